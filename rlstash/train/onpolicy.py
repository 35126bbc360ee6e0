"""The on-policy training loop (PPO): how collection and updates alternate, in one place.

::

    while step < steps and not solved:
        batch = collector.collect()               # T steps of N envs, by the current policy
        rollout.add(batch, collector.next_obs)    # [T, N] where the env data arrives (+ obs after)
        metrics = agent.update(rollout)           # n_epochs of shuffled minibatches, then done
        step += T * N
        evaluate / checkpoint / log at their intervals (excluded from train_seconds)

Collection and learning strictly alternate: each rollout is collected by exactly the policy
that is then updated on it, and is used by that one update only (no replay buffer, no rate
limiter: ``samples_per_insert`` is fixed at ``n_epochs`` by construction). N is ``--envs``
when given (> 1), else the agent's ``num_envs`` (the env's preset: 8 for CartPole-v1); T is
``rollout_steps``. The stopping rule, evaluation, checkpoints (agent with its normalisation
statistics, counters and RNG states), plots and telemetry are those of
:mod:`rlstash.train.drive`. :data:`ROLLOUT` is the :class:`~rlstash.train.run.Learning` of the
algorithms whose registry entry says ``store="rollout"``: the steps of
:func:`rlstash.train.builders.build_run` and of the loop that differ from off-policy runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rlstash.envs.make import env_source, make_pool_eval_env, make_vec_env
from rlstash.settings import field_values
from rlstash.storage.rollout import RolloutStorage
from rlstash.train import checkpoint
from rlstash.train.algos import rollout_envs
from rlstash.train.run import Learning, Run, step_spec


class RolloutLearning(Learning):
    """On-policy learning: a rollout of T steps of N envs by the current policy, one update
    on it (``n_epochs`` of shuffled minibatches), then the next rollout."""

    name = "rollout"
    same_step = True  # every row a real step (EnvPool's next-step resets cannot serve it)

    def check(self, cfg: Any) -> None:
        if cfg.history:
            raise ValueError(f"history: not supported by --algo {cfg.algo}; drop --history")

    def resolve(self, cfg: Any, agent_cfg: Any, given: dict[str, Any]) -> tuple[Any, Any]:
        check_rollout_settings(cfg)
        if "total_steps" not in given:  # anneal over this run unless told otherwise
            agent_cfg = dataclasses.replace(agent_cfg, total_steps=cfg.steps)
            cfg = dataclasses.replace(cfg, agent={**cfg.agent, "total_steps": cfg.steps})
        return cfg, agent_cfg

    def make_env(self, cfg: Any, agent_cfg: Any, info: Any, device: torch.device, seed: int) -> Any:
        # same-step autoreset: every row a real step (next-step mode spends a row per episode
        # end on a reset step); final observations come with the batch for bootstrapping; a
        # batched torch env's tensors stay on `device`
        source = env_source(cfg.env, info.act_space, agent_cfg.bound == "clip")
        n = rollout_envs(cfg, agent_cfg)
        return make_vec_env(cfg.env, n, cfg.workers, None, 0, device, same_step=True, source=source)

    def make_store(
        self, cfg: Any, agent_cfg: Any, info: Any, run_dir: Path, device: torch.device,
        state: dict[str, Any] | None,
    ) -> RolloutStorage:  # fmt: skip
        from rlstash.envs.make import is_batched

        return RolloutStorage(
            step_spec(info.obs_space, info.act_space), agent_cfg.rollout_steps,
            rollout_envs(cfg, agent_cfg), device=device if is_batched(cfg.env) else "cpu",
            same_step=True,  # the env's autoreset mode (make_env)
        )  # fmt: skip

    def collect_frames(self, cfg: Any, agent_cfg: Any) -> int:
        return agent_cfg.rollout_steps * rollout_envs(cfg, agent_cfg)

    def planned_updates(self, cfg: Any, agent_cfg: Any, limiter: Any, frames: int) -> int:
        per_rollout = agent_cfg.n_epochs * -(-frames // agent_cfg.minibatch_size)
        return -(-cfg.steps // frames) * per_rollout

    def make_eval_env(
        self, cfg: Any, agent_cfg: Any, info: Any, num_envs: int, recorder: Any
    ) -> Any:
        clip = agent_cfg.bound == "clip"
        return make_pool_eval_env(cfg.env, num_envs, info.act_space, clip, recorder)

    def describe(self, run: Run) -> str:
        from rlstash.agents.nets import param_bytes
        from rlstash.memory import human_bytes

        nets = param_bytes(*run.agent.nets.values())
        return (
            f"rollout: {run.rollout.steps} steps x {run.rollout.num_envs} envs, "
            f"{human_bytes(run.rollout.nbytes)} on {run.rollout.device}\n"
            f"networks: {human_bytes(nets)} of parameters on {run.agent.device} "
            "(x~4 with Adam state and gradients)"
        )

    def iterate(self, run: Run) -> Callable[[dict[str, Any]], dict[str, Any]]:
        def iterate(metrics: dict[str, Any]) -> dict[str, Any]:
            run.rollout.add(run.collector.collect(), run.collector.next_obs)
            metrics = run.agent.update(run.rollout)
            run.step += run.frames_per_collect
            return metrics

        return iterate

    def save(self, run: Run) -> Path:
        return checkpoint.save(run.run_dir, run.state())  # no buffer: a rollout is used once


ROLLOUT = RolloutLearning()


def check_rollout_settings(cfg: Any) -> None:
    """Refuse what an on-policy run (PPO, MAPPO, IPPO) has no use for: replay settings."""
    if cfg.storage != "ram":
        raise ValueError(
            f"storage: --algo {cfg.algo} keeps one rollout in memory and has no replay "
            f"storage; drop --storage {cfg.storage}"
        )
    if cfg.buffer_device != "cpu":
        raise ValueError(
            f"buffer_device: --algo {cfg.algo} keeps its rollout on --device, it has no "
            f"replay buffer; drop --buffer-device {cfg.buffer_device} (give --device)"
        )
    if cfg.compress != "none":
        raise ValueError(
            f"compress: --algo {cfg.algo} keeps one rollout in memory, not a replay of "
            f"frames; drop --compress {cfg.compress}"
        )
    for name, instead in (("batch_size", "minibatch_size"), ("n_steps", "rollout_steps"),
                          ("buffer_size", None), ("learning_starts", None),
                          ("train_freq", "rollout_steps"), ("gradient_steps", "n_epochs")):  # fmt: skip
        if field_values(cfg)[name] is not None:
            fix = f"give --{instead.replace('_', '-')} instead" if instead else "drop it"
            raise ValueError(f"{name}: a replay setting, not used by --algo {cfg.algo}; {fix}")
