"""Windows of consecutive steps that never cross an episode end or the write cursor; see
:mod:`rlstash.sampler` for the sampler contract."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlstash.core import Index, SampleContext
from rlstash.indices import as_rows
from rlstash.memory import check_host_state
from rlstash.sampler.checks import (
    REJECTION_ROUNDS,
    as_numpy,
    check_batch_size,
    check_capacity,
    check_ctx,
    check_state,
)
from rlstash.sampler.kinds import register_kind
from rlstash.spec import Batch, Spec


class SequenceSampler:
    """Windows of ``length`` consecutive steps inside one episode and one write era.

    :meth:`sample` returns ``idx`` of shape ``[B, length]`` (int64): row ``j`` of window
    ``b`` is step ``j`` after its start. On a plain ring ``idx[b, j] = (start_b + j) %
    capacity``; a storage whose consecutive steps are not consecutive rows (the stream
    storage's per-env lanes) passes ``ctx.window(starts, length)`` and its windows are used
    instead. A start is valid when

    * on a plain ring, the window lies in stored rows and does not cross the write cursor:
      in age order (oldest row first: row ``cursor`` once full, else row 0) it is positions
      ``a .. a+length-1`` with ``a + length <= size``, so it never mixes the newest and the
      oldest data nor touches unwritten rows; with ``ctx.window`` every row is stored
      (``< size``) and the storage's ``ctx.valid`` keeps windows off its newest rows;
    * no step but the last carries an episode end (any of ``end_keys`` set);
    * every row of it is in ``ctx.valid`` (when given).

    Starts are uniform over the valid ones: a start is drawn uniformly among the candidates
    and rejected windows are redrawn up to 8 times, then drawn from the exact list of valid
    starts (``O(size * length)``, only when most windows are rejected). Episode ends are
    tracked from :meth:`on_write`, which must see at least one of ``end_keys`` per batch.
    """

    # guarantees (rlstash.core.Sampler): indices are stored rows; on_write takes numpy arrays
    returns_valid_indices = True
    accepts_arrays = True

    def __init__(
        self, length: int, end_keys: tuple[str, ...] = ("terminated", "truncated")
    ) -> None:
        if not isinstance(length, int | np.integer) or isinstance(length, bool) or length < 1:
            raise ValueError(f"length: expected an int >= 1, got {length!r}")
        if (
            isinstance(end_keys, str)
            or not end_keys
            or not all(isinstance(k, str) for k in end_keys)
        ):
            raise TypeError(
                f"end_keys: expected a non-empty tuple of field names, got {end_keys!r}"
            )
        self.length = int(length)
        self.end_keys = tuple(end_keys)
        self.capacity = 0
        self._ends = np.zeros(0, dtype=bool)
        self._steps = np.arange(self.length, dtype=np.int64)  # [L]

    def plan_bytes(self, capacity: int) -> dict[str, int]:
        """Exact bytes of its arrays: one episode-end flag per row (made by :meth:`reset`) and
        the ``length`` int64 step offsets of a window."""
        return {"episode ends": check_capacity(capacity), "window offsets": 8 * self.length}

    def reset(self, capacity: int) -> None:
        """Bind to ``capacity`` rows (refused before allocating when it does not fit in RAM)."""
        capacity = check_capacity(capacity)
        if self.length > capacity:
            raise ValueError(f"length: {self.length} is longer than the buffer ({capacity} rows)")
        check_host_state("SequenceSampler", self.plan_bytes(capacity), capacity)
        self.capacity = capacity
        self._ends = np.zeros(capacity, dtype=bool)  # True where an episode ended at that row

    def check_spec(self, spec: Spec) -> None:
        """Refuse rows without episode-end flags, when bound to a buffer (before any write).

        At least one of ``end_keys`` must be a field of ``spec``, each present one a scalar
        bool or integer per row; else ValueError/TypeError naming what is missing and the fix.
        """
        present = [k for k in self.end_keys if k in spec]
        if not present:
            raise ValueError(
                f"spec: SequenceSampler needs at least one of the end flags {list(self.end_keys)} "
                f"as a field to find episode ends, got fields {list(spec)}; add a "
                f"{self.end_keys[0]!r} field (():bool), or pass end_keys=(...) naming your flags"
            )
        for key in present:
            f = spec[key]
            if f.dtype.is_floating_point or f.dtype.is_complex:
                raise TypeError(
                    f"field {key!r}: SequenceSampler reads it as episode-end flags, got "
                    f"{f.describe()}; store it as bool (or an integer type)"
                )
            if f.shape != ():
                raise ValueError(
                    f"field {key!r}: SequenceSampler expects one flag per row (shape ()), got "
                    f"{f.describe()}"
                )

    def on_write(self, index: Index, batch: Batch) -> None:
        """Record the episode-end flags of the rows written at ``index``."""
        if not self.capacity:
            raise RuntimeError("SequenceSampler: call reset(capacity) before using it")
        idx = as_rows(index, self.capacity).ravel()
        present = [k for k in self.end_keys if k in batch]
        if not present:
            raise ValueError(
                f"batch: SequenceSampler needs at least one of the end flags {list(self.end_keys)} "
                f"to find episode ends, got fields {sorted(batch)}"
            )
        flags = np.zeros(idx.size, dtype=bool)
        for key in present:
            f = as_numpy(batch[key], f"field {key!r}")
            if f.dtype.kind not in "biu":
                raise TypeError(
                    f"field {key!r}: expected bool or integer flags, got dtype {f.dtype}"
                )
            if f.size != idx.size or (f.ndim and f.shape[0] != idx.size):
                raise ValueError(
                    f"field {key!r}: expected shape [{idx.size}] (one flag per written row), "
                    f"got {list(f.shape)}"
                )
            flags |= f.reshape(idx.size) != 0
        self._ends[idx] = flags

    def sample(
        self, batch_size: int, ctx: SampleContext
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Window indices ``[batch_size, length]`` (int64) and no extras."""
        check_batch_size(batch_size)
        check_ctx(ctx, self.capacity)
        n, length = ctx.size, self.length
        if n < length:
            raise ValueError(f"cannot sample windows of length {length}: only {n} rows are stored")
        # candidates: age positions 0..n-length on a plain ring, any stored row with ctx.window
        span = n if ctx.window is not None else n - length + 1
        cand = ctx.rng.integers(0, span, batch_size)  # [B]
        rows = self._rows(cand, ctx)  # [B, L]
        redo = np.flatnonzero(~self._window_ok(rows, ctx))
        for _ in range(REJECTION_ROUNDS):
            if not redo.size:
                return rows, {}
            cand[redo] = ctx.rng.integers(0, span, redo.size)
            rows[redo] = self._rows(cand[redo], ctx)
            redo = redo[~self._window_ok(rows[redo], ctx)]
        if redo.size:
            starts = self._valid_starts(span, ctx)
            rows[redo] = self._rows(starts[ctx.rng.integers(0, starts.size, redo.size)], ctx)
        return rows, {}

    def _rows(self, cand: np.ndarray, ctx: SampleContext) -> np.ndarray:
        """[R] candidates -> [R, L] rows of their windows (see the class doc)."""
        if ctx.window is None:
            oldest = ctx.cursor if ctx.size == self.capacity else 0
            return (cand[:, None] + (self._steps + oldest)) % self.capacity
        rows = ctx.window(cand, self.length)
        if np.shape(rows) != (cand.size, self.length):
            raise ValueError(
                f"ctx.window: expected int rows of shape [{cand.size}, {self.length}], got "
                f"{list(np.shape(rows))}"
            )
        rows = as_rows(rows, self.capacity, "ctx.window")
        return rows

    def _window_ok(self, rows: np.ndarray, ctx: SampleContext) -> np.ndarray:
        """[R, L] window rows -> [R] True where the window is valid."""
        ok = ~self._ends[rows[:, :-1]].any(axis=1)  # an end only on the last step
        if ctx.valid is not None:
            ok &= ctx.valid[rows].all(axis=1)
        if ctx.window is not None and ctx.size < self.capacity:
            ok &= rows.max(axis=1) < ctx.size  # stored rows only
        return ok

    def _valid_starts(self, span: int, ctx: SampleContext) -> np.ndarray:
        """All valid candidates (exact); raises ValueError if there are none."""
        if ctx.window is None:
            starts = self._ring_starts(span, ctx)
        else:  # O(size * length), in chunks to bound the memory
            step = max(1, 2**20 // self.length)
            found = [
                a[self._window_ok(self._rows(a, ctx), ctx)]
                for a in (np.arange(i, min(i + step, span)) for i in range(0, span, step))
            ]
            starts = np.concatenate(found)
        if not starts.size:
            n, valid = ctx.size, ctx.valid
            n_valid = n if valid is None else int(np.count_nonzero(valid[:n]))
            raise ValueError(
                f"cannot sample windows of length {self.length}: none of the {n} stored rows "
                f"starts one that stays inside an episode ({int(self._ends.sum())} episode ends "
                f"stored, {n_valid} valid rows); use a shorter length or store longer episodes"
            )
        return starts

    def _ring_starts(self, span: int, ctx: SampleContext) -> np.ndarray:
        """Valid age positions on a plain ring, by running counts (O(size))."""
        n, length = ctx.size, self.length
        oldest = ctx.cursor if n == self.capacity else 0
        order = (np.arange(n, dtype=np.int64) + oldest) % self.capacity  # rows, oldest first
        ends = np.concatenate([[0], np.cumsum(self._ends[order])])  # [n + 1] running count
        ok = ends[length - 1 : length - 1 + span] == ends[:span]  # no end in a .. a+L-2
        if ctx.valid is not None:
            bad = np.concatenate([[0], np.cumsum(~ctx.valid[order])])
            ok &= bad[length : length + span] == bad[:span]  # every row of a .. a+L-1 valid
        return np.flatnonzero(ok)

    def state_dict(self) -> dict[str, Any]:
        return {
            "kind": "sequence",
            "capacity": self.capacity,
            "length": self.length,
            "end_keys": list(self.end_keys),
            "ends": self._ends.copy(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_state(state, "sequence", self.capacity)
        if int(state["length"]) != self.length:
            raise ValueError(
                f"length: the saved sampler has {state['length']}, this one {self.length}"
            )
        self.end_keys = tuple(state["end_keys"])
        self._ends[:] = np.asarray(state["ends"], dtype=bool)


# --------------------------------------------------------------------------- helpers


register_kind(
    "sequence", lambda state: SequenceSampler(int(state["length"]), tuple(state["end_keys"]))
)
