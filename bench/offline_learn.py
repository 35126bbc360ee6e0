"""Offline learning comparison (issue 26): rlstash IQL / TD3+BC vs TorchRL's sota-implementations
IQL / TD3+BC on one Minari dataset, identical hyperparameters, one side per process.

    python3 bench/offline_learn.py --side rlstash --algo iql --dataset bench/hopper/medium-v0
    python3 bench/offline_learn.py --side torchrl --algo iql --dataset bench/hopper/medium-v0
    python3 bench/offline_learn.py --report      # bench/results/offline_learn.json -> tables

Run the two sides side by side (one core each, one torch thread). Each process appends one JSON
line per evaluation to ``bench/results/offline_learn.jsonl`` as it goes (nothing is lost when a
run is stopped): gradient steps so far, the 10 deterministic episode returns, the mean and its
D4RL-normalised score (100 * (R - min) / (max - min), D4RL's reference returns of the env,
bench/make_offline_data.py ``D4RL_REF``), and the CPU and wall seconds spent in updates.

Settings (both sides; TorchRL's sota-implementations ``iql/offline_config.yaml`` and
``td3_bc/config.yaml``): batch 256, 256 x 256 ReLU MLPs, Adam lr 3e-4, gamma 0.99, tau 0.005;
IQL expectile 0.7, temperature 3 (advantage weights clipped at 100 on both sides); TD3+BC
alpha 2.5, policy delay 2, target noise 0.2 clipped at 0.5, Adam eps 1e-4 (set on rlstash's
optimizers here: rlstash's default is 1e-8). Networks: bench/offline.py ``torchrl_update``
(TorchRL's modules as sota builds them) and rlstash's own agents (IQL actor: tanh-squashed
Gaussian with log-std clamped to [-20, 2]; TorchRL's: ``biased_softplus_1.0`` scale, lower bound
0.1; the one architectural difference). rlstash runs ``compile="auto"`` with the run's length
known, as ``rlstash train`` does (compiles after 60 s of eager updates; the compile time is in
the wall time). Evaluation: the same gymnasium loop for both, ``--eval-episodes`` episodes of
the dataset's env with seeds ``1000 * (seed + 1) + i``, deterministic actions (TorchRL:
``ExplorationType.DETERMINISTIC``, as sota evaluates), every ``--eval-every`` gradient steps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
WORK = HERE / ".work" / "offline"
LOG = HERE / "results" / "offline_learn.jsonl"
OUT = HERE / "results" / "offline_learn.md"
BATCH = 256
TD3BC_ADAM_EPS = 1e-4  # td3_bc/config.yaml optim.adam_eps


def evaluate(env_id: str, policy: Any, episodes: int, seed: int) -> list[float]:
    """Returns of ``episodes`` deterministic episodes; ``policy(obs [d]) -> action [a]``."""
    import gymnasium as gym

    env = gym.make(env_id)
    out = []
    for i in range(episodes):
        obs, _ = env.reset(seed=1000 * (seed + 1) + i)
        total, done = 0.0, False
        while not done:
            obs, r, te, tr, _ = env.step(policy(obs))
            total += float(r)
            done = te or tr
        out.append(total)
    env.close()
    return out


def rlstash_side(args: argparse.Namespace) -> tuple[Any, Any, str]:
    import torch

    from rlstash import ReplayBuffer
    from rlstash.agents.iql import IQL, IQLConfig
    from rlstash.agents.td3_bc import TD3BC, TD3BCConfig

    rb = ReplayBuffer.from_minari(args.dataset, seed=args.seed)
    obs_dim = rb.storage.spec["obs"].shape[0]
    act_dim = rb.storage.spec["action"].shape[0]
    if args.algo == "iql":
        agent: Any = IQL(
            (obs_dim,), act_dim, -1.0, 1.0, IQLConfig(seed=args.seed, compile=args.compile)
        )
    else:
        agent = TD3BC(
            (obs_dim,), act_dim, -1.0, 1.0, TD3BCConfig(seed=args.seed, compile=args.compile)
        )
        for group in agent.groups.values():  # TorchRL's td3_bc adam_eps
            group.eps = TD3BC_ADAM_EPS
            for pg in group.opt.param_groups:
                pg["eps"] = TD3BC_ADAM_EPS
    agent.planned_updates = args.steps

    def update(n: int) -> None:
        for _ in range(n):
            agent.update(rb.sample(BATCH))

    def policy(obs: Any) -> Any:
        o = torch.as_tensor(obs, dtype=torch.float32).unsqueeze(0)
        return agent.act(o, deterministic=True)[0].numpy()

    return update, policy, int(rb.storage.nbytes)


def torchrl_side(args: argparse.Namespace) -> tuple[Any, Any, str]:
    import torch
    from offline import tensor_bytes, torchrl_minari_fix, torchrl_sampling, torchrl_update
    from tensordict import TensorDict
    from torchrl.data.datasets.minari_data import MinariExperienceReplay
    from torchrl.envs.utils import ExplorationType, set_exploration_type

    torch.manual_seed(args.seed)
    # one preprocessed copy per dataset, kept: the first run's setup_s is TorchRL's load time
    # (reading the Minari hdf5 into its memory-mapped storage); later runs map it again
    root = WORK / "torchrl-filled"
    root.mkdir(parents=True, exist_ok=True)
    # (load_from_local_minari=True always preprocesses again, rewriting the memory-mapped files
    # another run may be reading: a copy already made is opened without it)
    made = (root / args.dataset / "meta.json").exists()
    with torchrl_minari_fix():  # TorchRL 0.14.1 would hold zeros (offline.torchrl_minari_fix)
        trb = MinariExperienceReplay(
            args.dataset, batch_size=BATCH, root=str(root), load_from_local_minari=not made
        )
    if not trb.storage._storage["action"].abs().sum() > 0:
        raise RuntimeError(f"TorchRL's copy of {args.dataset} under {root} holds zero actions")
    held = tensor_bytes(trb.storage._storage)
    trb = torchrl_sampling(trb)
    td = trb.sample()
    obs_dim, act_dim = td["observation"].shape[-1], td["action"].shape[-1]
    eps = TD3BC_ADAM_EPS if args.algo == "td3_bc" else 1e-8
    run, _step, actor = torchrl_update(args.algo, trb, obs_dim, act_dim, adam_eps=eps)

    def policy(obs: Any) -> Any:
        o = torch.as_tensor(obs, dtype=torch.float32)
        with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
            return actor(TensorDict({"observation": o}, []))["action"].numpy()

    return run, policy, held


def train(args: argparse.Namespace) -> None:
    import minari
    import numpy as np
    import torch
    from make_offline_data import D4RL_REF

    torch.set_num_threads(1)
    env_id = minari.load_dataset(args.dataset).env_spec.id
    lo, hi = D4RL_REF[env_id]
    start = time.perf_counter()
    update, policy, held = (rlstash_side if args.side == "rlstash" else torchrl_side)(args)
    setup_s = time.perf_counter() - start
    print(f"[offline_learn] loaded in {setup_s:.1f} s, {held} bytes held", flush=True)
    done, cpu_s, wall_s = 0, 0.0, 0.0
    run_id = f"{args.side}-{args.algo}-{args.dataset}-s{args.seed}-{time.strftime('%H%M%S')}"
    while done < args.steps:
        n = min(args.eval_every, args.steps - done)
        c0, w0 = time.process_time(), time.perf_counter()
        update(n)
        cpu_s += time.process_time() - c0
        wall_s += time.perf_counter() - w0
        done += n
        e0 = time.perf_counter()
        rets = evaluate(env_id, policy, args.eval_episodes, args.seed)
        mean = float(np.mean(rets))
        rec = {
            "run": run_id, "side": args.side, "algo": args.algo, "dataset": args.dataset,
            "env": env_id, "seed": args.seed, "step": done, "return_mean": round(mean, 1),
            "return_std": round(float(np.std(rets)), 1),
            "normalised": round(100 * (mean - lo) / (hi - lo), 2),
            "returns": [round(r, 1) for r in rets], "update_cpu_s": round(cpu_s, 1),
            "update_wall_s": round(wall_s, 1), "eval_s": round(time.perf_counter() - e0, 1),
            "setup_s": round(setup_s, 1), "bytes_held": held, "compile": args.compile,
            "load_1m": round(os.getloadavg()[0], 2), "time": time.strftime("%H:%M:%S"),
        }  # fmt: skip
        with LOG.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        print(f"[offline_learn] {json.dumps(rec)}", flush=True)


def report() -> str:
    """Tables of the equal-step checkpoints both sides reached, from the JSONL log."""
    from common import markdown_table

    recs = [json.loads(line) for line in LOG.read_text().splitlines() if line.strip()]
    lines: list[str] = []
    for dataset in sorted({r["dataset"] for r in recs}, key=lambda d: "random" in d):
        for algo in ("iql", "td3_bc"):
            sel = [r for r in recs if r["dataset"] == dataset and r["algo"] == algo]
            if not sel:
                continue
            seeds = sorted({r["seed"] for r in sel})
            by = {(r["side"], r["seed"], r["step"]): r for r in sel}
            steps = sorted(
                {s for (side, seed, s) in by if side == "torchrl"}
                & {s for (side, seed, s) in by if side == "rlstash"}
            )
            rows = []
            for step in steps:
                row: list[object] = [f"{step:,}"]
                for side in ("rlstash", "torchrl"):
                    vals = [
                        by[(side, s, step)]["normalised"] for s in seeds if (side, s, step) in by
                    ]
                    row.append(
                        " / ".join(f"{v:.1f}" for v in vals)
                        + f" (mean {statistics.mean(vals):.1f})"
                        if vals
                        else "-"
                    )
                rows.append(row)
            rate = {}
            for side in ("rlstash", "torchrl"):
                last = [
                    max(
                        (r for r in sel if r["side"] == side and r["seed"] == s),
                        key=lambda r: r["step"],
                    )
                    for s in seeds
                    if any(r["side"] == side and r["seed"] == s for r in sel)
                ]
                rate[side] = (
                    statistics.median(r["step"] / r["update_cpu_s"] for r in last)
                    if last
                    else None,
                    statistics.median(r["step"] / r["update_wall_s"] for r in last)
                    if last
                    else None,
                    max((r["step"] for r in last), default=0),
                )
            lines += [
                f"### {algo} on `{dataset}` (seeds {', '.join(map(str, seeds))})",
                "",
                markdown_table(
                    [
                        "gradient steps",
                        "rlstash normalised (per seed)",
                        "TorchRL normalised (per seed)",
                    ],
                    rows,
                ),
                "",
            ]
            rr, tr = rate["rlstash"], rate["torchrl"]
            if rr[0] and tr[0]:
                lines += [
                    f"Gradient steps/s (median over seeds, CPU-seconds in updates / wall seconds "
                    f"in updates; rlstash compile as the run's --compile): rlstash {rr[0]:.1f} / {rr[1]:.1f}, "
                    f"TorchRL {tr[0]:.1f} / {tr[1]:.1f}: {rr[0] / tr[0]:.2f}x / {rr[1] / tr[1]:.2f}x. "
                    f"Furthest step reached: rlstash {rr[2]:,}, TorchRL {tr[2]:,}.",
                    "",
                ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", choices=("rlstash", "torchrl"))
    parser.add_argument("--algo", choices=("iql", "td3_bc"), default="iql")
    parser.add_argument("--dataset", default="bench/hopper/medium-v0")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=100_000, help="gradient steps")
    parser.add_argument("--eval-every", type=int, default=10_000, help="gradient steps")
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument(
        "--compile", default="auto", choices=("auto", "true", "false"),
        help="rlstash: compile the update (auto: as rlstash train; false on a loaded machine "
        "where a compilation takes many minutes)",
    )  # fmt: skip
    parser.add_argument("--report", action="store_true", help="print the tables of the log")
    args = parser.parse_args()
    from bench_venv import ensure_bench_venv

    ensure_bench_venv(__file__)
    from make_offline_data import MINARI_HOME

    os.environ.setdefault("MINARI_DATASETS_PATH", str(MINARI_HOME))
    if args.report:
        print(report())
        return 0
    args.compile = {"true": True, "false": False}.get(args.compile, args.compile)
    if not args.side:
        parser.error("--side: expected rlstash or torchrl (or --report)")
    train(args)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    raise SystemExit(main())
