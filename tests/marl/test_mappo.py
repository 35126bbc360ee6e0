"""MAPPO/IPPO (rlstash.agents.mappo): losses equal their hand computation with shared and with
independent parameters; masked rows contribute nothing; GAE per agent; discrete masks."""

from __future__ import annotations

import math

import pytest
import torch

from rlstash.agents.gae import gae
from rlstash.agents.mappo import MAPPO, IPPOConfig, MAPPOConfig
from rlstash.storage.marl_rollout import MultiAgentRollout

B, A, D, ACT = 5, 3, 4, 2
LOW, HIGH = torch.tensor([-1.0, -2.0]), torch.tensor([1.0, 2.0])


def _batch(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "obs": torch.randn(B, A, D, generator=g),
        "action": torch.randn(B, A, ACT, generator=g),
        "logp": torch.randn(B, A, generator=g) - 2.0,
        "advantages": torch.randn(B, A, generator=g),
        "returns": torch.randn(B, A, generator=g),
        "mask": torch.rand(B, A, generator=g) > 0.3,
    }


def _mlp(layers: list[torch.nn.Module], x: torch.Tensor, agent: int | None) -> torch.Tensor:
    """The AgentMLP by hand for one agent's inputs [B, in] (agent None: shared weights)."""
    for layer in layers:
        if isinstance(layer, torch.nn.Tanh):
            x = torch.tanh(x)
        else:
            k = 0 if agent is None else agent
            x = x @ layer.weight[k] + layer.bias[k]
    return x


def _hand_losses(agent: MAPPO, mb: dict[str, torch.Tensor]) -> tuple[float, float]:
    cfg = agent.config
    actor, critic = list(agent.actor.net), list(agent.critic.net)
    shared = cfg.share_params
    eye = torch.eye(A)
    pol, val, n = 0.0, 0.0, 0.0
    for i in range(A):
        x = mb["obs"][:, i]  # [B, D]
        xin = torch.cat([x, eye[i].expand(B, A)], 1) if shared and cfg.agent_id else x
        out = _mlp(actor, xin, None if shared else i)
        loc, raw = out[:, :ACT], out[:, ACT:]
        scale = torch.nn.functional.softplus(raw + math.log(math.expm1(1.0 - 0.01))) + 0.01
        u = mb["action"][:, i]
        logp = (-0.5 * ((u - loc) / scale) ** 2 - scale.log() - 0.5 * math.log(2 * math.pi)).sum(1)
        ratio = torch.exp(logp - mb["logp"][:, i])
        adv = mb["advantages"][:, i]
        surr = torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
        if cfg.centralised:
            g = mb["obs"].reshape(B, A * D)
            gin = torch.cat([g, eye[i].expand(B, A)], 1) if shared and cfg.agent_id else g
        else:
            gin = xin
        v = _mlp(critic, gin, None if shared else i)[:, 0]
        m = mb["mask"][:, i].float()
        pol += -(m * surr).sum().item()
        val += (m * (v - mb["returns"][:, i]) ** 2).sum().item()
        n += m.sum().item()
    return pol / n, val / n


@pytest.mark.parametrize("share", [True, False], ids=["shared", "independent"])
@pytest.mark.parametrize("config_cls", [MAPPOConfig, IPPOConfig], ids=["mappo", "ippo"])
def test_losses_equal_their_hand_computation(share: bool, config_cls: type) -> None:
    cfg = config_cls(net_arch=(8, 8), share_params=share, seed=1)
    agent = MAPPO(A, D, bounds=(LOW, HIGH), config=cfg)
    mb = _batch()
    out = agent.losses(mb)
    pol, val = _hand_losses(agent, mb)
    assert out["policy_loss"].item() == pytest.approx(pol, rel=1e-5, abs=1e-6)
    assert out["value_loss"].item() == pytest.approx(val, rel=1e-5, abs=1e-6)
    per_agent_params = agent.actor.net[0].weight.shape[0]
    assert per_agent_params == (1 if share else A)


def test_the_scale_mapping_is_benchmarls_biased_softplus() -> None:
    """tensordict's biased_softplus(1.0) (BenchMARL's 'biased_softplus_1.0'): 1 at 0, never
    below its min_val 0.01 (a floor of 1e-4 let the policy's noise vanish)."""
    from rlstash.agents.marl_nets import biased_softplus

    x = torch.tensor([-1e4, -20.0, 0.0, 3.0])
    offset = math.log(math.expm1(1.0 - 0.01))
    want = torch.nn.functional.softplus(x + offset) + 0.01
    torch.testing.assert_close(biased_softplus(x), want)
    assert float(biased_softplus(x)[0]) == pytest.approx(0.01)
    assert float(biased_softplus(x)[2]) == pytest.approx(1.0)


def test_shared_centralised_critic_without_ids_gives_every_agent_one_value() -> None:
    agent = MAPPO(A, D, bounds=(LOW, HIGH), config=MAPPOConfig(net_arch=(8,), agent_id=False))
    v = agent.values(torch.randn(B, A, D))
    assert v.shape == (B, A) and torch.equal(v, v[:, :1].expand(B, A))
    assert agent.critic.net[0].weight.shape[1] == A * D  # the concatenated observations


def _grads(agent: MAPPO, mb: dict[str, torch.Tensor]) -> torch.Tensor:
    agent.actor.zero_grad()
    agent.critic.zero_grad()
    out = agent.losses(mb)
    (out["policy_loss"] + out["value_loss"]).backward()
    return torch.cat([p.grad.flatten() for p in (*agent.actor.parameters(),
                                                 *agent.critic.parameters())])  # fmt: skip


@pytest.mark.parametrize("config_cls", [MAPPOConfig, IPPOConfig], ids=["mappo", "ippo"])
def test_masked_rows_contribute_nothing(config_cls: type) -> None:
    agent = MAPPO(A, D, bounds=(LOW, HIGH), config=config_cls(net_arch=(8,)))
    mb = _batch()
    other = {k: v.clone() for k, v in mb.items()}
    off = ~mb["mask"]
    g = torch.Generator().manual_seed(9)
    for name in ("action", "logp", "advantages", "returns"):  # garbage where the mask is off
        noise = torch.randn(other[name].shape, generator=g) * 100
        where = off.view(B, A, *([1] * (other[name].dim() - 2)))
        other[name] = torch.where(where, noise, other[name])
    if config_cls is IPPOConfig:  # a centralised critic sees every agent's obs by design
        other["obs"] = torch.where(off[..., None], torch.randn(B, A, D, generator=g), mb["obs"])
    a, b = agent.losses(mb), agent.losses(other)
    assert a["policy_loss"].item() == pytest.approx(b["policy_loss"].item(), rel=1e-6)
    assert a["value_loss"].item() == pytest.approx(b["value_loss"].item(), rel=1e-6)
    assert torch.allclose(_grads(agent, mb), _grads(agent, other), atol=1e-6)


def test_advantages_are_gae_per_agent_and_stop_at_each_agents_end() -> None:
    T, E = 6, 2
    agent = MAPPO(A, D, bounds=(LOW, HIGH), config=IPPOConfig(net_arch=(8,), gamma=0.9,
                                                              gae_lambda=0.8))  # fmt: skip
    r = MultiAgentRollout(T, E, A, D, (ACT,))
    g = torch.Generator().manual_seed(3)
    r.obs.copy_(torch.randn(r.obs.shape, generator=g))
    r.reward.copy_(torch.randn(r.reward.shape, generator=g))
    r.cont.fill_(True)
    r.terminated[2, 0, 1] = True  # agent 1 of env 0 terminates at t = 2
    r.cont[2, 0, 1] = False
    r.cont[4, 1] = False  # env 1 truncated at t = 4: bootstraps from the stored final value
    r.final_value[4, 1] = torch.tensor([1.0, 2.0, 3.0])
    adv, ret = agent.advantages(r)
    with torch.no_grad():
        v = agent.values(r.obs)  # [T + 1, E, A]
    for e in range(E):
        for i in range(A):
            nv = torch.where(r.cont[:, e, i], v[1:, e, i], r.final_value[:, e, i])
            want, _ = gae(r.reward[:, e, i, None], v[:T, e, i, None], nv[:, None],
                          r.terminated[:, e, i, None], r.cont[:, e, i, None], 0.9, 0.8)  # fmt: skip
            assert torch.allclose(adv[:, e, i], want[:, 0], atol=1e-6)
    # after agent 1's termination its earlier advantage does not see later rewards
    r.reward[3:, 0, 1] += 50.0
    assert torch.allclose(agent.advantages(r)[0][:3, 0, 1], adv[:3, 0, 1], atol=1e-6)
    # bootstrap_truncated=False: env 1's truncation at t = 4 ends like a termination (no
    # V(final) in its delta); every other advantage stays as it was
    agent.config.bootstrap_truncated = False
    cut, _ = agent.advantages(r)
    r_t = r.reward[4, 1] - v[4, 1]  # delta of the cut step, without gamma V(final)
    assert torch.allclose(cut[4, 1], r_t, atol=1e-6)
    assert not torch.allclose(adv[4, 1], r_t, atol=1e-3)  # with the bootstrap it differed
    same = torch.ones(T, E, dtype=torch.bool)
    same[:5, 1] = False  # env 1's steps up to the cut see it
    assert torch.allclose(cut[same], agent.advantages(r)[0][same], atol=1e-6)
    agent.config.bootstrap_truncated = True
    assert torch.allclose(cut[same], agent.advantages(r)[0][same], atol=1e-6)


def test_discrete_actions_respect_the_action_mask() -> None:
    agent = MAPPO(A, D, n_actions=5, config=MAPPOConfig(net_arch=(8,)))
    mask = torch.zeros(64, A, 5, dtype=torch.bool)
    mask[..., 3] = True
    mask[:, 0, 1] = True
    a, env_a, logp = agent.act(torch.randn(64, A, D), mask)
    assert torch.equal(a, env_a)
    assert mask.gather(-1, a[..., None]).all()
    assert (logp[:, 1:] == 0).all()  # one available action: probability 1


def test_an_update_on_a_rollout_moves_the_policy_and_keeps_its_metrics_on_device() -> None:
    T, E = 8, 4
    agent = MAPPO(A, D, bounds=(LOW, HIGH),
                  config=MAPPOConfig(net_arch=(16,), n_epochs=2, minibatch_size=8,
                                     learning_rate=1e-3))  # fmt: skip
    r = MultiAgentRollout(T, E, A, D, (ACT,))
    g = torch.Generator().manual_seed(5)
    for t in range(T):
        obs = torch.randn(E, A, D, generator=g)
        r.obs[t].copy_(obs)
        u, _, logp = agent.act(obs)
        r.put(t, u, logp, torch.ones(E, A, dtype=torch.bool), torch.randn(E, A, generator=g),
              torch.zeros(E, A, dtype=torch.bool), torch.zeros(E, A, dtype=torch.bool),
              torch.randn(E, A, D, generator=g))  # fmt: skip
    before = [p.detach().clone() for p in agent.actor.parameters()]
    metrics = agent.update(r)
    assert all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in metrics.values())
    assert all(torch.isfinite(v) for v in metrics.values())
    assert any(not torch.equal(a, b) for a, b in zip(before, agent.actor.parameters()))
    state = agent.state_dict()
    twin = MAPPO(A, D, bounds=(LOW, HIGH), config=MAPPOConfig(net_arch=(16,), seed=7))
    twin.load_state_dict(state)
    obs = torch.randn(2, A, D)
    assert torch.equal(twin.act(obs, deterministic=True)[1], agent.act(obs, deterministic=True)[1])


def test_shared_networks_are_nn_linear_draw_for_draw() -> None:
    """From one seed MAPPO's shared actor and critic are the nn.Linear MLPs built in their
    place (TorchRL's and BenchMARL's), weights and biases equal: the same seed starts both
    libraries from the same network (bench/marl_parity.py)."""
    cfg = MAPPOConfig(agent_id=False, compile=False, seed=7)
    agent = MAPPO(A, D, bounds=(LOW, HIGH), config=cfg)
    torch.manual_seed(7)
    torch_nets = [
        [torch.nn.Linear(i, o) for i, o in ((D, 256), (256, 256), (256, 2 * ACT))],
        [torch.nn.Linear(i, o) for i, o in ((A * D, 256), (256, 256), (256, 1))],
    ]
    for mine, theirs in zip((agent.actor, agent.critic), torch_nets):
        layers = [m for m in mine.net if not isinstance(m, torch.nn.Tanh)]
        for layer, linear in zip(layers, theirs, strict=True):
            assert torch.equal(layer.weight[0], linear.weight.T)
            assert torch.equal(layer.bias[0], linear.bias)
