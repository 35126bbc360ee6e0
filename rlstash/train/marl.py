"""Multi-agent on-policy training (MAPPO, IPPO) on VMAS: ``rlstash train --algo mappo --env
vmas/navigation``.

::

    env = VmasVectorEnv(scenario, E)                 # torch-batched, on the learner's device
    rollout = MultiAgentRollout(T, E, A, ...)        # [T, E, A], planned before allocation
    while step < steps:
        collector.collect(agent, rollout)            # T steps of E envs, every agent
        metrics = agent.update(rollout)              # GAE per agent, n_epochs of minibatches
        rollout.carry_over(); step += T * E
        evaluate / checkpoint / log at their intervals (rlstash.train.drive)

:data:`MULTIAGENT` is the :class:`~rlstash.train.run.Learning` of the algorithms whose
registry entry says ``store="multiagent"``: its hooks (``probe``: a :class:`MultiAgentInfo`;
``make_store``, ``make_agent``, ``make_env``, ``make_collector``, ``make_eval``, ``settings``)
are the steps of :func:`rlstash.train.builders.build_run` that differ, and the loop,
evaluation (deterministic, on its own envs), checkpoints, resume and the learning curve are
:mod:`rlstash.train.drive`'s. :func:`plan_rollout` is ``rlstash plan --algo mappo``'s.
Frames count env steps (each with all its agents), as BenchMARL counts them. The scenario's
settings are BenchMARL's task configs (:data:`VMAS_TASKS`) overridden by ``--env-kwargs``
(JSON). With ``--envs N`` a rollout keeps the preset's frames (6,000): ``rollout_steps`` becomes
6000 // N unless given.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rlstash.agents.mappo import METRICS
from rlstash.collect.multiagent import MultiAgentCollector
from rlstash.envs.make import EnvInfo, is_multiagent, make_multiagent_env, parse_env_kwargs
from rlstash.envs.multiagent import action_shape, flat_obs_dim
from rlstash.storage.marl_rollout import MultiAgentRollout
from rlstash.train import algos, checkpoint
from rlstash.train.onpolicy import check_rollout_settings
from rlstash.train.run import Learning, Run

if TYPE_CHECKING:
    from rlstash.memory import MemoryPlan

VMAS_TASKS: dict[str, dict[str, Any]] = {  # BenchMARL 1.5: conf/task/vmas/<task>.yaml
    "vmas/navigation": dict(
        max_steps=100,
        n_agents=3,
        collisions=True,
        agents_with_same_goal=1,
        split_goals=False,
        observe_all_goals=False,
        shared_rew=False,
        lidar_range=0.35,
        agent_radius=0.1,
    ),  # fmt: skip
    "vmas/balance": dict(
        max_steps=100, n_agents=4, random_package_pos_on_line=True, package_mass=5
    ),  # fmt: skip
}
PRESET_FRAMES = 6000  # BenchMARL's on_policy_collected_frames_per_batch
VMAS_PRESET = dict(eval_every=12_000, eval_episodes=10, checkpoint_every=60_000)


def env_kwargs(cfg: Any) -> dict[str, Any]:
    """The scenario's settings: BenchMARL's task config, then ``cfg.env_kwargs`` (JSON)."""
    return {**VMAS_TASKS.get(cfg.env, {}), **parse_env_kwargs(cfg.env_kwargs)}


def make_env(cfg: Any, num_envs: int, device: torch.device, seed: int) -> Any:
    """The run's multi-agent env: ``vmas/<scenario>`` on ``device``, or ``pettingzoo:<module>``
    in the process pool (``--workers``); other ids are refused with the forms known."""
    if not is_multiagent(cfg.env):
        raise ValueError(
            f"env: --algo {cfg.algo} trains multi-agent envs, got {cfg.env!r}; use vmas/<scenario> "
            "(e.g. vmas/navigation, vmas/balance) or pettingzoo:<module> "
            "(e.g. pettingzoo:mpe2.simple_spread_v3)"
        )
    return make_multiagent_env(cfg.env, num_envs, cfg.workers, seed, env_kwargs(cfg), device=device)


@dataclass
class MultiAgentInfo(EnvInfo):
    """What a multi-agent run knows of its env before making it (:meth:`MultiAgentLearning.
    probe`): one agent's spaces (``obs_space``, ``act_space``: the group's), the agents and the
    global state's space (None: the env has none)."""

    n_agents: int = 1
    state_space: Any = None

    @property
    def obs_dim(self) -> int:
        """One agent's observation, flattened (a dict's keys concatenated)."""
        return flat_obs_dim(self.obs_space)

    @property
    def state_dim(self) -> int | None:
        return None if self.state_space is None else flat_obs_dim(self.state_space)


def rollout_sizes(agent_cfg: Any, info: MultiAgentInfo) -> dict[str, Any]:
    """The :class:`MultiAgentRollout` arguments of a run (its plan and its store alike)."""
    shape, discrete = action_shape(info.act_space)
    return dict(
        steps=agent_cfg.rollout_steps, num_envs=agent_cfg.num_envs, n_agents=info.n_agents,
        obs_dim=info.obs_dim, action_shape=shape,
        action_dtype=torch.int64 if discrete else torch.float32, state_dim=info.state_dim,
    )  # fmt: skip


class MultiAgentEval:
    """Deterministic evaluation on its own envs, as :func:`rlstash.train.drive.drive` calls it."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.collector = MultiAgentCollector(env)
        self.per_agent: list[float] = []

    def rollout(
        self, agent: Any, episodes: int, deterministic: bool = True, seed: int | None = None
    ) -> dict[str, Any]:
        if seed is not None:
            self.env.reset(seed=seed)  # the evaluation's seed (the next reset continues it)
        out = self.collector.evaluate(agent, episodes, deterministic)
        self.per_agent = out["per_agent"].mean(0).tolist()
        return out


class MultiAgentLearning(Learning):
    """MAPPO/IPPO: a [T, E, A] rollout by the current policy, one update on it, repeated."""

    name = "multiagent"

    def check(self, cfg: Any) -> None:
        for name, bad in (("history", cfg.history), ("ray", cfg.ray), ("video", cfg.video)):
            if bad:
                raise ValueError(
                    f"{name}: not supported by --algo {cfg.algo} (multi-agent runs); drop --{name}"
                )
        check_rollout_settings(cfg)

    def resolve(self, cfg: Any, agent_cfg: Any, given: dict[str, Any]) -> tuple[Any, Any]:
        changes: dict[str, Any] = {}
        if cfg.envs > 1:
            changes["num_envs"] = cfg.envs
            if "rollout_steps" not in given:  # keep BenchMARL's frames per rollout
                changes["rollout_steps"] = max(1, PRESET_FRAMES // cfg.envs)
        if "total_steps" not in given:
            changes["total_steps"] = cfg.steps
        agent_cfg = dataclasses.replace(agent_cfg, **changes)
        cfg = dataclasses.replace(cfg, agent={**cfg.agent, **changes})
        return cfg, agent_cfg

    def probe(self, cfg: Any) -> MultiAgentInfo:
        env = make_env(cfg, 1, torch.device("cpu"), cfg.seed)  # spaces (on any device), closed
        try:
            group = _one_group(env, cfg)
            return MultiAgentInfo(
                env.observation_spaces[group], env.action_spaces[group], None,
                n_agents=len(env.groups[group]), state_space=env.state_space,
            )  # fmt: skip
        finally:
            env.close()

    def pick_backend(self, cfg: Any) -> tuple[Any, str]:
        return cfg, ""  # VMAS on the learner's device, PettingZoo in the process pool

    def env_note(self, cfg: Any, why: str, env: Any) -> str:
        return ""  # the env is described with the rollout (describe)

    def settings(self, cfg: Any, info: MultiAgentInfo) -> dict[str, Any]:
        return {
            "algo": cfg.algo, "env": cfg.env, "env_kwargs": env_kwargs(cfg),
            "net_arch": checkpoint.as_json(cfg.agent.get("net_arch")),
            "agents": info.n_agents, "agent_obs_dim": info.obs_dim,
            "agent_action_space": str(info.act_space),
        }  # fmt: skip

    def make_store(
        self, cfg: Any, agent_cfg: Any, info: MultiAgentInfo, run_dir: Path,
        device: torch.device, state: dict[str, Any] | None,
    ) -> MultiAgentRollout:  # fmt: skip
        return MultiAgentRollout(**rollout_sizes(agent_cfg, info), device=device)

    def make_agent(
        self, cfg: Any, agent_cfg: Any, info: MultiAgentInfo, device: torch.device
    ) -> Any:
        learner = algos.ALGOS[cfg.algo].learner(info.act_space, cfg.env)
        sizes = (info.n_agents, info.obs_dim, info.state_dim)
        return learner.build(sizes, info.act_space, agent_cfg, device)

    def make_env(
        self, cfg: Any, agent_cfg: Any, info: MultiAgentInfo, device: torch.device, seed: int
    ) -> Any:
        return make_env(cfg, agent_cfg.num_envs, device, seed)

    def make_collector(
        self, cfg: Any, agent_cfg: Any, info: MultiAgentInfo, env: Any, agent: Any,
        limiter: Any, frames: int, seed: int,
    ) -> tuple[MultiAgentCollector, None]:  # fmt: skip
        collector = MultiAgentCollector(env, seed=seed)
        collector.steps_per_batch = agent_cfg.rollout_steps
        return collector, None

    def make_eval(
        self, cfg: Any, agent_cfg: Any, info: MultiAgentInfo, agent: Any, recorder: Any
    ) -> MultiAgentEval:
        device = agent.device
        return MultiAgentEval(make_env(cfg, min(cfg.eval_episodes, 10), device, cfg.seed + 10_000))

    def collect_frames(self, cfg: Any, agent_cfg: Any) -> int:
        return agent_cfg.rollout_steps * agent_cfg.num_envs

    def planned_updates(self, cfg: Any, agent_cfg: Any, limiter: Any, frames: int) -> int:
        return -(-cfg.steps // frames) * agent_cfg.n_epochs * -(-frames // agent_cfg.minibatch_size)

    def describe(self, run: Run) -> str:
        from rlstash.agents.nets import param_bytes
        from rlstash.memory import human_bytes

        r, agent = run.rollout, run.agent
        nets = param_bytes(agent.actor, agent.critic)
        return (
            f"env: {run.cfg.env} {json.dumps(env_kwargs(run.cfg))}, {r.num_envs} envs x "
            f"{r.n_agents} agents on {run.env.device}\n"
            f"rollout: {r.steps} steps x {r.num_envs} envs x {r.n_agents} agents, "
            f"{human_bytes(r.nbytes)} on {r.device}\n"
            f"networks ({agent.algo}, shared parameters: {agent.config.share_params}): "
            f"{human_bytes(nets)} of parameters on {agent.device} (x~4 with Adam state and "
            "gradients)"
        )

    def iterate(self, run: Run) -> Callable[[dict[str, Any]], dict[str, Any]]:
        names = run.env.groups[run.collector.group]

        def iterate(metrics: dict[str, Any]) -> dict[str, Any]:
            run.collector.collect(run.agent, run.rollout)
            metrics = run.agent.update(run.rollout)
            run.rollout.carry_over()
            run.step += run.frames_per_collect
            stats = run.collector.stats
            per_agent = stats.total / stats.episodes.clamp_min(1)  # [A], read when logged
            per_agent = torch.where(stats.episodes > 0, per_agent, float("nan"))  # none yet
            metrics.update({f"return_{a}": per_agent[i] for i, a in enumerate(names)})
            return metrics

        return iterate

    def save(self, run: Run) -> Path:
        return checkpoint.save(run.run_dir, run.state())  # a rollout is used once: no buffer


MULTIAGENT = MultiAgentLearning()


def plan_rollout(cfg: Any, device: torch.device) -> tuple[MemoryPlan, dict[str, Any]]:
    """(the memory plan of the rollout a run of ``cfg`` allocates on ``device``, its
    :class:`MultiAgentRollout` sizes), settings resolved as ``rlstash train`` resolves them
    (preset, ``--envs``) and the env probed; nothing is allocated. The bytes are the rollout's
    own (:meth:`MultiAgentRollout.plan`: the arithmetic it checks itself with)."""
    MULTIAGENT.check(cfg)
    info = MULTIAGENT.probe(cfg)
    given = dict(cfg.agent)
    cfg, agent_cfg = algos.resolve(cfg, info.act_space)
    cfg, agent_cfg = MULTIAGENT.resolve(cfg, agent_cfg, given)
    sizes = rollout_sizes(agent_cfg, info)
    return MultiAgentRollout.plan(**sizes, device=device), sizes


def _one_group(env: Any, cfg: Any) -> str:
    if len(env.groups) != 1:
        raise ValueError(
            f"env {cfg.env}: has agent groups {sorted(env.groups)} (agents with different "
            f"spaces); --algo {cfg.algo} trains one group here: pick a scenario whose agents "
            "are alike"
        )
    return next(iter(env.groups))


__all__ = [
    "METRICS",
    "MULTIAGENT",
    "VMAS_PRESET",
    "VMAS_TASKS",
    "MultiAgentInfo",
    "plan_rollout",
    "rollout_sizes",
]
