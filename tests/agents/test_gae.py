"""GAE on rollouts from a time-limit env: terminated, truncated and running episodes against
hand-computed advantages, in both autoreset modes, through ProcessPoolVectorEnv + Collector + RolloutStorage."""

import functools

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlstash.agents.gae import gae, rollout_gae
from rlstash.collect.sync import Collector
from rlstash.envs import ProcessPoolVectorEnv
from rlstash.spec import Spec
from rlstash.storage.rollout import RolloutStorage

GAMMA, LAM = 0.5, 0.5


class ClockEnv(gym.Env):
    """obs = [t] (steps into the episode), reward of the step from t: t + 1; terminated when
    t reaches ``term_at`` (None: never). Time limits come from gymnasium's TimeLimit."""

    def __init__(self, term_at: int | None = None):
        self.term_at = term_at
        self.observation_space = spaces.Box(-np.inf, np.inf, (1,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        term = self.term_at is not None and self.t >= self.term_at
        return np.array([self.t], np.float32), float(self.t), term, False, {}


def make_clock(term_at: int | None, limit: int) -> gym.Env:
    return gym.wrappers.TimeLimit(ClockEnv(term_at), max_episode_steps=limit)


def value_fn(obs: torch.Tensor) -> torch.Tensor:  # V(s) = t
    return obs[:, 0].float()


# With gamma = lambda = 1/2, r_t = t + 1 and V(t) = t, by hand:
#   terminated at t = 2:  A(1) = 2 + 0 - 1 = 1;            A(0) = 1 + 1/2 - 0 + (1/4) 1 = 1.75
#   truncated at t = 2:   A(1) = 2 + (1/2) 2 - 1 = 2;      A(0) = 1.5 + (1/4) 2 = 2.0
#   running at the end (bootstrap from V of the obs after the rollout, t = 4):
#       A(3) = 4 + 2 - 3 = 3; A(2) = 2.5 + 0.75 = 3.25; A(1) = 2 + 0.8125 = 2.8125;
#       A(0) = 1.5 + 0.703125 = 2.203125
#   a fresh episode cut by the rollout's end after one step (obs 0, bootstrap t = 1):
#       A(0) = 1 + 0.5 - 0 = 1.5
# Rows hold the observation t each step was taken from; None marks an invalid row (next-step
# autoreset's reset step, whose obs is the final obs and whose action the env ignores).
CASES = [
    # (name, term_at, limit, mode, [(t or None, advantage)] per row for T = 4)
    ("terminated", 2, 100, "next_step", [(0, 1.75), (1, 1.0), (None, None), (0, 1.5)]),
    ("truncated", None, 2, "next_step", [(0, 2.0), (1, 2.0), (None, None), (0, 1.5)]),
    ("running", None, 100, "next_step", [(0, 2.203125), (1, 2.8125), (2, 3.25), (3, 3.0)]),
    ("terminated", 2, 100, "same_step", [(0, 1.75), (1, 1.0), (0, 1.75), (1, 1.0)]),
    ("truncated", None, 2, "same_step", [(0, 2.0), (1, 2.0), (0, 2.0), (1, 2.0)]),
    ("running", None, 100, "same_step", [(0, 2.203125), (1, 2.8125), (2, 3.25), (3, 3.0)]),
]


@pytest.mark.parametrize(
    "name,term_at,limit,mode,rows", CASES, ids=[f"{c[0]}-{c[3]}" for c in CASES]
)
def test_gae_of_a_time_limit_env_equals_hand_computed(name, term_at, limit, mode, rows):
    fns = [functools.partial(make_clock, term_at, limit)] * 2  # two identical envs: N = 2
    with ProcessPoolVectorEnv(fns, num_workers=0, autoreset_mode=mode, seed=0) as pool:
        collector = Collector(pool, lambda obs: torch.zeros(obs.shape[0], dtype=torch.int64), 8)
        rollout = RolloutStorage(
            Spec({"obs": ((1,), "float32"), "action": ((), "int64")}), 4, 2,
            same_step=collector.same_step,
        )  # fmt: skip
        rollout.add(collector.collect(), collector.next_obs)
    adv, ret, values = rollout_gae(rollout, value_fn, GAMMA, LAM)
    for t, (obs_t, want) in enumerate(rows):
        for env in range(2):
            assert bool(rollout.valid[t, env]) == (obs_t is not None), (t, env)
            if obs_t is None:
                continue
            assert rollout.obs[t, env, 0].item() == obs_t
            assert adv[t, env].item() == pytest.approx(want), (name, mode, t)
            assert ret[t, env].item() == pytest.approx(want + obs_t)
    torch.testing.assert_close(values, rollout.obs[:4, :, 0])


def _naive_gae(r, v, v_next, term, cont, gamma, lam):
    T, N = r.shape
    out = np.zeros((T, N))
    for n in range(N):
        running = 0.0
        for t in reversed(range(T)):
            delta = r[t, n] + gamma * (0.0 if term[t, n] else v_next[t, n]) - v[t, n]
            running = delta + (gamma * lam * running if cont[t, n] else 0.0)
            out[t, n] = running
    return out


def test_gae_scan_equals_a_naive_loop_on_random_data():
    g = torch.Generator().manual_seed(0)
    T, N = 17, 5
    r, v, vn = (torch.randn(T, N, generator=g) for _ in range(3))
    term = torch.rand(T, N, generator=g) < 0.1
    cont = (torch.rand(T, N, generator=g) < 0.8) & ~term
    adv, ret = gae(r, v, vn, term, cont, 0.97, 0.9)
    want = _naive_gae(r.numpy(), v.numpy(), vn.numpy(), term.numpy(), cont.numpy(), 0.97, 0.9)
    np.testing.assert_allclose(adv.numpy(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ret, adv + v)


def test_gae_refuses_mismatched_shapes():
    x = torch.zeros(3, 2)
    with pytest.raises(ValueError, match="next_value: expected shape"):
        gae(x, x, torch.zeros(3, 1), x.bool(), x.bool(), 0.9, 0.9)
    with pytest.raises(ValueError, match="gamma, lam"):
        gae(x, x, x, x.bool(), x.bool(), 1.5, 0.9)
