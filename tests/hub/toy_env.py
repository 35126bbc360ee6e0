"""A tiny env that renders RGB frames without pygame (CartPole needs it to render), for the
replay video of ``rlstash push``: 4 observations, 2 actions, episodes of 10 steps, reward 1
for action 1; registered as ``RlstashRenderToy-v0`` when imported."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

ENV_ID = "RlstashRenderToy-v0"
LENGTH = 10


class RenderToy(gym.Env):
    """See the module docstring."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(self, render_mode: str | None = None) -> None:
        self.render_mode = render_mode
        self.observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.t = 0

    def _obs(self) -> np.ndarray:
        return np.full(4, self.t / LENGTH, np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), float(action), self.t >= LENGTH, False, {}

    def render(self) -> np.ndarray:
        frame = np.zeros((16, 16, 3), np.uint8)
        frame[:, : self.t + 1] = 255
        return frame


if ENV_ID not in gym.registry:
    gym.register(id=ENV_ID, entry_point=RenderToy)
