"""SumMinTree: the sum and the minimum of many non-negative leaves, updated and searched in batches.

The prioritized sampler needs three things from ``capacity`` non-negative leaf values
``v[0..n-1]``, each for a whole batch at once and without a Python loop over the batch:

* ``find(u)``: for fractions ``u_b in [0, 1)``, the leaf ``i_b`` whose cumulative mass crosses
  ``u_b * total``, i.e. ``sum(v[:i]) <= u_b * total < sum(v[:i+1])``. A leaf with ``v_i = 0``
  is never returned (see "Rounding" below).
* ``set(idx, values)``: write leaves; on duplicate indices the last write wins.
* ``total()`` and ``min_positive()``: ``sum(v)`` and ``min{v_i : v_i > 0}`` (``inf`` if none).

Layout: a wide *top* level of ``M <= max_top`` nodes, then ``D`` levels of ``k``-ary groups (``k`` a power of two,
8 by default) down to the leaves, so level ``d`` holds ``M * k**d`` nodes and node ``j`` of
level ``d`` has children ``j*k .. j*k+k-1`` on level ``d+1``. For a million leaves that is
``M = 1954`` top nodes and three 8-ary levels. Each level is one flat float64 array. Numpy
cost is per call, not per element, so fewer levels win: at a million leaves and ``B = 256``
this layout did ``find`` + ``set`` in ~140 us where a vectorized binary tree (20 levels) took
~250 us; ``k = 16`` or ``32``, or a narrower or wider top, were no faster.

Search, per batch of ``B`` targets (``t`` is the remaining mass inside the current node)::

    top:      P = [0, cumsum(top)]              # [M + 1], sequential, hence monotone
              t = min(t, P[M] - ulp)             # u * total may round up to the total
              node = searchsorted(P[1:], t, "right"); t -= P[node]   # exact: P[node] <= t
    d = 1..D: rows = level_d[node*k : node*k+k]  # [B, k] one row gather
              E = rows @ STRICT_TRI              # [B, k] exclusive prefix, E[:, j] = sum_{i<j}
              c = #{j : E[:, j] <= t} - 1        # popcount of the bool row seen as uint64 words
              t -= E[c]; node = node*k + c

No step loops over the batch in Python: a level costs about ten numpy calls on ``B * k``
numbers, so for ``B = 256`` the whole search is a few dozen calls.

Update: leaves are written (deduplicated, last write wins), then each touched parent is
recomputed from its ``k`` children as one matrix-vector product ``rows @ ones`` per level.
Parents are recomputed from their children, never adjusted by deltas, so no rounding drift
accumulates however many updates happen.

Minimum: no min tree. The tree keeps ``m = min{v_i > 0}`` and ``c = #{i : v_i = m}``
exactly. A write of new values ``w`` over old values ``o`` (a few numpy calls on the batch)
sets ``m' = min(w > 0)`` if that is below ``m`` (``c'`` = its count in ``w``), else
``c' = c + #{w = m} - #{o = m}``; when ``c'`` reaches 0 the minimum is recomputed from the
leaves, once, at the next :meth:`min_positive` (``O(capacity)``, ~2 ms at a million leaves).
That happens only when the last leaf holding the minimum is overwritten by a larger value.
For proportional sampling this is cheap on average: the minimum's leaf has the lowest
sampling probability, at most ``1 / n`` for ``n`` positive leaves, so a batch of ``B``
sampled rows touches it with probability at most ``B / n``, i.e. ``O(B)`` amortized work per
step (plus ``O(capacity)`` per ring wrap over it). Updating the ``k`` sums and ``k`` minima
of every level cost twice the numpy calls of the sums alone.

Rounding: prefix sums from a matrix product may be off in the last bit and need not be
monotone, and a target can land at or past the end of its node (a parent's sum and the sum
of its children are computed in different orders). The top level is exact (a sequential
cumsum never stops on a node of mass 0, and ``t - P[node]`` rounds to a value >= 0, as
``P[node] <= t``). On the leaf level the chosen leaf's value is
checked, and where it is 0 the last positive leaf of that node is taken instead; if an inner
level had already picked an empty child, those few targets are searched again with that
check on every level. A positive node always has a positive child (a float sum of
non-negative numbers is 0 only when all are 0), so every returned leaf is positive. The
sampling bias this can introduce is of the order of float64 rounding (~1e-15 relative).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rlstash.core import check_capacity

_HAS_BITCOUNT = hasattr(np, "bitwise_count")


class SumMinTree:
    """Sum and min over ``capacity`` non-negative float64 leaves; batched ``set`` and ``find``.

    Args:
        capacity: number of leaves (all start at 0).
        branching: children per inner node, a power of two >= 8 (8 is fastest in numpy).
        max_top: largest width of the top level, searched with one cumsum + searchsorted.
    """

    def __init__(self, capacity: int, branching: int = 8, max_top: int = 2048) -> None:
        check_capacity(capacity)
        if branching < 8 or branching & (branching - 1):
            raise ValueError(f"branching: expected a power of two >= 8, got {branching!r}")
        if max_top < 1:
            raise ValueError(f"max_top: expected >= 1, got {max_top!r}")
        self.capacity = int(capacity)
        self.k = int(branching)
        self._shift = self.k.bit_length() - 1
        depth, self.top = _layout(self.capacity, self.k, max_top)
        self.depth = depth
        # level 0 = top (M nodes), level depth = leaves (M * k**depth >= capacity)
        self._sum = [np.zeros(self.top * self.k**d) for d in range(depth + 1)]
        # the same arrays as [nodes of the level above, k]: row j = the children of node j
        # (levels d >= 1 only; the top level has no parent)
        self._sum2 = [a.reshape(-1, self.k) if d else a for d, a in enumerate(self._sum)]
        # smallest positive leaf, how many leaves hold it, and whether to recompute both
        self._min_value, self._min_count, self._min_stale = np.inf, 0, False
        self._excl = np.triu(np.ones((self.k, self.k)), 1)  # [k, k], 1 where i < j
        self._base = np.empty(0, dtype=np.int64)
        self._ones = np.ones(self.k)  # [k]
        self._words = self.k // 8  # uint64 words per bool row of k children

    @staticmethod
    def plan_bytes(capacity: int, branching: int = 8, max_top: int = 2048) -> int:
        """Exact bytes of the arrays a tree of ``capacity`` leaves allocates (float64 levels,
        ``(1 + 1/k + 1/k**2 + ...) * 8`` bytes per leaf, plus two ``k``-sized constants)."""
        depth, top = _layout(int(capacity), int(branching), max_top)
        levels = sum(top * branching**d for d in range(depth + 1))
        return 8 * (levels + branching * branching + branching)

    # ------------------------------------------------------------------ reads
    @property
    def leaves(self) -> np.ndarray:
        """The leaf values, float64[capacity] (a read-only view; write with :meth:`set`)."""
        view = self._sum[-1][: self.capacity]
        view.flags.writeable = False
        return view

    def get(self, idx: np.ndarray) -> np.ndarray:
        """Leaf values at ``idx`` (float64, same shape)."""
        return self._sum[-1][idx]

    def total(self) -> float:
        """Sum of all leaves."""
        return float(self._sum[0].sum())

    def min_positive(self) -> float:
        """Smallest positive leaf (``inf`` when no leaf is positive)."""
        if self._min_stale:
            self._min_value, self._min_count = _min_and_count(self._sum[-1])
            self._min_stale = False
        return float(self._min_value)

    def count_positive(self) -> int:
        """Number of positive leaves (O(capacity); for tests and diagnostics)."""
        return int(np.count_nonzero(self._sum[-1]))

    # ----------------------------------------------------------------- writes
    def set(self, idx: np.ndarray, values: np.ndarray) -> None:
        """Write ``values`` at leaves ``idx``; with duplicate indices the last write wins.

        ``values`` must be finite and >= 0 (checked by the caller; the tree trusts them).
        """
        idx, values = last_write_wins(idx, values)
        if idx.size:
            self._set_sorted_unique(idx, values)

    def set_sorted_unique(self, idx: np.ndarray, values: np.ndarray) -> None:
        """:meth:`set` for ``idx`` already sorted without repeats (as from :func:`last_write_wins`)."""
        if idx.size:
            self._set_sorted_unique(idx, values)

    def fill(self, values: np.ndarray) -> None:
        """Replace every leaf (float64[capacity]) and rebuild all sums and minima."""
        values = np.asarray(values, dtype=np.float64)
        if values.shape != (self.capacity,):
            raise ValueError(f"values: expected shape [{self.capacity}], got {list(values.shape)}")
        self._sum[-1][: self.capacity] = values
        self._sum[-1][self.capacity :] = 0.0
        self.rebuild()

    def rebuild(self) -> None:
        """Recompute every inner node (and the minimum) from the leaves."""
        for d in range(self.depth, 0, -1):
            self._sum[d - 1][:] = _sum_rows(self._sum2[d], self._ones)
        self._min_stale = True

    def _set_sorted_unique(self, idx: np.ndarray, values: np.ndarray) -> None:
        leaves = self._sum[-1]
        if not self._min_stale:
            self._track_min(leaves[idx], values)
        leaves[idx] = values
        sums, sums2, ones, shift = self._sum, self._sum2, self._ones, self._shift
        for d in range(self.depth, 0, -1):
            # sorted, possibly repeated parents: a repeat recomputes the same value (cheaper
            # than deduplicating)
            idx = idx >> shift  # [U] parents on level d - 1
            if idx.size * 2 < sums[d - 1].size:
                sums[d - 1][idx] = _sum_rows(sums2[d].take(idx, axis=0), ones)  # [U, k] -> [U]
            else:  # most of the level: recompute all of it
                sums[d - 1][:] = _sum_rows(sums2[d], ones)

    def _track_min(self, old: np.ndarray, new: np.ndarray) -> None:
        """Leaves holding ``old`` now hold ``new`` (unique leaves): update min and count."""
        low = np.minimum.reduce(new)
        if not low > 0:  # zeros (or an empty batch) take no part in the minimum
            low = _min_and_count(new)[0]
        m = self._min_value
        if low < m:
            self._min_value, self._min_count = low, int(np.count_nonzero(new == low))
            return
        if m == np.inf:  # no positive leaf before, none now
            return
        count = self._min_count - int(np.count_nonzero(old == m))
        if low == m:
            count += int(np.count_nonzero(new == m))
        self._min_count = count
        if count <= 0:  # the last leaf holding the minimum was overwritten by a larger value
            self._min_stale = True

    # ----------------------------------------------------------------- search
    def find(self, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Leaves whose cumulative mass crosses ``u * total`` for fractions ``u`` in [0, 1).

        Returns ``(idx, value)``: int64 leaf indices and their float64 values (each > 0), both
        shaped like ``u`` flattened. Raises ValueError when every leaf is 0.
        """
        u = np.asarray(u, dtype=np.float64).ravel()
        node, value, clean = self._search(u, guard=False)
        if not clean:
            miss = value <= 0  # rounding led to an empty subtree (rare): search those again,
            if np.count_nonzero(miss):  # checking every level this time
                node[miss], value[miss], _ = self._search(u[miss], guard=True)
        return node, value

    def _search(self, u: np.ndarray, guard: bool) -> tuple[np.ndarray, np.ndarray, bool]:
        """``(leaf, value, clean)`` per target; ``clean``: every value was positive at once."""
        top = self._sum[0]
        prefix = np.empty(top.size + 1)  # [M + 1] exclusive prefix sums, then the total
        prefix[0] = 0.0
        inclusive = prefix[1:]
        np.add.accumulate(top, out=inclusive)  # sequential: monotone with exact zero steps
        total = prefix[-1]
        if not total > 0:
            raise ValueError("find: every leaf is 0, there is nothing to sample")
        if not math.isfinite(total):
            raise ValueError(f"find: the sum of the leaves overflowed float64 ({total})")
        t = u * total  # [B] target mass
        # below the total even when u * total rounds up to it: then the end of the last node
        np.minimum(t, math.nextafter(total, 0.0), out=t)
        node = inclusive.searchsorted(t, "right")  # [B] first node whose inclusive sum > t:
        # it has a positive mass, and prefix[node] <= t, so t - prefix[node] >= 0 exactly
        t -= prefix[node]  # mass left inside the chosen node
        if not self.depth:
            return node, top[node], True
        value, clean = t, True  # (set by the guarded levels)
        base = self._row_base(t.size)
        for d in range(1, self.depth + 1):
            last = d == self.depth  # the leaves are always guarded (their values are at hand)
            node, t, value, clean = self._descend(self._sum2[d], node, t, base, guard or last)
        return node, value, clean

    def _row_base(self, b: int) -> np.ndarray:
        """``arange(b) * k - 1``: flat offset of row ``i`` in a ``[b, k]`` block, minus one."""
        if self._base.size != b:
            self._base = np.arange(b, dtype=np.int64) * self.k - 1
        return self._base

    def _count_rows(self, below: np.ndarray) -> np.ndarray:
        """``[B, k]`` bool -> ``[B]`` number of True per row (popcount of uint64 words)."""
        if not _HAS_BITCOUNT:  # numpy < 2
            return np.count_nonzero(below, axis=1)
        count = np.bitwise_count(below.view(np.uint64))  # [B, k/8]: one byte 0/1 per child
        return count[:, 0] if self._words == 1 else count.sum(axis=1, dtype=np.int64)

    def _descend(
        self, level: np.ndarray, node: np.ndarray, t: np.ndarray, base: np.ndarray, guard: bool
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
        """One level down: ``(child, mass left in it, its value, clean)`` for each ``node``.

        Works in place on ``node`` and ``t`` (they become ``child`` and the mass left). With
        ``guard`` a chosen child of mass 0 is replaced by the node's last positive child;
        that fixes rounding at this level when ``node`` itself is positive. ``clean``: no
        chosen child had mass 0 (only known on guarded levels; True otherwise).
        """
        rows = level.take(node, axis=0)  # [B, k] children of each node
        excl = rows @ self._excl  # [B, k] exclusive prefix sums, column 0 is 0
        below = excl <= t[:, None]  # [B, k] bool, True for j <= c (monotone up to rounding)
        count = self._count_rows(below)  # [B] in 1..k since t >= 0 = excl[:, 0]
        flat = base + count  # [B] flat index of the chosen child c = count - 1 in ``rows``
        t -= excl.ravel()[flat]
        np.maximum(t, 0.0, out=t)
        child = node
        child <<= self._shift  # [B] first child of each node ...
        child += count
        child -= 1  # ... plus c
        if not guard:
            return child, t, t, True  # (the value is only looked at on guarded levels)
        value = rows.ravel()[flat]  # [B] mass of the chosen child
        if not np.count_nonzero(value <= 0):
            return child, t, value, True
        r = np.flatnonzero(value <= 0)  # empty child or past the end: last positive one
        positive = rows[r] > 0  # [R, k]; a positive node has a True in its row
        c = self.k - 1 - np.argmax(positive[:, ::-1], axis=1)
        child[r] += c - (count[r] - 1)
        value[r] = t[r] = rows[r, c]  # past the end of that child: take its last leaf
        return child, t, value, False

    # ------------------------------------------------------------ persistence
    def state_dict(self) -> dict[str, Any]:
        """Every level (not just the leaves), so a reload is bit-identical."""
        return {
            "capacity": self.capacity,
            "branching": self.k,
            "top": self.top,
            "sum": [a.copy() for a in self._sum],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        shape = (state.get("capacity"), state.get("branching"), state.get("top"))
        if shape != (self.capacity, self.k, self.top):
            raise ValueError(
                f"tree state: expected (capacity, branching, top) = "
                f"{(self.capacity, self.k, self.top)}, got {shape}"
            )
        levels = [np.asarray(src, dtype=np.float64) for src in state["sum"]]
        if [a.shape for a in levels] != [a.shape for a in self._sum]:
            raise ValueError(
                f"tree state: levels of shapes {[a.shape for a in levels]}, expected "
                f"{[a.shape for a in self._sum]}"
            )
        for dst, src in zip(self._sum, levels):  # (a state of an older version may hold "min":
            dst[:] = src  # minima are recomputed from the leaves instead)
        self._min_stale = True


def _layout(capacity: int, k: int, max_top: int) -> tuple[int, int]:
    """``(depth, top)``: the fewest ``k``-ary levels under a top of at most ``max_top`` nodes."""
    depth = 0
    while math.ceil(capacity / k**depth) > max_top:
        depth += 1
    return depth, math.ceil(capacity / k**depth)


def last_write_wins(idx: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sort ``idx`` and keep, for each repeated index, the value written last.

    Returns ``(unique sorted int64 indices, float64 values)``; numpy's own fancy assignment
    does not promise which of several writes to one index wins, this does.
    """
    idx = np.asarray(idx, dtype=np.int64).ravel()
    values = np.asarray(values, dtype=np.float64).ravel()
    if idx.size <= 1:
        return idx, values
    rising = idx[1:] > idx[:-1]  # [N-1]
    if np.count_nonzero(rising) == rising.size:  # sorted without repeats (sampled batches)
        return idx, values
    if not np.count_nonzero(idx[1:] < idx[:-1]):  # sorted with repeats: last of each run
        last = np.empty(idx.size, dtype=bool)
        last[:-1] = rising
        last[-1] = True
        return idx[last], values[last]
    order = np.argsort(idx, kind="stable")  # equal indices keep their call order
    idx, values = idx[order], values[order]
    last = np.empty(idx.size, dtype=bool)  # True on the last entry of each run
    last[-1] = True
    np.not_equal(idx[1:], idx[:-1], out=last[:-1])
    if last.all():
        return idx, values
    return idx[last], values[last]


def _sum_rows(rows: np.ndarray, ones: np.ndarray) -> np.ndarray:
    """``[N, k] -> [N]`` row sums (a matrix-vector product: one BLAS call, no per-row loop).

    With non-negative entries a sum is 0 exactly when every entry is 0.
    """
    return rows @ ones


_INF_BITS = np.float64(np.inf).view(np.uint64)
_SCAN = 1 << 16  # leaves per chunk of a full scan (bounds its temporary memory)


def _min_and_count(values: np.ndarray) -> tuple[float, int]:
    """``(min{v > 0}, #{v == that})`` of non-negative float64 values (``(inf, 0)`` if none).

    Non-negative float64 values order like their bit patterns read as uint64, so with
    ``key = bits - 1`` (wrapping, so 0.0 becomes the largest key) the smallest key is the
    smallest positive value. Scanned in chunks of ``_SCAN``.
    """
    low = _INF_BITS - 1
    for i in range(0, values.size, _SCAN):
        keys = values[i : i + _SCAN].view(np.uint64) - np.uint64(1)
        low = min(low, keys.min())
    if low >= _INF_BITS - 1:
        return np.inf, 0
    m = np.uint64(low + 1).view(np.float64)
    count = sum(
        int(np.count_nonzero(values[i : i + _SCAN] == m)) for i in range(0, values.size, _SCAN)
    )
    return float(m), count
