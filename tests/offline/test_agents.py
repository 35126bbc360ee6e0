"""IQL and TD3+BC (issue 26 point 4): their losses equal hand-computed values, the agents'
updates use them, and the compiled update equals the eager one."""

from __future__ import annotations

import math

import pytest
import torch

from rlstash.agents.base import read_metrics
from rlstash.agents.iql import IQL, IQLConfig, awr_actor_loss, expectile_loss
from rlstash.agents.sac import squashed_log_prob
from rlstash.agents.td3_bc import TD3BC, TD3BCConfig, td3_bc_actor_loss
from tests.agents.test_compiled import SMALL, _continuous, _run, assert_same_agents


def test_expectile_loss_by_hand():
    diff = torch.tensor([-1.0, 2.0, 0.5, -3.0])
    # weights |0.7 - 1(d < 0)|: 0.3, 0.7, 0.7, 0.3
    want = (0.3 * 1 + 0.7 * 4 + 0.7 * 0.25 + 0.3 * 9) / 4
    assert expectile_loss(diff, 0.7).item() == pytest.approx(want)
    assert expectile_loss(diff, 0.5).item() == pytest.approx(0.5 * (1 + 4 + 0.25 + 9) / 4)


def test_advantage_weighted_actor_loss_by_hand():
    logp = torch.tensor([-1.0, -2.0, 0.5], requires_grad=True)
    adv = torch.tensor([0.0, 1.0, 10.0])
    # weights exp(3 adv) clipped at 100: 1, e^3, 100
    want = -(1 * -1.0 + math.exp(3) * -2.0 + 100 * 0.5) / 3
    loss = awr_actor_loss(logp, adv, 3.0, 100.0)
    assert loss.item() == pytest.approx(want, rel=1e-6)
    loss.backward()  # the weights take no gradient: d/dlogp = -w / B
    torch.testing.assert_close(logp.grad, -torch.tensor([1.0, math.exp(3), 100.0]) / 3)


def test_td3_bc_actor_loss_by_hand():
    q = torch.tensor([2.0, -4.0])
    pi = torch.tensor([[0.5, 0.0], [1.0, -1.0]])
    a = torch.tensor([[0.0, 0.0], [1.0, 0.0]])
    lam = 2.5 / ((2 + 4) / 2)  # alpha / mean|Q|
    bc = (0.25 + 0 + 0 + 1) / 4
    loss, got_lam = td3_bc_actor_loss(q, pi, a, 2.5)
    assert got_lam.item() == pytest.approx(lam)
    assert loss.item() == pytest.approx(-lam * (2 - 4) / 2 + bc)


def _iql(compile_: bool = False) -> IQL:
    cfg = IQLConfig(net_arch=SMALL, expectile=0.8, temperature=2.0, compile=compile_)
    return IQL((3,), 2, -2.0, 2.0, cfg)


def test_iql_update_takes_its_losses_at_the_same_parameters():
    agent, batch = _iql(), _continuous(0)
    nets = agent.nets
    a = batch["action"] / 2.0  # the Box [-2, 2] -> [-1, 1]
    with torch.no_grad():
        q_t = nets["critic_target"](batch["obs"], a).amin(0)
        v = nets["value"](batch["obs"])
        v_next = nets["value"](batch["next_obs"]).masked_fill(batch["terminated"], 0.0)
        y = batch["reward"] + 0.99 * v_next
        q = nets["critic"](batch["obs"], a)
        mean, log_std = nets["actor"](batch["obs"])
        logp = squashed_log_prob(torch.atanh(a.clamp(-1 + 1e-6, 1 - 1e-6)), mean, log_std)
    diff = q_t - v
    want_v = (torch.where(diff < 0, 0.2, 0.8) * diff**2).mean()
    want_pi = -(torch.exp(2.0 * diff).clamp(max=100.0) * logp).mean()
    want_q = (batch["weight"] * ((q - y) ** 2).sum(0)).mean()
    out = read_metrics(agent.update(batch))
    assert out["value_loss"] == pytest.approx(want_v.item(), rel=1e-5)
    assert out["actor_loss"] == pytest.approx(want_pi.item(), rel=1e-5)
    assert out["critic_loss"] == pytest.approx(want_q.item(), rel=1e-5)
    act = agent.act(batch["obs"], deterministic=True)
    assert act.shape == (16, 2) and bool((act.abs() <= 2).all())


def test_td3_bc_actor_step_uses_the_normalised_q():
    agent = TD3BC((3,), 2, -2.0, 2.0, TD3BCConfig(net_arch=SMALL, alpha=1.5, compile=False))
    batch = _continuous(1)
    with torch.no_grad():
        pi = agent.nets["actor"](batch["obs"])
        q = agent.nets["critic"](batch["obs"], pi, member=0)
    want = -(1.5 / q.abs().mean()) * q.mean() + ((pi - batch["action"] / 2.0) ** 2).mean()
    loss, _ = agent._actor_loss(batch)
    assert loss.item() == pytest.approx(want.item(), rel=1e-5)
    agent.update(batch)
    out = read_metrics(agent.update(batch))  # update 2: the delayed actor step ran
    assert out["actor_loss"] == pytest.approx(want.item(), rel=1e-5)
    with pytest.raises(ValueError, match="alpha: expected > 0"):
        TD3BCConfig(alpha=0.0)
    with pytest.raises(ValueError, match="expectile: expected a value in"):
        IQLConfig(expectile=1.0)


def test_compiled_iql_update_equals_eager(aot_eager):
    """IQL's own compiled step (TD3+BC compiles TD3's steps around its actor loss; CI time
    keeps this to one agent)."""
    eager, comp, out_e, out_c = _run(_iql, _continuous, n=3)
    assert comp.compile_seconds > 0 and eager.compile_seconds == 0
    assert_same_agents(eager, comp)
    for key, value in read_metrics(out_e).items():
        assert read_metrics(out_c)[key] == pytest.approx(value, rel=1e-4, abs=1e-5), key
