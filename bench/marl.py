#!/usr/bin/env python3
"""BenchMARL vs rlstash on VMAS (``bench/results/marl.md``), run in ``.venv-marl``
(``bench/setup_marl.py``: benchmarl 1.5.2, torchrl 0.11.1, tensordict 0.11.0, vmas 1.5.2 over
torch 2.13.0 CPU).

    python3 bench/marl.py collect                     # env steps/s: VMAS alone, rlstash, TorchRL
    python3 bench/marl.py learn --seeds 0 1 --frames 60000 --task navigation --algo mappo
    python3 bench/marl.py report                      # the table from bench/results/marl-*.json

``collect``: VMAS navigation at 1,024 envs x 3 agents, uniform random actions, same-step resets
of ended envs, rounds interleaved (VMAS stepped by hand, rlstash's MultiAgentCollector into a
MultiAgentRollout, TorchRL's SyncDataCollector over VmasEnv), medians; bytes per env step of
rlstash's rollout vs TorchRL's collected batch (obs and next obs per agent).

``learn``: one process per (side, seed); per seed the two sides run side by side (same
machine load), seeds one after the other; both with BenchMARL's defaults (6,000 frames per batch from 10 envs, minibatch 400, 45
passes, lr 5e-5, [256, 256] tanh MLPs, tanh-normal, shared parameters; rlstash without the
agent-id input, which BenchMARL does not have), one torch thread each, evaluation every 12,000
frames (deterministic, 10 episodes; BenchMARL also evaluates after its first batch). Training
seconds exclude evaluation on both sides (BenchMARL: wall time minus the time from its last
train step to the end of each evaluation).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from setup_marl import ensure_marl_venv  # noqa: E402

RESULTS = HERE / "results"
TASKS = {"navigation": dict(n_agents=3), "balance": dict(n_agents=4)}


# --- collection --------------------------------------------------------------------------------


def _vmas_alone(envs: int, steps: int) -> float:
    import torch
    import vmas

    env = vmas.make_env("navigation", num_envs=envs, seed=0, max_steps=100,
                        terminated_truncated=True, n_agents=3)  # fmt: skip
    env.reset(seed=0)
    n = env.n_agents
    t0 = time.perf_counter()
    for _ in range(steps):
        acts = [torch.rand(envs, 2) * 2 - 1 for _ in range(n)]
        _, _, term, trunc, _ = env.step(acts)
        done = term | trunc
        ended = int(done.sum())
        if ended == envs:
            env.reset()
        elif ended:
            for i in done.nonzero().flatten().tolist():
                env.reset_at(i, return_observations=False)
            env.get_from_scenario(True, False, False, False)
    return envs * steps / (time.perf_counter() - t0)


class _Random:
    def act(self, obs, action_mask=None, deterministic=False):  # noqa: ANN001, ANN201
        import torch

        a = torch.rand(*obs.shape[:2], 2) * 2 - 1
        return a, a, torch.zeros(obs.shape[:2])

    def values(self, obs, state=None):  # noqa: ANN001, ANN201
        return obs.new_zeros(obs.shape[:2])


def _rlstash(envs: int, steps: int) -> tuple[float, int]:
    from rlstash.collect.multiagent import MultiAgentCollector
    from rlstash.envs.vmas import VmasVectorEnv
    from rlstash.storage.marl_rollout import MultiAgentRollout

    env = VmasVectorEnv("navigation", envs, seed=0, max_steps=100, n_agents=3)
    rollout = MultiAgentRollout(steps, envs, 3, env.observation_spaces["agents"].shape[0], (2,))
    collector = MultiAgentCollector(env, seed=0)
    t0 = time.perf_counter()
    collector.collect(_Random(), rollout)
    rate = envs * steps / (time.perf_counter() - t0)
    env.close()
    return rate, rollout.nbytes // (steps * envs)


def _torchrl(envs: int, steps: int) -> tuple[float, int]:
    from torchrl.collectors import SyncDataCollector
    from torchrl.envs.libs.vmas import VmasEnv

    env = VmasEnv("navigation", num_envs=envs, seed=0, max_steps=100, n_agents=3,
                  continuous_actions=True)  # fmt: skip
    frames = envs * steps
    col = SyncDataCollector(env, None, frames_per_batch=frames, total_frames=2 * frames)
    it = iter(col)
    next(it)  # the collector's first batch includes its set-up: timed is the second
    t0 = time.perf_counter()
    batch = next(it)
    rate = frames / (time.perf_counter() - t0)
    nbytes = sum(v.numel() * v.element_size() for v in batch.values(True, True))
    col.shutdown()
    return rate, nbytes // frames


def cmd_collect(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    rates: dict[str, list[float]] = {"vmas": [], "rlstash": [], "torchrl": []}
    sizes = {}
    for r in range(args.rounds):
        rates["vmas"].append(_vmas_alone(args.envs, args.steps))
        rate, sizes["rlstash"] = _rlstash(args.envs, args.steps)
        rates["rlstash"].append(rate)
        rate, sizes["torchrl"] = _torchrl(args.envs, args.steps)
        rates["torchrl"].append(rate)
        print(f"round {r}: " + ", ".join(f"{k} {v[-1]:,.0f}" for k, v in rates.items()), flush=True)
    from rlstash.storage.marl_rollout import naive_bytes_per_step

    out = {"envs": args.envs, "steps": args.steps, "rounds": args.rounds, "rates": rates,
           "median": {k: statistics.median(v) for k, v in rates.items()},
           "bytes_per_env_step": {**sizes, "naive": naive_bytes_per_step(3, 18, 2)}}  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "marl-collect.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(out["median"]), out["bytes_per_env_step"])


# --- learning ----------------------------------------------------------------------------------


CURVE: list[
    dict
] = []  # BenchMARL's evaluations, appended by its callback (picklable: module level)
_CLOCK = {"t0": 0.0, "eval": 0.0, "last_train": 0.0}


def _curve_callback():  # noqa: ANN202
    """A BenchMARL callback recording (frames, training seconds, evaluation reward)."""
    from benchmarl.experiment import Callback

    global _Curve
    if "_Curve" not in globals():

        class _Curve(Callback):
            def on_setup(self) -> None:
                _CLOCK["t0"] = time.perf_counter()

            def on_train_end(self, training_td, group):  # noqa: ANN001, ANN201
                _CLOCK["last_train"] = time.perf_counter()

            def on_evaluation_end(self, rollouts):  # noqa: ANN001, ANN201
                now = time.perf_counter()
                if self.experiment.total_frames > 0:
                    _CLOCK["eval"] += now - _CLOCK["last_train"]
                rewards = [float(r.get(("next", "agents", "reward")).sum(0).mean())
                           for r in rollouts]  # fmt: skip
                CURVE.append({"frames": self.experiment.total_frames,
                              "train_seconds": now - _CLOCK["t0"] - _CLOCK["eval"],
                              "eval_reward": statistics.fmean(rewards)})  # fmt: skip

        _Curve.__qualname__ = "_Curve"
        globals()["_Curve"] = _Curve
    return _Curve()


def _benchmarl(task: str, algo: str, seed: int, frames: int, workdir: Path) -> list[dict]:
    import torch
    from benchmarl.algorithms import IppoConfig, MappoConfig
    from benchmarl.environments import VmasTask
    from benchmarl.experiment import Experiment, ExperimentConfig
    from benchmarl.models.mlp import MlpConfig

    torch.set_num_threads(1)
    exp_cfg = ExperimentConfig.get_from_yaml()
    exp_cfg.max_n_frames = frames
    exp_cfg.evaluation_interval = 12_000
    exp_cfg.loggers = ["csv"]
    exp_cfg.render = False
    exp_cfg.create_json = False
    exp_cfg.save_folder = str(workdir)
    exp_cfg.checkpoint_at_end = False
    task_cfg = getattr(VmasTask, task.upper()).get_from_yaml()
    algo_cfg = (MappoConfig if algo == "mappo" else IppoConfig).get_from_yaml()
    model = MlpConfig.get_from_yaml()
    exp = Experiment(task=task_cfg, algorithm_config=algo_cfg, model_config=model,
                     critic_model_config=MlpConfig.get_from_yaml(), seed=seed,
                     config=exp_cfg, callbacks=[_curve_callback()])  # fmt: skip
    exp.run()
    return CURVE


def _rlstash_learn(task: str, algo: str, seed: int, frames: int, workdir: Path) -> list[dict]:
    import csv

    from rlstash.train.config import TrainConfig
    from rlstash.train.loop import train

    cfg = TrainConfig(algo=algo, env=f"vmas/{task}", steps=frames, seed=seed, device="cpu",
                      eval_every=12_000, eval_episodes=10, checkpoint_every=10**9,
                      run_dir=str(workdir), name=f"{algo}-{task}-s{seed}", quiet=True,
                      agent={"agent_id": False})  # fmt: skip
    result = train(cfg)
    path = result.run_dir / "eval.csv"
    rows = list(csv.DictReader(path.open())) if path.exists() else []
    return [{"frames": int(r["step"]), "train_seconds": float(r["train_seconds"]),
             "eval_reward": float(r["return_mean"])} for r in rows]  # fmt: skip


def cmd_one(args: argparse.Namespace) -> None:
    """One (side, seed) run in this process; its curve to --out."""
    import tempfile

    fn = _benchmarl if args.side == "benchmarl" else _rlstash_learn
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        curve = fn(args.task, args.algo, args.seed, args.frames, Path(tmp))
        wall = time.perf_counter() - t0
    Path(args.out).write_text(json.dumps({"side": args.side, "task": args.task, "algo": args.algo,
                                          "seed": args.seed, "frames": args.frames,
                                          "wall_seconds": wall, "curve": curve}))  # fmt: skip


def cmd_learn(args: argparse.Namespace) -> None:
    """Per seed, BenchMARL and rlstash side by side (two processes started together, so both
    see the same machine load), seeds one after the other."""
    RESULTS.mkdir(exist_ok=True)
    for seed in args.seeds:
        procs = []
        for side in ("benchmarl", "rlstash"):
            out = RESULTS / f"marl-{args.algo}-{args.task}-{side}-s{seed}.json"
            cmd = [sys.executable, __file__, "one", "--side", side, "--task", args.task,
                   "--algo", args.algo, "--seed", str(seed), "--frames", str(args.frames),
                   "--out", str(out)]  # fmt: skip
            print(" ".join(cmd), flush=True)
            procs.append(subprocess.Popen(cmd))
        for proc in procs:
            proc.wait()


def cmd_report(args: argparse.Namespace) -> None:
    """Print the learning curves and the collection numbers as markdown tables."""
    runs = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("marl-*-s*.json"))]
    lines = ["| side | algo | task | seed | frames | train s | eval reward |", "|---" * 7 + "|"]
    for r in runs:
        for c in r["curve"]:
            lines.append(f"| {r['side']} | {r['algo']} | {r['task']} | {r['seed']} | "
                         f"{c['frames']:,} | {c['train_seconds']:.0f} | {c['eval_reward']:.3f} |")  # fmt: skip
    for r in runs:
        lines.append(f"\n{r['side']} s{r['seed']}: {r['frames']:,} frames, whole run "
                     f"{r['wall_seconds']:.0f} s wall")  # fmt: skip
    path = RESULTS / "marl-collect.json"
    if path.exists():
        c = json.loads(path.read_text())
        m = c["median"]
        lines += ["", f"collection, VMAS navigation {c['envs']:,} envs x 3 agents, {c['steps']} "
                  f"steps, median of {c['rounds']} rounds (env steps/s):", "",
                  "| VMAS alone | rlstash | TorchRL SyncDataCollector | rlstash / VMAS | "
                  "rlstash / TorchRL |", "|---|---|---|---|---|",
                  f"| {m['vmas']:,.0f} | {m['rlstash']:,.0f} | {m['torchrl']:,.0f} | "
                  f"{m['rlstash'] / m['vmas']:.2f}x | {m['rlstash'] / m['torchrl']:.2f}x |",
                  "", f"bytes per env step: {c['bytes_per_env_step']}"]  # fmt: skip
    print("\n".join(lines))


def main() -> None:
    ensure_marl_venv(__file__)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--envs", type=int, default=1024)
    c.add_argument("--steps", type=int, default=100)
    c.add_argument("--rounds", type=int, default=3)
    c.set_defaults(fn=cmd_collect)
    for name, fn in (("learn", cmd_learn), ("one", cmd_one)):
        s = sub.add_parser(name)
        s.add_argument("--task", default="navigation", choices=sorted(TASKS))
        s.add_argument("--algo", default="mappo", choices=("mappo", "ippo"))
        s.add_argument("--frames", type=int, default=60_000)
        if name == "learn":
            s.add_argument("--seeds", type=int, nargs="+", default=[0])
        else:
            s.add_argument("--side", required=True, choices=("benchmarl", "rlstash"))
            s.add_argument("--seed", type=int, default=0)
            s.add_argument("--out", required=True)
        s.set_defaults(fn=fn)
    r = sub.add_parser("report")
    r.set_defaults(fn=cmd_report)
    args = p.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
