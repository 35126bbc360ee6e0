"""The algorithms ``rlstash train`` knows: algo -> (agent config, agent, loop defaults, presets).

Adding an algorithm is one :func:`register` call::

    register(Algo("td3", {"continuous": Learner(TD3Config, build_td3)},
                  loop=dict(batch_size=256, learning_starts=100, train_freq=1, ...),
                  presets={"Pendulum-v1": dict(learning_rate=1e-3, n_steps=1, ...)}))

after which ``--algo td3`` trains it, ``rlstash train --help`` lists its settings and
``--set``, ``--config`` and the flags accept them. A run's settings are resolved in this
order (:func:`resolve`): the agent config's defaults and the algorithm's ``loop`` defaults, then
the env's preset, then what the user gave. A preset is one flat dict: keys that are
:class:`TrainConfig` fields set the loop, the others the agent's config.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from rlstash.agents.dqn import DQN, DQNConfig
from rlstash.agents.iql import IQL, IQLConfig
from rlstash.agents.mappo import IPPOConfig, MAPPOConfig
from rlstash.agents.mappo import build_agent as build_marl_agent
from rlstash.agents.ppo import PPO, PPOConfig
from rlstash.agents.qmix import QMIXConfig, VDNConfig
from rlstash.agents.qmix import build_agent as build_qmix_agent
from rlstash.agents.sac import SAC, SACConfig
from rlstash.agents.sac_discrete import DiscreteSAC, DiscreteSACConfig
from rlstash.agents.td3 import TD3, TD3Config
from rlstash.agents.td3_bc import TD3BC, TD3BCConfig
from rlstash.envs.atari import is_atari
from rlstash.envs.batched import REFERENCE_IDS
from rlstash.presets import DQN_PRESETS, PPO_ATARI, PPO_PRESETS, SAC_PRESETS, TD3_PRESETS
from rlstash.settings import SettingError, field_values
from rlstash.train.config import ALGOS, LOOP_SETTINGS, RUN_DEFAULTS, TrainConfig

ACTION_KINDS = ("discrete", "continuous")
STORES = ("replay", "rollout", "offline", "multiagent", "marl_replay")
DEFAULT_STEPS = 100_000
"""A run's env steps when ``steps`` is not given (an on-policy algorithm counts them in
rollouts of its preset: :func:`rollout_budget`); the run stops earlier at the threshold."""


@dataclass(frozen=True)
class Learner:
    """The agent of one action kind: its config class and ``build(obs_shape, act_space,
    config, device) -> agent``."""

    config: type
    build: Callable[[tuple[int, ...], Any, Any, torch.device], Any]


@dataclass(frozen=True)
class Algo:
    """One algorithm: a :class:`Learner` per action kind it handles, its loop defaults (every
    name in ``LOOP_SETTINGS``) and per-env presets (flat: loop and agent settings)."""

    name: str
    learners: dict[str, Learner]
    loop: dict[str, Any]
    presets: dict[str, dict[str, Any]] = field(default_factory=dict)
    help: str = ""
    budget: Callable[[TrainConfig, Any, Any], int] | None = None
    """``budget(cfg, agent_cfg, preset_agent_cfg) -> steps``: the run's default ``steps``
    (None: :data:`DEFAULT_STEPS`); ``preset_agent_cfg`` is the agent config of the defaults and
    the env's preset alone, ``agent_cfg`` the run's (what the user gave on top)."""
    store: str = "replay"
    """What the run keeps its experience in, which decides how it learns: ``"replay"``
    (off-policy: a replay buffer sampled at a rate-limited ratio, :mod:`rlstash.train.builders`)
    or ``"rollout"`` (on-policy: one rollout per update, :mod:`rlstash.train.onpolicy`)."""

    def __post_init__(self) -> None:
        if self.store not in STORES:
            raise ValueError(f"algo {self.name}: store must be one of {STORES}, got {self.store!r}")
        missing = set(LOOP_SETTINGS) - set(self.loop)
        if missing or set(self.learners) - set(ACTION_KINDS):
            raise ValueError(
                f"algo {self.name}: loop must give {sorted(missing)} and learners may only be "
                f"{ACTION_KINDS}"
            )
        train_fields = {f.name for f in dataclasses.fields(TrainConfig)}
        for learner in self.learners.values():
            if agent_fields(learner.config) & train_fields:
                raise ValueError(
                    f"algo {self.name}: {learner.config.__name__} repeats TrainConfig settings "
                    f"{sorted(agent_fields(learner.config) & train_fields)}; give each setting once"
                )
        for env_id, preset in self.presets.items():
            known = set(LOOP_SETTINGS).union(
                RUN_DEFAULTS, *(agent_fields(lr.config) for lr in self.learners.values())
            )
            if set(preset) - known:
                raise ValueError(
                    f"algo {self.name}: preset {env_id} has unknown settings {sorted(set(preset) - known)}"
                )

    @property
    def on_policy(self) -> bool:
        """Whether the algorithm learns from rollouts of its current policy (no replay)."""
        return self.store == "rollout"

    def learner(self, act_space: Any, env_id: str) -> Learner:
        """The learner for ``act_space``, or a ValueError naming the algorithms that fit."""
        kind = action_kind(act_space)
        if kind in self.learners:
            return self.learners[kind]
        want = " or ".join("a Discrete" if k == "discrete" else "a 1-D Box" for k in self.learners)
        others = [a.name for a in ALGOS.values() if kind in a.learners]
        fix = f"use --algo {' or --algo '.join(others)}" if others else "no algorithm handles it"
        raise ValueError(
            f"algo {self.name}: needs {want} action space, env {env_id} has {act_space}; {fix}"
        )


def register(algo: Algo) -> Algo:
    """Make ``algo`` available to ``rlstash train --algo NAME`` (and its flags)."""
    ALGOS[algo.name] = algo
    return algo


def agent_fields(config_cls: type) -> set[str]:
    """The settings of an agent config the user can give (the run's ``seed`` seeds the agent)."""
    return {f.name for f in dataclasses.fields(config_cls)} - {"seed"}


def action_kind(act_space: Any) -> str | None:
    """'discrete' (Discrete), 'continuous' (1-D Box) or None."""
    from gymnasium import spaces

    if isinstance(act_space, spaces.Discrete):
        return "discrete"
    if isinstance(act_space, spaces.Box) and len(act_space.shape) == 1:
        return "continuous"
    return None


def resolve(cfg: TrainConfig, act_space: Any) -> tuple[TrainConfig, Any]:
    """(the run's TrainConfig with every loop setting filled in, the agent's config):
    defaults, then the env's preset, then ``cfg``'s own values. Its ``agent`` holds the full
    agent settings, so resolving it again (a resumed run) gives the same run."""
    algo = ALGOS[cfg.algo]
    learner = algo.learner(act_space, cfg.env)
    known = agent_fields(learner.config)
    preset = algo.presets.get(preset_key(algo, cfg.env), {})
    given = dict(cfg.agent)
    for key in given:
        if key in LOOP_SETTINGS:
            raise SettingError(
                f"agent.{key}", f"a {cfg.algo} agent setting", key,
                f"{key} is a loop setting: give TrainConfig({key}=...) or --{key.replace('_', '-')}",
            )  # fmt: skip
        if key not in known:
            raise SettingError(
                f"agent.{key}", f"one of the {cfg.algo} settings ({', '.join(sorted(known))})", key,
                f"see rlstash train --algo {cfg.algo} --help",
            )  # fmt: skip
    loop = {k: v for k, v in {**algo.loop, **preset}.items() if k in LOOP_SETTINGS}
    settings = field_values(cfg)
    loop.update({k: settings[k] for k in LOOP_SETTINGS if settings[k] is not None})
    for k, default in RUN_DEFAULTS.items():  # eval/checkpoint schedule: given, preset, default
        loop[k] = settings[k] if settings[k] is not None else preset.get(k, default)
    agent_values = {k: v for k, v in preset.items() if k in known}
    if cfg.history:
        agent_values["history_hidden"] = 64
    planned = dict(agent_values)
    agent_values.update(given)
    agent_cfg = learner.config(**agent_values, seed=cfg.seed)
    if cfg.steps is None:
        loop["steps"] = DEFAULT_STEPS
        if algo.budget is not None:
            loop["steps"] = algo.budget(cfg, agent_cfg, learner.config(**planned, seed=cfg.seed))
    full = {k: v for k, v in dataclasses.asdict(agent_cfg).items() if k in known}
    resolved = dataclasses.replace(cfg, agent=full, **loop)
    resolved.check_replay()  # the replay's lanes and compression budget, before anything is built
    return resolved, agent_cfg


def preset_key(algo: Algo, env_id: str) -> str:
    """The key of ``env_id``'s preset in ``algo.presets``: the id itself, the reference id of
    rlstash's batched envs (``rlstash/X``: X's), or ``"atari"`` for any ALE id without its own."""
    key = REFERENCE_IDS.get(env_id, env_id)
    if key not in algo.presets and is_atari(key):
        return "atari"
    return key


# --- the built-in algorithms ---------------------------------------------------------------


def _build_discrete(cls: type) -> Callable[..., Any]:
    def build(obs_shape: tuple[int, ...], act_space: Any, config: Any, device: torch.device):
        return cls(obs_shape, int(act_space.n), config, device=device)

    return build


def _build_box(cls: type) -> Callable[..., Any]:
    def build(obs_shape: tuple[int, ...], act_space: Any, config: Any, device: torch.device):
        low, high = act_space.low, act_space.high
        return cls(obs_shape, int(act_space.shape[0]), low, high, config, device=device)

    return build


register(
    Algo(
        "dqn",
        {"discrete": Learner(DQNConfig, _build_discrete(DQN))},
        # Stable-Baselines3's DQN defaults
        loop=dict(
            batch_size=32,
            buffer_size=1_000_000,
            learning_starts=100,
            train_freq=4,
            gradient_steps=1,
            n_steps=1,
        ),  # fmt: skip
        presets=DQN_PRESETS,
        help="double DQN (Discrete actions)",
    )
)
register(
    Algo(
        "sac",
        {
            "discrete": Learner(DiscreteSACConfig, _build_discrete(DiscreteSAC)),
            "continuous": Learner(SACConfig, _build_box(SAC)),
        },
        # Stable-Baselines3's SAC defaults
        loop=dict(
            batch_size=256,
            buffer_size=1_000_000,
            learning_starts=100,
            train_freq=1,
            gradient_steps=1,
            n_steps=1,
        ),  # fmt: skip
        presets=SAC_PRESETS,
        help="SAC (1-D Box actions) or discrete SAC (Discrete actions)",
    )
)


def rollout_envs(cfg: TrainConfig, agent_cfg: Any) -> int:
    """Envs an on-policy run collects from: ``envs`` when given (> 1), else the agent's
    ``num_envs`` (the env's preset: 8 for PPO CartPole-v1)."""
    return cfg.envs if cfg.envs > 1 else agent_cfg.num_envs


def rollout_budget(cfg: TrainConfig, agent_cfg: Any, preset_cfg: Any) -> int:
    """The default ``steps`` of an on-policy run: :data:`DEFAULT_STEPS` counted in rollouts of
    the preset (``num_envs x rollout_steps`` env steps each), so a run of more envs or longer
    rollouts makes as many rollouts (updates, learning-rate annealing) as the preset planned:
    PPO CartPole-v1 plans 100,000 steps in rollouts of 8 x 32; at 1024 envs that is 12.8M."""
    run = rollout_envs(cfg, agent_cfg) * agent_cfg.rollout_steps
    planned = preset_cfg.num_envs * preset_cfg.rollout_steps
    return -(-DEFAULT_STEPS * run // planned)


def _build_ppo(obs_shape: tuple[int, ...], act_space: Any, config: Any, device: torch.device):
    from gymnasium import spaces

    if isinstance(act_space, spaces.Discrete):
        return PPO(obs_shape, int(act_space.n), config=config, device=device)
    return PPO(obs_shape, bounds=(act_space.low, act_space.high), config=config, device=device)


# PPO collects a rollout and updates on it (store "rollout": rlstash.train.onpolicy): it has no replay, so the
# replay settings are unused (None); its rollout and minibatch sizes are agent settings
# (rollout_steps, minibatch_size, num_envs). Presets: rlstash.presets (CartPole-v1 and
# HalfCheetah-v5: the RL Zoo's tuned entries; Hopper, Walker2d, Ant: CleanRL's
# ppo_continuous_action).
register(
    Algo(
        "ppo",
        {
            "discrete": Learner(PPOConfig, _build_ppo),
            "continuous": Learner(PPOConfig, _build_ppo),
        },
        loop=dict.fromkeys(LOOP_SETTINGS),
        presets={**{env: dict(p) for env, p in PPO_PRESETS.items()}, "atari": PPO_ATARI},
        help="PPO (Discrete or 1-D Box actions; on-policy: rollouts, no replay)",
        budget=rollout_budget,
        store="rollout",
    )
)

register(
    Algo(
        "td3",
        {"continuous": Learner(TD3Config, _build_box(TD3))},
        # Stable-Baselines3's TD3 defaults
        loop=dict(
            batch_size=256,
            buffer_size=1_000_000,
            learning_starts=100,
            train_freq=1,
            gradient_steps=1,
            n_steps=1,
        ),  # fmt: skip
        presets=TD3_PRESETS,
        help="TD3 (1-D Box actions)",
    )
)

# Offline algorithms (store "offline": rlstash.train.offline): they learn from --dataset alone;
# steps, eval_every and checkpoint_every count gradient steps, gradient_steps of them per
# round; the replay is the dataset (buffer_size unused). Settings: TorchRL's
# sota-implementations (batch 256).
OFFLINE_LOOP = dict(
    batch_size=256, buffer_size=None, learning_starts=0, train_freq=1, gradient_steps=100,
    n_steps=1,
)  # fmt: skip
register(
    Algo(
        "iql",
        {"continuous": Learner(IQLConfig, _build_box(IQL))},
        loop=OFFLINE_LOOP,
        help="IQL, offline from --dataset (1-D Box actions)",
        store="offline",
    )
)
register(
    Algo(
        "td3_bc",
        {"continuous": Learner(TD3BCConfig, _build_box(TD3BC))},
        loop=OFFLINE_LOOP,
        help="TD3+BC, offline from --dataset (1-D Box actions)",
        store="offline",
    )
)

# MAPPO and IPPO (store "multiagent": rlstash.train.marl): BenchMARL's defaults in the agent
# configs; its evaluation every 12,000 frames here (BenchMARL: 120,000) for a learning curve
_VMAS = dict(eval_every=12_000, eval_episodes=10, checkpoint_every=60_000)
for _name, _cfg, _help in (
    ("mappo", MAPPOConfig, "MAPPO (multi-agent: vmas/<scenario>; centralised critic)"),
    ("ippo", IPPOConfig, "IPPO (multi-agent: vmas/<scenario>; per-agent critic)"),
):
    register(
        Algo(
            _name,
            {
                "discrete": Learner(_cfg, build_marl_agent),
                "continuous": Learner(_cfg, build_marl_agent),
            },
            loop=dict.fromkeys(LOOP_SETTINGS),
            presets={"vmas/navigation": dict(_VMAS), "vmas/balance": dict(_VMAS)},
            help=_help,
            store="multiagent",
        )
    )

# QMIX and VDN (store "marl_replay": rlstash.train.marl_offpolicy): BenchMARL's off-policy
# settings (conf/experiment/base_experiment.yaml: 6,000 frames per collection from 10 envs,
# 1,000 optimizer steps of 128 per collection, a 1M-frame replay, TD(0)) in the loop; the
# agent's in QMIXConfig/VDNConfig (conf/algorithm/qmix.yaml, vdn.yaml). Evaluation as MAPPO's.
MARL_OFFPOLICY_LOOP = dict(
    batch_size=128, buffer_size=1_000_000, learning_starts=0, train_freq=6000,
    gradient_steps=1000, n_steps=1,
)  # fmt: skip
for _name, _cfg, _help in (
    ("qmix", QMIXConfig, "QMIX (multi-agent, Discrete actions: monotonic mixer of agent Qs)"),
    ("vdn", VDNConfig, "VDN (multi-agent, Discrete actions: the sum of agent Qs)"),
):
    register(
        Algo(
            _name,
            {"discrete": Learner(_cfg, build_qmix_agent)},
            loop=MARL_OFFPOLICY_LOOP,
            presets={"vmas/navigation": dict(_VMAS), "vmas/balance": dict(_VMAS)},
            help=_help,
            store="marl_replay",
        )
    )
