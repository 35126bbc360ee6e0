#!/usr/bin/env python3
"""Replay-buffer benchmark: rlstash against TorchRL, Stable-Baselines3, cpprb and numpy itself.

    python3 bench/replay.py [--quick] [--workloads W1,W2,W3] [--reps N] [--peers a,b]
                            [--out bench/results/replay.md]

Runs in ``.venv-bench`` (re-executes itself there; creates it with bench/setup_env.py when
missing). Workloads (bench/replay_peers.py): W1 vector transitions (capacity 1M, batch 256,
sample and extend in chunks of 8 and 1024), W2 Atari-sized pixels (capacity 100k, batch 32),
W3 prioritized W1 (alpha 0.6, beta 0.4, sample 256 + update priorities per step).

Method: each workload runs in a fresh worker process that builds every buffer, fills it to
capacity, then times all (buffer, operation) pairs interleaved (``bench.common.interleaved``,
medians of >= 5 repetitions), first quiet, then with one busy process pinned to core 0.
When the buffers of a workload would not fit in memory together (W2), each runs in its own
worker beside its own copy of the numpy limit, and ratios between buffers go through their
ratio to the limit. Memory (RSS increase over the raw bytes stored) is measured in a fresh
process per buffer. The exit code is 1 when a buffer that should work fails.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VENV_PY = ROOT / ".venv-bench" / "bin" / "python"
WORK = HERE / ".work"
sys.path.insert(0, str(HERE))


# ----------------------------------------------------------------------------- workers


def _build(key: str, wl, workdir: Path, pool) -> tuple[object, dict]:
    import replay_peers as rp

    factory, where = rp.PEERS[key]
    if wl.name not in where:
        raise ValueError(f"peer {key!r} does not run workload {wl.name}")
    peer = factory(wl, workdir)
    peer.fill(pool)
    return peer, {"label": peer.label, "delivered": rp.nbytes(peer.sample())}


def _timings(timings: dict) -> dict:
    return {k: {"median": t.median, "rates": t.rates, "n": t.n} for k, t in timings.items()}


def _cpu(meter) -> dict:
    """Busy cores during a phase: machine, this worker, the competing load, everyone else."""
    keys = ("wall_s", "machine", "own", "excluded", "others")
    return {k: round(getattr(meter, k), 3) for k in keys}


def _time_worker(task: dict) -> dict:
    """Build, fill and time every peer of one group, quiet then under a competing load."""
    import replay_peers as rp
    from common import competing_load, cpu_meter, interleaved

    wl = rp.workloads(task["quick"])[task["workload"]]
    workdir = Path(task["workdir"])
    pool = rp.make_chunks(wl, wl.fill_rows, 2, seed=0)
    peers, info, errors, runs = {}, {}, {}, {}
    for key in task["peers"]:
        try:
            peer, info[key] = _build(key, wl, workdir, pool)
            peers[key] = peer
            todo = {f"{key}|sample": peer.sample_run()}
            for c in wl.extend_chunks:
                todo[f"{key}|extend{c}"] = peer.extend_run(rp.make_chunks(wl, c, 4, seed=c))
            for run in todo.values():
                run(2)  # smoke: a peer that fails here is reported, not timed
            runs.update(todo)
        except Exception as exc:  # reported in the table and in the exit code
            traceback.print_exc()
            errors[key] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        print(f"[replay] {wl.name}: built {key}", file=sys.stderr, flush=True)
    out = {"workload": wl.name, "info": info, "errors": errors, "quiet": {}, "load": {}}
    if runs:
        with cpu_meter() as meter:
            timings = interleaved(runs, task["reps"], task["target_s"])
        out["quiet"], out["cpu_quiet"] = _timings(timings), _cpu(meter)
        with competing_load(core=task["core"]) as proc, cpu_meter() as meter:
            meter.exclude(proc.pid)
            timings = interleaved(runs, task["reps"], task["target_s"])
        out["load"], out["cpu_load"] = _timings(timings), _cpu(meter)
    for peer in peers.values():
        peer.close()
    return out


def _malloc_trim() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _rss_worker(task: dict) -> dict:
    """RSS of one peer built and filled in this fresh process (after its imports)."""
    import replay_peers as rp
    from common import rss_parts

    wl = rp.workloads(task["quick"])[task["workload"]]
    key = task["peers"][0]
    pool = rp.make_chunks(wl, wl.fill_rows, 2, seed=0)
    try:  # warm-up on a tiny copy: imports, code pages and caches are not the buffer's memory
        tiny = dataclasses.replace(wl, capacity=min(wl.capacity, 2 * wl.batch))
        warm, _ = _build(key, tiny, Path(task["workdir"]) / "warmup", pool)
        warm.sample_run()(2)
        warm.close()
        del warm
    except Exception as exc:
        traceback.print_exc()
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
    gc.collect()
    _malloc_trim()  # freed warm-up memory goes back to the OS, not into the next allocation
    before = rss_parts()
    try:
        peer, info = _build(key, wl, Path(task["workdir"]), pool)
    except Exception as exc:
        traceback.print_exc()
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
    gc.collect()
    after = rss_parts()
    peer.close()
    return {"label": info["label"], "stored": wl.stored_bytes, "before": before, "after": after}


def _worker_main(task: dict) -> int:
    Path(task["workdir"]).mkdir(parents=True, exist_ok=True)
    try:
        fn = _time_worker if task["mode"] == "time" else _rss_worker
        result = fn(task)
    finally:
        shutil.rmtree(task["workdir"], ignore_errors=True)
    Path(task["result"]).write_text(json.dumps(result))
    return 0


# ----------------------------------------------------------------------------- orchestration


def _spawn(task: dict, timeout_s: float) -> dict:
    """Run one worker in a fresh process; its result, or an error for every peer it had."""
    WORK.mkdir(parents=True, exist_ok=True)
    fd, result = tempfile.mkstemp(prefix="result-", suffix=".json", dir=WORK)
    os.close(fd)
    task = dict(task, result=result, workdir=tempfile.mkdtemp(prefix="w-", dir=WORK))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(task)]
    try:
        proc = subprocess.run(cmd, timeout=timeout_s, check=False)
        text = Path(result).read_text() if proc.returncode == 0 else ""
        if text:
            return json.loads(text)
        why = f"worker exited with code {proc.returncode}"
    except subprocess.TimeoutExpired:
        why = f"worker timed out after {timeout_s:.0f} s"
    finally:
        Path(result).unlink(missing_ok=True)
        shutil.rmtree(task["workdir"], ignore_errors=True)
    if task["mode"] == "rss":
        return {"error": why}
    return {"workload": task["workload"], "info": {}, "errors": dict.fromkeys(task["peers"], why)}


def _groups(wl, keys: list[str], budget: int) -> list[list[str]]:
    """All peers together when they fit in ``budget`` bytes, else each beside the limit."""
    need = wl.stored_bytes * len(keys) * 1.3  # memmap peers count too: page cache
    if need <= budget or "limit" not in keys:
        return [keys]
    return [["limit", k] for k in keys if k != "limit"]


def _run_all(args: argparse.Namespace) -> dict:
    import psutil
    import replay_peers as rp
    from common import wait_quiet

    wls = rp.workloads(args.quick)
    budget = min(8 << 30, psutil.virtual_memory().available // 2)
    results: dict = {"time": {}, "rss": {}}
    base = {"quick": args.quick, "reps": args.reps, "target_s": args.target_s, "core": args.core}
    for name in args.workloads:
        wl = wls[name]
        keys = [k for k in args.peers if name in rp.PEERS[k][1]]
        groups = _groups(wl, keys, budget)
        results["time"][name] = []
        for group in groups:
            print(f"[replay] {name}: timing {', '.join(group)}", flush=True)
            task = dict(base, mode="time", workload=name, peers=group)
            wait_quiet(args.wait_quiet, "replay")
            results["time"][name].append(_spawn(task, args.timeout))
        if args.skip_rss:
            continue
        for key in keys:
            print(f"[replay] {name}: memory of {key}", flush=True)
            task = dict(base, mode="rss", workload=name, peers=[key])
            results["rss"].setdefault(name, {})[key] = _spawn(task, args.timeout)
    return results


def _parse(argv: list[str]) -> argparse.Namespace:
    import replay_peers as rp

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small capacities: a smoke run")
    p.add_argument("--workloads", default="W1,W2,W3", help="comma list of W1,W2,W3")
    p.add_argument(
        "--peers", default=",".join(rp.PEERS), help="comma list of " + ",".join(rp.PEERS)
    )
    p.add_argument("--reps", type=int, default=7, help="interleaved repetitions (>= 5)")
    p.add_argument("--target-s", type=float, default=None, help="seconds per repetition")
    p.add_argument("--core", type=int, default=0, help="core the competing process is pinned to")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per worker process")
    p.add_argument(
        "--wait-quiet",
        type=float,
        default=None,
        help="seconds to wait per worker for the machine to be quiet (default 120, --quick 0)",
    )
    p.add_argument("--skip-rss", action="store_true", help="skip the memory measurements")
    p.add_argument("--out", default=str(HERE / "results" / "replay.md"), help="markdown output")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return args
    args.workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    args.peers = [k.strip() for k in args.peers.split(",") if k.strip()]
    for w in args.workloads:
        if w not in rp.workloads(False):
            p.error(f"--workloads: expected names from W1,W2,W3, got {w!r}")
    for k in args.peers:
        if k not in rp.PEERS:
            p.error(f"--peers: expected names from {','.join(rp.PEERS)}, got {k!r}")
    if args.reps < 5:
        p.error(f"--reps: expected >= 5 interleaved repetitions, got {args.reps}")
    if args.wait_quiet is None:
        args.wait_quiet = 0.0 if args.quick else 120.0
    if args.target_s is None:
        args.target_s = 0.03 if args.quick else 0.2
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parse(argv)
    if args.worker:
        return _worker_main(json.loads(args.worker))
    from common import machine_info, publish, timed_run
    from replay_report import render

    info = machine_info()
    results = timed_run(lambda: _run_all(args), info)
    text, failed = render(results, info, args)
    return publish(text, args.out, "replay", failed)


if __name__ == "__main__":
    from bench_venv import ensure_bench_venv

    ensure_bench_venv(__file__)
    sys.exit(main())
