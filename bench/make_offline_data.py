"""Make the offline-RL benchmark datasets of issue 26 (bench/offline.py, bench/offline_learn.py).

    python3 bench/make_offline_data.py random            # bench/hopper/random-v0: 1M random steps
    python3 bench/make_offline_data.py sac               # train rlstash SAC until the medium target
    python3 bench/make_offline_data.py medium            # bench/hopper/medium-v0: 1M steps of it

The datasets are Minari datasets under ``MINARI_DATASETS_PATH`` (default ``bench/.work/minari``,
git-ignored), written with ``minari.create_dataset_from_buffers`` (one ``EpisodeBuffer`` per
episode; truncation at the env's 1,000-step limit kept apart from termination). Reproducible:
every env is seeded (episode k of env i: the env's RNG continued from ``reset(seed=seed+i)``),
the policies are seeded.

- ``random``: uniformly random actions (the action space's sampler, seeded).
- ``sac``: ``rlstash train --algo sac --env ENV`` (rlstash's defaults for it: no env preset;
  256 x 256, batch 256, lr 3e-4, one torch thread) evaluated every ``--eval-every`` env steps
  on 10 deterministic episodes, stopping at the first evaluation at or above ``--target``
  (``--threshold T --patience 1``); the run's final checkpoint is that policy. The default
  target is a third of D4RL's expert reference return for the env (Hopper: 3234.3 / 3 = 1078;
  D4RL's ``REF_MAX_SCORE``, d4rl/infos.py), the "medium" recipe (SAC stopped at about a third of
  its final return).
- ``medium``: the checkpoint of ``sac`` rolled out with *stochastic* actions (as D4RL's medium
  datasets were), ``--envs`` envs stepped in turn with one batched ``act`` per round.

Each command prints and writes ``bench/.work/offline/<name>.json`` (steps, episodes, mean
return, seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WORK = HERE / ".work" / "offline"
MINARI_HOME = HERE / ".work" / "minari"
# D4RL's reference returns (d4rl/infos.py REF_MIN_SCORE / REF_MAX_SCORE): the normalised score
# is 100 * (R - min) / (max - min).
D4RL_REF = {
    "Hopper-v5": (-20.272305, 3234.3),
    "HalfCheetah-v5": (-280.178953, 12135.0),
    "Walker2d-v5": (1.629008, 4592.3),
}


def dataset_id(env_id: str, kind: str) -> str:
    return f"bench/{env_id.split('-')[0].lower()}/{kind}-v0"


def sac_run_dir(env_id: str, seed: int) -> Path:
    return WORK / f"sac-{env_id.split('-')[0].lower()}-s{seed}"


def write_dataset(name: str, env_id: str, episodes: list[Any], algorithm: str) -> Any:
    import minari

    with warnings.catch_warnings():  # Minari's advice to set author, code_permalink, ...
        warnings.simplefilter("ignore", UserWarning)
        return minari.create_dataset_from_buffers(
            name, episodes, env=env_id, algorithm_name=algorithm
        )


def rollout(env_id: str, steps: int, seed: int, policy: Any, n_envs: int) -> list[Any]:
    """``steps`` env steps over ``n_envs`` envs; ``policy(obs [n, d]) -> actions [n, a]``.
    Episodes cut by the step budget are marked truncated (Minari needs a last flag)."""
    import gymnasium as gym
    import numpy as np
    from minari.data_collector.episode_buffer import EpisodeBuffer

    envs = [gym.make(env_id) for _ in range(n_envs)]
    for i, env in enumerate(envs):
        env.action_space.seed(seed + i)
    obs = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(envs)])
    eps: list[dict[str, list]] = [dict(o=[o], a=[], r=[], te=[], tr=[]) for o in obs]
    done_eps: list[Any] = []

    def close(i: int) -> None:
        e = eps[i]
        e["tr"][-1] = e["tr"][-1] or not e["te"][-1]
        done_eps.append(
            EpisodeBuffer(
                observations=np.stack(e["o"]),
                actions=np.stack(e["a"]).astype(np.float32),
                rewards=np.asarray(e["r"], np.float64),
                terminations=np.asarray(e["te"]),
                truncations=np.asarray(e["tr"]),
            )  # fmt: skip
        )

    taken = 0
    while taken < steps:
        act = policy(obs)
        for i, env in enumerate(envs):
            o, r, te, tr, _ = env.step(act[i])
            e = eps[i]
            e["a"].append(act[i]), e["r"].append(float(r)), e["te"].append(bool(te))
            e["tr"].append(bool(tr))
            taken += 1
            if te or tr:
                e["o"].append(o)
                close(i)
                o, _ = env.reset()
                eps[i] = dict(o=[o], a=[], r=[], te=[], tr=[])
            else:
                e["o"].append(o)
            obs[i] = o
            if taken >= steps:
                break
    for i in range(n_envs):
        if eps[i]["a"]:
            close(i)
    for env in envs:
        env.close()
    return done_eps


def summary(name: str, episodes: list[Any], seconds: float, **extra: Any) -> dict[str, Any]:
    import numpy as np

    rets = np.array([float(np.sum(e.rewards)) for e in episodes])
    lens = np.array([len(e.rewards) for e in episodes])
    out = {
        "dataset": name, "steps": int(lens.sum()), "episodes": len(episodes),
        "return_mean": round(float(rets.mean()), 1), "return_std": round(float(rets.std()), 1),
        "length_mean": round(float(lens.mean()), 1),
        "terminated": int(sum(bool(e.terminations[-1]) for e in episodes)),
        "seconds": round(seconds, 1), **extra,
    }  # fmt: skip
    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / f"{name.replace('/', '_')}.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(out), flush=True)
    return out


def cmd_random(args: argparse.Namespace) -> None:
    import numpy as np

    name = dataset_id(args.env, "random")
    start = time.perf_counter()
    import gymnasium as gym

    space = gym.make(args.env).action_space
    space.seed(args.seed)

    def policy(obs: Any) -> Any:
        return np.stack([space.sample() for _ in range(len(obs))])

    episodes = rollout(args.env, args.steps, args.seed, policy, args.envs)
    write_dataset(name, args.env, episodes, "uniform random actions")
    summary(name, episodes, time.perf_counter() - start, policy="uniform random")


def cmd_sac(args: argparse.Namespace) -> None:
    target = args.target if args.target is not None else D4RL_REF[args.env][1] / 3
    run_dir = sac_run_dir(args.env, args.seed)
    cmd = [
        str(ROOT / ".venv-bench" / "bin" / "rlstash"), "train", "--algo", "sac",
        "--env", args.env, "--seed", str(args.seed), "--torch-threads", "1",
        "--steps", str(args.max_steps), "--eval-every", str(args.eval_every),
        "--eval-episodes", "10", "--checkpoint-every", str(args.eval_every), "--threshold", f"{target:.1f}", "--patience", "1",
        "--run-dir", str(run_dir.parent), "--name", run_dir.name, "--quiet",
    ]  # fmt: skip
    if args.net_arch:
        cmd += ["--net-arch", args.net_arch]
    print("[make_offline_data]", " ".join(cmd), flush=True)
    start = time.perf_counter()
    subprocess.run(cmd, check=True)
    print(f"[make_offline_data] sac: {time.perf_counter() - start:.0f} s", flush=True)


def load_policy(run_dir: Path) -> Any:
    """The run's agent, rebuilt from its latest checkpoint (as ``rlstash eval`` does)."""
    import torch

    from rlstash.train import algos, builders, checkpoint, rundir
    from rlstash.train.config import TrainConfig

    ckpt, state, _ = rundir.read_checkpoint(run_dir)
    cfg = TrainConfig(**state["config"])
    info = builders.probe_env(cfg.env, cfg.history)
    cfg, agent_cfg = algos.resolve(cfg, info.act_space)
    agent = builders.make_agent(cfg, agent_cfg, info, torch.device("cpu"))
    with checkpoint.reading(ckpt / checkpoint.STATE):
        agent.load_state_dict(state["agent"])
    return agent, ckpt, state


def cmd_medium(args: argparse.Namespace) -> None:
    import numpy as np
    import torch

    torch.set_num_threads(1)
    run_dir = Path(args.run) if args.run else sac_run_dir(args.env, args.seed)
    agent, ckpt, state = load_policy(run_dir)
    torch.manual_seed(args.seed)

    def policy(obs: Any) -> Any:
        a = agent.act(torch.as_tensor(obs, dtype=torch.float32), deterministic=False)
        return a.numpy().astype(np.float32)

    name = dataset_id(args.env, args.name or "medium")
    start = time.perf_counter()
    episodes = rollout(args.env, args.steps, args.seed + 100, policy, args.envs)
    write_dataset(name, args.env, episodes, f"rlstash SAC ({ckpt.name}), stochastic actions")
    summary(name, episodes, time.perf_counter() - start, policy=str(ckpt))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("random", "sac", "medium"))
    parser.add_argument("--env", default="Hopper-v5", choices=sorted(D4RL_REF))
    parser.add_argument("--steps", type=int, default=1_000_000, help="dataset env steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--envs", type=int, default=16, help="envs stepped per act round")
    parser.add_argument("--target", type=float, default=None, help="sac: eval return to stop at")
    parser.add_argument("--eval-every", type=int, default=5000, help="sac: env steps")
    parser.add_argument("--net-arch", default="", help="sac: e.g. 64,64 (default: rlstash's)")
    parser.add_argument("--max-steps", type=int, default=1_000_000, help="sac: step budget")
    parser.add_argument("--name", default="", help="medium: dataset kind (default medium)")
    parser.add_argument("--run", default="", help="medium: the SAC run dir (default: sac's)")
    args = parser.parse_args()
    from bench_venv import ensure_bench_venv

    ensure_bench_venv(__file__)
    os.environ.setdefault("MINARI_DATASETS_PATH", str(MINARI_HOME))
    {"random": cmd_random, "sac": cmd_sac, "medium": cmd_medium}[args.what](args)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    raise SystemExit(main())
