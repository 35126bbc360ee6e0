#!/usr/bin/env python3
"""Learning benchmark, part ``atari``: DQN on Atari games, rlstash against Stable-Baselines3
with the same settings, in the same run, interleaved (issue 14).

    python3 bench/learn_atari.py                                  # Breakout and Pong, seed 0
    python3 bench/learn_atari.py --games Pong --seeds 0,1,2 --budget 200000

Writes bench/results/learn_atari.md (raw runs: bench/.work/learn_atari.json). Runs in
``.venv-bench`` (re-executes itself there, as bench/learn.py; ``--here`` runs in this
interpreter, e.g. another helper's bench venv with PYTHONPATH set to this tree).

Both sides play ``ALE/<Game>-v5`` made with ``frameskip=1`` (so v5's sticky actions, 0.25, stay)
under the same preprocessing: no-op reset (30), 4 frames per step with a max over the last two,
84x84 grayscale, stacks of 4, terminal on life loss and reward clipping for training, FIRE on
reset. rlstash: ``rlstash train --env ALE/<Game>-v5`` (:mod:`rlstash.envs.atari`, stacks rebuilt
by the stream storage from single frames); SB3: ``make_atari_env`` (its ``AtariWrapper``) +
``VecFrameStack(4)``. The learner settings are the same on both sides (``SETTINGS``, CleanRL's
dqn_atari / the RL Zoo's, with the exploration and warm-up scaled to the budget); rlstash's DQN
is double DQN, SB3's is not (no setting changes either).

Evaluation: the same for both: every ``eval_every`` agent steps, ``--eval-episodes`` full games
(all lives, unclipped score, FIRE after a life loss) on rlstash's evaluation env
(``make_atari(train=False)``), deterministic (greedy) actions, time excluded from the training
clock. Reported: training agent steps/s and env frames/s (4 frames per agent step), and the
evaluation score at each evaluation step (equal steps on both sides).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
WORK = HERE / ".work"
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

LIBS = ("rlstash", "sb3")
FRAME_SKIP = 4


def settings(budget: int) -> dict:
    """The learner settings of both sides for a budget of ``budget`` agent steps."""
    return {
        "learning_rate": 1e-4,
        "batch_size": 32,
        "buffer_size": min(100_000, budget),  # the RL Zoo's 100k; never more than the run
        "learning_starts": max(1000, budget // 10),  # CleanRL 80k of 10M; scaled to the budget
        "train_freq": 4,
        "gradient_steps": 1,
        "gamma": 0.99,
        "target_update_env_steps": 1000,  # CleanRL / RL Zoo: 1,000 env steps
        "exploration_fraction": 0.1,  # of the budget
        "exploration_final_eps": 0.01,
        "max_grad_norm": 10.0,  # SB3's (CleanRL: none)
    }


# ----------------------------------------------------------------------------- evaluation


def evaluate(act, env_id: str, episodes: int, seed: int) -> list[float]:
    """Full-game unclipped scores of ``act(obs [n, 4, 84, 84] uint8) -> actions [n]``."""
    import numpy as np

    from rlstash.envs.atari import make_atari

    n = min(episodes, 5)
    envs = [make_atari(env_id, train=False) for _ in range(n)]
    target = [(episodes + i) // n for i in range(n)]
    scores: list[float] = []
    try:
        obs = np.stack([e.reset(seed=seed + i)[0] for i, e in enumerate(envs)])
        ret, done_count = np.zeros(n), [0] * n
        while any(done_count[i] < target[i] for i in range(n)):
            actions = act(obs)
            for i, e in enumerate(envs):
                if done_count[i] >= target[i]:
                    continue
                o, r, term, trunc, _ = e.step(int(actions[i]))
                ret[i] += r
                if term or trunc:
                    scores.append(float(ret[i]))
                    ret[i], done_count[i] = 0.0, done_count[i] + 1
                    o, _ = e.reset()
                obs[i] = o
    finally:
        for e in envs:
            e.close()
    return scores


# ----------------------------------------------------------------------------- workers


def run_rlstash(
    env_id: str, seed: int, budget: int, eval_every: int, episodes: int, backend: str = "gymnasium"
) -> dict:
    import tempfile

    import torch
    from learn_atari_ppo import tree_cpu

    from rlstash.train import builders
    from rlstash.train.config import TrainConfig

    s = settings(budget)
    agent = {
        "learning_rate": s["learning_rate"], "gamma": s["gamma"],
        "target_update_interval": s["target_update_env_steps"] // s["train_freq"],
        "exploration_fraction": s["exploration_fraction"],
        "exploration_final_eps": s["exploration_final_eps"],
        "max_grad_norm": s["max_grad_norm"], "total_steps": budget,
        "compile": False,  # identical settings: eager, as SB3 (compile='auto' may compile mid-run)
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="rlstash-atari-") as tmp:
        cfg = TrainConfig(
            env=env_id, steps=budget, seed=seed, run_dir=tmp, name="run", quiet=True,
            device="cpu", checkpoint_every=10 * budget, eval_every=10 * budget, eval_episodes=1,
            batch_size=s["batch_size"], buffer_size=s["buffer_size"],
            learning_starts=s["learning_starts"], train_freq=s["train_freq"],
            gradient_steps=s["gradient_steps"], n_steps=1, agent=agent, env_backend=backend,
        )  # fmt: skip
        run = builders.build_run(cfg, Path(tmp) / "run")
        curve, train_s, eval_cpu, step = [], 0.0, 0.0, 0
        rb, limiter, collector = run.rb, run.limiter, run.collector
        cpu0 = tree_cpu()  # env workers' CPU included; read at the ends only (a scan is costly)
        try:
            while step < budget:  # rlstash.train.loop's loop, evaluation swapped for ours
                t0 = time.perf_counter()
                rb.extend(collector.collect())
                limiter.on_insert(run.frames_per_collect)
                step += run.frames_per_collect
                while limiter.can_sample():
                    run.agent.update(rb.sample(s["batch_size"]))
                    limiter.on_sample()
                train_s += time.perf_counter() - t0
                if step % eval_every == 0:
                    c0 = time.process_time()  # evaluation runs in this process

                    def act(obs):
                        return run.agent.act(torch.as_tensor(obs), deterministic=True).numpy()

                    scores = evaluate(act, env_id, episodes, seed + 10_000 + step)
                    curve.append([step, train_s, statistics.mean(scores)])
                    eval_cpu += time.process_time() - c0
            cpu_s = tree_cpu() - cpu0 - eval_cpu
        finally:
            run.close()
    return {"curve": curve, "steps": step, "train_seconds": train_s, "cpu_seconds": cpu_s,
            "settings": s, "backend": backend}  # fmt: skip


def run_sb3(env_id: str, seed: int, budget: int, eval_every: int, episodes: int) -> dict:
    import ale_py
    import gymnasium as gym
    import numpy as np
    from learn_atari_ppo import tree_cpu
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    gym.register_envs(ale_py)
    s = settings(budget)
    env = VecFrameStack(
        make_atari_env(env_id, n_envs=1, seed=seed, env_kwargs={"frameskip": 1}), n_stack=4
    )

    class EvalClock(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.curve: list[list[float]] = []
            self.excluded = self.start = self.cpu_excluded = self.cpu_start = 0.0

        def _on_training_start(self) -> None:
            self.start, self.cpu_start = time.perf_counter(), tree_cpu()

        def _on_step(self) -> bool:
            if self.num_timesteps % eval_every == 0:
                t0, c0 = time.perf_counter(), tree_cpu()
                train_s = t0 - self.start - self.excluded
                model = self.model

                def act(obs):  # rlstash's [n, 4, 84, 84] stacks = SB3's transposed ones
                    return model.predict(obs, deterministic=True)[0]

                scores = evaluate(act, env_id, episodes, seed + 10_000 + self.num_timesteps)
                self.curve.append([self.num_timesteps, train_s, float(np.mean(scores))])
                self.excluded += time.perf_counter() - t0
                self.cpu_excluded += tree_cpu() - c0
            return True

    model = DQN(
        "CnnPolicy", env, seed=seed, device="cpu", verbose=0,
        learning_rate=s["learning_rate"], batch_size=s["batch_size"],
        buffer_size=s["buffer_size"], learning_starts=s["learning_starts"],
        train_freq=s["train_freq"], gradient_steps=s["gradient_steps"], gamma=s["gamma"],
        target_update_interval=s["target_update_env_steps"],
        exploration_fraction=s["exploration_fraction"],
        exploration_final_eps=s["exploration_final_eps"], max_grad_norm=s["max_grad_norm"],
        optimize_memory_usage=False,
    )  # fmt: skip
    clock = EvalClock()
    model.learn(total_timesteps=budget, callback=clock)
    train_s = time.perf_counter() - clock.start - clock.excluded
    cpu_s = tree_cpu() - clock.cpu_start - clock.cpu_excluded
    env.close()
    return {"curve": clock.curve, "steps": budget, "train_seconds": train_s, "cpu_seconds": cpu_s,
            "settings": s}  # fmt: skip


def update_costs(reps: int = 5, n: int = 20) -> dict:
    """CPU ms per DQN update (batch 32 of [4, 84, 84] uint8 stacks, Nature CNN, 6 actions),
    rlstash vs SB3 in this process, interleaved, medians over ``reps`` rounds of ``n``.
    rlstash's update does 3 CNN forwards (online on s and s', target on s'; double DQN) and a
    backward; SB3's 2 forwards and a backward."""
    import gymnasium as gym
    import numpy as np
    import torch
    from stable_baselines3 import DQN as SB3DQN
    from stable_baselines3.common.vec_env import DummyVecEnv

    from rlstash.agents.dqn import DQN, DQNConfig

    rng = np.random.default_rng(0)
    obs = rng.integers(0, 256, (64, 4, 84, 84), dtype=np.uint8)
    act = rng.integers(0, 6, 64)
    batch = {
        "obs": torch.as_tensor(obs[:32]), "next_obs": torch.as_tensor(obs[32:]),
        "action": torch.as_tensor(act[:32]), "reward": torch.zeros(32),
        "terminated": torch.zeros(32, dtype=torch.bool),
    }  # fmt: skip
    agent = DQN((4, 84, 84), 6, DQNConfig(learning_rate=1e-4, compile=False), device="cpu")

    class Env(gym.Env):  # the spaces SB3's model is built from (its steps are never taken)
        observation_space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
        action_space = gym.spaces.Discrete(6)

        def reset(self, *, seed=None, options=None):
            return obs[0], {}

        def step(self, a):
            return obs[0], 0.0, False, False, {}

    model = SB3DQN("CnnPolicy", DummyVecEnv([Env]), buffer_size=64, learning_starts=0,
                   batch_size=32, device="cpu", verbose=0)  # fmt: skip
    for i in range(64):
        model.replay_buffer.add(obs[i], obs[(i + 1) % 64], np.array([act[i]]), np.zeros(1),
                                np.zeros(1), [{}])  # fmt: skip
    model._setup_learn(1000)
    runs = {
        "rlstash": lambda: agent.update(batch),
        "sb3": lambda: model.train(gradient_steps=1, batch_size=32),
    }
    times: dict[str, list[float]] = {k: [] for k in runs}
    for f in runs.values():
        f()
    for _ in range(reps):
        for name, f in runs.items():
            c0 = time.process_time()
            for _ in range(n):
                f()
            times[name].append((time.process_time() - c0) / n * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def worker(task: dict) -> dict:
    import torch

    torch.set_num_threads(1)
    if task.get("lib") == "updates":
        return update_costs()
    if task.get("part") == "ppo":
        from learn_atari_ppo import ppo_worker

        return ppo_worker(task)
    args = (task["env"], task["seed"], task["budget"], task["eval_every"], task["episodes"])
    if task["lib"] == "rlstash-envpool":
        return run_rlstash(*args, backend="envpool")
    return (run_rlstash if task["lib"] == "rlstash" else run_sb3)(*args)


def spawn(task: dict, timeout: float) -> dict:
    """``task`` in a fresh process (one torch thread, no CUDA): its JSON result or error."""
    from common import spawn_worker

    return spawn_worker(__file__, task, timeout)


# ----------------------------------------------------------------------------- report


def _rate(run: dict, clock: str = "cpu_seconds") -> float | None:
    if "error" in run or not run.get(clock):
        return None
    return run["steps"] / run[clock]


def game_section(game: str, part: dict) -> list[str]:
    lines = [f"## {game}", ""]
    seeds = sorted({s for lib in LIBS for s in part.get(lib, {})}, key=int)
    rows = []
    for seed in seeds:
        runs = {lib: part.get(lib, {}).get(seed, {}) for lib in LIBS}
        for clock in ("cpu_seconds", "train_seconds"):
            rates = {lib: _rate(r, clock) for lib, r in runs.items()}
            cells = []
            for lib in LIBS:
                r, err = rates[lib], runs[lib].get("error")
                cells += [f"{r:,.0f}" if r else f"error: {err}", f"{4 * r:,.0f}" if r else "-"]
            ok = rates["rlstash"] and rates["sb3"]
            ratio = f"{rates['rlstash'] / rates['sb3']:.2f}x" if ok else "-"
            name = "CPU" if clock == "cpu_seconds" else "wall"
            rows.append(f"| {seed} | {name} | " + " | ".join(cells) + f" | {ratio} |")
    lines += [
        "Training speed: agent steps and env frames (4 per step) per second of the training "
        "clock, evaluation excluded; per CPU second of the run's process (what it costs, "
        "robust to the other jobs on the machine) and per wall second (what it takes, noisy "
        "here):",
        "",
        "| seed | clock | rlstash steps/s | rlstash frames/s | SB3 steps/s | SB3 frames/s | "
        "rlstash / SB3 |",
        "|---|---|---:|---:|---:|---:|---:|",
        *rows,
        "",
        "Evaluation score (mean unclipped full-game score) at equal agent steps:",
        "",
        "| seed | step | rlstash | SB3 |",
        "|---|---:|---:|---:|",
    ]
    for seed in seeds:
        curves = {lib: {c[0]: c[2] for c in part.get(lib, {}).get(seed, {}).get("curve", [])}
                  for lib in LIBS}  # fmt: skip
        for step in sorted(set(curves["rlstash"]) | set(curves["sb3"])):
            cells = [f"{curves[lib][step]:.1f}" if step in curves[lib] else "-" for lib in LIBS]
            lines.append(f"| {seed} | {step:,} | {cells[0]} | {cells[1]} |")
    return lines + [""]


def update_section(costs: dict | None) -> list[str]:
    if not costs or "error" in costs:
        return [f"Update cost: not measured ({(costs or {}).get('error', 'run --updates')})", ""]
    r, b = costs["rlstash"], costs["sb3"]
    return [
        "## Where the time goes: one DQN update",
        "",
        "CPU ms per update (batch 32, [4, 84, 84] uint8, Nature CNN, one thread), both in one "
        "process, interleaved, median of 5 rounds of 20 (`--updates`):",
        "",
        "| rlstash | SB3 | SB3 / rlstash |",
        "|---:|---:|---:|",
        f"| {r:.1f} | {b:.1f} | {b / r:.2f}x |",
        "",
        "rlstash's update runs three CNN forwards (double DQN: online on s', target on s', "
        "online on s) and one backward, SB3's two forwards and one backward: it does ~25% "
        "more arithmetic per update and still takes less time (the convolutions run "
        "channels-last). With train_freq 4 the update is ~75% of a training step's CPU time on "
        "both sides and the env step (ALE, 4 frames, resize) most of the rest: both sides are "
        "bound by the same convolutions and emulator, so the issue's >= 1.5x frames/s goal is "
        "out of reach on one CPU thread without changing the algorithm (a GPU learner, or "
        "more envs per update, moves the bound; not measured: no GPU here).",
        "",
    ]


def write_report(results: dict) -> Path:
    m, cfg = results.get("machine", {}), results.get("config", {})
    lines = [
        "# Learning benchmark, part atari: DQN on Atari, rlstash vs Stable-Baselines3",
        "",
        f"Measured {m.get('date', '?')} on {m.get('cpus', '?')} CPU cores "
        f"({m.get('platform', '?')}), torch {m.get('torch', '?')}, SB3 {m.get('sb3', '?')}, "
        f"ale-py {m.get('ale_py', '?')}; one torch thread per run, runs interleaved "
        "(rlstash, SB3 per game and seed"
        + (", the two side by side" if cfg.get("parallel", 1) == 2 else "")
        + "), the machine shared with other jobs.",
        "",
        f"**Budget: {cfg.get('budget', 0):,} agent steps ({4 * cfg.get('budget', 0):,} frames) "
        f"per run, seeds {cfg.get('seeds')}, evaluation every {cfg.get('eval_every', 0):,} "
        f"steps on {cfg.get('episodes')} full games.** The issue asks for 200,000 agent steps "
        "x 3 seeds; on this shared 2-core machine that is many hours, so this is a much "
        "smaller budget. At this budget neither side has learned much (DQN's Atari learning "
        "curves start after ~10^6 frames): the scores compare early behaviour (a mean of "
        f"{cfg.get('episodes')} games of one seed is noise-level: random Breakout play scores "
        "0-4), the speed columns are the meaningful ones.",
        "",
        "Same settings on both sides (agent steps; `target_update_env_steps` is SB3's "
        "`target_update_interval`, rlstash's is in updates = that / train_freq): "
        f"`{json.dumps(settings(cfg.get('budget', 0)))}`. Differences that no setting "
        "changes: rlstash's DQN is double DQN; SB3 pads a new life's first stacks with zeros, "
        "rlstash with the first frame (gymnasium's FrameStackObservation padding); SB3 stores "
        "obs and next_obs stacks (8 frames per transition), rlstash one frame per slot.",
        "",
        "Reproduce: `python3 bench/learn_atari.py --games "
        f"{','.join(cfg.get('games', []))} --seeds {cfg.get('seeds')} --budget "
        f"{cfg.get('budget')} --eval-every {cfg.get('eval_every')} --eval-episodes "
        f"{cfg.get('episodes')}"
        + (f" --parallel {cfg['parallel']}" if cfg.get("parallel", 1) > 1 else "")
        + "`",
        "",
    ]
    for note in results.get("notes", []):  # remarks on particular runs, kept with the results
        lines += [note, ""]
    for game in cfg.get("games", []):
        if game in results.get("games", {}):
            lines += game_section(game, results["games"][game])
    lines += update_section(results.get("updates"))
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "learn_atari.md"
    out.write_text("\n".join(lines))
    return out


def _version(name: str) -> str:
    import importlib.metadata as md

    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "?"


def machine() -> dict:
    version = _version
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpus": os.cpu_count(),
        "platform": platform.platform(terse=True),
        "torch": version("torch"),
        "sb3": version("stable_baselines3"),
        "ale_py": version("ale_py"),
    }


def save(results: dict) -> None:
    WORK.mkdir(parents=True, exist_ok=True)
    tmp = WORK / "learn_atari.json.tmp"
    tmp.write_text(json.dumps(results, indent=1))
    tmp.replace(WORK / "learn_atari.json")


def run(
    games: list[str],
    seeds: list[int],
    budget: int,
    eval_every: int,
    episodes: int,
    parallel: int = 1,
) -> Path:
    """The whole part (also what bench/learn.py's ``atari`` part calls). Runs of other seeds
    saved with the same budget and evaluation schedule are kept (seeds added run by run).
    ``parallel`` runs at a time (each its own process, one torch thread)."""
    path = WORK / "learn_atari.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    same = {k: old.get("config", {}).get(k) for k in ("budget", "eval_every", "episodes")} == {
        "budget": budget, "eval_every": eval_every, "episodes": episodes,
    }  # fmt: skip
    kept = old.get("games", {}) if same else {}
    old_seeds = old["config"]["seeds"].split(",") if same else []
    all_seeds = sorted({*map(int, old_seeds), *seeds})
    all_games = list(dict.fromkeys([*(old["config"]["games"] if same else []), *games]))
    results = {
        "machine": machine(),
        "config": {
            "games": all_games,
            "seeds": ",".join(map(str, all_seeds)),
            "budget": budget,
            "eval_every": eval_every,
            "episodes": episodes,
        },  # fmt: skip
        "games": kept,
        "notes": old.get("notes", []) if same else [],
        "updates": spawn({"lib": "updates"}, timeout=3600),
    }
    results["config"]["parallel"] = parallel
    lock = threading.Lock()

    def one(game: str, seed: int, lib: str) -> None:
        task = {"lib": lib, "env": f"ALE/{game}-v5", "seed": seed, "budget": budget,
                "eval_every": eval_every, "episodes": episodes}  # fmt: skip
        start = time.time()
        out = spawn(task, timeout=4 * 3600)
        with lock:
            results["games"].setdefault(game, {}).setdefault(lib, {})[str(seed)] = out
            print(f"{game} {lib} seed {seed}: {out.get('error', '')} rate "
                  f"{_rate(out)} curve {out.get('curve')} ({time.time() - start:.0f} s)",
                  flush=True)  # fmt: skip
            save(results)
            write_report(results)

    order = [(g, s, lib) for s in seeds for g in games for lib in LIBS]  # rlstash, SB3 in turn
    with ThreadPoolExecutor(parallel) as pool:  # parallel 2: each rlstash run beside its SB3 run
        for f in [pool.submit(one, *t) for t in order]:
            f.result()
    return write_report(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--games", default="Breakout,Pong")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--budget", type=int, default=200_000, help="agent steps per run")
    parser.add_argument("--eval-every", type=int, default=None, help="default: budget / 4")
    parser.add_argument("--eval-episodes", type=int, default=5)
    parser.add_argument("--here", action="store_true", help="run in this interpreter")
    parser.add_argument(
        "--parallel", type=int, default=1, help="runs at a time (2: rlstash beside SB3)"
    )
    parser.add_argument("--part", choices=("dqn-envpool", "ppo"), default=None,
                        help="issue 27: DQN over EnvPool, or PPO vs SB3 and CleanRL")  # fmt: skip
    parser.add_argument("--updates", action="store_true", help="only the update-cost table")
    parser.add_argument("--report", action="store_true", help="only rewrite the report")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    if not args.here:
        from bench_venv import ensure_bench_venv

        ensure_bench_venv(__file__)
    if args.updates or args.report:  # into the saved results of the last run
        path = WORK / "learn_atari.json"
        results = json.loads(path.read_text()) if path.exists() else {}
        if args.updates:
            results["updates"] = spawn({"lib": "updates"}, timeout=3600)
            save(results)
        print(f"wrote {write_report(results)}")
        return
    games = [g for g in args.games.split(",") if g]
    seeds = [int(s) for s in args.seeds.split(",") if s]
    if args.part:  # a dated section appended to bench/results/learn_atari.md
        from learn_atari_ppo import run_part

        info = {**machine(), "envpool": _version("envpool")}
        out = run_part(args.part, games, seeds, args.budget, args.eval_episodes, spawn, info,
                       settings(args.budget))  # fmt: skip
        print(f"wrote {out}")
        return
    eval_every = args.eval_every or max(1, args.budget // 4)
    if eval_every % 4 or args.budget % eval_every:
        raise SystemExit("--eval-every: must divide --budget and be a multiple of 4 (train_freq)")
    out = run(games, seeds, args.budget, eval_every, args.eval_episodes, args.parallel)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
