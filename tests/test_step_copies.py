"""Host-to-device copies per env step (issue: per-step overhead of the off-policy loop).

A blocking ``.to("cuda")`` of a host tensor waits for the stream: one host wait per field.
A GPU stream replay made 3 of them per ``extend`` of one env step and 9 per ``sample`` (seen
in bench/gpu_e2e.py's profile). Now the host parts of a write or of a sample's indices go in
one packed copy each (:func:`rlstash.device.upload`): pinned and ``non_blocking`` on CUDA.
The counts are taken on the meta device, where the same code paths run without a GPU.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

import rlstash.device as device_mod
from rlstash import ReplayBuffer
from rlstash.device import UPLOAD_ALIGN, pack, part, upload
from rlstash.spec import Field, Spec
from rlstash.storage.stream import StreamStorage

SPEC = Spec({"obs": Field((17,), torch.float32), "action": Field((6,), torch.float32)})


class HostToDevice(TorchFunctionMode):
    """Counts tensor ops that move a host tensor to another device (``to``, ``copy_``)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", "")
        if name in ("to", "copy_", "cuda") and isinstance(out, torch.Tensor):
            src = args[1] if name == "copy_" else args[0]
            if isinstance(src, torch.Tensor) and src.is_cpu and not out.is_cpu:
                self.count += 1
        return out


def _step(t: int) -> dict[str, torch.Tensor]:
    return {
        "obs": torch.randn(1, 17),
        "action": torch.randn(1, 6),
        "reward": torch.randn(1),
        "terminated": torch.tensor([False]),
        "truncated": torch.tensor([t % 50 == 49]),
    }


@pytest.mark.parametrize("n_step", [1, 3])
def test_one_copy_per_extend_and_three_per_sample_on_a_device(n_step: int) -> None:
    from rlstash.storage.stream_spec import ReadSpec

    reads = ReadSpec(n_step=n_step, gamma=0.9)
    rb = ReplayBuffer(StreamStorage(SPEC, 1, 1000, device="meta", reads=reads), seed=0)
    for t in range(5):
        rb.extend(_step(t))
    steps = 100
    with HostToDevice() as moves:
        for t in range(5, 5 + steps):
            rb.extend(_step(t))
    assert moves.count == steps  # main: 3 per step (one per stored field)
    with HostToDevice() as moves:
        for _ in range(steps):
            batch = rb.sample(64)
    # the gather's rows, the flags and discounts, the sampler's index (+1: n-step weights);
    # main: 9 (n-step: 10), one per array
    assert moves.count == steps * (3 + (n_step > 1))
    assert {v.device.type for v in batch.values()} == {"meta"}
    assert batch["index"].dtype == torch.int64 and batch["discount"].dtype == torch.float32


def test_upload_packs_parts_at_aligned_offsets_and_keeps_values() -> None:
    parts = [
        torch.arange(5),
        np.array([True, False, True]),
        np.float32([0.5, 0.25]),
        torch.randn(3, 4)[:, 1],  # not contiguous
        torch.zeros(0),
        torch.tensor(3.0, dtype=torch.bfloat16),
    ]
    host = [p if isinstance(p, torch.Tensor) else torch.from_numpy(p) for p in parts]
    buf, offsets = pack(host)
    assert all(at % UPLOAD_ALIGN == 0 for at in offsets)
    for t, at in zip(host, offsets):
        got = part(buf, at, t)
        assert got.dtype == t.dtype and got.shape == t.shape and torch.equal(got, t)
    on_cpu = upload(parts, torch.device("cpu"))  # the CPU: the parts themselves, no copy
    assert on_cpu[0] is parts[0] and torch.equal(on_cpu[1], host[1])


def test_upload_to_cuda_is_one_pinned_non_blocking_copy(monkeypatch) -> None:
    calls = []

    class FakeBuffer:
        def __init__(self, buf: torch.Tensor) -> None:
            self.buf = buf

        def to(self, device, non_blocking=False):
            calls.append((torch.device(device).type, non_blocking))
            return self.buf.clone()  # the "device" copy (on the CPU here)

    real_pack = device_mod.pack

    def fake_pack(host, pinned=False):
        calls.append(("pinned", pinned))
        buf, offsets = real_pack(host)  # no pinning: no CUDA call in this test
        return FakeBuffer(buf), offsets

    monkeypatch.setattr(device_mod, "pack", fake_pack)
    a, b = np.arange(4), torch.tensor([1.5, -2.0])
    out = upload([a, b], torch.device("cuda"))
    assert calls == [("pinned", True), ("cuda", True)]
    assert torch.equal(out[0], torch.from_numpy(a)) and torch.equal(out[1], b)
