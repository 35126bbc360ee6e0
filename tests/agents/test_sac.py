"""Continuous SAC: the squashed log-prob, action scaling, targets, temperature, Polyak."""

import math

import numpy as np
import pytest
import torch

from rlstash.agents.sac import SAC, SACConfig, squashed_log_prob


def _batch(b=16, obs_dim=3, act_dim=2, seed=0, low=-2.0, high=2.0):
    g = torch.Generator().manual_seed(seed)
    return {
        "obs": torch.randn(b, obs_dim, generator=g),
        "action": low + (high - low) * torch.rand(b, act_dim, generator=g),
        "reward": torch.randn(b, generator=g),
        "next_obs": torch.randn(b, obs_dim, generator=g),
        "terminated": torch.rand(b, generator=g) < 0.3,
    }


def test_squashed_log_prob_matches_brute_force_formula():
    g = torch.Generator().manual_seed(0)
    mean = torch.randn(50, 3, generator=g, dtype=torch.float64)
    log_std = torch.randn(50, 3, generator=g, dtype=torch.float64).clamp(-2, 1)
    u = mean + log_std.exp() * torch.randn(50, 3, generator=g, dtype=torch.float64)
    normal = torch.distributions.Normal(mean, log_std.exp()).log_prob(u)
    brute = (normal - torch.log(1 - torch.tanh(u) ** 2)).sum(-1)  # change of variables, naive
    torch.testing.assert_close(squashed_log_prob(u, mean, log_std), brute)
    # stays finite where the naive form overflows (tanh(u) rounds to 1)
    big = torch.tensor([[30.0]], dtype=torch.float64)
    assert torch.isinf(torch.log(1 - torch.tanh(big) ** 2)).all()
    assert torch.isfinite(
        squashed_log_prob(big, torch.zeros_like(big), torch.zeros_like(big))
    ).all()


def test_squashed_density_integrates_to_one():
    # 1-D: p(a) = exp(log pi(atanh a)) must integrate to 1 over (-1, 1)
    a = torch.linspace(-1 + 1e-9, 1 - 1e-9, 400_001, dtype=torch.float64)
    u = torch.atanh(a)
    mean, log_std = torch.full_like(u, 0.7), torch.full_like(u, math.log(0.8))
    p = squashed_log_prob(u[:, None], mean[:, None], log_std[:, None]).exp()
    assert float(torch.trapezoid(p, a)) == pytest.approx(1.0, abs=1e-4)


def test_act_scales_to_asymmetric_bounds():
    agent = SAC((3,), 2, low=[-1.0, 0.0], high=[3.0, 10.0])
    obs = torch.randn(256, 3)
    a = agent.act(obs)
    assert a.shape == (256, 2) and a.dtype == torch.float32 and agent.env_steps == 256
    assert (
        (a[:, 0] >= -1).all()
        and (a[:, 0] <= 3).all()
        and (a[:, 1] >= 0).all()
        and (a[:, 1] <= 10).all()
    )
    mean, _ = agent.nets["actor"](obs)
    det = agent.act(obs, deterministic=True)
    torch.testing.assert_close(
        det, torch.tensor([1.0, 5.0]) + torch.tensor([2.0, 5.0]) * torch.tanh(mean)
    )
    assert agent.env_steps == 256


class _Const(torch.nn.Module):
    """A twin critic answering Q_1 = values[0], Q_2 = values[1] everywhere: [2, B]."""

    def __init__(self, *values):
        super().__init__()
        self.values = torch.tensor(values)

    def forward(self, obs, action, detach=False):
        return self.values[:, None].expand(2, obs.shape[0])


def test_td_target_table():
    agent = SAC((3,), 2, low=-1, high=1, config=SACConfig(gamma=0.9))
    agent.nets["critic_target"] = _Const(4.0, 3.0)
    agent.nets["actor"].sample = lambda obs, gen, deterministic=False: (
        torch.zeros(obs.shape[0], 2),
        torch.full((obs.shape[0],), -2.0),
    )
    batch = _batch(3)
    batch["reward"] = torch.tensor([1.0, 0.0, 2.0])
    batch["terminated"] = torch.tensor([False, False, True])
    # soft value: min(4, 3) - alpha * (-2) with alpha = 0.5 -> 4.0
    y = agent.td_target(batch, torch.tensor(0.5))
    torch.testing.assert_close(y, torch.tensor([1 + 0.9 * 4.0, 0.9 * 4.0, 2.0]))
    batch["discount"] = torch.tensor([0.5, 0.25, 0.5])
    torch.testing.assert_close(
        agent.td_target(batch, torch.tensor(0.5)), torch.tensor([3.0, 1.0, 2.0])
    )


@pytest.mark.parametrize("target, direction", [(-100.0, -1), (100.0, 1)])
def test_temperature_moves_toward_the_entropy_target(target, direction):
    agent = SAC((3,), 2, low=-2, high=2, config=SACConfig(target_entropy=target))
    agent.update(_batch())
    assert np.sign(agent.alpha - 1.0) == direction


def test_update_polyak_targets_and_metrics():
    agent = SAC((3,), 2, low=-2, high=2, config=SACConfig(tau=0.1))
    old = [p.clone() for p in agent.nets["critic_target"].parameters()]
    metrics = agent.update(_batch())
    for p_t, p_old, p in zip(
        agent.nets["critic_target"].parameters(), old, agent.nets["critic"].parameters()
    ):
        torch.testing.assert_close(p_t, 0.9 * p_old + 0.1 * p)
    assert metrics["td_error"].shape == (16,) and (metrics["td_error"] >= 0).all()
    scalars = {k: v for k, v in metrics.items() if k != "td_error"}
    assert all(  # on the device, unread (grad norms: 0.0 without clipping)
        (isinstance(v, torch.Tensor) and v.dim() == 0) or v == 0.0 for v in scalars.values()
    )
    # the critics see actions rescaled to [-1, 1]: a batch of bound actions is accepted
    agent.update(dict(_batch(), action=torch.full((16, 2), 2.0)))


def test_state_dict_round_trip():
    a = SAC((3,), 2, low=-2, high=2, config=SACConfig(seed=1))
    b = SAC((3,), 2, low=-2, high=2, config=SACConfig(seed=2))
    a.update(_batch())
    b.load_state_dict(a.state_dict())
    obs = torch.randn(4, 3)
    assert torch.equal(a.act(obs), b.act(obs))
    assert a.update(_batch(seed=1))["critic_loss"] == b.update(_batch(seed=1))["critic_loss"]


def test_bad_input():
    with pytest.raises(ValueError, match="low/high: expected low < high"):
        SAC((3,), 2, low=[0, 1], high=[1, 1])
    with pytest.raises(ValueError, match="high: expected 2 finite bounds"):
        SAC((3,), 2, low=-1, high=[1, np.inf])
    agent = SAC((3,), 2, low=-1, high=1)
    with pytest.raises(TypeError, match="float continuous actions"):
        agent.update(dict(_batch(), action=torch.zeros(16, 2, dtype=torch.int64)))
    with pytest.raises(ValueError, match=r"batch\['action'\]: expected shape \[16, 2\]"):
        agent.update(dict(_batch(), action=torch.zeros(16)))
    with pytest.raises(ValueError, match="mask"):
        agent.act(torch.zeros(1, 3), mask=torch.ones(1, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="log_std_min"):
        SACConfig(log_std_min=3.0)


def test_twin_critic_members_are_independent_mlps():
    """Each member of the batched twin critic equals a plain MLP with its weights, and the
    detached call passes gradients to the action but none to the weights."""
    from rlstash.agents.sac import TwinCritic

    critic = TwinCritic((3,), 2, (8, 5))
    obs, act = torch.randn(6, 3), torch.randn(6, 2, requires_grad=True)
    q = critic(obs, act)  # [2, 6]
    x = torch.cat([obs, act], -1)
    for m in range(2):
        h = x
        for i, (w, b) in enumerate(zip(critic.mlp.weights, critic.mlp.biases)):
            h = h @ w[m] + b[m, 0]
            h = torch.relu(h) if i < 2 else h
        torch.testing.assert_close(q[m], h.squeeze(-1))
    assert not torch.equal(q[0], q[1])  # independently initialized
    critic(obs, act, detach=True).sum().backward()
    assert act.grad is not None and act.grad.abs().sum() > 0
    assert all(p.grad is None for p in critic.parameters())
    critic(obs, act).sum().backward()
    assert all(p.grad is not None for p in critic.parameters())


def test_twin_critic_pixels_get_one_encoder_each():
    from rlstash.agents.sac import TwinCritic

    critic = TwinCritic((4, 84, 84), 2, (16,))
    assert not critic.shared and len(critic.features) == 2
    obs = torch.randint(0, 255, (3, 4, 84, 84), dtype=torch.uint8)
    act = torch.randn(3, 2, requires_grad=True)
    critic(obs, act, detach=True).sum().backward()
    assert act.grad is not None and all(p.grad is None for p in critic.parameters())
    assert all(p.requires_grad for p in critic.parameters())  # restored after the detached call


def test_exploration_action_is_rsample_s_without_its_log_prob():
    # act skips log pi (unused when acting): its actions stay rsample's, bit for bit
    agent = SAC((5,), 3, low=[-2.0, 0.0, -1.0], high=[3.0, 10.0, 1.0])
    obs, eps = torch.randn(64, 5), torch.randn(64, 3)
    a, _ = agent.actor["actor"].rsample(obs, eps)
    assert torch.equal(agent._act(obs, eps), agent.act_center + agent.act_scale * a)
