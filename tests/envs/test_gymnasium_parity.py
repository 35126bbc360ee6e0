"""Code written for gymnasium's AsyncVectorEnv runs unchanged on ProcessPoolVectorEnv (issue 10).

A representative part of gymnasium's own tests/vector suite (test_async_vector_env.py,
test_vector_env.py, test_autoreset_mode.py, test_observation_mode.py), rewritten for the pool
and kept fast. The full suite was run against the pool once (see bench/results/parity.md).
"""

from __future__ import annotations

import copy
import multiprocessing
import time
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import error as gym_error
from gymnasium import spaces
from gymnasium.utils.env_checker import data_equivalence
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

from rlstash.envs import ProcessPoolVectorEnv
from rlstash.envs.errors import SpaceMismatchError, WaitTimeoutError
from tests.envs.helpers import wait_gone

pytestmark = pytest.mark.multiproc


class SpaceEnv(gym.Env):
    """Observation and action in ``space``; the observation is a sample, the reward the step
    count; ``sleep_step``/``sleep_reset`` seconds per call; ``fail_at`` raises ValueError."""

    def __init__(
        self, space=None, sleep_step=0.0, sleep_reset=0.0, fail_at=None, length=3, act=None
    ):
        space = copy.deepcopy(space) if space is not None else spaces.Discrete(4)
        self.observation_space = space  # an RNG of its own per env
        self.action_space = copy.deepcopy(act) if act is not None else space
        self.sleep_step, self.sleep_reset = sleep_step, sleep_reset
        self.fail_at, self.length, self.t = fail_at, length, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.observation_space.seed(seed)
        time.sleep(self.sleep_reset)
        self.t = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        assert action in self.action_space, action
        self.t += 1
        if self.t == self.fail_at:
            raise ValueError(f"boom at step {self.t}")
        time.sleep(self.sleep_step)
        return self.observation_space.sample(), float(self.t), self.t >= self.length, False, {}

    def slow_value(self, seconds):
        """``seconds`` after sleeping that long (for ``call`` timeouts)."""
        time.sleep(seconds)
        return seconds


def envs_of(n=3, **kwargs):
    return [lambda: SpaceEnv(**kwargs)] * n


def test_async_vector_env_arguments_are_accepted():
    fns = [lambda: gym.make("CartPole-v1")] * 3
    for shared_memory in (True, False):
        with ProcessPoolVectorEnv(
            fns, shared_memory=shared_memory, copy=False, context="spawn", daemon=False,
            observation_mode="same", autoreset_mode=AutoresetMode.SAME_STEP,
        ) as pool:  # fmt: skip
            obs, _ = pool.reset(seed=0)
            assert pool.context == "spawn" and pool.copy is False
            assert pool.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
            assert obs.shape == (3, 4) and obs.dtype == np.float32
    with pytest.raises(TypeError, match=r"shared_memory: expected True or False, got 'yes'"):
        ProcessPoolVectorEnv(fns, shared_memory="yes")
    with pytest.raises(ValueError, match=r"Invalid `observation_mode`.*actual got nope"):
        ProcessPoolVectorEnv(fns, observation_mode="nope")


@pytest.mark.parametrize("workers", [0, 2])
def test_reset_seed_gives_each_env_seed_plus_index(workers):
    with ProcessPoolVectorEnv(lambda: gym.make("CartPole-v1"), 4, num_workers=workers) as pool:
        pool.reset(seed=42)
        assert pool.np_random_seed == (42, 43, 44, 45)
        pool.reset(seed=None)  # as gymnasium: the seed stays
        assert pool.np_random_seed == (42, 43, 44, 45)
        assert all(isinstance(g, np.random.Generator) for g in pool.np_random)


def test_caller_timeouts_raise_timeout_error_and_restart_nothing():
    with ProcessPoolVectorEnv(envs_of(2, sleep_step=0.4, sleep_reset=0.4), num_workers=2) as pool:
        pool.reset_async()
        with pytest.raises(TimeoutError, match=r"`reset_wait` has timed out after 0.05"):
            pool.reset_wait(timeout=0.05)
        pool.reset()  # the late answers are discarded first
        pool.step_async(np.array([1, 1]))
        with pytest.raises(multiprocessing.TimeoutError, match=r"`step_wait` has timed out"):
            pool.step_wait(timeout=0.05)
        assert pool.restarts == []
        _, rewards, *_ = pool.step(np.array([1, 1]))
        assert rewards.tolist() == [2.0, 2.0]  # the timed-out step still happened
    assert issubclass(WaitTimeoutError, TimeoutError)


def marking_worker(index, env_fn, pipe, parent_pipe, shared_memory, error_queue, mode, sem):
    """A custom gymnasium worker (AsyncVectorEnv's ``worker=``): gymnasium's own, which also
    marks its env (``started_by`` attribute) so a test can see that it ran."""
    from gymnasium.vector.async_vector_env import _async_worker

    def marked():
        env = env_fn()
        env.unwrapped.started_by = f"marking_worker {index}"
        return env

    _async_worker(index, marked, pipe, parent_pipe, shared_memory, error_queue, mode, sem)


@pytest.mark.parametrize("max_concurrency", [None, 2])
def test_custom_worker_runs_with_gymnasium_protocol(max_concurrency):
    fns = [lambda: gym.make("CartPole-v1")] * 3
    ref = SyncVectorEnv(fns)
    pool = ProcessPoolVectorEnv(fns, worker=marking_worker, max_concurrency=max_concurrency)
    try:
        assert pool.num_workers == 3 and len(pool.worker_pids) == 3
        for (a, _), (b, _) in [(pool.reset(seed=3), ref.reset(seed=3))]:
            assert data_equivalence(a, b)
        for _ in range(30):
            actions = np.array([1, 0, 1])
            got, want = pool.step(actions), ref.step(actions)
            assert data_equivalence(got[:4], want[:4])
        marks = tuple(f"marking_worker {i}" for i in range(3))
        assert pool.get_attr("started_by") == marks
        pool.call_async("started_by")
        assert pool.call_wait(timeout=30) == marks
        with pytest.raises(ValueError, match=r"actions: 1 action\(s\) outside the action space"):
            pool.step(np.array([1, 2, 0]))  # checked by the pool, as for its own workers
        pids = pool.worker_pids
    finally:
        pool.close()
        ref.close()
    assert wait_gone(pids) == []


def test_custom_worker_when_asyncvectorenv_is_swapped_for_the_pool(monkeypatch):
    """Code that points gymnasium.vector.AsyncVectorEnv at the pool (as gymnasium's suite was)
    still gets gymnasium's class behind ``worker=``, not the pool again (no recursion)."""
    monkeypatch.setattr(gym.vector, "AsyncVectorEnv", ProcessPoolVectorEnv)
    with gym.vector.AsyncVectorEnv(
        [lambda: gym.make("CartPole-v1")] * 2, worker=marking_worker
    ) as pool:
        assert isinstance(pool, ProcessPoolVectorEnv)
        pool.reset(seed=0)
        assert pool.step(np.array([0, 1]))[0].shape == (2, 4)


def test_incompatible_custom_worker_is_refused_as_gymnasium_does():
    def seven(index, env_fn, pipe, parent_pipe, shared_memory, error_queue, mode):
        pass

    fns = [lambda: gym.make("CartPole-v1")] * 2
    with pytest.raises(ValueError, match="A custom `worker` must accept 8 arguments"):
        ProcessPoolVectorEnv(fns, worker=seven)
    with pytest.raises(ValueError, match=r"num_workers: expected None with worker="):
        ProcessPoolVectorEnv(fns, worker=marking_worker, num_workers=2)


def test_call_wait_timeout_raises_timeout_error_and_restarts_nothing():
    with ProcessPoolVectorEnv(envs_of(2), num_workers=2) as pool:
        pool.reset(seed=0)
        pool.call_async("slow_value", 0.5)
        with pytest.raises(
            multiprocessing.TimeoutError, match=r"`call_wait` has timed out after 0.05 second"
        ):
            pool.call_wait(timeout=0.05)
        assert pool.call("slow_value", 0.0) == (0.0, 0.0)  # the late answers are discarded
        pool.call_async("slow_value", 0.01)
        assert pool.call_wait(timeout=30) == (0.01, 0.01)
        assert pool.restarts == []


@pytest.mark.parametrize("workers", [0, 2])
def test_env_exception_is_reraised_with_max_restarts_0(workers):
    pool = ProcessPoolVectorEnv(envs_of(2, fail_at=2), num_workers=workers, max_restarts=0)
    pool.reset(seed=0)
    pool.step(np.array([0, 0]))
    with warnings.catch_warnings(record=True), pytest.raises(ValueError, match="boom at step 2"):
        pool.step(np.array([0, 0]))
    assert pool.closed or pool._backend.closed
    pool.close()


def test_out_of_order_calls_raise_gymnasiums_errors():
    with ProcessPoolVectorEnv(envs_of(2), num_workers=2) as pool:
        with pytest.raises(
            gym_error.NoAsyncCallError,
            match=r"Calling `reset_wait` without any prior call to `reset_async`\.",
        ):
            pool.reset_wait()
        pool.reset()
        with pytest.raises(gym_error.NoAsyncCallError, match=r"`step_wait` without any prior"):
            pool.step_wait()
        pool.step_async(np.array([0, 0]))
        with pytest.raises(
            gym_error.AlreadyPendingCallError,
            match=r"Calling `reset_async` while waiting for a pending call to `step` to complete",
        ):
            pool.reset_async()
        with pytest.raises(gym_error.AlreadyPendingCallError, match=r"`step_async` while"):
            pool.step_async(np.array([0, 0]))
        with pytest.warns(UserWarning, match=r"Calling `close` while waiting for a pending call"):
            pool.close(terminate=True)
    with pytest.raises(gym_error.ClosedEnvironmentError):
        pool.reset()


def test_wrong_number_of_actions_raises_what_gymnasium_raises():
    fns = [lambda: gym.make("CartPole-v1")] * 2
    reference = AsyncVectorEnv(fns)
    try:
        reference.reset(seed=0)
        with pytest.raises(Exception) as theirs:
            reference.step([0, 1, 0])
    finally:
        reference.close(terminate=True)
    with ProcessPoolVectorEnv(fns, num_workers=2) as pool:
        pool.reset(seed=0)
        with pytest.raises(type(theirs.value), match=r"actions: expected shape \(2,\)"):
            pool.step([0, 1, 0])


SPACES = [
    spaces.Text(6),
    spaces.Graph(node_space=spaces.Box(-1, 1, shape=(2,)), edge_space=spaces.Discrete(3)),
    spaces.Sequence(spaces.Discrete(4)),
    spaces.OneOf([spaces.Discrete(3), spaces.Box(0.0, 1.0)]),
    spaces.Dict(name=spaces.Text(4), pos=spaces.Box(-1, 1, (2,))),
    spaces.Box(-1, 1, (2, 3), np.float16),
]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("space", SPACES, ids=[type(s).__name__ for s in SPACES])
def test_every_gymnasium_space_works(space, workers):
    """Spaces without a fixed array layout are pickled; the results are what SyncVectorEnv
    gives for the same seeds."""
    fns = [lambda: SpaceEnv(space)] * 3
    sync = SyncVectorEnv(fns)
    with ProcessPoolVectorEnv(fns, num_workers=workers) as pool:
        assert pool.observation_space == sync.observation_space
        assert pool.action_space == sync.action_space
        obs, _ = pool.reset(seed=5)
        ref, _ = sync.reset(seed=5)
        assert obs in pool.observation_space
        assert data_equivalence(obs, ref)
        pool.action_space.seed(1)
        actions = pool.action_space.sample()
        obs, rewards, *_ = pool.step(actions)
        ref, ref_rewards, *_ = sync.step(actions)
        assert data_equivalence(obs, ref)
        assert rewards.tolist() == ref_rewards.tolist()
    sync.close()


def test_custom_space_is_pickled_even_with_shared_memory():
    """AsyncVectorEnv refuses a custom space with shared_memory=True; the pool pickles it."""

    class Anything(spaces.Space):
        def sample(self, mask=None, probability=None):
            return "x" * int(self.np_random.integers(1, 4))

        def contains(self, x):
            return isinstance(x, str)

        def __eq__(self, other):
            return isinstance(other, Anything)

    with ProcessPoolVectorEnv([lambda: SpaceEnv(Anything())] * 2, num_workers=0) as pool:
        obs, _ = pool.reset(seed=0)
        assert isinstance(obs, tuple) and all(isinstance(o, str) for o in obs)
        with pytest.raises(ValueError, match=r"actions: 1 action\(s\) outside .*env 1: 3"):
            pool.step(("a", 3))
        pool.step(("a", "b"))


@pytest.mark.parametrize("shared_memory", [True, False])
def test_final_obs_elements_have_gymnasiums_types(shared_memory):
    """Same-step autoreset: a Discrete final observation is an int scalar, not a 0-d array."""
    fns = envs_of(2, length=2)
    sync = SyncVectorEnv(fns, autoreset_mode="SameStep")
    with ProcessPoolVectorEnv(
        fns, num_workers=2, autoreset_mode="SameStep", shared_memory=shared_memory
    ) as pool:
        for vec in (pool, sync):
            vec.reset(seed=0)
            vec.step(np.array([0, 0]))
        _, _, term, _, info = pool.step(np.array([0, 0]))
        _, _, _, _, ref = sync.step(np.array([0, 0]))
    assert term.all() and info["_final_obs"].all()
    for mine, theirs in zip(info["final_obs"], ref["final_obs"]):
        assert np.ndim(mine) == 0 and not isinstance(mine, np.ndarray)
        assert int(mine) == int(theirs)
    sync.close()


def test_observation_modes():
    boxes = [spaces.Box(0, i, (5,)) for i in (1, 2, 3)]
    fns = [lambda b=b: SpaceEnv(b, act=spaces.Discrete(2)) for b in boxes]
    with pytest.raises(RuntimeError, match=r"use `observation_mode='different'` instead"):
        ProcessPoolVectorEnv(fns, num_workers=2, observation_mode="same")
    with ProcessPoolVectorEnv(fns, num_workers=2, observation_mode="different") as pool:
        assert pool.observation_space == gym.vector.utils.batch_differing_spaces(boxes)
        assert pool.single_observation_space == boxes[0]
        obs, _ = pool.reset(seed=0)
        assert obs in pool.observation_space
    two = spaces.Discrete(2)
    mixed = [
        lambda: SpaceEnv(spaces.Box(0, 1, (3,)), act=two),
        lambda: SpaceEnv(spaces.Box(0, 1, (2,)), act=two),
    ]
    with pytest.raises(SpaceMismatchError, match=r"do not share a common shape and dtype"):
        ProcessPoolVectorEnv(mixed, num_workers=0, observation_mode="different")


def test_render_call_attributes_unwrapped_as_async_vector_env():
    fns = [lambda: gym.make("CartPole-v1", render_mode="rgb_array")] * 2
    with ProcessPoolVectorEnv(fns, num_workers=2) as pool:
        assert pool.render_mode == "rgb_array" and pool.unwrapped is pool
        pool.reset(seed=0)
        pool.set_attr("gravity", [9.81, 1.62])
        assert pool.get_attr("gravity") == (9.81, 1.62)
        assert pool.call("gravity") == (9.81, 1.62)
        pool.call_async("gravity")
        assert pool.call_wait() == (9.81, 1.62)
        try:
            frames = pool.render()
        except gym_error.DependencyNotInstalled:  # pygame is not a dependency
            frames = None
        if frames is not None:
            assert isinstance(frames, tuple) and len(frames) == 2


class Vec3(spaces.Space):
    """A custom space of fixed shape and dtype: its values can live in shared memory."""

    def __init__(self, seed=None):
        super().__init__((3,), np.float32, seed)

    def sample(self, mask=None, probability=None):
        return self.np_random.uniform(-1, 1, 3).astype(np.float32)

    def contains(self, x):
        return isinstance(x, np.ndarray) and x.shape == (3,) and x.dtype == np.float32

    def __eq__(self, other):
        return isinstance(other, Vec3)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("mode", ["NextStep", "SameStep"])
def test_fixed_size_custom_space_goes_through_shared_memory(workers, mode):
    """Observations of a custom space with a fixed shape and dtype are laid out in shared
    memory (not pickled) and come back as gymnasium batches them: a tuple per env."""
    for space in (Vec3(), spaces.Dict(v=Vec3(), d=spaces.Discrete(3))):
        fns = [lambda s=space: SpaceEnv(s, act=spaces.Discrete(2), length=2)] * 3
        sync = SyncVectorEnv(fns, autoreset_mode=mode)
        with ProcessPoolVectorEnv(fns, num_workers=workers, autoreset_mode=mode) as pool:
            assert not pool._arrays.obs_pickled and pool._arrays.shared.leaves("obs")
            assert pool.observation_space == sync.observation_space
            obs, _ = pool.reset(seed=5)
            assert data_equivalence(obs, sync.reset(seed=5)[0])
            for t in (1, 2):  # the episodes end at step 2 (later resets reseed at random)
                got, want = pool.step(np.array([1, 0, 1])), sync.step(np.array([1, 0, 1]))
                if mode == "SameStep" and t == 2:
                    assert got[4]["_final_obs"].all() and want[4]["_final_obs"].all()
                    assert data_equivalence(got[4]["final_obs"], want[4]["final_obs"])
                else:
                    assert data_equivalence(got[0], want[0])
        sync.close()
