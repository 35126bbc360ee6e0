"""Delivery: I3 (device/pin apply to the final batch) and I4 (copies safe by construction).

The CUDA path is checked with a fake CudaOps that records the order of operations on CPU
tensors; the tripwire stays on, so any real CUDA call would fail these tests.
"""

from __future__ import annotations

import threading
import warnings

import numpy as np
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


# ---------------------------------------------------------------- device=None leaves data (I3)
def test_device_none_leaves_a_non_cpu_batch_where_the_storage_is():
    """``ReplayBuffer(TensorStorage(..., device=X))`` with ``device=None`` returns batches on X
    (shown with a ``meta`` storage: no CUDA needed; it used to be copied to the host)."""
    from rlstash.replay import ReplayBuffer
    from rlstash.storage import TensorStorage

    spec = {"obs": ((3,), torch.float32), "action": ((), torch.int64)}
    rb = ReplayBuffer(TensorStorage(spec, 16, device="meta"), seed=0)
    rb.extend({"obs": torch.zeros(5, 3), "action": torch.arange(5)})
    out = rb.sample(4)
    assert out["obs"].device.type == "meta" and out["action"].device.type == "meta"
    assert out["obs"].shape == (4, 3)


def test_delivery_none_passes_non_cpu_tensors_and_pins_only_host_ones():
    meta = torch.empty(4, 3, device="meta")
    d = Delivery(None, False)
    b = {"obs": meta, "action": torch.arange(4)}
    assert d(b) is b
    ops = FakeCudaOps()
    out = Delivery(None, True, ops=ops)(b)
    assert out["obs"] is meta  # left where it is
    assert out["action"].data_ptr() in ops.pinned and ops.log == ["pin"]


# ---------------------------------------------------------------- unsupported devices (I3)
BAD_DEVICES = ["mps", "xpu", "cuda:x", "gpu", "hpu", "GPU0"]


@pytest.mark.parametrize("bad", BAD_DEVICES)
def test_unsupported_devices_are_refused_at_construction(bad):
    from rlstash.agents.dqn import DQN
    from rlstash.replay import ReplayBuffer
    from rlstash.storage import StreamStorage, TensorStorage

    spec = {"obs": ((3,), torch.float32), "action": ((), torch.int64)}
    pattern = rf"device: .*{bad!r}.*expected 'cpu', 'cuda'"
    with pytest.raises(ValueError, match=pattern):
        resolve_device(bad)
    with pytest.raises(ValueError, match=pattern):
        TensorStorage(spec, 8, device=bad)
    with pytest.raises(ValueError, match=pattern):
        StreamStorage(spec, 2, 16, device=bad)
    with pytest.raises(ValueError, match=pattern):
        ReplayBuffer(TensorStorage(spec, 8), device=bad)  # not at the first sample
    with pytest.raises(ValueError, match=pattern):
        Delivery(bad, False)
    with pytest.raises(ValueError, match=pattern):
        DQN((1,), 2, device=bad)
    with pytest.raises(ValueError, match=rf"act_device: .*{bad!r}"):
        DQN((1,), 2, act_device=bad)


def test_unsupported_device_message_names_the_fix():
    with pytest.raises(
        ValueError, match=r"'mps'.*not supported by rlstash.*fix: pass device='cpu'"
    ):
        resolve_device("mps")
    with pytest.raises(TypeError, match=r"device: expected a device string.*got int"):
        resolve_device(3)
    with pytest.raises(ValueError, match="device: expected .* got None"):
        resolve_device(None, allow_none=False)
    assert resolve_device("meta") == torch.device("meta")


def test_a_gpu_index_the_machine_lacks_is_refused():
    class OneGpu(FakeCudaOps):
        def device_count(self) -> int:
            return 1

    assert resolve_device("cuda:0", ops=OneGpu()) == torch.device("cuda", 0)
    with pytest.raises(ValueError, match=r"'cuda:3'.*has 1 CUDA device\(s\).*index below 1"):
        resolve_device("cuda:3", ops=OneGpu())
    with pytest.raises(ValueError, match=r"'cuda:3'.*has 1 CUDA device"):
        Delivery("cuda:3", False, ops=OneGpu())


def test_collector_refuses_an_unsupported_device():
    from rlstash.collect.sync import Collector

    class Env:
        num_envs = 2

    with pytest.raises(ValueError, match=r"device: .*'mps'"):
        Collector(Env(), lambda obs: obs, 2, device="mps")


# ---------------------------------------------------------------- prefetch on CUDA (I4)
class ThreadStreams(FakeCudaOps):
    """Fake ops whose current stream is per thread: "caller" for the test's thread, "producer"
    for any other (the prefetch thread). Events remember the stream they were recorded on;
    "device" copies return tensors that report a CUDA device."""

    def __init__(self) -> None:
        super().__init__()
        self.main = threading.get_ident()
        self.lock = threading.Lock()
        self.streams: dict[str, LoggedStream] = {}

    def current_stream(self, device):
        name = "caller" if threading.get_ident() == self.main else "producer"
        with self.lock:
            if name not in self.streams:
                self.streams[name] = LoggedStream(name, self)
            return self.streams[name]

    def new_event(self):
        return LoggedEvent(self)

    def to(self, t, device, non_blocking=False):
        out = super().to(t, device, non_blocking)
        return on_fake_cuda(out) if torch.device(device).type == "cuda" else out

    def record_stream(self, t, stream):
        self.note(f"record_stream:{stream.name}")

    def note(self, text: str) -> None:
        with self.lock:
            self.log.append(text)


class LoggedEvent:
    count = 0

    def __init__(self, ops: ThreadStreams) -> None:
        LoggedEvent.count += 1
        self.ops, self.name, self.stream = ops, f"ev{LoggedEvent.count}", None

    def record(self, stream) -> None:
        self.stream = stream.name
        self.ops.note(f"record:{self.name}@{stream.name}")

    def synchronize(self) -> None:
        self.ops.note(f"sync:{self.name}")


class LoggedStream:
    def __init__(self, name: str, ops: ThreadStreams) -> None:
        self.name, self.ops = name, ops

    def wait_event(self, event) -> None:
        self.ops.note(f"{self.name}.wait:{event.name}@{event.stream}")

    def wait_stream(self, other) -> None:
        self.ops.note(f"{self.name}.wait_stream:{other.name}")


def on_fake_cuda(t: torch.Tensor) -> torch.Tensor:
    return _on_fake_cuda(t)


@pytest.mark.allow_cuda
@pytest.mark.parametrize("mode", ["current", "dedicated"])
def test_prefetched_batch_is_handed_to_the_callers_stream(mode):
    """The prefetch thread's batch: an event recorded on its stream after the copies; the
    caller's stream waits on it when ``sample`` hands the batch over, and every tensor is
    ``record_stream``-ed for the caller, in both stream modes."""
    from rlstash.replay import ReplayBuffer
    from rlstash.storage import TensorStorage

    ops = ThreadStreams()
    spec = {"obs": ((3,), torch.float32), "action": ((), torch.int64)}
    rb = ReplayBuffer(TensorStorage(spec, 16), seed=0, prefetch=1)
    rb.delivery = Delivery("cuda", False, stream=mode, ops=ops)
    rb.extend({"obs": torch.zeros(5, 3), "action": torch.arange(5)})
    try:
        out = rb.sample(4)
        assert all(t.device.type == "cuda" for t in out.values())
        log = list(ops.log)  # the producer may already be making the next batch
        wait = next(e for e in log if e.startswith("caller.wait:"))
        event = wait.split(":")[1].split("@")[0]
        assert wait.endswith("@producer")
        recorded = log.index(f"record:{event}@producer")
        copies = [i for i, e in enumerate(log) if e.startswith("copy:")]
        assert len([i for i in copies if i < recorded]) >= len(out)  # recorded after its copies
        after = [e for e in log[log.index(wait) + 1 :] if e.startswith("record_stream:caller")]
        assert after == ["record_stream:caller"] * len(out)
    finally:
        rb.close()


@pytest.mark.allow_cuda
def test_host_prefetched_batches_make_no_stream_calls():
    from rlstash.replay import ReplayBuffer
    from rlstash.storage import TensorStorage

    ops = ThreadStreams()
    spec = {"obs": ((3,), torch.float32)}
    rb = ReplayBuffer(TensorStorage(spec, 16), seed=0, prefetch=2)
    rb.delivery = Delivery(None, False, ops=ops)
    rb.extend({"obs": torch.zeros(5, 3)})
    rb.sample(4)
    rb.close()
    assert ops.log == []


# ---------------------------------------------------------------- GPU storage order (I4)
@pytest.mark.allow_cuda
def test_stream_order_puts_reads_after_writes_and_writes_after_reads():
    from rlstash.device import StreamOrder

    ops = ThreadStreams()
    order = StreamOrder(torch.device("cuda", 0), ops)

    def in_thread(fn):
        t = threading.Thread(target=fn)
        t.start()
        t.join()

    order.before_write()
    order.after_write()  # caller writes: event e1 on "caller"
    write_event = ops.log[-1].split(":")[1].split("@")[0]
    in_thread(lambda: (order.before_read(), order.after_read()))  # the prefetch thread reads
    assert f"producer.wait:{write_event}@caller" in ops.log
    read_event = ops.log[-1].split(":")[1].split("@")[0]
    ops.log.clear()
    order.before_read()  # same stream as the write: no wait needed
    assert not any(".wait:" in e for e in ops.log)
    order.after_read()
    ops.log.clear()
    order.before_write()  # the next write waits for the producer's gather
    assert ops.log == [f"caller.wait:{read_event}@producer"]


@pytest.mark.allow_cuda
def test_gpu_storage_writes_and_reads_go_through_its_stream_order():
    """A non-CPU TensorStorage (``meta`` here) orders ``write``/``read`` with its order."""
    from rlstash.device import StreamOrder
    from rlstash.storage import TensorStorage

    ops = ThreadStreams()
    store = TensorStorage({"obs": ((3,), torch.float32)}, 8, device="meta")
    assert store.order is None  # only CUDA storages order their work
    store.order = StreamOrder(torch.device("cuda", 0), ops)
    store.write(slice(0, 2), {"obs": torch.zeros(2, 3)})
    assert [e.split(":")[0] for e in ops.log] == ["record"]
    t = threading.Thread(target=lambda: store.read(np.array([0, 1])))
    t.start()
    t.join()
    assert ops.log[1].startswith("producer.wait:") and ops.log[2].startswith("record:")
    store.write(np.array([2, 3]), {"obs": torch.zeros(2, 3)})
    assert ops.log[3].startswith("caller.wait:") and ops.log[3].endswith("@producer")


def test_cpu_storages_make_no_stream_order():
    from rlstash.device import stream_order

    assert stream_order(torch.device("cpu")) is None
    assert stream_order(torch.device("meta")) is None
