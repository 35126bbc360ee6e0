"""Proportional prioritized replay (Schaul et al. 2016) over a vectorized
:class:`~rlstash.sampler.sumtree.SumMinTree`; see :mod:`rlstash.sampler` for the sampler contract."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rlstash.core import Index, SampleContext
from rlstash.indices import as_rows, check_rows
from rlstash.memory import check_host_state
from rlstash.sampler.checks import (
    as_numpy,
    check_batch_size,
    check_capacity,
    check_ctx,
    check_float,
    check_state,
)
from rlstash.sampler.kinds import register_kind
from rlstash.sampler.sumtree import SumMinTree, last_write_wins
from rlstash.spec import Batch, Spec

_INF_BITS = np.float64(np.inf).view(np.uint64)
_INF_BITS32 = np.float32(np.inf).view(np.uint32)


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

    # guarantees (rlstash.core.Sampler): indices are stored rows; on_write takes numpy arrays
    returns_valid_indices = True
    accepts_arrays = True

    def __init__(
        self,
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-6,
        max_priority: float = 1.0,
        branching: int = 8,
    ) -> None:
        self.alpha = check_float("alpha", alpha, low=0.0)
        self.beta = beta
        self.eps = check_float("eps", eps, low=0.0)
        self.max_priority = check_float("max_priority", max_priority, low=0.0, strict=True)
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
        self._beta = check_float("beta", value, low=0.0)

    def plan_bytes(self, capacity: int) -> dict[str, int]:
        """Exact bytes :meth:`reset` allocates for ``capacity`` rows, by part (~19 B per row:
        the sum tree ~9.1, parked priorities 8, written and valid masks 1 each)."""
        capacity = check_capacity(capacity)
        return {
            "sum tree": SumMinTree.plan_bytes(capacity, self.branching),
            "parked priorities": 8 * capacity,
            "written and valid masks": 2 * capacity,
        }

    def reset(self, capacity: int) -> None:
        """Bind to ``capacity`` rows; refuses (InsufficientMemoryError) before allocating
        when :meth:`plan_bytes` does not fit in free RAM."""
        capacity = check_capacity(capacity)
        check_host_state("PrioritizedSampler", self.plan_bytes(capacity), capacity)
        self.capacity = capacity
        self._tree = SumMinTree(self.capacity, branching=self.branching)
        self._written = np.zeros(self.capacity, dtype=bool)  # rows seen by on_write
        self._valid = np.ones(self.capacity, dtype=bool)  # the last mask synced from ctx
        self._n_invalid = 0  # rows with _valid False
        self._n_written = 0  # rows with _written True
        self._parked = np.zeros(self.capacity)  # q of invalid rows (their leaf is 0)

    def check_spec(self, spec: Spec) -> None:
        """Works with rows of any spec (called when bound to a buffer)."""

    def on_write(self, index: Index, batch: Batch) -> None:
        """Rows at ``index`` were (over)written: they get the current max priority."""
        self._bound()
        idx = as_rows(index, self.capacity).ravel()
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
        idx = as_rows(indices, self.capacity, "indices", lazy=True).ravel()  # bounded below
        pri = as_numpy(priorities, "priorities").ravel()
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
            check_rows("indices", idx, self.capacity)
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
        check_batch_size(batch_size)
        check_ctx(ctx, self.capacity)
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
        idx = as_rows(indices, self.capacity, "indices")
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
        check_state(state, "prioritized", self.capacity)
        tree.load_state_dict(state["tree"])
        self.alpha, self.beta, self.eps = float(state["alpha"]), state["beta"], float(state["eps"])
        self.max_priority = float(state["max_priority"])
        self._written[:] = state["written"]
        self._valid[:] = state["valid"]
        self._parked[:] = state["parked"]
        self._n_invalid = int(self.capacity - np.count_nonzero(self._valid))
        self._n_written = int(np.count_nonzero(self._written))


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


register_kind(
    "prioritized",
    lambda state: PrioritizedSampler(
        alpha=float(state["alpha"]),
        beta=float(state["beta"]),
        eps=float(state["eps"]),
        max_priority=float(state["max_priority"]),
        branching=int(state["tree"]["branching"]),
    ),
)
