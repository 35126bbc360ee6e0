"""``rlstash/Pendulum-v1``: gymnasium's Pendulum-v1 over N envs as torch tensors.

Same constants (g = 10, m = l = 1, dt = 0.05, max speed 8, max torque 2), cost
``angle_normalize(th)^2 + 0.1 thdot^2 + 0.001 u^2`` (reward = -cost), initial states
uniform in [-pi, pi] x [-1, 1], never terminated, truncated after 200 steps, as
``gymnasium.envs.classic_control.pendulum``. The torque is clipped and squared in float32
as gymnasium does; ``dtype=torch.float64`` keeps the state in float64 like gymnasium.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from rlstash.envs.batched.core import BatchedVectorEnv

MAX_SPEED, MAX_TORQUE, DT, G, M, L = 8.0, 2.0, 0.05, 10.0, 1.0, 1.0


class PendulumDynamics:
    """Pendulum physics on ``[2, N]`` states ``(theta, theta_dot)``."""

    state_dim = 2

    def __init__(self, dtype: torch.dtype = torch.float32):
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"dtype: expected torch.float32 or torch.float64, got {dtype!r}")
        self.dtype = str(dtype).removeprefix("torch.")
        high = np.array([1.0, 1.0, MAX_SPEED], dtype=np.float32)
        self.single_observation_space = spaces.Box(-high, high, dtype=np.float32)
        self.single_action_space = spaces.Box(-MAX_TORQUE, MAX_TORQUE, (1,), np.float32)

    def initial(self, u: Any, ops: Any) -> Any:
        th = -math.pi + 2 * math.pi * u[0]
        thdot = -1.0 + 2.0 * u[1]
        return ops.cast(ops.xp.stack((th, thdot)), self.dtype)  # [2, M]

    def check_action(self, action: Any, num_envs: int, ops: Any) -> Any:
        if tuple(action.shape) != (num_envs, 1) or not ops.is_float(action):
            raise ValueError(
                f"actions: expected float actions of shape ({num_envs}, 1), "
                f"got {action.dtype} {list(action.shape)}"
            )
        return action

    def step(self, state: Any, action: Any, ops: Any) -> tuple[Any, Any, Any]:
        xp, f = ops.xp, self.dtype
        th, thdot = state  # [N] each
        u = xp.clip(ops.cast(action[:, 0], "float32"), -MAX_TORQUE, MAX_TORQUE)  # float32
        norm = xp.remainder(th + math.pi, 2 * math.pi) - math.pi
        costs = norm * norm + 0.1 * (thdot * thdot) + ops.cast(0.001 * (u * u), f)
        acc = 3 * G / (2 * L) * xp.sin(th) + ops.cast(3.0 / (M * L**2) * u, f)
        newthdot = xp.clip(thdot + acc * DT, -MAX_SPEED, MAX_SPEED)
        nxt = xp.stack((th + newthdot * DT, newthdot))  # [2, N]
        return nxt, ops.cast(-costs, "float32"), ops.zeros(th.shape[0], "bool")

    def observe(self, state: Any, ops: Any) -> Any:
        th, thdot = state
        obs = ops.xp.stack((ops.xp.cos(th), ops.xp.sin(th), thdot), 1)  # [N, 3]
        return ops.contiguous(obs, "float32")


def PendulumVectorEnv(
    num_envs: int = 1,
    device: str | torch.device = "cpu",
    max_episode_steps: int = 200,
    autoreset_mode: Any = AutoresetMode.NEXT_STEP,
    dtype: torch.dtype = torch.float32,
    **kwargs: Any,
) -> BatchedVectorEnv:
    """The vector entry point of ``rlstash/Pendulum-v1``."""
    if kwargs:
        raise TypeError(
            f"rlstash/Pendulum-v1: unknown arguments {sorted(kwargs)}; known: num_envs, device, "
            "max_episode_steps, autoreset_mode, dtype"
        )
    return BatchedVectorEnv(
        PendulumDynamics(dtype), num_envs, device, max_episode_steps, autoreset_mode
    )
