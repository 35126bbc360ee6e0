"""rlstash: reinforcement-learning experience, collected in parallel, stored once, delivered anywhere.

Public API (imported lazily, so that env worker processes importing ``rlstash.envs.worker``
never pull in torch)::

    from rlstash import Spec, Field, ReplayBuffer, TensorStorage, MemmapStorage, StreamStorage
    from rlstash import UniformSampler, PrioritizedSampler, SequenceSampler, plan
    from rlstash import ProcessPoolVectorEnv, Collector, RayCollector, DQN, SAC, DiscreteSAC, PPO, TD3, RateLimiter
    from rlstash import from_rsl_rl   # rsl_rl-style envs (Isaac Lab, Genesis) for the Collector
    from rlstash import PettingZooVectorEnv   # PettingZoo Parallel envs in the process pool
    from rlstash import RolloutStorage
    from rlstash import Logger, wandb_logger, push_to_hub, pull_from_hub   # tracking, sharing
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rlstash import registration as _registration

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    # data
    "Spec": "rlstash.spec",
    "Field": "rlstash.spec",
    "plan": "rlstash.memory",
    "MemoryPlan": "rlstash.memory",
    "InsufficientMemoryError": "rlstash.memory",
    "IndexRangeError": "rlstash.indices",
    "TensorStorage": "rlstash.storage.ram",
    "MemmapStorage": "rlstash.storage.disk",
    "StreamStorage": "rlstash.storage.stream",
    "FrameCompression": "rlstash.storage.frames",
    "TieredStorage": "rlstash.storage.tiered",
    "BootstrapMask": "rlstash.storage.bootstrap",
    "UniformSampler": "rlstash.sampler",
    "PrioritizedSampler": "rlstash.sampler",
    "SequenceSampler": "rlstash.sampler",
    "RingWriter": "rlstash.writer",
    "ReplayBuffer": "rlstash.replay",
    "Delivery": "rlstash.device",
    "RateLimiter": "rlstash.ratelimit",
    # envs and collection
    "ProcessPoolVectorEnv": "rlstash.envs.process_pool",
    "EnvPoolVectorEnv": "rlstash.envs.envpool_env",  # envpool itself imported when one is made
    "WorkerFailedError": "rlstash.envs.errors",
    "EnvPool": "rlstash.envs",  # the old name of ProcessPoolVectorEnv: warns once
    "Collector": "rlstash.collect.sync",
    "from_rsl_rl": "rlstash.envs.rsl_rl",  # rsl_rl-style envs (Isaac Lab, Genesis) as batched envs
    "PettingZooVectorEnv": "rlstash.envs.pettingzoo",  # PettingZoo Parallel envs, multi-agent
    "AsyncCollector": "rlstash.collect.async_",
    "RayCollector": "rlstash.collect.ray",  # Ray itself is imported only when one is built
    "RayActorFailedError": "rlstash.collect.ray",
    # multi-agent: the layout, VMAS (an optional extra), per-agent rollouts, MAPPO/IPPO
    "MultiAgentVectorEnv": "rlstash.envs.multiagent",
    "MultiAgentStep": "rlstash.envs.multiagent",
    "VmasVectorEnv": "rlstash.envs.vmas",  # VMAS itself is imported only when one is built
    "MultiAgentCollector": "rlstash.collect.multiagent",
    "MultiAgentRollout": "rlstash.storage.marl_rollout",
    "GroupedRollout": "rlstash.storage.marl_rollout",  # several agent groups: one per group
    "MAPPO": "rlstash.agents.mappo",
    "GroupedMAPPO": "rlstash.agents.mappo_groups",
    "MAPPOConfig": "rlstash.agents.mappo",
    "IPPOConfig": "rlstash.agents.mappo",
    # multi-agent off-policy: the stream's agent fields, its collector, QMIX/VDN
    "agent_step_spec": "rlstash.storage.stream_agents",
    "MultiAgentStreamCollector": "rlstash.collect.marl_stream",
    "QMIX": "rlstash.agents.qmix",
    "QMIXConfig": "rlstash.agents.qmix",
    "VDNConfig": "rlstash.agents.qmix",
    # agents
    "DQN": "rlstash.agents.dqn",
    "DQNConfig": "rlstash.agents.dqn",
    "SAC": "rlstash.agents.sac",
    "SACConfig": "rlstash.agents.sac",
    "DiscreteSAC": "rlstash.agents.sac_discrete",
    "DiscreteSACConfig": "rlstash.agents.sac_discrete",
    "PPO": "rlstash.agents.ppo",
    "PPOConfig": "rlstash.agents.ppo",
    "RolloutStorage": "rlstash.storage.rollout",
    "obs_shapes": "rlstash.agents.dict_obs",
    "TD3": "rlstash.agents.td3",
    "TD3Config": "rlstash.agents.td3",
    "IQL": "rlstash.agents.iql",  # offline: rlstash train --algo iql --dataset NAME
    "IQLConfig": "rlstash.agents.iql",
    "TD3BC": "rlstash.agents.td3_bc",
    "TD3BCConfig": "rlstash.agents.td3_bc",
    "read_metrics": "rlstash.agents.base",
    "HistorySummarizer": "rlstash.agents.history",
    "HistoryWindow": "rlstash.agents.history",
    "transitions_from_windows": "rlstash.agents.history",
    # the training application
    "TrainConfig": "rlstash.train.config",
    # tracking (rlstash train --track wandb) and sharing (rlstash push / pull)
    "Logger": "rlstash.train.tracking",
    "WandbLogger": "rlstash.train.tracking",
    "wandb_logger": "rlstash.train.tracking",
    "push_to_hub": "rlstash.hub.client",
    "pull_from_hub": "rlstash.hub.client",
}

__all__ = [
    "AsyncCollector",
    "BootstrapMask",
    "Collector",
    "DQN",
    "DQNConfig",
    "Delivery",
    "DiscreteSAC",
    "DiscreteSACConfig",
    "EnvPoolVectorEnv",
    "ProcessPoolVectorEnv",
    "Field",
    "FrameCompression",
    "GroupedMAPPO",
    "GroupedRollout",
    "HistorySummarizer",
    "HistoryWindow",
    "transitions_from_windows",
    "IndexRangeError",
    "InsufficientMemoryError",
    "IPPOConfig",
    "MAPPO",
    "MAPPOConfig",
    "MemmapStorage",
    "MemoryPlan",
    "MultiAgentCollector",
    "MultiAgentRollout",
    "MultiAgentStep",
    "MultiAgentStreamCollector",
    "MultiAgentVectorEnv",
    "PPO",
    "PPOConfig",
    "PettingZooVectorEnv",
    "PrioritizedSampler",
    "QMIX",
    "QMIXConfig",
    "RateLimiter",
    "RayActorFailedError",
    "RayCollector",
    "ReplayBuffer",
    "RingWriter",
    "RolloutStorage",
    "SAC",
    "SACConfig",
    "TD3",
    "TD3Config",
    "TD3BC",
    "TD3BCConfig",
    "IQL",
    "IQLConfig",
    "SequenceSampler",
    "Spec",
    "StreamStorage",
    "TensorStorage",
    "TieredStorage",
    "TrainConfig",
    "Logger",
    "WandbLogger",
    "wandb_logger",
    "push_to_hub",
    "pull_from_hub",
    "UniformSampler",
    "VDNConfig",
    "VmasVectorEnv",
    "WorkerFailedError",
    "agent_step_spec",
    "from_rsl_rl",
    "obs_shapes",
    "plan",
    "read_metrics",
]


_registration.install()  # the gymnasium ids rlstash/CartPole-v1, rlstash/Pendulum-v1


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rlstash' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)


if TYPE_CHECKING:  # for type checkers and IDEs; no runtime import
    from rlstash.agents.base import read_metrics
    from rlstash.agents.dict_obs import obs_shapes
    from rlstash.agents.mappo import MAPPO, IPPOConfig, MAPPOConfig
    from rlstash.agents.mappo_groups import GroupedMAPPO
    from rlstash.agents.qmix import QMIX, QMIXConfig, VDNConfig
    from rlstash.collect.marl_stream import MultiAgentStreamCollector
    from rlstash.collect.multiagent import MultiAgentCollector
    from rlstash.collect.ray import RayActorFailedError, RayCollector
    from rlstash.collect.sync import Collector
    from rlstash.device import Delivery
    from rlstash.envs.envpool_env import EnvPoolVectorEnv
    from rlstash.envs.errors import WorkerFailedError
    from rlstash.envs.multiagent import MultiAgentStep, MultiAgentVectorEnv
    from rlstash.envs.pettingzoo import PettingZooVectorEnv
    from rlstash.envs.process_pool import ProcessPoolVectorEnv
    from rlstash.envs.rsl_rl import from_rsl_rl
    from rlstash.envs.vmas import VmasVectorEnv
    from rlstash.hub.client import pull_from_hub, push_to_hub
    from rlstash.indices import IndexRangeError
    from rlstash.memory import InsufficientMemoryError, MemoryPlan, plan
    from rlstash.ratelimit import RateLimiter
    from rlstash.replay import ReplayBuffer
    from rlstash.sampler import PrioritizedSampler, SequenceSampler, UniformSampler
    from rlstash.spec import Field, Spec
    from rlstash.storage.disk import MemmapStorage
    from rlstash.storage.frames import FrameCompression
    from rlstash.storage.marl_rollout import GroupedRollout, MultiAgentRollout
    from rlstash.storage.ram import TensorStorage
    from rlstash.storage.rollout import RolloutStorage
    from rlstash.storage.stream_agents import agent_step_spec
    from rlstash.train.config import TrainConfig
    from rlstash.train.tracking import Logger, WandbLogger, wandb_logger
    from rlstash.writer import RingWriter
