"""``caller_envs``: the last envs of a pool step in the calling process while the workers
step theirs. Results are those of the in-process pool step by step; an env of the caller's
share that raises is handled like a worker that raised; close closes them."""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest
from gymnasium import spaces

from rlstash.envs import ProcessPoolVectorEnv, WorkerFailedError, WorkerRestartWarning
from rlstash.envs.errors import WaitTimeoutError
from rlstash.envs.testing import CountEnv, CrashEnv, HangEnv, InfoEnv, SpacesEnv
from tests.envs.helpers import wait_gone
from tests.envs.test_infos import same as _same_leaf

pytestmark = pytest.mark.multiproc

ZERO = np.zeros(4, dtype=np.int64)


def same(a, b) -> bool:
    """Structural equality of results (tuples, dicts, object arrays, arrays; NaN == NaN)."""
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray) and a.dtype == object:
        return isinstance(b, np.ndarray) and b.dtype == object and all(map(same, a, b))
    return _same_leaf(a, b)


def _step_alike(pool, ref, actions, steps: int, mode: str) -> None:
    """``pool`` and ``ref`` give the same observations, rewards, flags and infos."""
    assert same(pool.reset()[1], ref.reset()[1])
    for t in range(steps):
        a = actions(t)
        got, want = pool.step(a), ref.step(a)
        for g, w in zip(got[:4], want[:4]):
            assert same(g, w), (t, g, w)
        assert same(got[4], want[4]), (t, got[4], want[4])
        ended = want[2] | want[3]
        if mode == "disabled" and ended.any():
            assert same(
                pool.reset(options={"reset_mask": ended}), ref.reset(options={"reset_mask": ended})
            )


@pytest.mark.parametrize("mode", ["next_step", "same_step", "disabled"])
def test_steps_equal_in_process_step_by_step(mode):
    """Every kind of info (InfoEnv), episodes ending in both blocks, all autoreset modes."""
    fns = [functools.partial(InfoEnv, i, 2) for i in range(6)]
    kw = dict(seed=0, autoreset_mode=mode)
    with (
        ProcessPoolVectorEnv(fns, num_workers=1, caller_envs=3, **kw) as pool,
        ProcessPoolVectorEnv(fns, num_workers=0, **kw) as ref,
    ):
        assert pool.num_workers == 1 and pool.caller_envs == 3
        assert list(pool.envs_of(1)) == [3, 4, 5] and len(pool.worker_pids) == 1
        assert "1 workers + 3 envs in the caller" in repr(pool)
        _step_alike(pool, ref, lambda t: np.full(6, t % 2, dtype=np.int64), 40, mode)


@pytest.mark.parametrize("mode", ["next_step", "same_step"])
def test_dict_and_pickled_spaces_equal_in_process(mode):
    """Dict/Tuple observations (SpacesEnv) and Text observations (pickled with replies)."""
    with (
        ProcessPoolVectorEnv(SpacesEnv, 5, num_workers=2, caller_envs=2, seed=1,
                             autoreset_mode=mode) as pool,
        ProcessPoolVectorEnv(SpacesEnv, 5, num_workers=0, seed=1, autoreset_mode=mode) as ref,
    ):  # fmt: skip
        space = pool.action_space
        space.seed(0)
        samples = [space.sample() for _ in range(12)]
        _step_alike(pool, ref, samples.__getitem__, 12, mode)
    text = functools.partial(_TextEnv)
    with (
        ProcessPoolVectorEnv(text, 4, num_workers=1, caller_envs=2, seed=2,
                             autoreset_mode=mode) as pool,
        ProcessPoolVectorEnv(text, 4, num_workers=0, seed=2, autoreset_mode=mode) as ref,
    ):  # fmt: skip
        _step_alike(pool, ref, lambda t: np.full(4, t % 3, dtype=np.int64), 10, mode)


class _TextEnv(CountEnv):
    """Text observations: pickled with the replies, not in shared memory."""

    def __init__(self) -> None:
        super().__init__(episode_len=4)
        self.observation_space = spaces.Text(8)

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        return f"r{int(obs[0])}", info

    def step(self, action):
        obs, *rest = super().step(action)
        return (f"s{int(obs[1])}a{int(action)}", *rest)


def test_calls_and_attributes_in_env_order():
    with ProcessPoolVectorEnv(CountEnv, 5, num_workers=2, caller_envs=2, seed=0) as pool:
        pool.set_attr("episode_len", [3, 4, 5, 6, 7])
        assert pool.get_attr("episode_len") == (3, 4, 5, 6, 7)
        assert pool.call("scaled", 2, offset=1) == (7, 9, 11, 13, 15)
        assert [w["pid"] for w in pool.worker_info()] == pool.worker_pids  # processes only
        assert os.getpid() not in pool.worker_pids


def test_exception_in_the_callers_share_restarts_it(tmp_path):
    """Envs 2-3 (the caller's share) raise once: they are rebuilt with fresh seeds and end
    as truncated, reported as worker 1 (= num_workers); the worker's envs go on."""
    bad = functools.partial(CrashEnv, 3, "exception", once_file=str(tmp_path / "once"))
    fns = [functools.partial(CountEnv, 100)] * 2 + [bad] * 2
    with ProcessPoolVectorEnv(fns, num_workers=1, caller_envs=2, seed=0) as pool:
        pool.reset()
        pid = pool.worker_pids
        for _ in range(2):
            pool.step(ZERO)
        with pytest.warns(WorkerRestartWarning, match=r"env worker 1 \(envs 2..3\) exception"):
            obs, rew, term, trunc, infos = pool.step(ZERO)
        np.testing.assert_array_equal(trunc, [False, False, True, True])
        np.testing.assert_array_equal(rew, [3, 3, 0, 0])
        np.testing.assert_array_equal(infos["worker_restarted"], [False, False, True, True])
        assert (obs[2:, 1] == 0).all() and obs[2, 0] != 2  # fresh reset, fresh seed
        [event] = pool.restarts
        assert (event.worker, event.envs, event.reason, event.pid) == (
            1,
            (2, 3),
            "exception",
            os.getpid(),
        )
        assert "planned crash at step 3" in event.error
        assert pool.worker_pids == pid  # the worker process was not touched
        _, rew, _, trunc, _ = pool.step(ZERO)  # next_step: a reset step for 2-3
        np.testing.assert_array_equal(rew, [4, 4, 0, 0])
        assert not trunc.any()


@pytest.mark.filterwarnings("ignore:.*(error from Worker|Raising the last|Traceback):UserWarning")
def test_max_restarts_0_reraises_the_envs_exception():
    fns = [CountEnv, CountEnv, functools.partial(CrashEnv, 2, "exception")]
    pool = ProcessPoolVectorEnv(fns, num_workers=1, caller_envs=1, seed=0, max_restarts=0)
    pids = pool.worker_pids
    try:
        pool.reset()
        pool.step(np.zeros(3, dtype=np.int64))
        with pytest.raises(RuntimeError, match="planned crash at step 2") as info:
            pool.step(np.zeros(3, dtype=np.int64))
        assert isinstance(info.value.__cause__, WorkerFailedError)
        assert pool.closed or pool._backend.closed
    finally:
        pool.close()
    assert wait_gone(pids) == []


def test_caller_timeout_after_the_callers_share_ran(tmp_path):
    """A worker that hangs makes step_wait(timeout) raise TimeoutError; the caller's share
    has stepped (its rows hold the new step) and nothing restarts."""
    hang = functools.partial(HangEnv, 2, 2.0, str(tmp_path / "once"))  # close waits for it
    fns = [hang, CountEnv, CountEnv]
    with ProcessPoolVectorEnv(fns, num_workers=1, caller_envs=2, seed=0) as pool:
        pool.reset()
        pool.step(np.zeros(3, dtype=np.int64))
        pool.step_async(np.zeros(3, dtype=np.int64))
        with pytest.raises(WaitTimeoutError, match=r"envs \[0\] did not answer"):
            pool.step_wait(timeout=0.3)
        assert list(pool._backend.shared["reward"][1:]) == [2.0, 2.0]
        assert pool.restarts == []


class _Closing(CountEnv):
    closed_here: list[int] = []  # noqa: RUF012 - envs of the caller's share live in this process

    def close(self) -> None:
        _Closing.closed_here.append(os.getpid())
        super().close()


def test_close_closes_the_callers_envs_and_ends_the_workers():
    _Closing.closed_here.clear()
    pool = ProcessPoolVectorEnv(_Closing, 4, num_workers=1, caller_envs=3, seed=0)
    pids = pool.worker_pids
    pool.reset()
    pool.step(ZERO)
    pool.close()
    assert _Closing.closed_here == [os.getpid()] * 3
    assert wait_gone(pids) == []
    pool.close()  # twice is fine


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (
            dict(num_workers=0, caller_envs=2),
            ValueError,
            "caller_envs: expected 0 with num_workers=0",
        ),
        (dict(num_workers="auto", caller_envs=2), ValueError, 'caller_envs: num_workers="auto"'),
        (dict(num_workers=2, caller_envs=3), ValueError, "caller_envs: expected at most 2"),
        (dict(num_workers=1, caller_envs=-1), ValueError, "caller_envs: expected an int >= 0"),
        (dict(num_workers=1, caller_envs=True), TypeError, "caller_envs: expected an int >= 0"),
    ],
)
def test_bad_caller_envs_are_refused_before_anything_starts(kwargs, error, match):
    with pytest.raises(error, match=match):
        ProcessPoolVectorEnv(CountEnv, 4, **kwargs)


def test_num_workers_none_leaves_the_callers_core():
    from rlstash.envs.cpus import usable_cpus

    with ProcessPoolVectorEnv(CountEnv, 8, caller_envs=2) as pool:
        assert pool.num_workers == max(1, min(usable_cpus() - 1, 6))


CTRL_C = """
import sys, numpy as np
from rlstash.envs import ProcessPoolVectorEnv
pool = ProcessPoolVectorEnv("CartPole-v1", 8, num_workers=2, caller_envs=4, seed=0)
pool.reset()
actions = np.zeros(8, dtype=np.int64)
print("PIDS", " ".join(map(str, pool.worker_pids)), flush=True)
while True:
    pool.step(actions)
"""


def test_ctrl_c_while_the_caller_steps_its_share_ends_everything():
    """Ctrl-C to the process group lands in the caller's own env steps as often as in the
    wait for the workers: the workers end, nothing leaks, no warning."""
    from tests.envs.helpers import (
        interrupt,
        kill_tree,
        marked_processes,
        start_script,
        wait_for_line,
    )

    proc = start_script(CTRL_C)
    try:
        pids = [int(p) for p in wait_for_line(proc, "PIDS").split()[1:]]
        workers = [p.pid for p in marked_processes(proc.pid)]
        assert set(pids) <= set(workers) and len(pids) == 2
        stderr = interrupt(proc, 0.3)  # while it steps
    finally:
        kill_tree(proc)
    assert "KeyboardInterrupt" in stderr
    assert wait_gone(workers) == [] and marked_processes(proc.pid) == []
    for word in ("leaked", "resource_tracker", "ResourceWarning", "Exception ignored"):
        assert word not in stderr, stderr
