#!/usr/bin/env python3
"""Where an Atari DQN training step spends its CPU time, rlstash against Stable-Baselines3
(issue 14), with rlstash's compiled update (``compile=True``) beside its eager one.

    python3 bench/atari_profile.py [--game Pong] [--steps 2000] [--warmup 1000] [--rounds 2]

Each run is a fresh process (one torch thread, CUDA hidden) that trains DQN on
``ALE/<game>-v5`` with bench/learn_atari.py's settings: ``--warmup`` agent steps of random
play fill the replay (not timed), then ``--steps`` agent steps are timed (an update every 4
steps). The CPU seconds of that window are split into: env (ALE stepping and preprocessing,
in-process), acting (the Q-network's forward for the next action), storage (replay extend),
sample (replay sample) and update (the learner's step: forwards, backward, optimizer, target
sync). Frames/s = 4 x timed agent steps / CPU seconds. Runs are interleaved (rlstash, SB3,
rlstash compiled) round after round; medians. Writes bench/results/atari_profile.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

PARTS = ("env", "act", "storage", "sample", "update")
VARIANTS = ("rlstash", "sb3", "rlstash-compile")


class Clock:
    """CPU seconds per part; ``wrap(part, fn)`` times every call of ``fn`` under ``part``."""

    def __init__(self) -> None:
        self.parts = dict.fromkeys(PARTS, 0.0)
        self.on = False

    def wrap(self, part: str, fn):  # noqa: ANN001, ANN201
        def timed(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            if not self.on:
                return fn(*args, **kwargs)
            c0 = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.parts[part] += time.process_time() - c0

        return timed


def profile_rlstash(game: str, seed: int, steps: int, warmup: int, compile: bool) -> dict:
    import tempfile

    from learn_atari import settings

    from rlstash.train import builders
    from rlstash.train.config import TrainConfig

    s = settings(warmup + steps)
    agent = {"learning_rate": s["learning_rate"], "gamma": s["gamma"], "compile": compile,
             "target_update_interval": s["target_update_env_steps"] // s["train_freq"],
             "max_grad_norm": s["max_grad_norm"], "total_steps": warmup + steps}  # fmt: skip
    clock = Clock()
    with tempfile.TemporaryDirectory(prefix="rlstash-atari-profile-") as tmp:
        cfg = TrainConfig(
            env=f"ALE/{game}-v5", steps=warmup + steps, seed=seed, run_dir=tmp, name="run",
            quiet=True, device="cpu", batch_size=32, buffer_size=s["buffer_size"],
            learning_starts=warmup, train_freq=4, gradient_steps=1, n_steps=1, agent=agent,
        )  # fmt: skip
        run = builders.build_run(cfg, Path(tmp) / "run")
        rb, limiter, collector = run.rb, run.limiter, run.collector
        collector.policy = clock.wrap("act", collector.policy)
        extend, sample = clock.wrap("storage", rb.extend), clock.wrap("sample", rb.sample)
        update = clock.wrap("update", run.agent.update)
        step, total, compile_s = 0, 0.0, 0.0
        try:
            while step < warmup + steps:
                clock.on = step >= warmup
                c0 = time.process_time()
                extend(collector.collect())
                limiter.on_insert(run.frames_per_collect)
                step += run.frames_per_collect
                while limiter.can_sample():
                    w0 = time.perf_counter()
                    update(sample(32))
                    limiter.on_sample()
                    if compile and not compile_s:  # the first update compiles: not timed
                        compile_s = time.perf_counter() - w0
                        clock.parts["update"] = clock.parts["sample"] = 0.0
                        c0 = time.process_time()
                if clock.on:
                    total += time.process_time() - c0
        finally:
            run.close()
    return _result(clock, total, steps, compile_s)


def profile_sb3(game: str, seed: int, steps: int, warmup: int) -> dict:
    import ale_py
    import gymnasium as gym
    from learn_atari import settings
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    gym.register_envs(ale_py)
    s = settings(warmup + steps)
    env = VecFrameStack(
        make_atari_env(f"ALE/{game}-v5", n_envs=1, seed=seed, env_kwargs={"frameskip": 1}),
        n_stack=4,
    )
    model = DQN(
        "CnnPolicy", env, seed=seed, device="cpu", verbose=0,
        learning_rate=s["learning_rate"], batch_size=32, buffer_size=s["buffer_size"],
        learning_starts=warmup, train_freq=4, gradient_steps=1, gamma=s["gamma"],
        target_update_interval=s["target_update_env_steps"], max_grad_norm=s["max_grad_norm"],
        optimize_memory_usage=False,
    )  # fmt: skip
    clock = Clock()
    model.policy.predict = clock.wrap("act", model.policy.predict)
    model.replay_buffer.add = clock.wrap("storage", model.replay_buffer.add)
    model.replay_buffer.sample = clock.wrap("sample", model.replay_buffer.sample)
    model.train = clock.wrap("update", model.train)  # includes its samples: subtracted below
    span = {"start": 0.0}

    class Start(BaseCallback):
        def _on_step(self) -> bool:
            if self.num_timesteps == warmup and not clock.on:
                clock.on, span["start"] = True, time.process_time()
            return True

    model.learn(total_timesteps=warmup + steps, callback=Start())
    total = time.process_time() - span["start"]
    env.close()
    clock.parts["update"] -= clock.parts["sample"]
    return _result(clock, total, steps, 0.0)


def _result(clock: Clock, total: float, steps: int, compile_s: float) -> dict:
    parts = dict(clock.parts)
    parts["env"] = max(0.0, total - sum(v for k, v in parts.items() if k != "env"))
    return {"cpu_s": total, "steps": steps, "parts": parts, "compile_s": compile_s}


def worker(task: dict) -> dict:
    import torch

    torch.set_num_threads(1)
    if task["variant"] == "sb3":
        return profile_sb3(task["game"], task["seed"], task["steps"], task["warmup"])
    compile = task["variant"] == "rlstash-compile"
    return profile_rlstash(task["game"], task["seed"], task["steps"], task["warmup"], compile)


def render(runs: dict[str, list[dict]], args: argparse.Namespace, info: dict) -> str:
    from common import header_lines

    lines = ["# Atari DQN: where a training step's CPU time goes (issue 14)", "",
             "## Machine", "", *header_lines(info), "", "## Method", "",
             " ".join((__doc__ or "").split("\n\n")[2].split()), "",
             f"Command: `python3 bench/atari_profile.py --game {args.game} --steps {args.steps} "
             f"--warmup {args.warmup} --rounds {args.rounds}`", ""]  # fmt: skip
    ok = {v: [r for r in rs if "error" not in r] for v, rs in runs.items()}
    errors = [f"- {v}: {r['error']}" for v, rs in runs.items() for r in rs if "error" in r]

    def med(v: str, f) -> float:  # noqa: ANN001
        return statistics.median(f(r) for r in ok[v]) if ok[v] else float("nan")

    fps = {v: med(v, lambda r: 4 * r["steps"] / r["cpu_s"]) for v in runs}
    lines += ["| variant | frames/s (CPU) | ÷ SB3 | ms per agent step | "
              + " | ".join(f"{p} ms" for p in PARTS) + " | compile s |",
              "|---|---:|---:|---:|" + "---:|" * len(PARTS) + "---:|"]  # fmt: skip
    for v in runs:
        per = [med(v, lambda r, p=p: 1e3 * r["parts"][p] / r["steps"]) for p in PARTS]
        step_ms = med(v, lambda r: 1e3 * r["cpu_s"] / r["steps"])
        share = [f"{x:.2f} ({x / step_ms:.0%})" for x in per]
        lines.append(f"| {v} | {fps[v]:,.0f} | {fps[v] / fps['sb3']:.2f}x | {step_ms:.2f} | "
                     + " | ".join(share) + f" | {med(v, lambda r: r['compile_s']):.0f} |")  # fmt: skip
    lines += ["", f"Runs per variant: {', '.join(f'{v} {len(ok[v])}' for v in runs)}; load "
              f"before/after each: {json.dumps({v: [r.get('load_before_after') for r in rs] for v, rs in runs.items()})}"]  # fmt: skip
    return "\n".join(lines + ([""] + errors if errors else []) + [""])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--game", default="Pong")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--out", default=str(HERE / "results" / "atari_profile.md"))
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    from bench_venv import ensure_bench_venv

    ensure_bench_venv(__file__)
    from common import machine_info, spawn_worker

    info = machine_info()
    runs: dict[str, list[dict]] = {v: [] for v in args.variants.split(",")}
    for r in range(args.rounds):
        for v in runs:
            task = {"variant": v, "game": args.game, "seed": args.seed + r,
                    "steps": args.steps, "warmup": args.warmup}  # fmt: skip
            runs[v].append(spawn_worker(__file__, task, timeout=3600))
            print(f"[atari_profile] round {r} {v}: {json.dumps(runs[v][-1])}", flush=True)
    Path(args.out).write_text(render(runs, args, info))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
