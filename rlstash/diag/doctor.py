"""``rlstash doctor``: what matters for RL runs on this machine, with warnings and fixes."""

from __future__ import annotations

import multiprocessing as mp
import os
import resource
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import torch

GiB = 1024**3


@dataclass
class Report:
    """Facts as (name, value) rows, and warnings that each carry their fix."""

    rows: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def format(self) -> str:
        width = max(len(k) for k, _ in self.rows)
        lines = [f"{k:<{width}}  {v}" for k, v in self.rows]
        if self.warnings:
            lines.append("")
            lines += [f"WARNING: {w}" for w in self.warnings]
        else:
            lines += ["", "no problems found"]
        return "\n".join(lines)


def usable_cpus() -> int:
    """CPU cores this process may use: affinity mask and cgroup v2 ``cpu.max`` quota."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        n = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            n = min(n, max(1, int(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return n


def cgroup_memory_limit() -> int | None:
    """The container's memory limit in bytes, or None when there is none."""
    for p in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(p).read_text().strip()
        except OSError:
            continue
        if text != "max" and int(text) < (1 << 60):
            return int(text)
    return None


def diagnose(run_dir: str | os.PathLike = "runs") -> Report:
    """Collect the facts. Queries CUDA because the user asked what the machine has."""
    r = Report()
    r.rows.append(("torch", f"{torch.__version__} (CUDA build: {torch.version.cuda or 'no'})"))
    cuda = torch.cuda.is_available()
    r.rows.append(("CUDA visible", "yes" if cuda else "no"))
    if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
        r.rows.append(("CUDA_VISIBLE_DEVICES", repr(os.environ["CUDA_VISIBLE_DEVICES"])))
    if cuda:
        for i in range(torch.cuda.device_count()):
            free, total = torch.cuda.mem_get_info(i)
            name = torch.cuda.get_device_name(i)
            r.rows.append(
                (f"cuda:{i}", f"{name}, {free / GiB:.1f} GiB free of {total / GiB:.1f} GiB")
            )
    elif torch.version.cuda:
        r.warnings.append(
            "torch is a CUDA build but no GPU is visible; fix: check the driver (nvidia-smi) "
            "or CUDA_VISIBLE_DEVICES, or install the CPU build to save disk and RAM"
        )
    cpus = usable_cpus()
    r.rows.append(("CPU cores usable", f"{cpus} (of {os.cpu_count()})"))
    threads = torch.get_num_threads()
    r.rows.append(("torch intra-op threads", str(threads)))
    if threads > cpus:
        r.warnings.append(
            f"torch uses {threads} threads on {cpus} usable cores; fix: torch.set_num_threads({cpus})"
        )
    vm = psutil.virtual_memory()
    r.rows.append(("RAM available", f"{vm.available / GiB:.1f} GiB of {vm.total / GiB:.1f} GiB"))
    limit = cgroup_memory_limit()
    if limit is not None:
        r.rows.append(("cgroup memory limit", f"{limit / GiB:.1f} GiB"))
    run_dir = Path(run_dir)
    probe = next((p for p in [run_dir, *run_dir.absolute().parents] if p.exists()), Path("/"))
    disk = shutil.disk_usage(probe)
    r.rows.append(
        (f"disk free at {run_dir}", f"{disk.free / GiB:.1f} GiB of {disk.total / GiB:.1f} GiB")
    )
    if disk.free < 5 * GiB:
        r.warnings.append(
            f"only {disk.free / GiB:.1f} GiB free for runs and disk buffers; fix: --run-dir on a larger disk"
        )
    _shm(r)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    r.rows.append(("open-file limit", f"{soft} (hard {hard})"))
    if soft < 4096:
        r.warnings.append(
            f"open-file limit is {soft}; many env workers need more; fix: ulimit -n {min(hard, 65536)}"
        )
    methods = mp.get_all_start_methods()
    r.rows.append(("start methods", ", ".join(methods)))
    if "forkserver" not in methods:
        r.warnings.append(
            "forkserver is not available; ProcessPoolVectorEnv falls back to spawn (slower start-up)"
        )
    return r


def _shm(r: Report) -> None:
    if not Path("/dev/shm").exists():
        r.rows.append(("/dev/shm", "missing"))
        r.warnings.append(
            "/dev/shm is missing: shared-memory env workers cannot run; fix: mount a tmpfs there"
        )
        return
    shm = shutil.disk_usage("/dev/shm")
    r.rows.append(("/dev/shm", f"{shm.free / GiB:.2f} GiB free of {shm.total / GiB:.2f} GiB"))
    if shm.total < 1 * GiB:
        r.warnings.append(
            f"/dev/shm is only {shm.total / GiB:.2f} GiB; pixel envs over many workers need more; "
            "fix: docker run --shm-size=8g (or remount /dev/shm larger)"
        )
