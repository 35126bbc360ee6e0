"""The batched-env contract, checked at the first reset and step (issue 22, class 7; I11).

One test per class of misread env: the autoreset mode an env leaves undeclared, a device
hidden by wrappers, rewards and flags of the wrong shape or dtype, rsl_rl's step tuples (and
the adapter for them), and the spelling of the autoreset modes.
"""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv, VectorWrapper

import rlstash
from rlstash.collect import Collector
from rlstash.envs import ProcessPoolVectorEnv
from rlstash.envs.batched import ENV_IDS
from rlstash.envs.batched.cartpole import CartPoleVectorEnv
from rlstash.spec import Field
from rlstash.storage.stream import StreamStorage

N = 4
SPEC = {"obs": Field((4,), torch.float32), "action": Field((), torch.int64)}


def lean_left(obs):
    """CartPole: push left always (episodes end within ~10 steps)."""
    obs = obs["policy"] if isinstance(obs, dict) else obs
    return torch.zeros(obs.shape[0], dtype=torch.int64, device=obs.device)


class Bare:
    """A batched env with only what a Collector reads: num_envs, device, metadata (none by
    default), reset and step; ``mangle`` rewrites what reset/step return."""

    def __init__(self, inner, metadata=None, mangle=None, strip_info=False):
        self.inner, self.num_envs, self.device = inner, inner.num_envs, inner.device
        self.metadata = {} if metadata is None else metadata
        self.mangle, self.strip_info = mangle or {}, strip_info

    def reset(self, seed=None, options=None):
        obs, info = self.inner.reset(seed=seed)
        return self.mangle.get("reset_obs", lambda o: o)(obs), info

    def step(self, actions):
        out = list(self.inner.step(actions))
        for i, key in enumerate(("obs", "reward", "terminated", "truncated")):
            out[i] = self.mangle.get(key, lambda x: x)(out[i])
        if self.strip_info:
            out[4] = {}
        return tuple(out)


def collect_all(c, batches):
    got = [c.collect() for _ in range(batches)]
    return {k: torch.cat([b[k] for b in got]) for k in got[0]}


# ------------------------------------------------------------------ 1. one default mode
def test_one_default_autoreset_mode_on_every_path_gymnasiums():
    """An env that says nothing is read as gymnasium's default (NextStep) on the batched path
    as on the host path; a next-step env there works; one that shows it is same-step is
    refused with the declaration to add, nothing stored."""
    for env_id in ENV_IDS:  # rlstash's own batched envs declare their mode
        env = gym.make_vec(env_id, num_envs=2, vectorization_mode="vector_entry_point")
        assert isinstance(env.metadata["autoreset_mode"], AutoresetMode), env_id
    sync = SyncVectorEnv([lambda: gym.make("CartPole-v1")] * N)
    del sync.metadata["autoreset_mode"]
    host = Collector(sync, lean_left, frames_per_batch=N * 8, seed=0)
    bare = Collector(Bare(CartPoleVectorEnv(num_envs=N)), lean_left, N * 40, seed=0)
    declared = Collector(CartPoleVectorEnv(num_envs=N), lean_left, N * 40, seed=0)
    assert host.batched is None and bare.batched is not None
    assert host.same_step is bare.same_step is declared.same_step is False
    got, want = collect_all(bare, 3), collect_all(declared, 3)
    assert set(got) == set(want) and "final_obs" not in got
    for k in want:
        torch.testing.assert_close(got[k], want[k], msg=k)
    assert bare.stats.count == declared.stats.count > 3 * N
    assert list(bare.stats.lengths) == list(declared.stats.lengths)

    same = CartPoleVectorEnv(num_envs=N, autoreset_mode=AutoresetMode.SAME_STEP)
    with pytest.raises(ValueError, match=r"info has 'final_obs'.*read as gymnasium's default"):
        Collector(Bare(same), lean_left, N * 40, seed=0).collect()
    isaac_like = Bare(same, strip_info=True)  # resets within step, reports no final obs
    store = StreamStorage(SPEC, N, N * 200)
    c = Collector(isaac_like, lean_left, N * 40, seed=0)
    with pytest.raises(ValueError, match=r"no reset step.*declare it: env.metadata"):
        c.collect_into(store)
    assert store.size == 0 and not store.valid.any()  # refused before anything was stored


# ------------------------------------------------------------------ 2. device through wrappers
class Groups(VectorWrapper):
    """A plain gymnasium VectorWrapper (nothing forwarded): observation groups."""

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return {"policy": obs, "critic": obs * 2}, info

    def step(self, actions):
        obs, *rest = self.env.step(actions)
        return {"policy": obs, "critic": obs * 2}, *rest


class ToHost(VectorWrapper):
    """Returns host arrays from a torch env (without saying so)."""

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return obs.numpy(), info

    def step(self, actions):
        out = self.env.step(torch.as_tensor(actions))
        return (*(x.numpy() for x in out[:4]), out[4])


def test_device_is_found_through_wrappers():
    """gymnasium's VectorWrappers hide ``device``: it is found through them (dict observations
    stay tensors on the batched path); a wrapper that returns host arrays is named with the
    fix; dicts that cannot go to the host are refused naming their fields."""
    env = VectorWrapper(Groups(CartPoleVectorEnv(num_envs=N)))
    c = Collector(env, lean_left, frames_per_batch=N * 30, seed=0)
    assert c.batched is not None and c.device == torch.device("cpu")
    b = c.collect()
    assert {"obs/policy", "obs/critic"} <= set(b)
    torch.testing.assert_close(b["obs/critic"], 2 * b["obs/policy"])
    ref = Collector(CartPoleVectorEnv(num_envs=N), lean_left, N * 30, seed=0).collect()
    torch.testing.assert_close(b["obs/policy"], ref["obs"])
    assert c.stats.count > 0

    hidden = ToHost(CartPoleVectorEnv(num_envs=N))
    with pytest.raises(TypeError, match=r"device of the env inside ToHost; make ToHost return"):
        Collector(hidden, lean_left, N).collect()
    hidden.device = None  # says: my outputs are host arrays
    assert Collector(hidden, lean_left, N * 2, seed=0).collect()["obs"].shape == (2, N, 4)

    sync = Groups(SyncVectorEnv([lambda: gym.make("CartPole-v1")] * N))
    with pytest.raises(TypeError, match=r"observations: got a dict \{'policy': a float32 arr"):
        Collector(sync, lean_left, N).collect()

    from rlstash.collect.env_contract import find_device

    assert find_device(env) == (torch.device("cpu"), ("VectorWrapper", "Groups"))

    class ArrayConversion:  # gymnasium's NumpyToTorch/JaxToNumpy: their target decides
        def __init__(self, xp, target=None):
            self._target_xp, self._target_device, self.env = xp, target, CartPoleVectorEnv(2)

    assert find_device(ArrayConversion(torch, "cpu"))[0] == torch.device("cpu")
    assert find_device(ArrayConversion(np))[0] is None


# ------------------------------------------------------------------ 3. shapes and dtypes
BAD = {
    "reward [N, 1]": (
        {"reward": lambda r: r[:, None]},
        ValueError,
        r"reward: expected a real-valued tensor of shape \[4\] on cpu, got a torch.float32 "
        r"tensor \[4, 1\] on cpu; squeeze it to \[4\] in the env \(reward.squeeze\(-1\)\)",
    ),
    "terminated int64": (
        {"terminated": lambda x: x.long()},
        ValueError,
        r"terminated: expected a bool tensor of shape \[4\] on cpu, got a torch.int64 tensor "
        r"\[4\] on cpu; return bool flags",
    ),
    "truncated [N + 1]": (
        {"truncated": lambda x: torch.cat([x, x[:1]])},
        ValueError,
        r"truncated: expected a bool tensor of shape \[4\].*got a torch.bool tensor \[5\]",
    ),
    "reward on the host": (
        {"reward": lambda r: r.numpy()},
        ValueError,
        r"reward: expected .* on cpu, got a float32 array \[4\]; return a torch tensor on cpu",
    ),
    "float flags": (
        {"terminated": lambda x: x.float(), "truncated": lambda x: x.float()},
        ValueError,  # a gymnasium env with float flags, not taken for rsl_rl's tuple
        r"terminated: expected a bool tensor .*got a torch.float32 tensor \[4\].*\(.bool\(\)\)",
    ),
    "reward bool": (
        {"reward": lambda r: r > 0},
        ValueError,
        r"reward: expected a real-valued tensor .*got a torch.bool tensor \[4\]",
    ),
    "obs [N - 1] at reset": (
        {"reset_obs": lambda o: o[:-1]},
        ValueError,
        r"observations: expected \[4, \.\.\.\] \(one row per env: num_envs = 4\), got a "
        r"torch.float32 tensor \[3, 4\]",
    ),
    "obs [N - 1] at step": (
        {"obs": lambda o: o[:-1]},
        ValueError,
        r"observations: expected \[4, \.\.\.\].*\[3, 4\]",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_reward_and_flag_shapes_and_dtypes_are_checked_before_anything_is_stored(case):
    mangle, error, message = BAD[case]
    declared = {"autoreset_mode": AutoresetMode.NEXT_STEP}
    env = Bare(CartPoleVectorEnv(num_envs=N), declared, mangle)
    store = StreamStorage(SPEC, N, N * 100)
    with pytest.raises(error, match=message):
        Collector(env, lean_left, frames_per_batch=N * 5, seed=0).collect_into(store)
    assert store.size == 0
    with pytest.raises(error, match=message):
        Collector(env, lean_left, frames_per_batch=N * 5, seed=0).collect()


def test_host_path_rewards_are_checked_too():
    class Column(gym.vector.VectorWrapper):
        def step(self, actions):
            obs, r, *rest = self.env.step(actions)
            return obs, r[:, None], *rest

    env = Column(SyncVectorEnv([lambda: gym.make("CartPole-v1")] * N))
    with pytest.raises(ValueError, match=r"reward: expected a real-valued array of shape \[4\]"):
        Collector(env, lean_left, N * 3, seed=0).collect()


# ------------------------------------------------------------------ 4. rsl_rl's step tuples
class FakeRslRl:
    """rsl_rl's VecEnv as legged_gym implements it (``style=1``: step returns (obs,
    privileged_obs, rew, reset_buf, extras), bool flags) or Isaac Lab's RslRlVecEnvWrapper /
    Genesis (``style=2``: (obs, rew, dones, extras), int dones, float time_outs; ``style=3``:
    the same with observation groups, rsl_rl 3's TensorDict, as a dict). Env i's
    episodes last ``period[i]`` steps: the first two fall (terminated), the others time out
    at ``max_episode_length``; ended envs reset inside step. obs = (step in episode, i)."""

    def __init__(self, style, privileged=True, num_envs=6, device="cpu"):
        self.style, self.privileged = style, privileged
        self.num_envs, self.num_actions, self.device = num_envs, 2, torch.device(device)
        self.max_episode_length = 7
        self.fall_at = torch.tensor([3, 5] + [99] * (num_envs - 2), device=self.device)
        self.episode_length_buf = torch.zeros(num_envs, dtype=torch.int64, device=self.device)

    @property
    def period(self):
        """[num_envs] (on the host) episode lengths."""
        return self.fall_at.cpu().clamp(max=self.max_episode_length)

    def _obs(self):
        index = torch.arange(self.num_envs, device=self.device) * 1.0
        return torch.stack([self.episode_length_buf.float(), index], 1)

    def get_observations(self):
        if self.style == 1:
            return self._obs()
        if self.style == 3:
            return {"policy": self._obs(), "critic": self._obs() * 10}
        return self._obs(), {"observations": {"critic": self._obs() * 10}}

    def get_privileged_observations(self):
        return self._obs() * 10 if self.privileged else None

    def reset(self):
        self.episode_length_buf[:] = 0
        return self._obs(), self.get_privileged_observations()

    def step(self, actions):
        assert actions.shape == (self.num_envs, 2) and actions.device.type == self.device.type
        self.episode_length_buf += 1
        rew = self.episode_length_buf * 0.5  # float, never 0
        fell = self.episode_length_buf >= self.fall_at
        time_outs = self.episode_length_buf >= self.max_episode_length
        dones = fell | time_outs
        self.episode_length_buf[dones] = 0  # reset inside step: the new episode's obs
        obs = self._obs()
        if self.style == 1:
            extras = {"time_outs": time_outs}
            return obs, self.get_privileged_observations(), rew, dones, extras
        extras = {"time_outs": time_outs.float(), "observations": {"critic": obs * 10}}
        if self.style == 3:
            obs, extras = self.get_observations(), {"time_outs": time_outs}
        return obs, rew, dones.long(), extras


class Stepper:
    """Only the step/reset side of an rsl_rl env (no get_observations to recognise it by)."""

    def __init__(self, inner):
        self.inner, self.num_envs, self.device = inner, inner.num_envs, inner.device

    def reset(self, seed=None):
        return self.inner.reset()[0], {}

    def step(self, actions):
        return self.inner.step(actions)


def zeros2(obs):
    obs = obs["policy"] if isinstance(obs, dict) else obs
    return torch.zeros(obs.shape[0], 2, device=obs.device)


@pytest.mark.parametrize("style,privileged", [(1, True), (1, False), (2, True)])
def test_rsl_rl_step_tuples_are_refused_with_the_fix(style, privileged):
    env = FakeRslRl(style, privileged)
    with pytest.raises(TypeError, match=r"FakeRslRl has get_observations.*from_rsl_rl\(env\)"):
        Collector(env, zeros2, frames_per_batch=6 * 4)
    c = Collector(Stepper(env), zeros2, frames_per_batch=6 * 4, seed=None)
    with pytest.raises(TypeError, match=r"rsl_rl's VecEnv.*rlstash.envs.from_rsl_rl\(env\)"):
        c.collect()


@pytest.mark.parametrize("style,critic", [(1, False), (2, False), (1, True), (2, True), (3, False)])
def test_from_rsl_rl_collects_into_a_stream_with_exact_episode_counts(style, critic):
    """rsl_rl's same-step resets become gymnasium's SameStep with the documented stand-in
    final observation (the one the last step started from); terminated = dones & ~time_outs,
    truncated = time_outs; counts exact through the Collector and a StreamStorage."""
    raw = FakeRslRl(style)
    env = rlstash.from_rsl_rl(raw, critic=critic)
    assert rlstash.envs.from_rsl_rl is rlstash.from_rsl_rl
    assert env.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    assert env.device == raw.device and env.num_envs == 6
    T, n = 30, 6
    c = Collector(env, zeros2, frames_per_batch=n * T)
    assert c.batched is not None and c.same_step
    batch = c.collect()
    keys = ["obs/policy", "obs/critic"] if critic or style == 3 else ["obs"]
    spec = {k: Field((2,), torch.float32) for k in keys} | {"action": Field((2,), torch.float32)}
    store = StreamStorage(spec, n, n * 64, autoreset=AutoresetMode.SAME_STEP)
    store.extend(batch)

    period = raw.period  # [n] episode lengths
    ends = T // period  # episodes ended per env in T steps
    fell = raw.fall_at.cpu() <= raw.max_episode_length
    assert c.stats.count == int(ends.sum())
    assert sorted(c.stats.lengths) == sorted(int(p) for p, k in zip(period, ends) for _ in range(k))
    assert torch.equal(batch["terminated"].sum(0), torch.where(fell, ends, 0))
    assert torch.equal(batch["truncated"].sum(0), torch.where(fell, 0, ends))
    got = store.read(np.flatnonzero(store.valid))
    assert int(got["terminated"].sum()) == int(ends[fell].sum())
    assert int(got["truncated"].sum()) == int(ends[~fell].sum())
    first = keys[0]
    ended = got["terminated"] | got["truncated"]
    # the stand-in: an episode's last transition bootstraps from the obs it started from
    torch.testing.assert_close(got["next_" + first][ended], got[first][ended])
    assert (got[first][ended][:, 0] == period[got[first][ended][:, 1].long()] - 1).all()
    if len(keys) == 2:
        torch.testing.assert_close(got["obs/critic"], got["obs/policy"] * 10)


# ------------------------------------------------------------------ 5. one spelling
def test_one_spelling_of_autoreset_modes_gymnasiums():
    """gymnasium's AutoresetMode and its values everywhere; the old spelling warns."""
    spec = SPEC
    for mode in (AutoresetMode.SAME_STEP, "SameStep"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            store = StreamStorage(spec, N, N * 10, autoreset=mode)
        assert store.autoreset == AutoresetMode.SAME_STEP
    with pytest.warns(DeprecationWarning, match=r"autoreset='same_step'.*AutoresetMode.SAME_ST"):
        assert StreamStorage(spec, N, N * 10, autoreset="same_step").autoreset.value == "SameStep"
    with pytest.raises(ValueError, match=r"autoreset: expected one of AutoresetMode.NEXT_STEP"):
        StreamStorage(spec, N, N * 10, autoreset="same-step")
    with pytest.warns(DeprecationWarning, match="autoreset_mode='same_step'"):
        env = CartPoleVectorEnv(num_envs=2, autoreset_mode="same_step")
    assert env.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    with pytest.warns(DeprecationWarning, match="autoreset_mode='next_step'"):
        ProcessPoolVectorEnv("CartPole-v1", 2, num_workers=0, autoreset_mode="next_step").close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with ProcessPoolVectorEnv("CartPole-v1", 2, num_workers=0) as pool:  # the default
            assert pool.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP


def test_a_saved_stream_reopens_without_the_old_spelling_warning(tmp_path):
    store = StreamStorage(SPEC, N, N * 10, "disk", path=tmp_path / "s", autoreset="SameStep")
    c = Collector(CartPoleVectorEnv(N, autoreset_mode="SameStep"), lean_left, N * 20, seed=0)
    store.extend(c.collect())
    size = store.size
    store.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = StreamStorage(
            SPEC, N, N * 10, "disk", path=tmp_path / "s", autoreset=AutoresetMode.SAME_STEP
        )
        assert again.size == size > 0
        again.close()


# ------------------------------------------------------------------ on a GPU
@pytest.mark.gpu  # runs where CUDA exists (conftest: no tripwire there, skipped elsewhere)
def test_on_cuda_the_contract_holds_and_tensors_stay_on_the_device():
    env = VectorWrapper(Groups(CartPoleVectorEnv(num_envs=N, device="cuda")))
    c = Collector(env, lean_left, frames_per_batch=N * 30, seed=0)
    assert c.device.type == "cuda"
    assert c.collect()["obs/critic"].device.type == "cuda" and c.stats.count > 0
    raw = FakeRslRl(2, device="cuda")
    c = Collector(rlstash.from_rsl_rl(raw), zeros2, frames_per_batch=6 * 30)
    b = c.collect()
    assert b["terminated"].device.type == "cuda" and b["final_obs"].device.type == "cuda"
    assert c.stats.count == int((30 // raw.period).sum())
    declared = {"autoreset_mode": AutoresetMode.NEXT_STEP}
    bad = Bare(CartPoleVectorEnv(num_envs=N, device="cuda"), declared, BAD["reward [N, 1]"][0])
    with pytest.raises(ValueError, match=r"reward: expected .* on cuda:0, got .*\[4, 1\]"):
        Collector(bad, lean_left, N * 5, seed=0).collect()
    same = CartPoleVectorEnv(num_envs=N, device="cuda", autoreset_mode="SameStep")
    with pytest.raises(ValueError, match=r"no reset step.*declare it"):
        Collector(Bare(same, strip_info=True), lean_left, N * 40, seed=0).collect()
