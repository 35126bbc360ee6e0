"""TieredStorage: the newest rows on a hot tier (a GPU, or RAM), older ones on a cold tier.

::

    store = TieredStorage(hot=TensorStorage(spec, 50_000, "cuda"),
                          cold=MemmapStorage(spec, 5_000_000, "/data/replay"))
    rb = ReplayBuffer(store)          # capacity 5,000,000: the cold tier's
    batch = store.read(idx)           # one batch on cuda, whatever tier each row is in

Logical rows are the cold tier's rows: ``capacity = cold.capacity`` and row ``i`` lives at
cold row ``i`` once it has left the hot tier. The hot tier is a write-back cache of the most
recently written rows: a write goes into the next hot slots (a ring of ``hot.capacity``
slots); when those are still taken, the oldest ``block`` hot rows move down to the cold tier
in one write. Rows move on writes only, in blocks, never per sample.

A read gathers hot rows on the hot device and cold rows on the host, and returns one batch on
the hot device. With a CUDA hot tier and a host cold tier, cold rows are gathered into a
pinned staging buffer, copied with ``non_blocking=True`` on the caller's current stream, and
an event recorded behind the copy is synchronized before the batch is returned (so the
staging buffer is free again and no caller can see data in flight; invariant I4). All CUDA
calls go through :class:`~rlstash.device.CudaOps`; with a CPU hot tier none is made (I1).

``flush()`` copies the hot rows down (they stay cached) and then flushes the cold tier, so a
disk cold tier reopens with every row written before the flush. The writer position given to
:meth:`set_cursor` reaches the cold tier only then, so it never claims rows that are not
there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from rlstash.core import Index, PersistentStorage, Storage
from rlstash.device import CudaOps
from rlstash.indices import normalize_index
from rlstash.memory import check_host_state
from rlstash.spec import Batch, Spec
from rlstash.storage import register_kind
from rlstash.storage.ram import TensorStorage, spec_mismatch


class TieredStorage:
    """Hot tier (newest rows, any device) over a cold tier (the rest, disk or RAM).

    Args:
        hot: a storage on the device batches are delivered from; its capacity is the cache size.
        cold: the storage that holds every row that left the hot tier; its capacity is the
            logical capacity (> ``hot.capacity``), same spec as ``hot``.
        block: rows moved down at a time (default ``hot.capacity // 8``, at least 1).
        ops: the CUDA operations (tests pass fakes); used only when ``hot`` is on CUDA.
    """

    def __init__(
        self, hot: Storage, cold: Storage, block: int | None = None, ops: CudaOps | None = None
    ) -> None:
        diff = spec_mismatch(cold.spec, hot.spec)
        if diff:
            raise ValueError(f"hot: its spec differs from the cold tier's: {diff}")
        if not hot.capacity < cold.capacity:
            raise ValueError(
                f"hot: capacity {hot.capacity} must be smaller than the cold tier's "
                f"({cold.capacity}); the cold tier holds every row, the hot one the newest"
            )
        block = max(1, hot.capacity // 8) if block is None else block
        if not isinstance(block, int) or isinstance(block, bool) or not 1 <= block <= hot.capacity:
            raise ValueError(f"block: expected an int in [1, {hot.capacity}], got {block!r}")
        self.hot, self.cold, self.block = hot, cold, block
        self.spec: Spec = cold.spec
        self.capacity = cold.capacity
        self.device = torch.device(hot.device)
        self.ops = ops or CudaOps()
        check_host_state("TieredStorage's row map", self.plan_bytes(self.capacity, hot.capacity),
                         self.capacity)  # fmt: skip
        self._home = np.full(self.capacity, -1, np.int64)  # logical row -> hot slot, -1: cold
        self._owner = np.full(hot.capacity, -1, np.int64)  # hot slot -> logical row, -1: free
        self._next = 0  # next hot slot
        self._staging: Batch = {}  # pinned host buffers for cold rows bound to CUDA
        # a cold tier that keeps the writer position with its rows (disk) resumes from it
        self._persistent = isinstance(cold, PersistentStorage)
        self._cursor, self._size, self._extra = 0, 0, {}
        if self._persistent:
            self._cursor, self._size = int(cold.cursor), int(cold.size)
            self._extra: dict[str, Any] = dict(cold.extra or {})
        self._closed = False

    @staticmethod
    def plan_bytes(capacity: int, hot_capacity: int) -> dict[str, int]:
        """Host bytes of the row map a tiered storage allocates besides its tiers (checked
        against free RAM before it is): 8 B per logical row and per hot slot."""
        return {"row -> hot slot": 8 * capacity, "hot slot -> row": 8 * hot_capacity}

    @property
    def nbytes(self) -> int:
        """Bytes of both tiers' data."""
        return self.hot.nbytes + self.cold.nbytes

    @property
    def in_hot(self) -> np.ndarray:
        """bool[capacity]: rows currently served from the hot tier."""
        return self._home >= 0

    # ------------------------------------------------------------------ writing
    def write(self, index: Index, batch: Batch, validate: bool = True) -> None:
        """Write rows at logical ``index`` into the hot tier (moving a block down if needed).

        Validated first (a bad batch writes nothing). A batch larger than the hot tier sends
        its leading rows straight to the cold tier. Duplicate indices: the last row wins.
        """
        self._check_open()
        if validate:
            batch = self.spec.validate(batch)
        idx, n = normalize_index(index, self.capacity)
        if isinstance(idx, slice):
            idx = np.arange(idx.start, idx.stop, dtype=np.int64)
        rows = len(next(iter(batch.values()))) if batch else 0
        if rows != n:
            raise ValueError(f"index: selects {n} rows but the batch has {rows} rows")
        n_hot = self.hot.capacity
        if n > n_hot:  # only the last n_hot rows can be cached
            head = n - n_hot
            self._unmap(idx[:head])
            self.cold.write(idx[:head], {k: v[:head] for k, v in batch.items()}, validate=False)
            idx, batch, n = idx[head:], {k: v[head:] for k, v in batch.items()}, n_hot
        slots = (self._next + np.arange(n)) % n_hot  # [n]
        if (self._owner[slots] >= 0).any():
            self._move_down(max(n, self.block))
        self._unmap(idx)
        self.hot.write(slots, batch, validate=False)
        self._owner[slots] = idx
        self._home[idx] = slots  # duplicates: numpy keeps the last
        stale = self._home[idx] != slots
        self._owner[slots[stale]] = -1
        self._next = int((self._next + n) % n_hot)

    def _unmap(self, idx: np.ndarray) -> None:
        old = self._home[idx]
        self._owner[old[old >= 0]] = -1
        self._home[idx] = -1

    def _move_down(self, count: int) -> None:
        """Move the rows of the next ``count`` hot slots to the cold tier in one write."""
        region = (self._next + np.arange(count)) % self.hot.capacity
        slots = region[self._owner[region] >= 0]
        rows = self._owner[slots]
        self.cold.write(rows, self.hot.read(slots), validate=False)
        self._home[rows] = -1
        self._owner[slots] = -1

    # ------------------------------------------------------------------ reading
    def read(self, index: Index, out: Batch | None = None) -> Batch:
        """Gather rows at logical ``index`` from both tiers: one batch on the hot device."""
        self._check_open()
        idx, n = normalize_index(index, self.capacity)
        if isinstance(idx, slice):
            idx = np.arange(idx.start, idx.stop, dtype=np.int64)
        home = self._home[idx]
        hot = home >= 0
        if hot.all():
            return self.hot.read(home, out)
        if not hot.any():
            res = self._from_cold(idx)
        else:
            part_hot, part_cold = self.hot.read(home[hot]), self._from_cold(idx[~hot])
            where_hot = self._on_device(np.flatnonzero(hot))  # [h] output positions
            where_cold = self._on_device(np.flatnonzero(~hot))  # [c]
            res = {}
            for k, t in part_hot.items():
                buf = t.new_empty((n, *t.shape[1:]))  # [n, ...] on the hot device
                buf.index_copy_(0, where_hot, t)
                buf.index_copy_(0, where_cold, part_cold[k])
                res[k] = buf
        if out is None:
            return res
        for k, v in res.items():
            out[k].copy_(v)
        return out

    def _from_cold(self, idx: np.ndarray) -> Batch:
        """Cold rows on the hot device: pinned staging -> async copy -> event -> synchronize."""
        dev = self.device
        cold_dev = torch.device(self.cold.device)
        if dev == cold_dev:
            return self.cold.read(idx)
        if dev.type != "cuda" or cold_dev.type != "cpu":
            return {k: self.ops.to(v, dev) for k, v in self.cold.read(idx).items()}  # blocking
        stage = self._stage(idx.size)
        self.cold.read(idx, out=stage)  # host gather straight into pinned memory
        res = {k: self.ops.to(v, dev, non_blocking=True) for k, v in stage.items()}  # async H2D
        done = self.ops.new_event()
        done.record(self.ops.current_stream(dev))
        done.synchronize()  # the copies landed: staging is free, the batch is safe to use
        return res

    def _stage(self, n: int) -> Batch:
        """Pinned buffers with room for ``n`` rows (grown by doubling, then reused)."""
        have = next(iter(self._staging.values())).shape[0] if self._staging else 0
        if have < n:
            rows = max(n, 2 * have)
            self._staging = {
                k: self.ops.empty_pinned(torch.Size((rows, *f.shape)), f.dtype)
                for k, f in self.spec.items()
            }
        return {k: v[:n] for k, v in self._staging.items()}

    def _on_device(self, a: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(a)
        return t if self.device.type == "cpu" else self.ops.to(t, self.device)

    # ------------------------------------------------------------------ position and state
    @property
    def cursor(self) -> int:
        """The writer position last given to :meth:`set_cursor`."""
        return self._cursor

    @property
    def size(self) -> int:
        """The row count last given to :meth:`set_cursor`."""
        return self._size

    @property
    def extra(self) -> dict[str, Any]:
        """The small dict last given to :meth:`set_cursor`."""
        return self._extra

    @property
    def valid(self) -> np.ndarray | None:
        """The cold tier's torn-row mask after a crash (rows it may hold half-written), or
        None. Conservative: a row rewritten since sits whole in the hot tier meanwhile."""
        return self.cold.valid if self._persistent else None

    def set_cursor(self, cursor: int, size: int, extra: Mapping[str, Any] | None = None) -> None:
        """Record the writer position; it reaches a disk cold tier at the next :meth:`flush`."""
        if not (0 <= cursor < self.capacity and 0 <= size <= self.capacity):
            raise ValueError(
                f"cursor/size: expected 0 <= cursor < {self.capacity} and 0 <= size <= "
                f"{self.capacity}, got cursor={cursor} size={size}"
            )
        self._cursor, self._size = int(cursor), int(size)
        if extra is not None:
            self._extra = dict(extra)

    def _copy_down(self) -> None:
        """Copy every hot row to its cold row (the rows stay cached in the hot tier)."""
        slots = np.flatnonzero(self._owner >= 0)
        if slots.size:
            self.cold.write(self._owner[slots], self.hot.read(slots), validate=False)

    def flush(self) -> None:
        """Copy the hot rows down, pass the writer position on, and flush the cold tier."""
        self._check_open()
        self._copy_down()
        if self._persistent:
            self.cold.set_cursor(self._cursor, self._size, self._extra)
            self.cold.flush()

    def state_dict(self) -> dict[str, Any]:
        """Flushes, then ``{"kind", "hot": {capacity, device}, "block", "cursor", "size",
        "extra", "cold"}``: every row is in the cold tier's state."""
        self.flush()
        return {
            "kind": "TieredStorage",
            "hot": {"capacity": self.hot.capacity, "device": str(self.device)},
            "block": self.block,
            "cursor": self._cursor,
            "size": self._size,
            "extra": dict(self._extra),
            "cold": self.cold.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load the rows into the cold tier; the hot tier starts empty."""
        self._check_open()
        self.cold.load_state_dict(state["cold"])
        self._home[:] = -1
        self._owner[:] = -1
        self._next = 0
        self.set_cursor(int(state.get("cursor", 0)), int(state.get("size", 0)), state.get("extra"))

    @classmethod
    def from_state_dict(
        cls, state: Mapping[str, Any], device: str | torch.device | None = None
    ) -> TieredStorage:
        """Rebuild: the cold tier from its state (a disk one reopens its directory), an empty
        hot tier on ``device`` (default: the saved one)."""
        from rlstash.storage import storage_from_state

        cold = storage_from_state(dict(state["cold"]))
        hot = TensorStorage(
            cold.spec, int(state["hot"]["capacity"]), device or state["hot"]["device"]
        )
        store = cls(hot, cold, block=int(state["block"]))
        store.load_state_dict(state)
        return store

    def close(self) -> None:
        """Flush a cold tier that persists (disk), then close both tiers (idempotent)."""
        if self._closed:
            return
        try:
            if self._persistent:
                self.flush()
        finally:
            self._closed = True
            self._staging = {}
            self.hot.close()
            self.cold.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("TieredStorage is closed")

    def __enter__(self) -> TieredStorage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"TieredStorage(hot={type(self.hot).__name__}[{self.hot.capacity}] on {self.device}, "
            f"cold={type(self.cold).__name__}[{self.cold.capacity}], block={self.block})"
        )


register_kind("TieredStorage", lambda state, device: TieredStorage.from_state_dict(state, device))

__all__ = ["TieredStorage"]
