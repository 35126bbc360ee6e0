"""Collector on gymnasium's SyncVectorEnv (the ProcessPoolVectorEnv has its own tests)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from rlstash.collect import Collector


def make_env(mode=AutoresetMode.NEXT_STEP, n=4):
    return SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(n)], autoreset_mode=mode)


def zeros_policy(obs: torch.Tensor) -> torch.Tensor:
    return torch.zeros(obs.shape[0], dtype=torch.int64)


def test_batches_are_time_major_and_complete():
    env = make_env()
    c = Collector(env, zeros_policy, frames_per_batch=64, seed=0)
    b = c.collect()
    assert b["obs"].shape == (16, 4, 4) and b["obs"].dtype == torch.float32
    assert b["action"].shape == (16, 4) and b["action"].dtype == torch.int64
    for k in ("reward", "terminated", "truncated"):
        assert b[k].shape == (16, 4)
    assert "final_obs" not in b
    assert c.frames == 64
    env.close()


def test_next_step_autoreset_rows_follow_the_env():
    """Always pushing left ends CartPole episodes in ~10 steps: the row after a done is the
    reset step (reward 0, action ignored) and the next row starts a fresh episode."""
    env = make_env(n=2)
    c = Collector(env, zeros_policy, frames_per_batch=80, seed=1)
    b = c.collect()
    done = (b["terminated"] | b["truncated"]).numpy()
    t, i = np.argwhere(done)[0]
    assert b["reward"][t + 1, i] == 0.0  # reset step
    assert not done[t + 1, i]
    assert c.stats.count >= 2
    assert all(8 <= length <= 20 for length in c.stats.lengths)
    assert c.stats.returns[0] == c.stats.lengths[0]  # CartPole: reward 1 per step
    env.close()


def test_same_step_mode_gives_final_obs():
    env = make_env(AutoresetMode.SAME_STEP, n=2)
    c = Collector(env, zeros_policy, frames_per_batch=80, seed=1)
    b = c.collect()
    done = (b["terminated"] | b["truncated"]).numpy()
    t, i = np.argwhere(done)[0]
    final = b["final_obs"][t, i]
    assert final.abs().sum() > 0
    assert not torch.equal(final, b["obs"][t + 1, i])  # the next row is the reset obs
    assert torch.all(b["final_obs"][~torch.from_numpy(done)] == 0)
    env.close()


def test_rollout_counts_episodes_per_env():
    env = make_env(n=3)
    c = Collector(env, zeros_policy, frames_per_batch=30, seed=0)
    out = c.rollout(episodes=7, seed=3)
    assert out["returns"].shape == (7,) and out["lengths"].shape == (7,)
    np.testing.assert_array_equal(out["returns"], out["lengths"])
    env.close()


def test_rollout_uses_agent_act_deterministic():
    class Agent:
        def __init__(self):
            self.flags = []

        def act(self, obs, deterministic=False):
            self.flags.append(deterministic)
            return torch.ones(obs.shape[0], dtype=torch.int64)

    env = make_env(n=2)
    agent = Agent()
    c = Collector(env, zeros_policy, frames_per_batch=2)
    c.rollout(agent, episodes=2)
    assert agent.flags and all(agent.flags)
    env.close()


@pytest.mark.parametrize("fpb", [3, 6, "8"])
def test_bad_frames_per_batch(fpb):
    env = make_env(n=4)
    with pytest.raises(ValueError, match="frames_per_batch"):
        Collector(env, zeros_policy, frames_per_batch=fpb)
    env.close()


def test_bad_policy():
    env = make_env(n=2)
    with pytest.raises(TypeError, match="policy"):
        Collector(env, "greedy", frames_per_batch=2)  # type: ignore[arg-type]
    env.close()
