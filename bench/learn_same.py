#!/usr/bin/env python3
"""Learning benchmark with identical settings on both sides: rlstash against Stable-Baselines3.

bench/learn.py compares each side's preset (what a user gets); this script runs the same
networks and hyperparameters on both sides (what the implementation is worth) and the agents'
update rates against their compute limit. Its results: bench/results/learn_same.md.

    python3 bench/learn_same.py                              # everything; writes bench/results/learn_same.md
    python3 bench/learn_same.py --parts sac_same --seeds 0   # one part, one seed (results merged)
    python3 bench/learn_same.py --parts updates              # update rates vs the compute limit

Runs in ``.venv-bench`` (re-executes itself there; creates it with bench/setup_env.py when
missing). Parts:

- identical settings (what the implementation is worth): ``sac_same``: SAC on HalfCheetah-v5,
  (256, 256) networks and SB3's SAC defaults on both sides, 15,000 env steps; ``dqn_same``: DQN
  on CartPole-v1 with the RL Zoo's settings ((256, 256), 1-step returns) on both sides;
- ``updates``: each agent's update rate as a fraction of its network's compute limit
  (bench/update_flops.py).

Method (learning parts): every run is a fresh subprocess with one torch thread and CUDA
hidden; runs are interleaved (rlstash seed 0, SB3 seed 0, rlstash seed 1, ...). Both sides
evaluate on the same schedule (every 1,000 env steps, 10 deterministic episodes; HalfCheetah:
every 5,000, 5 episodes) on separate eval envs, and both exclude evaluation time from the
training clock (SB3 through a callback that stops the clock while it evaluates; rlstash's loop
does so itself). Both run the whole budget (no early stop), so the "stays" point means: every
later evaluation up to the end of the budget is >= threshold.

Reported per run: env steps and training seconds at (a) the first evaluation >= threshold,
(b) the first evaluation from which every later one stays >= threshold, and (c) where
``rlstash train`` would stop (5 evaluations in a row >= threshold, its default patience); for
parts without a threshold (HalfCheetah in 15,000 steps), training seconds, env steps/s and the
evaluation returns. Medians over seeds (a run that never gets there counts as +inf); ratios
rlstash / SB3.
"""

from __future__ import annotations

import argparse
import contextlib
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
WORK = HERE / ".work"  # raw results of every run (learn_same.json), merged across invocations
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

# rl-baselines3-zoo hyperparams/dqn.yml, sac.yml and td3.yml (SB3 defaults for everything else).
ZOO_DQN = {
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
}
ZOO_TD3 = {
    "learning_rate": 1e-3,
    "gamma": 0.98,
    "buffer_size": 200_000,
    "learning_starts": 10_000,
    "train_freq": [1, "episode"],
    "gradient_steps": -1,
    "noise_std": 0.1,  # NormalActionNoise(0, 0.1) on the [-1, 1] action
    "policy_kwargs": {"net_arch": [400, 300]},
}
# The zoo's DQN settings in rlstash's terms. SB3's target_update_interval = 10 env steps with
# bursts of 128 updates every 256 steps: the target equals the online net at the start of each
# burst and stays frozen through it, i.e. rlstash's target_update_interval = 128 updates.
# Left different: rlstash's DQN is double DQN (SB3's takes the max over the target net).
SAME_DQN = {
    "learning_rate": 2.3e-3, "lr_schedule": "constant", "batch_size": 64,
    "buffer_size": 100_000, "learning_starts": 1000, "gamma": 0.99, "n_steps": 1,
    "target_update_interval": 128, "train_freq": 256, "gradient_steps": 128,
    "exploration_fraction": 0.16, "exploration_final_eps": 0.04, "net_arch": [256, 256],
    "total_steps": 50_000,
}  # fmt: skip
# SB3's SAC defaults are rlstash's (lr 3e-4, batch 256, (256, 256), tau 0.005, auto alpha,
# learning_starts 100, one update per step); the buffer holds the whole run on both sides.
# Left different: SB3 acts uniformly at random for its first 100 steps, rlstash with its policy.
SAME_SAC = {"buffer_size": 15_000}

TASKS = {
    "dqn_same": {"algo": "dqn", "env": "CartPole-v1", "threshold": 475.0, "budget": 50_000,
                 "rlstash": SAME_DQN, "sb3": ZOO_DQN, "group": "same"},
    "sac_same": {"algo": "sac", "env": "HalfCheetah-v5", "threshold": None, "budget": 15_000,
                 "rlstash": SAME_SAC, "sb3": {"buffer_size": 15_000}, "group": "same",
                 "eval_every": 5000, "eval_episodes": 5},
}  # fmt: skip
EVAL_EVERY = 1000
EVAL_EPISODES = 10
PATIENCE = 5  # rlstash train's default: evaluations in a row at or above the threshold
LIBS = ("rlstash", "sb3")


# ----------------------------------------------------------------------------- workers


def _schedule(part: str) -> tuple[int, int]:
    task = TASKS[part]
    return task.get("eval_every", EVAL_EVERY), task.get("eval_episodes", EVAL_EPISODES)


def run_rlstash(part: str, seed: int, budget: int) -> dict:
    """One rlstash run (its preset, or the part's settings); the curve comes from eval.csv."""
    from rlstash.train.config import LOOP_SETTINGS
    from rlstash.train.loop import TrainConfig, train

    task = TASKS[part]
    eval_every, eval_episodes = _schedule(part)
    overrides = dict(task["rlstash"] or {})
    loop = {k: v for k, v in overrides.items() if k in LOOP_SETTINGS}
    agent = {k: v for k, v in overrides.items() if k not in LOOP_SETTINGS}
    with tempfile.TemporaryDirectory(prefix="rlstash-learn-") as tmp:
        cfg = TrainConfig(
            algo=task["algo"], env=task["env"], steps=budget, seed=seed, run_dir=tmp,
            name="run", eval_every=eval_every, eval_episodes=eval_episodes,
            threshold=task["threshold"], patience=10**9, quiet=True, device="cpu",
            checkpoint_every=10 * budget, agent=agent, **loop,
        )  # fmt: skip
        start = time.perf_counter()
        result = train(cfg)
        wall = time.perf_counter() - start
        evals = Path(tmp) / "run" / "eval.csv"  # absent when the budget ends before eval_every
        with open(evals) if evals.exists() else contextlib.nullcontext([]) as fh:
            curve = [
                [int(r["step"]), float(r["train_seconds"]), float(r["return_mean"])]
                for r in csv.DictReader(fh)
            ]
    settings = overrides or _preset(task["algo"], task["env"])
    return {"curve": curve, "steps": result.steps, "train_seconds": result.train_seconds,
            "wall_seconds": wall, "settings": settings}  # fmt: skip


def _preset(algo: str, env: str) -> dict:
    from rlstash.train.algos import ALGOS

    preset = ALGOS[algo].presets[env]
    return {k: list(v) if isinstance(v, tuple) else v for k, v in preset.items()}


def run_sb3(part: str, seed: int, budget: int) -> dict:
    """One SB3 run with the part's settings; evaluation time is excluded from the clock."""
    import gymnasium as gym
    import numpy as np
    from stable_baselines3 import DQN, SAC, TD3
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.noise import NormalActionNoise
    from stable_baselines3.common.vec_env import DummyVecEnv

    task = TASKS[part]
    env_id, (eval_every, eval_episodes) = task["env"], _schedule(part)
    eval_env = DummyVecEnv([lambda: gym.make(env_id) for _ in range(eval_episodes)])

    class EvalClock(BaseCallback):
        """Every eval_every steps: stop the clock, evaluate, restart it."""

        def __init__(self) -> None:
            super().__init__()
            self.curve: list[list[float]] = []
            self.excluded = 0.0
            self.start = 0.0

        def _on_training_start(self) -> None:
            self.start = time.perf_counter()

        def _on_step(self) -> bool:
            if self.num_timesteps % eval_every == 0:
                t0 = time.perf_counter()
                train_s = t0 - self.start - self.excluded
                eval_env.seed(seed + 10_000 + len(self.curve))
                returns, _ = evaluate_policy(
                    self.model, eval_env, n_eval_episodes=eval_episodes, deterministic=True,
                    return_episode_rewards=True,
                )  # fmt: skip
                self.curve.append([self.num_timesteps, train_s, float(np.mean(returns))])
                self.excluded += time.perf_counter() - t0
            return True

    cls = {"dqn": DQN, "sac": SAC, "td3": TD3}[task["algo"]]
    settings = dict(task["sb3"])
    env = gym.make(env_id)
    if "noise_std" in settings:
        std, dims = settings.pop("noise_std"), env.action_space.shape
        settings["action_noise"] = NormalActionNoise(np.zeros(dims), std * np.ones(dims))
    if isinstance(settings.get("train_freq"), list):
        settings["train_freq"] = tuple(settings["train_freq"])
    model = cls("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **settings)
    clock = EvalClock()
    start = time.perf_counter()
    model.learn(total_timesteps=budget, callback=clock)
    wall = time.perf_counter() - start
    train_s = wall - clock.excluded
    return {"curve": clock.curve, "steps": budget, "train_seconds": train_s,
            "wall_seconds": wall, "settings": task["sb3"]}  # fmt: skip


def worker(task: dict) -> dict:
    import torch

    torch.set_num_threads(1)
    if task["part"] == "contextual":
        import contextual

        return contextual.run(**task["args"])
    if task["part"] == "updates":
        import update_flops

        return update_flops.measure(task["name"])
    fn = run_rlstash if task["lib"] == "rlstash" else run_sb3
    return fn(task["part"], task["seed"], task["budget"])


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
    ok = [threshold is not None and r[2] >= threshold for r in curve]
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


def _title(name: str, part: dict) -> str:
    task = TASKS[name]
    what = "identical settings" if task["group"] == "same" else "presets"
    goal = f"threshold {task['threshold']:g}, " if task["threshold"] is not None else ""
    return f"## {task['algo'].upper()} {task['env']}, {what}: {goal}budget {part['budget']:,} env steps"


def _settings_lines(runs: dict) -> list[str]:
    lines = []
    for lib in LIBS:
        settings = next((r["settings"] for r in runs[lib].values() if "settings" in r), None)
        if settings:
            lines += ["", f"{lib} settings: `{json.dumps(settings)}`"]
    return lines


def speed_section(name: str, part: dict) -> list[str]:
    """A part without a threshold: training seconds for the budget, env steps/s, returns."""
    from common import markdown_table

    runs = {lib: part.get(lib, {}) for lib in LIBS}
    ok = {lib: [r for r in runs[lib].values() if "error" not in r] for lib in LIBS}
    lines = [_title(name, part), ""]
    rows, ratios = [], []
    for steps in sorted({r["steps"] for lib in LIBS for r in ok[lib]}):
        med = {}
        for lib in LIBS:
            mine = [r for r in ok[lib] if r["steps"] == steps]
            if not mine:
                continue
            med[lib] = statistics.median(r["train_seconds"] for r in mine)
            fin = [r["curve"][-1][2] for r in mine if r["curve"]]
            rows.append([f"{steps:,}", lib, len(mine), f"{med[lib]:.1f}",
                         f"{steps / med[lib]:.1f}",
                         f"{statistics.median(fin):.0f}" if fin else "not evaluated"])  # fmt: skip
        if len(med) == 2:
            ratios.append(f"{steps:,} env steps: rlstash takes **{med['rlstash'] / med['sb3']:.2f}x** "
                          "SB3's training seconds (medians over seeds)")  # fmt: skip
    lines += [f"- {r}" for r in ratios] + [""]
    lines += [markdown_table(["env steps", "library", "seeds", "train s", "env steps/s",
                              "final eval return"], rows), ""]  # fmt: skip
    per_run = []
    for seed in sorted({s for lib in LIBS for s in runs[lib]}, key=int):
        for lib in LIBS:
            r = runs[lib].get(seed)
            if r is None:
                continue
            if "error" in r:
                per_run.append([seed, lib, r["error"], "", "", ""])
                continue
            rets = " ".join(f"{c[0]}:{c[2]:.0f}" for c in r["curve"])
            per_run.append([seed, lib, f"{r['train_seconds']:.1f}",
                            f"{r['steps'] / r['train_seconds']:.1f}",
                            " ".join(map(str, r.get("load_before_after", []))), rets])  # fmt: skip
    lines += ["Per run:", "", markdown_table(["seed", "library", "train s", "env steps/s",
                                              "load 1m before/after", "eval step:return"],
                                             per_run)]  # fmt: skip
    return lines + _settings_lines(runs) + [""]


def learning_section(name: str, part: dict) -> list[str]:
    from common import markdown_table

    if TASKS[name]["threshold"] is None:
        return speed_section(name, part)
    lines = [_title(name, part), ""]
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
        if key != "solved":
            ok = not math.isinf(rs) and rs <= ss and rt <= GOAL_TIME * st
            goals.append(f"- {label}: steps {_cell(rs, ',.0f')} vs {_cell(ss, ',.0f')}, seconds "
                         f"{_cell(rt, '.1f')} vs {GOAL_TIME} x {_cell(st, '.1f')}: "
                         f"**{'met' if ok else 'missed'}**")  # fmt: skip
    lines.append("Medians over seeds (never = +inf):")
    lines += ["", markdown_table(["point", "rlstash steps", "SB3 steps", "ratio", "rlstash s",
                                  "SB3 s", "ratio"], rows), ""]  # fmt: skip
    if TASKS[name]["group"] == "preset":
        lines += ["Goal (rlstash <= SB3 env steps and <= 0.7x its training seconds):", "", *goals]
        lines.append("")
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
    return lines + _settings_lines(runs) + [""]


def contextual_section(part: dict) -> list[str]:
    import contextual
    from common import markdown_table

    lines = ["## Discrete SAC, 100,000 actions (bench/contextual.py)", ""]
    lines += [contextual.SUMMARY, ""]
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


GROUPS = {
    "same": "# Part 1: identical settings on both sides (what the implementation is worth)",
}


def _kept_sections(old: str) -> dict[str, str]:
    """Sections ("## ..." to the next) of a previous report, by heading."""
    chunks = old.split(NOTES_MARKER, 1)[0].split("\n## ")[1:]
    return {"## " + c.split("\n", 1)[0]: "## " + c.rstrip() for c in chunks}


def _kept(name: str, old: dict[str, str], old_date: str) -> list[str]:
    """A part not run this time: its section from the previous report, labelled with the date
    of the run that produced it."""
    task = TASKS[name]
    what = "identical settings" if task["group"] == "same" else "presets"
    prefixes = (f"## {task['algo'].upper()} {task['env']}, {what}",)
    if task["group"] == "preset":  # the heading before the two groups existed
        prefixes += (f"## {task['algo'].upper()} {task['env']}: threshold",)
    for heading, text in old.items():
        if not heading.startswith(prefixes):
            continue
        body = text.split("\n", 1)[1] if "\n" in text else ""
        if " (kept from " in heading:  # kept before: keep its date and note
            return [heading, body, ""]
        note = f"*Not rerun this time: the tables below are from the run of {old_date}.*"
        return [f"{heading} (kept from {old_date})", "", note, body, ""]
    return []


def write_report(results: dict) -> Path:
    import update_flops
    from common import header_lines

    out = RESULTS / "learn_same.md"
    previous = out.read_text() if out.exists() else ""
    notes = previous.split(NOTES_MARKER, 1)[1] if NOTES_MARKER in previous else ""
    old, old_date = _kept_sections(previous), "an earlier date"
    for line in previous.splitlines():
        if line.startswith("- date: "):
            old_date = line.removeprefix("- date: ")
            break
    paras = []
    for para in __doc__.split("\n\n")[2:6]:  # keep list items on lines of their own
        items = para.strip().split("\n- ")
        paras.append("\n- ".join(" ".join(x.split()).replace("``", "`") for x in items))
    lines = ["# Learning benchmark, identical settings: rlstash vs Stable-Baselines3", "",
             "Reproduce: `python3 bench/learn_same.py` (all parts, ~1 h on 2 quiet cores); "
             "`--parts sac_same,dqn_same,updates` and `--seeds` re-run "
             "parts, merged with the earlier runs kept in bench/.work/learn_same.json.", "",
             *[x for p in paras for x in (p, "")]]  # fmt: skip
    lines += ["Machine (of this run):", "", *header_lines(results.get("machine", {})), ""]
    for group, heading in GROUPS.items():
        lines += [heading, ""]
        for name, task in TASKS.items():
            if task["group"] != group:
                continue
            if name in results:
                lines += learning_section(name, results[name])
            else:
                lines += _kept(name, old, old_date)
    if "updates" in results:
        lines += ["# Part 2: update rates", "", *update_flops.section(results["updates"])]
    if "contextual" in results:
        lines += contextual_section(results["contextual"])
    elif kept := [t for h, t in old.items() if h.startswith("## Discrete SAC")]:
        heading, body = kept[0].split("\n", 1)
        if " (kept from " not in heading:
            heading += f" (kept from {old_date})"
        lines += [heading, body, ""]
    RESULTS.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n" + NOTES_MARKER + notes)
    return out


# ----------------------------------------------------------------------------- main


def load_results() -> dict:
    path = WORK / "learn_same.json"
    return json.loads(path.read_text()) if path.exists() else {}


def save_results(results: dict, parts: list[str]) -> None:
    """Write ``results[part]`` for ``parts`` into learn_same.json, keeping what other invocations
    (possibly running at the same time) wrote for other parts."""
    import fcntl

    WORK.mkdir(parents=True, exist_ok=True)
    with open(WORK / "learn_same.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        merged = load_results()
        for k in parts:
            if k not in results:
                continue
            if k in TASKS and isinstance(
                merged.get(k), dict
            ):  # merge runs lib by lib, seed by seed
                for key, value in results[k].items():
                    if key in LIBS:
                        merged[k].setdefault(key, {}).update(value)
                    else:
                        merged[k][key] = value
            else:
                merged[k] = results[k]
        merged["machine"] = results.get("machine", merged.get("machine", {}))
        tmp = WORK / "learn_same.json.tmp"
        tmp.write_text(json.dumps(merged, indent=1))
        tmp.replace(WORK / "learn_same.json")


def run_learning(
    name: str, seeds: list[int], budget: int, results: dict, libs: tuple[str, ...] = LIBS
) -> None:
    """Interleave rlstash and SB3 runs seed by seed; results[name][lib][seed] = run."""
    part = results.setdefault(name, {})
    part["budget"], part["threshold"] = budget, TASKS[name]["threshold"]
    for seed in seeds:
        for lib in libs:
            task = {"part": name, "lib": lib, "seed": seed, "budget": budget}
            start = time.time()
            out = spawn(task, timeout=3600)
            out["points"] = points(out.get("curve", []), TASKS[name]["threshold"])
            part.setdefault(lib, {})[str(seed)] = out
            pts = out["points"]
            print(f"{name} {lib} seed {seed}: {out.get('error', '')} first {pts['first']} "
                  f"stays {pts['stays']} solved {pts['solved']} "
                  f"train {out.get('train_seconds', 0):.0f} s ({time.time() - start:.0f} s)",
                  flush=True)  # fmt: skip
            save_results(results, [name])


def run_updates(results: dict) -> None:
    import update_flops

    part = results.setdefault("updates", {})
    for name in update_flops.CONFIGS:
        part[name] = spawn({"part": "updates", "name": name}, timeout=1800)
        print(f"updates {name}: {json.dumps(part[name])[:300]}", flush=True)
        save_results(results, ["updates"])


PARTS = (*TASKS, "updates")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--budget", type=int, default=None, help="env steps (default per part)")
    parser.add_argument(
        "--libs",
        default=",".join(LIBS),
        help="run only these sides (another invocation may run "
        "the other side at the same time: results are merged run by run)",
    )
    parser.add_argument(
        "--report-only", action="store_true", help="rewrite learn_same.md, run nothing"
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    from bench_venv import ensure_bench_venv

    ensure_bench_venv(__file__)
    parts = [p for p in args.parts.split(",") if p] if not args.report_only else []
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise SystemExit(f"--parts: unknown {unknown}; expected some of {', '.join(PARTS)}")
    seeds = [int(s) for s in args.seeds.split(",") if s]
    results = load_results()
    if parts:
        results["machine"] = machine()
    for part in parts:
        if part == "contextual":
            import contextual

            results["contextual"] = contextual.benchmark(lambda t: spawn(t, timeout=7200))
        elif part == "updates":
            run_updates(results)
        else:
            libs = tuple(lib for lib in LIBS if lib in args.libs.split(","))
            run_learning(part, seeds, args.budget or TASKS[part]["budget"], results, libs)
        save_results(results, [part])
    out = write_report(load_results())
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
