"""What this process may still allocate under its cgroup memory limits (v1 and v2), read from
the cgroup filesystem; :func:`rlstash.memory.ram_available` caps psutil's free RAM with it."""

from __future__ import annotations

import os
from pathlib import Path

_NO_LIMIT = 1 << 62  # cgroup v1 reports "no limit" as a huge page-aligned number


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _stat_value(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            k, _, v = line.partition(" ")
            if k == key:
                return int(v)
    except (OSError, ValueError):
        pass
    return 0


def _cgroup_paths(proc_cgroup: Path) -> tuple[str | None, str | None]:
    """(v2 path, v1 memory-controller path) of this process, from /proc/self/cgroup."""
    v2 = v1 = None
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None, None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        elif "memory" in parts[1].split(","):
            v1 = parts[2]
    return v2, v1


def _levels(base: Path, rel: str | None) -> list[Path]:
    """``base/rel`` and its parents up to ``base`` (only existing ones; ``base`` last)."""
    here = base / rel.lstrip("/") if rel else base
    out = []
    while True:
        if here.is_dir():
            out.append(here)
        if here == base or base not in here.parents:
            break
        here = here.parent
    return out or ([base] if base.is_dir() else [])


def cgroup_available(
    root: str | os.PathLike = "/sys/fs/cgroup", proc_cgroup: str | os.PathLike = "/proc/self/cgroup"
) -> int | None:
    """Bytes this process may still allocate under its cgroup memory limits, or None.

    cgroup v2: min over the process's cgroup and its ancestors of
    ``memory.max - (memory.current - inactive_file)``. cgroup v1: ``min(memory.limit_in_bytes,
    hierarchical_memory_limit) - (memory.usage_in_bytes - total_inactive_file)``. None when no
    limit is set (or no cgroup filesystem is readable).
    """
    root, proc_cgroup = Path(root), Path(proc_cgroup)
    v2, v1 = _cgroup_paths(proc_cgroup)
    best: int | None = None
    if (root / "cgroup.controllers").exists():  # unified (v2) hierarchy mounted at root
        for level in _levels(root, v2):
            limit = _read_int(level / "memory.max")
            current = _read_int(level / "memory.current")
            if limit is None or current is None:
                continue
            used = current - _stat_value(level / "memory.stat", "inactive_file")
            avail = max(limit - used, 0)
            best = avail if best is None else min(best, avail)
        return best
    base = root / "memory"
    for level in _levels(base, v1)[:1]:  # v1: hierarchical_memory_limit covers ancestors
        limit = _read_int(level / "memory.limit_in_bytes")
        hier = _stat_value(level / "memory.stat", "hierarchical_memory_limit") or None
        usage = _read_int(level / "memory.usage_in_bytes")
        limits = [x for x in (limit, hier) if x is not None and x < _NO_LIMIT]
        if not limits or usage is None:
            continue
        used = usage - _stat_value(level / "memory.stat", "total_inactive_file")
        best = max(min(limits) - used, 0)
    return best
