"""Training with collection on Ray: ``rlstash train --ray local|ADDRESS --ray-actors K --envs N``.

Only the collection moves: K Ray actors (:class:`~rlstash.collect.ray.RayCollector`) each step
N envs (``--workers`` processes per actor, 0 = in the actor) with a CPU copy of the agent's
policy; the learner, the replay buffer (one lane per env: K * N lanes), evaluation and
checkpoints stay in this process. After each round of updates the learner's policy goes out
once (one ``ray.put``) and the actors load it before their next chunk; the agent's step
counter (exploration and learning-rate schedules) follows the env steps inserted.

A run with ``--ray`` that finds a checkpoint in its run directory resumes from it when the
settings are the same (a cluster job restarted with the same command), instead of refusing.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rlstash.train.config import TrainConfig


def check(cfg: TrainConfig) -> None:
    """Refuse what Ray collection cannot do, before anything is built."""
    from rlstash.envs.make import is_batched
    from rlstash.train.algos import ALGOS

    if not _address_ok(cfg.ray):
        raise ValueError(
            f"ray: expected 'local', 'auto' or a cluster address host:port (or ray://host:port), "
            f"got {cfg.ray!r}; e.g. --ray local"
        )
    if ALGOS[cfg.algo].on_policy:
        raise ValueError(
            f"ray: collection on Ray feeds a replay buffer; --algo {cfg.algo} is on-policy. "
            "Use --algo dqn, sac or td3, or drop --ray"
        )
    if is_batched(cfg.env):
        raise ValueError(
            f"ray: {cfg.env} is a batched torch env stepped in this process; drop --ray or use "
            "a gymnasium id"
        )
    if importlib.util.find_spec("ray") is None:  # last: the settings' own errors come first
        raise ValueError("ray: Ray is not installed; pip install 'rlstash[ray]', or drop --ray")
    if cfg.ray != "local":  # before the run directory exists: ray.init retries for minutes
        from rlstash.collect.ray_session import check_reachable

        check_reachable(cfg.ray, name="ray", local="--ray local")


def _address_ok(address: str) -> bool:
    if address in ("local", "auto"):
        return True
    return re.fullmatch(r"(ray://)?[A-Za-z0-9_.\-]+:\d{1,5}", address) is not None


def make_collector(
    cfg: TrainConfig,
    agent_cfg: Any,
    info: Any,
    limiter: Any,
    frames: int,
    seed: int,
    make_agent: Callable[..., Any],
) -> Any:
    """The run's RayCollector: ``cfg.ray_actors`` actors of ``cfg.envs`` envs each, whose
    policies are ``make_agent(cfg, agent_cfg, info, cpu)`` (picklable: a module function)."""
    from rlstash.collect.ray import RayCollector
    from rlstash.envs.make import vec_source

    # windows (--history) and Atari preprocessing are made in the actors' workers
    source = vec_source(cfg.env, cfg.history)
    return RayCollector(
        source,
        functools.partial(actor_policy, make_agent, cfg, agent_cfg, info),
        num_actors=cfg.ray_actors,
        envs_per_actor=cfg.envs,
        frames_per_batch=frames,
        seed=seed,
        workers_per_actor=cfg.workers if isinstance(cfg.workers, int) else 0,
        rate_limiter=limiter,
        address=cfg.ray,
    )


def actor_policy(
    make_agent: Callable[..., Any], cfg: TrainConfig, agent_cfg: Any, info: Any
) -> Any:
    """A CPU copy of the run's agent, built inside a Ray actor (seeded from the actor's torch
    seed, so actors explore differently); the actor loads the learner's policy into it."""
    agent_cfg = dataclasses.replace(agent_cfg, seed=torch.initial_seed() % 2**31)
    return make_agent(cfg, agent_cfg, info, torch.device("cpu"))


def publish(run: Any) -> None:
    """Send the learner's policy to the actors; the agent counts the env steps inserted."""
    run.agent.env_steps = run.step
    run.collector.update_policy_weights(run.agent.policy_state_dict())


def same_run(cfg: TrainConfig, saved: dict[str, Any]) -> list[str]:
    """The settings in which ``cfg`` (resolved as a new run would be) differs from a
    checkpoint's ``saved`` config (empty: the same run)."""
    from rlstash.envs.make import probe_env
    from rlstash.train import algos

    resolved, _ = algos.resolve(cfg, probe_env(cfg.env, cfg.history).act_space)
    mine = dataclasses.asdict(resolved)
    return sorted(k for k in mine if k != "quiet" and mine[k] != saved.get(k))


def resume_dir(cfg: TrainConfig, run_dir: Path) -> Path:
    """``run_dir`` if it holds a checkpoint of this same Ray run, else a ValueError."""
    from rlstash.train import checkpoint

    ckpt = checkpoint.latest(run_dir)
    assert ckpt is not None
    differ = same_run(cfg, checkpoint.load_state(ckpt)["config"])
    if differ:
        raise ValueError(
            f"run_dir: {run_dir} holds a run with other settings ({', '.join(differ)}); "
            f"continue it with --resume {run_dir} or pick another --name"
        )
    return run_dir
