"""A PettingZoo Parallel env with two agent groups of different spaces (as MPE's
simple_adversary has): ``pettingzoo:tests.marl.pz_groups``.

Torch-free (the pool's workers import it). ``adversary_0`` observes [t, u, 1] (3 floats) and
picks one of 3 actions, rewarded 1 for action 2; ``agent_0`` and ``agent_1`` observe
[t, u, i, 1, 0] (5 floats) and act in Box(-1, 1, (2,)), rewarded -|a_0 - 0.5|. Episodes last
``length`` steps. With ``state`` the env has a global state (every observation, 13 floats).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo.utils.env import ParallelEnv

AGENTS = ["adversary_0", "agent_0", "agent_1"]


class GroupsEnv(ParallelEnv):
    """Two groups: ``adversary`` (1 agent, Discrete(3)) and ``agent`` (2 agents, a Box)."""

    metadata = {"name": "groups_v0"}

    def __init__(self, length: int = 5, state: bool = False):
        self.possible_agents = list(AGENTS)
        self.length = length
        if state:
            self.state_space = spaces.Box(-np.inf, np.inf, (13,), np.float32)
        self.agents: list[str] = []
        self.rng = np.random.default_rng()
        self.t, self.u = 0, 0.0

    def observation_space(self, agent: str) -> spaces.Space:
        return spaces.Box(-np.inf, np.inf, (3 if agent.startswith("adv") else 5,), np.float32)

    def action_space(self, agent: str) -> spaces.Space:
        if agent.startswith("adv"):
            return spaces.Discrete(3)
        return spaces.Box(-1.0, 1.0, (2,), np.float32)

    def _obs(self, agent: str) -> np.ndarray:
        if agent.startswith("adv"):
            return np.array([self.t, self.u, 1], np.float32)
        return np.array([self.t, self.u, AGENTS.index(agent), 1, 0], np.float32)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.t, self.u = 0, float(self.rng.random())
        self.agents = list(AGENTS)
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        self.t += 1
        rewards = {}
        for a in self.agents:
            act = actions[a]
            if a.startswith("adv"):
                rewards[a] = float(int(act) == 2)
            else:
                assert np.shape(act) == (2,), (a, act)
                rewards[a] = -abs(float(act[0]) - 0.5)
        over = self.t >= self.length
        obs = {a: self._obs(a) for a in self.agents}
        terms = dict.fromkeys(self.agents, False)
        truncs = dict.fromkeys(self.agents, over)
        infos: dict = {a: {} for a in self.agents}
        if over:
            self.agents = []
        return obs, rewards, terms, truncs, infos

    def state(self) -> np.ndarray:
        if not hasattr(self, "state_space"):
            return ParallelEnv.state(self)
        return np.concatenate([self._obs(a) for a in AGENTS])


def parallel_env(**kwargs: Any) -> GroupsEnv:
    """``pettingzoo:tests.marl.pz_groups`` makes a :class:`GroupsEnv`."""
    return GroupsEnv(**kwargs)
