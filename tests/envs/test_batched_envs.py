"""rlstash/CartPole-v1 and rlstash/Pendulum-v1 against gymnasium's own envs.

Both sides start from the same states and get the same actions; gymnasium's
``SyncVectorEnv`` over ``CartPoleEnv`` / ``PendulumEnv`` (with their ``TimeLimit``) is the
reference for the dynamics, rewards, flags, time limits, autoreset and ``final_obs``. After
every step gymnasium's sub-envs are set to the batched env's state (its reset states come
from its own RNG, and one-step comparisons keep chaotic rounding drift out of the picture).
"""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.wrappers import TimeLimit

import rlstash  # noqa: F401  (registers the ids)
from rlstash.envs.batched import core
from rlstash.envs.batched.cartpole import CartPoleVectorEnv
from rlstash.envs.batched.core import hashed_uniform
from rlstash.envs.batched.ops import NumpyOps, TorchOps
from rlstash.envs.batched.pendulum import PendulumVectorEnv

MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP]


@pytest.fixture(params=["numpy", "torch"])
def backend(request, monkeypatch):
    """The CPU runs the physics in numpy; accelerators run it in torch. ``torch`` runs the
    accelerator code path (torch ops, no data-dependent row selection) on CPU tensors."""
    if request.param == "torch":
        monkeypatch.setattr(core, "ops_for", lambda device: TorchOps(device))
    return request.param


def _time_limit(env: gym.Env) -> TimeLimit:
    while not isinstance(env, TimeLimit):
        env = env.env
    return env


def _sync_reference(ref: SyncVectorEnv, env, elapsed: np.ndarray | None = None) -> None:
    """Set gymnasium's sub-envs to the batched env's state (and episode step counts)."""
    state = env.state.numpy().astype(np.float64)  # [D, N]
    steps = env.elapsed.numpy() if elapsed is None else elapsed
    for i, sub in enumerate(ref.envs):
        sub.unwrapped.state = state[:, i].copy()
        _time_limit(sub)._elapsed_steps = int(steps[i])


def _actions(kind: str, obs: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
    n = obs.shape[0]
    if kind == "cartpole":  # half balance (reach the time limit), half random (fall over)
        balance = (obs[:, 2] + 0.5 * obs[:, 3] > 0).long()
        rand = torch.from_numpy(rng.integers(0, 2, n))
        return torch.where(torch.arange(n) % 2 == 0, balance, rand)
    return torch.from_numpy(rng.uniform(-3, 3, (n, 1)).astype(np.float32))  # beyond the clip


def _compare(kind: str, mode: AutoresetMode, dtype: torch.dtype, n: int, steps: int) -> dict:
    make = CartPoleVectorEnv if kind == "cartpole" else PendulumVectorEnv
    gym_id = "CartPole-v1" if kind == "cartpole" else "Pendulum-v1"
    env = make(num_envs=n, autoreset_mode=mode, dtype=dtype)
    ref = SyncVectorEnv([lambda: gym.make(gym_id) for _ in range(n)], autoreset_mode=mode)
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=0)
    ref.reset(seed=0)
    limit = env.max_episode_steps
    start = rng.integers(0, limit, n)  # episodes already under way: time limits come soon
    env.elapsed[:] = torch.from_numpy(start)
    _sync_reference(ref, env)
    seen = {"terminated": 0, "truncated": 0, "both": 0}
    exact = dtype == torch.float64
    tol = dict(rtol=0, atol=0) if exact else dict(rtol=1e-5, atol=1e-5)
    prev_done = np.zeros(n, bool)
    for _ in range(steps):
        act = _actions(kind, obs, rng)
        obs, rew, term, trunc, info = env.step(act)
        r_obs, r_rew, r_term, r_trunc, r_info = ref.step(act.numpy())
        assert obs.dtype == torch.float32 and rew.dtype == torch.float32
        assert term.dtype == torch.bool and trunc.dtype == torch.bool
        np.testing.assert_array_equal(term.numpy(), r_term)
        np.testing.assert_array_equal(trunc.numpy(), r_trunc)
        np.testing.assert_allclose(rew.numpy(), r_rew.astype(np.float32), **tol)
        done = r_term | r_trunc
        # rows that reset in this step got a state from each side's own RNG
        fresh = prev_done if mode == AutoresetMode.NEXT_STEP else done
        np.testing.assert_allclose(obs.numpy()[~fresh], r_obs[~fresh], **tol)
        if fresh.any():
            ref_reset = gym.make(gym_id).observation_space
            assert all(ref_reset.contains(o) for o in obs.numpy()[fresh])
            assert (env.elapsed.numpy()[fresh] == 0).all()
        if mode == AutoresetMode.SAME_STEP:
            np.testing.assert_array_equal(info["_final_obs"].numpy(), done)
            if done.any():
                want = np.stack([r_info["final_obs"][i] for i in np.flatnonzero(done)])
                np.testing.assert_allclose(info["final_obs"].numpy()[done], want, **tol)
                np.testing.assert_array_equal(r_info["_final_obs"], done)
        else:
            assert "final_obs" not in info and "final_obs" not in r_info
        seen["terminated"] += int(r_term.sum())
        seen["truncated"] += int(r_trunc.sum())
        seen["both"] += int((r_term & r_trunc).sum())
        prev_done = done
        _sync_reference(ref, env)
    ref.close()
    return seen


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_cartpole_matches_gymnasium_float64_exactly(mode, backend):
    seen = _compare("cartpole", mode, torch.float64, n=24, steps=260)
    assert seen["terminated"] > 10 and seen["truncated"] > 5  # both endings were exercised


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_pendulum_matches_gymnasium_float64_exactly(mode, backend):
    seen = _compare("pendulum", mode, torch.float64, n=16, steps=120)
    assert seen["truncated"] > 5 and seen["terminated"] == 0


@pytest.mark.parametrize("kind", ["cartpole", "pendulum"])
def test_float32_state_matches_gymnasium_closely(kind, backend):
    _compare(kind, AutoresetMode.SAME_STEP, torch.float32, n=16, steps=80)


def test_make_vec_builds_the_batched_envs_with_their_time_limits():
    cp = gym.make_vec(
        "rlstash/CartPole-v1", num_envs=4096, vectorization_mode="vector_entry_point", device="cpu"
    )
    pd = gym.make_vec("rlstash/Pendulum-v1", num_envs=8, vectorization_mode="vector_entry_point")
    assert (cp.num_envs, cp.max_episode_steps, cp.device.type) == (4096, 500, "cpu")
    assert (pd.num_envs, pd.max_episode_steps) == (8, 200)
    assert cp.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    assert cp.single_observation_space == gym.make("CartPole-v1").observation_space
    assert pd.single_action_space == gym.make("Pendulum-v1").action_space
    obs, _ = cp.reset(seed=3)
    assert obs.shape == (4096, 4) and isinstance(obs, torch.Tensor)
    assert gym.spec("rlstash/CartPole-v1").reward_threshold == 475.0
    single = gym.make("rlstash/Pendulum-v1")  # one env: gymnasium's numpy env
    assert single.spec.max_episode_steps == 200


def test_same_step_mode_through_make_vec():
    env = gym.make_vec(
        "rlstash/CartPole-v1",
        num_envs=4,
        vectorization_mode="vector_entry_point",
        autoreset_mode=AutoresetMode.SAME_STEP,
    )
    assert env.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP


def test_both_backends_give_the_same_episodes(monkeypatch):
    """Same seeds, same actions: the numpy (CPU) and torch (accelerator) paths give the same
    episodes, resets included (flags exactly; values to rounding: sin/cos differ by an ulp)."""
    runs = []
    for torch_path in (False, True):
        if torch_path:
            monkeypatch.setattr(core, "ops_for", lambda device: TorchOps(device))
        for mode in MODES:
            env = CartPoleVectorEnv(num_envs=32, autoreset_mode=mode, dtype=torch.float64)
            obs, _ = env.reset(seed=5)
            out = [obs.clone()]
            gen = torch.Generator().manual_seed(0)
            for _ in range(60):
                step = env.step(torch.randint(0, 2, (32,), generator=gen))
                out += [t.clone() for t in step[:4]]
                if mode == AutoresetMode.SAME_STEP:
                    out += [step[4]["final_obs"].clone(), step[4]["_final_obs"].clone()]
            runs.append(out)
    half = len(runs) // 2
    for a, b in zip(runs[:half], runs[half:]):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6)


def test_reset_pool_gives_the_states_of_the_hash_at_every_counter():
    """The CPU path's pool of initial states (refilled 16 resets at a time, envs at different
    paces) hands out exactly the state the hash gives for each env's (seed, counter)."""
    from rlstash.envs.batched.cartpole import CartPoleDynamics
    from rlstash.envs.batched.core import ResetPool

    ops, dyn, n = NumpyOps(), CartPoleDynamics(torch.float64), 6
    pool = ResetPool(dyn, ops, n)
    seeds, resets = np.arange(n, dtype=np.int64) * 7 + 1, np.zeros(n, np.int64)
    rng = np.random.default_rng(0)
    refills = 0
    for _ in range(200):
        rows = np.flatnonzero(rng.random(n) < np.linspace(0.05, 0.9, n))  # env 5 resets most
        if rows.size == 0:
            continue
        before = pool.base.copy()
        got = pool.take(seeds, resets, rows)
        refills += not np.array_equal(before, pool.base)
        want = dyn.initial(hashed_uniform(seeds[rows], resets[rows], 4, ops), ops)
        np.testing.assert_array_equal(got, want)
        resets[rows] += 1
    assert resets.max() > 8 * ResetPool.B and refills > 8


def test_numpy_path_equals_the_torch_path_over_many_resets(monkeypatch):
    """Hundreds of resets per env (pool refills), a masked reset and a reseed: the CPU path's
    episodes, with the reset pool (up to POOL_MAX_ENVS envs) and without it (hashed on the
    spot, beyond), equal the torch path's, which hashes each reset on the spot."""
    runs = []
    for path in ("numpy + pool", "numpy, no pool", "torch"):
        if path == "numpy, no pool":
            monkeypatch.setattr(core, "POOL_MAX_ENVS", 4)  # 8 envs: more than the limit
        if path == "torch":
            monkeypatch.setattr(core, "ops_for", lambda device: TorchOps(device))
        env = CartPoleVectorEnv(num_envs=8, dtype=torch.float64)
        assert (env._pool is not None) == (path == "numpy + pool")
        out = [env.reset(seed=5)[0].clone()]
        left = torch.zeros(8, dtype=torch.int64)  # episodes of ~10 steps
        for t in range(400):
            if t == 150:
                mask = torch.tensor([True, False] * 4)
                out.append(env.reset(options={"reset_mask": mask})[0].clone())
            if t == 250:
                out.append(env.reset(seed=11)[0].clone())
            out += [x.clone() for x in env.step(left)[:4]]
        runs.append(out)
    for other in runs[1:]:
        for x, y in zip(runs[0], other):
            torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6)


def test_per_env_seeding_is_independent_of_batch_size_and_other_envs():
    small = CartPoleVectorEnv(num_envs=3)
    big = CartPoleVectorEnv(num_envs=300)
    a, _ = small.reset(seed=7)
    b, _ = big.reset(seed=7)
    assert torch.equal(a, b[:3])
    c, _ = small.reset(seed=[9, 8, 7 + 2])
    assert torch.equal(c[2], a[2]) and not torch.equal(c[0], a[0])
    again, _ = small.reset(seed=7)
    assert torch.equal(again, a)
    later, _ = small.reset()  # no seed: the envs' streams continue
    assert not torch.equal(later, a)
    u = hashed_uniform(np.arange(1000), np.zeros(1000, np.int64), 4, NumpyOps())
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean().item() - 0.5) < 0.02


def test_unseeded_reset_draws_fresh_seeds():
    a, _ = CartPoleVectorEnv(num_envs=4).reset()
    b, _ = CartPoleVectorEnv(num_envs=4).reset()
    assert not torch.equal(a, b)


def test_reset_mask_resets_only_those_envs():
    env = CartPoleVectorEnv(num_envs=4, autoreset_mode=AutoresetMode.DISABLED)
    env.reset(seed=0)
    for _ in range(5):
        obs, *_ = env.step(torch.ones(4, dtype=torch.int64))
    mask = torch.tensor([True, False, True, False])
    new, _ = env.reset(options={"reset_mask": mask})
    assert torch.equal(new[~mask], obs[~mask])
    assert not torch.equal(new[mask], obs[mask])
    assert env.elapsed.tolist() == [0, 5, 0, 5]
    with pytest.raises(ValueError, match="reset_mask"):
        env.reset(options={"reset_mask": torch.ones(3, dtype=torch.bool)})


def test_bad_actions_are_refused_with_the_expected_shape():
    env = CartPoleVectorEnv(num_envs=4)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        env.step(torch.zeros(4, 1, dtype=torch.int64))
    with pytest.raises(ValueError, match="integer"):
        env.step(torch.zeros(4))
    with pytest.raises(ValueError, match="on meta"):
        env.step(torch.zeros(4, dtype=torch.int64, device="meta"))
    pend = PendulumVectorEnv(num_envs=2)
    pend.reset(seed=0)
    with pytest.raises(ValueError, match=r"\(2, 1\)"):
        pend.step(torch.zeros(2))
    with pytest.raises(TypeError, match="unknown arguments"):
        CartPoleVectorEnv(num_envs=2, render_mode="human")
    with pytest.raises(RuntimeError, match="reset"):
        CartPoleVectorEnv(num_envs=2).step(torch.zeros(2, dtype=torch.int64))


def test_outputs_do_not_alias_the_env_state():
    env = CartPoleVectorEnv(num_envs=8)
    obs, _ = env.reset(seed=0)
    kept = obs.clone()
    env.step(torch.ones(8, dtype=torch.int64))
    assert torch.equal(obs, kept)


def test_registration_is_lazy_and_torch_free():
    """``import rlstash`` imports neither gymnasium nor torch, registers the ids whichever of
    rlstash and gymnasium is imported first, and single-env use never imports torch."""
    code = (
        "import sys\n"
        "import {first}\n"
        "assert 'gymnasium' not in sys.modules or '{first}' == 'gymnasium'\n"
        "import {second}\n"
        "import gymnasium as gym\n"
        "env = gym.make('rlstash/CartPole-v1'); env.reset(seed=0); env.step(0)\n"
        "assert 'rlstash/Pendulum-v1' in gym.registry\n"
        "print('torch' in sys.modules)\n"
    )
    for first, second in (("rlstash", "gymnasium"), ("gymnasium", "rlstash")):
        out = subprocess.run(
            [sys.executable, "-c", code.format(first=first, second=second)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "False", (first, out.stdout)


@pytest.mark.parametrize("mode", [*MODES, AutoresetMode.DISABLED], ids=lambda m: m.value)
def test_accelerator_path_never_reads_data_on_the_host(mode):
    """On the ``meta`` device tensors have no data: any host read (``.item()``, ``nonzero``,
    ``bool(t)``, a copy to the CPU) raises. The accelerator path runs through all the same."""
    env = CartPoleVectorEnv(num_envs=64, device="meta", autoreset_mode=mode)
    obs, _ = env.reset(seed=0)
    assert obs.device.type == "meta" and obs.shape == (64, 4)
    for _ in range(3):
        obs, rew, term, trunc, info = env.step(torch.zeros(64, dtype=torch.int64, device="meta"))
    assert {t.device.type for t in (obs, rew, term, trunc)} == {"meta"}
    if mode == AutoresetMode.SAME_STEP:
        assert info["final_obs"].device.type == "meta"
    env.reset(options={"reset_mask": torch.ones(64, dtype=torch.bool, device="meta")})
    pend = PendulumVectorEnv(num_envs=8, device="meta")
    pend.reset(seed=1)
    pend.step(torch.zeros(8, 1, device="meta"))


@pytest.mark.gpu  # runs where CUDA exists (conftest: no tripwire there, skipped elsewhere)
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_gpu_env_matches_the_cpu_env(mode, monkeypatch):
    """Real CUDA: the same seeds and actions give the CPU env's episodes (flags exactly, values
    to rounding), everything stays on the GPU, and stepping never synchronises the device."""

    def no_sync(*args, **kwargs):
        raise AssertionError("torch.cuda.synchronize was called")

    n = 4096
    gpu = CartPoleVectorEnv(num_envs=n, device="cuda", autoreset_mode=mode, dtype=torch.float64)
    cpu = CartPoleVectorEnv(num_envs=n, autoreset_mode=mode, dtype=torch.float64)
    g_obs, _ = gpu.reset(seed=0)
    c_obs, _ = cpu.reset(seed=0)
    monkeypatch.setattr(torch.cuda, "synchronize", no_sync)
    gen = torch.Generator().manual_seed(0)
    for _ in range(100):
        act = torch.randint(0, 2, (n,), generator=gen)
        g = gpu.step(act.cuda())
        c = cpu.step(act)
        assert all(t.device.type == "cuda" for t in g[:4])
        for x, y in zip(g[:4], c[:4]):
            torch.testing.assert_close(x.cpu(), y, rtol=1e-6, atol=1e-6)
