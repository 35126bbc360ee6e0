"""``rlstash eval``: run the saved policy of a run for k episodes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from rlstash.collect.sync import Collector
from rlstash.train import algos, builders, checkpoint, rundir
from rlstash.train.config import TrainConfig


def evaluate_run(
    run_dir: Path,
    episodes: int = 10,
    seed: int = 12345,
    device: str = "cpu",
    video: bool = False,
    video_dir: Path | None = None,
) -> dict[str, np.ndarray]:
    """Rebuild the agent of ``run_dir`` from its checkpoint and roll it out deterministically
    (ALE ids: full games, unclipped score). With ``video`` the episodes of evaluation env 0
    are recorded to ``<video_dir>/eval-s<seed>-<i>.mp4`` (default ``<run_dir>/videos``;
    ``out["videos"]``: the paths)."""
    from rlstash.train import video as videos

    for name, value, low in (("episodes", episodes, 1), ("seed", seed, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name}: expected an int >= {low}, got {value!r}; give {low} or more")
    if checkpoint.latest(run_dir) is None:
        raise ValueError(
            f"run: no complete checkpoint in {run_dir}; train first (rlstash train --name ...)"
        )
    recorder = videos.Recorder(video_dir or run_dir / "videos") if video else None  # refuses early
    ckpt, state, _ = rundir.read_checkpoint(run_dir)  # manifest, settings, checksum, load
    cfg = TrainConfig(**state["config"])
    if algos.ALGOS[cfg.algo].store == "multiagent":  # MAPPO/IPPO: every agent group's policy
        from rlstash.train import marl

        return marl.evaluate_saved(cfg, state, ckpt, episodes, seed, device, recorder)
    info = builders.probe_env(cfg.env, cfg.history)
    cfg, agent_cfg = algos.resolve(cfg, info.act_space)
    agent = builders.make_agent(cfg, agent_cfg, info, torch.device(device))
    with checkpoint.reading(ckpt / checkpoint.STATE):
        agent.load_state_dict(state["agent"])
    n = min(episodes, 10)
    env = builders.make_eval_env(cfg.env, n, cfg.history, recorder)
    try:
        collector = Collector(env, agent.act, n, device=agent.act_device)
        if recorder is not None:  # env 0 runs episodes // n of the episodes
            recorder.request(*(f"eval-s{seed}-{i}" for i in range(episodes // n)))
        out = collector.rollout(agent, episodes=episodes, deterministic=True, seed=seed)
    finally:
        env.close()
    if recorder is not None:
        out["videos"] = np.asarray([str(p) for p in recorder.written])
    return out
