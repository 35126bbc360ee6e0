"""ReplayBuffer: storage + sampler + writer, joined in a few lines.

::

    rb = ReplayBuffer(TensorStorage(spec, 100_000), sampler=PrioritizedSampler(), seed=0,
                      transforms=[normalize], device="cuda", pin_memory=True, prefetch=2)
    rb.extend(batch)                      # validated first: a bad batch writes nothing
    out = rb.sample(256)                  # fields + "index" (+ "weight" when prioritized)
    rb.update_priorities(out["index"], td_error)

Order of work in ``sample`` (invariant I3): the sampler picks indices, the storage gathers
the rows, the transforms run in order, and only then is the final batch pinned and moved to
``device``. So ``device``/``pin_memory`` describe exactly what the caller gets, whatever
the storage (RAM, GPU or disk) and whatever the transforms return.

Thread safety: ``extend`` and the index-pick + gather of ``sample`` run under one lock and
rows become visible to samplers only after they are written, so a sampler thread never sees
a torn row or an index whose data is not written yet. Transforms and delivery run outside
the lock.

Determinism: with ``seed`` set and ``prefetch=0`` the sequence of samples is a function of
the seed and the data. With ``prefetch=k`` a background thread samples ahead, so a batch
may predate the last ``k`` extends.
"""

from __future__ import annotations

import os
import queue
import tempfile
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlstash.core import Index, SampleContext, Sampler, Storage
from rlstash.device import Delivery
from rlstash.indices import as_rows
from rlstash.sampler import PrioritizedSampler, SequenceSampler, UniformSampler
from rlstash.spec import Batch
from rlstash.writer import RingWriter

Transform = Callable[[Batch], Batch]
_FORMAT = 1
# Samplers whose indices are always stored rows in [0, capacity): their batches are gathered
# without a bounds check. Exact types: a subclass may override ``sample``.
_IN_RANGE = frozenset({UniformSampler, PrioritizedSampler, SequenceSampler})
# Samplers whose ``on_write`` accepts numpy arrays as well as tensors (or ignores the batch).
_ANY_ARRAYS = _IN_RANGE


class ReplayBuffer:
    """A FIFO replay buffer over any :class:`~rlstash.core.Storage`.

    Args:
        storage: where rows live (``TensorStorage`` on any device, ``MemmapStorage`` on disk).
        sampler: picks indices; default :class:`~rlstash.sampler.UniformSampler`.
        transforms: callables ``dict -> dict`` applied in order to each sampled batch.
        device: where the final batch is delivered (``None``: leave it where the storage is).
        pin_memory: pin the final host batch (warns once and does nothing without CUDA).
        prefetch: number of batches a background thread keeps ready (0: none).
        seed: seed of the buffer's own ``numpy.random.Generator``.
    """

    def __init__(
        self,
        storage: Storage,
        sampler: Sampler | None = None,
        transforms: Iterable[Transform] = (),
        device: str | torch.device | None = None,
        pin_memory: bool = False,
        prefetch: int = 0,
        seed: int | None = None,
    ) -> None:
        placed = callable(getattr(storage, "extend", None)) and hasattr(storage, "valid")
        if not placed and not isinstance(storage, Storage):
            raise TypeError(
                f"storage: expected a Storage (TensorStorage, MemmapStorage, ...), got {type(storage).__name__}"
            )
        if not isinstance(prefetch, int) or prefetch < 0:
            raise ValueError(f"prefetch: expected an int >= 0, got {prefetch!r}")
        transforms = list(transforms)
        for i, t in enumerate(transforms):
            if not callable(t):
                raise TypeError(
                    f"transforms[{i}]: expected a callable dict -> dict, got {type(t).__name__}"
                )
        if sampler is None:
            sampler = UniformSampler()
        self.storage = storage
        # A storage that places rows itself (the stream storage's per-env lanes) replaces the
        # ring writer: it says where rows went, which starts are valid, and how windows run.
        self._placed = placed
        self.sampler = sampler
        self.writer = RingWriter(storage.capacity)
        self.transforms = transforms
        self.delivery = Delivery(device, pin_memory)
        self.prefetch = prefetch
        self.rng = np.random.default_rng(seed)
        self.sampler.reset(storage.capacity)
        _check_spec(self.sampler, storage.spec)  # e.g. SequenceSampler needs episode flags
        self._lock = threading.RLock()
        self._ctx = SampleContext(0, 0, storage.capacity, self.rng)
        # hot-path helpers, looked up once (None when the storage has no such fast path)
        from rlstash.storage.ram import ArrayStorage  # (the storage package is loaded by now)

        fast = isinstance(storage, ArrayStorage)  # TensorStorage, MemmapStorage
        self._rows_at = getattr(storage, "valid", None) is not None or hasattr(storage, "window")
        # ArrayStorage.gather: no bounds check; StreamStorage.gather: no validity re-check
        self._gather = getattr(storage, "gather", None) if fast or placed else None
        self._exact = storage.exact_sources if fast else None
        self._put = storage.put if fast else None
        self._set_cursor = getattr(storage, "set_cursor", None)
        self._host = getattr(getattr(storage, "device", None), "type", None) == "cpu"
        self._prefetcher: _Prefetcher | None = None
        self._closed = False
        self._resume_from_storage()

    # sizes
    @property
    def capacity(self) -> int:
        return self.storage.capacity

    def __len__(self) -> int:
        return int(self.storage.size) if self._placed else self.writer.size

    def __repr__(self) -> str:
        return (
            f"ReplayBuffer({type(self.storage).__name__}, {type(self.sampler).__name__}, "
            f"size={len(self)}/{self.capacity}, device={self.delivery.device})"
        )

    # writing
    def extend(self, batch: Mapping[str, Any]) -> np.ndarray:
        """Validate ``batch`` and append its rows; returns the indices written.

        A batch with more rows than the capacity keeps its last ``capacity`` rows, exactly as
        writing them one by one would.
        """
        if self._closed:
            self._check_open()
        if self._placed:
            with self._lock:
                index = self.storage.extend(batch)  # validated there: a bad batch writes nothing
                self.sampler.on_write(index, self.storage.step_flags(index))
            return index
        exact = self._exact(batch) if self._exact is not None else None
        if exact is not None:
            srcs, n = exact
            writer = self.writer
            if n <= writer.capacity:
                with self._lock:
                    index = writer.reserve(n)
                    self._put(index, srcs)
                    writer.commit(n)
                    self._after_write(index, batch, srcs)
                if type(index) is slice:
                    return np.arange(index.start, index.stop, dtype=np.int64)
                return index
        data = self.storage.spec.validate(batch)
        n = next(iter(data.values())).shape[0]
        cap = self.capacity
        with self._lock:
            if n > cap:
                data = {k: v[n - cap :] for k, v in data.items()}
                start = (self.writer.cursor + n - cap) % cap
                index: Index = (start + np.arange(cap, dtype=np.int64)) % cap
            else:
                index = self.writer.reserve(n)
            self.storage.write(index, data, validate=False)
            self.writer.commit(n)
            self._sync_storage_cursor()
            self.sampler.on_write(index, data)
        if isinstance(index, slice):
            return np.arange(index.start, index.stop, dtype=np.int64)
        return index

    def _after_write(self, index: Index, batch: dict[str, Any], srcs: list[Any]) -> None:
        """After a fast-path write (``storage.exact_sources`` + ``put``, under the lock): the
        disk cursor, then the sampler (given tensors unless it accepts numpy arrays)."""
        if self._set_cursor is not None:
            w = self.writer
            self._set_cursor(w.cursor, w.size, {"total": w.total})
        sampler = self.sampler
        kind = type(sampler)
        if kind is UniformSampler:
            return  # keeps no per-row state
        if kind not in _ANY_ARRAYS and any(type(v) is not torch.Tensor for v in srcs):
            batch = self.storage.spec.validate(batch)  # tensors for a custom sampler
        sampler.on_write(index, batch)

    def add(self, row: Mapping[str, Any]) -> int:
        """Append one row given without the leading dimension."""
        batch = {
            k: (v.unsqueeze(0) if isinstance(v, torch.Tensor) else np.asarray(v)[None])
            for k, v in row.items()
        }
        return int(self.extend(batch)[0])

    # sampling
    def sample(self, batch_size: int) -> Batch:
        """Sample a batch: fields, ``index`` (int64) and sampler extras such as ``weight``."""
        if self._closed:
            self._check_open()
        if type(batch_size) is not int and (
            not isinstance(batch_size, int) or isinstance(batch_size, bool)
        ):
            raise ValueError(f"batch_size: expected a positive int, got {batch_size!r}")
        if batch_size <= 0:
            raise ValueError(f"batch_size: expected a positive int, got {batch_size!r}")
        if self.prefetch:
            if self._prefetcher is None or self._prefetcher.batch_size != batch_size:
                self._stop_prefetch()
                self._prefetcher = _Prefetcher(self, batch_size, self.prefetch)
            return self._prefetcher.get()
        return self._sample_now(batch_size)

    def _sample_now(self, batch_size: int) -> Batch:
        with self._lock:
            ctx = self._ctx
            if self._placed:  # candidates anywhere; ``valid`` says which rows are starts
                if not self.storage.size:
                    raise ValueError("sample: the buffer is empty; extend it before sampling")
                ctx.size, ctx.cursor = self.capacity, 0
            else:
                writer = self.writer
                if not writer.size:
                    raise ValueError("sample: the buffer is empty; extend it before sampling")
                ctx.size, ctx.cursor = writer.size, writer.cursor
            if self._rows_at:
                ctx.valid = getattr(self.storage, "valid", None)
                ctx.window = getattr(self.storage, "window", None)
            sampler = self.sampler
            index, extra = sampler.sample(batch_size, ctx)
            # indices of a built-in sampler are stored rows: gather without a bounds check
            read = self._gather if type(sampler) in _IN_RANGE else None
            read = read or self.storage.read
            if index.ndim == 1:
                batch = read(index)
            else:  # windows [B, L] (sequence sampler): gather flat, then [B, L, ...]
                flat = read(index.reshape(-1))
                batch = {k: v.reshape(*index.shape, *v.shape[1:]) for k, v in flat.items()}
        from_numpy = torch.from_numpy
        batch["index"] = from_numpy(index)
        for key, value in extra.items():
            batch[key] = from_numpy(value)
        transforms = self.transforms
        if not transforms and self._host and self.delivery.identity:
            return batch  # host tensors, nothing to move or pin: delivery is the identity
        for transform in transforms:
            batch = transform(batch)
            if not isinstance(batch, dict):
                raise TypeError(
                    f"transform {transform!r}: expected it to return a dict, got {type(batch).__name__}"
                )
        return self.delivery(batch)

    def update_priorities(self, index: Any, priority: Any) -> None:
        """Forward new priorities to the sampler (prioritized sampling only)."""
        update = getattr(self.sampler, "update_priorities", None)
        if update is None:
            raise TypeError(
                f"update_priorities: {type(self.sampler).__name__} has no priorities; use PrioritizedSampler"
            )
        index = as_rows(index, self.capacity, "index", lazy=True)  # the sampler checks the range
        priority = _host_numpy(priority, "priority")
        with self._lock:
            update(index, priority)

    # lifecycle
    def close(self) -> None:
        """Stop the prefetch thread and close the storage (a disk storage flushes its metadata)."""
        if self._closed:
            return
        self._stop_prefetch()
        self._closed = True
        self.storage.close()

    def __enter__(self) -> ReplayBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("ReplayBuffer is closed")

    def _stop_prefetch(self) -> None:
        if self._prefetcher is not None:
            self._prefetcher.stop()
            self._prefetcher = None

    # state
    def _sync_storage_cursor(self) -> None:
        """A disk storage persists the writer position with its metadata (resume after a crash)."""
        if self._set_cursor is not None:
            self._set_cursor(self.writer.cursor, self.writer.size, {"total": self.writer.total})

    def _resume_from_storage(self) -> None:
        """A reopened disk storage knows its cursor; pick it up (resume after a crash)."""
        if self._placed:
            written = np.flatnonzero(self.storage.written)
            if written.size:
                self.sampler.on_write(written, self.storage.step_flags(written))
            return
        size = getattr(self.storage, "size", 0) or 0
        if size:
            self.writer.cursor = int(getattr(self.storage, "cursor", 0))
            self.writer.size = int(size)
            self.writer.total = int(getattr(self.storage, "extra", {}).get("total", size))
            index = np.arange(self.writer.size, dtype=np.int64)
            self.sampler.on_write(index, _fields_for(self.sampler, self.storage, self.writer.size))

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: storage, writer cursor, sampler state and RNG."""
        with self._lock:
            return {
                "format": _FORMAT,
                "storage": self.storage.state_dict(),
                "writer": self.writer.state_dict(),
                "sampler": self.sampler,
                "rng": self.rng.bit_generator.state,
            }

    def save(self, path: str | os.PathLike) -> Path:
        """Write the buffer to ``path`` (a file) atomically: temp file, fsync, rename."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        flush = getattr(self.storage, "flush", None)
        if flush is not None:
            flush()
        state = self.state_dict()
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            _fsync_dir(path.parent)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    @classmethod
    def load(
        cls,
        path: str | os.PathLike,
        transforms: Iterable[Transform] = (),
        device: str | torch.device | None = None,
        pin_memory: bool = False,
        prefetch: int = 0,
    ) -> ReplayBuffer:
        """Rebuild a buffer saved by :meth:`save`; it samples exactly what the original would."""
        state = torch.load(Path(path), weights_only=False)
        if state.get("format") != _FORMAT:
            raise ValueError(
                f"{path}: unknown buffer format {state.get('format')!r}, expected {_FORMAT}"
            )
        from rlstash.storage import storage_from_state

        storage = storage_from_state(state["storage"])
        rb = cls(
            storage,
            sampler=None,  # the saved sampler replaces the default below, untouched by reset()
            transforms=transforms,
            device=device,
            pin_memory=pin_memory,
            prefetch=prefetch,
        )
        rb._load_rest(state)
        return rb

    def _load_rest(self, state: dict[str, Any]) -> None:
        self.writer.load_state_dict(state["writer"])
        self.sampler = state["sampler"]
        self.rng.bit_generator.state = state["rng"]
        self._sync_storage_cursor()


class _Prefetcher:
    """A daemon thread that keeps ``depth`` batches ready; holds only a weak reference."""

    def __init__(self, buffer: ReplayBuffer, batch_size: int, depth: int) -> None:
        self.batch_size = batch_size
        self.queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self.stop_event = threading.Event()
        ref = weakref.ref(buffer)
        self.thread = threading.Thread(
            target=_prefetch_loop,
            args=(ref, batch_size, self.queue, self.stop_event),
            name="rlstash-prefetch",
            daemon=True,
        )
        self.thread.start()

    def get(self) -> Batch:
        while True:
            try:
                item = self.queue.get(timeout=1.0)
            except queue.Empty:
                if not self.thread.is_alive():
                    raise RuntimeError("prefetch thread stopped unexpectedly") from None
                continue
            if isinstance(item, BaseException):
                raise item
            return item

    def stop(self) -> None:
        self.stop_event.set()
        while True:  # unblock a put() waiting on a full queue
            try:
                self.queue.get_nowait()
            except queue.Empty:
                break
        self.thread.join(timeout=10.0)


def _prefetch_loop(
    ref: weakref.ref, batch_size: int, q: queue.Queue, stop: threading.Event
) -> None:
    while not stop.is_set():
        buffer = ref()
        if buffer is None:
            return
        try:
            item: Any = buffer._sample_now(batch_size)
            buffer.delivery.synchronize()  # hand over only data that is safe to read (I4)
        except BaseException as exc:  # noqa: BLE001 - surfaced to the caller by get()
            item = exc
        del buffer
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                break
            except queue.Full:
                continue
        if isinstance(item, BaseException):
            return


def _check_spec(sampler: Sampler, spec: Any) -> None:
    """Let the sampler refuse the storage's rows before anything is written (optional hook)."""
    check = getattr(sampler, "check_spec", None)
    if check is not None:
        check(spec)


def _fields_for(sampler: Sampler, storage: Storage, size: int) -> Batch:
    """The stored fields a sampler tracks itself (e.g. episode ends), for the first ``size`` rows."""
    tensors = getattr(storage, "tensors", {})
    keys = [k for k in getattr(sampler, "end_keys", ()) if k in tensors]
    return {k: tensors[k][:size] for k in keys}


def _host_numpy(value: Any, name: str) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        if value.requires_grad:
            value = value.detach()
        return (value if value.is_cpu else value.to("cpu")).numpy()
    try:
        return np.asarray(value)
    except Exception as exc:  # noqa: BLE001
        raise TypeError(f"{name}: expected a tensor or array, got {type(value).__name__}") from exc


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = ["ReplayBuffer", "Transform"]
