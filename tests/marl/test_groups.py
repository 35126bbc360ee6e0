"""Several agent groups per run (agents with different spaces: ``adversary_*`` vs ``agent_*``):
each group's rollout [T, E, A_g, ...] planned to the byte, one MAPPO per group whose losses
equal their hand computation with the centralised critic over every group's observations, the
grouped update equal to each group's own, checkpoints covering every group."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip(
    "pettingzoo", reason="PettingZoo is an optional extra: pip install 'rlstash[pettingzoo]'"
)

from rlstash.agents.mappo import MAPPO, IPPOConfig, MAPPOConfig  # noqa: E402
from rlstash.agents.mappo_groups import GroupedMAPPO  # noqa: E402
from rlstash.collect.multiagent import MultiAgentCollector  # noqa: E402
from rlstash.envs.pettingzoo import PettingZooVectorEnv  # noqa: E402
from rlstash.memory import InsufficientMemoryError  # noqa: E402
from rlstash.storage.marl_rollout import GroupedRollout  # noqa: E402

T, E = 6, 3
ENV = "pettingzoo:tests.marl.pz_groups"
SIZES = {
    "adversary": dict(n_agents=1, obs_dim=3, action_shape=(), action_dtype=torch.int64),
    "agent": dict(n_agents=2, obs_dim=5, action_shape=(2,), action_dtype=torch.float32),
}


def _agents(config_cls: type = MAPPOConfig, state_dim: int = 13, **kw: object) -> GroupedMAPPO:
    cfg = dict(net_arch=(8,), n_epochs=2, minibatch_size=6, rollout_steps=T, num_envs=E, **kw)
    adv = MAPPO(1, 3, n_actions=3, state_dim=state_dim, config=config_cls(**cfg))
    bounds = (torch.full((2,), -1.0), torch.ones(2))
    ag = MAPPO(2, 5, bounds=bounds, state_dim=state_dim, config=config_cls(**{**cfg, "seed": 1}))
    return GroupedMAPPO({"adversary": adv, "agent": ag})


def _filled(state: bool = False, config_cls: type = MAPPOConfig) -> tuple:
    env = PettingZooVectorEnv(ENV, E, 0, seed=0, env_kwargs={"length": 4, "state": state})
    agent = _agents(config_cls)
    rollout = GroupedRollout(T, E, SIZES, state_dim=13 if state else None)
    collector = MultiAgentCollector(env, seed=0)
    collector.collect(agent, rollout)
    env.close()
    return env, agent, rollout, collector


def test_groups_come_from_the_agents_spaces_and_each_rollout_holds_its_own() -> None:
    env, agent, rollout, collector = _filled()
    assert env.groups == {"adversary": ("adversary_0",), "agent": ("agent_0", "agent_1")}
    adv, ag = rollout.rollouts["adversary"], rollout.rollouts["agent"]
    assert adv.obs.shape == (T + 1, E, 1, 3) and ag.obs.shape == (T + 1, E, 2, 5)
    assert adv.action.dtype == torch.int64 and ag.action.shape == (T, E, 2, 2)
    # obs [t, u, ...]: t counts the episode's steps (4 a episode), the row's group tag is kept
    assert adv.obs[1:5, :, 0, 0].tolist() == [[1.0] * E, [2.0] * E, [3.0] * E, [0.0] * E]
    assert (ag.obs[..., 2] == torch.tensor([1.0, 2.0])).all()  # each agent's index in AGENTS
    assert (adv.reward == (adv.action == 2).float()).all()  # the adversary's own reward
    assert ((ag.reward <= 0) & (ag.reward >= -1.5)).all()
    assert not adv.cont[3].any() and adv.cont[2].all()  # the episode ends at its 4th step
    assert collector.agent_names == ["adversary_0", "agent_0", "agent_1"]
    assert collector.stats.count == E  # one episode per env ended, every group's agents
    # the joint critic input: every group's observations, flattened, in group order
    joint = rollout.view("agent", joint=True).state
    assert joint.shape == (T + 1, E, 13)
    assert torch.equal(joint[..., :3], adv.obs[:, :, 0]) and torch.equal(
        joint[..., 3:], ag.obs.flatten(-2)
    )
    assert rollout.view("agent").state is None  # IPPO's view: no global input


@pytest.mark.parametrize("state", [False, True])
def test_plan_equals_allocated_bytes(state: bool) -> None:
    sd = 13 if state else None
    rollout = GroupedRollout(T, E, SIZES, state_dim=sd)
    planned = GroupedRollout.plan_bytes(T, E, SIZES, sd)
    assert sum(planned.values()) == rollout.nbytes
    assert planned["adversary/obs"] == rollout.rollouts["adversary"].obs.nbytes
    assert planned["agent/action"] == rollout.rollouts["agent"].action.nbytes
    assert ("state" in planned) == state
    plan = GroupedRollout.plan(T, E, SIZES, sd)
    assert sum(plan.fields.values()) == rollout.nbytes


def test_a_grouped_rollout_that_does_not_fit_is_refused_before_allocation() -> None:
    big = {g: {**s, "obs_dim": 10**7} for g, s in SIZES.items()}
    with pytest.raises(InsufficientMemoryError, match="envs x 3 agents"):
        GroupedRollout(10**4, 10**3, big)


def test_bad_group_sizes_are_refused_naming_the_group() -> None:
    with pytest.raises(ValueError, match=r"groups\['agent'\].*obs_dim"):
        GroupedRollout(T, E, {"agent": {"n_agents": 2}})


def _hand_mlp(module: torch.nn.Module, x: torch.Tensor, k: int) -> torch.Tensor:
    for layer in module.net:
        if isinstance(layer, torch.nn.Tanh):
            x = torch.tanh(x)
        else:
            x = x @ layer.weight[k] + layer.bias[k]
    return x


def _hand_losses(agent: MAPPO, mb: dict, discrete: bool) -> tuple[float, float]:
    """Policy and value loss of one group by hand, agent by agent: the actor sees the agent's
    observation and one-hot id; MAPPO's critic the joint input (every group's observations)
    and the id, IPPO's the agent's own observation and id."""
    cfg, (B, A) = agent.config, mb["mask"].shape
    eye = torch.eye(A)
    pol = val = n = 0.0
    for i in range(A):
        shared = cfg.share_params
        k = 0 if shared else i
        ident = eye[i].expand(B, A)
        x = torch.cat([mb["obs"][:, i], ident], 1) if shared else mb["obs"][:, i]
        out = _hand_mlp(agent.actor, x, k)
        if discrete:
            logp = torch.log_softmax(out, 1).gather(1, mb["action"][:, i, None]).squeeze(1)
        else:
            loc, raw = out.chunk(2, 1)
            scale = torch.nn.functional.softplus(raw + math.log(math.expm1(1.0 - 0.01))) + 0.01
            z = (mb["action"][:, i] - loc) / scale
            logp = (-0.5 * z**2 - scale.log() - 0.5 * math.log(2 * math.pi)).sum(1)
        ratio = torch.exp(logp - mb["logp"][:, i])
        adv = mb["advantages"][:, i]
        surr = torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
        g = mb["state"] if cfg.centralised else mb["obs"][:, i]
        v = _hand_mlp(agent.critic, torch.cat([g, ident], 1) if shared else g, k)[:, 0]
        m = mb["mask"][:, i]
        pol -= float(surr[m].sum())
        val += float(((v - mb["returns"][:, i]) ** 2)[m].sum())
        n += float(m.sum())
    return pol / n, val / n


@pytest.mark.parametrize("config_cls", [MAPPOConfig, IPPOConfig])
def test_each_groups_losses_equal_their_hand_computation(config_cls: type) -> None:
    _, agent, rollout, _ = _filled(config_cls=config_cls)
    with torch.no_grad():
        for g, discrete in (("adversary", True), ("agent", False)):
            view = rollout.view(g, joint=agent.algo == "mappo")
            part = agent.agents[g]
            adv, ret = part.advantages(view)
            B = 2 * E  # two steps of every env
            mb = {"obs": view.obs[:2], "action": view.action[:2], "logp": view.logp[:2],
                  "advantages": adv[:2], "returns": ret[:2], "mask": view.mask[:2]}  # fmt: skip
            mb = {k: v.reshape(B, *v.shape[2:]) for k, v in mb.items()}
            if view.state is not None:
                mb["state"] = view.state[:2].reshape(B, -1)
            got = part.losses(mb)
            pol, val = _hand_losses(part, mb, discrete)
            assert float(got["policy_loss"]) == pytest.approx(pol, rel=1e-4, abs=1e-6)
            assert float(got["value_loss"]) == pytest.approx(val, rel=1e-4, abs=1e-6)


def test_the_grouped_update_is_each_groups_own_update() -> None:
    _, agent, rollout, _ = _filled()
    twin = _agents()
    twin.load_state_dict(agent.state_dict())  # the same weights, optimizers and generators
    alone = twin.agents
    before = {g: a.actor_opt.flat.param.clone() for g, a in agent.agents.items()}
    metrics = agent.update(rollout)
    for g, a in alone.items():
        own = a.update(rollout.view(g, joint=True))
        assert torch.equal(a.actor_opt.flat.param, agent.agents[g].actor_opt.flat.param)
        assert torch.equal(a.critic_opt.flat.param, agent.agents[g].critic_opt.flat.param)
        assert not torch.equal(before[g], a.actor_opt.flat.param)  # it learned
        for k, v in own.items():
            assert torch.equal(metrics[f"{k}_{g}"], v)
    mean = (metrics["policy_loss_adversary"] + metrics["policy_loss_agent"]) / 2
    assert torch.allclose(metrics["policy_loss"], mean)
    assert agent.updates == 1


def test_the_state_covers_every_group_and_a_missing_group_is_refused() -> None:
    a, b = _agents(), _agents(seed=5)
    b.load_state_dict(a.state_dict())
    for g in a.agents:
        assert torch.equal(a.agents[g].actor_opt.flat.param, b.agents[g].actor_opt.flat.param)
        assert torch.equal(a.agents[g].critic_opt.flat.param, b.agents[g].critic_opt.flat.param)
    state = a.state_dict()
    del state["groups"]["agent"]
    with pytest.raises(ValueError, match=r"holds groups \['adversary'\], expected"):
        b.load_state_dict(state)


def test_one_agent_for_an_env_of_two_groups_is_refused_naming_the_groups() -> None:
    env = PettingZooVectorEnv(ENV, 2, 0, seed=0)
    try:
        collector = MultiAgentCollector(env)
        with pytest.raises(ValueError, match=r"agent groups \['adversary', 'agent'\], got one"):
            collector.collect(_agents().agents["agent"], GroupedRollout(2, 2, SIZES))
    finally:
        env.close()


def test_mpe_simple_adversary_fills_a_grouped_rollout() -> None:
    pytest.importorskip(
        "mpe2", reason="MPE tasks are an optional extra: pip install 'rlstash[mpe]'"
    )
    env = PettingZooVectorEnv("pettingzoo:mpe2.simple_adversary_v3", 2, 0, seed=0,
                              env_kwargs={"max_cycles": 5})  # fmt: skip
    try:
        assert {g: len(m) for g, m in env.groups.items()} == {"adversary": 1, "agent": 2}
        dims = {g: env.observation_spaces[g].shape[0] for g in env.groups}
        sizes = {g: dict(n_agents=len(m), obs_dim=dims[g], action_dtype=torch.int64)
                 for g, m in env.groups.items()}  # fmt: skip
        sd = env.state_space.shape[0] if env.state_space is not None else None
        joint = sd or sum(len(m) * dims[g] for g, m in env.groups.items())
        cfg = MAPPOConfig(net_arch=(8,), n_epochs=1, minibatch_size=4)
        agent = GroupedMAPPO({g: MAPPO(len(m), dims[g], n_actions=5, state_dim=joint, config=cfg)
                              for g, m in env.groups.items()})  # fmt: skip
        rollout = GroupedRollout(6, 2, sizes, state_dim=sd)
        MultiAgentCollector(env, seed=0).collect(agent, rollout)
        assert not rollout.rollouts["agent"].cont[4].any()  # max_cycles 5: the 5th step ends
        metrics = agent.update(rollout)
        assert torch.isfinite(metrics["policy_loss_adversary"])
    finally:
        env.close()
