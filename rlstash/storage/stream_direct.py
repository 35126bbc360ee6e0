"""Steps written straight into a :class:`~rlstash.storage.stream.StreamStorage`'s slots.

A collector of a batched torch env (:meth:`~rlstash.collect.sync.Collector.collect_into`)
copies each env step's observation, action and reward once, into the rows the stream gives
it, instead of into a ``[T, N]`` batch that ``extend`` then copies again. With slot-major
rows the N lanes' slots of one lockstep step are one contiguous block, so each step is one
contiguous copy per field::

    slots = store.open_steps(T)           # None: not possible here, use extend
    for t in range(T):
        row = slots.step(t)               # {"obs": [N, ...], "action": [N, ...], "reward": [N]}
        row["obs"].copy_(obs); ...; obs, reward, term, trunc, _ = env.step(actions)
        row["reward"].copy_(reward); term_t[t], trunc_t[t] = term, trunc
    index = slots.commit(term_t, trunc_t) # the lanes' bookkeeping: as extend of the batch

Possible for a stream with next-step autoreset whose lanes are in lockstep, on the CPU, in a
plain (RAM or disk) backing, without stacked input or frame compression, and whose stored
fields are exactly the obs fields, ``action`` and ``reward``. The slots the T steps
overwrite stop being alive when :func:`open_steps` returns (a sampler never reads a row
while it is rewritten); :meth:`StepSlots.commit` then records the steps as ``extend`` would.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from rlstash.finite import check_finite
from rlstash.storage.ram import numpy_view
from rlstash.storage.stream_write import StreamWriter, host_flags


class StepSlots:
    """The slots of ``T`` lockstep steps of every lane, from lane position ``col`` on, in
    the slot tensors ``tensors`` of ``writer``'s backing."""

    def __init__(
        self, writer: StreamWriter, tensors: dict[str, torch.Tensor], T: int, col: int
    ) -> None:
        self.writer, self.T, self.col = writer, T, col
        N, L = writer.num_envs, writer.lane_capacity
        self._grid = {k: tensors[k].view(L, N, *tensors[k].shape[1:]) for k in writer.slot_spec}
        self._arrays = {k: numpy_view(g) for k, g in self._grid.items()}  # the same memory
        self._open = True

    def _pos(self, t: int) -> int:
        if not 0 <= t < self.T:
            raise IndexError(f"t: expected a step in [0, {self.T}), got {t}")
        return (self.col + t) % self.writer.lane_capacity

    def step(self, t: int) -> dict[str, torch.Tensor]:
        """Step ``t``'s slots of the N lanes: one ``[N, ...]`` view of the rows per field."""
        pos = self._pos(t)
        return {k: g[pos] for k, g in self._grid.items()}

    def step_arrays(self, t: int) -> dict[str, np.ndarray]:
        """:meth:`step` as numpy views (bfloat16 as int16 bit patterns): a CPU writer's copies
        cost ~1 us each this way, against ~5 us for ``Tensor.copy_``."""
        pos = self._pos(t)
        return {k: a[pos] for k, a in self._arrays.items()}

    def block_arrays(self) -> dict[str, np.ndarray]:
        """The ``T`` steps' slots as numpy views ``[T, N, ...]`` per field, for a loader that
        copies whole episodes at once (a Minari dataset); a ValueError where the steps wrap
        past the lanes' end (open them from a fresh stream)."""
        if self.col + self.T > self.writer.lane_capacity:
            raise ValueError(
                f"T: {self.T} steps from lane position {self.col} wrap past the lanes' "
                f"{self.writer.lane_capacity} slots; open at most {self.writer.lane_capacity - self.col}"
            )
        return {k: a[self.col : self.col + self.T] for k, a in self._arrays.items()}

    def _filled(self) -> dict[str, torch.Tensor]:
        """The ``T`` steps' rows of each float field, time-major ``[T * N, ...]``."""
        T, L, col, out = self.T, self.writer.lane_capacity, self.col, {}
        for k, g in self._grid.items():  # g: [L, N, ...]
            if g.is_floating_point():
                part = g[col : col + T] if col + T <= L else torch.cat([g[col:], g[: col + T - L]])
                out[k] = part.reshape(T * g.shape[1], *g.shape[2:])
        return out

    def commit(self, terminated: torch.Tensor, truncated: torch.Tensor) -> np.ndarray:
        """Record the ``T`` steps (their slots filled): ``terminated``/``truncated`` bool
        ``[T, N]``. Returns the slots written, in order, as ``extend`` does. A non-finite
        float in the filled rows (invariant I10, unless the stream's ``check_finite`` is off)
        raises a ValueError naming field, step and env: the steps are not recorded."""
        if not self._open:
            raise RuntimeError("StepSlots.commit: already committed")
        writer, N = self.writer, self.writer.num_envs
        shape = (self.T, N)
        for name, v in (("terminated", terminated), ("truncated", truncated)):
            if not isinstance(v, torch.Tensor) or v.dtype != torch.bool or tuple(v.shape) != shape:
                got = f"{v.dtype} {list(v.shape)}" if isinstance(v, torch.Tensor) else type(v)
                raise ValueError(
                    f"{name}: expected a bool tensor of shape {list(shape)}, got {got}"
                )
        writer.check_open()
        if writer.check_finite:  # I10: the filled rows count only if their floats are finite
            check_finite(self._filled(), envs=N)
        term, trunc = host_flags(terminated.reshape(-1), truncated.reshape(-1), self.T, N)
        plan = writer.lanes.plan(term, trunc, False)
        if plan["cols"] is None or int(plan["cols"][0]) != self.col:  # pragma: no cover
            raise RuntimeError("StepSlots.commit: the stream was written since open_steps")
        self._open = False
        writer.lanes.commit(plan)
        writer.committed()  # a disk stream commits the lanes: the steps survive a crash now
        return writer.lanes.written_order(plan)


class LockedSteps:
    """:class:`StepSlots` whose commit holds ``lock`` and then calls ``written(index)``
    (a replay buffer's: its sampler learns the slots, as after ``extend``)."""

    def __init__(self, slots: StepSlots, lock: Any, written: Callable[[np.ndarray], None]) -> None:
        self.slots, self.lock, self.written, self.T = slots, lock, written, slots.T

    def step(self, t: int) -> dict[str, torch.Tensor]:
        """:meth:`StepSlots.step`."""
        return self.slots.step(t)

    def step_arrays(self, t: int) -> dict[str, np.ndarray]:
        """:meth:`StepSlots.step_arrays`."""
        return self.slots.step_arrays(t)

    def block_arrays(self) -> dict[str, np.ndarray]:
        """:meth:`StepSlots.block_arrays`."""
        return self.slots.block_arrays()

    def commit(self, terminated: torch.Tensor, truncated: torch.Tensor) -> np.ndarray:
        """:meth:`StepSlots.commit` under the lock, then ``written``."""
        with self.lock:
            index = self.slots.commit(terminated, truncated)
            self.written(index)
        return index


def open_steps(writer: StreamWriter, T: int, any_fields: bool = False) -> StepSlots | None:
    """Slots for ``T`` steps written in place (module docstring), or None where the stream
    ``writer`` writes cannot take them so (then collect a batch and ``extend`` it).
    ``any_fields``: the caller fills every slot field, extra fields too (a dataset loader),
    not only the obs fields, ``action`` and ``reward``."""
    writer.check_open()
    lanes, L = writer.lanes, writer.lane_capacity
    if (
        writer.autoreset != AutoresetMode.NEXT_STEP
        or writer.stacked_input
        or writer.compressed
        or not 1 <= T <= L
        or not any_fields
        and set(writer.slot_spec) != {*writer.obs_keys, "action", "reward"}
    ):
        return None
    tensors = writer.rows.step_tensors()  # None: not contiguous CPU tensors
    if not tensors:
        return None
    writer.start_new_episodes()  # after a resume or a load (as extend)
    start = lanes.count % L
    if not (start == start[0]).all():  # lanes drifted (a final obs of end_episodes)
        return None
    writer.reserve(None, T)  # disk: a commit vouches for these slots
    lanes.vacate(T)
    return StepSlots(writer, tensors, T, int(start[0]))


def check_step_fields(
    row: dict[str, torch.Tensor], fields: dict[str, Any], actions: Any
) -> str | None:
    """Why the observations ``fields`` (by field name) and ``actions`` of a collector cannot
    be copied as they are into a step's slots ``row`` (:meth:`StepSlots.step`: other fields,
    dtype, shape or device), or None."""
    given = {**fields, "action": actions}
    want = set(row) - {"reward"}
    if row["reward"].dtype not in (torch.float16, torch.float32, torch.float64):
        return f"reward stored as {row['reward'].dtype}"
    if set(given) != want:
        return f"fields {sorted(given)}, the stream's {sorted(want)}"
    for k, v in given.items():
        dst = row[k]
        if not isinstance(v, torch.Tensor) or v.dtype != dst.dtype or v.shape != dst.shape:
            if not isinstance(v, torch.Tensor | np.ndarray):
                return f"{k}: {type(v)} []"
            return f"{k}: {v.dtype} {list(v.shape)}"
        if v.device != dst.device:
            return f"{k}: on {v.device}"
    return None


__all__ = ["LockedSteps", "StepSlots", "check_step_fields", "open_steps"]
