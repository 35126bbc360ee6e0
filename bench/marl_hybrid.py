#!/usr/bin/env python3
"""BenchMARL's MAPPO loop with rlstash's update (``bench/results/marl.md``, "Hybrid"; runs in
``.venv-marl``, ``bench/setup_marl.py``).

    python3 bench/marl_hybrid.py --task balance --seed 1 --frames 60000

BenchMARL collects, computes GAE and evaluates exactly as in ``bench/marl.py learn``; each
iteration's 675 minibatch steps are done by rlstash's :meth:`MAPPO.learn
<rlstash.agents.mappo.MAPPO.learn>` (the written gradient, ``agent_id=False``) on the same
rows (the pre-tanh sample recovered from BenchMARL's action as its TanhNormal does:
``atanh`` of the action clamped to 1 - 1e-6), and its weights are copied back into
BenchMARL's networks before the next collection. BenchMARL's initial weights start both. The
curve goes to ``bench/results/marl_hybrid-<task>-s<seed>.json``: with the update shown equal
step for step (``bench/marl_parity.py``), a hybrid that learns as BenchMARL does leaves the
difference to collection and evaluation, or to seed noise.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from setup_marl import ensure_marl_venv  # noqa: E402


def run(task: str, seed: int, frames: int, eval_every: int) -> dict:
    import torch

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    import marl as bench_marl
    from benchmarl.experiment import Experiment
    from marl_parity import _as_rlstash, _layers, rows_of
    from tensordict import TensorDict

    from rlstash.agents.mappo import MAPPO, MAPPOConfig

    n_agents = bench_marl.TASKS[task]["n_agents"]
    agent: MAPPO | None = None
    calls = [0]
    per_iter = 45 * (6000 // 400)  # BenchMARL's minibatch steps per iteration

    def optimizer_loop(self, group):  # noqa: ANN001, ANN202
        nonlocal agent
        loss, buffer = self.losses[group], self.replay_buffers[group]
        if agent is None:
            data = buffer.storage._storage[:1]
            obs_dim, act_dim = (
                data["agents", "observation"].shape[-1],
                data["agents", "action"].shape[-1],
            )
            cfg = MAPPOConfig(agent_id=False, bootstrap_truncated=False, compile=False, seed=seed)
            agent = MAPPO(n_agents, obs_dim, bounds=(-torch.ones(act_dim), torch.ones(act_dim)),
                          config=cfg)  # fmt: skip
            with torch.no_grad():  # BenchMARL's initial weights into rlstash's networks
                for _, b, r, tr in _layers(loss, agent):
                    r[0].copy_(_as_rlstash(b, tr))
        if calls[0] % per_iter == 0:  # the iteration's whole update, by rlstash
            data = buffer.storage._storage[: len(buffer)]
            rows = rows_of(data)
            with torch.no_grad():
                rows["logp"] = agent.log_prob(rows["obs"], rows["action"])[0]
            agent.learn(rows)
            with torch.no_grad():  # back into BenchMARL's networks (its policy collects)
                for _, b, r, tr in _layers(loss, agent):
                    b.data.copy_(r.detach()[0].T if tr else r.detach()[0])
        calls[0] += 1
        return TensorDict({"loss_objective": torch.zeros(()), "loss_critic": torch.zeros(())}, [])

    Experiment._optimizer_loop = optimizer_loop
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        curve = bench_marl._benchmarl(task, "mappo", seed, frames, eval_every, Path(tmp))
    use = resource.getrusage(resource.RUSAGE_SELF)
    return {"side": "hybrid: BenchMARL collection + rlstash update", "task": task, "seed": seed,
            "frames": frames, "wall_seconds": time.perf_counter() - t0,
            "cpu_seconds": use.ru_utime + use.ru_stime, "load_before": load0,
            "load_after": os.getloadavg(), "curve": curve}  # fmt: skip


def main() -> None:
    ensure_marl_venv(__file__)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="balance", choices=("balance", "navigation"))
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--frames", type=int, default=60_000)
    p.add_argument("--eval-every", type=int, default=12_000)
    args = p.parse_args()
    out = run(args.task, args.seed, args.frames, args.eval_every)
    path = HERE / "results" / f"marl_hybrid-{args.task}-s{args.seed}.json"
    path.write_text(json.dumps(out))
    print(path, [(c["frames"], round(c["eval_reward"], 2)) for c in out["curve"]])


if __name__ == "__main__":
    main()
