#!/usr/bin/env python3
"""Learning benchmark: rlstash against Stable-Baselines3 (RL Zoo hyperparameters), same machine.

    python3 bench/learn.py                           # everything; writes bench/results/learn.md
    python3 bench/learn.py --parts dqn --seeds 0     # one part, one seed (results merged)
    python3 bench/learn.py --parts contextual        # discrete SAC, 100,000 actions
    python3 bench/learn.py --parts ppo,ppo_contextual  # PPO CartPole; PPO with 100,000 actions

Runs in ``.venv-bench`` (re-executes itself there; creates it with bench/setup_env.py when
missing). Parts:

- ``dqn``: DQN on CartPole-v1, budget 50,000 env steps, threshold 475;
- ``sac``: SAC on Pendulum-v1, budget 20,000 env steps, threshold -200;
- ``contextual``: discrete SAC on bench/contextual.py's 100,000-action task, chunked vs one-hot;
- ``ppo``: PPO on CartPole-v1, budget 100,000 env steps (the RL Zoo's), threshold 475;
- ``ppo_contextual``: PPO on the same 100,000-action task, chunked vs one-hot (peak memory).

Method (dqn, sac): every run is a fresh subprocess with one torch thread and CUDA hidden;
runs are interleaved (rlstash seed 0, SB3 seed 0, rlstash seed 1, ...). Both sides evaluate
every 1,000 env steps with 10 deterministic episodes on separate eval envs, and both exclude
evaluation time from the training clock (SB3 through a callback that stops the clock while it
evaluates; rlstash's loop does so itself). Both run the whole budget (no early stop), so the
"stays" point means: every later evaluation up to the end of the budget is >= threshold.
rlstash runs its preset (``rlstash train`` defaults); SB3 runs the RL Zoo's settings.

Reported per run: env steps and training seconds at (a) the first evaluation >= threshold,
(b) the first evaluation from which every later one stays >= threshold, and (c) where
``rlstash train`` would stop (5 evaluations in a row >= threshold, its default patience).
Medians over seeds (a run that never gets there counts as +inf); ratios rlstash / SB3.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VENV_PY = ROOT / ".venv-bench" / "bin" / "python"
RESULTS = HERE / "results"
WORK = HERE / ".work"  # raw results of every run (learn.json), merged across invocations
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

TASKS = {
    "dqn": {"env": "CartPole-v1", "threshold": 475.0, "budget": 50_000},
    "sac": {"env": "Pendulum-v1", "threshold": -200.0, "budget": 20_000},
    "ppo": {"env": "CartPole-v1", "threshold": 475.0, "budget": 100_000, "goal_time": 0.5},
}
# rl-baselines3-zoo hyperparams/dqn.yml and sac.yml (SB3 defaults for everything else).
ZOO = {
    "dqn": {
        "learning_rate": 2.3e-3,
        "batch_size": 64,
        "buffer_size": 100_000,
        "learning_starts": 1000,
        "gamma": 0.99,
        "target_update_interval": 10,
        "train_freq": 256,
        "gradient_steps": 128,
        "exploration_fraction": 0.16,
        "exploration_final_eps": 0.04,
        "policy_kwargs": {"net_arch": [256, 256]},
    },
    "sac": {"learning_rate": 1e-3},
    # hyperparams/ppo.yml CartPole-v1 (lin_X: X * progress_remaining); SB3's MlpPolicy: separate
    # (64, 64) tanh policy and value nets, orthogonal init, Adam eps 1e-5 -- rlstash's preset
    # is the same, so "identical settings" and "each side's preset" are one comparison here.
    "ppo": {
        "n_envs": 8,
        "n_steps": 32,
        "batch_size": 256,
        "gae_lambda": 0.8,
        "gamma": 0.98,
        "n_epochs": 20,
        "ent_coef": 0.0,
        "learning_rate": "lin_0.001",
        "clip_range": "lin_0.2",
    },  # fmt: skip
}
EVAL_EVERY = 1000
EVAL_EPISODES = 10
PATIENCE = 5  # rlstash train's default: evaluations in a row at or above the threshold
LIBS = ("rlstash", "sb3")


# ----------------------------------------------------------------------------- workers


def run_rlstash(algo: str, seed: int, budget: int) -> dict:
    """One rlstash run of its preset; the curve comes from the run's eval.csv."""
    from rlstash.train.loop import TrainConfig, train

    task = TASKS[algo]
    with tempfile.TemporaryDirectory(prefix="rlstash-learn-") as tmp:
        cfg = TrainConfig(
            algo=algo, env=task["env"], steps=budget, seed=seed, run_dir=tmp, name="run",
            eval_every=EVAL_EVERY, eval_episodes=EVAL_EPISODES, threshold=task["threshold"],
            patience=10**9, quiet=True, device="cpu", checkpoint_every=10 * budget,
        )  # fmt: skip
        start = time.perf_counter()
        result = train(cfg)
        wall = time.perf_counter() - start
        with open(Path(tmp) / "run" / "eval.csv") as fh:
            curve = [
                [int(r["step"]), float(r["train_seconds"]), float(r["return_mean"])]
                for r in csv.DictReader(fh)
            ]
    from rlstash.train.algos import ALGOS

    preset = {
        k: list(v) if isinstance(v, tuple) else v
        for k, v in ALGOS[algo].presets[task["env"]].items()
    }
    return {"curve": curve, "steps": result.steps, "train_seconds": result.train_seconds,
            "wall_seconds": wall, "settings": preset}  # fmt: skip


def run_sb3(algo: str, seed: int, budget: int) -> dict:
    """One SB3 run with the RL Zoo settings; evaluation time is excluded from the clock."""
    import gymnasium as gym
    import numpy as np
    from stable_baselines3 import DQN, SAC
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import DummyVecEnv

    env_id = TASKS[algo]["env"]
    eval_env = DummyVecEnv([lambda: gym.make(env_id) for _ in range(EVAL_EPISODES)])

    class EvalClock(BaseCallback):
        """Every EVAL_EVERY steps: stop the clock, evaluate, restart it."""

        def __init__(self) -> None:
            super().__init__()
            self.curve: list[list[float]] = []
            self.excluded = 0.0
            self.start = 0.0

        def _on_training_start(self) -> None:
            self.start = time.perf_counter()

        def _on_step(self) -> bool:
            if self.num_timesteps % EVAL_EVERY == 0:
                t0 = time.perf_counter()
                train_s = t0 - self.start - self.excluded
                eval_env.seed(seed + 10_000 + len(self.curve))
                returns, _ = evaluate_policy(
                    self.model, eval_env, n_eval_episodes=EVAL_EPISODES, deterministic=True,
                    return_episode_rewards=True,
                )  # fmt: skip
                self.curve.append([self.num_timesteps, train_s, float(np.mean(returns))])
                self.excluded += time.perf_counter() - t0
            return True

    if algo == "ppo":
        model = _sb3_ppo(env_id, seed)
    else:
        cls = DQN if algo == "dqn" else SAC
        model = cls("MlpPolicy", gym.make(env_id), seed=seed, device="cpu", verbose=0, **ZOO[algo])
    clock = EvalClock()
    start = time.perf_counter()
    model.learn(total_timesteps=budget, callback=clock)
    wall = time.perf_counter() - start
    train_s = wall - clock.excluded
    return {"curve": clock.curve, "steps": budget, "train_seconds": train_s,
            "wall_seconds": wall, "settings": ZOO[algo]}  # fmt: skip


def _sb3_ppo(env_id: str, seed: int):  # noqa: ANN202
    """SB3's PPO with the RL Zoo's CartPole settings (its n_envs DummyVecEnv, lin_ schedules)."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    kw = dict(ZOO["ppo"])
    env = make_vec_env(env_id, n_envs=kw.pop("n_envs"), seed=seed)
    for key in ("learning_rate", "clip_range"):
        if isinstance(kw[key], str) and kw[key].startswith("lin_"):
            start = float(kw[key][4:])
            kw[key] = lambda progress, start=start: progress * start
    return PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **kw)


def worker(task: dict) -> dict:
    import torch

    torch.set_num_threads(1)
    if task["part"] in ("contextual", "ppo_contextual"):
        import contextual

        fn = contextual.run if task["part"] == "contextual" else contextual.run_ppo
        return fn(**task["args"])
    fn = run_rlstash if task["lib"] == "rlstash" else run_sb3
    return fn(task["algo"], task["seed"], task["budget"])


def spawn(task: dict, timeout: float) -> dict:
    """Run ``task`` in a fresh process (one torch thread, no CUDA); its JSON result or error."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(task)]
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


# ----------------------------------------------------------------------------- analysis


def points(curve: list[list[float]], threshold: float, patience: int = PATIENCE) -> dict:
    """(step, seconds) at the first eval >= threshold, from where all later stay >= it, and
    at the end of the first run of ``patience`` evals in a row >= it (None when never)."""
    ok = [r[2] >= threshold for r in curve]
    first = next((i for i, v in enumerate(ok) if v), None)
    stays = None
    for i in range(len(ok) - 1, -1, -1):
        if not ok[i]:
            break
        stays = i
    solved, run = None, 0
    for i, v in enumerate(ok):
        run = run + 1 if v else 0
        if run >= patience:
            solved = i
            break

    def at(i: int | None) -> list[float] | None:
        return None if i is None else [curve[i][0], curve[i][1]]

    return {"first": at(first), "stays": at(stays), "solved": at(solved)}


def median_or_inf(values: list[float | None]) -> float:
    """Median where a missing value (never reached) counts as +inf."""
    return statistics.median([math.inf if v is None else v for v in values]) if values else math.nan


# ----------------------------------------------------------------------------- report

NOTES_MARKER = "<!-- notes: kept when the tables above are regenerated -->"
POINTS = {"first": "first eval >= threshold", "stays": "stays >= threshold to the end",
          "solved": f"{PATIENCE} evals in a row (where `rlstash train` stops)"}  # fmt: skip
GOAL_TIME = 0.7  # rlstash may take at most this fraction of SB3's training seconds


def machine() -> dict:
    from common import machine_info

    info = machine_info()
    info.pop("torch_threads", None)  # the parent's; every worker runs one torch thread
    return info


def _cell(value: float | None, fmt: str) -> str:
    return "never" if value is None or math.isinf(value) else format(value, fmt)


def _ratio(a: float, b: float) -> str:
    if math.isinf(a) or math.isinf(b) or not b:
        return "—"
    return f"{a / b:.2f}x"


def learning_section(algo: str, part: dict) -> list[str]:
    from common import markdown_table

    task = TASKS[algo]
    lines = [f"## {algo.upper()} {task['env']}: threshold {task['threshold']:g}, "
             f"budget {part['budget']:,} env steps", ""]  # fmt: skip
    runs = {lib: part.get(lib, {}) for lib in LIBS}
    rows, goals = [], []
    for key, label in POINTS.items():
        med = {}
        for lib in LIBS:
            pts = [r["points"][key] for r in runs[lib].values() if "error" not in r]
            med[lib] = (median_or_inf([p and p[0] for p in pts]),
                        median_or_inf([p and p[1] for p in pts]))  # fmt: skip
        (rs, rt), (ss, st) = med["rlstash"], med["sb3"]
        rows.append([label, _cell(rs, ",.0f"), _cell(ss, ",.0f"), _ratio(rs, ss),
                     _cell(rt, ".1f"), _cell(st, ".1f"), _ratio(rt, st)])  # fmt: skip
        goal_time = task.get("goal_time", GOAL_TIME)
        if key != "solved":
            ok = not math.isinf(rs) and rs <= ss and rt <= goal_time * st
            goals.append(f"- {label}: steps {_cell(rs, ',.0f')} vs {_cell(ss, ',.0f')}, seconds "
                         f"{_cell(rt, '.1f')} vs {goal_time} x {_cell(st, '.1f')}: "
                         f"**{'met' if ok else 'missed'}**")  # fmt: skip
    lines.append("Medians over seeds (never = +inf):")
    lines += ["", markdown_table(["point", "rlstash steps", "SB3 steps", "ratio", "rlstash s",
                                  "SB3 s", "ratio"], rows), ""]  # fmt: skip
    lines += [f"Goal (rlstash <= SB3 env steps and <= {task.get('goal_time', GOAL_TIME)}x its "
              "training seconds):", "", *goals, ""]  # fmt: skip
    per_run = []
    for seed in sorted({s for lib in LIBS for s in runs[lib]}, key=int):
        for lib in LIBS:
            r = runs[lib].get(seed)
            if r is None:
                continue
            if "error" in r:
                per_run.append([seed, lib, r["error"], "", "", "", "", ""])
                continue
            p = r["points"]
            cells = [f"{_cell(p[k] and p[k][0], ',.0f')} / {_cell(p[k] and p[k][1], '.1f')}"
                     for k in POINTS]  # fmt: skip
            rets = " ".join(f"{c[2]:.0f}" for c in r["curve"])
            per_run.append([seed, lib, *cells, f"{r['train_seconds']:.1f}",
                            f"{r['steps'] / r['train_seconds']:.0f}", rets])  # fmt: skip
    lines += ["Per run (env steps / training seconds; the last columns: whole budget):", ""]
    lines.append(markdown_table(["seed", "library", "first", "stays", "solved", "train s",
                                 "steps/s", "eval returns"], per_run))  # fmt: skip
    for lib in LIBS:
        settings = next((r["settings"] for r in runs[lib].values() if "settings" in r), None)
        if settings:
            lines += ["", f"{lib} settings: `{json.dumps(settings)}`"]
    return lines + [""]


def contextual_section(part: dict, algo: str = "Discrete SAC") -> list[str]:
    import contextual
    from common import markdown_table

    lines = [f"## {algo}, 100,000 actions (bench/contextual.py)", ""]
    lines += [contextual.SUMMARY if algo == "Discrete SAC" else contextual.PPO_SUMMARY, ""]
    rows, curves = [], []
    for key, r in part.items():
        if "error" in r:
            rows.append([key, r["error"], "", "", "", "", ""])
            continue
        last = r["curve"][-1]
        rows.append([f"{r['n_actions']:,}", r["form"], f"{last[2]:.3f}", f"{last[3]:.2f}",
                     f"{r['rss_before_mib']:.0f}", f"{r['peak_extra_mib']:.0f}",
                     f"{r['s_per_update']:.3f}"])  # fmt: skip
        curves.append(f"- {r['form']}: " + " ".join(f"{c[0]}:{c[2]:.2f}/{c[3]:.2f}"
                                                    for c in r["curve"]))  # fmt: skip
    lines.append(markdown_table(["actions", "form", "final return", "hit rate",
                                 "RSS before MiB", "peak extra MiB", "s/update"], rows))  # fmt: skip
    lines += ["", "Return curves (env step: greedy return / hit rate over the 16 contexts):", ""]
    return lines + curves + [""]


def write_report(results: dict) -> Path:
    from common import header_lines

    out = RESULTS / "learn.md"
    notes = ""
    if out.exists() and NOTES_MARKER in out.read_text():
        notes = out.read_text().split(NOTES_MARKER, 1)[1]
    paras = [" ".join(p.split()).replace("``", "`") for p in __doc__.split("\n\n")[4:6]]
    lines = ["# Learning benchmark: rlstash vs Stable-Baselines3", "",
             "Reproduce: `python3 bench/learn.py` (all parts, ~30 min on 2 cores); "
             "`--parts dqn|sac|contextual` and `--seeds` re-run a part, merged with the earlier "
             "runs kept in bench/.work/learn.json.", "", paras[0], "", paras[1], ""]  # fmt: skip
    lines += ["Machine:", "", *header_lines(results.get("machine", {})), ""]
    for algo in TASKS:
        if algo in results:
            lines += learning_section(algo, results[algo])
    if "contextual" in results:
        lines += contextual_section(results["contextual"])
    if "ppo_contextual" in results:
        lines += contextual_section(results["ppo_contextual"], "PPO")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n" + NOTES_MARKER + notes)
    return out


# ----------------------------------------------------------------------------- main


def load_results() -> dict:
    path = WORK / "learn.json"
    return json.loads(path.read_text()) if path.exists() else {}


def save_results(results: dict) -> None:
    WORK.mkdir(parents=True, exist_ok=True)
    tmp = WORK / "learn.json.tmp"
    tmp.write_text(json.dumps(results, indent=1))
    tmp.replace(WORK / "learn.json")


def run_learning(algo: str, seeds: list[int], budget: int, results: dict) -> None:
    """Interleave rlstash and SB3 runs seed by seed; results[algo][lib][seed] = run."""
    part = results.setdefault(algo, {})
    part["budget"], part["threshold"] = budget, TASKS[algo]["threshold"]
    for seed in seeds:
        for lib in LIBS:
            task = {"part": "learn", "lib": lib, "algo": algo, "seed": seed, "budget": budget}
            start = time.time()
            out = spawn(task, timeout=3600)
            out["points"] = points(out.get("curve", []), TASKS[algo]["threshold"])
            part.setdefault(lib, {})[str(seed)] = out
            pts = out["points"]
            print(f"{algo} {lib} seed {seed}: {out.get('error', '')} first {pts['first']} "
                  f"stays {pts['stays']} solved {pts['solved']} ({time.time() - start:.0f} s)",
                  flush=True)  # fmt: skip
            save_results(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="dqn,sac,contextual,ppo,ppo_contextual")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--budget", type=int, default=None, help="env steps (default per part)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    from bench_venv import ensure_bench_venv

    ensure_bench_venv(__file__)
    parts = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(parts) - {*TASKS, "contextual", "ppo_contextual"})
    if unknown:
        raise SystemExit(
            f"--parts: unknown {unknown}; expected dqn, sac, ppo, contextual, ppo_contextual"
        )
    seeds = [int(s) for s in args.seeds.split(",") if s]
    results = load_results()
    results["machine"] = machine()
    for part in parts:
        if part in ("contextual", "ppo_contextual"):
            import contextual

            results[part] = contextual.benchmark(lambda t: spawn(t, timeout=7200), part=part)
        else:
            run_learning(part, seeds, args.budget or TASKS[part]["budget"], results)
        save_results(results)
    out = write_report(results)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
