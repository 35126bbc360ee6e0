"""A PettingZoo Parallel env that costs almost nothing to step (bench/marl_pz.py's ``tiny``
task): it measures what each vectorisation adds per step, not the env's physics.

Three agents, Box(18,) float32 observations, Discrete(5) actions, 25-step episodes (every
agent truncated together); each step adds the action to a running observation. Torch-free.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo.utils.env import ParallelEnv

AGENTS = ("agent_0", "agent_1", "agent_2")
LENGTH = 25


class TinyEnv(ParallelEnv):
    """See the module docstring."""

    metadata = {"name": "tiny_v0"}

    def __init__(self) -> None:
        self.possible_agents = list(AGENTS)
        self.render_mode = None
        self.agents: list[str] = []
        self.obs_space = spaces.Box(-np.inf, np.inf, (18,), np.float32)
        self.act_space = spaces.Discrete(5)
        self.values = {a: np.zeros(18, np.float32) for a in AGENTS}
        self.t = 0

    def observation_space(self, agent: str) -> spaces.Space:
        return self.obs_space

    def action_space(self, agent: str) -> spaces.Space:
        return self.act_space

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.t, self.agents = 0, list(AGENTS)
        for v in self.values.values():
            v[:] = 0.0 if seed is None else float(seed)
        return {a: self.values[a].copy() for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        self.t += 1
        end = self.t >= LENGTH
        obs, rew, term, trunc, info = {}, {}, {}, {}, {}
        for a in self.agents:
            self.values[a][0] += int(actions[a])
            obs[a] = self.values[a].copy()
            rew[a], term[a], trunc[a], info[a] = 0.0, False, end, {}
        if end:
            self.agents = []
        return obs, rew, term, trunc, info


def parallel_env(**kwargs: Any) -> TinyEnv:
    """``pettingzoo:pz_tiny`` (with ``bench/`` on the path)."""
    return TinyEnv(**kwargs)
