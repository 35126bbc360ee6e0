"""StreamStorage through the ReplayBuffer facade, fed by a real Collector.

Each sampled transition must equal what a naive (obs, next_obs) buffer would hold: the
naive reference is rebuilt here from the same collected steps.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from rlstash.collect import Collector
from rlstash.replay import ReplayBuffer
from rlstash.sampler import PrioritizedSampler, SequenceSampler, UniformSampler
from rlstash.spec import Field, Spec
from rlstash.storage import ReadSpec, StreamStorage

N = 3


def collect(mode: AutoresetMode, steps: int):
    env = SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(N)], autoreset_mode=mode)
    gen = torch.Generator().manual_seed(0)
    c = Collector(
        env,
        lambda o: torch.randint(0, 2, (o.shape[0],), generator=gen),
        frames_per_batch=N * steps,
        seed=0,
    )
    batch = c.collect()
    env.close()
    return batch


def naive_transitions(batch, same_step: bool):
    """(obs, action, reward, next_obs, terminated, truncated) per env, from a [T, N] batch."""
    T = batch["obs"].shape[0]
    out = set()
    for e in range(N):
        after_done = False
        for t in range(T - 1):
            if after_done and not same_step:
                after_done = False
                continue  # next-step mode: the reset step is no transition
            done = bool(batch["terminated"][t, e] | batch["truncated"][t, e])
            nxt = batch["final_obs"][t, e] if (same_step and done) else batch["obs"][t + 1, e]
            out.add(
                _key(
                    batch["obs"][t, e],
                    batch["action"][t, e],
                    batch["reward"][t, e],
                    nxt,
                    batch["terminated"][t, e],
                    batch["truncated"][t, e],
                )
            )
            after_done = done
    return out


def _key(obs, action, reward, next_obs, term, trunc):
    return (
        tuple(np.round(obs.numpy(), 6)),
        int(action),
        float(reward),
        tuple(np.round(next_obs.numpy(), 6)),
        bool(term),
        bool(trunc),
    )


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
@pytest.mark.parametrize("sampler", [UniformSampler, PrioritizedSampler])
def test_sampled_transitions_equal_naive_ones(mode, sampler):
    batch = collect(mode, 80)
    same = mode == AutoresetMode.SAME_STEP
    spec = Spec({"obs": Field((4,), torch.float32), "action": Field((), torch.int64)})
    storage = StreamStorage(spec, N, 3 * 200, autoreset="same_step" if same else "next_step")
    rb = ReplayBuffer(storage, sampler=sampler(), seed=0)
    rb.extend(batch)
    assert len(rb) > 0
    expected = naive_transitions(batch, same)
    got = rb.sample(512)
    for i in range(512):
        k = _key(
            got["obs"][i],
            got["action"][i],
            got["reward"][i],
            got["next_obs"][i],
            got["terminated"][i],
            got["truncated"][i],
        )
        assert k in expected
    if sampler is PrioritizedSampler:
        rb.update_priorities(got["index"], torch.rand(512) + 0.01)


def test_nstep_and_sequence_through_buffer_and_save_load(tmp_path):
    batch = collect(AutoresetMode.NEXT_STEP, 60)
    spec = Spec({"obs": Field((4,), torch.float32), "action": Field((), torch.int64)})
    storage = StreamStorage(spec, N, 3 * 100, reads=ReadSpec(n_step=3, gamma=0.5))
    rb = ReplayBuffer(storage, seed=1)
    rb.extend(batch)
    b = rb.sample(64)
    # CartPole pays 1 per step: an n-step return is 1 + 0.5 + 0.25 unless the episode ended
    full = b["discount"] == 0.125
    torch.testing.assert_close(b["reward"][full], torch.full((int(full.sum()),), 1.75))
    rb.save(tmp_path / "rb.pt")
    expected = rb.sample(16)
    again = ReplayBuffer.load(tmp_path / "rb.pt")
    got = again.sample(16)
    for k in expected:
        torch.testing.assert_close(got[k], expected[k])

    seq = ReplayBuffer(StreamStorage(spec, N, 3 * 100), sampler=SequenceSampler(4), seed=0)
    seq.extend(batch)
    w = seq.sample(8)
    assert w["obs"].shape == (8, 4, 4)
    assert not w["done"][:, :-1].any()  # windows never cross an episode end


@pytest.mark.multiproc
@pytest.mark.parametrize("mode", ["next_step", "same_step"])
def test_worker_restart_never_stitches_or_bootstraps_from_a_reset_obs(tmp_path, mode):
    """I7: a worker killed mid-episode (SIGSEGV) is restarted; the step it never finished is
    dropped, the step before it ends the episode as truncated, and no stored transition
    leads from the old episode into the fresh reset observation."""
    from rlstash.envs import ProcessPoolVectorEnv
    from rlstash.envs.testing import CrashEnv

    once = str(tmp_path / "crashed")
    fns = [lambda: CrashEnv(crash_at=5, mode="segfault", once_file=once) for _ in range(2)]
    with pytest.warns(Warning):
        with ProcessPoolVectorEnv(fns, num_workers=2, seed=0, autoreset_mode=mode) as pool:
            c = Collector(
                pool, lambda o: torch.zeros(o.shape[0], dtype=torch.int64), frames_per_batch=2 * 12
            )
            batch = c.collect()
            restarts = len(pool.restarts)
    assert restarts == 1 and batch["restarted"].sum() == 1
    spec = Spec({"obs": Field((2,), torch.float64), "action": Field((), torch.int64)})
    st = StreamStorage(spec, 2, 2 * 40, autoreset=mode)
    rb = ReplayBuffer(st, seed=0)
    rb.extend(batch)
    idx = np.flatnonzero(st.valid)
    got = st.read(idx)
    obs, nxt = got["obs"].numpy(), got["next_obs"].numpy()
    same_episode = (obs[:, 0] == nxt[:, 0]) & (nxt[:, 1] == obs[:, 1] + 1)
    assert same_episode.all(), "a transition crosses the restart"
    env = int(np.argwhere(batch["restarted"].numpy())[0][1])
    lane = (idx % 2) == env  # slot-major rows: row = position * N + lane (storage/lanes.py)
    crashed_seed = batch["obs"][0, env, 0].item()
    old = lane & (obs[:, 0] == crashed_seed)
    # the old episode: t=0..3 -> t+1 kept, the last one (t=3 -> 4) truncated; nothing from t=4
    assert sorted(obs[old, 1].tolist()) == [0.0, 1.0, 2.0, 3.0]
    assert got["truncated"][torch.from_numpy(old & (obs[:, 1] == 3))].all()
    assert (lane & (obs[:, 0] != crashed_seed)).any()  # the restarted env's new episode is stored
