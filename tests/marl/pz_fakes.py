"""Small PettingZoo Parallel envs that misbehave on purpose, for the PettingZoo tests.

Torch-free (numpy, gymnasium, pettingzoo): the pool's workers import this module to build
them, and the tests check that the workers never load torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo.utils.env import ParallelEnv

AGENTS = ["a_0", "a_1", "a_2"]


class RaggedEnv(ParallelEnv):
    """Three agents: ``a_0`` plays the whole episode (``length`` steps, then truncated),
    ``a_1`` terminates at its ``done_at``-th step, ``a_2`` is absent until step ``join_at``.
    obs = [t, u, agent index] with u drawn from the seeded generator at reset; reward =
    10 * agent index + t + action; ``a_0``'s action mask forbids action 2 (in infos).
    ``state()`` is every agent's observation, concatenated."""

    metadata = {"name": "ragged_v0"}

    def __init__(self, length: int = 5, done_at: int = 2, join_at: int = 2, dict_obs: bool = False):
        self.possible_agents = list(AGENTS)
        self.length, self.done_at, self.join_at = length, done_at, join_at
        self.dict_obs = dict_obs
        self.state_space = spaces.Box(-np.inf, np.inf, (9,), np.float32)
        self.agents: list[str] = []
        self.rng = np.random.default_rng()
        self.t, self.u = 0, 0.0

    def observation_space(self, agent: str) -> spaces.Space:
        box = spaces.Box(-np.inf, np.inf, (3,), np.float32)
        if self.dict_obs:
            return spaces.Dict({"pos": box, "id": spaces.Discrete(3)})
        return box

    def action_space(self, agent: str) -> spaces.Space:
        return spaces.Discrete(3)

    def _obs(self, agent: str) -> Any:
        i = AGENTS.index(agent)
        vec = np.array([self.t, self.u, i], dtype=np.float32)
        return {"pos": vec, "id": i} if self.dict_obs else vec

    def _infos(self) -> dict:
        return {
            a: ({"action_mask": np.array([1, 1, 0], np.int8)} if a == "a_0" else {})
            for a in self.agents
        }

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.t, self.u = 0, float(self.rng.random())
        self.agents = ["a_0", "a_1"] + (["a_2"] if self.join_at <= 0 else [])
        return {a: self._obs(a) for a in self.agents}, self._infos()

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        self.t += 1
        rewards = {a: float(10 * AGENTS.index(a) + self.t + actions[a]) for a in self.agents}
        terms = {a: a == "a_1" and self.t >= self.done_at for a in self.agents}
        truncs = {a: self.t >= self.length for a in self.agents}
        obs = {a: self._obs(a) for a in self.agents}
        self.agents = [a for a in self.agents if not (terms[a] or truncs[a])]
        if self.t == self.join_at and self.t < self.length:
            self.agents.append("a_2")
            obs["a_2"] = self._obs("a_2")
        return obs, rewards, terms, truncs, self._infos()

    def state(self) -> np.ndarray:
        out = np.zeros(9, dtype=np.float32)
        for a in self.agents:
            i = AGENTS.index(a)
            vec = self._obs(a)["pos"] if self.dict_obs else self._obs(a)
            out[3 * i : 3 * i + 3] = np.asarray(vec)[:3]
        return out


class CrashEnv(RaggedEnv):
    """A :class:`RaggedEnv` that raises at step ``crash_at`` of an episode reset with seed
    ``crash_seed`` (a restarted worker resets with fresh seeds: it does not crash again)."""

    def __init__(self, crash_at: int = 3, crash_seed: int = 100, **kwargs: Any):
        super().__init__(**kwargs)
        self.crash_at, self.crash_seed, self.seed = crash_at, crash_seed, None

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.seed = seed
        return super().reset(seed=seed, options=options)

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        if self.seed == self.crash_seed and self.t + 1 == self.crash_at:
            raise RuntimeError("CrashEnv: crashed on purpose")
        return super().step(actions)


class StrangerEnv(RaggedEnv):
    """Returns an observation for an agent that is not in ``possible_agents``."""

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        obs, rewards, terms, truncs, infos = super().step(actions)
        obs["stranger"] = np.zeros(3, np.float32)
        return obs, rewards, terms, truncs, infos


class MixedEnv(RaggedEnv):
    """``a_2`` has a larger observation than ``a_0``/``a_1`` (two groups by default)."""

    def observation_space(self, agent: str) -> spaces.Space:
        return spaces.Box(-np.inf, np.inf, (4 if agent == "a_2" else 3,), np.float32)

    def _obs(self, agent: str) -> Any:
        vec = super()._obs(agent)
        return np.append(vec, 1.0).astype(np.float32) if agent == "a_2" else vec


def parallel_env(**kwargs: Any) -> RaggedEnv:
    """``pettingzoo:tests.marl.pz_fakes`` makes a :class:`RaggedEnv`."""
    return RaggedEnv(**kwargs)


class MaskObsEnv(RaggedEnv):
    """Observations in PettingZoo's classic form ``{"observation", "action_mask"}``; agent i
    may not take action i."""

    def observation_space(self, agent: str) -> spaces.Space:
        return spaces.Dict(
            {
                "observation": spaces.Box(-np.inf, np.inf, (3,), np.float32),
                "action_mask": spaces.MultiBinary(3),
            }
        )

    def _obs(self, agent: str) -> Any:
        mask = np.ones(3, np.int8)
        mask[AGENTS.index(agent)] = 0
        return {"observation": super()._obs(agent), "action_mask": mask}

    def _infos(self) -> dict:
        return {a: {} for a in self.agents}

    def state(self) -> np.ndarray:
        return np.zeros(9, np.float32)


class UndeclaredStateEnv(RaggedEnv):
    """Has ``state()`` but declares no ``state_space``."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        del self.state_space


class NoStateEnv(RaggedEnv):
    """No global state: PettingZoo's base ``state()`` (raises NotImplementedError)."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        del self.state_space

    state = ParallelEnv.state


class BoxEnv(RaggedEnv):
    """Continuous actions: Box(-1, 1, (2,)); reward = 10 * agent index + t + sum(action)."""

    def action_space(self, agent: str) -> spaces.Space:
        return spaces.Box(-1.0, 1.0, (2,), np.float32)

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        for a, act in actions.items():
            assert np.shape(act) == (2,), (a, act)
        obs, rewards, terms, truncs, infos = super().step(
            {a: float(np.sum(v)) for a, v in actions.items()}
        )
        return obs, rewards, terms, truncs, infos


class EpisodeStateEnv(ParallelEnv):
    """Two agents, both truncated after ``length`` steps; a global state that differs per
    step and per episode and does not depend on which agents are left:
    ``state() = [100 * episode + t, u, 1]`` (``episode`` counts this instance's resets, u is
    drawn at reset from the seeded generator). obs = [t, u, agent index]. With ``crash_at``:
    raises at that step of the instance's second episode (a worker restart after one ended)."""

    metadata = {"name": "episode_state_v0"}

    def __init__(self, length: int = 3, crash_at: int | None = None):
        self.possible_agents = ["b_0", "b_1"]
        self.length, self.crash_at = length, crash_at
        self.state_space = spaces.Box(-np.inf, np.inf, (3,), np.float32)
        self.agents: list[str] = []
        self.rng = np.random.default_rng()
        self.t, self.u, self.episode = 0, 0.0, 0

    def observation_space(self, agent: str) -> spaces.Space:
        return spaces.Box(-np.inf, np.inf, (3,), np.float32)

    def action_space(self, agent: str) -> spaces.Space:
        return spaces.Discrete(2)

    def _obs(self, agent: str) -> np.ndarray:
        return np.array([self.t, self.u, self.possible_agents.index(agent)], np.float32)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.t, self.u, self.episode = 0, float(self.rng.random()), self.episode + 1
        self.agents = list(self.possible_agents)
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        if self.episode == 2 and self.crash_at is not None and self.t + 1 == self.crash_at:
            raise RuntimeError("EpisodeStateEnv: crashed on purpose")
        self.t += 1
        obs = {a: self._obs(a) for a in self.agents}
        rewards = {a: float(actions[a]) for a in self.agents}
        terms = {a: False for a in self.agents}
        truncs = {a: self.t >= self.length for a in self.agents}
        infos: dict = {a: {} for a in self.agents}
        if self.t >= self.length:
            self.agents = []
        return obs, rewards, terms, truncs, infos

    def state(self) -> np.ndarray:
        return np.array([100 * self.episode + self.t, self.u, 1.0], np.float32)
