"""Samplers pick row indices; storages move the data (see :mod:`rlstash.protocols`).

Three behaviours, one class each:

* :class:`UniformSampler` -- uniform with replacement, or epochs without replacement.
* :class:`PrioritizedSampler` -- proportional prioritized replay (Schaul et al. 2016) over a
  vectorized :class:`~rlstash.sumtree.SumMinTree`.
* :class:`SequenceSampler` -- windows of ``length`` consecutive steps that never cross an
  episode end or the write cursor.

Every sampler reads the buffer's state from a :class:`~rlstash.protocols.SampleContext`:
rows ``0..size-1`` are stored (all rows once full), ``cursor`` is the next write position and
``valid`` (optional, ``bool[capacity]``) marks rows that may be returned; a row outside it is
never returned. All randomness comes from ``ctx.rng``, so the same generator state gives the
same indices, and ``state_dict``/``load_state_dict`` capture everything else.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from rlstash.protocols import Index, SampleContext
from rlstash.spec import Batch
from rlstash.sumtree import SumMinTree, last_write_wins

_REJECTION_ROUNDS = 8  # redraws before an exact (O(capacity)) fallback
_INF_BITS = np.float64(np.inf).view(np.uint64)
_INF_BITS32 = np.float32(np.inf).view(np.uint32)


class UniformSampler:
    """Uniform sampling over stored (and valid) rows.

    With ``replacement=True`` every index is an independent uniform draw: without a valid
    mask one :func:`uniform_ints` (raw 64-bit draws cut to ``ceil(log2 size)`` bits, values
    ``>= size`` dropped: exact, and about half the cost of ``Generator.integers`` at a batch
    of 256). With a mask the draw is rejection
    sampling: rejected positions are redrawn up to 8 times, then drawn among
    ``flatnonzero(valid[:size])``; each accepted index is exactly uniform over the valid
    rows, and the cost is ``O(batch_size / fraction valid)`` instead of ``O(capacity)``.

    With ``replacement=False`` rows are served in epochs: an epoch is a random permutation
    of the rows stored and valid when it starts, consumed ``batch_size`` at a time. Rows that
    stopped being valid are skipped; rows written later join the next epoch. A batch never
    repeats a row: when an epoch runs out mid-batch, the batch is completed from a fresh
    permutation whose first entries exclude the rows already taken (those go to its end), so
    every epoch still returns each of its rows exactly once.
    """

    def __init__(self, replacement: bool = True) -> None:
        if not isinstance(replacement, bool):
            raise TypeError(f"replacement: expected a bool, got {replacement!r}")
        self.replacement = replacement
        self.capacity = 0
        self.epoch = 0  # completed + current epochs (without replacement)
        self._perm = np.empty(0, dtype=np.int64)  # current epoch's order
        self._pos = 0  # next entry of ``_perm``

    def reset(self, capacity: int) -> None:
        self.capacity = _check_capacity(capacity)
        self.epoch, self._perm, self._pos = 0, np.empty(0, dtype=np.int64), 0

    def on_write(self, index: Index, batch: Batch) -> None:
        """Uniform sampling keeps no per-row state."""

    def sample(
        self, batch_size: int, ctx: SampleContext
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """``batch_size`` int64 row indices and no extras."""
        _check_batch_size(batch_size)
        _check_ctx(ctx, self.capacity)
        if not self.replacement:
            return self._sample_epoch(batch_size, ctx), {}
        if ctx.valid is None:
            return uniform_ints(ctx.rng, ctx.size, batch_size), {}
        return _uniform_valid(batch_size, ctx), {}

    def _sample_epoch(self, batch_size: int, ctx: SampleContext) -> np.ndarray:
        perm, pos, epoch = self._perm, self._pos, self.epoch  # committed only on success
        parts: list[np.ndarray] = []
        need = batch_size
        while need:
            if pos >= perm.size:
                taken = np.concatenate(parts) if parts else perm[:0]
                perm, pos, epoch = _new_epoch(batch_size, ctx, taken), 0, epoch + 1
            chunk = perm[pos : pos + need]
            pos += chunk.size
            keep = chunk < ctx.size
            if ctx.valid is not None:
                keep &= ctx.valid[chunk]
            if not keep.all():
                chunk = chunk[keep]
            parts.append(chunk)
            need -= chunk.size
        self._perm, self._pos, self.epoch = perm, pos, epoch
        return np.concatenate(parts) if len(parts) > 1 else parts[0].copy()

    def state_dict(self) -> dict[str, Any]:
        return {
            "kind": "uniform",
            "replacement": self.replacement,
            "capacity": self.capacity,
            "epoch": self.epoch,
            "perm": self._perm.copy(),
            "pos": self._pos,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _check_state(state, "uniform", self.capacity)
        if state["replacement"] != self.replacement:
            raise ValueError(
                f"replacement: the saved sampler has replacement={state['replacement']}, "
                f"this one {self.replacement}"
            )
        perm = np.asarray(state["perm"], dtype=np.int64).copy()
        self._perm, self._pos, self.epoch = perm, int(state["pos"]), int(state["epoch"])


class PrioritizedSampler:
    r"""Proportional prioritized replay with stratified sampling and importance weights.

    A row with priority :math:`p_i \ge 0` is stored as :math:`q_i = (p_i + \epsilon)^\alpha`
    and drawn with probability :math:`P(i) = q_i / \sum_j q_j` over the stored valid rows.
    A batch of ``B`` is stratified: the total mass is cut into ``B`` equal segments and one
    uniform point is drawn in each, so indices come out in increasing order of mass.

    Importance weights, with ``N`` the number of stored valid rows::

        w_i = (N * P(i)) ** -beta / max_j (N * P(j)) ** -beta = (q_i / q_min) ** -beta

    (``N`` and the total cancel; ``q_min`` is the smallest positive stored ``q``), returned as
    ``extras["weight"]`` (float32, in (0, 1]). ``beta`` may be annealed by assigning it.

    New rows (:meth:`on_write`) get ``max_priority ** alpha``, where ``max_priority`` is the
    largest ``p + eps`` ever given to :meth:`update_priorities` (initially the constructor's
    ``max_priority``); it never decreases.

    Validity: a row is sampled only if its tree leaf is positive. When ``ctx.valid`` is
    given (it may be the same array, changed in place), :meth:`sample` first compares it with
    a copy of the mask it saw last, 8 rows per uint64 word (~35 us at a million rows), and
    moves the priority of each row that became invalid into a parking array (leaf 0), and
    back when it becomes valid (one small tree update, ~40 us more when rows changed).
    :meth:`update_priorities` on an invalid row updates its parked priority. Without a mask
    every written row is valid and nothing is compared.

    Args:
        alpha: priority exponent (0 = uniform).
        beta: importance-weight exponent (0 = no correction, 1 = full).
        eps: added to every priority so no written row has probability 0.
        max_priority: priority of the first rows, before any update.
        branching: fan-out of the sum tree (a power of two >= 8).
    """

    def __init__(
        self,
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-6,
        max_priority: float = 1.0,
        branching: int = 8,
    ) -> None:
        self.alpha = _check_float("alpha", alpha, low=0.0)
        self.beta = beta
        self.eps = _check_float("eps", eps, low=0.0)
        self.max_priority = _check_float("max_priority", max_priority, low=0.0, strict=True)
        if not isinstance(branching, int) or branching < 8 or branching & (branching - 1):
            raise ValueError(f"branching: expected a power of two >= 8, got {branching!r}")
        self.branching = branching
        self.capacity = 0
        self._tree: SumMinTree | None = None
        self._seg = np.empty(0)

    @property
    def beta(self) -> float:
        """Importance-weight exponent; assign to anneal (must be finite and >= 0)."""
        return self._beta

    @beta.setter
    def beta(self, value: float) -> None:
        self._beta = _check_float("beta", value, low=0.0)

    def reset(self, capacity: int) -> None:
        self.capacity = _check_capacity(capacity)
        self._tree = SumMinTree(self.capacity, branching=self.branching)
        self._written = np.zeros(self.capacity, dtype=bool)  # rows seen by on_write
        self._valid = np.ones(self.capacity, dtype=bool)  # the last mask synced from ctx
        self._n_invalid = 0  # rows with _valid False
        self._n_written = 0  # rows with _written True
        self._parked = np.zeros(self.capacity)  # q of invalid rows (their leaf is 0)

    def on_write(self, index: Index, batch: Batch) -> None:
        """Rows at ``index`` were (over)written: they get the current max priority."""
        self._bound()
        idx = _index_array(index, self.capacity)
        contiguous = isinstance(index, slice)  # sorted, no repeats
        if self._n_written < self.capacity:
            fresh = idx[~self._written[idx]]
            self._written[fresh] = True
            self._n_written += fresh.size if contiguous else np.unique(fresh).size
        q = self.max_priority**self.alpha
        self._store(idx, np.full(idx.size, q), unique=contiguous)

    def update_priorities(self, indices: Any, priorities: Any) -> None:
        """Set the priorities of rows ``indices`` (numpy or torch; duplicates: last wins).

        ``priorities`` must be finite and >= 0; a torch tensor is detached and copied to the
        host. Bad input raises ValueError/TypeError naming it and changes nothing.
        """
        self._bound()
        idx = _as_numpy(indices, "indices").ravel()
        pri = _as_numpy(priorities, "priorities").ravel()
        if idx.dtype.kind not in "iu":
            raise TypeError(f"indices: expected an integer array, got dtype {idx.dtype}")
        if pri.dtype.kind not in "fiu":
            raise TypeError(f"priorities: expected a float array, got dtype {pri.dtype}")
        if idx.size != pri.size:
            raise ValueError(
                f"priorities: expected one per index ({idx.size}), got {pri.size} (indices "
                f"shape {list(np.shape(indices))}, priorities shape {list(np.shape(priorities))})"
            )
        if idx.size == 0:
            return
        rows, last = last_write_wins(idx, pri)  # [U] sorted unique rows, each one's last priority
        if rows[0] < 0 or rows[-1] >= self.capacity:  # sorted: the ends bound every row
            _check_rows("indices", idx, self.capacity)
        high = _max_nonnegative(pri)  # every priority given, repeated rows included
        if self._n_written < self.capacity and not self._written[rows].all():
            unwritten = rows[~self._written[rows]]
            raise ValueError(
                f"indices: {unwritten.size} rows were never written (first: {int(unwritten[0])});"
                " nothing was updated"
            )
        high += self.eps
        if not _finite_power(high, self.alpha):
            raise ValueError(f"priorities: (p + eps) ** alpha overflows float64 for p = {high!r}")
        q = np.add(last, self.eps)  # [U] float64
        if self.alpha != 1.0:
            np.power(q, self.alpha, out=q)
        self._store(rows, q, unique=True)
        self.max_priority = max(self.max_priority, high)

    def sample(
        self, batch_size: int, ctx: SampleContext
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """``batch_size`` int64 indices (stratified, ascending mass) and ``{"weight": w}``."""
        tree = self._bound()
        _check_batch_size(batch_size)
        _check_ctx(ctx, self.capacity)
        if ctx.valid is not None:
            self._sync_valid(ctx.valid)
        elif self._n_invalid:
            self._sync_valid(np.ones(self.capacity, dtype=bool))
        u = ctx.rng.random(batch_size)
        u += self._segments(batch_size)
        u *= 1.0 / batch_size  # [B] one uniform point in each of B equal segments of [0, 1)
        try:
            idx, q = tree.find(u)  # [B] rows, [B] their q
        except ValueError as exc:
            raise ValueError(
                f"cannot sample: no stored row is valid with a positive priority ({exc})"
            ) from None
        q /= tree.min_positive()
        weight = np.power(q, -self._beta, out=q)  # [B] (q_i / q_min) ** -beta, in (0, 1]
        return idx, {"weight": weight.astype(np.float32)}

    def _segments(self, batch_size: int) -> np.ndarray:
        """``arange(batch_size)`` as float64, cached."""
        if self._seg.size != batch_size:
            self._seg = np.arange(batch_size, dtype=np.float64)
        return self._seg

    def priorities(self, indices: Any) -> np.ndarray:
        """Stored ``q = (p + eps) ** alpha`` of rows ``indices`` (0 for rows never written)."""
        self._bound()
        idx = np.asarray(indices, dtype=np.int64)
        _check_rows("indices", idx.ravel(), self.capacity)
        return np.where(self._valid[idx], self._tree.get(idx), self._parked[idx])

    def _store(self, idx: np.ndarray, q: np.ndarray, unique: bool) -> None:
        """Write ``q`` at rows ``idx``: into the tree for valid rows, parked otherwise."""
        if self._n_invalid:
            ok = self._valid[idx]
            self._parked[idx[~ok]] = q[~ok]
            idx, q = idx[ok], q[ok]
        if unique:
            self._tree.set_sorted_unique(idx, q)
        else:
            self._tree.set(idx, q)

    def _sync_valid(self, valid: np.ndarray) -> None:
        """Apply the rows whose validity changed since the last mask (see class doc)."""
        changed = _changed_rows(valid, self._valid)
        if not changed.size:
            return
        on = changed[valid[changed]]  # rows that became valid
        off = changed[~valid[changed]]  # rows that became invalid
        tree = self._tree
        self._parked[off] = tree.get(off)
        values = np.concatenate([self._parked[on], np.zeros(off.size)])
        tree.set(np.concatenate([on, off]), values)
        self._parked[on] = 0.0
        self._valid[changed] = valid[changed]
        self._n_invalid += off.size - on.size

    def _bound(self) -> SumMinTree:
        if self._tree is None:
            raise RuntimeError("PrioritizedSampler: call reset(capacity) before using it")
        return self._tree

    def state_dict(self) -> dict[str, Any]:
        tree = self._bound()
        return {
            "kind": "prioritized",
            "capacity": self.capacity,
            "alpha": self.alpha,
            "beta": self._beta,
            "eps": self.eps,
            "max_priority": self.max_priority,
            "tree": tree.state_dict(),
            "written": self._written.copy(),
            "valid": self._valid.copy(),
            "parked": self._parked.copy(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        tree = self._bound()
        _check_state(state, "prioritized", self.capacity)
        tree.load_state_dict(state["tree"])
        self.alpha, self.beta, self.eps = float(state["alpha"]), state["beta"], float(state["eps"])
        self.max_priority = float(state["max_priority"])
        self._written[:] = state["written"]
        self._valid[:] = state["valid"]
        self._parked[:] = state["parked"]
        self._n_invalid = int(self.capacity - np.count_nonzero(self._valid))
        self._n_written = int(np.count_nonzero(self._written))


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

    def reset(self, capacity: int) -> None:
        capacity = _check_capacity(capacity)
        if self.length > capacity:
            raise ValueError(f"length: {self.length} is longer than the buffer ({capacity} rows)")
        self.capacity = capacity
        self._ends = np.zeros(capacity, dtype=bool)  # True where an episode ended at that row

    def on_write(self, index: Index, batch: Batch) -> None:
        """Record the episode-end flags of the rows written at ``index``."""
        if not self.capacity:
            raise RuntimeError("SequenceSampler: call reset(capacity) before using it")
        idx = _index_array(index, self.capacity)
        present = [k for k in self.end_keys if k in batch]
        if not present:
            raise ValueError(
                f"batch: SequenceSampler needs at least one of the end flags {list(self.end_keys)} "
                f"to find episode ends, got fields {sorted(batch)}"
            )
        flags = np.zeros(idx.size, dtype=bool)
        for key in present:
            f = _as_numpy(batch[key], f"field {key!r}")
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
        _check_batch_size(batch_size)
        _check_ctx(ctx, self.capacity)
        n, length = ctx.size, self.length
        if n < length:
            raise ValueError(f"cannot sample windows of length {length}: only {n} rows are stored")
        # candidates: age positions 0..n-length on a plain ring, any stored row with ctx.window
        span = n if ctx.window is not None else n - length + 1
        cand = ctx.rng.integers(0, span, batch_size)  # [B]
        rows = self._rows(cand, ctx)  # [B, L]
        redo = np.flatnonzero(~self._window_ok(rows, ctx))
        for _ in range(_REJECTION_ROUNDS):
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
        rows = np.asarray(ctx.window(cand, self.length))
        if rows.shape != (cand.size, self.length) or rows.dtype.kind not in "iu":
            raise ValueError(
                f"ctx.window: expected int rows of shape [{cand.size}, {self.length}], got "
                f"{rows.dtype}{list(rows.shape)}"
            )
        rows = rows.astype(np.int64, copy=False)
        _check_rows("ctx.window", rows.ravel(), self.capacity)
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
        _check_state(state, "sequence", self.capacity)
        if int(state["length"]) != self.length:
            raise ValueError(
                f"length: the saved sampler has {state['length']}, this one {self.length}"
            )
        self.end_keys = tuple(state["end_keys"])
        self._ends[:] = np.asarray(state["ends"], dtype=bool)


# --------------------------------------------------------------------------- helpers
def _check_capacity(capacity: Any) -> int:
    if not isinstance(capacity, int | np.integer) or isinstance(capacity, bool) or capacity <= 0:
        raise ValueError(f"capacity: expected a positive int, got {capacity!r}")
    return int(capacity)


def _check_batch_size(batch_size: Any) -> None:
    if type(batch_size) is int and batch_size > 0:
        return
    if not isinstance(batch_size, int | np.integer) or isinstance(batch_size, bool):
        raise TypeError(f"batch_size: expected an int, got {type(batch_size).__name__}")
    if batch_size <= 0:
        raise ValueError(f"batch_size: expected >= 1, got {batch_size}")


def _check_ctx(ctx: SampleContext, capacity: int) -> None:
    """Cheap consistency checks of a sample context (attribute reads only)."""
    if (
        ctx.valid is None
        and ctx.capacity == capacity
        and 0 < ctx.size <= capacity
        and 0 <= ctx.cursor < capacity
    ):
        return  # the common case, in one expression
    if not capacity:
        raise RuntimeError("sampler: call reset(capacity) before sampling")
    if ctx.capacity != capacity:
        raise ValueError(
            f"ctx.capacity: the sampler was reset for {capacity} rows, got {ctx.capacity}"
        )
    if not 0 <= ctx.size <= capacity:
        raise ValueError(f"ctx.size: expected 0 <= size <= {capacity}, got {ctx.size}")
    if ctx.size == 0:
        raise ValueError("cannot sample from an empty buffer (size 0); write rows first")
    if not 0 <= ctx.cursor < capacity:
        raise ValueError(f"ctx.cursor: expected 0 <= cursor < {capacity}, got {ctx.cursor}")
    v = ctx.valid
    if v is not None and (
        not isinstance(v, np.ndarray) or v.dtype != np.bool_ or v.shape != (capacity,)
    ):
        got = f"{v.dtype}{list(v.shape)}" if isinstance(v, np.ndarray) else type(v).__name__
        raise ValueError(f"ctx.valid: expected a numpy bool[{capacity}] mask or None, got {got}")


def _check_float(name: str, value: Any, low: float, strict: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise TypeError(f"{name}: expected a number, got {type(value).__name__}")
    value = float(value)
    if not np.isfinite(value) or value < low or (strict and value == low):
        rule = ">" if strict else ">="
        raise ValueError(f"{name}: expected a finite number {rule} {low}, got {value!r}")
    return value


def _check_state(state: Any, kind: str, capacity: int) -> None:
    if not isinstance(state, dict) or state.get("kind") != kind:
        got = state.get("kind") if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"state: expected a {kind!r} sampler state, got {got!r}")
    if state.get("capacity") != capacity:
        raise ValueError(
            f"state: the saved sampler has capacity {state.get('capacity')}, this one {capacity}"
        )


def _as_numpy(value: Any, name: str) -> np.ndarray:
    """A host numpy array from a numpy array, a torch tensor (detached, copied to host) or a list."""
    if isinstance(value, torch.Tensor):
        if value.requires_grad:
            value = value.detach()
        if not value.is_cpu:
            value = value.cpu()  # an explicit, synchronizing device-to-host copy
        return value.numpy()
    arr = np.asarray(value)
    if arr.dtype == object or arr.dtype.kind in "USV":
        raise TypeError(f"{name}: expected a numeric array or tensor, got {type(value).__name__}")
    return arr


def _check_rows(name: str, idx: np.ndarray, capacity: int) -> None:
    """ValueError unless every index is in [0, capacity) (one reduction: negatives wrap high)."""
    if not idx.size:
        return
    unsigned = idx.view(idx.dtype.str.replace("i", "u")) if idx.dtype.kind == "i" else idx
    if unsigned.max() >= capacity:
        bad = idx[(idx < 0) | (idx >= capacity)]
        raise ValueError(
            f"{name}: expected rows in [0, {capacity}), got {bad.size} outside (first: {int(bad[0])})"
        )


def _changed_rows(new: np.ndarray, old: np.ndarray) -> np.ndarray:
    """Sorted rows where two bool masks differ: compared 8 rows at a time as uint64 words."""
    whole = new.size // 8 * 8
    if not new.flags.c_contiguous or whole == 0:
        return np.flatnonzero(new != old)
    words = np.flatnonzero(new[:whole].view(np.uint64) != old[:whole].view(np.uint64))
    rows = ((words << 3)[:, None] + np.arange(8)).ravel()  # the 8 rows of each differing word
    tail = np.arange(whole, new.size)  # the last size % 8 rows
    rows = np.concatenate([rows, tail]) if tail.size else rows
    return rows[new[rows] != old[rows]]


def _finite_power(x: float, alpha: float) -> bool:
    try:
        return math.isfinite(x**alpha)
    except OverflowError:
        return False


def _max_nonnegative(pri: np.ndarray) -> float:
    """``max(pri)``, or ValueError when any value is NaN, infinite or negative.

    Fast path for float64 and float32 (one reduction): non-negative finite values are exactly
    those whose bits, read as unsigned integers, are below the bits of ``inf`` (a sign bit or
    NaN makes them larger), and they order like those integers.
    """
    if pri.flags.c_contiguous:
        if pri.dtype == np.float64:
            high = pri.view(np.uint64).max()
            if high < _INF_BITS:
                return float(high.view(np.float64))
        elif pri.dtype == np.float32:
            high = pri.view(np.uint32).max()
            if high < _INF_BITS32:
                return float(high.view(np.float32))
    low, high = pri.min(), pri.max()  # NaN propagates into both; -0.0 passes here
    if low >= 0 and high < np.inf:
        return float(high)
    pri = pri.astype(np.float64)
    bad = ~np.isfinite(pri) | (pri < 0)
    raise ValueError(
        f"priorities: expected finite values >= 0, got {int(bad.sum())} bad of {pri.size} "
        f"(first: {float(pri[np.flatnonzero(bad)[0]])!r}); nothing was updated"
    )


def _index_array(index: Index, capacity: int) -> np.ndarray:
    """Row indices (int64, 1-D) of a write index: a slice or an integer array."""
    if isinstance(index, slice):
        start, stop, step = index.indices(capacity)
        if (index.stop is not None and index.stop > capacity) or step != 1:
            raise ValueError(
                f"index: expected a contiguous slice within [0, {capacity}), got {index}"
            )
        return np.arange(start, stop, dtype=np.int64)
    idx = _as_numpy(index, "index")
    if idx.dtype.kind not in "iu":
        raise TypeError(f"index: expected a slice or an integer array, got dtype {idx.dtype}")
    idx = idx.astype(np.int64, copy=False).ravel()
    _check_rows("index", idx, capacity)
    return idx


def uniform_ints(rng: np.random.Generator, high: int, size: int) -> np.ndarray:
    """``size`` independent, exactly uniform int64 values in ``[0, high)`` (``high >= 1``).

    Each candidate is the top ``b = bit_length(high - 1)`` bits of one raw 64-bit draw of
    ``rng``'s bit generator, uniform on ``[0, 2**b)``; candidates ``>= high`` (probability
    ``p < 1/2``) are dropped, so the kept ones are uniform on ``[0, high)``. About
    ``size / (1 - p)`` plus a margin are drawn at once and the first ``size`` kept are
    returned (a second round when too few were kept: rare).
    """
    high = int(high)
    bits = (high - 1).bit_length()
    if bits == 0:
        return np.zeros(size, dtype=np.int64)
    shift = np.uint64(64 - bits)
    raw = rng.bit_generator.random_raw
    want = int(size * (1 << bits) / high * 1.05) + 16  # expected draws + margin
    got = raw(want) >> shift  # [want] uint64 in [0, 2**bits)
    got = got[got < high]
    while got.size < size:
        more = raw(want) >> shift
        got = np.concatenate([got, more[more < high]])
    return got[:size].view(np.int64)


def _uniform_valid(batch_size: int, ctx: SampleContext) -> np.ndarray:
    """Uniform over valid stored rows by rejection (see :class:`UniformSampler`)."""
    valid, n, rng = ctx.valid, ctx.size, ctx.rng
    idx = rng.integers(0, n, batch_size)  # [B]
    redo = np.flatnonzero(~valid[idx])
    for _ in range(_REJECTION_ROUNDS):
        if not redo.size:
            return idx
        idx[redo] = rng.integers(0, n, redo.size)
        redo = redo[~valid[idx[redo]]]
    if redo.size:
        rows = np.flatnonzero(valid[:n])
        if not rows.size:
            raise ValueError(f"cannot sample: none of the {n} stored rows is valid (ctx.valid)")
        idx[redo] = rows[rng.integers(0, rows.size, redo.size)]
    return idx


def _new_epoch(batch_size: int, ctx: SampleContext, taken: np.ndarray) -> np.ndarray:
    """A permutation of the stored valid rows; rows in ``taken`` are moved to its end."""
    n = ctx.size
    rows = np.arange(n, dtype=np.int64) if ctx.valid is None else np.flatnonzero(ctx.valid[:n])
    if rows.size < batch_size:
        raise ValueError(
            f"batch_size: {batch_size} is more than the {rows.size} rows available (stored and "
            "valid); sampling without replacement needs batch_size <= rows, or replacement=True"
        )
    perm = ctx.rng.permutation(rows)
    if taken.size:
        dup = np.isin(perm, taken)
        if dup.any():
            perm = np.concatenate([perm[~dup], perm[dup]])
    return perm
