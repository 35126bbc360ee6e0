"""Plan before allocate for a run (invariant I2): the replay buffer and the agent's networks
are checked against what is free before either is built, and a run that does not fit is
refused in one line naming the numbers and the flags that set them.

The checks are the library's own (the stream storage's :func:`~rlstash.storage.stream_plan.
stream_plan`, the storages' and the agents' dry runs, :mod:`rlstash.agents.planning`); here
their refusals are worded for ``rlstash train``::

    --buffer-size 1,000,000,000,000: the replay buffer needs 27.3 TiB on ram (...), 21.4 GiB
    free (20.4 GiB usable); --buffer-size <= 731,234,567 fits, or --storage disk
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlstash.agents.planning import AgentMemoryError, measure
from rlstash.memory import InsufficientMemoryError, human_bytes, plan
from rlstash.train.config import flag


def _label(name: str) -> str:
    """How ``rlstash train`` is given an agent setting: its flag (``net_arch`` -> ``--net-arch``)."""
    return flag(name)


def check_agent(build: Callable[[], Any]) -> None:
    """Refuse the agent ``build()`` makes before it is built when its networks do not fit,
    in one line naming the flags (:class:`~rlstash.agents.planning.AgentMemoryError`)."""
    memory = measure(build)
    if memory is not None:
        memory.check(_label)


def check_tiered(
    spec: Any, k: int, num_envs: int, capacity: int, n_hot: int, device: Any, path: Path
) -> None:
    """The parts of a tiered replay checked together before any is allocated: the hot tier
    on ``device``, the cold tier's files and the lanes' under ``path`` (not when they exist:
    a stream there resumes), the row map and the lanes' bookkeeping in RAM."""
    from rlstash.storage.stream_commit import disk_bytes
    from rlstash.storage.stream_plan import BOOKKEEPING, bookkeeping_bytes
    from rlstash.storage.stream_spec import slot_spec
    from rlstash.storage.tiered import TieredStorage

    sspec = slot_spec(spec, k, k > 1)
    hot = min(n_hot, capacity)
    extra = {
        str(device): {"hot tier": sum(sspec.field_nbytes(hot).values())},
        "ram": TieredStorage.plan_bytes(capacity, hot),
        "disk": disk_bytes(num_envs, capacity // num_envs),
    }
    overhead = {BOOKKEEPING: bookkeeping_bytes(num_envs, capacity, on_disk=True)}
    p = plan(sspec, capacity, "disk", path=path, extra=extra, overhead=overhead)
    p.check(places=[x.place for x in p.places if x.place != "disk" or not path.exists()])


def buffer_refusal(
    exc: InsufficientMemoryError, cfg: Any, capacity: int
) -> InsufficientMemoryError:
    """``exc`` (a replay buffer of ``capacity`` slots that does not fit) as one line naming
    ``--buffer-size`` (the largest that fits, at the bytes per slot planned) and the fixes."""
    p = exc.plan
    place = p.place(exc.place) if p is not None else None
    usable = place.usable if place is not None and place.usable is not None else exc.free
    if place is None and exc.place != "disk":
        usable = int(usable * 0.95)  # check_needs' safety margin
    per_slot = exc.needed / capacity
    fits = int(usable // per_slot) // cfg.lanes * cfg.lanes
    items = ""
    if place is not None:
        items = " (" + ", ".join(f"{k} {human_bytes(v)}" for k, v in place.items.items() if v) + ")"
    fixes = [f"--buffer-size <= {fits:,} fits" if fits >= cfg.lanes else "free memory first"]
    if exc.place == "ram" and cfg.storage == "ram":
        fixes.append("--storage disk (the replay in files under --run-dir)")
    if exc.place.startswith("cuda"):
        fixes.append("--buffer-device cpu")
    if exc.place == "disk":
        fixes.append("a --run-dir on a disk with more free space")
    where = "disk at --run-dir" if exc.place == "disk" else exc.place
    text = (
        f"--buffer-size {cfg.buffer_size:,}: the replay buffer ({cfg.storage} storage, "
        f"{capacity:,} slots over --envs {cfg.lanes}) needs {human_bytes(exc.needed)} on {where}"
        f"{items}, {human_bytes(exc.free)} free; " + ", or ".join(fixes)
    )
    return InsufficientMemoryError(text, exc.place, exc.needed, exc.free, p)


__all__ = ["AgentMemoryError", "buffer_refusal", "check_agent", "check_tiered"]
