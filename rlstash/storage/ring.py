"""The placement of an indexed storage: a ring writer says where rows go (first in, first out).

:class:`RingPlacement` joins a :class:`~rlstash.core.Storage` (``TensorStorage``,
``MemmapStorage``, ``TieredStorage``, a user's) and a :class:`~rlstash.writer.RingWriter`
into the :class:`~rlstash.core.Placement` a :class:`~rlstash.replay.ReplayBuffer` works
through; the stream storage's counterpart is :class:`~rlstash.storage.placement.SelfPlacement`.

Which path a batch takes is decided here from the contracts the parts declare
(:mod:`rlstash.core`): a storage with :class:`~rlstash.core.FastRows` is written without casts
(``exact_sources`` + ``put``) when the batch already has the stored dtypes and shapes, and
gathered unchecked when the sampler declares ``returns_valid_indices``; a
:class:`~rlstash.core.PersistentStorage` keeps the writer position with its rows (resume after
a crash) and may mark rows a crash tore, which are never sampled. Anything else takes the
checked paths (``spec.validate``, ``write``, ``read``), never a silently different one.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from rlstash.core import (
    FastRows,
    Index,
    PersistentStorage,
    SampleContext,
    Sampler,
    Storage,
    declares,
)
from rlstash.finite import check_finite
from rlstash.spec import Batch
from rlstash.writer import RingWriter

RESUME_CHUNK = 1 << 16  # rows per read when a reopened storage replays its rows to a sampler

# A prepared batch: (sources in storage order or None, rows, the batch or its validated data).
# Sources are set when the batch can be ``put`` as it is (FastRows.exact_sources).
Prepared = tuple[list[Any] | None, int, Any]


class RingPlacement:
    """An indexed ``storage`` filled as a ring by a :class:`~rlstash.writer.RingWriter`.

    Args:
        storage: the rows (any :class:`~rlstash.core.Storage`).
        sampler: the buffer's sampler; its declared guarantees pick the read path and what its
            ``on_write`` is given (see :func:`~rlstash.core.declares`).
        check_finite: refuse NaN/+-inf in a float field (invariant I10).
    """

    def __init__(self, storage: Storage, sampler: Sampler, check_finite: bool = True) -> None:
        self.storage = storage
        self.writer: RingWriter = RingWriter(storage.capacity)
        self.check_finite = bool(check_finite)
        self.fast = isinstance(storage, FastRows)  # TensorStorage, MemmapStorage
        self.persistent = isinstance(storage, PersistentStorage)  # disk, tiered
        # indices a sampler vouches for are gathered unchecked (no bounds check)
        self.trusted = self.fast and declares(sampler, "returns_valid_indices")
        self.as_tensors = not declares(sampler, "accepts_arrays")
        # float fields, checked on the fast path (the checked path checks in spec.validate)
        self.floats = [k for k, f in storage.spec.items() if f.dtype.is_floating_point]

    @property
    def size(self) -> int:
        return self.writer.size

    # writing
    def prepare(self, batch: Any) -> Prepared:
        """The batch's sources when it can be written as it is (non-finite floats refused),
        else the batch validated (:meth:`~rlstash.spec.Spec.validate`)."""
        if self.fast:
            exact = self.storage.exact_sources(batch)
            if exact is not None:
                if self.check_finite and self.floats:  # I10: the same objects as the sources
                    check_finite({k: batch[k] for k in self.floats})
                if exact[1] <= self.writer.capacity:
                    return exact[0], exact[1], batch
        data = self.storage.spec.validate(batch, finite=self.check_finite)
        return None, next(iter(data.values())).shape[0], data

    def place(self, prepared: Prepared) -> tuple[Index, Any]:
        """Reserve, write, commit; returns the rows written and the batch for the sampler
        (tensors unless it declares ``accepts_arrays``). A batch with more rows than the
        capacity keeps its last ``capacity`` rows, exactly as writing them one by one would."""
        sources, n, batch = prepared
        writer, storage = self.writer, self.storage
        if sources is not None:
            index = writer.reserve(n)
            storage.put(index, sources)
            writer.commit(n)
            self.sync()
            if self.as_tensors and any(type(v) is not torch.Tensor for v in sources):
                batch = storage.spec.validate(batch)  # tensors for a sampler that needs them
            return index, batch
        cap = writer.capacity
        if n > cap:
            batch = {k: v[n - cap :] for k, v in batch.items()}
            start = (writer.cursor + n - cap) % cap
            index: Index = (start + np.arange(cap, dtype=np.int64)) % cap
        else:
            index = writer.reserve(n)
        storage.write(index, batch, validate=False)
        writer.commit(n)
        self.sync()
        return index, batch

    # sampling
    def context(self, ctx: SampleContext) -> SampleContext:
        """The stored rows of the ring, less those a crash may have torn (never sampled)."""
        writer = self.writer
        if not writer.size:
            raise ValueError("sample: the buffer is empty; extend it before sampling")
        ctx.size, ctx.cursor = writer.size, writer.cursor
        if self.persistent:
            ctx.valid = self.storage.valid
        return ctx

    def take(self, index: np.ndarray) -> Batch:
        """Gather the rows at ``index`` (``gather`` when the sampler vouches for them)."""
        return take_rows(self.storage, self.trusted, index)

    # state
    def sync(self) -> None:
        """A persistent storage keeps the writer position with its rows (resume after a crash)."""
        if self.persistent:
            w = self.writer
            self.storage.set_cursor(w.cursor, w.size, {"total": w.total})

    def resume(self) -> Iterator[tuple[np.ndarray, Any]]:
        """A reopened persistent storage holds rows: take up its writer position and yield its
        rows (views of the stored rows when it has them, else read in chunks)."""
        storage = self.storage
        if not self.persistent or not storage.size:
            return
        writer, size = self.writer, int(storage.size)
        writer.cursor, writer.size = int(storage.cursor), size
        writer.total = int((storage.extra or {}).get("total", size))
        if self.fast:  # views of the stored rows, no copy
            yield np.arange(size, dtype=np.int64), {k: t[:size] for k, t in storage.tensors.items()}
            return
        for start in range(0, size, RESUME_CHUNK):
            index = np.arange(start, min(size, start + RESUME_CHUNK), dtype=np.int64)
            yield index, storage.read(index)

    def flush(self) -> None:
        if self.persistent:
            self.storage.flush()

    def state_dict(self) -> dict[str, Any]:
        return self.writer.state_dict()

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        self.writer.load_state_dict(state)
        self.sync()


def take_rows(storage: Any, trusted: bool, index: np.ndarray) -> Batch:
    """The rows at ``index`` ([B]) or windows of rows ([B, L]): the storage's unchecked
    ``gather`` when the sampler vouches for the indices (``trusted``), else ``read``."""
    read = storage.gather if trusted else storage.read
    return read(index) if index.ndim == 1 else gather_windows(read, index)


def gather_windows(read: Any, index: np.ndarray) -> Batch:
    """Windows ``[B, L]`` of a sequence sampler: gathered flat, returned as ``[B, L, ...]``."""
    flat = read(index.reshape(-1))
    return {k: v.reshape(*index.shape, *v.shape[1:]) for k, v in flat.items()}


__all__ = ["RingPlacement", "gather_windows", "take_rows"]
