"""Collector.collect_into: a batched env's steps written straight into a stream's slots (one
copy per field and step) store exactly what ``extend(collect())`` stores."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode

from rlstash.collect import Collector
from rlstash.envs.batched.cartpole import CartPoleVectorEnv
from rlstash.replay import ReplayBuffer
from rlstash.sampler import PrioritizedSampler
from rlstash.spec import Field
from rlstash.storage.stream import ReadSpec, StreamStorage

SPEC = {"obs": Field((4,), torch.float32), "action": Field((), torch.int64)}


def noisy_balance(n, seed=1):
    gen = torch.Generator().manual_seed(seed)

    def policy(obs: torch.Tensor) -> torch.Tensor:
        good = (obs[:, 2] + 0.3 * obs[:, 3] > 0).long()
        return torch.where(torch.rand(n, generator=gen) < 0.6, 1 - good, good)

    return policy


def pair(n, T, mode=AutoresetMode.NEXT_STEP):
    """Two identical collectors over identical envs."""
    return [
        Collector(CartPoleVectorEnv(num_envs=n, autoreset_mode=mode), noisy_balance(n),
                  frames_per_batch=n * T, seed=0)
        for _ in range(2)
    ]  # fmt: skip


def assert_same_stream(a: StreamStorage, b: StreamStorage) -> None:
    for k in a.backing.tensors:
        torch.testing.assert_close(a.backing.tensors[k], b.backing.tensors[k], rtol=0, atol=0)
    for k, v in a.lanes.arrays().items():  # floor: the in-place path raises it first
        if k != "floor":
            np.testing.assert_array_equal(v, b.lanes.arrays()[k], err_msg=k)
    np.testing.assert_array_equal(a.lanes.alive_floor(), b.lanes.alive_floor())
    np.testing.assert_array_equal(a.valid, b.valid)
    idx = np.flatnonzero(a.valid)
    ra, rb = a.read(idx), b.read(idx)
    for k in ra:
        torch.testing.assert_close(ra[k], rb[k], rtol=0, atol=0, msg=k)


@pytest.mark.parametrize("reads", [ReadSpec(), ReadSpec(n_step=3, gamma=0.9, frame_stack=3)])
def test_collect_into_a_stream_stores_what_extend_of_the_batch_stores(reads):
    """Batches of 12 steps into lanes of 20 (every chunk but some wraps the ring), with many
    episode ends: slots, lane bookkeeping, valid starts, reads and episode stats all equal
    the batch path's; the direct path really ran (the batch path's collect was not called)."""
    n, T = 6, 12
    direct, batch = pair(n, T)
    a = StreamStorage(SPEC, n, n * 20, reads=reads)
    b = StreamStorage(SPEC, n, n * 20, reads=reads)
    calls = []
    direct.batched.collect = lambda *args: calls.append(args)  # must not be used
    for _ in range(7):
        got = direct.collect_into(a)
        want = b.extend(batch.collect())
        np.testing.assert_array_equal(got, want)
        assert_same_stream(a, b)
    assert not calls and direct.frames == batch.frames == 7 * n * T
    assert direct.stats.count == batch.stats.count > 5
    assert direct.stats.returns == batch.stats.returns
    torch.testing.assert_close(direct.next_obs, batch.next_obs)


def test_collect_into_a_replay_buffer_tells_its_sampler():
    """Through a ReplayBuffer over a stream: the commit takes the buffer's lock and the
    sampler learns the new slots (a prioritized sampler gives them the max priority)."""
    n, T = 4, 8
    direct, batch = pair(n, T)
    rbs = [
        ReplayBuffer(StreamStorage(SPEC, n, n * 32), sampler=PrioritizedSampler(), seed=0)
        for _ in range(2)
    ]
    for _ in range(5):
        direct.collect_into(rbs[0])
        rbs[1].extend(batch.collect())
    assert_same_stream(rbs[0].storage, rbs[1].storage)
    every = np.arange(n * 32)
    np.testing.assert_array_equal(rbs[0].sampler._written, rbs[1].sampler._written)
    assert rbs[0].sampler._written[np.flatnonzero(rbs[0].storage.valid)].all()
    np.testing.assert_array_equal(
        rbs[0].sampler.priorities(every), rbs[1].sampler.priorities(every)
    )
    a, b = rbs[0].sample(64), rbs[1].sample(64)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)


def test_slots_being_rewritten_are_never_valid_nor_read():
    """Between open_steps and commit, no valid start reaches into the vacated rows (its
    n-step successors and frame history all lie in alive slots)."""
    n, L, T = 3, 10, 4
    store = StreamStorage(SPEC, n, n * L, reads=ReadSpec(n_step=2, frame_stack=3))
    c = Collector(CartPoleVectorEnv(num_envs=n), noisy_balance(n), frames_per_batch=n * T, seed=0)
    for _ in range(4):
        c.collect_into(store)
    col = int(store.lanes.count[0]) % L
    slots = store.open_steps(T)
    rows = set(((col + np.arange(T)) % L * n)[:, None].__add__(np.arange(n)).reshape(-1).tolist())
    assert slots is not None and not store.valid[list(rows)].any()
    idx = np.flatnonzero(store.valid)
    assert idx.size > 0
    steps, _, _, nxt = store.lanes.nstep(idx)
    touched = {*steps.reshape(-1).tolist(), *nxt.tolist()}
    touched |= set(store.lanes.frame_rows(idx).reshape(-1).tolist())
    touched |= set(store.lanes.frame_rows(nxt).reshape(-1).tolist())
    assert not touched & rows


def test_collect_into_falls_back_to_extend_where_steps_cannot_go_in_place():
    """Same-step envs, obs stored in another dtype, and an extra stored field: the batch
    path (validated, cast as extend casts), with the same result as extend(collect())."""
    n, T = 4, 6
    cases = [
        (AutoresetMode.SAME_STEP, SPEC, "same_step"),
        (AutoresetMode.NEXT_STEP, {**SPEC, "obs": Field((4,), torch.float64)}, "next_step"),
        (AutoresetMode.NEXT_STEP, {**SPEC, "action": Field((), torch.int32)}, "next_step"),
    ]
    for mode, spec, autoreset in cases:
        direct, batch = pair(n, T, mode)
        a = StreamStorage(spec, n, n * 16, autoreset=autoreset)
        b = StreamStorage(spec, n, n * 16, autoreset=autoreset)
        for _ in range(4):
            np.testing.assert_array_equal(direct.collect_into(a), b.extend(batch.collect()))
        assert_same_stream(a, b)


def test_collect_into_a_disk_stream_survives_a_reopen(tmp_path):
    """A disk stream filled in place holds what the batch path's holds, and reopens with the
    transitions its saves vouch for (the bookkeeping is saved before slots are overwritten)."""
    n, T = 3, 8
    direct, batch = pair(n, T)
    a = StreamStorage(SPEC, n, n * 40, "disk", path=tmp_path / "a")
    b = StreamStorage(SPEC, n, n * 40, "disk", path=tmp_path / "b")
    direct.batched.collect = lambda *args: pytest.fail("the batch path ran")
    for _ in range(9):  # 72 steps through lanes of 40: the ring wraps
        np.testing.assert_array_equal(direct.collect_into(a), b.extend(batch.collect()))
    assert_same_stream(a, b)
    a.close()
    b.close()
    a = StreamStorage(SPEC, n, n * 40, "disk", path=tmp_path / "a")
    b = StreamStorage(SPEC, n, n * 40, "disk", path=tmp_path / "b")
    assert a.valid.sum() > 50
    assert_same_stream(a, b)
    a.close()
    b.close()


def test_collect_into_takes_dict_observations_as_obs_key_fields():
    """Isaac Lab style observation groups (nested dicts): each ``obs/<key>`` field is copied
    into its own rows, as ``extend`` of the batch stores them."""
    from tests.collect.test_dict_obs import KEYS, DictObsEnv

    n, T = 4, 6
    shapes = {"obs/policy": (4,), "obs/critic/sq": (4,), "obs/critic/x": (1,)}
    spec = {**{k: Field(s, torch.float32) for k, s in shapes.items()}, "action": SPEC["action"]}

    def policy(obs):
        return noisy_balance(n)(obs["policy"])

    cs = [
        Collector(DictObsEnv(n, AutoresetMode.NEXT_STEP), policy, frames_per_batch=n * T, seed=0)
        for _ in range(2)
    ]
    a, b = (StreamStorage(spec, n, n * 16, reads=ReadSpec(n_step=2)) for _ in range(2))
    cs[0].batched.collect = lambda *args: pytest.fail("the batch path ran")
    for _ in range(5):
        np.testing.assert_array_equal(cs[0].collect_into(a), b.extend(cs[1].collect()))
    assert_same_stream(a, b)
    assert sorted(a.obs_keys) == sorted(KEYS)
