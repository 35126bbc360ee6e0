#!/usr/bin/env python3
"""Does ``num_workers="auto"`` pick the fastest way to use the cores? One quick check per cell.

    python3 bench/collect_auto.py [--cells CartPole-v1:8,HalfCheetah-v5:32,...] [--reps 5]
                                  [--out FILE]

Per cell (env id, num_envs): ProcessPoolVectorEnv in-process (``w0``), with 2 workers
(``w2``), with 1 worker + the caller's n//2 envs (``w1c``) and with ``num_workers="auto"``,
all built first, then timed interleaved (``--reps`` rounds of ~0.2 s each, medians, random
actions). The choice counts as right when the chosen configuration's rate is within 15% of
the best of the three (as bench/collect.py's goal line). Written for 2 usable cores (auto's
candidates there are exactly w0, w2 and w1c). bench/collect.py measures the same peers beside
gymnasium, SB3 and TorchRL; this is the short check of auto alone.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_CELLS = (
    "CartPole-v1:8,CartPole-v1:32,CartPole-v1:256,Pendulum-v1:8,Pendulum-v1:32,"
    "HalfCheetah-v5:8,HalfCheetah-v5:32,Burn-200us:8,Burn-200us:32,Burn-200us:256"
)
ENVS = {"Burn-200us": "rlstash.envs.testing:rlstash/Burn-v0"}  # others: gymnasium ids


def _rate(pool, budget: float = 0.2) -> float:
    space, steps, t0 = pool.action_space, 0, time.perf_counter()
    while steps < 3 or time.perf_counter() - t0 < budget:
        pool.step(space.sample())
        steps += 1
    return steps * pool.num_envs / (time.perf_counter() - t0)


def cell(env: str, n: int, reps: int) -> dict:
    """Rates of w0, w2, w1c and auto, auto's choice and whether it is right."""
    import numpy as np

    from rlstash.envs import ProcessPoolVectorEnv

    env_id = ENVS.get(env, env)
    configs = {
        "w0": dict(num_workers=0),
        "w2": dict(num_workers=2),
        "w1c": dict(num_workers=1, caller_envs=n // 2),
    }
    pools = {k: ProcessPoolVectorEnv(env_id, n, seed=0, **v) for k, v in configs.items()}
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pools["auto"] = ProcessPoolVectorEnv(env_id, n, seed=0, num_workers="auto")
        text = next(str(w.message) for w in caught if "chose" in str(w.message))
        chose = re.search(r"chose (.+?) \(", text).group(1)  # type: ignore[union-attr]
        key = "w0" if "in-process" in chose else "w1c" if "this process" in chose else "w2"
        for pool in pools.values():
            pool.reset(seed=0)
        rates: dict[str, list[float]] = {k: [] for k in pools}
        for _ in range(reps):
            for k, pool in pools.items():
                rates[k].append(_rate(pool))
        med = {k: float(np.median(v)) for k, v in rates.items()}
        best = max(med[k] for k in configs)
        return {"rates": med, "chose": key, "right": med[key] >= 0.85 * best}
    finally:
        for pool in pools.values():
            pool.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cells", default=DEFAULT_CELLS, help="env:num_envs,...")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out", help="also write the table here (markdown)")
    args = p.parse_args()
    warnings.filterwarnings("ignore")
    rows, right = [], 0
    cells = [c.split(":") for c in args.cells.split(",")]
    for env, n in cells:
        load = os.getloadavg()[0]
        r = cell(env, int(n), args.reps)
        right += r["right"]
        rates = " | ".join(f"{r['rates'][k]:,.0f}" for k in ("w0", "w2", "w1c", "auto"))
        rows.append(
            f"| {env} | {n} | {rates} | {r['chose']} | {'yes' if r['right'] else 'NO'} | {load:.1f} |"
        )
        print(rows[-1], flush=True)
    lines = [
        f"`python bench/collect_auto.py --cells {args.cells} --reps {args.reps}`; "
        f"{os.cpu_count()} cores. Env steps/s, medians of {args.reps} interleaved rounds.",
        "",
        "| env | N | w0 | w2 | w1c | auto | auto chose | right | load |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: |",
        *rows,
        "",
        f"auto chose right (within 15% of the best) in {right}/{len(cells)} cells.",
        "",
    ]
    import common  # bench/common.py (the script's folder is on sys.path)

    return common.publish("\n".join(lines), args.out, "collect_auto", [])


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    from bench_venv import ensure_bench_venv

    ensure_bench_venv(__file__)
    sys.exit(main())
