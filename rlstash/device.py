"""Devices: resolution, safe copies, stream policy and pinned staging buffers.

Rules (invariants I1, I3, I4 of DESIGN.md):

* With every device CPU nothing here calls a ``torch.cuda`` API. CUDA is consulted only
  when a CUDA device, ``"auto"`` or ``pin_memory=True`` is asked for.
* :class:`Delivery` is applied to the *final* batch, after every transform, so ``device``
  and ``pin_memory`` describe exactly what the caller receives, whatever the storage.
* A ``non_blocking`` copy is followed by the synchronization that makes it safe:
  host -> device copies go through pinned staging buffers that are reused only after an
  event recorded behind the previous copy has completed; device -> host copies are
  synchronized before the batch is returned. Copies run on the caller's current stream;
  a dedicated stream is used only when asked for, and the caller's stream then waits on it.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from rlstash.spec import Batch

_warned_pin = False


SUPPORTED = ("cpu", "cuda", "meta")  # device types rlstash stores and delivers on
COMPUTE = ("cpu", "cuda")  # device types that run computations: agents and training runs
_META_NOTE = "'meta' holds shapes without data: dry runs of storages, never training"


_DTYPES = {
    str(d).removeprefix("torch."): d for d in vars(torch).values() if isinstance(d, torch.dtype)
}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a name (``"float32"`` -> ``torch.float32``, ``"bfloat16"``, ``"bool"``:
    torch's names, which are numpy's where numpy has the type)."""
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(
            f"dtype: expected a torch dtype name such as 'float32', got {name!r}"
        ) from None


def device_help(kinds: tuple[str, ...] = SUPPORTED) -> str:
    """The accepted spellings of a device of one of ``kinds``, for messages and ``--help``."""
    words = ["'cpu'"] if "cpu" in kinds else []
    if "cuda" in kinds:
        words += ["'cuda'", "'cuda:N'", "'auto' (CUDA when available, else CPU)"]
    words += [f"'{k}'" for k in kinds if k not in ("cpu", "cuda")]
    return ", ".join(words[:-1]) + " or " + words[-1] if len(words) > 1 else words[0]


def check_device(
    device: str | torch.device, name: str = "device", kinds: tuple[str, ...] = SUPPORTED
) -> torch.device | None:
    """The spelling and type check of :func:`resolve_device`, asking CUDA nothing: the
    ``torch.device`` of ``device``, or None for ``"auto"``; a ValueError naming ``name``, the
    value and the accepted ``kinds`` otherwise (e.g. ``kinds=COMPUTE`` refuses ``meta``)."""
    if not isinstance(device, (str, torch.device)):
        raise TypeError(
            f"{name}: expected a device string or torch.device ({device_help(kinds)}), "
            f"got {type(device).__name__} {device!r}"
        )
    if isinstance(device, str) and device == "auto" and "cuda" in kinds:
        return None
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(
            f"{name}: {device!r} is not a device; expected {device_help(kinds)}"
        ) from exc
    if dev.type not in kinds:
        why = f" ({_META_NOTE})" if dev.type == "meta" else ""
        given = f" (from {str(device)!r})" if str(device) != dev.type else ""
        where = "" if "meta" in kinds else " for computing (agents, training)"
        raise ValueError(
            f"{name}: device type {dev.type!r}{given} is not supported by rlstash{where}{why}; "
            f"expected {device_help(kinds)}; fix: pass {name}='cpu' or a CUDA device"
        )
    return dev


def resolve_device(
    device: str | torch.device | None,
    name: str = "device",
    allow_none: bool = True,
    ops: CudaOps | None = None,
    kinds: tuple[str, ...] = SUPPORTED,
) -> torch.device | None:
    """Parse and check a device argument; the one place rlstash turns user input into a device.

    ``"auto"`` means CUDA when available, else CPU. ``None`` stays ``None`` (leave data where
    it is) when ``allow_none``. Supported types are ``kinds``: by default ``cpu``, ``cuda`` and
    ``meta`` (shapes without data: dry runs and tests); ``kinds=COMPUTE`` (what computes: agents,
    training) refuses ``meta``. Anything else (``"mps"``, ``"xpu"``, a typo such as ``"gpu"``
    or ``"cuda:x"``), CUDA on a machine without it, or a GPU index the machine does not have is
    a ``ValueError`` naming ``name``, the value and the fix, raised when the object is built,
    never a silent CPU fallback. ``ops`` replaces the CUDA queries (tests).
    """
    if device is None:
        if allow_none:
            return None
        raise ValueError(f"{name}: expected {device_help(kinds)}, got None")
    dev = check_device(device, name, kinds)
    ops = ops or CudaOps()
    if dev is None:  # "auto"
        return torch.device("cuda") if ops.is_available() else torch.device("cpu")
    if dev.type == "cuda":
        _check_cuda(dev, name, ops)
    return dev


def _check_cuda(dev: torch.device, name: str, ops: CudaOps) -> None:
    if not ops.is_available():
        raise ValueError(
            f"{name}: {str(dev)!r} was asked for but torch.cuda.is_available() is False "
            f"(torch {torch.__version__}); fix: pass {name}='cpu' or install a CUDA build of torch"
        )
    if dev.index is not None:
        count = ops.device_count()
        if dev.index >= count:
            raise ValueError(
                f"{name}: {str(dev)!r} was asked for but this machine has {count} CUDA "
                f"device(s) (cuda:0 .. cuda:{count - 1}); fix: pass an index below {count}"
            )


def is_cuda(device: torch.device | None) -> bool:
    return device is not None and device.type == "cuda"


UPLOAD_ALIGN = 64  # bytes: each part of an upload starts here (inductor wants 16)


def upload(parts: Sequence[np.ndarray | torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """Host arrays or tensors ``parts`` as tensors on ``device``, in one host-to-device copy.

    A blocking copy per small tensor costs a CUDA synchronization each (a pageable
    ``.to("cuda")`` waits for the stream); a write or a sample of a GPU storage made up to nine
    of them per env step. Here the parts are packed into one pinned host buffer (each at a
    ``UPLOAD_ALIGN``-byte offset) and copied with ``non_blocking=True``: no host wait. Safe
    (invariant I4): the parts are copied into the buffer before this returns (the caller may
    reuse them at once), and the buffer comes from torch's pinned-memory cache, which reuses a
    block only after the copies that read it have completed (an event per copy). The results
    are views of one device buffer, queued on the current stream. A CPU ``device``: the parts
    as tensors, no copy; another device (``meta``): one plain copy. No CUDA call unless
    ``device`` is CUDA (I1)."""
    host = [
        (p.detach() if p.requires_grad else p)
        if isinstance(p, torch.Tensor)
        else torch.from_numpy(_contiguous(p))
        for p in parts
    ]
    if device.type == "cpu":
        return host
    pinned = device.type == "cuda"
    buf, offsets = pack(host, pinned)
    on = buf.to(device, non_blocking=pinned)
    return [part(on, at, t) for t, at in zip(host, offsets)]


def _contiguous(a: np.ndarray) -> np.ndarray:
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def pack(host: Sequence[torch.Tensor], pinned: bool = False) -> tuple[torch.Tensor, list[int]]:
    """(one uint8 host buffer holding the bytes of every tensor of ``host``, each tensor's
    offset in it: a multiple of ``UPLOAD_ALIGN``); pinned when asked (a CUDA call)."""
    offsets, total = [], 0
    for t in host:
        offsets.append(total)
        nbytes = t.numel() * t.element_size()
        total += -(-nbytes // UPLOAD_ALIGN) * UPLOAD_ALIGN
    buf = torch.empty(max(total, 1), dtype=torch.uint8, pin_memory=pinned)
    for t, at in zip(host, offsets):
        if t.numel():
            part(buf, at, t).copy_(t)
    return buf, offsets


def part(buf: torch.Tensor, at: int, like: torch.Tensor) -> torch.Tensor:
    """The bytes of ``buf`` from ``at`` as a tensor shaped and typed as ``like``."""
    n = like.numel()
    flat = buf[at : at + n * like.element_size()].view(like.dtype)
    return flat.view(like.shape)


class CudaOps:
    """The few CUDA operations delivery needs, behind one object so tests can fake them."""

    def is_available(self) -> bool:
        return torch.cuda.is_available()

    def device_count(self) -> int:
        return torch.cuda.device_count()

    def empty_pinned(self, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, pin_memory=True)

    def pin(self, t: torch.Tensor) -> torch.Tensor:
        return t.pin_memory()

    def current_stream(self, device: torch.device) -> Any:
        return torch.cuda.current_stream(device)

    def new_stream(self, device: torch.device) -> Any:
        return torch.cuda.Stream(device)

    def use_stream(self, stream: Any) -> Any:
        return torch.cuda.stream(stream)

    def new_event(self) -> Any:
        return torch.cuda.Event()

    def to(self, t: torch.Tensor, device: torch.device, non_blocking: bool = False) -> torch.Tensor:
        return t.to(device, non_blocking=non_blocking)

    def record_stream(self, t: torch.Tensor, stream: Any) -> None:
        t.record_stream(stream)


class Delivery:
    """Moves a batch to ``device`` (and pins host batches) safely; owns pinned staging.

    ``Delivery(device=None, pin_memory=False)`` is the identity. Tensors already on the
    target device are passed through untouched. ``stream`` is ``"current"`` (default: the
    caller's current CUDA stream) or ``"dedicated"`` (a side stream; the caller's stream
    waits on an event recorded behind the copies before the batch is handed over).
    """

    def __init__(
        self,
        device: str | torch.device | None = None,
        pin_memory: bool = False,
        stream: str = "current",
        ops: CudaOps | None = None,
    ) -> None:
        if stream not in ("current", "dedicated"):
            raise ValueError(f"stream: expected 'current' or 'dedicated', got {stream!r}")
        if not isinstance(pin_memory, bool):
            raise TypeError(f"pin_memory: expected a bool, got {type(pin_memory).__name__}")
        self.ops = ops or CudaOps()
        self.device = resolve_device(device, ops=ops)
        self.pin_memory = pin_memory
        self.stream_mode = stream
        self._staging: dict[str, torch.Tensor] = {}
        self._staging_free: Any = None  # event recorded after the last H2D copy from staging
        self._side_stream: Any = None
        if pin_memory and not is_cuda(self.device) and not self.ops.is_available():
            _warn_pin_once()
            self.pin_memory = False

    @property
    def identity(self) -> bool:
        """True when delivery never changes a CPU batch (no device, no pinning)."""
        return not self.pin_memory and (self.device is None or self.device.type == "cpu")

    def __call__(self, batch: Batch) -> Batch:
        device = self.device
        if device is None:  # leave every tensor where it is; pin the host ones if asked
            return self._pin_host(batch) if self.pin_memory else batch
        if not self.pin_memory and device.type == "cpu":
            for t in batch.values():
                if not t.is_cpu:
                    break
            else:
                return batch
        if device.type == "cuda":
            return self._to_cuda(batch)
        return self._to_host_or_other(batch)

    def _pin_host(self, batch: Batch) -> Batch:
        """``device=None, pin_memory=True``: host tensors pinned, others left where they are."""
        return {k: self.ops.pin(t) if t.is_cpu else t for k, t in batch.items()}

    # host or another non-CUDA target
    def _to_host_or_other(self, batch: Batch) -> Batch:
        target = self.device
        assert target is not None
        out: Batch = {}
        pending = None
        for key, t in batch.items():
            if t.device.type == "cuda" and target.type == "cpu" and self.pin_memory:
                dst = self.ops.empty_pinned(t.shape, t.dtype)
                dst.copy_(t, non_blocking=True)  # D2H into pinned memory: async ...
                pending = pending or t.device
                out[key] = dst
            elif t.device != target:
                out[key] = self.ops.to(t, target)  # blocking copy: safe when it returns
            elif self.pin_memory and target.type == "cpu":
                out[key] = self.ops.pin(t)
            else:
                out[key] = t
        if pending is not None:
            event = self.ops.new_event()
            event.record(self.ops.current_stream(pending))
            event.synchronize()  # ... so wait for it before anyone can read the batch (I4)
        return out

    # host -> CUDA through pinned staging
    def _to_cuda(self, batch: Batch) -> Batch:
        dev = self.device
        assert dev is not None
        caller = self.ops.current_stream(dev)
        stream = caller
        if self.stream_mode == "dedicated":
            if self._side_stream is None:
                self._side_stream = self.ops.new_stream(dev)
            stream = self._side_stream
            stream.wait_stream(caller)
        if self._staging_free is not None:
            self._staging_free.synchronize()  # the previous copy out of staging has finished
        out: Batch = {}
        with self.ops.use_stream(stream):
            for key, t in batch.items():
                if t.device == dev:
                    out[key] = t
                elif t.device.type == "cpu":
                    stage = self._stage(key, t)
                    out[key] = self.ops.to(stage, dev, non_blocking=True)  # async H2D
                else:
                    out[key] = self.ops.to(t, dev)
            done = self.ops.new_event()
            done.record(stream)
        self._staging_free = done
        if stream is not caller:
            caller.wait_event(done)  # the caller's stream sees the data only after the copy
            for key, t in out.items():
                if batch[key] is not t:
                    self.ops.record_stream(t, caller)
        return out

    def _stage(self, key: str, t: torch.Tensor) -> torch.Tensor:
        buf = self._staging.get(key)
        if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
            buf = self.ops.empty_pinned(t.shape, t.dtype)
            self._staging[key] = buf
        buf.copy_(t)
        return buf

    def synchronize(self) -> None:
        """Wait until staging buffers are free (the last host->device copy completed)."""
        if self._staging_free is not None:
            self._staging_free.synchronize()


class Handover:
    """Hands a batch made on one thread's CUDA stream to another thread's stream safely (I4).

    The producer (a prefetch thread) calls :meth:`mark` once the batch is complete: for each
    CUDA device in it, an event is recorded on the producer's current stream, behind every
    gather, transform and copy that made the batch. The consumer calls :meth:`receive` when it
    takes the batch: its current stream waits on that event (its kernels see finished data,
    without blocking the host), and every tensor is ``record_stream``-ed for it, so the caching
    allocator never hands the memory to another allocation (the next prefetch copy) while the
    consumer's kernels may still read it. Host-only batches make no CUDA call (I1).
    """

    def __init__(self, ops: CudaOps | None = None) -> None:
        self.ops = ops or CudaOps()

    def mark(self, batch: Batch) -> list[tuple[torch.device, Any]]:
        """Producer side: ``[(device, event)]`` for the CUDA devices of ``batch``."""
        marks = []
        for dev in _cuda_devices(batch):
            event = self.ops.new_event()
            event.record(self.ops.current_stream(dev))
            marks.append((dev, event))
        return marks

    def receive(self, batch: Batch, marks: list[tuple[torch.device, Any]]) -> Batch:
        """Consumer side: the caller's current stream waits for the batch and owns its memory."""
        for dev, event in marks:
            stream = self.ops.current_stream(dev)
            stream.wait_event(event)
            for t in batch.values():
                if t.device == dev:
                    self.ops.record_stream(t, stream)
        return batch


def _cuda_devices(batch: Batch) -> list[torch.device]:
    devices: list[torch.device] = []
    for t in batch.values():
        dev = t.device
        if dev.type == "cuda" and dev not in devices:
            devices.append(dev)
    return devices


class StreamOrder:
    """Orders the writes and reads of one GPU storage on the GPU, whatever stream runs them.

    A host lock orders when work is *enqueued*; on a GPU, work enqueued on two streams may
    still run in any order: a gather on the prefetch thread's stream could read rows an
    ``extend`` on the learner's stream has not finished writing, or a write could overwrite
    rows a gather is still reading. So (called under the owner's lock, around each operation):

    * :meth:`before_read` makes the reading stream wait on the event of the last write;
    * :meth:`after_read` records an event per reading stream;
    * :meth:`before_write` makes the writing stream wait on the last write and on every read
      recorded since (a ring overwrites the oldest rows);
    * :meth:`after_write` records the write's event.

    Waits on the stream's own events are skipped (a stream is ordered with itself). All calls
    go through :class:`CudaOps` (tests pass fakes).
    """

    def __init__(self, device: torch.device, ops: CudaOps | None = None) -> None:
        self.device = device
        self.ops = ops or CudaOps()
        self._write: tuple[Any, Any] | None = None  # (stream, event) of the last write
        self._reads: dict[Any, Any] = {}  # stream -> event of its last read since that write

    def before_read(self) -> None:
        stream = self.ops.current_stream(self.device)
        if self._write is not None and self._write[0] != stream:
            stream.wait_event(self._write[1])

    def after_read(self) -> None:
        stream = self.ops.current_stream(self.device)
        event = self.ops.new_event()
        event.record(stream)
        self._reads[stream] = event

    def before_write(self) -> None:
        stream = self.ops.current_stream(self.device)
        if self._write is not None and self._write[0] != stream:
            stream.wait_event(self._write[1])
        for other, event in self._reads.items():
            if other != stream:
                stream.wait_event(event)
        self._reads.clear()  # later writes wait on this one, which waited on them

    def after_write(self) -> None:
        stream = self.ops.current_stream(self.device)
        event = self.ops.new_event()
        event.record(stream)
        self._write = (stream, event)


def stream_order(device: torch.device) -> StreamOrder | None:
    """A :class:`StreamOrder` for a CUDA storage, ``None`` elsewhere (no CUDA call on the CPU)."""
    return StreamOrder(device) if device.type == "cuda" else None


def _warn_pin_once() -> None:
    global _warned_pin
    if not _warned_pin:
        _warned_pin = True
        warnings.warn(
            "pin_memory=True does nothing on this machine: torch.cuda.is_available() is False "
            "(pinned memory only speeds up copies to a CUDA device)",
            RuntimeWarning,
            stacklevel=3,
        )
