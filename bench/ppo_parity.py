#!/usr/bin/env python3
"""PPO update parity: rlstash's PPO against Stable-Baselines3's on the same weights and rollouts.

    python3 bench/ppo_parity.py                 # CartPole-v1, the RL Zoo's settings, 120 rollouts

Both sides start from the same weights (rlstash's, copied into SB3's MlpPolicy). SB3 collects
every rollout (8 envs x 32 steps; its own sampling); the same rollout goes into an rlstash
RolloutStorage (raw rewards, terminated/truncated, the final observations from SB3's infos) and
each side runs its own update on it: rlstash ``PPO.update``, SB3 ``PPO.train`` (20 epochs of
one 256-row minibatch, lr and clip range annealed with the same progress). Per rollout it
reports the largest difference of V(s), old log pi and the GAE advantages (truncated episodes
bootstrap from V(final obs) in rlstash, from a reward plus gamma V(terminal obs) in SB3) and of
the weights after the update.

Before each collection SB3's weights, Adam moments and step count are set to rlstash's
again: float rounding of 20 full-batch Adam steps per rollout grows over many rollouts, so
without the reset the comparison would soon be of two different policies; with it, each
rollout's weight difference after the update is that of one update from the same state.

Writes bench/results/ppo_parity.md. Runs in ``.venv-bench`` (re-executes itself there).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

T, N, TOTAL = 32, 8, 100_000  # the Zoo's CartPole: 8 envs x 32 steps, 1e5 env steps


def build(seed: int):
    """(rlstash agent, SB3 model, [(rlstash layer, SB3 layer)]) with SB3 set to rlstash's
    weights and a fresh SB3 optimizer."""
    from learn_tasks import ZOO_PPO
    from stable_baselines3 import PPO as SB3PPO
    from stable_baselines3.common.env_util import make_vec_env

    from rlstash.agents.ppo import PPO, PRESETS, PPOConfig

    cfg = PPOConfig(**PRESETS["CartPole-v1"], total_steps=TOTAL, compile=False, seed=seed)
    agent = PPO((4,), n_actions=2, config=cfg)
    kw = {k: v for k, v in ZOO_PPO.items() if k not in ("n_envs", "learning_rate", "clip_range")}
    sb = SB3PPO("MlpPolicy", make_vec_env("CartPole-v1", n_envs=N, seed=seed), seed=seed,
                device="cpu", learning_rate=lambda p: p * 1e-3, clip_range=lambda p: p * 0.2,
                **kw)  # fmt: skip
    net, pol = agent.nets["policy"], sb.policy
    pairs = [
        (net.actor_trunk[1], pol.mlp_extractor.policy_net[0]),
        (net.actor_trunk[3], pol.mlp_extractor.policy_net[2]),
        (net.critic[0][1], pol.mlp_extractor.value_net[0]),
        (net.critic[0][3], pol.mlp_extractor.value_net[2]),
        (net.value_head, pol.value_net),
        (net.head, pol.action_net),
    ]
    sync(pairs)
    pol.optimizer = pol.optimizer_class(pol.parameters(), lr=1e-3, **pol.optimizer_kwargs)
    return agent, sb, pairs


def _bias(layer):
    return layer.bias_ if hasattr(layer, "bias_") else layer.bias  # rlstash's linear head: bias_


def sync(pairs, agent=None, sb=None) -> None:
    """SB3's weights := rlstash's; with ``agent`` and ``sb`` also SB3's Adam moments and step
    count := rlstash's (its parameters are views of one flat vector: each one's slice of the
    flat moments is found by its offset in that vector)."""
    import torch

    with torch.no_grad():
        for ours, theirs in pairs:
            theirs.weight.copy_(ours.weight)
            theirs.bias.copy_(_bias(ours))
    if agent is None:
        return
    flat = agent.groups["policy"].flat.param
    state = agent.groups["policy"].opt.state[flat]
    opt = sb.policy.optimizer
    for ours, theirs in pairs:
        for mine, other in ((ours.weight, theirs.weight), (_bias(ours), theirs.bias)):
            start = (mine.data_ptr() - flat.data_ptr()) // flat.element_size()
            sl = slice(start, start + mine.numel())
            opt.state[other] = {
                "step": state["step"].clone().reshape(()),
                "exp_avg": state["exp_avg"][sl].view_as(other).clone(),
                "exp_avg_sq": state["exp_avg_sq"][sl].view_as(other).clone(),
            }


def weight_diff(pairs) -> float:
    return max(
        max((a.weight - b.weight).abs().max().item(), (_bias(a) - b.bias).abs().max().item())
        for a, b in pairs
    )


def recorder():
    """An SB3 callback keeping each step's raw rewards, dones, truncations, final obs."""
    import numpy as np
    from stable_baselines3.common.callbacks import BaseCallback

    class Record(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.rows: list = []

        def _on_step(self) -> bool:
            infos = self.locals["infos"]
            trunc = np.array([bool(i.get("TimeLimit.truncated", False)) for i in infos])
            final = np.zeros((N, 4), np.float32)
            for k, info in enumerate(infos):
                if "terminal_observation" in info:
                    final[k] = info["terminal_observation"]
            self.rows.append((self.locals["rewards"].copy(), self.locals["dones"].copy(),
                              trunc, final))  # fmt: skip
            return True

    return Record()


def as_rollout(sb, rows, rollout):
    """SB3's last rollout (buffer + recorded steps) into ``rollout``."""
    import numpy as np
    import torch

    buf = sb.rollout_buffer
    raw, done, trunc, final = (np.stack([r[i] for r in rows]) for i in range(4))
    batch = {
        "obs": torch.as_tensor(buf.observations, dtype=torch.float32),
        "action": torch.as_tensor(buf.actions[..., 0], dtype=torch.int64),
        "reward": torch.as_tensor(raw, dtype=torch.float32),
        "terminated": torch.as_tensor(done & ~trunc),
        "truncated": torch.as_tensor(trunc),
        "final_obs": torch.as_tensor(final),
    }
    rollout.add(batch, torch.as_tensor(sb._last_obs, dtype=torch.float32))
    return int(done.sum()), int(trunc.sum())


def compare(rollouts: int, seed: int) -> list[dict]:
    """One row per rollout: differences before and after the update (module docstring)."""
    import torch

    from rlstash.spec import Spec
    from rlstash.storage.rollout import RolloutStorage

    torch.set_num_threads(1)
    agent, sb, pairs = build(seed)
    record = recorder()
    sb._setup_learn(TOTAL, record)
    record.init_callback(sb)
    spec = Spec({"obs": ((4,), "float32"), "action": ((), "int64")})
    rollout = RolloutStorage(spec, T, N, same_step=True)
    out = []
    for i in range(rollouts):
        sync(pairs, agent, sb)
        record.rows = []
        sb.collect_rollouts(sb.env, record, sb.rollout_buffer, n_rollout_steps=T)
        sb._update_current_progress_remaining(sb.num_timesteps, TOTAL)
        ended, truncated = as_rollout(sb, record.rows, rollout)
        agent.env_steps = sb.num_timesteps
        data, buf = agent.prepare(rollout), sb.rollout_buffer
        diffs = {name: (data[name] - torch.as_tensor(getattr(buf, key)).reshape(-1)).abs().max()
                 for name, key in (("values", "values"), ("logp", "log_probs"),
                                   ("advantages", "advantages"))}  # fmt: skip
        stats = agent.update(rollout)
        sb.train()
        out.append({"rollout": i, "env_steps": sb.num_timesteps, "ended": ended,
                    "truncated": truncated, **{k: float(v) for k, v in diffs.items()},
                    "weights": weight_diff(pairs), "lr": stats["learning_rate"],
                    "sb3_lr": sb.policy.optimizer.param_groups[0]["lr"],
                    "clip": stats["clip_range"],
                    "sb3_clip": sb.clip_range(sb._current_progress_remaining)})  # fmt: skip
    return out


def report(rows: list[dict], seed: int) -> list[str]:
    worst = {k: max(r[k] for r in rows) for k in ("values", "logp", "advantages", "weights")}
    trunc = [r for r in rows if r["truncated"]]
    lines = [
        "# PPO update parity: rlstash vs Stable-Baselines3 (CartPole-v1, the RL Zoo's settings)",
        "",
        f"Reproduce: `python3 bench/ppo_parity.py --rollouts {len(rows)} --seed {seed}`. "
        "Method: bench/ppo_parity.py's docstring (same weights before each rollout, SB3's "
        "rollouts fed to both updates).",
        "",
        f"- rollouts: {len(rows)} ({rows[-1]['env_steps']:,} env steps), "
        f"{sum(r['ended'] for r in rows)} episode ends, {sum(r['truncated'] for r in rows)} "
        f"of them truncations at 500 steps (in {len(trunc)} rollouts)",
        f"- learning rate and clip range equal on every rollout: "
        f"{all(abs(r['lr'] - r['sb3_lr']) < 1e-12 for r in rows)} and "
        f"{all(abs(r['clip'] - r['sb3_clip']) < 1e-12 for r in rows)}",
        f"- largest |difference| over all rollouts: V(s) {worst['values']:.1e}, old log pi "
        f"{worst['logp']:.1e}, GAE advantages {worst['advantages']:.1e}; in the rollouts with "
        f"truncations: advantages {max((r['advantages'] for r in trunc), default=0):.1e}",
        f"- weights after one update from the same state: up to {worst['weights']:.1e} "
        f"(median {sorted(r['weights'] for r in rows)[len(rows) // 2]:.1e})",
        "",
        "| rollout | env steps | episode ends | truncated | max dV | max dlogp | max dA | max dW |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {r['rollout']} | {r['env_steps']:,} | {r['ended']} | {r['truncated']} | "
        f"{r['values']:.1e} | {r['logp']:.1e} | {r['advantages']:.1e} | {r['weights']:.1e} |"
        for r in rows
        if r["rollout"] < 3 or r["truncated"] or r["rollout"] % 20 == 0
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=120)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(HERE / "results" / "ppo_parity.md"))
    args = parser.parse_args()
    from bench_venv import ensure_bench_venv

    ensure_bench_venv(__file__)
    from common import header_lines, machine_info

    rows = compare(args.rollouts, args.seed)
    lines = report(rows, args.seed)
    machine = ["Machine:", "", *header_lines(machine_info()), ""]
    Path(args.out).write_text("\n".join([*lines[:4], *machine, *lines[4:]]) + "\n")
    print("\n".join(lines[:10]))


if __name__ == "__main__":
    main()
