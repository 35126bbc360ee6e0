"""Agents: DQN, SAC (continuous), TD3, discrete SAC for huge action sets and PPO; offline IQL
and TD3+BC; see :mod:`.base`."""

from rlstash.agents.actions import (
    ActionFeatures,
    ActionHead,
    ActionMask,
    EmbeddingActionHead,
    LinearActionHead,
    chunked_argmax,
    chunked_logsumexp,
    gumbel_scores,
    pack_mask,
    sample_softmax,
    sample_uniform,
    soft_policy_objective,
    softmax_stats,
)
from rlstash.agents.base import Agent, AgentBase, check_batch, read_metrics
from rlstash.agents.dqn import DQN, DQNConfig
from rlstash.agents.gae import gae, rollout_gae
from rlstash.agents.history import HistorySummarizer, HistoryWindow, transitions_from_windows
from rlstash.agents.iql import IQL, IQLConfig
from rlstash.agents.ppo import PPO, PPOConfig
from rlstash.agents.sac import SAC, SACConfig
from rlstash.agents.sac_discrete import DiscreteSAC, DiscreteSACConfig
from rlstash.agents.schedules import ConstantSchedule, LinearSchedule, epsilon_schedule
from rlstash.agents.td3 import TD3, TD3Config
from rlstash.agents.td3_bc import TD3BC, TD3BCConfig

ALGOS = {
    "dqn": DQN, "sac": SAC, "sac_discrete": DiscreteSAC, "ppo": PPO, "td3": TD3, "iql": IQL,
    "td3_bc": TD3BC,
}  # fmt: skip

__all__ = [
    "ALGOS",
    "DQN",
    "PPO",
    "PPOConfig",
    "SAC",
    "ActionFeatures",
    "ActionHead",
    "ActionMask",
    "Agent",
    "AgentBase",
    "ConstantSchedule",
    "DQNConfig",
    "DiscreteSAC",
    "DiscreteSACConfig",
    "EmbeddingActionHead",
    "HistorySummarizer",
    "HistoryWindow",
    "transitions_from_windows",
    "LinearActionHead",
    "LinearSchedule",
    "SACConfig",
    "TD3",
    "TD3Config",
    "TD3BC",
    "TD3BCConfig",
    "IQL",
    "IQLConfig",
    "check_batch",
    "read_metrics",
    "chunked_argmax",
    "chunked_logsumexp",
    "epsilon_schedule",
    "gae",
    "rollout_gae",
    "gumbel_scores",
    "pack_mask",
    "sample_softmax",
    "sample_uniform",
    "soft_policy_objective",
    "softmax_stats",
]
