"""What ``rlstash train`` stores when an episode ends, through the run it builds (env, collector,
stream replay; the ``iterate`` of its loop): a fall (``terminated``) is stored as terminated and
not bootstrapped, a time limit (``truncated``) as truncated and bootstrapped from the final
observation, and no transition crosses into the next episode.

HalfCheetah-like envs never end early; Hopper-like ones do (a fall ends the episode, else the
1,000-step limit does): ``FallOrLimit-v0`` has both kinds of episode, every step labelled in
its observation ``[env uid, episode, t]``, so each stored transition can be checked against
what the env did."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlstash.train.builders import build_run
from rlstash.train.config import TrainConfig

FALL_AT, LIMIT = 7, 12  # even episodes fall at step 7, odd ones reach the time limit
ENV_ID = "tests.test_train_episode_ends:FallOrLimit-v0"


class FallOrLimit(gym.Env):
    """obs [uid, episode, t] (float64, as MuJoCo's); reward t after the step; Box actions."""

    observation_space = spaces.Box(-np.inf, np.inf, (3,), np.float64)
    action_space = spaces.Box(-1.0, 1.0, (2,), np.float32)

    def __init__(self) -> None:
        self.uid, self.episode, self.t = -1.0, -1, 0

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        if self.uid < 0:
            self.uid = float(self.np_random.integers(1, 2**31))
        self.episode, self.t = self.episode + 1, 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        fell = self.episode % 2 == 0 and self.t == FALL_AT
        return self._obs(), float(self.t), fell, False, {}

    def _obs(self) -> np.ndarray:
        return np.array([self.uid, self.episode, self.t], np.float64)


if "FallOrLimit-v0" not in gym.registry:
    gym.register("FallOrLimit-v0", entry_point=FallOrLimit, max_episode_steps=LIMIT)


@pytest.mark.parametrize("envs", [1, 3])
def test_train_stores_a_fall_as_terminated_and_a_time_limit_as_truncated(
    tmp_path: Path, envs: int
) -> None:
    cfg = TrainConfig(algo="sac", env=ENV_ID, envs=envs, steps=10_000, seed=0,
                      run_dir=str(tmp_path), name="r", device="cpu", quiet=True,
                      agent={"net_arch": (8,), "compile": False})  # fmt: skip
    run = build_run(cfg, tmp_path / "r")
    try:
        iterate = run.learning.iterate(run)
        while run.step < 150 * envs:  # fewer than learning_starts: collection only
            iterate({})
        st = run.rb.storage
        got = st.read(np.flatnonzero(st.valid))
        y = run.agent.td_target(got, torch.tensor(0.1))  # the SAC target of these rows
    finally:
        run.close()
    obs, nxt = got["obs"].numpy(), got["next_obs"].numpy()
    term, trunc = got["terminated"].numpy(), got["truncated"].numpy()
    assert (nxt[:, :2] == obs[:, :2]).all(), "a transition crossed into another episode"
    assert (nxt[:, 2] == obs[:, 2] + 1).all(), "next_obs is not the step's next observation"
    assert (got["reward"].numpy() == nxt[:, 2]).all()
    falls = (obs[:, 1] % 2 == 0) & (nxt[:, 2] == FALL_AT)
    limits = (obs[:, 1] % 2 == 1) & (nxt[:, 2] == LIMIT)
    assert falls.sum() >= 2 * envs and limits.sum() >= 2 * envs
    np.testing.assert_array_equal(term, falls)  # a fall: terminated, never truncated
    np.testing.assert_array_equal(trunc, limits)  # the time limit: truncated only
    # every finished episode is stored whole: steps 0 .. end-1 of each (uid, episode)
    ends = {(u, e): int(t) for (u, e, t), d in zip(nxt, term | trunc) if d}
    starts: dict[tuple[float, float], set[int]] = {}
    for u, e, t in obs:
        starts.setdefault((u, e), set()).add(int(t))
    for key, end in ends.items():
        assert starts[key] == set(range(end)), f"episode {key} is missing steps"
    # the target: r alone after a fall; r + gamma * (...) after a time limit and mid-episode
    r = got["reward"]
    assert torch.equal(y[falls], r[falls])
    assert not torch.isclose(y[limits], r[limits]).any()
