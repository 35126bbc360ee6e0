#!/usr/bin/env python3
"""Learning on a PettingZoo MPE task: rlstash IPPO/MAPPO beside SB3 PPO with SuperSuit's
parameter-sharing wrappers, identical settings, equal frames.

    python3 bench/marl_pz_learn.py                     # appends to bench/results/marl_pz.md
    python3 bench/marl_pz_learn.py --seeds 0 1 --frames 102400 --sides ippo sb3 mappo

The task: MPE ``simple_spread_v3`` (mpe2; 3 agents, 5 discrete actions, 25-step episodes,
local_ratio 0.5), 16 envs stepped in-process on each side.

* rlstash: ``rlstash train --algo ippo|mappo --env pettingzoo:mpe2.simple_spread_v3 --workers 0``
  (parameters shared by the 3 agents, no agent id, as SuperSuit's parameter sharing; IPPO's
  critic sees the agent's own observation, MAPPO's the env's global state).
* SB3: ``PPO("MlpPolicy", concat_vec_envs_v1(pettingzoo_env_to_vec_env_v1(env), 16,
  num_cpus=0, base_class="stable_baselines3"))``: each agent is one row of a single-agent
  vector env of 48 rows, one shared policy.

Identical settings (:data:`SETTINGS`): 128 steps x 16 envs per rollout (2,048 env steps =
6,144 agent steps), 10 passes of minibatches of 256 env steps (768 agent steps), Adam lr 3e-4
eps 1e-5, gamma 0.99, GAE lambda 0.95, clip 0.2, entropy 0.01, value coefficient 0.5, gradient
clip 0.5, separate [64, 64] tanh actor and critic with torch's default init (SB3:
``ortho_init=False``), no advantage normalisation (SB3: ``normalize_advantage=False``), one
torch thread. What still differs: SB3 steps one Adam over actor and critic and clips their
joint gradient norm, rlstash one Adam and one clip each; SuperSuit's SB3 wrapper reports MPE's
25-step time limit as a plain done (SB3 then does not bootstrap it), rlstash bootstraps a
truncated episode with V(final observation). Frames are env steps (each with all its
agents); SB3 counts agent steps, so it is given 3x the timesteps. Evaluation: deterministic
(argmax), 10 episodes on fresh envs every ``--eval-every`` frames, the return of an episode
being its agents' mean summed reward. Seconds: training only (rlstash: ``train_seconds``; SB3:
the ``learn`` calls), evaluation excluded. Runs alternate sides within each seed.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VENV_PY = HERE / ".work" / "venv-pz-learn" / "bin" / "python"
TASK = "mpe2.simple_spread_v3"
N_AGENTS, N_ENVS, T = 3, 16, 128
SETTINGS = dict(learning_rate=3e-4, adam_eps=1e-5, rollout_steps=T, minibatch_size=256,
                n_epochs=10, gamma=0.99, gae_lambda=0.95, clip_range=0.2, ent_coef=0.01,
                vf_coef=0.5, max_grad_norm=0.5, net_arch=[64, 64], activation="tanh")  # fmt: skip
ENV_KWARGS = dict(N=3, local_ratio=0.5, max_cycles=25, continuous_actions=False)


def _ensure_venv() -> None:
    if Path(sys.prefix).resolve() == VENV_PY.parent.parent.resolve():
        return
    subprocess.check_call(["nice", "-n", "15", sys.executable, str(HERE / "setup_pz_learn.py")])
    os.execv(str(VENV_PY), [str(VENV_PY), str(Path(__file__).resolve()), *sys.argv[1:]])


def run_rlstash(algo: str, seed: int, frames: int, eval_every: int, out: Path) -> dict:
    """One ``rlstash train`` run; its evaluations and training seconds."""
    sets = [*(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in SETTINGS.items()), "share_params=true",
            "agent_id=false", "compile=false"]  # fmt: skip
    cmd = [sys.executable, "-m", "rlstash", "train", "--run-dir", str(out), "--name",
           f"{algo}-s{seed}", "--algo", algo, "--env", f"pettingzoo:{TASK}", "--envs",
           str(N_ENVS), "--workers", "0", "--steps", str(frames), "--seed", str(seed),
           "--env-kwargs", json.dumps(ENV_KWARGS), "--eval-every", str(eval_every),
           "--eval-episodes", "10", "--checkpoint-every", str(frames), "--torch-threads", "1",
           "--quiet"]  # fmt: skip
    for s in sets:
        cmd += ["--set", s]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"rlstash {algo} seed {seed} failed: {done.stderr[-2000:]}")
    rows = list(csv.DictReader((out / f"{algo}-s{seed}" / "eval.csv").open()))
    evals = [(int(r["step"]), float(r["return_mean"])) for r in rows]
    return {"evals": evals, "train_s": float(rows[-1]["train_seconds"]), "wall_s": wall}


def run_sb3(seed: int, frames: int, eval_every: int) -> dict:
    """SB3 PPO over SuperSuit's parameter-sharing vector env; evaluations and the seconds of
    its ``learn`` calls."""
    import numpy as np
    import supersuit as ss
    import torch
    from mpe2 import simple_spread_v3
    from stable_baselines3 import PPO
    from stable_baselines3.common.utils import set_random_seed

    torch.set_num_threads(1)
    env = simple_spread_v3.parallel_env(**ENV_KWARGS)
    env = ss.pettingzoo_env_to_vec_env_v1(env)
    env = ss.concat_vec_envs_v1(env, N_ENVS, num_cpus=0, base_class="stable_baselines3")
    env.venv.reset(seed=seed)  # seeds each copy's RNG (SB3's own env.seed reaches no env here)
    set_random_seed(seed)
    s = SETTINGS
    model = PPO(
        "MlpPolicy", env, learning_rate=s["learning_rate"], n_steps=T,
        batch_size=s["minibatch_size"] * N_AGENTS, n_epochs=s["n_epochs"], gamma=s["gamma"],
        gae_lambda=s["gae_lambda"], clip_range=s["clip_range"], ent_coef=s["ent_coef"],
        vf_coef=s["vf_coef"], max_grad_norm=s["max_grad_norm"], normalize_advantage=False,
        policy_kwargs=dict(net_arch=dict(pi=s["net_arch"], vf=s["net_arch"]),
                           activation_fn=torch.nn.Tanh, ortho_init=False,
                           optimizer_kwargs=dict(eps=s["adam_eps"])),
        seed=None, device="cpu", verbose=0,
    )  # fmt: skip
    evals, train_s, done = [], 0.0, 0
    while done < frames:
        t0 = time.perf_counter()
        model.learn(eval_every * N_AGENTS, reset_num_timesteps=False)
        train_s += time.perf_counter() - t0
        done += eval_every
        evals.append((done, _sb3_eval(model, seed + 10_000 + len(evals), np)))
    env.close()
    return {"evals": evals, "train_s": train_s}


def _sb3_eval(model, seed: int, np) -> float:
    """Mean over 10 episodes of the agents' mean summed reward, deterministic actions."""
    from mpe2 import simple_spread_v3

    env = simple_spread_v3.parallel_env(**ENV_KWARGS)
    returns = []
    for i in range(10):
        obs, _ = env.reset(seed=seed * 100 + i)
        total = dict.fromkeys(env.possible_agents, 0.0)
        while env.agents:
            names = list(obs)
            acts, _ = model.predict(np.stack([obs[a] for a in names]), deterministic=True)
            obs, rew, _, _, _ = env.step({a: int(x) for a, x in zip(names, acts)})
            for a, r in rew.items():
                total[a] += r
        returns.append(sum(total.values()) / len(total))
    env.close()
    return float(np.mean(returns))


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--frames", type=int, default=102_400)
    ap.add_argument("--eval-every", type=int, default=20_480)
    ap.add_argument("--sides", nargs="+", default=["ippo", "sb3"],
                    choices=["ippo", "mappo", "sb3"])  # fmt: skip
    ap.add_argument("--out", type=Path, default=HERE / "results" / "marl_pz.md")
    args = ap.parse_args()
    _ensure_venv()
    load_before = _uptime()
    results: dict[str, list[dict]] = {s: [] for s in args.sides}
    with tempfile.TemporaryDirectory() as tmp:
        for i, seed in enumerate(args.seeds):
            order = args.sides if i % 2 == 0 else list(reversed(args.sides))
            for side in order:
                print(f"[marl_pz_learn] seed {seed}: {side} ...", flush=True)
                if side == "sb3":
                    r = run_sb3(seed, args.frames, args.eval_every)
                else:
                    r = run_rlstash(side, seed, args.frames, args.eval_every, Path(tmp))
                print(f"[marl_pz_learn]   {r['evals'][-1]} in {r['train_s']:.0f} s", flush=True)
                results[side].append(r)
    load_after = _uptime()
    _write(args, results, load_before, load_after)


def _write(args, results: dict, before: str, after: str) -> None:
    import common  # bench/common.py

    steps = sorted({f for r in next(iter(results.values())) for f, _ in r["evals"]})
    lines = [
        "",
        f"## Learning: rlstash IPPO/MAPPO vs SB3 PPO + SuperSuit ({datetime.date.today()})",
        "",
        f"`bench/marl_pz_learn.py --seeds {' '.join(map(str, args.seeds))} --frames "
        f"{args.frames} --eval-every {args.eval_every} --sides {' '.join(args.sides)}` "
        f"(`bench/setup_pz_learn.py`'s venv: pettingzoo 1.27.0, mpe2 1.1.1, supersuit 3.11.0, "
        "stable-baselines3 2.9.2, torch 2.13.0 CPU, one torch thread). MPE `simple_spread_v3`, "
        "16 envs in-process, identical settings (the script's docstring: what still differs). "
        "Evaluation return: deterministic, 10 episodes, agents' mean; per seed, then the "
        "median. Seconds: training only.",
        "",
        f"{common.load_sentence(before, after)} Load before: `{before}`; after: `{after}`.",
        "",
        "| frames | " + " | ".join(f"{s} (seeds)" for s in results) + " |",
        "|---:|" + "---:|" * len(results),
    ]
    for f in steps:
        cells = []
        for runs in results.values():
            vals = [dict(r["evals"]).get(f) for r in runs]
            vals = [v for v in vals if v is not None]
            cells.append(" / ".join(f"{v:.1f}" for v in vals) if vals else "-")
        lines.append(f"| {f:,} | " + " | ".join(cells) + " |")
    lines += ["", "| side | final return (median) | train seconds (median) | frames/s |",
              "|---|---:|---:|---:|"]  # fmt: skip
    for side, runs in results.items():
        final = statistics.median(r["evals"][-1][1] for r in runs)
        secs = statistics.median(r["train_s"] for r in runs)
        lines.append(f"| {side} | {final:.2f} | {secs:.0f} | {args.frames / secs:,.0f} |")
    if "sb3" in results:
        sb3 = statistics.median(r["train_s"] for r in results["sb3"])
        for side in results:
            if side != "sb3":
                mine = statistics.median(r["train_s"] for r in results[side])
                lines.append(f"\n{side} / SB3 training seconds: {mine / sb3:.2f}x")
    with args.out.open("a") as fh:
        fh.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
