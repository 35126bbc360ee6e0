"""Memory telemetry for long runs: process-tree RSS, GPU memory, /dev/shm and run-dir disk use.

A run killed for memory can be explained from its log afterwards: the loop logs these
numbers at every evaluation, and prints the memory plan at start.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import psutil
import torch

MiB = 1024**2


def tree_rss(pid: int | None = None) -> int:
    """Resident bytes of a process and all its descendants."""
    try:
        root = psutil.Process(pid or os.getpid())
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total


def dir_bytes(path: str | os.PathLike) -> int:
    """Bytes allocated on disk by the files below ``path`` (sparse-aware)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                continue
    return total


def snapshot(
    run_dir: str | os.PathLike | None = None, device: torch.device | None = None
) -> dict[str, float]:
    """One row of telemetry, in MiB. GPU memory only when ``device`` is a CUDA device (I1)."""
    row = {"rss_tree_mb": tree_rss() / MiB}
    if Path("/dev/shm").exists():
        shm = shutil.disk_usage("/dev/shm")
        row["shm_used_mb"] = (shm.total - shm.free) / MiB
    if run_dir is not None and Path(run_dir).exists():
        row["run_dir_mb"] = dir_bytes(run_dir) / MiB
        row["disk_free_mb"] = shutil.disk_usage(run_dir).free / MiB
    if device is not None and device.type == "cuda":
        row["gpu_allocated_mb"] = torch.cuda.memory_allocated(device) / MiB
        row["gpu_peak_mb"] = torch.cuda.max_memory_allocated(device) / MiB
    return row


def open_fds() -> int:
    """Open file descriptors of this process."""
    return psutil.Process().num_fds() if hasattr(psutil.Process, "num_fds") else -1
