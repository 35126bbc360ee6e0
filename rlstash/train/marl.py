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
Frames count env steps (each with all its agents), as BenchMARL counts them. An env with
several agent groups (agents with different spaces) trains one agent per group
(:class:`~rlstash.agents.mappo_groups.GroupedMAPPO`) on a
:class:`~rlstash.storage.marl_rollout.GroupedRollout`; its logs carry every agent's and every
group's return, its checkpoints every group. ``--video`` records VMAS evaluations
(:func:`rlstash.train.video.record_batched`). The scenario's
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
from rlstash.storage.marl_rollout import GroupedRollout, MultiAgentRollout
from rlstash.train import algos, checkpoint
from rlstash.train.onpolicy import check_rollout_settings
from rlstash.train.run import Learning, Run

if TYPE_CHECKING:
    from rlstash.agents.mappo_groups import GroupedMAPPO
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
    groups: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    observation_spaces: dict[str, Any] = dataclasses.field(default_factory=dict)
    action_spaces: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def obs_dim(self) -> int:
        """One agent's observation, flattened (a dict's keys concatenated)."""
        return flat_obs_dim(self.obs_space)

    @property
    def state_dim(self) -> int | None:
        return None if self.state_space is None else flat_obs_dim(self.state_space)

    @property
    def grouped(self) -> bool:
        """The env has several agent groups (one agent and one rollout per group)."""
        return len(self.groups) > 1

    @property
    def joint_dim(self) -> int:
        """Every agent's observation of every group, flattened and concatenated."""
        return sum(
            len(m) * flat_obs_dim(self.observation_spaces[g]) for g, m in self.groups.items()
        )

    def group_info(self, group: str) -> MultiAgentInfo:
        """The info of one group (its spaces and agents; the env's state)."""
        return MultiAgentInfo(
            self.observation_spaces[group], self.action_spaces[group], None,
            n_agents=len(self.groups[group]), state_space=self.state_space,
            groups={group: self.groups[group]},
            observation_spaces={group: self.observation_spaces[group]},
            action_spaces={group: self.action_spaces[group]},
        )  # fmt: skip


def rollout_sizes(agent_cfg: Any, info: MultiAgentInfo) -> dict[str, Any]:
    """The :class:`MultiAgentRollout` arguments of a run (its plan and its store alike); with
    several groups the :class:`GroupedRollout` arguments (``groups``: each group's sizes)."""
    if info.grouped:
        groups = {}
        for g in info.groups:
            sizes = rollout_sizes(agent_cfg, info.group_info(g))
            groups[g] = {k: sizes[k] for k in ("n_agents", "obs_dim", "action_shape",
                                               "action_dtype")}  # fmt: skip
        return dict(steps=agent_cfg.rollout_steps, num_envs=agent_cfg.num_envs, groups=groups,
                    state_dim=info.state_dim)  # fmt: skip
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
    uses_env_kwargs = True

    def check(self, cfg: Any) -> None:
        for name, bad in (("history", cfg.history), ("ray", cfg.ray)):
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
            group = next(iter(env.groups))  # the first group's spaces pick the preset
            return MultiAgentInfo(
                env.observation_spaces[group], env.action_spaces[group], None,
                n_agents=len(env.groups[group]), state_space=env.state_space,
                groups=dict(env.groups), observation_spaces=dict(env.observation_spaces),
                action_spaces=dict(env.action_spaces),
            )  # fmt: skip
        finally:
            env.close()

    def pick_backend(self, cfg: Any) -> tuple[Any, str]:
        return cfg, ""  # VMAS on the learner's device, PettingZoo in the process pool

    def env_note(self, cfg: Any, why: str, env: Any) -> str:
        return ""  # the env is described with the rollout (describe)

    def settings(self, cfg: Any, info: MultiAgentInfo) -> dict[str, Any]:
        out = {
            "algo": cfg.algo, "env": cfg.env, "env_kwargs": env_kwargs(cfg),
            "net_arch": checkpoint.as_json(cfg.agent.get("net_arch")),
            "agents": info.n_agents, "agent_obs_dim": info.obs_dim,
            "agent_action_space": str(info.act_space),
        }  # fmt: skip
        if info.grouped:  # every group's agents and spaces (a checkpoint holds every group)
            out["groups"] = {
                g: {"agents": list(m), "obs_dim": flat_obs_dim(info.observation_spaces[g]),
                    "action_space": str(info.action_spaces[g])}
                for g, m in info.groups.items()
            }  # fmt: skip
        return out

    def make_store(
        self, cfg: Any, agent_cfg: Any, info: MultiAgentInfo, run_dir: Path,
        device: torch.device, state: dict[str, Any] | None,
    ) -> MultiAgentRollout | GroupedRollout:  # fmt: skip
        if info.grouped:
            return GroupedRollout(**rollout_sizes(agent_cfg, info), device=device)
        return MultiAgentRollout(**rollout_sizes(agent_cfg, info), device=device)

    def make_agent(
        self, cfg: Any, agent_cfg: Any, info: MultiAgentInfo, device: torch.device
    ) -> Any:
        if info.grouped:
            return make_grouped_agent(cfg, agent_cfg, info, device)
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
        env = make_env(cfg, min(cfg.eval_episodes, 10), agent.device, cfg.seed + 10_000)
        if recorder is not None:  # --video: env 0's episodes (VMAS renders headless)
            from rlstash.train.video import record_batched

            try:
                record_batched(env, recorder, cfg.env)
            except BaseException:
                env.close()
                raise
        return MultiAgentEval(env)

    def collect_frames(self, cfg: Any, agent_cfg: Any) -> int:
        return agent_cfg.rollout_steps * agent_cfg.num_envs

    def planned_updates(self, cfg: Any, agent_cfg: Any, limiter: Any, frames: int) -> int:
        return -(-cfg.steps // frames) * agent_cfg.n_epochs * -(-frames // agent_cfg.minibatch_size)

    def describe(self, run: Run) -> str:
        from rlstash.agents.nets import param_bytes
        from rlstash.memory import human_bytes

        r, agent = run.rollout, run.agent
        nets = param_bytes(*_networks(agent))
        groups = ""
        if len(run.env.groups) > 1:
            groups = " in groups " + ", ".join(f"{g} ({len(m)})" for g, m in run.env.groups.items())
        return (
            f"env: {run.cfg.env} {json.dumps(env_kwargs(run.cfg))}, {r.num_envs} envs x "
            f"{r.n_agents} agents{groups} on {run.env.device}\n"
            f"rollout: {r.steps} steps x {r.num_envs} envs x {r.n_agents} agents, "
            f"{human_bytes(r.nbytes)} on {r.device}\n"
            f"networks ({agent.algo}, shared parameters: {agent.config.share_params}): "
            f"{human_bytes(nets)} of parameters on {agent.device} (x~4 with Adam state and "
            "gradients)"
        )

    def iterate(self, run: Run) -> Callable[[dict[str, Any]], dict[str, Any]]:
        names = run.collector.agent_names  # every group's agents, in group order
        spans, i = {}, 0
        for g, members in run.env.groups.items():
            spans[g], i = slice(i, i + len(members)), i + len(members)
        grouped = len(spans) > 1

        def iterate(metrics: dict[str, Any]) -> dict[str, Any]:
            run.collector.collect(run.agent, run.rollout)
            metrics = run.agent.update(run.rollout)
            run.rollout.carry_over()
            run.step += run.frames_per_collect
            stats = run.collector.stats
            per_agent = stats.total / stats.episodes.clamp_min(1)  # [A], read when logged
            per_agent = torch.where(stats.episodes > 0, per_agent, float("nan"))  # none yet
            metrics.update({f"return_{a}": per_agent[i] for i, a in enumerate(names)})
            if grouped:  # each group's mean return per agent
                metrics.update({f"group_return_{g}": per_agent[s].mean() for g, s in spans.items()})
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
    if info.grouped:
        return GroupedRollout.plan(**sizes, device=device), sizes
    return MultiAgentRollout.plan(**sizes, device=device), sizes


def settings_now(config: dict[str, Any]) -> dict[str, Any]:
    """What a multi-agent checkpoint's settings say of its env (agents, observation sizes,
    action spaces, groups), as the env of the recorded ``config`` (a TrainConfig's fields)
    has them now: :func:`rlstash.train.rundir.read_checkpoint` refuses a checkpoint whose
    networks do not fit the env any more."""
    from rlstash.train.config import TrainConfig

    cfg = TrainConfig(**config)
    settings = MULTIAGENT.settings(cfg, MULTIAGENT.probe(cfg))
    keys = ("agents", "agent_obs_dim", "agent_action_space", "groups")
    return {k: settings[k] for k in keys if k in settings}


def evaluate_saved(
    cfg: Any, state: dict[str, Any], ckpt: Path, episodes: int, seed: int, device: str,
    recorder: Any = None,
) -> dict[str, Any]:  # fmt: skip
    """``rlstash eval`` of a multi-agent run: its agent (every group's) rebuilt from the
    checkpoint ``state`` and rolled out deterministically for ``episodes`` episodes on up to
    10 envs; with ``recorder`` the episodes of env 0 (``eval-s<seed>-<i>.mp4``,
    ``out["videos"]``)."""
    import numpy as np

    info = MULTIAGENT.probe(cfg)
    given = dict(cfg.agent)
    cfg, agent_cfg = algos.resolve(cfg, info.act_space)
    cfg, agent_cfg = MULTIAGENT.resolve(cfg, agent_cfg, given)
    agent = MULTIAGENT.make_agent(cfg, agent_cfg, info, torch.device(device))
    with checkpoint.reading(ckpt / checkpoint.STATE):
        agent.load_state_dict(state["agent"])
    n = min(episodes, 10)
    env = make_env(cfg, n, torch.device(device), seed)
    try:
        if recorder is not None:  # env 0 runs episodes // n of the episodes
            from rlstash.train.video import record_batched

            record_batched(env, recorder, cfg.env)
            recorder.request(*(f"eval-s{seed}-{i}" for i in range(episodes // n)))
        out = MultiAgentEval(env).rollout(agent, episodes, deterministic=True, seed=seed)
    finally:
        env.close()
    if recorder is not None:
        out["videos"] = np.asarray([str(p) for p in recorder.written])
    return out


def make_grouped_agent(
    cfg: Any, agent_cfg: Any, info: MultiAgentInfo, device: torch.device
) -> GroupedMAPPO:
    """One MAPPO/IPPO per group, each built by the algorithm's learner for its group's action
    space (seeded ``seed + i`` for the i-th group); the centralised critics' global input is
    the env's state, else every group's observations (:attr:`MultiAgentInfo.joint_dim`)."""
    from rlstash.agents.mappo_groups import GroupedMAPPO

    state_dim = info.state_dim if info.state_dim is not None else info.joint_dim
    agents = {}
    for i, g in enumerate(info.groups):
        gi = info.group_info(g)
        learner = algos.ALGOS[cfg.algo].learner(gi.act_space, cfg.env)
        group_cfg = dataclasses.replace(agent_cfg, seed=agent_cfg.seed + i)
        agents[g] = learner.build((gi.n_agents, gi.obs_dim, state_dim), gi.act_space, group_cfg,
                                  device)  # fmt: skip
    return GroupedMAPPO(agents)


def _networks(agent: Any) -> list[Any]:
    """The actors and critics of an agent (every group's)."""
    from rlstash.agents.mappo_groups import GroupedMAPPO

    if isinstance(agent, GroupedMAPPO):
        return [m for a in agent.agents.values() for m in (a.actor, a.critic)]
    return [agent.actor, agent.critic]


__all__ = [
    "METRICS",
    "MULTIAGENT",
    "VMAS_PRESET",
    "VMAS_TASKS",
    "MultiAgentInfo",
    "plan_rollout",
    "rollout_sizes",
]
