"""The write path of :class:`~rlstash.storage.stream.StreamStorage`: a batch of one step
(``[N, ...]``) or a time-major chunk (``[T, N, ...]``) validated in full, planned by the
lanes and written into the backing's slots.

A chunk is one write, not T: its ``terminated``/``truncated`` reach the host once (views on
the CPU; one blocking device-to-host copy for both on a GPU, the write path's only host
read), :meth:`~rlstash.storage.lanes.Lanes.plan` places the T steps with row operations over
the N lanes, and the slots are written in one call (one contiguous copy per field while the
lanes move in lockstep, as next-step chunks keep them: rows are slot-major). A disk stream
commits its lanes (:class:`~rlstash.storage.stream_commit.LaneBooks`) once an operation is
complete, and first, before a chunk overwrites alive slots, vouches for the slots it will
write.

The writer knows the lane/slot index (:class:`~rlstash.storage.lanes.Lanes`), the backing's
rows (:class:`~rlstash.storage.stream_backing.SlotRows`) and the commit records (None in
RAM), nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from rlstash.finite import check_finite, rows_where
from rlstash.spec import Batch, Spec
from rlstash.storage.lanes import Lanes
from rlstash.storage.stream_backing import SlotRows
from rlstash.storage.stream_commit import LaneBooks

RESTARTED = "restarted"  # optional extend field: the env's worker restarted during this step


def as_bool(value: Any) -> torch.Tensor:
    return value if isinstance(value, torch.Tensor) else torch.from_numpy(np.asarray(value))


class StreamWriter:
    """Writes steps into the slots ``rows`` and records them in ``lanes`` (and ``books``).

    Args:
        spec: the step spec (what ``extend`` validates).
        slot_spec: the stored fields of a slot.
        obs_keys: the observation fields.
        lanes: the lane/slot index, updated by every write.
        rows: the backing's slots.
        books: a disk stream's commit records, or None.
        autoreset: the env's autoreset mode (``NEXT_STEP`` or ``SAME_STEP``).
        stacked_input: observations arrive stacked ``[k, ...]``; the newest frame is stored.
        compressed: the backing compresses frames (rows go in lane order, one write).
        check_finite: refuse non-finite floats (invariant I10).
    """

    def __init__(
        self,
        spec: Spec,
        slot_spec: Spec,
        obs_keys: list[str],
        lanes: Lanes,
        rows: SlotRows,
        books: LaneBooks | None,
        autoreset: AutoresetMode,
        stacked_input: bool,
        compressed: bool,
        check_finite: bool,
    ) -> None:
        self.spec, self.slot_spec, self.obs_keys = spec, slot_spec, obs_keys
        self.lanes, self.rows, self.books = lanes, rows, books
        self.num_envs, self.lane_capacity = lanes.num_envs, lanes.L
        self.autoreset, self.stacked_input = autoreset, stacked_input
        self.compressed, self.check_finite = compressed, check_finite
        self.cut = np.zeros(lanes.num_envs, bool)  # lanes whose episode ends before the next extend
        self.closed = False

    def check_open(self) -> None:
        """RuntimeError once the stream is closed."""
        if self.closed:
            raise RuntimeError("StreamStorage is closed")

    def reserve(self, lanes: np.ndarray | None, grow: Any) -> None:
        """Disk, before ``grow`` slots of each of ``lanes`` (None: all) are written:
        :meth:`LaneBooks.reserve <rlstash.storage.stream_commit.LaneBooks.reserve>`."""
        if self.books is not None:
            self.books.reserve(lanes, grow)

    def committed(self) -> None:
        """Disk, after an operation completed (its slots and flags written): commit the lanes."""
        if self.books is not None:
            self.books.committed()

    def start_new_episodes(self) -> None:
        """After a resume or a load: the lanes' envs are new, so are their episodes."""
        if self.cut.any():
            self.end_episodes(self.cut.copy())

    def extend(self, batch: Mapping[str, Any]) -> np.ndarray:
        """Store one step of N envs (``[N, ...]``) or a time-major chunk (``[T, N, ...]``).

        Validated in full first (a bad batch writes nothing). Returns the slot indices written,
        in order (same-step autoreset also writes a final-obs slot per ended episode).
        """
        self.check_open()
        data, final, T = self.validate(batch)
        self.start_new_episodes()  # after a resume or a load
        restarted = data.pop(RESTARTED, None)
        if restarted is not None and bool(restarted.any()):
            index = self.write_restarted(data, final, T, host(restarted).reshape(T, -1))
        else:
            index = self.write_steps(data, final, T)
        self.committed()
        return index

    def end_episodes(self, envs: Any = None, final_obs: Any = None) -> None:
        """:meth:`StreamStorage.end_episodes <rlstash.storage.stream.StreamStorage.end_episodes>`:
        end the current episode of the lanes ``envs``, storing ``final_obs`` when given."""
        self.check_open()
        sel = np.atleast_1d(np.arange(self.num_envs)[slice(None) if envs is None else envs])
        if final_obs is not None:
            if not isinstance(final_obs, Mapping):
                final_obs = {self.obs_keys[0]: final_obs} if len(self.obs_keys) == 1 else final_obs
            fin = Spec({k: self.spec[k] for k in self.obs_keys}).validate(
                final_obs, finite=self.check_finite
            )
            if len(fin[self.obs_keys[0]]) != sel.size:
                raise ValueError(
                    f"final_obs: expected one row per env ended ({sel.size}), "
                    f"got {len(fin[self.obs_keys[0]])}"
                )
            plan = self.lanes.plan_finals(sel)
            frames = self.newest_frames(fin, np.flatnonzero(plan["keep"]))
            k = plan["rows"].size
            data = {
                n: frames[n] if n in frames else torch.zeros((k, *f.shape), dtype=f.dtype)
                for n, f in self.slot_spec.items()
            }
            self.reserve(plan["lanes"], 1)
            self.rows.write(plan["rows"], data)
            self.lanes.commit_finals(plan)
        self.lanes.end_episodes(sel)
        self.cut[sel] = False
        self.committed()

    def validate(self, batch: Mapping[str, Any]) -> tuple[Batch, Batch | None, int]:
        """The batch checked and flattened to ``[T * N, ...]`` (time-major): step fields,
        final obs per obs field (same-step) or None, and ``T``."""
        if not isinstance(batch, Mapping):
            raise TypeError(
                f"batch: expected a dict of field -> tensor, got {type(batch).__name__}"
            )
        finals = {"final_" + k: k for k in self.obs_keys}
        finals_and_restarts = {**finals, RESTARTED: RESTARTED}
        given = [k for k in batch if k in finals]
        if self.autoreset == AutoresetMode.NEXT_STEP and given:
            raise ValueError(
                f"batch: {given} given with autoreset='NextStep', where the final obs arrives as "
                "the next step's obs; drop it or use autoreset='SameStep'"
            )
        if self.autoreset == AutoresetMode.SAME_STEP and len(given) != len(finals):
            raise ValueError(
                f"batch: autoreset='SameStep' needs {sorted(finals)}, got {list(batch)}"
            )
        key = self.obs_keys[0]
        head = leading(batch.get(key), len(self.spec[key].shape), key)
        if head[-1] != self.num_envs:
            raise ValueError(
                f"field {key!r}: expected leading dims [N={self.num_envs}] or "
                f"[T, N={self.num_envs}], got {list(head)}"
            )
        data = self.spec.validate(
            {k: flat(k, v, head) for k, v in batch.items() if k not in finals_and_restarts}
        )
        if RESTARTED in batch:
            r = flat(RESTARTED, as_bool(batch[RESTARTED]), head)
            if r.dtype != torch.bool or tuple(r.shape) != (len(data[key]),):
                raise ValueError(
                    f"field {RESTARTED!r}: expected bool with leading dims {list(head)}, "
                    f"got {r.dtype} {list(r.shape)}"
                )
            data[RESTARTED] = r
        final = None
        if given:
            fspec = Spec({f: self.spec[k] for f, k in finals.items()})
            got = fspec.validate({f: flat(f, batch[f], head) for f in finals})
            final = {k: got[f] for f, k in finals.items()}
        if self.check_finite:  # I10: every float field; final obs where an episode ended
            ended = {"final_" + k: v for k, v in (final or {}).items()}
            done = data["terminated"] | data["truncated"] if ended else None
            check_finite(data, rows_where(ended, done) if ended else {}, envs=head[-1])
        return data, final, len(data[key]) // self.num_envs

    def newest_frames(
        self, step: Mapping[str, torch.Tensor], rows: np.ndarray | None = None
    ) -> Batch:
        """The stored frame of each obs field: the newest one of a stacked obs."""
        out = {}
        for k in self.obs_keys:
            v = step[k] if rows is None else step[k][torch.from_numpy(rows)]
            out[k] = v[:, -1] if self.stacked_input else v
        return out

    def write_steps(self, data: Batch, final: Batch | None, T: int) -> np.ndarray:
        """Store ``T`` steps (fields ``[T * N, ...]``, time-major) in chunks that grow no lane
        by more than its ``L`` slots (so no slot is written twice in one chunk)."""
        N, per = self.num_envs, self.lane_capacity // (1 if final is None else 2)
        if T <= per:
            return self.write_chunk(data, final, T)
        written = []
        for a in range(0, T, per):
            b = min(T, a + per)
            part = {k: v[a * N : b * N] for k, v in data.items()}
            fin = None if final is None else {k: v[a * N : b * N] for k, v in final.items()}
            written.append(self.write_chunk(part, fin, b - a))
        return np.concatenate(written)

    def write_chunk(self, data: Batch, final: Batch | None, T: int) -> np.ndarray:
        """One chunk: its flags reach the host once (one copy off the CPU), the lanes plan
        all ``T`` steps at once, the step slots are one write and the final-obs slots
        (same-step) another; returns the slots in the order the steps wrote them."""
        if T == 0:
            return np.zeros(0, np.int64)
        N, lanes = self.num_envs, self.lanes
        term, trunc = host_flags(data["terminated"], data["truncated"], T, N)
        plan = lanes.plan(term, trunc, final is not None)
        frames = self.newest_frames(data)
        self.reserve(None, plan["grow"])
        step = {n: frames.get(n, data.get(n)) for n in self.slot_spec}
        at = plan["ended"]
        fins = None
        if at.size:  # same_step: the final obs of each ended episode follows its step
            fin = self.newest_frames(final, at)
            zeros = {
                n: data[n].new_zeros((at.size, *data[n].shape[1:]))
                for n in self.slot_spec
                if n not in fin
            }
            fins = {n: fin.get(n, zeros.get(n)) for n in self.slot_spec}
        rows = plan["rows"].reshape(-1)
        if fins is not None and self.compressed:  # frames go in lane order
            rows = np.concatenate([rows, plan["fin_rows"]])
            step = {n: torch.cat([step[n], fins[n]]) for n in self.slot_spec}
            fins = None
        if plan["cols"] is not None and not self.compressed:  # lanes in lockstep
            self.write_block(int(plan["cols"][0]), T, step)
        else:
            self.rows.write(rows, step)
        if fins is not None:
            self.rows.write(plan["fin_rows"], fins)
        lanes.commit(plan)
        return lanes.written_order(plan)

    def write_block(self, col: int, T: int, step: Batch) -> None:
        """Write ``T`` lockstep steps (fields ``[T * N, ...]``, time-major) from lane position
        ``col`` on: slot-major rows make them the rows ``[col * N, (col + T) * N)`` of the ring,
        one contiguous block per field (two where the steps wrap past the lanes' end)."""
        N, L = self.num_envs, self.lane_capacity
        a = min(T, L - col)  # steps before the ring wraps
        if a == T:
            self.rows.write(slice(col * N, (col + T) * N), step)
            return
        self.rows.write(slice(col * N, L * N), {k: v[: a * N] for k, v in step.items()})
        self.rows.write(slice(0, (T - a) * N), {k: v[a * N :] for k, v in step.items()})

    def write_restarted(
        self, data: Batch, final: Batch | None, T: int, restarted: np.ndarray
    ) -> np.ndarray:
        """Steps from a pool whose workers restarted (``restarted`` [T, N] on the host): one
        step at a time, each followed by undoing the restarted envs' step."""
        N, written = self.num_envs, []
        for t in range(T):
            step = {k: v[t * N : (t + 1) * N] for k, v in data.items()}
            fin = None if final is None else {k: v[t * N : (t + 1) * N] for k, v in final.items()}
            written.append(self.write_chunk(step, fin, 1))
            sel = np.flatnonzero(restarted[t])
            if sel.size:
                done = host(step["terminated"] | step["truncated"])[sel]
                # same-step mode wrote a final-obs slot after the ended step: look one further back
                back = 2 if final is not None else 1
                self.lanes.drop_restarted(sel[done], back)
                self.lanes.drop_restarted(sel[~done], 1)
        return np.concatenate(written)


def leading(value: Any, ndim: int, name: str) -> tuple[int, ...]:
    """The leading dims (``(N,)`` or ``(T, N)``) of the first obs field."""
    if value is None:
        raise ValueError(f"batch: field {name!r} is missing")
    shape = tuple(np.shape(value))  # a tensor's or an array's shape, or a nested list's
    if len(shape) not in (ndim + 1, ndim + 2):
        raise ValueError(
            f"field {name!r}: expected [N, ...] or [T, N, ...] with {ndim} dims per row, "
            f"got shape {list(shape)}"
        )
    return shape[: len(shape) - ndim]


def flat(name: str, value: Any, head: tuple[int, ...]) -> Any:
    """``[T, N, ...]`` -> ``[T * N, ...]`` (checked against the obs field's leading dims)."""
    if len(head) == 1:
        return value
    if not isinstance(value, (torch.Tensor, np.ndarray)):
        value = np.asarray(value)
    if tuple(value.shape[:2]) != head:
        raise ValueError(
            f"field {name!r}: expected leading dims {list(head)}, got {list(value.shape)}"
        )
    return value.reshape(head[0] * head[1], *value.shape[2:])


def host(t: torch.Tensor) -> np.ndarray:
    return (t if t.device.type == "cpu" else t.to("cpu")).numpy()


def host_flags(
    term: torch.Tensor, trunc: torch.Tensor, T: int, N: int
) -> tuple[np.ndarray, np.ndarray]:
    """``terminated``/``truncated`` ``[T * N]`` as host bool arrays ``[T, N]``: views on the
    CPU; elsewhere one blocking device-to-host copy of both (complete when it returns)."""
    if term.device.type == "cpu":
        return term.numpy().reshape(T, N), trunc.numpy().reshape(T, N)
    both = torch.stack((term, trunc)).to("cpu").numpy()
    return both[0].reshape(T, N), both[1].reshape(T, N)
