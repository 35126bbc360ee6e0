"""The placement of a storage that places rows itself (the stream storage's per-env lanes).

:class:`SelfPlacement` is the :class:`~rlstash.core.Placement` of a
:class:`~rlstash.core.PlacedStorage`: the storage validates a batch, says where its rows went,
which rows are valid sample starts and how windows of consecutive steps run; there is no
writer. The indexed counterpart is :class:`~rlstash.storage.ring.RingPlacement`;
:func:`placement_for` picks between them from the contracts a storage declares.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from rlstash.core import (
    Index,
    PlacedStorage,
    Placement,
    SampleContext,
    Sampler,
    Storage,
    declares,
    missing_members,
)
from rlstash.spec import Batch
from rlstash.storage.ring import RingPlacement, take_rows


class SelfPlacement:
    """A :class:`~rlstash.core.PlacedStorage` as a buffer's placement.

    Args:
        storage: the placed storage (``StreamStorage``).
        sampler: the buffer's sampler: indices it declares valid are gathered unchecked.
        check_finite: False turns off the storage's own non-finite check (its
            ``check_finite``): the storage validates its own batches.
    """

    writer = None  # the storage places rows itself

    def __init__(self, storage: PlacedStorage, sampler: Sampler, check_finite: bool = True) -> None:
        self.storage = storage
        self.trusted = declares(sampler, "returns_valid_indices")  # no validity re-check
        if not check_finite:
            storage.check_finite = False  # type: ignore[attr-defined]

    @property
    def size(self) -> int:
        return int(self.storage.size)

    def prepare(self, batch: Any) -> Any:
        """As given: the storage validates it in :meth:`place` (a bad batch writes nothing)."""
        return batch

    def place(self, prepared: Any) -> tuple[Index, dict[str, np.ndarray]]:
        """``storage.extend``; the sampler is given the rows' episode-end flags."""
        index = self.storage.extend(prepared)
        return index, self.storage.step_flags(index)

    def context(self, ctx: SampleContext) -> SampleContext:
        """Candidates anywhere in ``[0, capacity)``; ``valid`` says which rows are starts and
        ``window`` how a start's consecutive steps run in the lanes."""
        storage = self.storage
        if not storage.size:
            raise ValueError("sample: the buffer is empty; extend it before sampling")
        ctx.size, ctx.cursor = storage.capacity, 0
        ctx.valid, ctx.window = storage.valid, storage.window
        return ctx

    def take(self, index: np.ndarray) -> Batch:
        """Gather the rows at ``index`` (``gather`` when the sampler vouches for them)."""
        return take_rows(self.storage, self.trusted, index)

    def resume(self) -> Iterator[tuple[np.ndarray, dict[str, np.ndarray]]]:
        """The rows a reopened storage holds, with their episode-end flags."""
        written = np.flatnonzero(self.storage.written)
        if written.size:
            yield written, self.storage.step_flags(written)

    def flush(self) -> None:
        self.storage.flush()

    def state_dict(self) -> None:
        return None  # no writer: the storage's own state_dict holds its positions

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        pass


def placement_for(storage: Any, sampler: Sampler, check_finite: bool = True) -> Placement:
    """The placement of ``storage``: its own when it places rows itself, else a ring
    (:func:`check_storage` first)."""
    if check_storage(storage):
        return SelfPlacement(storage, sampler, check_finite)
    return RingPlacement(storage, sampler, check_finite)


def check_storage(storage: Any) -> bool:
    """True for a :class:`~rlstash.core.PlacedStorage`, False for a
    :class:`~rlstash.core.Storage`; TypeError naming what it lacks when it is neither."""
    if isinstance(storage, PlacedStorage):
        return True
    if isinstance(storage, Storage):
        return False
    raise TypeError(
        f"storage: expected a Storage (TensorStorage, MemmapStorage, TieredStorage) or a "
        f"PlacedStorage (StreamStorage), got {type(storage).__name__}, which lacks "
        f"{missing_members(storage, Storage)} (see rlstash.core)"
    )


__all__ = ["SelfPlacement", "check_storage", "placement_for"]
