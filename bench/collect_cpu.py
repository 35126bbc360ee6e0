#!/usr/bin/env python3
"""CPU time per env step of the collection peers: bench/collect.py's load-independent companion.

    python3 bench/collect_cpu.py [--envs HalfCheetah-v5] [--n 32] [--steps 600] [--rounds 5]
                                 [--cores 2] [--out bench/results/collect_cpu.md]

On a machine shared with other work, wall-clock ratios say who got the cores (a peer with
32 processes gets more of them than a one-process loop). CPU time does not depend on that:
for each peer, the CPU seconds per vector step spent in this process (the caller: actions,
messages, copies) and in each of its worker processes (psutil, over ``--steps`` steps after
a warm-up), in ``--rounds`` interleaved rounds, medians.

From it, the rate the peer would reach on ``--cores`` idle cores, as a ratio to the raw loop
(an *estimate*, not a measurement; wake-up latencies are left out, so it is an upper bound)::

    step time = caller CPU + max(busiest worker CPU, all workers' CPU / cores)
    ratio     = raw loop CPU per step / step time

The caller's CPU counts in full because it runs while the workers wait for it (actions) or it
waits for them (results); the workers run in parallel, one per core at best.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

PEERS = ("raw", "rlstash-w2", "gym-async")


def _cpu(pid: int) -> float:
    import psutil

    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def measure(peer, sample, steps: int) -> dict[str, float]:
    """CPU microseconds per vector step: the caller's and each worker's; wall too."""
    pids = [os.getpid(), *peer.worker_pids()]
    before = [_cpu(p) for p in pids]
    start = time.perf_counter()
    for _ in range(steps):
        peer.step(sample())
    wall = time.perf_counter() - start
    used = [(_cpu(p) - b) / steps * 1e6 for p, b in zip(pids, before)]
    return {"caller": used[0], "workers": used[1:], "wall": wall / steps * 1e6}


def step_estimate(m: dict, cores: int) -> float:
    """Microseconds per vector step on ``cores`` idle cores (see the module docstring)."""
    workers = m["workers"]
    parallel = max(max(workers), sum(workers) / cores) if workers else 0.0
    return m["caller"] + parallel


def run_env(env: str, n: int, steps: int, rounds: int, cores: int) -> list[list[object]]:
    from collect_peers import action_sampler, build_peer

    peers = {k: build_peer(k, env, n) for k in PEERS}
    try:
        for p in peers.values():
            p.reset()
        space = peers["raw"].single_action_space
        samplers = {k: action_sampler(space, n, seed=i) for i, k in enumerate(peers)}
        for k, p in peers.items():  # warm-up
            measure(p, samplers[k], max(steps // 10, 10))
        got: dict[str, list[dict]] = {k: [] for k in peers}
        for r in range(rounds):
            order = list(peers)[r % len(peers) :] + list(peers)[: r % len(peers)]
            for k in order:
                got[k].append(measure(peers[k], samplers[k], steps))
    finally:
        for p in peers.values():
            p.close()

    def med(k: str, f) -> float:
        return statistics.median(f(m) for m in got[k])

    raw = med("raw", lambda m: m["caller"])
    rows = []
    for k in peers:
        est = med(k, lambda m: step_estimate(m, cores))
        workers = [
            statistics.median(m["workers"][i] for m in got[k])
            for i in range(len(got[k][0]["workers"]))
        ]
        shown = ", ".join(f"{w:.0f}" for w in workers) if len(workers) <= 4 else (
            f"{len(workers)} x ~{statistics.median(workers):.0f}"
        )  # fmt: skip
        rows.append([env, n, k, f"{med(k, lambda m: m['caller']):.0f}", shown or "—",
                     f"{est:.0f}", f"{raw / est:.2f}x", f"{med(k, lambda m: m['wall']):.0f}"])  # fmt: skip
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--envs", default="HalfCheetah-v5,CartPole-v1")
    p.add_argument("--n", type=int, default=32, help="envs per peer")
    p.add_argument("--steps", type=int, default=600, help="vector steps per measurement")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (medians)")
    p.add_argument("--cores", type=int, default=2, help="idle cores of the estimate")
    p.add_argument("--out", default=str(HERE / "results" / "collect_cpu.md"))
    args = p.parse_args()
    from common import header_lines, machine_info, markdown_table, publish, timed_run

    info = machine_info()
    envs = [e.strip() for e in args.envs.split(",") if e.strip()]

    def run() -> list:
        return [r for e in envs for r in run_env(e, args.n, args.steps, args.rounds, args.cores)]

    rows = timed_run(run, info)
    headers = ["env", "N", "peer", "caller CPU us/step", "worker CPU us/step (each)",
               f"est. us/step on {args.cores} idle cores", "est. ratio to raw",
               "wall us/step (this machine, loaded)"]  # fmt: skip
    text = "\n".join([
        "# Env collection: CPU time per vector step (load-independent)", "",
        f"`python bench/collect_cpu.py --envs {','.join(envs)} --n {args.n} --steps {args.steps} "
        f"--rounds {args.rounds} --cores {args.cores}`", "", *header_lines(info), "",
        __doc__.split("\n\n", 2)[2].strip(), "", markdown_table(headers, rows), "",
    ])  # fmt: skip
    return publish(text, args.out, "collect_cpu", [])


if __name__ == "__main__":
    from bench_venv import ensure_bench_venv

    ensure_bench_venv(__file__)
    sys.exit(main())
