#!/usr/bin/env python3
"""Where a vector step of ProcessPoolVectorEnv spends its wall time: a per-step timeline.

    python3 bench/collect_timeline.py [--env HalfCheetah-v5] [--n 32] [--workers 2]
                                      [--caller-envs K] [--steps 400] [--out FILE]

Each env is wrapped to record when its ``step`` starts and ends (``time.perf_counter``, one
clock for all processes on Linux) into a memory-mapped file; the caller records when
``step_async`` starts and when ``step_wait`` returns. Per step, relative to ``step_async``:

* ``wake w``: when worker w starts its first env step (the STEP message reached it:
  pipe write, wake-up, read, actions read from shared memory);
* ``done w``: when worker w ends its last env step; ``envs w``: the sum of its env steps;
* ``return``: when ``step_wait`` returns (replies read, infos, observation copies);
* ``between``: the caller's own time until the next ``step_async`` (random actions here).

With ``--caller-envs K`` the last K envs step in the calling process (``caller_envs``); their
block is the last "worker" (index ``--workers``) of the table.

Medians over the steps after a warm-up. On an idle machine, ``wake`` and ``return - max(done)``
are the costs of waking processes; ``max(done) - min(done)`` the imbalance between workers. On
a loaded machine they mostly show other users' work (the load average is printed).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

HERE = Path(__file__).resolve().parent


class TimedEnv(gym.Wrapper):
    """Writes (start, end) of every ``step`` of env ``index`` into row ``k`` of a memmap."""

    def __init__(self, env: gym.Env, index: int, path: str, shape: tuple[int, int, int]):
        super().__init__(env)
        self.index, self.k = index, 0
        self.marks = np.memmap(path, dtype=np.float64, mode="r+", shape=shape)

    def step(self, action):
        t0 = time.perf_counter()
        out = self.env.step(action)
        if self.k < len(self.marks):
            self.marks[self.k, self.index] = (t0, time.perf_counter())
        self.k += 1
        return out


def make(env_id: str, index: int, path: str, shape: tuple[int, int, int]) -> gym.Env:
    return TimedEnv(gym.make(env_id), index, path, shape)


def raw_step_us(env_id: str, n: int, steps: int) -> float:
    """Median microseconds per vector step of the one-process loop (actions sampled as for
    the pool, observations and rewards written into arrays, ended envs reset)."""
    envs = [gym.make(env_id) for _ in range(n)]
    space = gym.vector.utils.batch_space(envs[0].action_space, n)
    space.seed(0)
    obs = np.zeros((n, *envs[0].observation_space.shape))
    rewards = np.zeros(n)
    for i, env in enumerate(envs):
        env.reset(seed=i)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        actions = space.sample()
        for j, env in enumerate(envs):
            o, rewards[j], term, trunc, _ = env.step(actions[j])
            obs[j] = o
            if term or trunc:
                env.reset()
        times.append(time.perf_counter() - t0)
    for env in envs:
        env.close()
    return float(np.median(times[min(50, steps // 4) :])) * 1e6


def timeline(env_id: str, n: int, workers: int, steps: int, share: int = 0) -> dict[str, float]:
    """Median microseconds per step of each phase (see the module docstring)."""
    from rlstash.envs import ProcessPoolVectorEnv

    warm = min(50, steps // 4)
    with tempfile.TemporaryDirectory() as tmp:
        path, shape = os.path.join(tmp, "marks"), (steps, n, 2)
        np.memmap(path, dtype=np.float64, mode="w+", shape=shape).flush()
        fns = [functools.partial(make, env_id, i, path, shape) for i in range(n)]
        caller = np.zeros((steps, 2))  # step_async called, step_wait returned
        with ProcessPoolVectorEnv(fns, num_workers=workers, seed=0, caller_envs=share) as pool:
            pool.reset()
            blocks = [pool.envs_of(w) for w in range(workers + (1 if share else 0))]
            space = pool.action_space
            space.seed(0)
            for k in range(steps):
                actions = space.sample()
                t0 = time.perf_counter()
                pool.step_async(actions)
                pool.step_wait()
                caller[k] = (t0, time.perf_counter())
        marks = np.array(np.memmap(path, dtype=np.float64, mode="r", shape=shape))
    rows = []
    for k in range(warm, steps - 1):
        t0, t1 = caller[k, 0], caller[k, 1]
        row = {"return": t1 - t0, "between": caller[k + 1, 0] - t1}
        for w, envs in enumerate(blocks):
            m = marks[k, envs.start : envs.stop]
            row[f"wake {w}"] = m[0, 0] - t0
            row[f"done {w}"] = m[-1, 1] - t0
            row[f"envs {w}"] = float((m[:, 1] - m[:, 0]).sum())
        rows.append(row)
    return {key: float(np.median([r[key] for r in rows])) * 1e6 for key in rows[0]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--env", default="HalfCheetah-v5")
    p.add_argument("--n", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--caller-envs", type=int, default=0)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--out", help="also write the table here (markdown)")
    args = p.parse_args()
    if args.steps < 20:
        p.error(f"--steps: expected >= 20 steps, got {args.steps}")
    load = os.getloadavg()[0]
    raw = [raw_step_us(args.env, args.n, args.steps)]
    result = timeline(args.env, args.n, args.workers, args.steps, args.caller_envs)
    raw.append(raw_step_us(args.env, args.n, args.steps))
    step = result["return"] + result["between"]
    result["pool step (return + between)"] = step
    result["raw loop step (median of before/after)"] = raw_us = float(np.median(raw))
    lines = [
        f"# Step timeline: {args.env}, {args.n} envs, {args.workers} workers"
        + (f" + {args.caller_envs} envs in the caller" if args.caller_envs else ""),
        "",
        f"`python bench/collect_timeline.py --env {args.env} --n {args.n} --workers "
        f"{args.workers} --caller-envs {args.caller_envs} --steps {args.steps}`; load average {load:.2f} on "
        f"{os.cpu_count()} cores. Median microseconds after step_async.",
        "",
        "| phase | us |",
        "| --- | ---: |",
        *[f"| {key} | {value:.0f} |" for key, value in result.items()],
        "",
        f"Pool vs raw loop: {raw_us / step:.2f}x (per-step medians; the pool's envs are wrapped "
        "to record their step times, the raw loop's are not).",
        "",
    ]
    import common  # bench/common.py (the script's folder is on sys.path)

    return common.publish("\n".join(lines), args.out, "collect_timeline", [])


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    from bench_venv import ensure_bench_venv

    ensure_bench_venv(__file__)
    sys.exit(main())
