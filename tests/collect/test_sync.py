"""Collector on gymnasium's SyncVectorEnv (the ProcessPoolVectorEnv has its own tests) and on
batched torch envs (rlstash/CartPole-v1 and fakes of the CUDA path)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from rlstash.collect import Collector
from rlstash.collect import batched as batched_mod
from rlstash.envs.batched.cartpole import CartPoleVectorEnv
from rlstash.spec import Field
from rlstash.storage.stream import ReadSpec, StreamStorage


def make_env(mode=AutoresetMode.NEXT_STEP, n=4):
    return SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(n)], autoreset_mode=mode)


def zeros_policy(obs: torch.Tensor) -> torch.Tensor:
    return torch.zeros(obs.shape[0], dtype=torch.int64)


def test_batches_are_time_major_and_complete():
    env = make_env()
    c = Collector(env, zeros_policy, frames_per_batch=64, seed=0)
    b = c.collect()
    assert b["obs"].shape == (16, 4, 4) and b["obs"].dtype == torch.float32
    assert b["action"].shape == (16, 4) and b["action"].dtype == torch.int64
    for k in ("reward", "terminated", "truncated"):
        assert b[k].shape == (16, 4)
    assert "final_obs" not in b
    assert c.frames == 64
    env.close()


def test_next_step_autoreset_rows_follow_the_env():
    """Always pushing left ends CartPole episodes in ~10 steps: the row after a done is the
    reset step (reward 0, action ignored) and the next row starts a fresh episode."""
    env = make_env(n=2)
    c = Collector(env, zeros_policy, frames_per_batch=80, seed=1)
    b = c.collect()
    done = (b["terminated"] | b["truncated"]).numpy()
    t, i = np.argwhere(done)[0]
    assert b["reward"][t + 1, i] == 0.0  # reset step
    assert not done[t + 1, i]
    assert c.stats.count >= 2
    assert all(8 <= length <= 20 for length in c.stats.lengths)
    assert c.stats.returns[0] == c.stats.lengths[0]  # CartPole: reward 1 per step
    env.close()


def test_same_step_mode_gives_final_obs():
    env = make_env(AutoresetMode.SAME_STEP, n=2)
    c = Collector(env, zeros_policy, frames_per_batch=80, seed=1)
    b = c.collect()
    done = (b["terminated"] | b["truncated"]).numpy()
    t, i = np.argwhere(done)[0]
    final = b["final_obs"][t, i]
    assert final.abs().sum() > 0
    assert not torch.equal(final, b["obs"][t + 1, i])  # the next row is the reset obs
    assert torch.all(b["final_obs"][~torch.from_numpy(done)] == 0)
    env.close()


def test_rollout_counts_episodes_per_env():
    env = make_env(n=3)
    c = Collector(env, zeros_policy, frames_per_batch=30, seed=0)
    out = c.rollout(episodes=7, seed=3)
    assert out["returns"].shape == (7,) and out["lengths"].shape == (7,)
    np.testing.assert_array_equal(out["returns"], out["lengths"])
    env.close()


def test_rollout_uses_agent_act_deterministic():
    class Agent:
        def __init__(self):
            self.flags = []

        def act(self, obs, deterministic=False):
            self.flags.append(deterministic)
            return torch.ones(obs.shape[0], dtype=torch.int64)

    env = make_env(n=2)
    agent = Agent()
    c = Collector(env, zeros_policy, frames_per_batch=2)
    c.rollout(agent, episodes=2)
    assert agent.flags and all(agent.flags)
    env.close()


@pytest.mark.parametrize("fpb", [3, 6, "8"])
def test_bad_frames_per_batch(fpb):
    env = make_env(n=4)
    with pytest.raises(ValueError, match="frames_per_batch"):
        Collector(env, zeros_policy, frames_per_batch=fpb)
    env.close()


def test_bad_policy():
    env = make_env(n=2)
    with pytest.raises(TypeError, match="policy"):
        Collector(env, "greedy", frames_per_batch=2)  # type: ignore[arg-type]
    env.close()


# ---------------------------------------------------------------------------------------
# Batched torch envs (rlstash/CartPole-v1 and fakes): tensors stay on the env's device
# ---------------------------------------------------------------------------------------


def balance(obs: torch.Tensor) -> torch.Tensor:
    return (obs[:, 2] + 0.3 * obs[:, 3] > 0).long()


def manual_rollout(mode, n, steps, seed):
    """The same env driven by hand: what the collector's batch must hold."""
    env = CartPoleVectorEnv(num_envs=n, autoreset_mode=mode)
    gen = torch.Generator().manual_seed(1)
    obs, _ = env.reset(seed=seed)
    rows = {k: [] for k in ("obs", "action", "reward", "terminated", "truncated", "final_obs")}
    for _ in range(steps):
        act = torch.where(torch.rand(n, generator=gen) < 0.5, balance(obs), 1 - balance(obs))
        nxt, r, te, tr, info = env.step(act)
        for k, v in zip(
            ("obs", "action", "reward", "terminated", "truncated"), (obs, act, r, te, tr)
        ):
            rows[k].append(v)
        if "final_obs" in info:
            rows["final_obs"].append(torch.where(info["_final_obs"][:, None], info["final_obs"], 0))
        obs = nxt
    return {k: torch.stack(v) for k, v in rows.items() if v}


def noisy_balance(n):
    gen = torch.Generator().manual_seed(1)

    def policy(obs):
        return torch.where(torch.rand(n, generator=gen) < 0.5, balance(obs), 1 - balance(obs))

    return policy


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_batched_env_batches_equal_a_manual_rollout(mode):
    """Under the CUDA tripwire (CPU path): the batch is exactly the env's own trajectory, and
    the episode statistics are those of a manual count."""
    n, T = 16, 40
    env = CartPoleVectorEnv(num_envs=n, autoreset_mode=mode)
    c = Collector(env, noisy_balance(n), frames_per_batch=n * T, seed=3)
    assert c.batched is not None and c.device == torch.device("cpu")
    got = [c.collect() for _ in range(3)]
    want = manual_rollout(mode, n, 3 * T, seed=3)
    for k, v in want.items():
        assert torch.equal(torch.cat([g[k] for g in got]), v), k
    assert ("final_obs" in got[0]) == (mode == AutoresetMode.SAME_STEP)
    # episode statistics: the lengths of the episodes that ended in these steps
    done = (want["terminated"] | want["truncated"]).numpy()
    live = np.ones(n, bool)
    length, lengths = np.zeros(n, int), []
    for t in range(3 * T):
        length += live
        for i in np.flatnonzero(done[t] & live):
            lengths.append(int(length[i]))
            length[i] = 0
        live = ~(done[t] & live) if mode == AutoresetMode.NEXT_STEP else np.ones(n, bool)
    assert c.stats.count == len(lengths) > 5
    assert list(c.stats.lengths) == lengths[-100:]
    assert list(c.stats.returns) == [float(x) for x in lengths[-100:]]  # reward 1 per step
    assert c.frames == 3 * n * T


@pytest.mark.parametrize("mode", ["next_step", "same_step"])
@pytest.mark.parametrize(
    "reads", [ReadSpec(n_step=1), ReadSpec(n_step=3, gamma=0.9, frame_stack=2)]
)
def test_stream_storage_takes_batched_batches_as_they_are(mode, reads):
    """Batches from the device go into a StreamStorage on the same device unchanged, and the
    transitions it rebuilds (n-step returns, frame stacks) equal a naive rebuild."""
    n, T = 8, 30
    amode = AutoresetMode.NEXT_STEP if mode == "next_step" else AutoresetMode.SAME_STEP
    env = CartPoleVectorEnv(num_envs=n, autoreset_mode=amode)
    c = Collector(env, noisy_balance(n), frames_per_batch=n * T, seed=0)
    spec = {"obs": Field((4,), torch.float32), "action": Field((), torch.int64)}
    store = StreamStorage(spec, n, capacity=n * 200, autoreset=mode, reads=reads)
    batches = [c.collect() for _ in range(2)]
    for b in batches:
        store.extend(b)
    starts = np.flatnonzero(store.valid)
    got = store.read(starts)
    ref = naive_transitions(batches, mode, reads)
    assert len(starts) == len(ref) > 50
    for j, s in enumerate(starts):
        slot, e = divmod(int(s), n)  # slot-major rows: position * N + env
        want = ref[(e, slot)]
        for k in ("obs", "next_obs", "action", "reward", "terminated", "truncated", "discount"):
            torch.testing.assert_close(got[k][j], want[k], msg=k)


def _stack(slots, idx, k):
    """Frames of slot ``idx``: an episode's slots end with its final-obs slot (no step);
    frames before its first slot repeat the first."""
    first = max([j + 1 for j in range(idx) if slots[j][1] is None], default=0)
    fr = [slots[max(idx - b, first)][0] for b in range(k - 1, -1, -1)]
    return torch.stack(fr) if k > 1 else fr[0]


def naive_transitions(batches, mode, reads):
    """(env, slot) -> transition, from the time-major batches with plain Python loops."""
    obs = torch.cat([b["obs"] for b in batches])
    T, n = obs.shape[:2]
    cat = {k: torch.cat([b[k] for b in batches]) for k in batches[0]}
    out = {}
    for e in range(n):
        slots = []  # per slot: obs, then step fields or None for a final-obs slot
        skip = False
        for t in range(T):
            if skip:  # next-step: this row's obs is the previous episode's final obs
                slots.append((cat["obs"][t, e], None))
                skip = False
                continue
            d = bool(cat["terminated"][t, e] | cat["truncated"][t, e])
            slots.append((cat["obs"][t, e], t))
            if d and mode == "same_step":
                slots.append((cat["final_obs"][t, e], None))
            skip = d and mode == "next_step"
        for i, (_, t) in enumerate(slots):
            if t is None:
                continue
            m, ret, end_t = 0, 0.0, t
            while m < reads.n_step and i + m < len(slots):
                tt = slots[i + m][1]
                if tt is None:
                    break
                ret += reads.gamma**m * float(cat["reward"][tt, e])
                end_t = tt
                m += 1
                if bool(cat["terminated"][tt, e] | cat["truncated"][tt, e]):
                    break
            if i + m >= len(slots):
                continue  # bootstrap slot not written yet: not a valid start
            k = reads.frame_stack

            out[(e, i)] = {
                "obs": _stack(slots, i, k),
                "next_obs": _stack(slots, i + m, k),
                "action": cat["action"][t, e],
                "reward": torch.tensor(ret, dtype=torch.float32),
                "terminated": cat["terminated"][end_t, e],
                "truncated": cat["truncated"][end_t, e],
                "discount": torch.tensor(reads.gamma**m, dtype=torch.float32),
            }
    return out


class FakeStream:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def wait_stream(self, other):
        self.log.append(f"{self.name}.wait_stream({other.name})")

    def wait_event(self, event):
        self.log.append(f"{self.name}.wait_event")


class FakeEvent:
    def __init__(self, log):
        self.log = log

    def record(self, stream):
        self.log.append(f"event.record({stream.name})")

    def synchronize(self):
        self.log.append("event.synchronize")


class Pinned(torch.Tensor):
    """A host buffer that logs the copy into it and the host's reads of it."""

    log: list = []

    def copy_(self, src, non_blocking=False):
        Pinned.log.append(f"d2h(non_blocking={non_blocking})")
        return super().copy_(src)

    def numpy(self, *args, **kwargs):
        Pinned.log.append("host read")
        return torch.Tensor.numpy(self.as_subclass(torch.Tensor), *args, **kwargs)


class FakeCuda:
    """Stands in for rlstash.device.CudaOps: logs every stream/event/pinned operation."""

    def __init__(self, log):
        self.log = log
        self.stream = FakeStream("caller", log)
        self.active = "caller"

    def current_stream(self, device):
        return self.stream if self.active == "caller" else self.side

    def new_stream(self, device):
        self.log.append("new_stream")
        self.side = FakeStream("side", self.log)
        return self.side

    def use_stream(self, stream):
        import contextlib

        @contextlib.contextmanager
        def ctx():
            self.active, before = stream.name, self.active
            self.log.append(f"use_stream({stream.name})")
            yield
            self.active = before

        return ctx()

    def new_event(self):
        return FakeEvent(self.log)

    def empty_pinned(self, shape, dtype):
        self.log.append("empty_pinned")
        return torch.empty(shape, dtype=dtype).as_subclass(Pinned)

    def record_stream(self, t, stream):
        self.log.append(f"record_stream({stream.name})")


class LoggedEnv:
    """A batched env that logs its steps (delegates to rlstash/CartPole-v1)."""

    def __init__(self, log, n=4):
        self.inner = CartPoleVectorEnv(num_envs=n)
        self.log, self.num_envs, self.device = log, n, self.inner.device
        self.metadata = self.inner.metadata

    def reset(self, seed=None):
        return self.inner.reset(seed=seed)

    def step(self, actions):
        self.log.append("env.step")
        return self.inner.step(actions)


def logged_policy(log, cuda):
    def policy(obs):
        log.append(f"policy on {cuda.active}")
        return torch.zeros(obs.shape[0], dtype=torch.int64)

    return policy


@pytest.fixture
def fake_cuda(monkeypatch):
    """The CUDA path, with CUDA replaced by fakes; the tripwire stays on, so any real
    torch.cuda call (synchronize, streams, events, pinning) fails the test."""
    log: list = []
    cuda = FakeCuda(log)
    Pinned.log = log
    monkeypatch.setattr(batched_mod, "cuda_ops_for", lambda device: cuda)
    return log, cuda


def test_cuda_path_stays_on_the_callers_stream_and_reads_the_host_after_the_event(fake_cuda):
    log, cuda = fake_cuda
    c = Collector(LoggedEnv(log), logged_policy(log, cuda), frames_per_batch=4 * 30, seed=0)
    c.collect()
    assert "new_stream" not in log and not any(e.startswith("use_stream") for e in log)
    assert all(e == "policy on caller" for e in log if e.startswith("policy"))
    assert "event.synchronize" not in log and "host read" not in log  # nothing read yet
    tail = log[log.index("empty_pinned") :]
    assert tail == ["empty_pinned", "d2h(non_blocking=True)"] * 3 + ["event.record(caller)"]
    log.clear()
    assert c.stats.count > 0  # always-left CartPole ends episodes within 30 steps
    assert log[0] == "event.synchronize" and log.count("host read") == 3
    log.clear()
    c.stats  # noqa: B018 - nothing pending: no second wait
    assert log == []


def test_dedicated_stream_orders_policy_before_the_env_step(fake_cuda):
    log, cuda = fake_cuda
    c = Collector(
        LoggedEnv(log),
        logged_policy(log, cuda),
        frames_per_batch=4 * 2,
        cuda_stream="dedicated",
        seed=0,
    )
    c.collect()
    step = log[log.index("new_stream") + 1 :]
    first = step[: step.index("env.step") + 1]
    assert first == [
        "side.wait_stream(caller)",  # the policy sees the env's observations
        "use_stream(side)",
        "policy on side",
        "caller.wait_stream(side)",  # the env steps only after the actions exist
        "record_stream(side)",
        "record_stream(caller)",
        "env.step",
    ]
    assert log.count("new_stream") == 1


def test_policy_must_return_actions_on_the_env_device():
    env = CartPoleVectorEnv(num_envs=4)
    c = Collector(env, lambda obs: np.zeros(4, np.int64), frames_per_batch=4)
    with pytest.raises(ValueError, match="policy: expected actions as a tensor on cpu"):
        c.collect()
    meta = Collector(env, lambda o: torch.zeros(4, dtype=torch.int64, device="meta"), 4)
    with pytest.raises(ValueError, match="got meta"):
        meta.collect()


def test_collector_device_must_be_the_env_device():
    env = CartPoleVectorEnv(num_envs=4)
    with pytest.raises(ValueError, match="the env steps on cpu"):
        Collector(env, balance, frames_per_batch=4, device="meta")
    assert Collector(env, balance, frames_per_batch=4, device="cpu").device.type == "cpu"


class NumpyObsEnv(LoggedEnv):
    def reset(self, seed=None):
        obs, info = self.inner.reset(seed=seed)
        return obs.numpy(), info


class NoFinalObsEnv(LoggedEnv):
    """Same-step autoreset without reporting the final observation (as Isaac Lab does)."""

    def __init__(self, log, metadata=None):
        super().__init__(log)
        self.inner = CartPoleVectorEnv(num_envs=4, autoreset_mode=AutoresetMode.SAME_STEP)
        self.metadata = {} if metadata is None else metadata

    def step(self, actions):
        obs, r, te, tr, info = self.inner.step(actions)
        return obs, r, te, tr, {}


def test_batched_env_must_return_tensors_on_its_device():
    with pytest.raises(TypeError, match="observations: a batched env on cpu must return torch"):
        Collector(NumpyObsEnv([]), balance, frames_per_batch=4).collect()


def test_same_step_env_without_final_obs_is_refused_when_an_episode_ends():
    declared = {"autoreset_mode": AutoresetMode.SAME_STEP}
    c = Collector(NoFinalObsEnv([], declared), zeros_policy, frames_per_batch=4 * 3, seed=0)
    assert c.same_step
    c.collect()  # no episode ended yet: nothing is lost
    with pytest.raises(ValueError, match="no 'final_obs'"):
        for _ in range(10):
            c.collect()
    # saying nothing, it is read as gymnasium's default (NextStep) and its first episode end
    # shows it is not: refused with the declaration to add (tests/faults/test_batched_contract)
    c = Collector(NoFinalObsEnv([]), zeros_policy, frames_per_batch=4 * 3, seed=0)
    assert not c.same_step
    with pytest.raises(ValueError, match=r"declare it: env.metadata\['autoreset_mode'\]"):
        for _ in range(10):
            c.collect()


def test_rollout_on_a_batched_env():
    env = CartPoleVectorEnv(num_envs=3)
    c = Collector(env, zeros_policy, frames_per_batch=3, seed=0)
    out = c.rollout(episodes=5, seed=1)
    assert out["returns"].shape == (5,)
    np.testing.assert_array_equal(out["returns"], out["lengths"])
    assert (out["lengths"] > 5).all() and (out["lengths"] < 30).all()


@pytest.mark.gpu  # runs where CUDA exists (conftest: no tripwire there, skipped elsewhere)
def test_gpu_batched_collection_on_a_side_stream_without_synchronize(monkeypatch):
    """Real CUDA: batches stay on the GPU, work runs on the caller's (non-default) stream,
    torch.cuda.synchronize is never called, and the logged statistics are right."""

    def no_sync(*args, **kwargs):
        raise AssertionError("torch.cuda.synchronize was called")

    n, T = 1024, 64
    env = CartPoleVectorEnv(num_envs=n, device="cuda")
    c = Collector(env, lambda o: (o[:, 2] > 0).long(), frames_per_batch=n * T, seed=0)
    mine = torch.cuda.Stream()
    monkeypatch.setattr(torch.cuda, "synchronize", no_sync)
    with torch.cuda.stream(mine):
        batch = c.collect()
        batch2 = c.collect()
    assert all(v.device.type == "cuda" for v in batch.values())
    mine.synchronize()
    ends = [(b["terminated"] | b["truncated"]).sum() for b in (batch, batch2)]
    done = ends[0] + ends[1]  # episodes that ended in either batch (a sum: an env may end in both)
    assert c.stats.count == int(done.sum().item())
    ref = CartPoleVectorEnv(num_envs=n)  # the CPU env from the same seeds: same episodes
    cpu = Collector(ref, lambda o: (o[:, 2] > 0).long(), frames_per_batch=n * T, seed=0)
    b_cpu = cpu.collect()
    torch.testing.assert_close(batch["obs"][:10].cpu(), b_cpu["obs"][:10], atol=1e-4, rtol=0)


@pytest.mark.parametrize("next_step", [True, False])
def test_episode_ends_on_device_equals_a_python_count(next_step):
    """The whole-batch episode accounting (numpy on the CPU, torch on accelerators) equals
    a step-by-step count, across batches (carry) and in both autoreset modes."""
    rng = np.random.default_rng(0)
    n = 7
    logs = {
        name: batched_mod.EpisodeLog(n, torch.device("cpu"), cuda)
        for name, cuda in (("numpy", None), ("torch", FakeCuda([])))
    }
    returns, lengths = [], []
    ret, length, after = np.zeros(n), np.zeros(n, int), np.zeros(n, bool)
    for _ in range(4):
        T = int(rng.integers(1, 12))
        reward = rng.normal(size=(T, n)).astype(np.float32)
        done = rng.random((T, n)) < 0.2
        if next_step:  # an env reports no end on its reset step
            done[1:] &= ~done[:-1]
            done[0] &= ~after
        for t in range(T):
            live = ~after if next_step else np.ones(n, bool)
            ret += np.where(live, reward[t], 0)
            length += live
            for i in np.flatnonzero(done[t]):
                returns.append(ret[i])
                lengths.append(length[i])
                ret[i], length[i] = 0, 0
            after = done[t] if next_step else np.zeros(n, bool)
        for log in logs.values():
            log.add(torch.from_numpy(reward), torch.from_numpy(done), next_step)
            log.flush()
    for log in logs.values():
        got_r, got_l = [], []
        assert log.drain(got_r, got_l) == len(returns) > 3
        np.testing.assert_allclose(got_r, returns, rtol=1e-6)
        assert got_l == lengths


def test_next_obs_of_a_batched_env_is_a_copy_on_its_device():
    env = CartPoleVectorEnv(num_envs=4)
    c = Collector(env, zeros_policy, frames_per_batch=8, seed=0)
    c.collect()
    nxt = c.next_obs
    assert nxt.device == env.device and nxt.shape == (4, 4)
    kept = nxt.clone()
    nxt += 1  # a copy: the collector's observations are untouched
    b = c.collect()
    assert torch.equal(b["obs"][0], kept)  # the next batch starts from it
