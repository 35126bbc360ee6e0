"""Every timeout is honoured (issue 22, class 5): a restarted worker's start and reset are
bounded by the pool's ``start_timeout`` and ``step_timeout``, never by a fixed 120 s; a worker
that misses them is one more failure against ``max_restarts``, reported like a hang in a step,
and every process it started is gone afterwards."""

from __future__ import annotations

import functools
import os
import signal
import time

import numpy as np
import pytest
import torch

from rlstash.collect.async_ import AsyncCollector
from rlstash.envs import ProcessPoolVectorEnv, WorkerFailedError, WorkerRestartWarning
from rlstash.envs.testing import CountEnv, HangEnv
from tests.envs.helpers import marked_processes, wait_gone

pytestmark = [
    pytest.mark.multiproc,
    pytest.mark.timeout(120),  # on main each missed reset took 120 s
    pytest.mark.filterwarnings("ignore::rlstash.envs.WorkerRestartWarning"),
]

STEP = 2.0  # step_timeout of these tests: the old bound of a restart's reset was 120 s
BOUND = 30.0  # two missed resets of 2 s plus restarts; main waited 240 s here


def _hangs_in_reset_once_armed(tmp_path, once: bool = False):
    """A factory of envs that hang in their first reset when the file ``armed`` exists (so
    only envs built by a restart hang); ``once``: only the first such env hangs."""
    armed = tmp_path / "armed"
    once_file = str(tmp_path / "once") if once else None
    fn = functools.partial(
        HangEnv, hang_at=1, during="reset", armed_file=str(armed), once_file=once_file
    )
    return fn, armed


def _our_processes() -> list[int]:
    return [p.pid for p in marked_processes(os.getpid())]


def test_pool_restart_hanging_in_reset_fails_within_step_timeout(tmp_path):
    hang, armed = _hangs_in_reset_once_armed(tmp_path)
    fns = [CountEnv, CountEnv, hang, hang]
    zero = np.zeros(4, dtype=np.int64)
    pool = ProcessPoolVectorEnv(fns, num_workers=2, seed=0, step_timeout=STEP, max_restarts=2)
    try:
        pool.reset()
        pool.step(zero)
        armed.touch()  # envs built from now on (by a restart) hang in their first reset
        victim = pool.worker_pids[1]
        os.kill(victim, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(WorkerFailedError) as info:
            pool.step(zero)  # died -> restart hangs in reset -> restart hangs -> budget spent
        took = time.monotonic() - t0
    finally:
        pool.close()
    err = info.value
    assert took < BOUND, f"{took:.0f} s: the restarts' resets ignored step_timeout={STEP}"
    assert (err.worker, err.envs, err.failures, err.max_restarts) == (1, (2, 3), 3, 2)
    assert [(e.reason, e.command) for e in err.events] == [
        ("died", "step"),
        ("timeout", "restart"),
        ("timeout", "restart"),
    ]
    assert f"step_timeout={STEP} s" in err.events[1].error and "failed 3 time(s)" in str(err)
    assert wait_gone([victim] + [e.pid for e in err.events] + _our_processes()) == []


def test_pool_restart_without_step_timeout_is_bounded_by_start_timeout(tmp_path):
    """A restarted worker hanging in reset, with no step_timeout set: the restart is still
    bounded (by start_timeout), never waited on for ever."""
    hang, armed = _hangs_in_reset_once_armed(tmp_path)
    fns = [CountEnv, CountEnv, hang, hang]
    zero = np.zeros(4, dtype=np.int64)
    start = 10.0  # generous: the pool's own start on a loaded machine is bounded by it too
    pool = ProcessPoolVectorEnv(fns, num_workers=2, seed=0, start_timeout=start, max_restarts=1)
    try:
        pool.reset()
        pool.step(zero)
        armed.touch()
        victim = pool.worker_pids[1]
        os.kill(victim, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(WorkerFailedError) as info:
            pool.step(zero)  # died -> the restart hangs in reset -> budget spent
        took = time.monotonic() - t0
    finally:
        pool.close()
    assert took < 3 * start, f"{took:.0f} s: a restart's reset without step_timeout was unbounded"
    assert [(e.reason, e.command) for e in info.value.events] == [
        ("died", "step"),
        ("timeout", "restart"),
    ]
    assert f"start_timeout={start} s" in info.value.events[1].error
    assert wait_gone([victim] + [e.pid for e in info.value.events] + _our_processes()) == []


def test_pool_restart_hanging_once_in_reset_counts_and_recovers(tmp_path):
    hang, armed = _hangs_in_reset_once_armed(tmp_path, once=True)
    zero = np.zeros(4, dtype=np.int64)
    fns = [CountEnv, CountEnv, hang, hang]
    with ProcessPoolVectorEnv(fns, num_workers=2, seed=0, step_timeout=STEP) as pool:
        pool.reset()
        pool.step(zero)
        armed.touch()
        os.kill(pool.worker_pids[1], signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.warns(WorkerRestartWarning, match=r"timeout during restart; restarting"):
            _, rew, _, trunc, infos = pool.step(zero)
        assert time.monotonic() - t0 < BOUND
        np.testing.assert_array_equal(trunc, [False, False, True, True])
        np.testing.assert_array_equal(infos["worker_restarted"], [False, False, True, True])
        assert [(e.reason, e.command, e.count) for e in pool.restarts] == [
            ("died", "step", 1),
            ("timeout", "restart", 2),
        ]
        hung = pool.restarts[1].pid
        _, rew, _, trunc, _ = pool.step(zero)  # the third worker of slot 1 steps on
        assert not trunc.any() and rew.tolist() == [3.0, 3.0, 0.0, 0.0]
    assert wait_gone([hung] + _our_processes()) == []


class _Zero(torch.nn.Module):
    """Action 0 for CountEnv observations [n, 2]."""

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.zeros(len(obs), dtype=torch.int64)


def test_async_restart_hanging_in_reset_fails_within_step_timeout(tmp_path):
    hang, armed = _hangs_in_reset_once_armed(tmp_path)
    c = AsyncCollector(
        hang, _Zero, num_workers=1, frames_per_batch=4, seed=0, step_timeout=STEP,
        max_restarts=2,
    )  # fmt: skip
    try:
        c.collect()
        armed.touch()
        victim = c.worker_pids[0]
        os.kill(victim, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(WorkerFailedError) as info:
            for _ in range(10):
                c.collect()
        took = time.monotonic() - t0
    finally:
        c.close()
    err = info.value
    assert took < BOUND, f"{took:.0f} s: the restarts' resets ignored step_timeout={STEP}"
    assert [(e.reason, e.command) for e in err.events] == [
        ("died", "collect"),
        ("timeout", "restart"),
        ("timeout", "restart"),
    ]
    assert f"step_timeout={STEP} s" in err.events[1].error
    assert wait_gone([victim] + [e.pid for e in err.events] + _our_processes()) == []


def _ray_collector(**timeouts):
    from rlstash.collect.ray import RayCollector

    return RayCollector("CartPole-v1", _Zero, 1, 1, 4, **timeouts)


@pytest.mark.parametrize(
    ("make", "name", "value"),
    [
        (lambda v: ProcessPoolVectorEnv(CountEnv, 2, start_timeout=v), "start_timeout", 0),
        (lambda v: ProcessPoolVectorEnv(CountEnv, 2, step_timeout=v), "step_timeout", np.inf),
        (lambda v: AsyncCollector(CountEnv, _Zero, 1, 4, start_timeout=v), "start_timeout", -1),
        (lambda v: _ray_collector(request_timeout=v), "request_timeout", float("inf")),
        (lambda v: _ray_collector(restart_timeout=v), "restart_timeout", None),
    ],
)
def test_timeouts_are_checked_before_anything_starts(make, name, value):
    with pytest.raises(ValueError, match=rf"{name}: expected seconds > 0"):
        make(value)
    assert _our_processes() == []
