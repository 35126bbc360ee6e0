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
