"""The learning parts of bench/learn.py: each side's settings and the worker that runs one side
for one seed (in a fresh process: bench/learn.py spawns it).

Two groups of parts:

- ``preset`` (bench/results/learn.md): each side's preset, what a user gets: rlstash's
  ``rlstash train`` preset against SB3 with the RL Zoo's settings;
- ``same`` (bench/results/learn_same.md): identical networks and hyperparameters on both sides,
  what the implementation is worth.

A part's two sides have run ids (default ``<lib>-<part>``). Where two parts run SB3 with the
same settings (``dqn`` and ``dqn_same``: the RL Zoo's DQN; ``td3`` and ``td3_same``: the Zoo's
TD3) they share the SB3 runs: one run per seed serves both tables.
"""

from __future__ import annotations

import contextlib
import csv
import io
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

# rl-baselines3-zoo hyperparams/{dqn,sac,td3,ppo}.yml (SB3 defaults for everything else).
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
ZOO_SAC = {"learning_rate": 1e-3}
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
# CartPole-v1 (lin_X: X * progress_remaining); SB3's MlpPolicy: separate (64, 64) tanh policy
# and value nets, orthogonal init, Adam eps 1e-5 -- rlstash's preset is the same, so
# "identical settings" and "each side's preset" are one comparison here.
ZOO_PPO = {
    "n_envs": 8, "n_steps": 32, "batch_size": 256, "gae_lambda": 0.8, "gamma": 0.98,
    "n_epochs": 20, "ent_coef": 0.0, "learning_rate": "lin_0.001", "clip_range": "lin_0.2",
}  # fmt: skip

# HalfCheetah-v3 in hyperparams/ppo.yml (the Zoo's tuned MuJoCo entry; n_timesteps 1e6, here
# the benchmark's 300,000): VecNormalize with SB3's defaults (obs and reward, clip 10) and, as
# the Zoo does, the algorithm's gamma; constant learning rate and clip range. rlstash's
# HalfCheetah-v5 preset is this entry (rlstash/agents/ppo.py: ZOO_HALF_CHEETAH).
ZOO_PPO_CHEETAH = {
    "n_envs": 1, "normalize": {"norm_obs": True, "norm_reward": True, "gamma": 0.98},
    "n_steps": 512, "batch_size": 64, "gamma": 0.98, "learning_rate": 2.0633e-05,
    "ent_coef": 0.000401762, "clip_range": 0.1, "n_epochs": 20, "gae_lambda": 0.92,
    "max_grad_norm": 0.8, "vf_coef": 0.58096,
    "policy_kwargs": {"log_std_init": -2.0, "ortho_init": False, "activation_fn": "relu",
                      "net_arch": {"pi": [256, 256], "vf": [256, 256]}},
}  # fmt: skip
# CleanRL's ppo_continuous_action (rlstash's HalfCheetah-v5 preset until 2026-11-24, now the
# Zoo's entry) on both sides: pinned in full on the rlstash side (every setting the runs depend
# on, eager as SB3), and in SB3's terms: one env, 2048 steps
# per rollout, minibatch 64, 10 epochs, lr 3e-4 annealed linearly to 0, clip 0.2 and value clip
# 0.2, advantage normalisation, gamma 0.99, lambda 0.95, no entropy bonus, vf_coef 0.5, grad norm
# 0.5, VecNormalize of observations and rewards (gamma 0.99, clip 10), separate (64, 64) tanh
# policy and value nets with orthogonal init, state-independent log std starting at 0, Adam eps
# 1e-5 (SB3's default for PPO). Left different: rlstash folds a rollout into its observation
# statistics after the rollout, VecNormalize at every step.
SAME_PPO_CHEETAH_RLSTASH = {
    "num_envs": 1, "rollout_steps": 2048, "minibatch_size": 64, "n_epochs": 10,
    "learning_rate": 3e-4, "anneal_lr": True, "anneal_clip_range": False, "clip_range": 0.2,
    "clip_range_vf": 0.2, "normalize_advantage": True, "gamma": 0.99, "gae_lambda": 0.95,
    "ent_coef": 0.0, "vf_coef": 0.5, "max_grad_norm": 0.5, "target_kl": None,
    "norm_obs": True, "norm_reward": True, "clip_obs": 10.0, "clip_reward": 10.0,
    "net_arch": [64, 64], "activation": "tanh", "ortho_init": True, "log_std_init": 0.0,
    "bound": "clip", "adam_eps": 1e-5, "compile": False,
}  # fmt: skip
SAME_PPO_CHEETAH = {
    "n_envs": 1, "normalize": {"norm_obs": True, "norm_reward": True, "gamma": 0.99,
                               "clip_obs": 10.0, "clip_reward": 10.0},
    "n_steps": 2048, "batch_size": 64, "n_epochs": 10, "learning_rate": "lin_3e-4",
    "clip_range": 0.2, "clip_range_vf": 0.2, "gamma": 0.99, "gae_lambda": 0.95,
    "ent_coef": 0.0, "vf_coef": 0.5, "max_grad_norm": 0.5,
    "policy_kwargs": {"log_std_init": 0.0, "ortho_init": True, "activation_fn": "tanh",
                      "net_arch": {"pi": [64, 64], "vf": [64, 64]}},
}  # fmt: skip
CHEETAH_RETURNS_AT = (100_000, 200_000, 300_000)

# The zoo's DQN settings in rlstash's terms. SB3's target_update_interval counts env steps
# (10): with bursts of 128 updates every 256 env steps the target is copied from the online net
# while collecting, so it equals the online net at the start of each burst and stays frozen
# through it -- rlstash's target_update_interval counts updates: 128. Left different: rlstash's
# DQN is double DQN (SB3's takes the max over the target net); no setting changes either.
SAME_DQN = {
    "learning_rate": 2.3e-3, "lr_schedule": "constant", "batch_size": 64,
    "buffer_size": 100_000, "learning_starts": 1000, "gamma": 0.99, "n_steps": 1,
    "target_update_interval": 128, "train_freq": 256, "gradient_steps": 128,
    "exploration_fraction": 0.16, "exploration_final_eps": 0.04, "net_arch": [256, 256],
    "total_steps": 50_000, "compile": False,
}  # fmt: skip
# The identical-settings parts run rlstash eager (compile=False, as SB3): the agents' default
# compile="auto" may compile in a long run; the *_compile parts measure compiled updates.
# SB3's SAC defaults are rlstash's (lr 3e-4, batch 256, (256, 256), tau 0.005, auto alpha,
# learning_starts 100, one update per step); the buffer holds the whole run on both sides.
# Left different: SB3 acts uniformly at random for its first 100 steps, rlstash with its policy.
SAME_SAC = {"buffer_size": 15_000, "compile": False}
# SAC Hopper-v5 (issue 26's "medium" policy; a termination/truncation defect shows only where
# episodes end early, which HalfCheetah's never do): SB3's SAC defaults on both sides, nothing
# set (1M buffer, learning_starts 100, one update per env step), rlstash as `rlstash train
# --algo sac --env Hopper-v5` runs it (compile="auto": eager, compiled after 60 s of updates;
# tests/agents/test_compiled.py: the compiled update equals the eager one). The rlstash run is
# kept in bench/.work/learn_runs/ with a checkpoint at each evaluation (bench/keep_checkpoint.py
# copies the one of a good evaluation aside). Threshold: a third of D4RL's Hopper
# expert return (3234.3 / 3), the "medium" target of bench/make_offline_data.py.
SAC_HOPPER_THRESHOLD = 1078.1
# The zoo's TD3 in rlstash's terms: Pendulum's episodes are 200 steps (time limit, no early
# termination), so SB3's train_freq (1, "episode") with gradient_steps -1 is 200 updates every
# 200 env steps; 10,000 uniformly random steps before learning (SB3: learning_starts); batch
# 256, tau 0.005, policy delay 2, target noise 0.2 clipped at 0.5: the defaults of both.
SAME_TD3 = {
    "learning_rate": 1e-3, "gamma": 0.98, "buffer_size": 200_000, "learning_starts": 10_000,
    "random_steps": 10_000, "train_freq": 200, "gradient_steps": 200, "batch_size": 256,
    "exploration_noise": 0.1, "net_arch": [400, 300], "compile": False,
}  # fmt: skip

# part -> algo, env, threshold (None: no threshold, seconds and returns only), budget (env
# steps), each side's settings (None: rlstash's preset) and run id, group, evaluation schedule;
# update_rate: (obs dim, act dim) of the env, to report updates/s against the FLOP limit.
TASKS: dict[str, dict[str, Any]] = {
    "dqn": {"algo": "dqn", "env": "CartPole-v1", "threshold": 475.0, "budget": 50_000,
            "rlstash": None, "sb3": ZOO_DQN, "sb3_id": "sb3-dqn_zoo", "group": "preset"},
    "sac": {"algo": "sac", "env": "Pendulum-v1", "threshold": -200.0, "budget": 20_000,
            "rlstash": None, "sb3": ZOO_SAC, "group": "preset"},
    "ppo": {"algo": "ppo", "env": "CartPole-v1", "threshold": 475.0, "budget": 100_000,
            "rlstash": None, "sb3": ZOO_PPO, "group": "preset", "goal_time": 0.5},
    "td3": {"algo": "td3", "env": "Pendulum-v1", "threshold": -200.0, "budget": 20_000,
            "rlstash": None, "sb3": ZOO_TD3, "sb3_id": "sb3-td3_zoo", "group": "preset",
            "update_rate": (3, 1)},
    "dqn_same": {"algo": "dqn", "env": "CartPole-v1", "threshold": 475.0, "budget": 50_000,
                 "rlstash": SAME_DQN, "sb3": ZOO_DQN, "sb3_id": "sb3-dqn_zoo",
                 "group": "same"},
    "sac_same": {"algo": "sac", "env": "HalfCheetah-v5", "threshold": None, "budget": 15_000,
                 "rlstash": SAME_SAC, "sb3": {"buffer_size": 15_000}, "group": "same",
                 "eval_every": 5000, "eval_episodes": 5},
    "td3_same": {"algo": "td3", "env": "Pendulum-v1", "threshold": -200.0, "budget": 20_000,
                 "rlstash": SAME_TD3, "sb3": ZOO_TD3, "sb3_id": "sb3-td3_zoo",
                 "group": "same", "update_rate": (3, 1)},
    # PPO HalfCheetah-v5: rlstash's preset (the Zoo's entry) against the Zoo; CleanRL's
    # settings on both sides
    "ppo_cheetah": {"algo": "ppo", "env": "HalfCheetah-v5", "threshold": None,
                    "budget": 300_000, "rlstash": None, "sb3": ZOO_PPO_CHEETAH,
                    "sb3_id": "sb3-ppo_cheetah_zoo", "group": "preset", "eval_every": 10_000,
                    "eval_episodes": 5, "returns_at": CHEETAH_RETURNS_AT},
    "ppo_cheetah_same": {"algo": "ppo", "env": "HalfCheetah-v5", "threshold": None,
                         "budget": 300_000, "rlstash": SAME_PPO_CHEETAH_RLSTASH,
                         "sb3": SAME_PPO_CHEETAH, "group": "same",
                         "eval_every": 10_000, "eval_episodes": 5,
                         "returns_at": CHEETAH_RETURNS_AT},
    "sac_hopper": {"algo": "sac", "env": "Hopper-v5", "threshold": SAC_HOPPER_THRESHOLD,
                   "budget": 100_000, "rlstash": {}, "sb3": {}, "group": "same",
                   "eval_every": 5000, "eval_episodes": 10, "keep_run": True},
    # End to end with compiled updates (issue 15): rlstash with compile=True against the SB3
    # runs of the eager part (same settings, shared runs); reported as env steps/s.
    "ppo_compile": {"algo": "ppo", "env": "CartPole-v1", "threshold": 475.0, "budget": 100_000,
                    "rlstash": {"compile": True}, "sb3": ZOO_PPO, "sb3_id": "sb3-ppo",
                    "group": "same", "eager": "ppo"},
    "sac_same_compile": {"algo": "sac", "env": "HalfCheetah-v5", "threshold": None,
                         "budget": 15_000, "rlstash": {**SAME_SAC, "compile": True},
                         "sb3": {"buffer_size": 15_000}, "sb3_id": "sb3-sac_same",
                         "group": "same", "eval_every": 5000, "eval_episodes": 5,
                         "eager": "sac_same"},
}  # fmt: skip
# What `rlstash train` says once with compile=True (rlstash/train/runlog.py::note_compile).
COMPILED = re.compile(r"compiled the update in ([0-9.]+) s")
EVAL_EVERY = 1000
RUNS = Path(__file__).resolve().parent / ".work" / "learn_runs"  # parts with keep_run
EVAL_EPISODES = 10
LIBS = ("rlstash", "sb3")


def run_id(part: str, lib: str) -> str:
    """The id under which ``lib``'s runs of ``part`` are kept (shared by parts that run that
    side with the same settings)."""
    return TASKS[part].get(f"{lib}_id", f"{lib}-{part}")


def schedule(part: str) -> tuple[int, int]:
    """(env steps between evaluations, episodes per evaluation) of ``part``."""
    task = TASKS[part]
    return task.get("eval_every", EVAL_EVERY), task.get("eval_episodes", EVAL_EPISODES)


def run_rlstash(part: str, seed: int, budget: int) -> dict:
    """One rlstash run (its preset, or the part's settings); the curve comes from eval.csv."""
    from rlstash.train.config import LOOP_SETTINGS
    from rlstash.train.loop import TrainConfig, train

    task = TASKS[part]
    eval_every, eval_episodes = schedule(part)
    overrides = dict(task["rlstash"] or {})
    loop = {k: v for k, v in overrides.items() if k in LOOP_SETTINGS}
    agent = {k: v for k, v in overrides.items() if k not in LOOP_SETTINGS}
    kept = RUNS / f"{part}-s{seed}" if task.get("keep_run") else None
    if kept is not None:  # a fresh run each time (a run directory holds one run)
        shutil.rmtree(kept, ignore_errors=True)
        kept.mkdir(parents=True)
    where: Any = contextlib.nullcontext(str(kept)) if kept else None
    with where or tempfile.TemporaryDirectory(prefix="rlstash-learn-") as tmp:
        cfg = TrainConfig(
            algo=task["algo"], env=task["env"], steps=budget, seed=seed, run_dir=tmp,
            name="run", eval_every=eval_every, eval_episodes=eval_episodes,
            threshold=task["threshold"], patience=10**9, quiet=True, device="cpu",
            checkpoint_every=eval_every if kept else 10 * budget, agent=agent, **loop,
        )  # fmt: skip
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()) as out:  # what the trainer says
            result = train(cfg)
        wall = time.perf_counter() - start
        rows = Path(tmp) / "run" / "progress.csv"  # its last row: updates so far
        with open(rows) if rows.exists() else contextlib.nullcontext([]) as fh:
            last = list(csv.DictReader(fh))[-1:]
        progress = [float(last[0]["updates"]), float(last[0]["train_seconds"])] if last else None
        evals = Path(tmp) / "run" / "eval.csv"  # absent when the budget ends before eval_every
        with open(evals) if evals.exists() else contextlib.nullcontext([]) as fh:
            curve = [
                [int(r["step"]), float(r["train_seconds"]), float(r["return_mean"])]
                for r in csv.DictReader(fh)
            ]
    settings = overrides or _preset(task["algo"], task["env"]) or "defaults (no env preset)"
    said = COMPILED.search(out.getvalue())
    return {"curve": curve, "steps": result.steps, "train_seconds": result.train_seconds,
            "wall_seconds": wall, "settings": settings, "updates_at": progress,
            "compile_seconds": float(said.group(1)) if said else None,
            **({"run_dir": str(kept / "run")} if kept else {})}  # fmt: skip


def _preset(algo: str, env: str) -> dict:
    from rlstash.train.algos import ALGOS

    preset = ALGOS[algo].presets.get(env, {})
    return {k: list(v) if isinstance(v, tuple) else v for k, v in preset.items()}


def run_sb3(part: str, seed: int, budget: int) -> dict:
    """One SB3 run with the part's settings; evaluation time is excluded from the clock."""
    task = TASKS[part]
    log = RUNS / f"{part}-sb3-s{seed}.csv" if task.get("keep_run") else None
    clock = _eval_clock(task["env"], seed, *schedule(part), log=log)
    model = _sb3_ppo(task, seed) if task["algo"] == "ppo" else _sb3_off_policy(task, seed)
    start = time.perf_counter()
    model.learn(total_timesteps=budget, callback=clock)
    wall = time.perf_counter() - start
    train_s = wall - clock.excluded
    return {"curve": clock.curve, "steps": model.num_timesteps, "train_seconds": train_s,
            "wall_seconds": wall, "settings": task["sb3"] or "defaults",
            "updates_at": [model._n_updates, train_s]}  # fmt: skip


def _eval_clock(
    env_id: str, seed: int, eval_every: int, episodes: int, log: Path | None = None
) -> Any:
    """An SB3 callback: every ``eval_every`` env steps stop the clock, evaluate ``episodes``
    deterministic episodes on separate envs, restart the clock. With ``log``, each evaluation
    is also appended there as it happens (step,train_seconds,return_mean: a long run's curve
    so far, as rlstash's eval.csv)."""
    import gymnasium as gym
    import numpy as np
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize, sync_envs_normalization

    eval_env: Any = DummyVecEnv([lambda: gym.make(env_id) for _ in range(episodes)])

    class EvalClock(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.curve: list[list[float]] = []
            self.excluded = 0.0
            self.start = 0.0

        def _on_training_start(self) -> None:
            nonlocal eval_env
            if isinstance(self.training_env, VecNormalize):  # evaluate on frozen statistics
                eval_env = VecNormalize(eval_env, training=False, norm_reward=False)
            self.start = time.perf_counter()

        def _on_step(self) -> bool:
            if self.num_timesteps % eval_every == 0:
                t0 = time.perf_counter()
                train_s = t0 - self.start - self.excluded
                eval_env.seed(seed + 10_000 + len(self.curve))
                if isinstance(eval_env, VecNormalize):  # the training env's obs statistics now
                    sync_envs_normalization(self.training_env, eval_env)
                returns, _ = evaluate_policy(
                    self.model, eval_env, n_eval_episodes=episodes, deterministic=True,
                    return_episode_rewards=True,
                )  # fmt: skip
                self.curve.append([self.num_timesteps, train_s, float(np.mean(returns))])
                if log is not None:
                    log.parent.mkdir(parents=True, exist_ok=True)
                    with open(log, "a" if len(self.curve) > 1 else "w") as fh:
                        fh.write("step,train_seconds,return_mean\n" if len(self.curve) == 1 else "")
                        fh.write(",".join(map(str, self.curve[-1])) + "\n")
                self.excluded += time.perf_counter() - t0
            return True

    return EvalClock()


def _sb3_off_policy(task: dict, seed: int) -> Any:
    import gymnasium as gym
    import numpy as np
    from stable_baselines3 import DQN, SAC, TD3
    from stable_baselines3.common.noise import NormalActionNoise

    cls = {"dqn": DQN, "sac": SAC, "td3": TD3}[task["algo"]]
    settings = dict(task["sb3"])
    env = gym.make(task["env"])
    if "noise_std" in settings:
        std, dims = settings.pop("noise_std"), env.action_space.shape
        settings["action_noise"] = NormalActionNoise(np.zeros(dims), std * np.ones(dims))
    if isinstance(settings.get("train_freq"), list):
        settings["train_freq"] = tuple(settings["train_freq"])
    return cls("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **settings)


def _sb3_ppo(task: dict, seed: int) -> Any:
    """SB3's PPO with the part's settings (its n_envs DummyVecEnv, lin_ schedules, VecNormalize
    where ``normalize`` gives its arguments, activations by name)."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize
    from torch import nn

    kw = dict(task["sb3"])
    env = make_vec_env(task["env"], n_envs=kw.pop("n_envs"), seed=seed)
    if "normalize" in kw:
        env = VecNormalize(env, **kw.pop("normalize"))
    for key in ("learning_rate", "clip_range"):
        if isinstance(kw.get(key), str) and kw[key].startswith("lin_"):
            start = float(kw[key][4:])
            kw[key] = lambda progress, start=start: progress * start
    policy_kwargs = dict(kw.pop("policy_kwargs", {}))
    if "activation_fn" in policy_kwargs:
        policy_kwargs["activation_fn"] = {"tanh": nn.Tanh, "relu": nn.ReLU}[
            policy_kwargs["activation_fn"]
        ]
    return PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0, policy_kwargs=policy_kwargs,
               **kw)  # fmt: skip


def worker(task: dict) -> dict:
    """Run one spawned task in this (fresh) process with one torch thread."""
    import torch

    torch.set_num_threads(1)
    if task["part"] in ("contextual", "ppo_contextual"):
        import contextual

        fn = contextual.run if task["part"] == "contextual" else contextual.run_ppo
        return fn(**task["args"])
    if task["part"] == "updates":
        import updates

        return updates.measure(task["name"])
    fn = run_rlstash if task["lib"] == "rlstash" else run_sb3
    if not TASKS[task["part"]].get("update_rate"):
        cpu = time.process_time()  # this process's CPU seconds (evaluations included)
        out = fn(task["part"], task["seed"], task["budget"])
        return {**out, "cpu_seconds": round(time.process_time() - cpu, 1)}
    import updates  # the matmul rate of this process, before and after the run

    before = updates.matmul_flops()
    out = fn(task["part"], task["seed"], task["budget"])
    return {**out, "matmul_flops": [before, updates.matmul_flops()]}
