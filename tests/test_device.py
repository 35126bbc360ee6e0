"""Delivery: I3 (device/pin apply to the final batch) and I4 (copies safe by construction).

The CUDA path is checked with a fake CudaOps that records the order of operations on CPU
tensors; the tripwire stays on, so any real CUDA call would fail these tests.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import rlstash.device as device_mod
from rlstash.device import CudaOps, Delivery, resolve_device


class FakeEvent:
    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.recorded = False
        self.synced = False

    def record(self, stream=None) -> None:
        self.recorded = True
        self.log.append("record")

    def synchronize(self) -> None:
        assert self.recorded, "synchronize on an event never recorded"
        self.synced = True
        self.log.append("event.synchronize")


class FakeStream:
    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    def wait_stream(self, other) -> None:
        self.log.append(f"{self.name}.wait_stream")

    def wait_event(self, event) -> None:
        self.log.append(f"{self.name}.wait_event")


class _Ctx:
    def __init__(self, log, stream):
        self.log, self.stream = log, stream

    def __enter__(self):
        self.log.append(f"enter:{self.stream.name}")

    def __exit__(self, *a):
        self.log.append(f"exit:{self.stream.name}")


class FakeCudaOps(CudaOps):
    """CPU stand-in: 'pinned' tensors are tagged, 'device' copies are clones."""

    def __init__(self, available: bool = True) -> None:
        self.log: list[str] = []
        self.available = available
        self.pinned: set[int] = set()
        self.caller = FakeStream("caller", self.log)

    def is_available(self) -> bool:
        return self.available

    def empty_pinned(self, shape, dtype):
        self.log.append("alloc_pinned")
        t = torch.empty(shape, dtype=dtype)
        self.pinned.add(t.data_ptr())
        return t

    def pin(self, t):
        self.log.append("pin")
        out = t.clone()
        self.pinned.add(out.data_ptr())
        return out

    def current_stream(self, device):
        return self.caller

    def new_stream(self, device):
        return FakeStream("side", self.log)

    def use_stream(self, stream):
        return _Ctx(self.log, stream)

    def new_event(self):
        return FakeEvent(self.log)

    def to(self, t, device, non_blocking=False):
        src = "pinned" if t.data_ptr() in self.pinned else "pageable"
        self.log.append(f"copy:{src}:nb={non_blocking}")
        return t.clone()

    def record_stream(self, t, stream):
        self.log.append("record_stream")


def batch():
    return {"obs": torch.arange(12.0).reshape(4, 3), "action": torch.arange(4)}


def test_identity_is_a_noop():
    d = Delivery(None, False)
    b = batch()
    assert d(b) is b


def test_cpu_device_without_cuda_touches_no_cuda():
    d = Delivery("cpu", False)
    b = batch()
    out = d(b)
    assert out["obs"] is b["obs"]


def test_resolve_device_errors_name_the_field():
    with pytest.raises(ValueError, match="device"):
        resolve_device("gpu-please")
    assert resolve_device(None) is None
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.allow_cuda
def test_cuda_without_cuda_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"is_available\(\) is False.*device='cpu'"):
        Delivery("cuda", False)


def test_pin_without_cuda_warns_once_and_does_nothing(monkeypatch):
    monkeypatch.setattr(device_mod, "_warned_pin", False)
    ops = FakeCudaOps(available=False)
    with pytest.warns(RuntimeWarning, match="pin_memory=True does nothing"):
        d = Delivery("cpu", True, ops=ops)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Delivery("cpu", True, ops=ops)  # second time: silent
    b = batch()
    assert d(b)["obs"] is b["obs"]
    assert ops.log == []


def test_pin_applies_to_final_host_batch():
    ops = FakeCudaOps()
    d = Delivery(None, True, ops=ops)
    out = d(batch())
    assert all(t.data_ptr() in ops.pinned for t in out.values())
    assert ops.log == ["pin", "pin"]


def test_h2d_goes_through_pinned_staging_and_waits_before_reuse():
    ops = FakeCudaOps()
    d = Delivery("cuda", False, ops=ops)
    first = d(batch())
    torch.testing.assert_close(first["obs"], batch()["obs"])
    # every copy reads from pinned memory, non-blocking, and an event is recorded behind them
    assert ops.log == [
        "enter:caller",
        "alloc_pinned",
        "copy:pinned:nb=True",
        "alloc_pinned",
        "copy:pinned:nb=True",
        "record",
        "exit:caller",
    ]
    ops.log.clear()
    d(batch())
    # staging is reused, but only after the previous copy's event completed (I4)
    assert ops.log[0] == "event.synchronize"
    assert "alloc_pinned" not in ops.log


def test_dedicated_stream_makes_caller_wait():
    ops = FakeCudaOps()
    d = Delivery("cuda", False, stream="dedicated", ops=ops)
    d(batch())
    assert ops.log[0] == "side.wait_stream"
    assert "enter:side" in ops.log
    assert ops.log.index("caller.wait_event") > ops.log.index("record")
    assert ops.log.count("record_stream") == 2


def test_d2h_into_pinned_is_synchronized_before_return(monkeypatch):
    ops = FakeCudaOps()
    d = Delivery("cpu", True, ops=ops)
    b = batch()

    # Pretend the tensors live on a CUDA device: only .device matters for routing.
    fake = {k: _on_fake_cuda(v) for k, v in b.items()}
    out = d(fake)
    assert ops.log[-2:] == ["record", "event.synchronize"]
    torch.testing.assert_close(out["obs"], b["obs"])


def _on_fake_cuda(t: torch.Tensor) -> torch.Tensor:
    class _T(torch.Tensor):
        @property
        def device(self):  # type: ignore[override]
            return torch.device("cuda", 0)

    return t.as_subclass(_T)


def test_bad_arguments():
    with pytest.raises(ValueError, match="stream"):
        Delivery(None, False, stream="other")
    with pytest.raises(TypeError, match="pin_memory"):
        Delivery(None, "yes")  # type: ignore[arg-type]
