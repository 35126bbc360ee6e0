"""A stream replay samples among the rows written so far (``StreamStorage.rows_bound``), not
the whole capacity: a 1e6-slot stream holding 5,000 steps drew among 1e6 candidates and
scanned ``valid[:1e6]`` per sample, ~0.7 ms of host time per update (bench/gpu_e2e.py's SAC
window). The bound must hold every valid start, whatever the writes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlstash import ReplayBuffer
from rlstash.core import SampleContext
from rlstash.spec import Field, Spec
from rlstash.storage.stream import StreamStorage

SPEC = Spec({"obs": Field((3,), torch.float32), "action": Field((), torch.int64)})


def _steps(rng: np.random.Generator, n: int, same_step: bool) -> dict[str, np.ndarray]:
    done = rng.random(n) < 0.2
    term = done & (rng.random(n) < 0.5)
    out = {
        "obs": rng.standard_normal((n, 3)).astype(np.float32),
        "action": rng.integers(0, 4, n),
        "reward": rng.standard_normal(n).astype(np.float32),
        "terminated": term,
        "truncated": done & ~term,
    }
    if same_step:
        out["final_obs"] = rng.standard_normal((n, 3)).astype(np.float32)
    return out


@pytest.mark.parametrize("mode", ["NextStep", "SameStep"])
@pytest.mark.parametrize("envs", [1, 3])
def test_every_valid_start_is_below_the_bound_and_sampled_from(mode: str, envs: int) -> None:
    rng = np.random.default_rng(0)
    st = StreamStorage(SPEC, envs, 60 * envs, autoreset=mode)
    rb = ReplayBuffer(st, seed=0)
    seen = np.zeros(st.capacity, bool)
    for step in range(150):  # past the ring's wrap (60 slots per lane)
        rb.extend(_steps(rng, envs, mode == "SameStep"))
        if step % 7 == 3:
            st.end_episodes([0])  # an env reset outside the stream
        if not st.valid.any():
            continue
        bound = st.rows_bound
        assert not st.valid[bound:].any()
        assert bound <= st.capacity
        ctx = rb.placement.context(SampleContext(0, 0, st.capacity, rb.rng))
        assert ctx.size == bound
        seen[rb.sample(32)["index"].numpy()] = True
        assert st.valid[rb.sample(8)["index"].numpy()].all()
    assert st.rows_bound == st.capacity  # wrapped
    assert seen[st.valid].mean() > 0.5  # candidates across the whole ring once it wrapped


def test_a_young_stream_draws_among_its_rows_only() -> None:
    st = StreamStorage(SPEC, 2, 1_000_000)
    rb = ReplayBuffer(st, seed=0)
    rng = np.random.default_rng(1)
    for _ in range(50):
        rb.extend(_steps(rng, 2, False))
    assert st.rows_bound == 100
    index = rb.sample(4096)["index"].numpy()
    counts = np.bincount(index, minlength=100)[:100]
    starts = np.flatnonzero(st.valid)
    assert set(np.flatnonzero(counts)) == set(starts)  # every valid start, nothing else
    expect = 4096 / starts.size
    assert np.all(np.abs(counts[starts] - expect) < 6 * np.sqrt(expect))  # uniform
