"""Step infos of plain numbers travel through shared memory; the infos are exactly those of
the pickled path (batch_infos) and of the in-process pool."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlstash.envs import ProcessPoolVectorEnv
from rlstash.envs.info_columns import NEW, SAME, InfoColumnWriter, block_infos, read_schema
from rlstash.envs.infos import batch_infos
from rlstash.envs.shm import INFO_COLUMNS
from rlstash.envs.testing import CountEnv, InfoEnv
from tests.envs.test_infos import same

K = 3
KINDS = {  # one strategy per value type
    "float": st.floats(allow_nan=False, width=64),
    "bool": st.booleans(),
    "int": st.integers(-(1 << 62), 1 << 62),
    "f32": st.floats(-1e4, 1e4, width=32).map(np.float32),
    "i16": st.integers(-100, 100).map(np.int16),
    "i64": st.integers(0, 1 << 40).map(np.int64),
    "other": st.sampled_from(["s", None]),
}
KEYS = ["a", "b", "_c", "final_obs"]
ANY_INFO = st.dictionaries(st.sampled_from(KEYS), st.one_of(*KINDS.values()), max_size=3)


@st.composite
def uniform_step(draw):
    """K infos with the same keys and value types (the case carried in shared memory)."""
    keys = draw(st.lists(st.sampled_from(KEYS[:2] + ["x", "y"]), min_size=1, unique=True))
    kinds = [draw(st.sampled_from(list(KINDS))) for _ in keys]
    return [{k: draw(KINDS[kind]) for k, kind in zip(keys, kinds)} for _ in range(K)]


STEP = st.one_of(uniform_step(), st.lists(ANY_INFO, min_size=K, max_size=K))


@settings(max_examples=200, deadline=None)
@given(st.lists(STEP, min_size=1, max_size=4))
def test_columns_give_what_batch_infos_gives(steps):
    """Step after step, a writer/reader pair gives batch_infos' result whenever it accepts
    a block (and refuses what it cannot carry exactly)."""
    area = np.zeros((K + 2, INFO_COLUMNS))
    writer, known = InfoColumnWriter(area[1 : 1 + K]), None
    for infos in steps:
        entries = [(j, info) for j, info in enumerate(infos) if info]
        payload = writer.encode(entries)
        if payload is None:
            continue
        assert payload == SAME or payload[:1] == NEW
        known = read_schema(payload, known)
        got = block_infos(area, slice(1, 1 + K), known)
        assert same(got, batch_infos(entries, K)), (entries, got)


def test_mujoco_style_infos_are_accepted_and_cheap_to_repeat():
    area = np.zeros((2, INFO_COLUMNS))
    writer = InfoColumnWriter(area)
    infos = [(j, {"x": float(j), "r": np.float32(0.5)}) for j in range(2)]
    first = writer.encode(infos)
    assert first[:1] == NEW and writer.encode(infos) == SAME
    assert writer.encode(infos[:1]) is None  # an env without info: pickled
    assert writer.encode([(j, {"x": "text"}) for j in range(2)]) is None


@pytest.mark.parametrize("mode", ["next_step", "same_step"])
def test_pool_infos_equal_in_process_infos_step_by_step(mode):
    """Every kind of info (InfoEnv cycles through them), over workers and in-process."""
    fns = [functools.partial(InfoEnv, i, 2) for i in range(6)]
    with (
        ProcessPoolVectorEnv(fns, num_workers=2, seed=0, autoreset_mode=mode) as pool,
        ProcessPoolVectorEnv(fns, num_workers=0, seed=0, autoreset_mode=mode) as ref,
    ):
        assert same(pool.reset()[1], ref.reset()[1])
        actions = np.zeros(6, dtype=np.int64)
        for t in range(40):
            got, want = pool.step(actions)[4], ref.step(actions)[4]
            assert same(got, want), (t, got, want)


def test_infos_are_fresh_arrays_each_step():
    """Arrays read from shared memory are copies: the next step does not change them."""
    fns = [functools.partial(CountEnv, 100, 1)] * 4
    with ProcessPoolVectorEnv(fns, num_workers=2, seed=0) as pool:
        pool.reset()
        first = pool.step(np.zeros(4, dtype=np.int64))[4]
        kept = first["t"].copy()
        second = pool.step(np.zeros(4, dtype=np.int64))[4]
        assert first["t"].dtype == np.int64 and np.array_equal(first["t"], kept)
        assert np.array_equal(second["t"], kept + 1) and second["_t"].all()
