"""How many CPU cores this process may use: affinity mask and cgroup CPU quota (torch-free)."""

from __future__ import annotations

import math
import os
from pathlib import Path


def _cgroup_quota(
    root: Path = Path("/sys/fs/cgroup"), proc: Path = Path("/proc/self/cgroup")
) -> float | None:
    """Cores allowed by the cgroup CPU quota (v2 ``cpu.max``, v1 ``cfs_quota_us``), or None.

    The tightest quota along the cgroup path counts: ``quota / period`` cores.
    """
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        return None
    best: float | None = None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        rel = Path(path.lstrip("/"))
        if hierarchy == "0" and controllers == "":  # cgroup v2
            bases = [root]
        elif "cpu" in controllers.split(","):  # cgroup v1
            bases = [root / "cpu,cpuacct", root / "cpu"]
        else:
            continue
        for base in bases:
            d = base / rel
            while True:
                quota = _read_quota(d)
                if quota is not None:
                    best = quota if best is None else min(best, quota)
                if d == base or d.parent == d:
                    break
                d = d.parent
    return best


def _read_quota(d: Path) -> float | None:
    try:
        text = (d / "cpu.max").read_text().split()
        if text and text[0] != "max":
            return int(text[0]) / int(text[1])
        return None
    except (OSError, ValueError, IndexError):
        pass
    try:
        quota = int((d / "cpu.cfs_quota_us").read_text())
        period = int((d / "cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def usable_cpus() -> int:
    """``min(len(sched_getaffinity), ceil(cgroup quota))``, at least 1."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    quota = _cgroup_quota()
    if quota is not None:
        n = min(n, max(1, math.ceil(quota)))
    return max(1, n)
