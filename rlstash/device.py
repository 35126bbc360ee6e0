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
from typing import Any

import torch

from rlstash.spec import Batch

_warned_pin = False


def resolve_device(device: str | torch.device | None, name: str = "device") -> torch.device | None:
    """Parse a device argument. ``"auto"`` means CUDA when available, else CPU.

    ``None`` stays ``None`` (leave data where it is). Asking for CUDA on a machine without it
    is an error that says so, never a silent CPU fallback.
    """
    if device is None:
        return None
    if isinstance(device, str) and device == "auto":
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(
            f"{name}: expected 'cpu', 'cuda', 'cuda:N', 'auto' or None, got {device!r}"
        ) from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"{name}: {str(dev)!r} was asked for but torch.cuda.is_available() is False "
            f"(torch {torch.__version__}); fix: pass {name}='cpu' or install a CUDA build of torch"
        )
    return dev


def is_cuda(device: torch.device | None) -> bool:
    return device is not None and device.type == "cuda"


class CudaOps:
    """The few CUDA operations delivery needs, behind one object so tests can fake them."""

    def is_available(self) -> bool:
        return torch.cuda.is_available()

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
        self.device = resolve_device(device) if ops is None else _parse(device)
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
        if self.identity:
            for t in batch.values():
                if not t.is_cpu:
                    break
            else:
                return batch
        if is_cuda(self.device):
            return self._to_cuda(batch)
        return self._to_host_or_other(batch)

    # host or another non-CUDA target
    def _to_host_or_other(self, batch: Batch) -> Batch:
        target = self.device or torch.device("cpu")
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


def _parse(device: str | torch.device | None) -> torch.device | None:
    return None if device is None else torch.device(device)


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
