"""Put first on ``PYTHONPATH`` to run CleanRL's ``ppo_atari_envpool.py`` unchanged over
envpool >= 1.0 (``bench/learn_atari_ppo.run_cleanrl``), where the envpool it pins cannot be
installed: CleanRL pins envpool 0.6.6 + gym 0.23.1 on Python < 3.11; this machine has 3.11
only (no envpool 0.6.6 wheel) and the registry refused envpool 0.8.4 (connection resets).

envpool 1.x's ``make(env_type="gym")`` returns a gymnasium pool (5-tuple steps, ``reset``
returning ``(obs, info)``, a read-only ``num_envs``); envpool 0.6 returned gym's old API.
This wraps it back: ``reset() -> obs``, ``step -> (obs, reward, terminated | truncated,
info)``, gym (not gymnasium) spaces, settable attributes. Nothing else changes: the same C++
pool, the same options the script passes, EnvPool's defaults for the rest.
"""

import envpool
import gym
import numpy as np

_make = envpool.make


class OldGymPool:
    """An envpool >= 1.0 gymnasium pool with envpool 0.6's gym API (see the module)."""

    def __init__(self, pool):
        self._pool = pool
        self.action_space = gym.spaces.Discrete(int(pool.action_space.n))
        space = pool.observation_space
        self.observation_space = gym.spaces.Box(0, 255, space.shape, np.uint8)

    def reset(self, **kwargs):
        return self._pool.reset()[0]

    def step(self, actions):
        obs, reward, terminated, truncated, info = self._pool.step(actions)
        return obs, reward, terminated | truncated, info

    def close(self):
        self._pool.close()


def make(task_id, env_type="gym", **kwargs):
    if env_type == "gym":
        return OldGymPool(_make(task_id, env_type="gymnasium", **kwargs))
    return _make(task_id, env_type=env_type, **kwargs)


envpool.make = make
