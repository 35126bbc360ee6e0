#!/usr/bin/env python3
"""PettingZoo through rlstash's process pool vs PettingZoo + SuperSuit's vectorisation.

    python3 bench/marl_pz.py                       # writes bench/results/marl_pz.md
    python3 bench/marl_pz.py --rounds 5 --steps 200

The task: MPE ``simple_spread_v3`` (mpe2; 3 agents, discrete actions, 25-step episodes), 32
envs on 2 worker processes, uniform random actions drawn by one numpy generator in the loop.

* rlstash: :class:`rlstash.envs.pettingzoo.PettingZooVectorEnv` (``num_workers=2``): per-agent
  tensors over shared memory, same-step autoreset, masks, the global state, action masks.
* SuperSuit: ``concat_vec_envs_v1(pettingzoo_env_to_vec_env_v1(env), 32, num_cpus=2,
  base_class="gymnasium")``: each agent is one row of a single-agent vector env, 2 processes.

Rounds alternate the two sides (the first side alternates too); each round times ``--steps``
vector steps after a warm-up. Reported: the median env steps/s of each side (one env step =
every agent of one env acting once) and the ratio of the medians. Runs under
``bench/.work/venv-pz`` (``bench/setup_pz_env.py``: SuperSuit stays out of ``.venv``).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENV_PY = HERE / ".work" / "venv-pz" / "bin" / "python"
N_ENVS, N_WORKERS, N_AGENTS, N_ACTIONS = 32, 2, 3, 5
TASKS = {  # name -> (module with parallel_env(), what it is)
    "spread": ("mpe2.simple_spread_v3", "MPE `simple_spread_v3` (mpe2; 25-step episodes)"),
    "tiny": ("pz_tiny", "`bench/pz_tiny.py` (a near-free env: the vectorisation's own cost)"),
}


def _ensure_venv() -> None:
    if Path(sys.prefix).resolve() == VENV_PY.parent.parent.resolve():
        return
    subprocess.check_call([sys.executable, str(HERE / "setup_pz_env.py")])
    os.execv(str(VENV_PY), [str(VENV_PY), str(Path(__file__).resolve()), *sys.argv[1:]])


def rlstash_side(task: str, seed: int, state: bool = True):
    import torch

    from rlstash.envs.pettingzoo import PettingZooVectorEnv

    env = PettingZooVectorEnv(task, N_ENVS, N_WORKERS, seed, state=state)
    env.reset()

    def step(actions) -> None:
        env.step({"agents": torch.from_numpy(actions.reshape(N_ENVS, N_AGENTS))})

    return step, env.close


def supersuit_side(task: str, seed: int):
    import importlib

    import supersuit as ss

    vec = ss.pettingzoo_env_to_vec_env_v1(importlib.import_module(task).parallel_env())
    vec = ss.concat_vec_envs_v1(vec, N_ENVS, num_cpus=N_WORKERS, base_class="gymnasium")
    vec.reset(seed=seed)

    def step(actions) -> None:
        vec.step(actions)

    return step, vec.close


def time_side(step, rng, steps: int) -> float:
    """Env steps per second over ``steps`` vector steps of random actions."""
    draws = [rng.integers(0, N_ACTIONS, N_ENVS * N_AGENTS) for _ in range(steps)]
    start = time.perf_counter()
    for actions in draws:
        step(actions)
    return steps * N_ENVS / (time.perf_counter() - start)


def run_task(task: str, rounds: int, steps: int, rng) -> dict[str, list[float]]:
    """Interleaved rounds of every side on one task: env steps/s per round and side."""
    sides = {
        "rlstash PettingZooVectorEnv": rlstash_side(task, 0),
        "rlstash, state=False": rlstash_side(task, 0, state=False),
        "SuperSuit concat_vec_envs": supersuit_side(task, 0),
    }
    rates: dict[str, list[float]] = {name: [] for name in sides}
    try:
        for step, _ in sides.values():  # warm-up: caches, first resets
            time_side(step, rng, 20)
        for r in range(rounds):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            for name in order:
                rates[name].append(time_side(sides[name][0], rng, steps))
            print(f"{task} round {r}: " + ", ".join(f"{n} {v[-1]:,.0f}" for n, v in rates.items()))
    finally:
        for _, close in sides.values():
            close()
    return rates


def table(rates: dict[str, list[float]]) -> list[str]:
    """The markdown rows of one task and its ratio line."""
    medians = {n: statistics.median(v) for n, v in rates.items()}
    peer = medians["SuperSuit concat_vec_envs"]
    lines = [
        "| side | median env steps/s | agent steps/s | rounds (env steps/s) |",
        "| --- | ---: | ---: | --- |",
    ]
    for name, values in rates.items():
        shown = ", ".join(f"{v:,.0f}" for v in values)
        lines.append(
            f"| {name} | {medians[name]:,.0f} | {medians[name] * N_AGENTS:,.0f} | {shown} |"
        )
    ratios = ", ".join(f"{n}: **{medians[n] / peer:.2f}x**" for n in list(rates)[:2])
    return [*lines, "", f"Ratio to SuperSuit (medians; goal >= 2x): {ratios}.", ""]


def main() -> None:
    _ensure_venv()
    import common  # bench/common.py
    import numpy as np

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=300, help="vector steps per round")
    parser.add_argument("--tasks", default="spread,tiny", help=f"of {sorted(TASKS)}")
    parser.add_argument("--out", default=str(HERE / "results" / "marl_pz.md"))
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))  # pz_tiny (the workers get this path too)
    rng = np.random.default_rng(0)
    load_before = os.getloadavg()
    results = {
        t: run_task(TASKS[t][0], args.rounds, args.steps, rng) for t in args.tasks.split(",")
    }
    load_after = os.getloadavg()
    import pettingzoo
    import supersuit
    import torch

    lines = [
        "# PettingZoo through rlstash's process pool vs SuperSuit's vectorisation",
        "",
        f"`python3 bench/marl_pz.py --rounds {args.rounds} --steps {args.steps}`: "
        f"{N_ENVS} envs of {N_AGENTS} agents (discrete actions) on {N_WORKERS} worker "
        "processes, uniform random actions; one env step = every agent of one env acting once. "
        "Sides interleaved per round (alternating order), medians.",
        "",
        f"{common.load_sentence(load_before, load_after)} Python "
        f"{platform.python_version()}, torch {torch.__version__}, pettingzoo "
        f"{pettingzoo.__version__}, SuperSuit {getattr(supersuit, '__version__', '3.11.0')}.",
        "",
    ]
    for task, rates in results.items():
        lines += [f"## {TASKS[task][1]}", "", *table(rates)]
    lines += [
        "rlstash returns per-agent tensors ([32, 3, ...]) with masks, the global state "
        "(simple_spread's `state()` recomputes every agent's observation; `state=False` leaves "
        "it out, as SuperSuit does) and unpacked action masks each step; SuperSuit returns "
        "per-agent rows of a single-agent vector env ([96, ...]).",
        "",
        "`pz_tiny` has no global state, so its two rlstash rows run the same configuration: "
        "their gap is the noise of this loaded machine. On MPE the env's own physics and "
        "observations dominate (both sides step the same `parallel_env()` in 2 processes), "
        "so the vectorisation's lower cost shows only partly.",
        "",
    ]
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
