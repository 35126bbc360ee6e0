"""Faults are contained (invariant I7): crashed, killed or hung workers are restarted, their
episodes end as truncated, and past the budget a clear error names the worker."""

from __future__ import annotations

import functools
import os
import signal
import time

import numpy as np
import pytest
from gymnasium import error as gym_error

from rlstash.envs import ProcessPoolVectorEnv, WorkerFailedError, WorkerRestartWarning
from rlstash.envs.errors import SpaceMismatchError
from rlstash.envs.testing import CountEnv, CrashEnv, HangEnv
from tests.envs.helpers import wait_gone

pytestmark = [
    pytest.mark.multiproc,
    pytest.mark.filterwarnings("ignore::rlstash.envs.WorkerRestartWarning"),
]

ZERO = np.zeros(4, dtype=np.int64)


def _pool(bad, tmp_path, num_workers=2, **kwargs):
    """Envs 0-1 healthy (worker 0), envs 2-3 ``bad`` (worker 1) failing once."""
    once = str(tmp_path / "once")
    bad_fn = functools.partial(bad, once_file=once) if bad is not CountEnv else bad
    fns = [functools.partial(CountEnv, 100)] * 2 + [bad_fn] * 2
    return ProcessPoolVectorEnv(fns, num_workers=num_workers, seed=0, **kwargs)


@pytest.mark.parametrize(
    ("bad", "reason", "exitcode", "text"),
    [
        (
            functools.partial(CrashEnv, 3, "exception"),
            "exception",
            -signal.SIGKILL,
            "planned crash at step 3",
        ),
        (
            functools.partial(CrashEnv, 3, "segfault"),
            "died",
            -signal.SIGSEGV,
            "signal 11 (SIGSEGV)",
        ),
        (functools.partial(CrashEnv, 3, "exit"), "died", 7, "exit code 7"),
    ],
    ids=["exception", "segfault", "exit"],
)
def test_crash_restarts_worker_and_truncates_its_episodes(tmp_path, bad, reason, exitcode, text):
    with _pool(bad, tmp_path) as pool:
        pool.reset()
        old = pool.worker_pids
        for _ in range(2):
            pool.step(ZERO)
        with pytest.warns(WorkerRestartWarning, match=rf"env worker 1 \(envs 2..3\) {reason}"):
            obs, rew, term, trunc, infos = pool.step(ZERO)  # the crash
        np.testing.assert_array_equal(trunc, [False, False, True, True])
        np.testing.assert_array_equal(term, [False] * 4)
        np.testing.assert_array_equal(rew, [3, 3, 0, 0])
        np.testing.assert_array_equal(infos["worker_restarted"], [False, False, True, True])
        np.testing.assert_array_equal(infos["_worker_restarted"], [False, False, True, True])
        assert (obs[2:, 1] == 0).all() and (obs[:2, 1] == 3).all()  # fresh reset obs
        assert obs[2, 0] != 2  # a fresh seed, not the original seed + 2
        [event] = pool.restarts
        assert (event.worker, event.envs, event.reason, event.count) == (1, (2, 3), reason, 1)
        assert event.exitcode == exitcode and text in event.error
        assert pool.worker_pids[0] == old[0] and pool.worker_pids[1] != old[1]
        # next_step mode: the step after a truncation is a reset step (reward 0, no flags)
        obs, rew, term, trunc, infos = pool.step(ZERO)
        np.testing.assert_array_equal(rew, [4, 4, 0, 0])
        assert not trunc.any() and "worker_restarted" not in infos
        obs, rew, *_ = pool.step(ZERO)
        np.testing.assert_array_equal(rew, [5, 5, 1, 1])


def test_kill_9_from_outside(tmp_path):
    with _pool(CountEnv, tmp_path) as pool:
        pool.reset()
        pool.step(ZERO)
        victim = pool.worker_pids[0]
        os.kill(victim, signal.SIGKILL)
        with pytest.warns(WorkerRestartWarning, match=r"worker 0 \(envs 0..1\) died"):
            _, _, _, trunc, infos = pool.step(ZERO)
        np.testing.assert_array_equal(trunc, [True, True, False, False])
        assert pool.restarts[0].exitcode == -signal.SIGKILL
        assert wait_gone([victim]) == []


def test_fork_server_killed_all_workers_restart(tmp_path):
    with _pool(CountEnv, tmp_path) as pool:
        pool.reset()
        pool.step(ZERO)
        server = pool._backend.launcher.server
        os.kill(server.pid, signal.SIGKILL)  # its children get SIGKILL too (PDEATHSIG)
        assert wait_gone(pool.worker_pids) == []
        _, rew, _, trunc, infos = pool.step(ZERO)
        assert trunc.all() and (rew == 0).all() and infos["worker_restarted"].all()
        assert pool._backend.launcher.server.pid != server.pid
        _, rew, _, trunc, _ = pool.step(ZERO)
        assert not trunc.any()


def test_hang_is_killed_after_step_timeout(tmp_path):
    with _pool(functools.partial(HangEnv, 2), tmp_path, step_timeout=0.3) as pool:
        pool.reset()
        pool.step(ZERO)
        hung = pool.worker_pids[1]
        t0 = time.monotonic()
        _, _, _, trunc, _ = pool.step(ZERO)
        assert 0.3 <= time.monotonic() - t0 < 10.0  # killed at 0.3 s, not after the 1 h hang
        np.testing.assert_array_equal(trunc, [False, False, True, True])
        assert pool.restarts[0].reason == "timeout"
        assert wait_gone([hung]) == []


def test_same_step_mode_restart_has_no_final_obs(tmp_path):
    bad = functools.partial(CrashEnv, 2, "exception")
    with _pool(bad, tmp_path, autoreset_mode="same_step") as pool:
        pool.reset()
        pool.step(ZERO)
        obs, rew, term, trunc, infos = pool.step(ZERO)
        np.testing.assert_array_equal(trunc, [False, False, True, True])
        assert "_final_obs" not in infos or not infos["_final_obs"][2:].any()
        assert (obs[2:, 1] == 0).all()  # same_step: the new episode's first observation
        _, rew, _, trunc, _ = pool.step(ZERO)
        np.testing.assert_array_equal(rew, [3, 3, 1, 1])  # same_step: stepped right away


def test_budget_exhausted_raises_named_error_and_closes(tmp_path):
    fns = [CountEnv] * 2 + [functools.partial(CrashEnv, 1, "exception")] * 2
    pool = ProcessPoolVectorEnv(fns, num_workers=2, max_restarts=2)
    pool.reset()
    pids = pool.worker_pids
    with pytest.raises(WorkerFailedError) as info:
        for _ in range(5):
            pool.step(ZERO)
    err = info.value
    assert (err.worker, err.envs, err.failures, err.max_restarts) == (1, (2, 3), 3, 2)
    msg = str(err)
    assert "env worker 1 (envs 2..3) failed 3 time(s), more than max_restarts=2" in msg
    assert "CrashEnv: planned crash at step 1" in msg
    assert isinstance(err, RuntimeError) and len(err.events) == 3
    with pytest.raises(gym_error.ClosedEnvironmentError):
        pool.step(ZERO)
    assert wait_gone(pids) == []


def test_factory_failing_at_start_is_reported_with_traceback():
    def broken():
        raise OSError("no such simulator")

    with pytest.raises(
        WorkerFailedError, match=r"could not start its envs(.|\n)*no such simulator"
    ):
        ProcessPoolVectorEnv([CountEnv, broken], num_workers=2)


@pytest.mark.parametrize("error", [ValueError, TypeError, ImportError])
def test_bad_input_refused_by_an_in_process_env_is_raised_as_it_was(error):
    """An in-process env that refuses its settings (a video env that cannot render, a bad
    keyword) raises that error itself: the CLI's one line, exit 2, not a worker failure."""

    def refuses():
        raise error("video: env X cannot render frames; drop --video")

    with pytest.raises(error, match="drop --video"):
        ProcessPoolVectorEnv([refuses, CountEnv], num_workers=0)


@pytest.mark.parametrize("workers", [3, 0, 1])  # across workers, in-process, in one worker
def test_mismatched_spaces_are_refused(workers):
    """gymnasium raises RuntimeError here, rlstash's checks ValueError: the error is both."""
    match = r"not equivalent.*\(env 2: Box\(0.0, 1.0, \(3,\), float32\), env 0: Box"
    with pytest.raises(SpaceMismatchError, match=match) as caught:
        ProcessPoolVectorEnv([CountEnv, CountEnv, _other], num_workers=workers)
    assert isinstance(caught.value, RuntimeError) and isinstance(caught.value, ValueError)


def _other():
    from gymnasium import spaces

    env = CountEnv()
    env.observation_space = spaces.Box(0, 1, (3,))
    return env


def test_restart_outside_a_step_is_reported_at_the_next_step(tmp_path):
    with _pool(CountEnv, tmp_path) as pool:
        pool.reset()
        pool.step(ZERO)
        os.kill(pool.worker_pids[1], signal.SIGKILL)
        with pytest.raises(RuntimeError, match=r"env worker 1 died during episode_len"):
            pool.get_attr("episode_len")
        obs, rew, term, trunc, infos = pool.step(ZERO)  # envs 2-3 are not stepped
        np.testing.assert_array_equal(trunc, [False, False, True, True])
        np.testing.assert_array_equal(rew, [2, 2, 0, 0])
        np.testing.assert_array_equal(infos["worker_restarted"], [False, False, True, True])
        _, rew, _, trunc, _ = pool.step(ZERO)
        np.testing.assert_array_equal(rew, [3, 3, 0, 0])  # reset step (next_step mode)
        assert not trunc.any()


def test_restart_during_reset(tmp_path):
    with _pool(CountEnv, tmp_path) as pool:
        pool.reset()
        os.kill(pool.worker_pids[0], signal.SIGKILL)
        obs, infos = pool.reset(seed=100)
        np.testing.assert_array_equal(infos["worker_restarted"], [True, True, False, False])
        np.testing.assert_array_equal(obs[2:, 0], [102, 103])
        assert (obs[:, 1] == 0).all()
        _, rew, _, trunc, _ = pool.step(ZERO)
        assert not trunc.any() and (rew == 1).all()


def test_in_process_exception_rebuilds_envs(tmp_path):
    bad = functools.partial(CrashEnv, 2, "exception", once_file=str(tmp_path / "once"))
    with ProcessPoolVectorEnv([CountEnv, bad], num_workers=0) as pool:
        pool.reset()
        pool.step(np.zeros(2, dtype=np.int64))
        with pytest.warns(WorkerRestartWarning, match=r"env worker 0 \(envs 0..1\) exception"):
            _, rew, _, trunc, infos = pool.step(np.zeros(2, dtype=np.int64))
        assert trunc.all() and (rew == 0).all() and infos["worker_restarted"].all()
        _, rew, _, trunc, _ = pool.step(np.zeros(2, dtype=np.int64))
        assert not trunc.any()
