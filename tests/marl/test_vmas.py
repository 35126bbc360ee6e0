"""VMAS through rlstash (rlstash.envs.vmas, rlstash.collect.multiagent) equals VMAS stepped by
hand; actions with bad names or shapes are refused naming the agent; dict observations."""

from __future__ import annotations

import pytest
import torch

vmas = pytest.importorskip("vmas", reason="VMAS is an optional extra: pip install 'rlstash[vmas]'")

from rlstash.collect.multiagent import MultiAgentCollector  # noqa: E402
from rlstash.envs.vmas import VmasVectorEnv  # noqa: E402
from rlstash.storage.marl_rollout import MultiAgentRollout  # noqa: E402

E, A, HORIZON = 4, 3, 5
KW = dict(n_agents=A, shared_rew=False)


def _actions(t: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + t)
    return torch.rand(E, A, 2, generator=g) * 2 - 1  # [E, A, 2] in the Box


def _by_hand(steps: int) -> list[tuple]:
    """VMAS stepped by hand with the same actions; done envs reset by hand (reset_at)."""
    env = vmas.make_env("navigation", num_envs=E, seed=0, max_steps=HORIZON,
                        terminated_truncated=True, **KW)  # fmt: skip
    obs = env.reset(seed=0)
    out = [(torch.stack(obs, 1), None, None, None)]
    for t in range(steps):
        a = _actions(t)
        obs, rews, term, trunc, _ = env.step([a[:, i] for i in range(A)])
        final = torch.stack(obs, 1)
        done = term | trunc
        if bool(done.all()):  # every env ended together (a fixed horizon): one reset
            obs = env.reset()
        elif bool(done.any()):
            for i in done.nonzero().flatten().tolist():
                env.reset_at(i)
            obs = env.get_from_scenario(True, False, False, False)[0]
        out.append((torch.stack(obs, 1), torch.stack(rews, 1), done, final))
    return out


def test_vmas_through_rlstash_equals_vmas_by_hand() -> None:
    steps = 2 * HORIZON + 2  # two episode ends (same-step resets)
    ref = _by_hand(steps)
    env = VmasVectorEnv("navigation", E, seed=0, max_steps=HORIZON, **KW)
    try:
        assert env.groups == {"agents": ("agent_0", "agent_1", "agent_2")}
        step = env.reset(seed=0)
        assert torch.equal(step.obs["agents"], ref[0][0])
        ends = 0
        for t in range(steps):
            step = env.step({"agents": _actions(t)})
            obs, rew, done, final = ref[t + 1]
            assert torch.equal(step.obs["agents"], obs), t
            assert torch.equal(step.reward["agents"], rew), t
            assert torch.equal(step.env_done, done), t
            assert torch.equal(step.truncated["agents"], done[:, None].expand(E, A))
            assert step.mask["agents"].all()
            if bool(done.any()):
                ends += 1
                assert torch.equal(step.final_obs["agents"], final)
            else:
                assert step.final_obs is None
        assert ends == 2
    finally:
        env.close()


class _Scripted:
    """A deterministic 'agent': the test's actions, stored as they are; values = obs sum."""

    def __init__(self) -> None:
        self.t = 0

    def act(self, obs: torch.Tensor, action_mask: object = None, deterministic: bool = False):
        a = _actions(self.t)
        self.t += 1
        return a, a, torch.zeros(E, A)

    def values(self, obs: torch.Tensor, state: object = None) -> torch.Tensor:
        return obs.sum(-1)


def test_collector_fills_the_rollout_as_vmas_by_hand() -> None:
    T = HORIZON + 2
    ref = _by_hand(T)
    env = VmasVectorEnv("navigation", E, seed=0, max_steps=HORIZON, **KW)
    rollout = MultiAgentRollout(T, E, A, obs_dim=env.observation_spaces["agents"].shape[0],
                                action_shape=(2,))  # fmt: skip
    collector = MultiAgentCollector(env, seed=0)
    collector.collect(_Scripted(), rollout)
    env.close()
    for t in range(T):
        assert torch.equal(rollout.obs[t], ref[t][0]), t
        assert torch.equal(rollout.action[t], _actions(t))
        obs, rew, done, final = ref[t + 1]
        assert torch.equal(rollout.reward[t], rew)
        assert torch.equal(rollout.cont[t], ~done[:, None].expand(E, A))
        want = final.sum(-1) * done[:, None] if bool(done.any()) else torch.zeros(E, A)
        assert torch.equal(rollout.final_value[t], want), t  # the final obs' value, once
    assert torch.equal(rollout.obs[T], ref[T][0])
    assert collector.stats.count == E  # one episode end per env
    want = sum(ref[t + 1][1] for t in range(HORIZON)).mean(0)  # [A]
    assert torch.allclose(torch.tensor(collector.stats.returns_per_agent()), want)


def test_bad_agent_names_and_shapes_are_refused_before_vmas_steps() -> None:
    env = VmasVectorEnv("navigation", E, seed=0, max_steps=HORIZON, **KW)
    try:
        env.reset(seed=0)
        with pytest.raises(ValueError, match="unknown group or agent 'agent_7'"):
            env.step({"agent_7": torch.zeros(E, 2)})
        with pytest.raises(ValueError, match=r"'agents' expected shape \[4, 3, 2\]"):
            env.step({"agents": torch.zeros(E, A, 3)})
        with pytest.raises(ValueError, match="no action for agent 'agent_2'"):
            env.step({"agent_0": torch.zeros(E, 2), "agent_1": torch.zeros(E, 2)})
        assert int(env._env.steps[0]) == 0  # nothing was stepped
    finally:
        env.close()


def test_discrete_vmas_actions() -> None:
    env = VmasVectorEnv("navigation", E, seed=0, continuous_actions=False, max_steps=HORIZON, **KW)
    try:
        n = env.action_spaces["agents"].n
        step = env.step({"agents": torch.randint(0, n, (E, A))})
        assert step.reward["agents"].shape == (E, A)
        with pytest.raises(TypeError, match="expected integer action indices"):
            env.step({"agents": torch.zeros(E, A)})
    finally:
        env.close()


def test_dict_observations_of_a_scenario_come_back_per_key() -> None:
    from vmas.scenarios.navigation import Scenario

    class DictObs(Scenario):
        def observation(self, agent):  # noqa: ANN001, ANN201
            flat = super().observation(agent)
            return {"pos": flat[:, :2], "rest": flat[:, 2:]}

    env = VmasVectorEnv(DictObs(), E, seed=0, max_steps=HORIZON, **KW)
    plain = VmasVectorEnv("navigation", E, seed=0, max_steps=HORIZON, **KW)
    try:
        assert set(env.observation_spaces["agents"].spaces) == {"pos", "rest"}
        d, p = env.reset(seed=0), plain.reset(seed=0)
        assert d.obs["agents"]["pos"].shape == (E, A, 2)
        assert torch.equal(torch.cat([d.obs["agents"]["pos"], d.obs["agents"]["rest"]], -1),
                           p.obs["agents"])  # fmt: skip
        for t in range(HORIZON):  # through an episode end: final_obs per key too
            d = env.step({"agents": _actions(t)})
        assert set(d.final_obs["agents"]) == {"pos", "rest"}
    finally:
        env.close()
        plain.close()
