"""Ring bookkeeping of a stream storage's lanes (see :mod:`rlstash.storage.stream`).

Per slot three small numpy values: ``flags`` (written, transition start, terminated,
truncated), ``ep`` (position in its episode, clipped to ``k - 1``) and ``valid`` (a sampler
may return it). :class:`Lanes` keeps them, decides where each env step goes, and answers
the read-side questions (n-step rows, frame rows, windows) with vectorized numpy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

WRITTEN, START, TERM, TRUNC = 1, 2, 4, 8  # slot flag bits
DONE = TERM | TRUNC
LANE_KEYS = ("count", "floor", "next_ep", "pending", "reserved", "flags", "ep")


class Lanes:
    """Ring bookkeeping of ``num_envs`` lanes of ``L`` slots, all in small numpy arrays.

    Slot number ``s`` of lane ``e`` (its ``s``-th slot ever) lives at row ``e * L + s % L``;
    the lane holds slot numbers ``[alive_floor, count)`` with ``alive_floor =
    max(floor, count - L)``. ``valid`` is kept equal to :meth:`valid_starts` of every alive
    slot by :meth:`refresh` after each step.
    """

    def __init__(self, num_envs: int, L: int, n_step: int, frame_stack: int) -> None:
        self.num_envs, self.L, self.n, self.k = num_envs, L, n_step, frame_stack
        self.base = np.arange(num_envs, dtype=np.int64) * L  # first row of each lane
        self.count = np.zeros(num_envs, np.int64)  # slots ever written to the lane
        self.floor = np.zeros(num_envs, np.int64)  # oldest slot number that may be alive
        self.next_ep = np.zeros(num_envs, np.int64)  # episode position of the next slot
        self.pending = np.zeros(num_envs, bool)  # next_step: the next obs is a final obs
        self.reserved = np.zeros(num_envs, np.int64)  # disk: slot numbers vouched for
        self.flags = np.zeros(num_envs * L, np.uint8)  # WRITTEN | START | TERM | TRUNC
        self.ep = np.zeros(num_envs * L, np.uint8)  # episode position, clipped to k - 1
        self.valid = np.zeros(num_envs * L, bool)  # valid transition starts (updated in place)
        self.version = 0  # bumped on every change of ``valid``

    @staticmethod
    def plan_bytes(num_envs: int, L: int) -> int:
        """Exact bytes of the arrays :class:`Lanes` allocates: ``flags``, ``ep`` and ``valid``
        (1 byte per slot each) and, per lane, ``base``, ``count``, ``floor``, ``next_ep``,
        ``reserved`` (int64) and ``pending`` (bool)."""
        return 3 * num_envs * L + (5 * 8 + 1) * num_envs

    def arrays(self) -> dict[str, np.ndarray]:
        return {k: getattr(self, k) for k in LANE_KEYS}

    def load(self, arrays: Mapping[str, Any]) -> None:
        """Copy saved arrays in (every shape checked first), then recompute ``valid``."""
        for k in LANE_KEYS:
            got, want = np.shape(arrays[k]), getattr(self, k).shape
            if got != want:
                raise ValueError(f"state: lane array {k!r} has shape {got}, expected {want}")
        for k in LANE_KEYS:
            getattr(self, k)[...] = np.asarray(arrays[k])
        self.recompute()

    def alive_floor(self) -> np.ndarray:
        return np.maximum(self.floor, self.count - self.L)  # [N]

    # ------------------------------------------------------------------ writing
    def plan(self, term: np.ndarray, trunc: np.ndarray, same_step: bool) -> dict[str, np.ndarray]:
        """Where one step of the N lanes goes; nothing changes until :meth:`commit`.

        ``rows`` [N (+ D)]: the slot of each env's obs, then (same-step) the final-obs slots
        of the ``ended`` lanes [D]. Next-step: a lane whose last step ended an episode gets
        its final obs now, in a slot that is no start.
        """
        L, k, done = self.L, self.k, term | trunc
        rows = self.base + self.count % L  # [N]
        bits = (WRITTEN | START | (TERM * term) | (TRUNC * trunc)).astype(np.uint8)
        ep = np.minimum(self.next_ep, k - 1)
        if not same_step:
            fin = self.pending
            return dict(
                rows=rows,
                bits=np.where(fin, WRITTEN, bits).astype(np.uint8),
                ep=ep,
                grow=np.ones(self.num_envs, np.int64),
                next_ep=np.where(fin, 0, self.next_ep + 1),
                pending=~fin & done,
                ended=np.zeros(0, np.int64),
            )
        d = np.flatnonzero(done)
        return dict(
            rows=np.concatenate([rows, self.base[d] + (self.count[d] + 1) % L]),
            bits=np.concatenate([bits, np.full(d.size, WRITTEN, np.uint8)]),
            ep=np.concatenate([ep, np.minimum(self.next_ep[d] + 1, k - 1)]),
            grow=1 + done.astype(np.int64),
            next_ep=np.where(done, 0, self.next_ep + 1),
            pending=self.pending.copy(),
            ended=d,
        )

    def commit(self, step: Mapping[str, np.ndarray]) -> None:
        """Record a planned step (its data are written) and update ``valid``."""
        self.flags[step["rows"]], self.ep[step["rows"]] = step["bits"], step["ep"]
        self.count += step["grow"]
        self.next_ep, self.pending = step["next_ep"], step["pending"]
        self.refresh()

    # ------------------------------------------------------------------ validity
    def valid_starts(self, lane: np.ndarray, seq: np.ndarray) -> np.ndarray:
        """Whether alive slot number ``seq`` of ``lane`` (both [P]) is a valid start: a start
        whose frame history is alive and whose bootstrap slot ``seq + m`` is written."""
        L, n = self.L, self.n
        count, base = self.count[lane], self.base[lane]
        row = base + seq % L
        ok = (self.flags[row] & START) != 0
        ok &= seq - self.ep[row] >= self.alive_floor()[lane]  # frame history still present
        sj = seq[:, None] + np.arange(n)  # [P, n]
        d = ((self.flags[base[:, None] + sj % L] & DONE) != 0) & (sj < count[:, None])
        m = np.where(d.any(1), d.argmax(1) + 1, n)  # steps summed
        return ok & (seq + m <= count - 1)

    def refresh(self, sel: np.ndarray | None = None) -> None:
        """Re-check the starts a step can change in lanes ``sel`` (default all): the newest
        n + 2 slots (successors written) and the oldest k - 1 (frame history overwritten)."""
        n, k, L = self.n, self.k, self.L
        sel = np.arange(self.num_envs) if sel is None else sel
        count, floor = self.count[sel], self.alive_floor()[sel]
        seq = np.concatenate(
            [count[:, None] - 1 - np.arange(n + 2), floor[:, None] + np.arange(k - 1)], axis=1
        )  # [S, n + k + 1]
        lane = np.broadcast_to(sel[:, None], seq.shape)
        alive = (seq >= floor[:, None]) & (seq < count[:, None])
        lane, seq = lane[alive], seq[alive]
        self.valid[self.base[lane] + seq % L] = self.valid_starts(lane, seq)
        self.version += 1

    def recompute(self) -> None:
        """``valid`` of every slot from scratch; slots not alive are cleared."""
        L, count, floor = self.L, self.count[:, None], self.alive_floor()[:, None]
        seq = count - 1 - ((count - 1 - np.arange(L)) % L)  # [N, L] slot number at each row
        lane = np.broadcast_to(np.arange(self.num_envs)[:, None], seq.shape)
        alive = seq >= floor
        self.valid[:] = False
        self.valid[self.base[lane[alive]] + seq[alive] % L] = self.valid_starts(
            lane[alive], seq[alive]
        )
        self.flags[~alive.reshape(-1)] = 0
        self.version += 1

    def plan_finals(self, sel: np.ndarray) -> dict[str, np.ndarray]:
        """Final-obs slots for the lanes of ``sel`` whose last slot is a start: ``keep`` [S]
        marks them, ``rows`` [K] are the new slots. A pending (next-step, done) lane keeps its
        flags; any other last start is truncated there (``trunc_rows``)."""
        c, L = self.count[sel], self.L
        last = self.base[sel] + (c - 1) % L
        keep = (c - 1 >= self.alive_floor()[sel]) & ((self.flags[last] & START) != 0)
        lanes = sel[keep]
        return dict(
            keep=keep,
            lanes=lanes,
            rows=self.base[lanes] + self.count[lanes] % L,
            ep=np.minimum(self.next_ep[lanes], self.k - 1),
            trunc_rows=last[keep & ~self.pending[sel]],
        )

    def commit_finals(self, plan: Mapping[str, np.ndarray]) -> None:
        """Record the final-obs slots of :meth:`plan_finals` (their data are written)."""
        self.flags[plan["trunc_rows"]] |= TRUNC
        self.flags[plan["rows"]], self.ep[plan["rows"]] = WRITTEN, plan["ep"]
        self.count[plan["lanes"]] += 1
        self.pending[plan["lanes"]] = False
        self.refresh(plan["lanes"])

    def end_episodes(self, sel: np.ndarray) -> None:
        """Cut the current episode of lanes ``sel`` (see :meth:`StreamStorage.end_episodes`)."""
        self._drop_last(sel, back=1)
        self.next_ep[sel], self.pending[sel] = 0, False
        self.refresh(sel)

    def drop_restarted(self, sel: np.ndarray, back: int) -> None:
        """The step stored ``back`` slots ago in lanes ``sel`` never happened (its worker was
        restarted): its obs becomes the episode's final obs and the step before it turns
        truncated. Slots written after it (a same-step final obs) are no starts anyway. The
        lane's next slot starts a new episode (a pending next-step lane gets there by itself)."""
        self._drop_last(sel, back)
        self.next_ep[sel[~self.pending[sel]]] = 0  # frame stacks never reach into the old one
        self.refresh(sel)

    def _drop_last(self, sel: np.ndarray, back: int) -> None:
        floor, L = self.alive_floor(), self.L
        for e in sel:
            c, f, base = int(self.count[e]) - back + 1, int(floor[e]), int(self.base[e])
            last, prev = base + (c - 1) % L, base + (c - 2) % L
            if c - 1 >= f and self.flags[last] & START:
                self.flags[last] = WRITTEN  # its step's result was never stored
                if c - 2 >= f and self.flags[prev] & START:
                    self.flags[prev] |= TRUNC  # the episode ends at the last stored obs

    def drop_unvouched(self) -> None:
        """After reopening a save: each lane may have written slots ``[count, reserved)`` since
        (data unknown), overwriting slots ``[count - L, reserved - L)``: both count as gone."""
        L = self.L
        for e in range(self.num_envs):
            lo, hi = max(self.count[e] - L, self.floor[e]), self.reserved[e] - L
            if hi > lo:
                self.flags[self.base[e] + np.arange(lo, hi) % L] = 0
            self.floor[e] = max(self.floor[e], hi, 0)
        self.recompute()

    # ------------------------------------------------------------------ reading
    def nstep(self, flat: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """For valid starts [P]: rows of their n steps [P, n], steps summed m [P], flags of
        step ``t + m - 1`` [P] and the bootstrap slot's row [P]."""
        L, n = self.L, self.n
        base, pos = flat // L * L, flat % L
        if n == 1:  # one step: m = 1, its own flags, the next slot
            return (
                flat[:, None],
                np.ones(flat.shape, np.int64),
                self.flags[flat],
                base + (pos + 1) % L,
            )
        steps = base[:, None] + (pos[:, None] + np.arange(n)) % L  # [P, n]
        d = (self.flags[steps] & DONE) != 0
        m = np.where(d.any(1), d.argmax(1) + 1, n)  # [P]
        return steps, m, self.flags[base + (pos + m - 1) % L], base + (pos + m) % L

    def frame_rows(self, rows: np.ndarray) -> np.ndarray:
        """Rows of the k frames of the obs at ``rows`` [P] -> [P, k] (oldest first; before the
        episode's first frame, that frame repeated) or [P] when k == 1."""
        k, L = self.k, self.L
        if k == 1:
            return rows
        base, pos = rows // L * L, rows % L
        back = np.minimum(
            np.arange(k - 1, -1, -1)[None, :], self.ep[rows][:, None].astype(np.int64)
        )
        return base[:, None] + (pos[:, None] - back) % L  # [P, k]

    def shifts_by_one(self, rows: np.ndarray, nxt: np.ndarray) -> bool:
        """Whether every ``nxt`` is the slot right after ``rows`` in the same episode, so the
        frames of ``nxt`` are those of ``rows`` shifted by one (frame_rows(nxt)[:, j] ==
        frame_rows(rows)[:, j + 1], padding included: ep(nxt) = min(ep(rows) + 1, k - 1))."""
        L = self.L
        follows = nxt == rows // L * L + (rows % L + 1) % L
        ep, ep_next = self.ep[rows].astype(np.int64), self.ep[nxt].astype(np.int64)
        return bool(follows.all() and (ep_next == np.minimum(ep + 1, self.k - 1)).all())

    def window(self, starts: np.ndarray, length: int) -> np.ndarray:
        """Rows of ``length`` consecutive steps of each start's lane: [B] -> [B, length]."""
        s = np.asarray(starts, dtype=np.int64)
        return (s // self.L * self.L)[:, None] + (s[:, None] % self.L + np.arange(length)) % self.L
