"""Shared benchmark helpers: interleaved timing, throughput, RSS, a competing load, tables.

Absolute times on a shared 2-core machine are noise; ratios measured in one run are the
result. So every benchmark runs its configurations *interleaved* (one repetition of each in
turn, rep after rep) and reports medians::

    res = interleaved({"a": run_a, "b": run_b}, reps=7)   # run_x(n) performs n operations
    res["a"].median                                       # operations per second
    with competing_load(core=0):                          # one busy process pinned to core 0
        loaded = interleaved({"a": run_a, "b": run_b}, reps=7)

Only the standard library, numpy and psutil are needed (torch versions are read if present).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import gc
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
BENCH_ENV = ROOT / ".venv-bench" / "bench-env.json"
MIN_REPS = 5

Run = Callable[[int], object]  # run(n) performs n operations of one configuration


@dataclass
class Timing:
    """Operations per second of one configuration over interleaved repetitions."""

    n: int  # operations per repetition (calibrated)
    rates: list[float] = field(default_factory=list)  # ops/s of each repetition

    @property
    def median(self) -> float:
        return statistics.median(self.rates)

    @property
    def spread(self) -> float:
        """(max - min) / median: how noisy the repetitions were."""
        return (max(self.rates) - min(self.rates)) / self.median if self.median else math.nan


CLOCK = {"clock": time.perf_counter}  # what _time measures: wall seconds unless changed


def use_cpu_clock() -> None:
    """Time repetitions in CPU seconds of this process (``time.process_time``) instead of
    wall seconds: on a machine other users load, a single-threaded loop's CPU time counts
    much less of their load. Say so next to the results."""
    CLOCK["clock"] = time.process_time


def _time(run: Run, n: int) -> float:
    clock = CLOCK["clock"]
    start = clock()
    run(n)
    return clock() - start


def calibrate(run: Run, target_s: float, max_n: int = 1 << 24) -> int:
    """Operations per repetition so that one repetition lasts about ``target_s`` seconds.

    One warm-up call, then ``n`` grows x4 until a call lasts >= target_s / 8; the final
    ``n = ceil(n * target_s / t)``.
    """
    if target_s <= 0:
        raise ValueError(f"target_s: expected > 0 seconds, got {target_s}")
    run(1)
    n = 1
    while True:
        t = _time(run, n)
        if t >= target_s / 8 or n >= max_n:
            break
        n *= 4
    return max(1, min(max_n, math.ceil(n * target_s / max(t, 1e-9))))


def interleaved(runs: Mapping[str, Run], reps: int = 7, target_s: float = 0.2) -> dict[str, Timing]:
    """Time each configuration in turn, rep after rep; medians are in ``Timing.median``.

    Each ``run(n)`` performs ``n`` operations; ``n`` is calibrated once per configuration so a
    repetition lasts ``target_s``. The order rotates by one every repetition, so no
    configuration always follows the same neighbour. Rate of a repetition: ``n / seconds``.
    """
    if reps < MIN_REPS:
        raise ValueError(f"reps: expected >= {MIN_REPS} repetitions, got {reps}")
    if not runs:
        raise ValueError("runs: expected at least one configuration, got none")
    names = list(runs)
    timings = {name: Timing(n=calibrate(runs[name], target_s)) for name in names}
    for rep in range(reps):
        k = rep % len(names)
        for name in names[k:] + names[:k]:
            t = timings[name]
            t.rates.append(t.n / _time(runs[name], t.n))
    return timings


def gb_per_s(rate: float, nbytes: int) -> float:
    """Throughput in GB/s (1e9 bytes) of ``rate`` operations/s moving ``nbytes`` each."""
    return rate * nbytes / 1e9


def rate_cell(rate: float | None, base: float | None) -> str:
    """A table cell: the rate and its ratio to ``base`` ('12.3k (1.50x)'); '–' without a rate,
    no ratio without a base."""
    if rate is None:
        return "–"
    return fmt_rate(rate) + (f" ({rate / base:.2f}x)" if base else "")


def fmt_rate(x: float | None) -> str:
    """12345.6 -> '12.3k'; None/NaN -> '—'."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.3g}{unit}" if abs(x) / div < 100 else f"{x / div:.0f}{unit}"
    return f"{x:.3g}"


def fmt_ratio(x: float | None, digits: int = 2) -> str:
    """0.8512 -> '0.85x'; None/NaN -> '—'."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:.{digits}f}x"


def fmt_bytes(n: float | None) -> str:
    """Bytes in binary units: 176160768 -> '168.0 MiB'."""
    if n is None:
        return "—"
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= div:
            return f"{n / div:.1f} {unit}"
    return f"{int(n)} B"


def tree_rss(pid: int | None = None) -> int:
    """Resident bytes of a process and all its descendants (psutil)."""
    proc = psutil.Process(pid)
    total = proc.memory_info().rss
    for child in proc.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            total += child.memory_info().rss
    return total


def rss_parts() -> dict[str, int]:
    """This process's resident bytes split as in /proc/self/status: anon, file, shmem, total."""
    parts = {"anon": 0, "file": 0, "shmem": 0}
    keys = {"RssAnon:": "anon", "RssFile:": "file", "RssShmem:": "shmem"}
    with contextlib.suppress(OSError), open("/proc/self/status") as fh:
        for line in fh:
            name, *rest = line.split()
            if name in keys:
                parts[keys[name]] = int(rest[0]) * 1024
    parts["total"] = psutil.Process().memory_info().rss
    return parts


@dataclass
class CpuMeter:
    """CPU use during a phase, in cores: the whole machine, this process, and the rest."""

    wall_s: float = 0.0
    machine: float = 0.0  # busy cores, all processes
    own: float = 0.0  # this process (all its threads)
    excluded: float = 0.0  # processes passed to exclude(), e.g. the competing load
    _start: dict[int, float] = field(default_factory=dict)  # pid -> its CPU seconds so far

    @property
    def others(self) -> float:
        """Cores used by everything else on the machine (other users' work)."""
        return max(0.0, self.machine - self.own - self.excluded)

    def exclude(self, pid: int) -> None:
        """Count ``pid`` (alive until the meter closes) apart from the others."""
        self._start[pid] = _proc_cpu(pid)


def _proc_cpu(pid: int | None = None) -> float:
    with contextlib.suppress(psutil.Error):
        t = psutil.Process(pid).cpu_times()
        return t.user + t.system
    return 0.0


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic GC pause while the body runs (as timeit): what exists is collected and frozen,
    collection is off; both undone after. One peer's garbage (TorchRL's) then never costs
    another peer's timed run."""
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()


@contextlib.contextmanager
def cpu_meter() -> Iterator[CpuMeter]:
    """Measure how busy the machine was while the body ran (psutil.cpu_times deltas)."""
    meter = CpuMeter()
    t0, own0, sys0 = time.perf_counter(), _proc_cpu(), psutil.cpu_times()
    try:
        yield meter
    finally:
        meter.wall_s = time.perf_counter() - t0
        sys1 = psutil.cpu_times()
        idle = (sys1.idle + getattr(sys1, "iowait", 0)) - (sys0.idle + getattr(sys0, "iowait", 0))
        total = sum(sys1) - sum(sys0)
        ncpu = psutil.cpu_count() or 1
        meter.machine = (1 - idle / total) * ncpu if total > 0 else 0.0
        meter.own = (_proc_cpu() - own0) / meter.wall_s
        used = sum(_proc_cpu(pid) - start for pid, start in meter._start.items())
        meter.excluded = used / meter.wall_s


_SPIN = (
    "import os, signal\nsignal.signal(signal.SIGTERM, lambda *a: os._exit(0))\nwhile True: pass\n"
)


@contextlib.contextmanager
def competing_load(core: int = 0) -> Iterator[subprocess.Popen]:
    """One busy process (a pure-Python spin loop) pinned to ``core`` for the duration.

    Models env workers and a learner sharing a machine. The process is stopped on exit,
    also when the body raises.
    """
    allowed = os.sched_getaffinity(0)
    if core not in allowed:
        raise ValueError(f"core: expected one of the usable cores {sorted(allowed)}, got {core}")
    proc = subprocess.Popen([sys.executable, "-c", _SPIN], stdin=subprocess.DEVNULL)
    try:
        os.sched_setaffinity(proc.pid, {core})
        time.sleep(0.2)  # let it start spinning
        if proc.poll() is not None:
            raise RuntimeError(f"competing load exited early with code {proc.returncode}")
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub markdown table; numbers right-aligned."""
    for i, row in enumerate(rows):
        if len(row) != len(headers):
            raise ValueError(f"rows[{i}]: expected {len(headers)} cells, got {len(row)}")

    def numeric(i: int) -> bool:
        cells = [str(r[i]) for r in rows if str(r[i]) not in ("—", "")]
        return bool(cells) and all(c[:1].isdigit() or c[:1] in "-+." for c in cells)

    align = ["---:" if numeric(i) else "---" for i in range(len(headers))]
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def machine_info() -> dict[str, object]:
    """What the results depend on: cores, memory, load, library versions, threads, date."""
    info: dict[str, object] = {
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "memory_total": fmt_bytes(psutil.virtual_memory().total),
        "memory_available": fmt_bytes(psutil.virtual_memory().available),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "python": sys.version.split()[0],
        "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE", "unset"),
    }
    with contextlib.suppress(ImportError):
        import numpy

        info["numpy"] = numpy.__version__
    with contextlib.suppress(ImportError):
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
    if BENCH_ENV.exists():
        peers = json.loads(BENCH_ENV.read_text())
        for key in ("torchrl", "tensordict", "stable_baselines3", "cpprb", "torchrl_extension"):
            if key in peers:
                info[key] = peers[key]
    return info


def load_of(value: object) -> float | None:
    """The 1-minute load average in ``value``: a number, or ``uptime``'s line."""
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, (tuple, list)) and value:
        return load_of(value[0])
    found = re.search(r"load averages?:\s*([0-9.]+)", str(value))
    return float(found.group(1)) if found else None


def load_sentence(before: object, after: object, cores: int | None = None) -> str:
    """What the load averages measured before and after a benchmark say of the machine: a
    LOADED one (above 1.25 x the cores: more runnable processes than cores) or a quiet one.
    Reports say this instead of assuming either."""
    cores = cores or os.cpu_count() or 1
    b, a = load_of(before), load_of(after)
    if b is None and a is None:
        return "Load not measured: the ratios measured in the same run are the result."
    seen = f"load average {b if b is not None else '?'} before, {a if a is not None else '?'} after, on {cores} cores"
    if max(x for x in (b, a) if x is not None) > 1.25 * cores:
        return (
            f"**The machine was LOADED** ({seen}): absolute rates are not a quiet machine's; "
            "the ratios measured in the same run are the result."
        )
    return (
        f"The machine was quiet ({seen}, the benchmark's own processes included); the ratios "
        "measured in the same run are the result."
    )


def header_lines(info: Mapping[str, object]) -> list[str]:
    """Machine info as markdown bullet lines."""
    return [f"- {key}: {value}" for key, value in info.items()]


def wait_quiet(max_wait_s: float, tag: str, others_max: float = 0.5) -> None:
    """Wait (at most ``max_wait_s``) until the machine uses < ``others_max`` cores, saying so."""
    deadline = time.monotonic() + max_wait_s
    while time.monotonic() < deadline:
        busy = psutil.cpu_percent(interval=2.0) / 100 * (psutil.cpu_count() or 1)
        if busy < others_max:
            return
        print(f"[{tag}] machine busy ({busy:.2f} cores used by others); waiting", flush=True)
        time.sleep(5)


def timed_run(run: Callable[[], Any], info: dict) -> Any:
    """``run()``; the load average at its end and its wall time go into ``info``."""
    start = time.time()
    try:
        return run()
    finally:
        info["load_average_1m_end"] = round(os.getloadavg()[0], 2)
        info["wall_time_s"] = round(time.time() - start)


def publish(text: str, out: str | Path | None, tag: str, failed: Sequence[str]) -> int:
    """Print a report, write it to ``out`` (parents created; None: print only) and say where
    it went and which peers failed; the exit code (1 when any failed)."""
    print(text)
    if out is not None:
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"[{tag}] wrote {path}", flush=True)
    if failed:
        print(f"[{tag}] FAILED peers: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def spawn_worker(script: str, task: dict, timeout: float) -> dict:
    """Run ``script --worker <task as JSON>`` in a fresh process (one torch thread, CUDA
    hidden) and return the JSON on its last stdout line, or ``{"error": ...}`` with the last
    line of its stderr; the load average before and after is added to the result."""
    cmd = [sys.executable, str(Path(script).resolve()), "--worker", json.dumps(task)]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    load = os.getloadavg()[0]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"]
        return {"error": lines[-1]}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["load_before_after"] = [round(load, 2), round(os.getloadavg()[0], 2)]
    return out
