"""Fixtures of the offline tests: Minari datasets made by Minari's own DataCollector under a
temporary MINARI_DATASETS_PATH, and the agents' compile fixtures."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from tests.agents.conftest import aot_eager, no_cuda  # noqa: F401 - fixtures used here


def dict_env(max_steps: int = 30):
    """A small env with Dict observations {"pos": f32[2], "vel": {"x": f64[1]}}, Box actions,
    terminating at random and truncated after ``max_steps`` steps (TimeLimit)."""
    import gymnasium as gym
    from gymnasium import spaces

    class _DictEnv(gym.Env):
        observation_space = spaces.Dict(
            {
                "pos": spaces.Box(-10, 10, (2,), np.float32),
                "vel": spaces.Dict({"x": spaces.Box(-10, 10, (1,), np.float64)}),
            }
        )
        action_space = spaces.Box(-1, 1, (2,), np.float32)

        def _obs(self):
            return {"pos": self.pos.copy(), "vel": {"x": self.vel.copy()}}

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.pos = self.np_random.uniform(-1, 1, 2).astype(np.float32)
            self.vel = self.np_random.uniform(-1, 1, 1)
            return self._obs(), {}

        def step(self, action):
            self.pos = np.clip(self.pos + 0.1 * np.asarray(action, np.float32), -10, 10)
            self.vel = self.vel * 0.9 + 0.01
            terminated = bool(self.np_random.random() < 0.05)
            return self._obs(), float(self.pos.sum()), terminated, False, {}

    return gym.wrappers.TimeLimit(_DictEnv(), max_steps)


def collect(dataset_id: str, env, steps: int, seed: int = 0, record_infos: bool = False):
    """A Minari dataset of ``steps`` random-action steps of ``env`` made by DataCollector
    (``record_infos``: DataCollector's own option, the step infos kept)."""
    minari = pytest.importorskip("minari", reason="Minari tests need rlstash[minari]")
    collector = minari.DataCollector(env, record_infos=record_infos)
    collector.reset(seed=seed)
    collector.action_space.seed(seed)
    for _ in range(steps):
        _, _, term, trunc, _ = collector.step(collector.action_space.sample())
        if term or trunc:
            collector.reset()
    with warnings.catch_warnings():  # Minari's advice to set author, code_permalink, ...
        warnings.simplefilter("ignore", UserWarning)
        ds = collector.create_dataset(dataset_id=dataset_id, algorithm_name="random")
    collector.close()
    return ds


@pytest.fixture
def minari_path(tmp_path, monkeypatch):
    """MINARI_DATASETS_PATH under tmp_path (Minari reads it on every call)."""
    pytest.importorskip("minari", reason="Minari tests need rlstash[minari]")
    pytest.importorskip("jax", reason="minari.DataCollector needs jax (minari[create])")
    path = tmp_path / "minari"
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(path))
    return path
