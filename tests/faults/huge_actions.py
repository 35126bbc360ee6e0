"""An env with 10**12 discrete actions (registered on import as ``HugeActions-v0``):
``rlstash train --env tests.faults.huge_actions:HugeActions-v0``."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

N_ACTIONS = 10**12


class HugeActions(gym.Env):
    """4 zeros for an observation, reward 0, episodes of 50 steps; 10**12 actions."""

    observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = spaces.Discrete(N_ACTIONS)

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return np.zeros(4, np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        return np.zeros(4, np.float32), 0.0, False, False, {}


if "HugeActions-v0" not in gym.registry:
    gym.register("HugeActions-v0", entry_point=HugeActions, max_episode_steps=50)
