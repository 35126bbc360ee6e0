"""Dict observations from batched torch envs (Isaac Lab's observation groups): the policy gets
the dict, batches and storages get ``obs/<key>`` fields."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode

from rlstash.collect import Collector
from rlstash.envs.batched.cartpole import CartPoleVectorEnv
from rlstash.spec import Field
from rlstash.storage.ram import TensorStorage
from rlstash.storage.stream import ReadSpec, StreamStorage

KEYS = ["obs/policy", "obs/critic/sq", "obs/critic/x"]


def groups(obs: torch.Tensor) -> dict:
    """Isaac Lab style groups of a CartPole observation [N, 4], one of them nested."""
    return {"policy": obs, "critic": {"sq": obs * obs, "x": obs[:, :1] * 3}}


def flat(obs: torch.Tensor, prefix: str = "obs") -> dict[str, torch.Tensor]:
    """What the collector stores for ``groups(obs)``: the fields ``<prefix>/<key>``."""
    return {
        f"{prefix}/policy": obs,
        f"{prefix}/critic/sq": obs * obs,
        f"{prefix}/critic/x": obs[..., :1] * 3,
    }


class DictObsEnv:
    """rlstash/CartPole-v1 whose observations (and same-step final observations) are dicts."""

    def __init__(self, n: int, mode: AutoresetMode, final: str = "groups") -> None:
        self.inner = CartPoleVectorEnv(num_envs=n, autoreset_mode=mode)
        self.num_envs, self.device, self.metadata = n, self.inner.device, self.inner.metadata
        self.final = final

    def reset(self, seed=None, options=None):
        obs, info = self.inner.reset(seed=seed, options=options)
        return groups(obs), info

    def step(self, actions):
        obs, r, te, tr, info = self.inner.step(actions)
        if "final_obs" in info:
            fin = info["final_obs"]
            info = {**info, "final_obs": groups(fin) if self.final == "groups" else {"policy": fin}}
        return groups(obs), r, te, tr, info


def balance(obs):
    """Push towards the pole's lean, with noise: episodes of a few dozen steps."""
    assert isinstance(obs, dict), "the policy gets the env's dict"
    x = obs["policy"] if isinstance(obs, dict) else obs
    gen = balance.gen
    lean = (x[:, 2] > 0).long()
    return torch.where(torch.rand(x.shape[0], generator=gen) < 0.6, lean, 1 - lean)


def plain_balance(obs):
    return balance({"policy": obs})


def rollout(env, policy, n, T, batches=2):
    balance.gen = torch.Generator().manual_seed(7)
    c = Collector(env, policy, frames_per_batch=n * T, seed=3)
    return c, [c.collect() for _ in range(batches)]


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_dict_observations_become_obs_key_fields(mode):
    """The batch holds ``obs/<key>`` (nested keys joined by '/') and in same-step mode
    ``final_obs/<key>``, equal to the groups of the plain env's trajectory; ``next_obs`` is
    the env's dict (a copy)."""
    n, T = 8, 25
    c, got = rollout(DictObsEnv(n, mode), balance, n, T)
    plain_c, want = rollout(CartPoleVectorEnv(num_envs=n, autoreset_mode=mode), plain_balance, n, T)
    same = mode == AutoresetMode.SAME_STEP
    finals = [k.replace("obs", "final_obs", 1) for k in KEYS] if same else []
    assert list(got[0]) == [*KEYS, "action", "reward", "terminated", "truncated", *finals]
    for g, w in zip(got, want):
        expect = {**flat(w["obs"]), **(flat(w["final_obs"], "final_obs") if same else {})}
        for k, v in expect.items():
            assert torch.equal(g[k], v), k
        for k in ("action", "reward", "terminated", "truncated"):
            assert torch.equal(g[k], w[k]), k
    assert (got[-1]["terminated"] | got[-1]["truncated"]).any()
    nxt = c.next_obs
    assert nxt.keys() == {"policy", "critic"} and nxt["critic"].keys() == {"sq", "x"}
    assert torch.equal(nxt["policy"], plain_c.next_obs)
    assert nxt["policy"].data_ptr() != c.batched.obs["policy"].data_ptr()  # a copy
    assert list(c.stats.lengths) == list(plain_c.stats.lengths) and c.stats.count > 3


@pytest.mark.parametrize("mode", ["next_step", "same_step"])
def test_stream_storage_stores_dict_observations(mode):
    """A StreamStorage with ``obs/<key>`` fields takes the dict batches as they are: its
    transitions (n-step, frame stacks) are those of plain streams fed each group alone."""
    n, T = 6, 30
    amode = AutoresetMode.NEXT_STEP if mode == "next_step" else AutoresetMode.SAME_STEP
    _, got = rollout(DictObsEnv(n, amode), balance, n, T)
    reads = ReadSpec(n_step=2, gamma=0.9, frame_stack=2)
    shapes = {"obs/policy": (4,), "obs/critic/sq": (4,), "obs/critic/x": (1,)}
    spec = {k: Field(s, torch.float32) for k, s in shapes.items()}
    store = StreamStorage(
        {**spec, "action": Field((), torch.int64)}, n, n * 40, autoreset=mode, reads=reads
    )
    plain = {
        k: StreamStorage(
            {"obs": spec[k], "action": Field((), torch.int64)},
            n,
            n * 40,
            autoreset=mode,
            reads=reads,
        )
        for k in KEYS
    }
    for b in got:
        store.extend(b)
        for k, s in plain.items():
            one = {
                "obs": b[k],
                **{f: b[f] for f in ("action", "reward", "terminated", "truncated")},
            }
            if mode == "same_step":
                one["final_obs"] = b[k.replace("obs", "final_obs", 1)]
            s.extend(one)
    idx = np.flatnonzero(store.valid)
    assert idx.size > 50
    rec = store.read(idx)
    for k, s in plain.items():
        np.testing.assert_array_equal(s.valid, store.valid)
        want = s.read(idx)
        assert torch.equal(rec[k], want["obs"]) and rec[k].shape[1] == 2  # 2 frames
        assert torch.equal(rec["next_" + k], want["next_obs"]), k
        for f in ("action", "reward", "discount", "terminated", "truncated"):
            assert torch.equal(rec[f], want[f]), f


def test_tensor_storage_takes_the_flattened_dict_batch():
    n, T = 4, 10
    _, (b,) = rollout(DictObsEnv(n, AutoresetMode.NEXT_STEP), balance, n, T, batches=1)
    spec = {k: Field(tuple(v.shape[2:]), v.dtype) for k, v in b.items()}
    ring = TensorStorage(spec, n * T)
    ring.write(np.arange(n * T), {k: v.reshape(n * T, *v.shape[2:]) for k, v in b.items()})
    rows = ring.read(np.arange(n * T))
    for k, v in b.items():
        assert torch.equal(rows[k], v.reshape(n * T, *v.shape[2:])), k


class NumpyLeafEnv(DictObsEnv):
    def reset(self, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        obs["critic"]["x"] = obs["critic"]["x"].numpy()
        return obs, info


def test_dict_observations_are_checked_per_key():
    env = NumpyLeafEnv(4, AutoresetMode.NEXT_STEP)
    with pytest.raises(TypeError, match=r"observations\['critic/x'\]: a batched env on cpu"):
        Collector(env, balance, frames_per_batch=8).collect()
    balance.gen = torch.Generator().manual_seed(0)
    partial = DictObsEnv(4, AutoresetMode.SAME_STEP, final="policy only")
    with pytest.raises(ValueError, match=r"info\['final_obs'\]: expected the observation's fields"):
        Collector(partial, balance, frames_per_batch=8).collect()
