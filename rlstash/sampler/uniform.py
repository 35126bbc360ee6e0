"""Uniform sampling over stored (and valid) rows; see :mod:`rlstash.sampler` for the family.

Every sampler reads the buffer's state from a :class:`~rlstash.core.SampleContext`:
rows ``0..size-1`` are stored (all rows once full), ``cursor`` is the next write position and
``valid`` (optional, ``bool[capacity]``) marks rows that may be returned; a row outside it is
never returned. All randomness comes from ``ctx.rng``, so the same generator state gives the
same indices, and ``state_dict``/``load_state_dict`` capture everything else.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlstash.core import Index, SampleContext
from rlstash.sampler.checks import (
    REJECTION_ROUNDS,
    check_batch_size,
    check_capacity,
    check_ctx,
    check_state,
)
from rlstash.sampler.kinds import register_kind
from rlstash.spec import Batch, Spec

__all__ = ["UniformSampler", "uniform_ints"]


class UniformSampler:
    """Uniform sampling over stored (and valid) rows.

    With ``replacement=True`` every index is an independent uniform draw: without a valid
    mask one :func:`uniform_ints` (raw 64-bit draws cut to ``ceil(log2 size)`` bits, values
    ``>= size`` dropped: exact, and about half the cost of ``Generator.integers`` at a batch
    of 256). With a mask the draw is rejection
    sampling: rejected positions are refilled from further draws made in bulk (as many as
    the fraction valid seen so far needs), or drawn among ``flatnonzero(valid[:size])`` when
    that scan is cheaper; each accepted index is exactly uniform over the valid rows, and
    the cost is ``O(min(batch_size / fraction valid, capacity))``.

    With ``replacement=False`` rows are served in epochs: an epoch is a random permutation
    of the rows stored and valid when it starts, consumed ``batch_size`` at a time. Rows that
    stopped being valid are skipped; rows written later join the next epoch. A batch never
    repeats a row: when an epoch runs out mid-batch, the batch is completed from a fresh
    permutation whose first entries exclude the rows already taken (those go to its end), so
    every epoch still returns each of its rows exactly once.
    """

    # guarantees (rlstash.core.Sampler): indices are stored rows; on_write takes numpy arrays
    returns_valid_indices = True
    accepts_arrays = True

    def __init__(self, replacement: bool = True) -> None:
        if not isinstance(replacement, bool):
            raise TypeError(f"replacement: expected a bool, got {replacement!r}")
        self.replacement = replacement
        self.capacity = 0
        self.epoch = 0  # completed + current epochs (without replacement)
        self._perm = np.empty(0, dtype=np.int64)  # current epoch's order
        self._pos = 0  # next entry of ``_perm``

    def plan_bytes(self, capacity: int) -> dict[str, int]:
        """Bytes of per-row state: none with replacement; without, the epoch's permutation
        (int64, one per stored valid row: at most ``capacity``, made at an epoch's start)."""
        capacity = check_capacity(capacity)
        return {} if self.replacement else {"epoch permutation": 8 * capacity}

    def reset(self, capacity: int) -> None:
        self.capacity = check_capacity(capacity)
        self.epoch, self._perm, self._pos = 0, np.empty(0, dtype=np.int64), 0

    def check_spec(self, spec: Spec) -> None:
        """Works with rows of any spec (called when bound to a buffer)."""

    def on_write(self, index: Index, batch: Batch) -> None:
        """Uniform sampling keeps no per-row state."""

    def sample(
        self, batch_size: int, ctx: SampleContext
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """``batch_size`` int64 row indices and no extras."""
        check_batch_size(batch_size)
        check_ctx(ctx, self.capacity)
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
        check_state(state, "uniform", self.capacity)
        if state["replacement"] != self.replacement:
            raise ValueError(
                f"replacement: the saved sampler has replacement={state['replacement']}, "
                f"this one {self.replacement}"
            )
        perm = np.asarray(state["perm"], dtype=np.int64).copy()
        self._perm, self._pos, self.epoch = perm, int(state["pos"]), int(state["epoch"])


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
    """Uniform over valid stored rows by rejection (see :class:`UniformSampler`).

    The rejected positions are refilled, in order, by the valid ones among further uniform
    draws, made in bulk: as many as the fraction valid seen so far says they need (a buffer
    filled to 10% of its capacity needs ~10 draws per row, in one call instead of up to 8
    rounds and then an O(capacity) scan). Each accepted draw is uniform over the valid rows
    whatever the number of draws, so the result is exact. When the draws needed would cost
    more than a scan (fraction valid < ~10 x batch_size / size), rows are drawn among
    ``flatnonzero(valid[:size])`` instead."""
    valid, n, rng = ctx.valid, ctx.size, ctx.rng
    idx = rng.integers(0, n, batch_size)  # [B]
    redo = np.flatnonzero(~valid[idx])  # positions still to fill, in order
    drawn, hits = batch_size, batch_size - redo.size
    for _ in range(REJECTION_ROUNDS):
        if not redo.size:
            return idx
        want = int(redo.size * drawn / max(hits, 1) * 1.25) + 16
        if want > n // 8:
            break  # a scan of valid[:n] is cheaper than the draws
        cand = rng.integers(0, n, want)
        cand = cand[valid[cand]]  # valid draws, in draw order
        take = min(cand.size, redo.size)
        idx[redo[:take]] = cand[:take]
        redo, drawn, hits = redo[take:], drawn + want, hits + cand.size
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


register_kind("uniform", lambda state: UniformSampler(replacement=bool(state["replacement"])))
