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

ACTOR = "actor_network_params.module.0.module.0.mlp.params."
CRITIC = "critic_network_params.module.0.mlp.params."


def run(task: str, seed: int, frames: int, eval_every: int) -> dict:
    import torch

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    import marl as bench_marl
    from benchmarl.experiment import Experiment
    from tensordict import TensorDict

    from rlstash.agents.mappo import MAPPO, MAPPOConfig

    n_agents = bench_marl.TASKS[task]["n_agents"]
    agent: MAPPO | None = None
    calls = [0]
    per_iter = 45 * (6000 // 400)  # BenchMARL's minibatch steps per iteration

    def pairs(loss):  # noqa: ANN001, ANN202
        bp = dict(loss.named_parameters())
        for pre, net in ((ACTOR, agent.actor), (CRITIC, agent.critic)):
            lins = [m for m in net.net if hasattr(m, "weight")]
            for i, lin in zip((0, 2, 4), lins):
                yield bp[f"{pre}{i}.weight"], lin.weight, True
                yield bp[f"{pre}{i}.bias"], lin.bias, False

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
                for b, r, w in pairs(loss):
                    r.data[0] = b.data.T if w else b.data
        if calls[0] % per_iter == 0:  # the iteration's whole update, by rlstash
            data = buffer.storage._storage[: len(buffer)]
            u = torch.atanh(data["agents", "action"].clamp(-1 + 1e-6, 1 - 1e-6))
            rows = {"obs": data["agents", "observation"], "action": u,
                    "advantages": data["agents", "advantage"].squeeze(-1),
                    "returns": data["agents", "value_target"].squeeze(-1),
                    "mask": torch.ones(u.shape[:2], dtype=torch.bool)}  # fmt: skip
            with torch.no_grad():
                rows["logp"] = agent.log_prob(rows["obs"], u)[0]
            agent.learn(rows)
            with torch.no_grad():  # back into BenchMARL's networks (its policy collects)
                for b, r, w in pairs(loss):
                    b.data.copy_(r.data[0].T if w else r.data[0])
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
