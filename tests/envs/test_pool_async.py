"""Asynchronous batches of ProcessPoolVectorEnv (``batch_size``; rlstash.envs.pool_async).

Property: whatever order the workers answer in, AsyncBatchCollector over the pool stores what
the synchronous pool under Collector stores for the same envs and per-env actions, slot for
slot (episode ends, frame stacks, n-step returns), worker restarts included."""

from __future__ import annotations

import functools
import os
import signal
import time

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlstash.collect.async_batches import AsyncBatchCollector
from rlstash.collect.sync import Collector
from rlstash.envs.cpus import usable_cpus
from rlstash.envs.errors import WorkerRestartWarning
from rlstash.envs.pool_async import default_workers
from rlstash.envs.process_pool import ProcessPoolVectorEnv
from rlstash.envs.testing import CountEnv, CrashEnv, HangEnv
from rlstash.spec import Field
from rlstash.storage.stream import StreamStorage
from rlstash.storage.stream_spec import ReadSpec
from tests.collect.test_async_batches import CountingPolicy, per_env_actions, same_stream
from tests.envs.helpers import marked_processes, wait_gone

CARTPOLE = functools.partial(gym.make, "CartPole-v1", max_episode_steps=30)
ZERO2 = np.zeros(2, dtype=np.int64)


def stream(spec: dict, n: int, lane: int) -> StreamStorage:
    return StreamStorage(spec, n, n * lane, reads=ReadSpec(n_step=3, gamma=0.9, frame_stack=4))


def sync_reference(fns, workers: int, seed: int, table: np.ndarray, steps: int, spec: dict):
    """The synchronous pool under Collector: env e's t-th action is table[e, t]."""
    store = stream(spec, len(fns), steps + 8)
    t = [0]

    def policy(obs):
        t[0] += 1
        return torch.as_tensor(table[:, t[0] - 1])

    with ProcessPoolVectorEnv(fns, num_workers=workers, caller_envs=0, seed=seed) as pool:
        collector = Collector(pool, policy, frames_per_batch=len(fns) * steps)
        collector.collect_into(store)
    return store


def async_run(fns, workers: int, batch: int, seed: int, table, steps: int, spec: dict):
    """AsyncBatchCollector over the pool with ``batch_size``: the first ``steps`` rows."""
    store = stream(spec, len(fns), steps + 8)
    pool = ProcessPoolVectorEnv(fns, num_workers=workers, seed=seed, batch_size=batch)
    try:
        collector = AsyncBatchCollector(pool, CountingPolicy(table), queue=2)  # rings grow
        rows = 0
        while rows < steps:
            collector.step_ready()
            while rows < steps and (chunk := collector.pop_rows()) is not None:
                store.extend(chunk)
                rows += 1
    finally:
        pool.close()
    return store, pool


CARTPOLE_SPEC = {"obs": Field((4,), torch.float32), "action": Field((), torch.int64)}
COUNT_SPEC = {"obs": Field((2,), torch.float64), "action": Field((), torch.int64)}


@st.composite
def layouts(draw):
    """(envs, workers dividing them, a batch of whole worker blocks)."""
    n = draw(st.integers(2, 6))
    workers = draw(st.sampled_from([w for w in range(1, 4) if n % w == 0]))  # few processes
    return n, workers, draw(st.integers(1, workers)) * (n // workers)


@settings(max_examples=4, deadline=None)
@given(layout=layouts(), steps=st.integers(20, 50))
def test_async_batches_store_what_the_synchronous_pool_stores(layout, steps):
    n, workers, batch = layout
    table = per_env_actions(n, 4 * steps + 50, 11)
    ref = sync_reference([CARTPOLE] * n, workers, 7, table, steps, CARTPOLE_SPEC)
    got, _ = async_run([CARTPOLE] * n, workers, batch, 7, table, steps, CARTPOLE_SPEC)
    same_stream(got, ref)


def test_a_restarted_worker_ends_its_episodes_as_the_synchronous_pool_does(tmp_path):
    def fns(tag):  # worker 1's envs crash once, at their 4th step
        crash = functools.partial(CrashEnv, 4, "exception", once_file=str(tmp_path / tag))
        return [functools.partial(CountEnv, 3)] * 2 + [crash] * 2

    steps, table = 12, per_env_actions(4, 200, 3)
    with pytest.warns(WorkerRestartWarning, match="env worker 1"):
        ref = sync_reference(fns("sync"), 2, 5, table, steps, COUNT_SPEC)
    with pytest.warns(WorkerRestartWarning, match="env worker 1"):
        got, pool = async_run(fns("async"), 2, 2, 5, table, steps, COUNT_SPEC)
    assert [(e.worker, e.reason) for e in pool.restarts] == [(1, "exception")]
    same_stream(got, ref)


def test_a_killed_worker_comes_back_truncated_in_the_next_recv_the_other_runs_on():
    with ProcessPoolVectorEnv([functools.partial(CountEnv, 50)] * 4, num_workers=2,
                              seed=0, batch_size=2) as pool:  # fmt: skip
        pool.async_reset()
        for _ in range(4):  # every env a reset result then one step
            _, _, _, _, infos = pool.recv()
            pool.send(np.zeros(2, np.int64), infos["env_id"])
        obs, *_, infos = pool.recv()  # one worker's envs; keep them waiting
        held = infos["env_id"].tolist()
        victim = 1 - pool._async.slot_of[held[0]]
        os.kill(pool.worker_pids[victim], signal.SIGKILL)
        mine = set(pool.envs_of(victim))
        flagged, first = {}, {}
        with pytest.warns(WorkerRestartWarning, match=f"env worker {victim}.*died"):
            pool.send(np.zeros(2, np.int64), held)
            deadline = time.monotonic() + 60  # the kill may land late on a loaded machine
            while time.monotonic() < deadline:
                obs, rew, term, trunc, infos = pool.recv()
                restarted = infos.get("worker_restarted", np.zeros(2, bool))
                for j, e in enumerate(infos["env_id"].tolist()):
                    first.setdefault(e, (rew[j], trunc[j]))
                    if restarted[j]:
                        flagged[e] = (obs[j], rew[j], trunc[j])
                pool.send(np.zeros(2, np.int64), infos["env_id"])
                if set(flagged) == mine and set(held) <= set(first):
                    break
        assert set(flagged) == mine  # the dead worker's envs: truncated, fresh reset obs
        assert all(tr and r == 0 and o[1] == 0 for o, r, tr in flagged.values())
        for e in held:  # the other worker stepped on
            assert first[e][0] > 0 and not first[e][1]
        assert len(pool.restarts) == 1


def test_a_hung_worker_is_restarted_after_step_timeout(tmp_path):
    hang = functools.partial(HangEnv, 2, 60.0, str(tmp_path / "once"))
    fns = [CountEnv, CountEnv, hang, hang]
    with ProcessPoolVectorEnv(fns, num_workers=2, seed=0, batch_size=2, step_timeout=2.0) as pool:
        pool.async_reset()
        flagged, start = [], time.monotonic()
        with pytest.warns(WorkerRestartWarning, match="timeout"):
            while not flagged and time.monotonic() - start < 60:  # worker 0 serves meanwhile
                _, _, _, trunc, infos = pool.recv()
                if "worker_restarted" in infos:
                    flagged += infos["env_id"][infos["worker_restarted"]].tolist()
                    assert trunc[infos["worker_restarted"]].all()
                pool.send(np.zeros(2, np.int64), infos["env_id"])
        assert sorted(flagged) == [2, 3]


def test_close_with_steps_in_flight_ends_every_worker():
    pool = ProcessPoolVectorEnv(
        "rlstash.envs.testing:rlstash/Burn-v0", num_envs=4, num_workers=2, batch_size=2
    )
    try:
        pids = pool.worker_pids
        pool.async_reset()
        _, *_, infos = pool.recv()
        pool.send(np.zeros(2, np.int64), infos["env_id"])  # both workers busy now
    finally:
        pool.close()
    assert wait_gone(pids) == [] and marked_processes(os.getpid()) == []


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"batch_size": 0}, ValueError, r"batch_size: expected 1..num_envs \(4\), got 0"),
        ({"batch_size": 5}, ValueError, r"batch_size: expected 1..num_envs \(4\), got 5"),
        ({"batch_size": 2.0}, TypeError, "batch_size: expected an int or None"),
        ({"batch_size": 2, "num_workers": 0}, ValueError, "num_workers: asynchronous"),
        ({"batch_size": 2, "num_workers": 1, "caller_envs": 1}, ValueError, "caller_envs: asy"),
        ({"batch_size": 2, "autoreset_mode": "SameStep"}, ValueError, "autoreset_mode: asy"),
        ({"batch_size": 1, "num_workers": 2}, ValueError, "batch_size: expected whole worker"),
        ({"batch_size": 2, "num_workers": 3}, ValueError, r"num_workers=4 \(blocks of 1\)"),
    ],
)
def test_bad_async_settings_are_refused_before_anything_starts(kwargs, error, match):
    with pytest.raises(error, match=match):
        ProcessPoolVectorEnv(CountEnv, num_envs=4, **kwargs)
    assert marked_processes(os.getpid()) == []


def test_bad_ids_and_calls_are_refused_with_the_fix():
    with ProcessPoolVectorEnv(CountEnv, num_envs=4, num_workers=2, batch_size=2) as pool:
        with pytest.raises(RuntimeError, match="batch_size=2 < num_envs=4.*async_reset"):
            pool.reset()
        pool.async_reset()
        _, *_, infos = pool.recv()
        ids = infos["env_id"]
        others = sorted(set(range(4)) - set(ids.tolist()))
        bad = [
            (others, ValueError, r"envs \[.*\] are not waiting for an action"),
            ([ids[0], ids[0]], ValueError, "each env once"),
            ([7, ids[0]], ValueError, r"indices in 0..3, got \[7\]"),
            (np.array([0.0, 1.0]), ValueError, "1-D array of env indices"),
        ]
        for env_ids, error, match in bad:
            with pytest.raises(error, match=match):
                pool.send(ZERO2, env_ids)
        with pytest.raises(ValueError, match=r"actions: expected shape \(2,\)"):
            pool.send(np.zeros(3, np.int64), ids)
        with pytest.raises(ValueError, match="outside the action space"):
            pool.send(np.array([0, 9]), ids)
        pool.recv()  # the other worker's reset results; now all 4 envs wait
        with pytest.raises(RuntimeError, match=r"only 0 env\(s\) can answer.*4 env\(s\)"):
            pool.recv()
        pool.send(ZERO2, ids)  # nothing was written by the refused sends
        assert len(pool.recv()[0]) == 2
    with ProcessPoolVectorEnv(CountEnv, num_envs=2, num_workers=1) as sync:
        with pytest.raises(RuntimeError, match="steps synchronously.*batch_size=B"):
            sync.recv()


def test_default_layout_is_whole_blocks_one_batch_a_worker_at_least():
    assert default_workers(32, 16, 2) == 2  # 2 workers of 16: a batch is a worker's envs
    assert default_workers(32, 8, 2) == 4
    assert default_workers(32, 16, 16) == 16
    assert default_workers(6, 4, 2) == 3  # blocks of 2; 4 = two blocks
    assert default_workers(5, 2, 2) == 5  # only blocks of one env fit
    with ProcessPoolVectorEnv(CountEnv, num_envs=6, batch_size=2) as pool:
        assert pool.caller_envs == 0 and pool.num_workers == default_workers(6, 2, usable_cpus())
