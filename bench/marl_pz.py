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
TASK = "mpe2.simple_spread_v3"


def _ensure_venv() -> None:
    if Path(sys.prefix).resolve() == VENV_PY.parent.parent.resolve():
        return
    subprocess.check_call([sys.executable, str(HERE / "setup_pz_env.py")])
    os.execv(str(VENV_PY), [str(VENV_PY), str(Path(__file__).resolve()), *sys.argv[1:]])


def rlstash_side(seed: int):
    import torch

    from rlstash.envs.pettingzoo import PettingZooVectorEnv

    env = PettingZooVectorEnv(TASK, N_ENVS, N_WORKERS, seed)
    env.reset()

    def step(actions) -> None:
        env.step({"agents": torch.from_numpy(actions.reshape(N_ENVS, N_AGENTS))})

    return step, env.close


def supersuit_side(seed: int):
    import supersuit as ss
    from mpe2 import simple_spread_v3

    vec = ss.pettingzoo_env_to_vec_env_v1(simple_spread_v3.parallel_env())
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


def main() -> None:
    _ensure_venv()
    import numpy as np

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=300, help="vector steps per round")
    parser.add_argument("--out", default=str(HERE / "results" / "marl_pz.md"))
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    sides = {"rlstash PettingZooVectorEnv": rlstash_side(0), "SuperSuit concat_vec_envs": supersuit_side(0)}
    rates: dict[str, list[float]] = {name: [] for name in sides}
    load_before = os.getloadavg()
    try:
        for name, (step, _) in sides.items():  # warm-up: caches, first resets
            time_side(step, rng, 50)
        for r in range(args.rounds):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            for name in order:
                rates[name].append(time_side(sides[name][0], rng, args.steps))
            print(f"round {r}: " + ", ".join(f"{n} {rates[n][-1]:,.0f}" for n in rates), flush=True)
    finally:
        for _, close in sides.values():
            close()
    load_after = os.getloadavg()
    medians = {n: statistics.median(v) for n, v in rates.items()}
    ours, peer = medians.values()
    import pettingzoo
    import supersuit
    import torch

    lines = [
        "# PettingZoo through rlstash's process pool vs SuperSuit's vectorisation",
        "",
        f"`python3 bench/marl_pz.py --rounds {args.rounds} --steps {args.steps}` -- MPE "
        f"`simple_spread_v3` (mpe2; {N_AGENTS} agents, discrete actions, 25-step episodes), "
        f"{N_ENVS} envs on {N_WORKERS} worker processes, uniform random actions; one env step = "
        "every agent of one env acting once. Rounds interleaved (alternating order), medians.",
        "",
        f"**Machine: {os.cpu_count()} cores shared with other helpers' test runs (LOADED): load "
        f"average {load_before[0]:.1f} before, {load_after[0]:.1f} after.** Python "
        f"{platform.python_version()}, torch {torch.__version__}, pettingzoo "
        f"{pettingzoo.__version__}, SuperSuit {getattr(supersuit, '__version__', '3.11.0')}.",
        "",
        "| side | median env steps/s | agent steps/s | rounds (env steps/s) |",
        "| --- | ---: | ---: | --- |",
    ]
    for name, values in rates.items():
        shown = ", ".join(f"{v:,.0f}" for v in values)
        lines.append(
            f"| {name} | {medians[name]:,.0f} | {medians[name] * N_AGENTS:,.0f} | {shown} |"
        )
    lines += [
        "",
        f"Ratio rlstash / SuperSuit (medians): **{ours / peer:.2f}x** (goal >= 2x).",
        "",
        "rlstash returns per-agent tensors ([32, 3, ...]) with masks, the global state and "
        "unpacked action masks each step; SuperSuit returns per-agent rows of a single-agent "
        "vector env ([96, ...]) and no state.",
        "",
    ]
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
