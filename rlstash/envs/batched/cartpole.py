"""``rlstash/CartPole-v1``: gymnasium's CartPole-v1 over N envs as torch tensors.

Same constants, Euler integration, termination (``|x| > 2.4`` or ``|theta| > 12 deg``),
reward 1 per step, initial states uniform in [-0.05, 0.05]^4 and a 500-step time limit as
``gymnasium.envs.classic_control.cartpole``. ``dtype=torch.float64`` reproduces gymnasium's
float64 state arithmetic; the default float32 is what a GPU runs fast (observations are
float32 either way, as gymnasium's).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from rlstash.envs.batched.core import BatchedVectorEnv

GRAVITY, MASSCART, MASSPOLE, LENGTH, FORCE_MAG, TAU = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
TOTAL_MASS = MASSPOLE + MASSCART
POLEMASS_LENGTH = MASSPOLE * LENGTH
THETA_THRESHOLD = 12 * 2 * math.pi / 360
X_THRESHOLD = 2.4


class CartPoleDynamics:
    """CartPole physics on ``[4, N]`` states ``(x, x_dot, theta, theta_dot)``."""

    state_dim = 4

    def __init__(self, dtype: torch.dtype = torch.float32, low: float = -0.05, high: float = 0.05):
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"dtype: expected torch.float32 or torch.float64, got {dtype!r}")
        self.dtype, self.low, self.high = str(dtype).removeprefix("torch."), float(low), float(high)
        bound = np.array([X_THRESHOLD * 2, np.inf, THETA_THRESHOLD * 2, np.inf], np.float32)
        self.single_observation_space = spaces.Box(-bound, bound, dtype=np.float32)
        self.single_action_space = spaces.Discrete(2)

    def initial(self, u: Any, ops: Any) -> Any:
        return ops.cast(self.low + (self.high - self.low) * u, self.dtype)  # [4, M]

    def check_action(self, action: Any, num_envs: int, ops: Any) -> Any:
        if tuple(action.shape) != (num_envs,) or not ops.is_int(action):
            raise ValueError(
                f"actions: expected integer actions of shape ({num_envs},) in {{0, 1}}, "
                f"got {action.dtype} {list(action.shape)}"
            )
        return action

    def step(self, state: Any, action: Any, ops: Any) -> tuple[Any, Any, Any]:
        xp = ops.xp
        x, x_dot, theta, theta_dot = state  # [N] each
        force = ops.cast(xp.where(action == 1, FORCE_MAG, -FORCE_MAG), self.dtype)
        cos, sin = xp.cos(theta), xp.sin(theta)
        temp = (force + POLEMASS_LENGTH * (theta_dot * theta_dot) * sin) / TOTAL_MASS
        theta_acc = (GRAVITY * sin - cos * temp) / (
            LENGTH * (4.0 / 3.0 - MASSPOLE * (cos * cos) / TOTAL_MASS)
        )
        x_acc = temp - POLEMASS_LENGTH * theta_acc * cos / TOTAL_MASS
        nxt = xp.stack(
            (
                x + TAU * x_dot,
                x_dot + TAU * x_acc,
                theta + TAU * theta_dot,
                theta_dot + TAU * theta_acc,
            )
        )  # [4, N]
        terminated = (abs(nxt[0]) > X_THRESHOLD) | (abs(nxt[2]) > THETA_THRESHOLD)
        reward = ops.ones(terminated.shape[0], "float32")
        return nxt, reward, terminated

    def observe(self, state: Any, ops: Any) -> Any:
        return ops.contiguous(state.T, "float32")  # [N, 4]


def CartPoleVectorEnv(
    num_envs: int = 1,
    device: str | torch.device = "cpu",
    max_episode_steps: int = 500,
    autoreset_mode: Any = AutoresetMode.NEXT_STEP,
    dtype: torch.dtype = torch.float32,
    **kwargs: Any,
) -> BatchedVectorEnv:
    """The vector entry point of ``rlstash/CartPole-v1`` (``gym.make_vec`` passes
    ``num_envs``, ``max_episode_steps`` and its keyword arguments)."""
    if kwargs:
        raise TypeError(
            f"rlstash/CartPole-v1: unknown arguments {sorted(kwargs)}; known: num_envs, device, "
            "max_episode_steps, autoreset_mode, dtype"
        )
    return BatchedVectorEnv(
        CartPoleDynamics(dtype), num_envs, device, max_episode_steps, autoreset_mode
    )
