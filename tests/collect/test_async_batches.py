"""Asynchronous batches (AsyncBatchCollector): envs stepped whenever they are ready, each
env's steps into its own lane. Property: whatever order the envs become ready in, the stream
holds what a synchronous run of the same envs with the same per-env actions stores (episode
boundaries, next observations, frame stacks, n-step returns), slot for slot."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlstash.collect.async_batches import AsyncBatchCollector
from rlstash.spec import Field
from rlstash.storage.stream import StreamStorage
from rlstash.storage.stream_spec import ReadSpec

SPEC = {"obs": Field((4,), torch.float32), "action": Field((), torch.int64)}
ENV = "CartPole-v1"


class ShuffledReadyEnvs:
    """An asynchronous pool with EnvPool's protocol over gymnasium envs stepped here: ``recv``
    answers ``batch_size`` of the envs in flight chosen by ``order`` (any readiness order),
    next-step autoreset per env."""

    def __init__(self, n: int, batch_size: int, seed: int, order: np.random.Generator):
        self.num_envs, self.batch_size, self.order = n, batch_size, order
        self.envs = [gym.make(ENV, max_episode_steps=30) for _ in range(n)]
        self.seed = seed
        self.pending: dict[int, tuple] = {}  # env -> its result, in flight
        self.ended = np.zeros(n, dtype=bool)

    def async_reset(self) -> None:
        for e, env in enumerate(self.envs):
            obs, _ = env.reset(seed=self.seed + e)
            self.pending[e] = (obs, 0.0, False, False)
        self.ended[:] = False

    def send(self, actions, env_ids) -> None:
        for a, e in zip(np.asarray(actions).tolist(), np.asarray(env_ids).tolist()):
            assert e not in self.pending, "an env got an action before its result was taken"
            env = self.envs[e]
            if self.ended[e]:
                obs, _ = env.reset()
                self.pending[e], self.ended[e] = (obs, 0.0, False, False), False
            else:
                obs, r, term, trunc, _ = env.step(a)
                self.pending[e], self.ended[e] = (obs, r, term, trunc), term or trunc

    def recv(self):
        ready = sorted(self.pending)
        ids = self.order.choice(ready, size=min(self.batch_size, len(ready)), replace=False)
        rows = [self.pending.pop(int(e)) for e in ids]
        obs, rew, term, trunc = (np.array(x) for x in zip(*rows))
        return obs, rew, term, trunc, {"env_id": ids.astype(np.int32)}


def per_env_actions(n: int, length: int, seed: int) -> np.ndarray:
    """Action k of env e (k: that env's k-th action, reset steps included)."""
    return np.random.default_rng(seed).integers(0, 2, (n, length))


class CountingPolicy:
    """Env e's k-th call gets its k-th action from the table, whatever batch it is in."""

    def __init__(self, table: np.ndarray):
        self.table, self.count = table, np.zeros(len(table), dtype=np.int64)

    def __call__(self, obs, env_ids):
        out = np.array([self.table[e, self.count[e]] for e in env_ids], dtype=np.int64)
        self.count[env_ids] += 1
        return out


def stream(n: int, lane: int) -> StreamStorage:
    return StreamStorage(SPEC, n, n * lane, reads=ReadSpec(n_step=3, gamma=0.9, frame_stack=4))


def synchronous(n: int, steps: int, seed: int, table: np.ndarray) -> StreamStorage:
    """The reference: a SyncVectorEnv (next-step autoreset) of the same envs and actions."""
    env = gym.vector.SyncVectorEnv([lambda: gym.make(ENV, max_episode_steps=30)] * n)
    store = stream(n, steps + 8)
    obs, _ = env.reset(seed=[seed + e for e in range(n)])
    for t in range(steps):
        actions = table[:, t]
        nxt, rew, term, trunc, _ = env.step(actions)
        store.extend({
            "obs": torch.as_tensor(obs), "action": torch.as_tensor(actions),
            "reward": torch.as_tensor(rew, dtype=torch.float32),
            "terminated": torch.as_tensor(term), "truncated": torch.as_tensor(trunc),
        })  # fmt: skip
        obs = nxt
    env.close()
    return store


def same_stream(a: StreamStorage, b: StreamStorage) -> None:
    np.testing.assert_array_equal(a.valid, b.valid)
    np.testing.assert_array_equal(a.written, b.written)
    starts = np.flatnonzero(a.valid)
    assert starts.size > 0
    ra, rb = a.read(starts), b.read(starts)
    assert set(ra) == set(rb)
    for k in ra:
        torch.testing.assert_close(ra[k], rb[k], rtol=0, atol=0, msg=k)


@settings(max_examples=15, deadline=None)
@given(
    n=st.integers(2, 6),
    batch=st.integers(1, 6),
    order_seed=st.integers(0, 2**16),
    steps=st.integers(20, 70),
)
def test_any_readiness_order_stores_what_a_synchronous_run_stores(n, batch, order_seed, steps):
    batch = min(batch, n)
    seed, table = 7, per_env_actions(n, 4 * steps + 50, 11)
    ref = synchronous(n, steps, seed, table)
    env = ShuffledReadyEnvs(n, batch, seed, np.random.default_rng(order_seed))
    collector = AsyncBatchCollector(env, CountingPolicy(table), queue=2)  # rings grow
    store = stream(n, steps + 8)
    rows = 0
    while rows < steps:
        collector.step_ready()
        while rows < steps and (chunk := collector.pop_rows()) is not None:
            store.extend(chunk)
            rows += 1
    same_stream(store, ref)


def test_collect_into_writes_whole_rows_and_keeps_the_rest_queued():
    n, seed, table = 4, 3, per_env_actions(4, 400, 5)
    env = ShuffledReadyEnvs(n, 2, seed, np.random.default_rng(0))
    collector = AsyncBatchCollector(env, CountingPolicy(table))
    store = stream(n, 200)
    rows = collector.collect_into(store, steps=100)
    assert collector.env_steps >= 100
    assert rows >= 1
    queued = collector.env_steps - rows * n
    assert queued == collector.queued().sum() and queued >= 0


def test_a_synchronous_env_is_refused_with_the_fix():
    env = gym.vector.SyncVectorEnv([lambda: gym.make(ENV)] * 2)
    with pytest.raises(TypeError, match="asynchronous env pool.*rlstash.Collector"):
        AsyncBatchCollector(env, lambda obs, ids: ids)
    env.close()
