"""Plan before allocate for a :class:`~rlstash.storage.stream.StreamStorage` (invariant I2):
the exact bytes of its slots and of its lanes' bookkeeping, per place, checked before any of
them is allocated.

::

    slots          capacity * row bytes of the slot spec      on the backing's place
    bookkeeping    3 B per slot (flags, episode position, valid) + 42 B per lane, host RAM;
                   a disk stream keeps flags and episode positions in lanes.bin (disk) and
                   1 B per slot in RAM
    lanes files    lanes.bin + lanes.rec (disk and tiered streams)

A factory backing plans its own data when the factory builds it; the stream checks its
bookkeeping first.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch

from rlstash.memory import MemoryPlan, check_needs, plan
from rlstash.spec import Spec
from rlstash.storage.frame_backing import frame_plan_bytes
from rlstash.storage.frames import FrameCompression, frame_fields
from rlstash.storage.lanes import Lanes
from rlstash.storage.stream_commit import disk_bytes
from rlstash.storage.stream_spec import obs_names, slot_spec, step_spec

BOOKKEEPING = "stream: lane bookkeeping"  # the plan's name of the lanes' host bytes


def bookkeeping_bytes(num_envs: int, slots: int, on_disk: bool = False) -> int:
    """Host bytes of the lanes (:meth:`Lanes.plan_bytes`) plus the storage's ``_cut`` mask;
    ``on_disk``: the slots' flags and episode positions live in ``lanes.bin`` instead."""
    return Lanes.plan_bytes(num_envs, slots // num_envs, slots_given=on_disk) + num_envs


def plan_bytes(
    spec: Spec | Mapping,
    capacity: int,
    frame_stack: int = 1,
    stacked_input: bool = False,
    num_envs: int = 1,
    compression: FrameCompression | None = None,
) -> dict[str, int]:
    """:meth:`StreamStorage.plan_bytes`: per stored field, plus ``"bookkeeping"``."""
    slots = capacity // num_envs * num_envs
    sspec = slot_spec(spec, frame_stack, stacked_input)
    out = sspec.field_nbytes(slots)
    if compression is not None:
        keys = frame_fields(sspec, obs_names(sspec))
        for k in keys:
            del out[k]
        out.update(frame_plan_bytes(sspec, keys, compression, num_envs, slots // num_envs))
    out["bookkeeping"] = bookkeeping_bytes(num_envs, slots)
    return out


def naive_bytes(
    spec: Spec | Mapping, capacity: int, frame_stack: int = 1, stacked_input: bool = False
) -> dict[str, int]:
    """:meth:`StreamStorage.naive_bytes`."""
    spec, out = step_spec(spec), {}
    for name, f in spec.items():
        stack = frame_stack if name in obs_names(spec) and not stacked_input else 1
        out[name] = f.row_bytes * stack * capacity
        if name in obs_names(spec):
            out["next_" + name] = out[name]
    return out


def stream_plan(
    sspec: Spec,
    num_envs: int,
    slots: int,
    backing: Any,
    device: str | torch.device,
    path: str | os.PathLike | None,
    resume: bool = False,
    allow_overcommit: bool = False,
) -> MemoryPlan | None:
    """Check what a stream of ``slots`` slots of ``sspec`` over ``num_envs`` lanes allocates
    on ``backing`` ("ram", "disk", a FrameCompression or a factory) before any of it is, and
    return its plan (None for a factory, whose storage plans its own data). A disk stream
    that ``resume``s checks its host RAM only (its files exist)."""
    L = slots // num_envs
    if callable(backing) and not isinstance(backing, (str, FrameCompression)):
        needs: dict[str, dict[str, int]] = {
            "ram": {BOOKKEEPING: bookkeeping_bytes(num_envs, slots, on_disk=path is not None)}
        }
        if path is not None and not resume:
            needs["disk"] = disk_bytes(num_envs, L)
        check_needs(
            f"the lanes of a StreamStorage of {slots:,} slots",
            needs,
            "a smaller capacity (or fewer num_envs lanes)",
            path=path,
            allow_overcommit=allow_overcommit,
        )
        return None
    if isinstance(backing, FrameCompression):
        keys = frame_fields(sspec, obs_names(sspec))
        rest = Spec({k: f for k, f in sspec.items() if k not in keys})
        arena = frame_plan_bytes(sspec, keys, backing, num_envs, L)
        p = plan(
            rest, slots, "ram", "cpu", extra={"ram": {f"frames: {k}": b for k, b in arena.items()}},
            overhead={BOOKKEEPING: bookkeeping_bytes(num_envs, slots)},
        )  # fmt: skip
        return p.check(allow_overcommit)
    if backing == "disk":
        p = plan(
            sspec, slots, "disk", path=path, extra={"disk": disk_bytes(num_envs, L)},
            overhead={BOOKKEEPING: bookkeeping_bytes(num_envs, slots, on_disk=True)},
        )  # fmt: skip
        return p.check(allow_overcommit, places=("ram",) if resume else None)
    overhead = {BOOKKEEPING: bookkeeping_bytes(num_envs, slots)}
    return plan(sspec, slots, "ram", device, overhead=overhead).check(allow_overcommit)


__all__ = ["BOOKKEEPING", "bookkeeping_bytes", "naive_bytes", "plan_bytes", "stream_plan"]
