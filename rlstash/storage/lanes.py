"""Ring bookkeeping of a stream storage's lanes (see :mod:`rlstash.storage.stream`).

Per slot three small numpy values: ``flags`` (written, transition start, terminated,
truncated), ``ep`` (position in its episode, clipped to ``k - 1``) and ``valid`` (a sampler
may return it). :class:`Lanes` keeps them, decides where each env step goes, and answers
the read-side questions (n-step rows, frame rows, windows) with vectorized numpy.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np

WRITTEN, START, TERM, TRUNC = 1, 2, 4, 8  # slot flag bits
DONE = TERM | TRUNC
LANE_KEYS = ("count", "floor", "next_ep", "pending", "reserved", "flags", "ep")


@functools.cache
def _window_back(k: int) -> np.ndarray:
    """Slots back from a 1-step read's start to each frame of its window: k - 1 .. 0, -1
    (shared and read-only; not per storage, so not in any storage's planned bytes)."""
    back = np.arange(k - 1, -2, -1)
    back.flags.writeable = False
    return back


def _wrap(p: np.ndarray, L: int) -> np.ndarray:
    """``p % L`` in place for ``0 <= p < 2L`` (one conditional subtraction: numpy's integer
    ``%`` divides every element, ~4x slower on a chunk's [T, N] positions)."""
    np.subtract(p, L, out=p, where=p >= L)
    return p


class Lanes:
    """Ring bookkeeping of ``num_envs`` lanes of ``L`` slots, all in small numpy arrays.

    Slot-major rows: slot number ``s`` of lane ``e`` (its ``s``-th slot ever) lives at row
    ``(s % L) * N + e`` (:meth:`row`; ``lane = row % N``, position ``row // N``), so the N
    lanes' slots of one lockstep step are one contiguous block of rows. The lane holds slot
    numbers ``[alive_floor, count)`` with ``alive_floor = max(floor, count - L)``. ``valid``
    is kept equal to :meth:`valid_starts` of every alive slot by :meth:`refresh` after each
    step. Per-slot arrays viewed ``[L, N]`` (:meth:`grid`) are position-major.
    """

    def __init__(
        self,
        num_envs: int,
        L: int,
        n_step: int,
        frame_stack: int,
        slots: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        """``slots``: the per-slot ``flags`` and ``ep`` arrays to work on in place (a disk
        stream's memory-mapped ones, :mod:`rlstash.storage.stream_commit`); default new."""
        self.num_envs, self.L, self.n, self.k = num_envs, L, n_step, frame_stack
        self.ids = np.arange(num_envs, dtype=np.int64)  # lane numbers (row = pos * N + lane)
        # the per-lane int64 arrays are the rows of one block (a disk stream commits it whole)
        self.per_lane = np.zeros((4, num_envs), np.int64)
        self.count = self.per_lane[0]  # slots ever written to the lane
        self.floor = self.per_lane[1]  # oldest slot number that may be alive
        self.next_ep = self.per_lane[2]  # episode position of the next slot (k > 1)
        self.reserved = self.per_lane[3]  # disk: slot numbers a commit vouched for
        self.pending = np.zeros(num_envs, bool)  # next_step: the next obs is a final obs
        if slots is None:
            slots = np.zeros(num_envs * L, np.uint8), np.zeros(num_envs * L, np.uint8)
        self.flags = slots[0]  # WRITTEN | START | TERM | TRUNC
        self.ep = slots[1]  # episode position, clipped to k - 1
        self.valid = np.zeros(num_envs * L, bool)  # valid transition starts (updated in place)
        self.version = 0  # bumped on every change of ``valid``

    @staticmethod
    def plan_bytes(num_envs: int, L: int, slots_given: bool = False) -> int:
        """Exact bytes of the arrays :class:`Lanes` allocates: ``flags``, ``ep`` (unless
        ``slots_given``) and ``valid`` (1 byte per slot each) and, per lane, ``ids``,
        ``count``, ``floor``, ``next_ep``, ``reserved`` (int64) and ``pending`` (bool)."""
        return (1 if slots_given else 3) * num_envs * L + (5 * 8 + 1) * num_envs

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays a save holds, by the names of :data:`LANE_KEYS` (the arrays themselves)."""
        return {
            "count": self.count,
            "floor": self.floor,
            "next_ep": self.next_ep,
            "pending": self.pending,
            "reserved": self.reserved,
            "flags": self.flags,
            "ep": self.ep,
        }

    def load(self, arrays: Mapping[str, Any]) -> None:
        """Copy saved arrays in (every shape checked first), then recompute ``valid``."""
        mine = self.arrays()
        for k in LANE_KEYS:
            got, want = np.shape(arrays[k]), mine[k].shape
            if got != want:
                raise ValueError(f"state: lane array {k!r} has shape {got}, expected {want}")
        for k in LANE_KEYS:
            mine[k][...] = np.asarray(arrays[k])
        self.recompute()

    def restore(self, per_lane: Mapping[str, np.ndarray]) -> None:
        """Take the committed per-lane arrays of a reopened directory (its slots' ``flags``
        and ``ep`` are already in place), drop what the commit did not vouch for and
        recompute ``valid``."""
        mine = self.arrays()
        for k in ("count", "floor", "next_ep", "reserved", "pending"):
            mine[k][...] = per_lane[k]
        self.drop_unvouched()

    def slot_damage(self) -> str | None:
        """What no writer stores in the per-slot arrays, in words (flag bits other than
        WRITTEN | START | TERM | TRUNC, an episode position past ``k - 1``): bytes damaged
        since they were written; None when there is none. A cheap plausibility check, not a
        checksum: damage that leaves valid values is not seen."""
        problems = []
        for name, bad in (
            ("flags with unknown bits", np.flatnonzero(self.flags & ~np.uint8(WRITTEN | START | DONE))),
            (f"episode positions past {self.k - 1}", np.flatnonzero(self.ep > self.k - 1)),
        ):  # fmt: skip
            if bad.size:
                more = " ..." if bad.size > 8 else ""
                problems.append(f"{bad.size:,} slots hold {name} (slots {bad[:8].tolist()}{more})")
        return "; ".join(problems) or None

    def alive_floor(self) -> np.ndarray:
        return np.maximum(self.floor, self.count - self.L)  # [N]

    def row(self, lane: Any, seq: Any) -> Any:
        """Row of slot number (or unwrapped lane position) ``seq`` of ``lane`` (broadcast)."""
        return seq % self.L * self.num_envs + lane

    def grid(self, a: np.ndarray) -> np.ndarray:
        """A per-slot array viewed ``[L, N]`` (position, lane): a view, no copy."""
        return a.reshape(self.L, self.num_envs)

    # ------------------------------------------------------------------ writing
    def plan(self, term: np.ndarray, trunc: np.ndarray, same_step: bool) -> dict[str, Any]:
        """Where a chunk of ``T`` steps of the N lanes goes (``term``/``trunc`` bool [T, N]);
        nothing changes until :meth:`commit`. No lane may grow by more than ``L`` slots.

        Every step takes one slot per lane for its obs: ``rows``, ``bits`` and ``ep`` [T, N]
        (``cols`` [T]: the lane position of every lane when all lanes are in lockstep, as
        next-step chunks keep them, so step ``t`` is the rows ``[cols[t] * N, (cols[t] + 1)
        * N)``; else None). Next-step: the step after one that ended an
        episode holds the final obs, a slot that is no start (its flags are dropped).
        Same-step: each ended step is followed by a final-obs slot of its own: ``fin_rows``
        and ``fin_ep`` [D] for the ended steps ``ended`` [D] (flat ``t * N + e``, in step
        order). A lane's episode position restarts after ``cut`` steps (ended steps, or
        next-step's final-obs steps). ``T`` row operations over N lanes, no per-lane Python.
        """
        T, N = term.shape
        L = self.L
        done = term | trunc
        bits = term.view(np.uint8) * np.uint8(TERM)
        bits |= trunc.view(np.uint8) * np.uint8(TRUNC)
        bits |= WRITTEN | START
        pending = self.pending.copy()
        if same_step:
            cut = done
        else:
            pend = np.empty((T + 1, N), bool)  # pend[t]: step t's obs is a final obs
            pend[0] = self.pending
            pend[1:] = done  # as the recursion below when no reset step reports an end
            if (done & pend[:T]).any():
                for t in range(T):
                    np.greater(done[t], pend[t], out=pend[t + 1])  # done, and not a reset step
            cut, pending = pend[:T], pend[T].copy()
            bits &= ~(cut.view(np.uint8) * np.uint8(0xFF ^ WRITTEN))  # final obs: WRITTEN only
        ep = self._positions(cut)
        start = self.count % L
        plan: dict[str, Any] = dict(
            bits=bits, ep=ep[:T], pending=pending, ended=np.zeros(0, np.int64), cols=None
        )
        plan["next_ep"] = self._next_ep(cut)
        if not same_step:
            plan["grow"] = np.full(N, T, np.int64)
            if (start == start[0]).all():
                plan["cols"] = (start[0] + np.arange(T)) % L
                plan["rows"] = plan["cols"][:, None] * N + self.ids
            else:
                plan["rows"] = _wrap(start + np.arange(T)[:, None], L) * N + self.ids  # T <= L
            return plan
        off = np.empty((T, N), np.int64)  # lane position of each step's obs slot (unwrapped)
        off[0] = start
        for t in range(1, T):
            np.add(off[t - 1], 1, out=off[t])
            off[t] += done[t - 1]  # the final-obs slot of the step before
        plan["grow"] = off[T - 1] - start + 1 + done[T - 1]
        at = plan["ended"] = np.flatnonzero(done)
        fin = off.reshape(-1)[at] + 1  # off[t] + 1 < start + 2T <= start + L: below 2L
        plan["rows"] = _wrap(off, L) * N + self.ids
        plan["fin_rows"] = _wrap(fin, L) * N + at % N
        plan["fin_ep"] = np.minimum(ep[:T].reshape(-1)[at] + 1, self.k - 1).astype(np.uint8)
        return plan

    def vacate(self, T: int) -> None:
        """Lanes in lockstep, before ``T`` steps are written into their next slots in place
        (:mod:`rlstash.storage.stream_direct`): the oldest slots those steps overwrite stop
        being alive now, and no start keeps frame history in them."""
        L = self.L
        pos = (int(self.count[0]) + np.arange(T)) % L
        self.grid(self.flags)[pos] = 0
        self.grid(self.valid)[pos] = False
        np.maximum(self.floor, self.count + T - L, out=self.floor)
        if self.k > 1:
            self._refresh_oldest(self.ids)
        self.version += 1

    def _next_ep(self, cut: np.ndarray) -> np.ndarray:
        """``next_ep`` after a chunk with cuts ``cut`` [T, N]: T - 1 - (the last cut step), or
        next_ep + T where no step was cut. With k == 1 every position is clipped to 0, so
        it is not tracked (stays 0)."""
        if self.k == 1:
            return self.next_ep
        T = cut.shape[0]
        last = np.where(cut, np.arange(T, dtype=np.int32)[:, None], -1).max(0)  # [N]
        return np.where(last >= 0, T - 1 - last, self.next_ep + T)

    def _positions(self, cut: np.ndarray) -> np.ndarray:
        """Episode positions (clipped to k - 1) of the T + 1 slots from ``next_ep`` on, where
        ``p[t + 1] = 0 if cut[t] else p[t] + 1``: uint8 [T + 1, N] (zeros when k == 1)."""
        T, N = cut.shape
        k = self.k
        ep = np.zeros((T + 1, N), np.uint8)
        if k == 1:
            return ep
        ep[0] = np.minimum(self.next_ep, k - 1)
        keep = ~cut
        for t in range(T):
            np.add(ep[t], 1, out=ep[t + 1])
            np.minimum(ep[t + 1], k - 1, out=ep[t + 1])
            ep[t + 1] *= keep[t]
        return ep

    @staticmethod
    def written_order(plan: Mapping[str, Any]) -> np.ndarray:
        """The slots of a :meth:`plan` in the order the steps wrote them: per step the N obs
        slots, then the final-obs slots of the envs that ended in it (same-step)."""
        rows = plan["rows"]
        at = plan["ended"]
        if at.size == 0:
            return rows.reshape(-1)
        fin = np.full(rows.shape, -1, np.int64)
        fin.reshape(-1)[at] = plan["fin_rows"]
        grid = np.concatenate([rows, fin], axis=1)  # [T, 2N]
        return grid[grid >= 0]

    def commit(self, plan: Mapping[str, Any]) -> None:
        """Record a planned chunk (its data are written) and update ``valid``."""
        rows = plan["rows"].reshape(-1)
        if plan["cols"] is not None:  # lockstep: whole rows of the [L, N] grids
            self.grid(self.flags)[plan["cols"]] = plan["bits"]
            if self.k > 1:
                self.grid(self.ep)[plan["cols"]] = plan["ep"]
        else:
            self.flags[rows] = plan["bits"].reshape(-1)
            if self.k > 1:  # else every position is 0 (clipped to k - 1)
                self.ep[rows] = plan["ep"].reshape(-1)
        if plan["ended"].size:
            self.flags[plan["fin_rows"]], self.ep[plan["fin_rows"]] = WRITTEN, plan["fin_ep"]
        self.count += plan["grow"]
        if plan["next_ep"] is not self.next_ep:
            self.next_ep[...] = plan["next_ep"]
        self.pending = plan["pending"]
        self.refresh(newest=int(plan["grow"].max()) + self.n + 1)

    # ------------------------------------------------------------------ validity
    def valid_starts(self, lane: np.ndarray, seq: np.ndarray) -> np.ndarray:
        """Whether alive slot number ``seq`` of ``lane`` (both [P]) is a valid start: a start
        whose frame history is alive and whose bootstrap slot ``seq + m`` is written."""
        n = self.n
        count = self.count[lane]
        row = self.row(lane, seq)
        ok = (self.flags[row] & START) != 0
        ok &= seq - self.ep[row] >= self.alive_floor()[lane]  # frame history still present
        sj = seq[:, None] + np.arange(n)  # [P, n]
        d = ((self.flags[self.row(lane[:, None], sj)] & DONE) != 0) & (sj < count[:, None])
        m = np.where(d.any(1), d.argmax(1) + 1, n)  # steps summed
        return ok & (seq + m <= count - 1)

    def refresh(self, sel: np.ndarray | None = None, newest: int | None = None) -> None:
        """Re-check the starts a write can change in lanes ``sel`` (default all): the newest
        ``newest`` slots (default n + 2, what one step changes; a chunk that grew a lane by
        ``g`` changes its newest ``g + n + 1``) and the oldest k - 1 (frame history
        overwritten by the ring)."""
        lanes = np.arange(self.num_envs) if sel is None else np.asarray(sel, np.int64)
        if lanes.size:
            W = min(self.L, self.n + 2 if newest is None else newest)
            self._refresh_newest(lanes, W, every=sel is None)
            if self.k > 1:
                self._refresh_oldest(lanes)
        self.version += 1

    def _refresh_newest(self, lanes: np.ndarray, W: int, every: bool) -> None:
        """``valid`` of the newest ``W <= L`` slots of ``lanes`` [S], as [S, W] (lane, slot).

        Slot ``w`` (``seq = count - W + w``) is valid when it is a start, its frame history is
        alive and its bootstrap slot ``w + m`` is written (``w + m <= W - 1``), where ``m`` is
        1 + the first j < n with a done slot ``w + j``, or n. Slots of the window that are
        not alive (before the floor, or before the lane's first slot: rows not written since)
        get False at their own row: with W <= L no two slots of a window share a row. When
        ``every`` lane is refreshed and all are in lockstep, the window is W whole rows of the
        ``[L, N]`` grids (a slice of them, or two where it wraps), seen transposed."""
        L, N, n, k = self.L, self.num_envs, self.n, self.k
        count, floor = self.count[lanes], self.alive_floor()[lanes]
        start = (count - W) % L  # lane position of each window's first slot
        c0 = int(start[0])
        lockstep = bool((start == c0).all())
        grid_rows: Any = None
        if every and lockstep:
            grid_rows = slice(c0, c0 + W) if c0 + W <= L else _wrap(c0 + np.arange(W), L)
            win: Any = None
            fl, ep = self.grid(self.flags)[grid_rows].T, self.grid(self.ep)[grid_rows].T
        else:
            pos = _wrap((c0 if lockstep else start[:, None]) + np.arange(W), L)  # W <= L
            win = pos * N + lanes[:, None]  # [S, W] rows
            fl, ep = self.flags[win], None
        ok = (fl & START) != 0
        if ((count - W - (k - 1)) < floor).any():  # some frame history may be gone
            seq = count[:, None] + np.arange(-W, 0)
            ok &= seq - (self.ep[win] if ep is None else ep) >= floor[:, None]
        if n == 1:  # m = 1 whatever the flags: the next slot must be written
            ok[:, W - 1] = False
        else:
            ok &= self._reach(fl, W)
        if grid_rows is None:
            self.valid[win] = ok
        else:
            self.grid(self.valid)[grid_rows] = ok.T

    def _reach(self, fl: np.ndarray, W: int) -> np.ndarray:
        """[S, W]: the bootstrap slot ``w + m`` of slot ``w`` of a window of flags ``fl`` is
        written (``w + m <= W - 1``)."""
        n = self.n
        done = (fl & DONE) != 0
        reach = np.zeros_like(done)
        open_ = np.ones_like(done)  # no done among the slots looked at so far
        for j in range(min(n, W)):
            lim = W - j  # slots w < lim have slot w + j written
            hit = open_[:, :lim] & done[:, j:]
            reach[:, : lim - 1] |= hit[:, : lim - 1]  # bootstrap: the slot after the done one
            open_[:, :lim] &= ~done[:, j:]
        if W > n:
            reach[:, : W - n] |= open_[:, : W - n]  # no done within n steps: slot w + n
        return reach

    def _refresh_oldest(self, lanes: np.ndarray) -> None:
        """``valid`` of the oldest k - 1 alive slots of ``lanes`` (their history may be gone)."""
        count, floor = self.count[lanes], self.alive_floor()[lanes]
        seq = floor[:, None] + np.arange(self.k - 1)  # [S, k - 1]
        lane = np.broadcast_to(lanes[:, None], seq.shape)
        alive = seq < count[:, None]
        lane, seq = lane[alive], seq[alive]
        self.valid[self.row(lane, seq)] = self.valid_starts(lane, seq)

    def recompute(self) -> None:
        """``valid`` of every slot from scratch; slots not alive are cleared."""
        L, count, floor = self.L, self.count[:, None], self.alive_floor()[:, None]
        seq = count - 1 - ((count - 1 - np.arange(L)) % L)  # [N, L] slot number at each row
        lane = np.broadcast_to(self.ids[:, None], seq.shape)
        alive = seq >= floor
        self.valid[:] = False
        self.valid[self.row(lane[alive], seq[alive])] = self.valid_starts(lane[alive], seq[alive])
        self.grid(self.flags)[~alive.T] = 0  # [N, L] by lane and position -> [L, N] rows
        self.version += 1

    def plan_finals(self, sel: np.ndarray) -> dict[str, np.ndarray]:
        """Final-obs slots for the lanes of ``sel`` whose last slot is a start: ``keep`` [S]
        marks them, ``rows`` [K] are the new slots. A pending (next-step, done) lane keeps its
        flags; any other last start is truncated there (``trunc_rows``)."""
        c = self.count[sel]
        last = self.row(sel, c - 1)
        keep = (c - 1 >= self.alive_floor()[sel]) & ((self.flags[last] & START) != 0)
        lanes = sel[keep]
        return dict(
            keep=keep,
            lanes=lanes,
            rows=self.row(lanes, self.count[lanes]),
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

    def drop_before(self, floor: np.ndarray) -> None:
        """Slots below ``floor`` [N] (slot numbers per lane) are gone (a compressed frame
        arena reused their bytes): they stop being alive and no start may need them."""
        old = self.alive_floor()
        sel = np.flatnonzero(floor > old)
        for e in sel:
            rows = self.row(e, np.arange(old[e], floor[e]))
            self.flags[rows], self.valid[rows] = 0, False
        if sel.size:
            self.floor[sel] = floor[sel]
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
        floor = self.alive_floor()
        for e in sel:
            c, f = int(self.count[e]) - back + 1, int(floor[e])
            last, prev = self.row(int(e), c - 1), self.row(int(e), c - 2)
            if c - 1 >= f and self.flags[last] & START:
                # the step before first: a disk stream killed between the two stores reopens
                # with the last slot still a start, and drops it (the same end) by itself
                if c - 2 >= f and self.flags[prev] & START:
                    self.flags[prev] |= TRUNC  # the episode ends at the last stored obs
                self.flags[last] = WRITTEN  # its step's result was never stored

    def drop_unvouched(self) -> None:
        """After reopening a save: each lane may have written slots ``[count, reserved)`` since
        (data unknown), overwriting slots ``[count - L, reserved - L)``: both count as gone."""
        L = self.L
        for e in range(self.num_envs):
            lo, hi = max(self.count[e] - L, self.floor[e]), self.reserved[e] - L
            if hi > lo:
                self.flags[self.row(e, np.arange(lo, hi))] = 0
            self.floor[e] = max(self.floor[e], hi, 0)
        self.recompute()

    # ------------------------------------------------------------------ reading
    def nstep(self, flat: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """For valid starts [P]: rows of their n steps [P, n], steps summed m [P], flags of
        step ``t + m - 1`` [P] and the bootstrap slot's row [P]."""
        N, n = self.num_envs, self.n
        lane, pos = flat % N, flat // N
        if n == 1:  # one step: m = 1, its own flags, the next slot
            return (
                flat[:, None],
                np.ones(flat.shape, np.int64),
                self.flags[flat],
                self.row(lane, pos + 1),
            )
        steps = self.row(lane[:, None], pos[:, None] + np.arange(n))  # [P, n]
        d = (self.flags[steps] & DONE) != 0
        m = np.where(d.any(1), d.argmax(1) + 1, n)  # [P]
        return steps, m, self.flags[self.row(lane, pos + m - 1)], self.row(lane, pos + m)

    def frame_rows(self, rows: np.ndarray) -> np.ndarray:
        """Rows of the k frames of the obs at ``rows`` [P] -> [P, k] (oldest first; before the
        episode's first frame, that frame repeated) or [P] when k == 1."""
        k, N = self.k, self.num_envs
        if k == 1:
            return rows
        lane, pos = rows % N, rows // N
        back = np.minimum(
            np.arange(k - 1, -1, -1)[None, :], self.ep[rows][:, None].astype(np.int64)
        )
        return self.row(lane[:, None], pos[:, None] - back)  # [P, k]

    def one_step_window(self, rows: np.ndarray) -> np.ndarray | None:
        """1-step reads with frame stacks (k > 1): rows of the k frames of the obs at ``rows``
        [P] and of the next slot's newest frame, [P, k + 1] (next_obs's frames are obs's
        shifted by one slot); None when a next slot does not continue its start's episode
        (then :meth:`frame_rows` of each). The same rows as ``frame_rows(rows)`` and the
        successors ``nstep(rows)[3]``, when :meth:`shifts_by_one` holds, in fewer steps."""
        k, L, N = self.k, self.L, self.num_envs
        lane = rows % N
        pos = (rows - lane) // N
        ep = self.ep[rows]
        back = np.minimum(_window_back(k), ep[:, None])  # [P, k + 1]
        win = (pos[:, None] - back) % L * N + lane[:, None]  # rows (slot-major: p * N + e)
        if not (self.ep[win[:, -1]] == np.minimum(ep + 1, k - 1)).all():
            return None
        return win  # [P, k + 1]: frames t - k + 1 .. t (padded), then t + 1

    def shifts_by_one(self, rows: np.ndarray, nxt: np.ndarray) -> bool:
        """Whether every ``nxt`` is the slot right after ``rows`` in the same episode, so the
        frames of ``nxt`` are those of ``rows`` shifted by one (frame_rows(nxt)[:, j] ==
        frame_rows(rows)[:, j + 1], padding included: ep(nxt) = min(ep(rows) + 1, k - 1))."""
        follows = nxt == self.row(rows % self.num_envs, rows // self.num_envs + 1)
        ep, ep_next = self.ep[rows].astype(np.int64), self.ep[nxt].astype(np.int64)
        return bool(follows.all() and (ep_next == np.minimum(ep + 1, self.k - 1)).all())

    def window(self, starts: np.ndarray, length: int) -> np.ndarray:
        """Rows of ``length`` consecutive steps of each start's lane: [B] -> [B, length]."""
        s = np.asarray(starts, dtype=np.int64)
        N = self.num_envs
        return self.row((s % N)[:, None], (s // N)[:, None] + np.arange(length))
