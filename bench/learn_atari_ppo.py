"""Issue 27's end-to-end Atari runs beside bench/learn_atari.py's DQN: PPO (rlstash, SB3,
CleanRL's ``ppo_atari_envpool.py`` as CleanRL ships it) and the dated sections both write.

Run through bench/learn_atari.py (``--part ppo``, ``--part dqn-envpool``); the workers here are
called in fresh processes (one torch thread each) by its ``spawn``.

PPO settings (CleanRL's ppo_atari_envpool.py defaults, :data:`SETTINGS`): 8 envs x 128 steps,
4 epochs of 4 minibatches (256 rows), lr 2.5e-4 annealed to 0 over the run, gamma 0.99, GAE
0.95, clip 0.1 on the ratio and the value, entropy 0.01, value 0.5 (CleanRL's loss is
``0.5 * vf_coef * max(clipped, unclipped)``: rlstash's and SB3's have no 0.5, so both get 0.25,
the same loss), gradient-norm clip 0.5, Adam eps 1e-5, one Nature CNN shared by actor and
critic, advantages normalized per minibatch.

* rlstash: ``rlstash train --algo ppo --env ALE/<Game>-v5`` (its Atari preset is these settings,
  :data:`rlstash.presets.PPO_ATARI`), eager, gymnasium/ALE envs in rlstash's process pool
  (PPO needs same-step autoreset, which EnvPool's next-step resets cannot give: rlstash
  refuses ``--env-backend envpool`` for PPO, so there is no rlstash-over-EnvPool PPO row);
* SB3: ``PPO("CnnPolicy")`` over ``make_atari_env`` (DummyVecEnv, its default) +
  ``VecFrameStack(4)``, the same settings;
* CleanRL: ``ppo_atari_envpool.py`` from github.com/vwxyzjn/cleanrl, byte for byte, run with
  ``--env-id <Game>-v5 --total-timesteps B --seed S`` (tracking is off by default) and
  ``OMP_NUM_THREADS=1`` in its environment (one torch thread; the script does not set it).
  Its envs are EnvPool's defaults (stack_num 4 in EnvPool, sticky actions 0 where rlstash and
  SB3 play v5's 0.25, episodic life, reward clip), its clock its own ``SPS`` line.
"""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CLEANRL = HERE / ".work" / "cleanrl"  # the fetched script (git-ignored), run unchanged here
CLEANRL_SCRIPT = "ppo_atari_envpool.py"

SETTINGS = {
    "num_envs": 8, "rollout_steps": 128, "n_epochs": 4, "num_minibatches": 4,
    "minibatch_size": 256, "learning_rate": 2.5e-4, "anneal_lr": True, "gamma": 0.99,
    "gae_lambda": 0.95, "clip_range": 0.1, "clip_range_vf": 0.1, "ent_coef": 0.01,
    "vf_coef": 0.25, "max_grad_norm": 0.5, "adam_eps": 1e-5,
}  # fmt: skip


def tree_cpu() -> float:
    """CPU seconds of this process and its live descendants (rlstash's env workers)."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def run_rlstash_ppo(env_id: str, seed: int, budget: int) -> dict:
    from rlstash.train import builders
    from rlstash.train.config import TrainConfig

    s = SETTINGS
    agent = {k: s[k] for k in ("num_envs", "rollout_steps", "n_epochs", "minibatch_size",
                               "learning_rate", "anneal_lr", "gamma", "gae_lambda",
                               "clip_range", "clip_range_vf", "ent_coef", "vf_coef",
                               "max_grad_norm", "adam_eps")}  # fmt: skip
    agent.update(compile=False, anneal_clip_range=False, total_steps=budget)
    with tempfile.TemporaryDirectory(prefix="rlstash-ppo-") as tmp:
        cfg = TrainConfig(
            algo="ppo", env=env_id, steps=budget, seed=seed, run_dir=tmp, name="run",
            quiet=True, device="cpu", checkpoint_every=10 * budget, eval_every=10 * budget,
            eval_episodes=1, agent=agent,
        )  # fmt: skip
        run = builders.build_run(cfg, Path(tmp) / "run")
        try:
            step = run.learning.iterate(run)
            t0, c0 = time.perf_counter(), tree_cpu()
            while run.step < budget:
                step({})
            wall, cpu = time.perf_counter() - t0, tree_cpu() - c0
            workers = getattr(run.env, "num_workers", "?")  # rlstash train's --workers 0
            note = "envs in-process" if workers == 0 else f"{workers} env workers"
            frames = run.step
        finally:
            run.close()
    return {"steps": frames, "train_seconds": wall, "cpu_seconds": cpu, "note": note}


def run_sb3_ppo(env_id: str, seed: int, budget: int) -> dict:
    import ale_py
    import gymnasium as gym
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    gym.register_envs(ale_py)
    s = SETTINGS
    env = VecFrameStack(
        make_atari_env(env_id, n_envs=s["num_envs"], seed=seed, env_kwargs={"frameskip": 1}),
        n_stack=4,
    )
    lr = s["learning_rate"]
    model = PPO(
        "CnnPolicy", env, seed=seed, device="cpu", verbose=0,
        learning_rate=lambda remaining: remaining * lr, n_steps=s["rollout_steps"],
        batch_size=s["minibatch_size"], n_epochs=s["n_epochs"], gamma=s["gamma"],
        gae_lambda=s["gae_lambda"], clip_range=s["clip_range"],
        clip_range_vf=s["clip_range_vf"], ent_coef=s["ent_coef"], vf_coef=s["vf_coef"],
        max_grad_norm=s["max_grad_norm"], policy_kwargs={"optimizer_kwargs": {"eps": 1e-5}},
    )  # fmt: skip
    t0, c0 = time.perf_counter(), tree_cpu()
    model.learn(total_timesteps=budget)
    wall, cpu = time.perf_counter() - t0, tree_cpu() - c0
    steps = model.num_timesteps
    env.close()
    return {"steps": steps, "train_seconds": wall, "cpu_seconds": cpu, "note": "DummyVecEnv"}


def run_cleanrl(game: str, seed: int, budget: int) -> dict:
    """CleanRL's script, unchanged, in a child process; its own SPS line is its clock."""
    script = CLEANRL / CLEANRL_SCRIPT
    if not script.exists():
        return {"error": f"{script} missing: run bench/learn_atari.py --part ppo (fetches it)"}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    stamp, waited = ROOT / ".venv-cleanrl" / ".cleanrl-stamp", time.time()
    # its pinned envpool/gym (bench/setup_atari_cleanrl.py), else the shim over envpool 1.x
    env["PYTHONPATH"] = str(stamp.parent if stamp.exists() else HERE / "cleanrl_shim")
    while not stamp.exists() and time.time() - waited < float(os.environ.get("CLEANRL_WAIT_S", 0)):
        time.sleep(10)  # its venv still being set up (the run says how long it waited)
    waited = time.time() - waited
    cmd = [sys.executable, CLEANRL_SCRIPT, "--env-id", f"{game}-v5",
           "--total-timesteps", str(budget), "--seed", str(seed)]  # fmt: skip
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run(
        cmd, cwd=CLEANRL, env=env, capture_output=True, text=True, timeout=3 * 3600
    )  # its TensorBoard runs/ lands in bench/.work/cleanrl
    whole = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        return {"error": f"exit {out.returncode}: {out.stderr[-600:]}"}
    sps = [int(m) for m in re.findall(r"^SPS: (\d+)$", out.stdout, re.M)]
    steps = budget // (SETTINGS["num_envs"] * SETTINGS["rollout_steps"]) * 1024
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"steps": steps, "train_seconds": steps / sps[-1], "cpu_seconds": cpu,
            "whole_seconds": whole, "waited_for_venv_s": round(waited),
            "note": "CPU: the whole process, start-up included"
            + (f"; started {waited:.0f} s after the others (its venv)" if waited > 30 else "")}  # fmt: skip


def fetch_cleanrl() -> str:
    """Copy CleanRL's script from the mirror made by the ``fetch`` of github:vwxyzjn/cleanrl
    (``CLEANRL_GIT``, default /work/.mirror/vwxyzjn+cleanrl/repo); its commit."""
    git = os.environ.get("CLEANRL_GIT", "/work/.mirror/vwxyzjn+cleanrl/repo")
    commit = subprocess.check_output(["git", "-C", git, "rev-parse", "HEAD"], text=True).strip()
    text = subprocess.check_output(
        ["git", "-C", git, "show", f"{commit}:cleanrl/{CLEANRL_SCRIPT}"], text=True
    )
    CLEANRL.mkdir(parents=True, exist_ok=True)
    (CLEANRL / CLEANRL_SCRIPT).write_text(text)
    return commit


def ppo_worker(task: dict) -> dict:
    game, seed, budget = task["game"], task["seed"], task["budget"]
    if task["lib"] == "cleanrl":
        return run_cleanrl(game, seed, budget)
    fn = run_rlstash_ppo if task["lib"] == "rlstash" else run_sb3_ppo
    return fn(f"ALE/{game}-v5", seed, budget)


def median(xs: list[float]) -> float:
    xs = sorted(xs)
    return (xs[(len(xs) - 1) // 2] + xs[len(xs) // 2]) / 2


def speed_section(title: str, intro: list[str], runs: dict, libs: tuple[str, ...],
                  base: str) -> list[str]:  # fmt: skip
    """A dated section: per game and lib the medians over seeds of agent steps/s by the
    training clock (wall) and per CPU second, and their ratio to ``base``."""
    lines = [f"## {title}", "", *intro, ""]
    head = "| game | seeds | clock | " + " | ".join(libs) + " | " + " | ".join(
        f"{lib} / {base}" for lib in libs if lib != base) + " |"  # fmt: skip
    lines += [head, "|" + "---|" * 3 + "---:|" * (2 * len(libs) - 1)]
    for game, per_lib in runs.items():
        for clock, key in (("wall", "train_seconds"), ("CPU", "cpu_seconds")):
            med, seeds = {}, set()
            for lib in libs:
                rates = [r["steps"] / r[key] for s, r in per_lib.get(lib, {}).items()
                         if "error" not in r and r.get(key)]  # fmt: skip
                seeds |= {s for s, r in per_lib.get(lib, {}).items() if "error" not in r}
                med[lib] = median(rates) if rates else None
            cells = [f"{med[lib]:,.0f}" if med[lib] else "–" for lib in libs]
            ratios = [f"{med[lib] / med[base]:.2f}x" if med[lib] and med[base] else "–"
                      for lib in libs if lib != base]  # fmt: skip
            lines.append(f"| {game} | {','.join(sorted(seeds))} | {clock} | "
                         + " | ".join(cells + ratios) + " |")  # fmt: skip
    lines += ["", "Per run (agent steps/s wall / CPU; notes):", ""]
    for game, per_lib in runs.items():
        for lib in libs:
            for seed, r in sorted(per_lib.get(lib, {}).items()):
                if "error" in r:
                    lines.append(f"- {game} {lib} seed {seed}: error: {r['error'][-300:]}")
                    continue
                lines.append(
                    f"- {game} {lib} seed {seed}: {r['steps'] / r['train_seconds']:,.1f} / "
                    f"{r['steps'] / r['cpu_seconds']:,.1f} ({r['steps']:,} steps"
                    + (f"; {r['note']}" if r.get("note") else "") + ")"
                )  # fmt: skip
    return lines + [""]


def append_section(path: Path, lines: list[str]) -> None:
    """Append (or replace, by its title line) a dated section; the earlier content is kept."""
    old = path.read_text() if path.exists() else ""
    title = lines[0]
    if title in old:
        start = old.index(title)
        nxt = old.find("\n## ", start + len(title))
        old = old[:start] + (old[nxt + 1 :] if nxt >= 0 else "")
    path.write_text(old.rstrip("\n") + "\n\n" + "\n".join(lines).rstrip("\n") + "\n")


def dump(path: Path, results: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1))


def _uptime() -> str:
    out = subprocess.run(["uptime"], capture_output=True, text=True).stdout
    return out.strip().split("load average:")[-1].strip()


DQN_LIBS = ("rlstash", "rlstash-envpool", "sb3")
PPO_LIBS = ("rlstash", "sb3", "cleanrl")


def run_part(part: str, games: list[str], seeds: list[int], budget: int, episodes: int,
             spawn, machine: dict, dqn_settings: dict) -> Path:  # fmt: skip
    """``part`` ``dqn-envpool`` or ``ppo``: for each seed and game the libs' runs side by side
    (one process each, started together so that each meets the same load), then a dated
    section appended to bench/results/learn_atari.md (raw runs: bench/.work/<part>.json)."""
    from concurrent.futures import ThreadPoolExecutor

    import common  # bench/common.py

    libs = DQN_LIBS if part == "dqn-envpool" else PPO_LIBS
    commit = fetch_cleanrl() if part == "ppo" else None
    before, started = _uptime(), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    runs: dict = {}
    work = HERE / ".work" / f"learn_atari_{part}.json"
    for seed in seeds:  # every game and lib of a seed at once (one process each)
        tasks = [{"part": part, "lib": lib, "game": game, "env": f"ALE/{game}-v5",
                  "seed": seed, "budget": budget, "eval_every": budget,
                  "episodes": episodes} for game in games for lib in libs]  # fmt: skip
        with ThreadPoolExecutor(len(tasks)) as pool:
            outs = list(pool.map(lambda t: spawn(t, timeout=3 * 3600), tasks))
        for task, out in zip(tasks, outs):
            game, lib = task["game"], task["lib"]
            runs.setdefault(game, {}).setdefault(lib, {})[str(seed)] = out
            rate = out["steps"] / out["train_seconds"] if "error" not in out else out
            print(f"{part} {game} {lib} seed {seed}: {rate}", flush=True)
        dump(work, {"runs": runs, "machine": machine})
    after = _uptime()
    cmd = (f"python3 bench/learn_atari.py --part {part} --games {','.join(games)} --seeds "
           f"{','.join(map(str, seeds))} --budget {budget}"
           + (f" --eval-episodes {episodes}" if part == "dqn-envpool" else ""))  # fmt: skip
    head = [
        f"Measured {started} (finished {time.strftime('%H:%M UTC', time.gmtime())}) on "
        f"{machine.get('cpus')} CPU cores, torch {machine.get('torch')}, SB3 "
        f"{machine.get('sb3')}, ale-py {machine.get('ale_py')}, envpool "
        f"{machine.get('envpool')}; one torch thread per run, eager on every side. "
        f"{common.load_sentence(before, after)} Load (`uptime`) before {before}, after {after}. The runs of one game and seed are started together, one "
        "process each (every game of a seed at once), so each meets the same load; rates are medians over seeds of agent "
        "steps/s by the training clock (wall, evaluation excluded) and per CPU second of the "
        "run's process tree (env worker processes included).",
        "",
        f"**Budget: {budget:,} agent steps ({4 * budget:,} frames) per run.** At this budget "
        "no side has learned anything that a score could show (Pong stays near -21, Breakout "
        "near random play's 0-4): scores are noise here; speed is the point.",
        "",
        f"Reproduce (in `.venv-atari`, `python3 bench/setup_atari.py`): `{cmd}`",
    ]
    if part == "dqn-envpool":
        title = f"DQN over EnvPool ({started})"
        intro = head + [
            "",
            "DQN settings as the sections above (`" + json.dumps(dqn_settings) + "`), 1 env. "
            "`rlstash`: gymnasium/ALE env (rlstash's Atari path); `rlstash-envpool`: the same "
            "run with `--env-backend envpool` (EnvPool's C++ Atari, rlstash's preprocessing "
            "options); `sb3`: SB3 DQN over its AtariWrapper. Final evaluation score (1 full "
            "game, greedy; noise at this budget) in the per-run lines.",
        ]
        for game in runs.values():
            for lib in libs:
                for r in game.get(lib, {}).values():
                    if r.get("curve"):
                        r["note"] = f"final score {r['curve'][-1][2]:.0f}"
    else:
        title = f"PPO: rlstash vs SB3 vs CleanRL ppo_atari_envpool.py ({started})"
        intro = head + [
            "",
            "Settings (CleanRL's ppo_atari_envpool.py defaults): `"
            + json.dumps(SETTINGS)
            + "` (vf_coef 0.25 = CleanRL's 0.5 x its 0.5 factor). `rlstash`: `rlstash train "
            "--algo ppo` over rlstash's process pool of gymnasium/ALE envs (rlstash refuses "
            "`--env-backend envpool` for PPO: PPO needs same-step autoreset); `sb3`: SB3 PPO "
            "CnnPolicy over make_atari_env (DummyVecEnv) + VecFrameStack(4); `cleanrl`: "
            f"`cleanrl/{CLEANRL_SCRIPT}` at vwxyzjn/cleanrl {commit}, unchanged, "
            "`--env-id <Game>-v5 --total-timesteps B --seed S`, `OMP_NUM_THREADS=1`; its wall "
            "clock is its own last `SPS:` line, its CPU the whole process (start-up "
            "included). CleanRL's envs are EnvPool's defaults (stacks of 4 made by EnvPool, "
            "no sticky actions), the others' rlstash's/SB3's Atari preprocessing (sticky 0.25).",
        ]
    lines = speed_section(title, intro, runs, libs, "sb3")
    out = HERE / "results" / "learn_atari.md"
    append_section(out, lines)
    return out
