"""The default layout of ``ProcessPoolVectorEnv(fns)`` (neither ``num_workers`` nor
``caller_envs``): C - 1 workers and the caller's share of N // C envs on C >= 2 usable
cores, by rule (no timing pass); every env in a worker where the caller must not step envs.
The results are the in-process pool's, step by step."""

from __future__ import annotations

import numpy as np
import pytest

from rlstash.envs import ProcessPoolVectorEnv, pool_setup
from rlstash.envs.auto import default_layout
from rlstash.envs.testing import CountEnv

pytestmark = pytest.mark.multiproc


@pytest.mark.parametrize(
    ("envs", "cores", "contained", "expected"),
    [
        (32, 2, False, (1, 16)),
        (8, 2, False, (1, 4)),
        (3, 2, False, (1, 1)),
        (32, 4, False, (3, 8)),
        (2, 16, False, (1, 1)),
        (32, 1, False, (1, 0)),  # one core: no share, the old default
        (1, 4, False, (1, 0)),  # one env: a worker
        (32, 2, True, (2, 0)),  # contained: every env in a worker
        (3, 16, True, (3, 0)),
    ],
)
def test_rule(envs, cores, contained, expected):
    workers, caller = default_layout(envs, cores, contained)
    assert (workers, caller) == expected
    assert workers >= 1 and workers + caller <= envs


def test_no_layout_arguments_give_the_rule_with_no_timing(monkeypatch):
    monkeypatch.setattr(pool_setup, "usable_cpus", lambda: 2)
    with ProcessPoolVectorEnv(CountEnv, 8, seed=0) as pool:
        assert (pool.num_workers, pool.caller_envs) == (1, 4)
        assert pool.auto_timing == {}  # a rule, not a timing pass
        assert len(pool.worker_pids) == 1
        assert list(pool.envs_of(1)) == [4, 5, 6, 7]  # the caller's share: the last envs


@pytest.mark.parametrize(
    "kwargs",
    [
        {"step_timeout": 30.0},  # a hang must be bounded: only a worker can be killed
        {"worker_env": {"OMP_NUM_THREADS": "1"}},  # the envs need the workers' environment
        {"max_concurrency": 2},
        {"caller_envs": 0},  # asked for explicitly
    ],
)
def test_every_env_in_a_worker_where_the_caller_must_not_step_them(monkeypatch, kwargs):
    monkeypatch.setattr(pool_setup, "usable_cpus", lambda: 2)
    with ProcessPoolVectorEnv(CountEnv, 6, **kwargs) as pool:
        assert pool.caller_envs == 0
        assert pool.num_workers == 2


def test_explicit_workers_keep_no_share():
    with ProcessPoolVectorEnv(CountEnv, 6, num_workers=2) as pool:
        assert (pool.num_workers, pool.caller_envs) == (2, 0)


def test_default_layout_steps_as_in_process():
    """Same seeds and actions: the default layout's results equal the in-process pool's."""
    rng = np.random.default_rng(0)
    with (
        ProcessPoolVectorEnv("CartPole-v1", 6, seed=3) as pool,
        ProcessPoolVectorEnv("CartPole-v1", 6, num_workers=0, seed=3) as ref,
    ):
        a, b = pool.reset()[0], ref.reset()[0]
        np.testing.assert_array_equal(a, b)
        for _ in range(60):
            actions = rng.integers(0, 2, 6)
            got, want = pool.step(actions), ref.step(actions)
            for x, y in zip(got[:4], want[:4]):
                np.testing.assert_array_equal(x, y)
