"""The multi-agent vector env protocol (shared by the VMAS and PettingZoo sources).

Copied from the shared layout text (MARL_LAYOUT.md) so that the PettingZoo source runs on
this branch; the VMAS helper owns this module and the coordinator keeps that version.

A multi-agent vector env (``MultiAgentVectorEnv``, a ``typing.Protocol``, runtime-checkable)::

    num_envs: int
    device: torch.device                       # where its tensors live (CPU for PettingZoo)
    groups: dict[str, tuple[str, ...]]         # group name -> agent names, a fixed agent axis;
                                               # agents with identical spaces share a group
                                               # (one group "agents" when all agents are alike),
                                               # order = the env's possible_agents / VMAS agents
    observation_spaces: dict[str, gymnasium.Space]   # per group: ONE agent's observation space
    action_spaces: dict[str, gymnasium.Space]        # per group: ONE agent's action space
    state_space: gymnasium.Space | None        # the global state where the env provides one
    def reset(self, *, seed: int | None = None) -> MultiAgentStep
    def step(self, actions: dict[str, torch.Tensor]) -> MultiAgentStep   # [E, A_g, *act_shape]
    def close(self) -> None

On reset: reward 0, terminated/truncated False, mask True for present agents.
Errors name the agent/group: unknown agent names, mismatched spaces, wrong action shapes are
refused with a ValueError that names the agent or group, what was expected, what came, the fix.
Worker restarts (process pool): the affected envs' episodes end for all their agents
(truncated True, env_done True) and the next obs is the restarted env's first one.

Torch-free at import (annotations only), like the rest of :mod:`rlstash.envs`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import gymnasium
    import torch


@dataclass
class MultiAgentStep:
    """One reset or step of every env, per agent group (shapes: E envs, A_g agents)."""

    obs: dict[
        str, torch.Tensor | dict[str, torch.Tensor]
    ]  # [E, A_g, *obs_shape] (dict obs: a dict of those)
    reward: dict[str, torch.Tensor]  # [E, A_g] float32 (team reward: the same value for each agent)
    terminated: dict[str, torch.Tensor]  # [E, A_g] bool
    truncated: dict[str, torch.Tensor]  # [E, A_g] bool
    mask: dict[str, torch.Tensor]  # [E, A_g] bool: the agent acted in this step (False once it
    # is done or absent, until its env resets); rows with
    # mask False contribute nothing to losses and are never sampled
    action_mask: dict[str, torch.Tensor | None]  # [E, A_g, n] bool for discrete actions, else None
    state: torch.Tensor | None  # [E, *state_shape]
    env_done: torch.Tensor  # [E] bool: every agent of that env is done; the env
    # resets in the same step (autoreset "same_step"):
    # obs/state hold the new episode's first values and
    final_obs: dict[str, torch.Tensor] | None  # holds the last observations of the ended episodes
    # (rows where env_done; None when no env ended)


@runtime_checkable
class MultiAgentVectorEnv(Protocol):
    """E envs of several agents each, stepped together; tensors per agent group."""

    num_envs: int
    device: torch.device
    groups: dict[str, tuple[str, ...]]
    observation_spaces: dict[str, gymnasium.Space]
    action_spaces: dict[str, gymnasium.Space]
    state_space: gymnasium.Space | None

    def reset(self, *, seed: int | None = None) -> MultiAgentStep: ...

    def step(self, actions: dict[str, torch.Tensor]) -> MultiAgentStep: ...

    def close(self) -> None: ...


__all__ = ["MultiAgentStep", "MultiAgentVectorEnv"]
