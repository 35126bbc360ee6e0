"""ProcessPoolVectorEnv behaves like gymnasium's vector envs: same results as SyncVectorEnv, same API."""

from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import error as gym_error
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from rlstash.envs import ProcessPoolVectorEnv, WorkerFailedError
from rlstash.envs.testing import CountEnv, SpacesEnv

pytestmark = pytest.mark.multiproc

GYM_MODE = {"next_step": AutoresetMode.NEXT_STEP, "same_step": AutoresetMode.SAME_STEP}


def same(a, b) -> bool:
    """Structural equality of nested results (dtype included for arrays)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, np.ndarray) and a.dtype == object:
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if a is None or b is None:
        return a is b
    a_arr, b_arr = np.asarray(a), np.asarray(b)
    return a_arr.dtype == b_arr.dtype and np.array_equal(a_arr, b_arr)


@pytest.mark.parametrize("mode", ["next_step", "same_step"])
@pytest.mark.parametrize("num_workers", [0, 2, 3])
@pytest.mark.parametrize(
    "factory",
    [functools.partial(CountEnv, 3, info_every=2), functools.partial(SpacesEnv, 3)],
    ids=["count_with_infos", "dict_tuple_spaces"],
)
def test_same_results_as_sync_vector_env(mode, num_workers, factory):
    ref = SyncVectorEnv([factory] * 5, autoreset_mode=GYM_MODE[mode])
    with ProcessPoolVectorEnv([factory] * 5, num_workers=num_workers, autoreset_mode=mode) as pool:
        assert pool.metadata["autoreset_mode"] == GYM_MODE[mode]
        assert pool.single_observation_space == ref.single_observation_space
        assert pool.observation_space == ref.observation_space
        assert pool.action_space == ref.action_space
        got, want = pool.reset(seed=3), ref.reset(seed=3)
        assert same(got, want)
        ref.action_space.seed(1)
        for t in range(8):
            actions = ref.action_space.sample()
            got, want = pool.step(actions), ref.step(actions)
            assert all(same(g, w) for g, w in zip(got, want)), (t, got, want)
    ref.close()


def test_env_id_lambdas_env_kwargs_and_step_async():
    def make():
        return gym.make("CartPole-v1", max_episode_steps=7)

    pools = [
        ProcessPoolVectorEnv("CartPole-v1", 4, num_workers=2, env_kwargs={"max_episode_steps": 7}),
        ProcessPoolVectorEnv(lambda: make(), 4, num_workers=2),  # lambdas travel by cloudpickle
        ProcessPoolVectorEnv("rlstash/Count-v0", 4, num_workers=2, env_kwargs={"episode_len": 7}),
    ]
    try:
        for pool in pools:
            pool.reset(seed=0)
            ends = 0
            for _ in range(7):
                pool.step_async(np.zeros(4, dtype=np.int64))
                _, _, term, trunc, _ = pool.step_wait()
                ends += int((term | trunc).sum())
            assert ends >= 4  # every episode ends within 7 steps (time limit or termination)
    finally:
        for pool in pools:
            pool.close()


@pytest.fixture(scope="module")
def pool():
    with ProcessPoolVectorEnv(CountEnv, 6, num_workers=2, seed=10) as p:
        yield p


def test_first_reset_uses_pool_seed_then_reset_seed(pool):
    obs, _ = pool.reset()
    np.testing.assert_array_equal(obs[:, 0], np.arange(10, 16))
    obs, _ = pool.reset(seed=[5, 4, 3, 2, 1, 0])
    np.testing.assert_array_equal(obs[:, 0], [5, 4, 3, 2, 1, 0])
    with pytest.raises(ValueError, match=r"seed: expected None, an int or a list of 6 seeds"):
        pool.reset(seed=[1, 2])


def test_actions_validated_before_anything_is_written(pool):
    pool.reset(seed=0)
    act = pool._arrays.shared["act"]
    act[:] = 2
    with pytest.raises(
        ValueError, match=r"actions: expected shape \(6,\) \(int64, one row per env\), got \(5,\)"
    ):
        pool.step(np.zeros(5, dtype=np.int64))
    with pytest.raises(TypeError, match=r"actions: expected dtype int64, got float64"):
        pool.step(np.zeros(6))
    with pytest.raises(TypeError, match=r"actions: expected dtype int64, got <U1"):
        pool.step(["a"] * 6)
    assert (act == 2).all()
    obs, rew, *_ = pool.step([1, 0, 1, 0, 1, 0])  # lists and int32 are fine
    np.testing.assert_array_equal(rew, [2, 1, 2, 1, 2, 1])


def test_nested_action_errors_name_the_leaf():
    with ProcessPoolVectorEnv(SpacesEnv, 2, num_workers=0) as pool:
        pool.reset()
        with pytest.raises(TypeError, match=r"actions: expected a tuple of 2 parts"):
            pool.step(np.zeros(2))
        with pytest.raises(ValueError, match=r"actions\[1\]: expected shape \(2, 2\)"):
            pool.step((np.zeros(2, dtype=np.int64), np.zeros((2, 3))))


def test_actions_outside_the_space_are_refused_in_the_parent():
    """Issue 9: CartPole asserts on a bad action; the worker must not crash (and use up
    max_restarts=0): the pool refuses in the caller's process, naming the envs."""
    with ProcessPoolVectorEnv("CartPole-v1", 4, num_workers=2, max_restarts=0) as pool:
        pool.reset(seed=0)
        with pytest.raises(
            ValueError,
            match=r"actions: 2 action\(s\) outside the action space Discrete\(2\) "
            r"\(env 1: 2, env 3: -1\); nothing was sent",
        ):
            pool.step(np.array([0, 2, 1, -1]))
        assert pool.restarts == []
        obs, *_ = pool.step(np.array([0, 1, 1, 0]))  # the pool is still usable
        assert obs.shape == (4, 4)


def test_nested_actions_outside_the_space_name_the_leaf_and_env():
    with ProcessPoolVectorEnv(SpacesEnv, 3, num_workers=0) as pool:
        pool.reset()
        good = (np.array([0, 3, 1]), np.zeros((3, 2)))
        with pytest.raises(ValueError, match=r"actions\[0\]: 1 action\(s\) .*\(env 2: 4\)"):
            pool.step((np.array([0, 3, 4]), good[1]))
        nan = np.zeros((3, 2))
        nan[1, 0] = np.nan
        with pytest.raises(
            ValueError, match=r"actions\[1\]: 1 action\(s\) .*\(env 1: \[nan  0\.\]\)"
        ):
            pool.step((good[0], nan))
        pool.step((good[0], np.full((3, 2), 5.0)))  # out of Box bounds: passed, as gymnasium


@pytest.mark.parametrize(
    "space, values, bad",
    [
        (spaces.Discrete(3, start=-1), [-1, 1, 2, -2], [2, 3]),
        (spaces.MultiDiscrete([2, 3]), [[1, 2], [2, 0], [0, -1]], [1, 2]),
        (spaces.MultiBinary(2), [[0, 1], [1, 2]], [1]),
        (spaces.Box(-1, 1, (2,)), [[0, 9], [np.nan, 0]], [1]),
    ],
)
def test_bad_action_rows_per_space(space, values, bad):
    from rlstash.envs.actions import bad_rows

    assert bad_rows(space, np.asarray(values)).tolist() == bad


def test_copies_by_default_views_when_asked(pool):
    obs, _ = pool.reset(seed=0)
    obs2, *_ = pool.step(np.zeros(6, dtype=np.int64))
    assert obs[0, 1] == 0 and obs2[0, 1] == 1  # the first result was not overwritten
    pool.copy = False
    try:
        view, rew, *_ = pool.step(np.zeros(6, dtype=np.int64))
        pool.step(np.zeros(6, dtype=np.int64))
        assert view[0, 1] == 3 and rew[0] == 3  # views of shared memory: now step 3
    finally:
        pool.copy = True


def test_call_get_attr_set_attr(pool):
    assert pool.get_attr("episode_len") == (5,) * 6
    pool.set_attr("episode_len", [1, 2, 3, 4, 5, 6])
    assert pool.get_attr("episode_len") == (1, 2, 3, 4, 5, 6)
    pool.set_attr("episode_len", 5)
    assert pool.call("scaled", 3, offset=1) == (16,) * 6  # 3 * episode_len + offset
    with pytest.raises(ValueError, match=r"name: call\('reset'\) is not allowed"):
        pool.call("reset", seed=1)
    with pytest.raises(ValueError, match=r"values: expected a list or tuple of 6 values"):
        pool.set_attr("episode_len", [1, 2])
    with pytest.raises(AttributeError, match=r"no attribute 'nope'") as caught:  # gymnasium's
        pool.get_attr("nope")  # type, the workers' tracebacks in the cause
    assert "nope failed" in str(caught.value.__cause__)
    pool.reset(seed=0)
    _, rew, *_ = pool.step(np.zeros(6, dtype=np.int64))  # still in step after the error
    np.testing.assert_array_equal(rew, 1.0)


def test_state_errors(pool):
    pool.reset(seed=0)
    pool.step_async(np.zeros(6, dtype=np.int64))
    with pytest.raises(gym_error.AlreadyPendingCallError):
        pool.step_async(np.zeros(6, dtype=np.int64))
    with pytest.raises(gym_error.AlreadyPendingCallError):
        pool.reset()
    pool.step_wait()
    with pytest.raises(gym_error.NoAsyncCallError):
        pool.step_wait()


def test_async_reset_and_call_like_async_vector_env(pool):
    pool.reset_async(seed=1)
    obs, _ = pool.reset_wait()
    np.testing.assert_array_equal(obs[:, 0], np.arange(1, 7))
    pool.call_async("scaled", 2)
    assert pool.call_wait() == (10,) * 6
    with pytest.raises(gym_error.NoAsyncCallError):
        pool.call_wait()
    with pytest.raises(gym_error.NoAsyncCallError):
        pool.reset_wait()


def test_step_before_reset_and_after_close():
    pool = ProcessPoolVectorEnv(CountEnv, 2, num_workers=1)
    with pytest.raises(gym_error.ResetNeeded):
        pool.step(np.zeros(2, dtype=np.int64))
    pool.close()
    pool.close()  # twice is fine
    assert pool.closed
    with pytest.raises(gym_error.ClosedEnvironmentError):
        pool.reset()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_disabled_mode_and_reset_mask(num_workers):
    with ProcessPoolVectorEnv(
        CountEnv, 4, num_workers=num_workers, autoreset_mode="disabled"
    ) as pool:
        pool.reset(seed=0)
        for _ in range(5):
            _, _, term, _, _ = pool.step(np.zeros(4, dtype=np.int64))
        assert term.all()
        with pytest.raises(RuntimeError, match=r"envs \[0, 1, 2, 3\] ended.*reset_mask"):
            pool.step(np.zeros(4, dtype=np.int64))
        mask = np.array([True, False, True, False])
        obs, _ = pool.reset(seed=7, options={"reset_mask": mask})
        np.testing.assert_array_equal(obs[:, 1], [0, 5, 0, 5])  # unmasked envs untouched
        np.testing.assert_array_equal(obs[[0, 2], 0], [7, 9])
        with pytest.raises(RuntimeError, match=r"envs \[1, 3\] ended"):
            pool.step(np.zeros(4, dtype=np.int64))
        with pytest.raises(ValueError, match=r"reset_mask'\]: expected a bool numpy array"):
            pool.reset(options={"reset_mask": [True] * 4})
        pool.reset(options={"reset_mask": ~mask})
        pool.step(np.zeros(4, dtype=np.int64))


@pytest.mark.parametrize("method", ["spawn", "fork", "forkserver"])
def test_start_methods_give_the_same_steps(method):
    with ProcessPoolVectorEnv(CountEnv, 3, num_workers=2, context=method, seed=4) as pool:
        assert pool.start_method == method
        obs, _ = pool.reset()
        obs, rew, term, trunc, _ = pool.step(np.array([0, 1, 2]))
        np.testing.assert_array_equal(obs, [[4, 1], [5, 1], [6, 1]])
        np.testing.assert_array_equal(rew, [1, 2, 3])


def test_uneven_split_and_envs_of():
    with ProcessPoolVectorEnv(CountEnv, 7, num_workers=3) as pool:
        assert [list(pool.envs_of(w)) for w in range(3)] == [[0, 1, 2], [3, 4], [5, 6]]
        assert len(set(pool.worker_pids)) == 3
        assert "ProcessPoolVectorEnv(envs, num_envs=7, 3 workers)" == repr(pool)


def _wrong_shape():
    from gymnasium import spaces

    env = CountEnv()
    env.observation_space = spaces.Box(-1, 1, (3,))
    return env


@pytest.mark.parametrize("num_workers", [0, 1])
def test_observation_not_fitting_the_space_names_the_env(num_workers):
    match = (
        r"env 0: observation: expected shape \(3,\) float32 \(from the space\), got shape \(2,\)"
    )
    pool = ProcessPoolVectorEnv([_wrong_shape] * 2, num_workers=num_workers, max_restarts=0)
    with pytest.raises(ValueError, match=match) as caught:  # max_restarts=0: re-raised as is
        pool.reset()
    assert isinstance(caught.value.__cause__, WorkerFailedError)
    assert pool.closed or pool._backend.closed


def test_gymnasium_vector_wrappers_work_on_top():
    env = gym.wrappers.vector.RecordEpisodeStatistics(
        ProcessPoolVectorEnv(functools.partial(CountEnv, 3), 4, num_workers=2)
    )
    env.reset(seed=0)
    for _ in range(3):
        _, _, term, _, infos = env.step(np.zeros(4, dtype=np.int64))
    assert term.all() and infos["_episode"].all()
    np.testing.assert_array_equal(infos["episode"]["l"], [3, 3, 3, 3])
    env.close()


def test_box_actions_pendulum_matches_sync_vector_env():
    ref = SyncVectorEnv([lambda: gym.make("Pendulum-v1")] * 4)
    with ProcessPoolVectorEnv("Pendulum-v1", 4, num_workers=2) as pool:
        assert same(pool.reset(seed=5), ref.reset(seed=5))
        actions = np.random.default_rng(0).uniform(-2, 2, size=(10, 4, 1)).astype(np.float32)
        for a in actions:
            assert all(same(g, w) for g, w in zip(pool.step(a), ref.step(a)))
    ref.close()
