"""``rlstash eval``: run the saved policy of a run for k episodes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from rlstash.collect.sync import Collector
from rlstash.train import builders, checkpoint


def evaluate_run(
    run_dir: Path, episodes: int = 10, seed: int = 12345, device: str = "cpu"
) -> dict[str, np.ndarray]:
    """Rebuild the agent of ``run_dir`` from its checkpoint and roll it out deterministically."""
    ckpt = checkpoint.latest(run_dir)
    if ckpt is None:
        raise ValueError(
            f"run: no complete checkpoint in {run_dir}; train first (rlstash train --name ...)"
        )
    state = checkpoint.load_state(ckpt)
    cfg = state["config"]
    history = int(cfg.get("history", 0))
    obs_space, act_space, _ = builders.env_spaces(cfg["env"], history)
    agent = builders.make_agent(
        cfg["algo"], cfg["env"], obs_space, act_space, torch.device(device), dict(cfg["agent"]),
        history,
    )  # fmt: skip
    agent.load_state_dict(state["agent"])
    n = min(episodes, 10)
    env = builders.make_eval_env(cfg["env"], n, history)
    try:
        collector = Collector(env, agent.act, n, device=agent.act_device)
        return collector.rollout(agent, episodes=episodes, deterministic=True, seed=seed)
    finally:
        env.close()
