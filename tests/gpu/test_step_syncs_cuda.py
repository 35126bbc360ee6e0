"""An env step into a GPU stream replay, and a sample of it, make no host wait (marker
``gpu``: skipped where CUDA is absent; run with ``python3 run.py test -m gpu``).

``torch.cuda.set_sync_debug_mode("error")`` raises on every synchronizing call (a blocking
``.to("cuda")`` of a host tensor, ``.item()``, a device-to-host copy): a write made 3 of them
per env step and a sample 9 (bench/gpu_e2e.py's profile); now the host parts go in one
pinned, non-blocking copy each (:func:`rlstash.device.upload`). Their values are checked
after the writes: a non-blocking copy read before it landed would show here.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlstash.replay import ReplayBuffer
from rlstash.spec import Field, Spec
from rlstash.storage import StreamStorage
from rlstash.storage.stream_spec import ReadSpec

pytestmark = pytest.mark.gpu

SPEC = Spec({"obs": Field((17,), torch.float64), "action": Field((6,), torch.float32)})


def _step(t: int) -> dict[str, np.ndarray]:
    return {
        "obs": np.full((1, 1, 17), t, np.float64),  # a [T=1, N=1] batch, as the Collector's
        "action": np.full((1, 1, 6), -t, np.float32),
        "reward": np.float32([[t]]),
        "terminated": np.array([[False]]),
        "truncated": np.array([[t % 97 == 96]]),
    }


@pytest.mark.parametrize("n_step", [1, 3])
def test_an_env_step_and_a_sample_make_no_host_wait(n_step: int) -> None:
    reads = ReadSpec(n_step=n_step, gamma=0.9)
    rb = ReplayBuffer(StreamStorage(SPEC, 1, 100_000, device="cuda", reads=reads), seed=0)
    for t in range(10):  # warm-up: allocations, the pinned-memory cache
        rb.extend(_step(t))
    rb.sample(256)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for t in range(10, 400):
            rb.extend(_step(t))
            batch = rb.sample(256)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    index = batch["index"].cpu().numpy()
    assert batch["obs"].device.type == "cuda" and batch["index"].device.type == "cuda"
    slot_step = batch["obs"][:, 0].cpu().numpy()  # obs of step t holds t
    np.testing.assert_array_equal(batch["action"][:, 0].cpu().numpy(), -slot_step)
    assert np.unique(index).size > 100
    if n_step == 1:
        np.testing.assert_array_equal(batch["reward"].cpu().numpy(), slot_step)
        np.testing.assert_array_equal(batch["next_obs"][:, 0].cpu().numpy(), slot_step + 1)
