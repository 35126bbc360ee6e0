"""Batched torch envs: N environments stepped as tensors on one device (CPU, CUDA, ...).

``rlstash/CartPole-v1`` and ``rlstash/Pendulum-v1`` are gymnasium's CartPole and Pendulum
written as tensor programs over ``N`` envs (thousands), with gymnasium's dynamics, bounds,
termination, time limits (500 / 200 steps, reported as truncated), both autoreset modes and
per-env seeding. They are the reference for the batched-env contract that GPU simulators
(ManiSkill3's ``ManiSkillVectorEnv``, Isaac Lab) follow: a gymnasium ``VectorEnv`` whose
``reset``/``step`` take and return torch tensors on one device::

    import gymnasium as gym
    import rlstash  # registers the ids (no torch import until an env is made)

    env = gym.make_vec("rlstash/CartPole-v1", num_envs=4096,
                       vectorization_mode="vector_entry_point", device="cuda")
    obs, info = env.reset(seed=0)          # [4096, 4] float32 on cuda
    obs, reward, terminated, truncated, info = env.step(actions)  # actions: [4096] int64

``gym.make("rlstash/CartPole-v1")`` (one env) is gymnasium's numpy env, so the id also
works with the process pool and anything else that makes single envs.

This package's ``__init__`` is torch-free; the env modules import torch and are loaded
only through their entry points.
"""

from __future__ import annotations

ENV_IDS: dict[str, dict] = {
    "rlstash/CartPole-v1": dict(
        entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv",
        vector_entry_point="rlstash.envs.batched.cartpole:CartPoleVectorEnv",
        max_episode_steps=500,
        reward_threshold=475.0,
    ),
    "rlstash/Pendulum-v1": dict(
        entry_point="gymnasium.envs.classic_control.pendulum:PendulumEnv",
        vector_entry_point="rlstash.envs.batched.pendulum:PendulumVectorEnv",
        max_episode_steps=200,
    ),
}

REFERENCE_IDS = {"rlstash/CartPole-v1": "CartPole-v1", "rlstash/Pendulum-v1": "Pendulum-v1"}
"""The gymnasium env each batched env reproduces (its presets and thresholds apply)."""

__all__ = ["ENV_IDS", "REFERENCE_IDS"]
