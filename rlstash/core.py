"""The core roles and how they fit together.

A replay buffer is three small parts joined in a few lines (see :mod:`rlstash.replay`)::

    index = writer.reserve(n)             # where the next n rows go (slice or index array)
    storage.write(index, batch)           # storage moves data; validated first
    writer.commit(n)                      # only now do the rows become visible
    sampler.on_write(index, batch)        # e.g. prioritized: new rows get the max priority

    idx, extra = sampler.sample(batch_size, ctx)   # indices only (host numpy int64)
    batch = storage.read(idx)                      # gather rows
    for t in transforms: batch = t(batch)          # plain dict -> dict callables
    batch = deliver(batch, device, pin_memory)     # rlstash.device: last, after transforms

Indices are host-side ``numpy.int64`` arrays, or a ``slice`` for a contiguous run (the
common case when writing). Storages accept both. Devices are arguments, never hidden state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from rlstash.spec import Batch, Spec

Index = np.ndarray | slice


@runtime_checkable
class Storage(Protocol):
    """Preallocated struct-of-arrays: one contiguous tensor (or file) per field."""

    spec: Spec
    capacity: int
    device: torch.device  # where the rows live; "cpu" for RAM and disk

    @property
    def nbytes(self) -> int:
        """Bytes held by the data (exact, known before allocation)."""
        ...

    def write(self, index: Index, batch: Batch, validate: bool = True) -> None:
        """Write ``batch`` rows at ``index``; validates first so a bad batch writes nothing."""
        ...

    def read(self, index: Index, out: Batch | None = None) -> Batch:
        """Gather rows at ``index`` (into ``out`` when given, reusing its memory)."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


@dataclass
class SampleContext:
    """What a sampler may look at when it picks indices."""

    size: int  # rows stored (<= capacity)
    cursor: int  # next write position; when full, the oldest row is at ``cursor``
    capacity: int
    rng: np.random.Generator
    valid: np.ndarray | None = None  # bool[capacity]: True where a row may be returned
    # Maps window starts [B] to the indices of ``length`` consecutive steps [B, length]. None
    # means a plain ring: (start + arange(length)) % capacity. Storages whose consecutive
    # steps are not consecutive rows (the stream storage's per-env lanes) provide it.
    window: Callable[[np.ndarray, int], np.ndarray] | None = None


@runtime_checkable
class Sampler(Protocol):
    """Picks indices; never touches data."""

    def reset(self, capacity: int) -> None:
        """Bind to a buffer of ``capacity`` rows (allocates per-row state such as priorities)."""
        ...

    def on_write(self, index: Index, batch: Batch) -> None:
        """Called after rows at ``index`` were written."""
        ...

    def sample(
        self, batch_size: int, ctx: SampleContext
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Return ``batch_size`` indices and extra per-row arrays (e.g. ``weight``)."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@runtime_checkable
class Writer(Protocol):
    """Decides where rows go; ``reserve`` then ``commit`` so a failed write changes nothing."""

    capacity: int
    cursor: int
    size: int

    def reserve(self, n: int) -> Index: ...

    def commit(self, n: int) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...
