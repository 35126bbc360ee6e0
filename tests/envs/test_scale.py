"""64 CartPole envs over 2, 8 and 16 workers on a small machine; num_workers="auto"."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import SyncVectorEnv

from rlstash.envs import AutoChoiceWarning, OversubscriptionWarning, ProcessPoolVectorEnv

pytestmark = pytest.mark.multiproc

N, T = 64, 200


@pytest.fixture(scope="module")
def reference():
    """SyncVectorEnv's trajectory for fixed seeds and actions: [T] results."""
    actions = np.random.default_rng(0).integers(0, 2, size=(T, N))
    ref = SyncVectorEnv([lambda: gym.make("CartPole-v1")] * N)
    first = ref.reset(seed=0)[0]
    steps = [ref.step(a)[:4] for a in actions]
    ref.close()
    return actions, first, steps


@pytest.mark.parametrize("num_workers", [2, 8, 16])
def test_64_cartpoles_match_sync_vector_env(num_workers, reference):
    actions, first, steps = reference
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OversubscriptionWarning)
        pool = ProcessPoolVectorEnv("CartPole-v1", N, num_workers=num_workers)
    with pool:
        assert len(pool.worker_pids) == num_workers
        obs, _ = pool.reset(seed=0)
        np.testing.assert_array_equal(obs, first)
        ends = 0
        for t in range(T):
            got = pool.step(actions[t])
            for g, w in zip(got[:4], steps[t]):
                np.testing.assert_array_equal(g, w)
            ends += int((got[2] | got[3]).sum())
        assert ends > N  # many episodes ended and were auto-reset the same way
        assert pool.restarts == []


@pytest.mark.parametrize("mode", ["NextStep", "Disabled"])
def test_auto_times_both_and_says_which(mode):
    with pytest.warns(AutoChoiceWarning, match=r'num_workers="auto"\) chose') as record:
        pool = ProcessPoolVectorEnv(
            "CartPole-v1", 8, num_workers="auto", seed=0, autoreset_mode=mode
        )
    with pool:
        timing = pool.auto_timing
        assert "in_process" in timing
        message = str(record[0].message)
        if len(timing) == 1:  # a single usable core: processes cannot help
            assert pool.num_workers == 0
        else:
            best = max(timing, key=timing.get)
            assert (pool.num_workers == 0) == (best == "in_process")
            assert ("in-process" in message) == (best == "in_process")
            assert (pool.caller_envs > 0) == ("+caller" in best)  # W-1 workers + the caller
            assert ("caller_envs=" in message) == ("+caller" in best)
        obs, _ = pool.reset()
        assert obs.shape == (8, 4)
        pool.step(np.zeros(8, dtype=np.int64))
