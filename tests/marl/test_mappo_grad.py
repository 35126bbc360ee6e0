"""MAPPO/IPPO's written-out gradient (rlstash.agents.marl_grad) against the autograd update:
the same parameters, Adam state and metrics after several updates, for shared and per-agent
weights, MAPPO and IPPO, with and without agent ids, continuous (tanh-normal) and masked
discrete actions, masked agent rows, an entropy bonus and ReLU; the choice of path and its
statement in the agent's repr."""

from __future__ import annotations

import pytest
import torch

from rlstash.agents.mappo import MAPPO, METRICS, IPPOConfig, MAPPOConfig
from rlstash.agents.marl_grad import MAPPOGrad

A, D, ACT, N_ACT, S = 3, 4, 2, 5, 7
LOW, HIGH = torch.tensor([-1.0, -2.0]), torch.tensor([1.0, 2.0])
CASES = {  # config class, share_params, agent_id, discrete, extra settings
    "mappo-shared-noid-continuous": (MAPPOConfig, True, False, False, {}),
    "mappo-shared-id-continuous-entropy": (MAPPOConfig, True, True, False, {"ent_coef": 0.05}),
    "mappo-independent-continuous": (MAPPOConfig, False, True, False, {}),
    "mappo-shared-discrete-entropy": (MAPPOConfig, True, True, True, {"ent_coef": 0.05}),
    "mappo-independent-discrete-relu": (MAPPOConfig, False, True, True, {"activation": "relu"}),
    "mappo-state-noid-discrete": (MAPPOConfig, True, False, True, {"state": True}),
    "ippo-shared-continuous": (IPPOConfig, True, True, False, {}),
    "ippo-independent-discrete": (IPPOConfig, False, True, True, {"ent_coef": 0.01}),
    "ippo-shared-noid-continuous-one-layer": (IPPOConfig, True, False, False,
                                              {"net_arch": (12,)}),
}  # fmt: skip


def _agent(case: str, backward: str) -> MAPPO:
    config_cls, share, agent_id, discrete, extra = CASES[case]
    extra = dict(extra)
    state = extra.pop("state", False)
    settings = dict(
        net_arch=(16, 16),
        share_params=share,
        agent_id=agent_id,
        minibatch_size=8,
        n_epochs=2,
        learning_rate=3e-3,
        clip_range=0.05,
        seed=2,
        compile=False,
    )
    settings.update(extra)
    cfg = config_cls(**settings, backward=backward)
    kw = {"state_dim": S} if state else {}
    if discrete:
        return MAPPO(A, D, n_actions=N_ACT, config=cfg, **kw)
    return MAPPO(A, D, bounds=(LOW, HIGH), config=cfg, **kw)


def _data(agent: MAPPO, seed: int, rows: int = 22) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    data = {
        "obs": torch.randn(rows, A, D, generator=g),
        "advantages": torch.randn(rows, A, generator=g),
        "returns": torch.randn(rows, A, generator=g),
        "mask": torch.rand(rows, A, generator=g) > 0.2,
    }
    if agent.state_dim:
        data["state"] = torch.randn(rows, S, generator=g)
    if agent.n_actions is None:
        data["action"] = torch.randn(rows, A, ACT, generator=g)
    else:  # per-row masks, the taken action always available
        mask = torch.rand(rows, A, N_ACT, generator=g) < 0.6
        action = torch.randint(0, N_ACT, (rows, A), generator=g)
        data["action_mask"] = mask.scatter(-1, action[..., None], True)
        data["action"] = action
    with torch.no_grad():  # old log-probs near the current ones: some ratios clip, some not
        logp = agent.log_prob(data["obs"], data["action"], data.get("action_mask"))[0]
    data["logp"] = logp + 0.1 * torch.randn(rows, A, generator=g)
    return data


def _state(agent: MAPPO) -> list[torch.Tensor]:
    out = []
    for group in (agent.actor_opt, agent.critic_opt):
        state = group.opt.state[group.flat.param]
        out += [group.flat.param, state["exp_avg"], state["exp_avg_sq"], state["step"]]
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_written_update_equals_autograd(case: str) -> None:
    ref, fast = _agent(case, "autograd"), _agent(case, "auto")
    assert ref.written_grad() is None and isinstance(fast.written_grad(), MAPPOGrad)
    for i in range(2):
        data = _data(ref, i)
        out_r, out_f = ref.learn(data), fast.learn(data)
        for key in METRICS:
            assert float(out_f[key]) == pytest.approx(float(out_r[key]), rel=1e-4, abs=1e-5), key
    assert 0 < float(out_r["clip_fraction"]) < 1  # both branches of the clipped surrogate ran
    for got, want in zip(_state(fast), _state(ref), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=2e-5)


def test_saturated_units_and_a_near_deterministic_policy_equal_autograd() -> None:
    """Large weights: saturated tanh units, p ~ 1 over the available actions, and the
    softplus scale near its floor (the regime where a hand-written derivative goes wrong)."""
    for case, head in (("mappo-shared-discrete-entropy", 30.0),
                       ("mappo-shared-id-continuous-entropy", 4.0)):  # fmt: skip
        ref, fast = _agent(case, "autograd"), _agent(case, "written")
        for agent in (ref, fast):
            with torch.no_grad():
                agent.actor.net[-1].weight.mul_(head)
                agent.actor.net[0].weight.mul_(8.0)
        data = _data(ref, 0)
        out_r, out_f = ref.learn(data), fast.learn(data)
        assert all(torch.isfinite(out_r[key]) for key in METRICS)
        for key in METRICS:
            assert float(out_f[key]) == pytest.approx(float(out_r[key]), rel=1e-4, abs=1e-4), key
        for got, want in zip(_state(fast), _state(ref), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_masked_rows_contribute_nothing_to_the_written_gradient() -> None:
    """Anything (even inf) in the rows whose agent mask is off leaves the update unchanged."""
    a, b = (
        _agent("mappo-shared-noid-continuous", "written"),
        _agent("mappo-shared-noid-continuous", "written"),
    )
    data = _data(a, 0, rows=8)
    other = {k: v.clone() for k, v in data.items()}
    off = ~data["mask"]
    other["action"][off] = float("inf")
    other["logp"][off] = float("nan")
    other["advantages"][off] = 1e30
    other["returns"][off] = float("-inf")
    out_a, out_b = a.learn(data), b.learn(other)
    for key in METRICS:
        assert float(out_a[key]) == pytest.approx(float(out_b[key]), rel=1e-6), key
    for got, want in zip(_state(b), _state(a), strict=True):
        torch.testing.assert_close(got, want)


def test_the_path_is_chosen_and_stated() -> None:
    agent = _agent("mappo-shared-noid-continuous", "auto")
    assert agent.update_path == "written" and "update=written" in repr(agent)
    agent = _agent("mappo-shared-noid-continuous", "autograd")
    assert agent.update_path == "autograd (backward='autograd')"
    assert "update=autograd" in repr(agent)
    with pytest.raises(ValueError, match="backward: expected one of auto, written, autograd"):
        MAPPOConfig(backward="manual")


def test_networks_it_does_not_cover_keep_autograd() -> None:
    class Odd(torch.nn.Module):  # a critic that is no AgentMLP
        def __init__(self, critic):
            super().__init__()
            self.inner = critic

        def forward(self, x):
            return self.inner(x)

    agent = _agent("mappo-shared-noid-continuous", "auto")
    agent.critic = Odd(agent.critic)
    from rlstash.agents.marl_grad import unsupported

    assert unsupported(agent) == "a critic of type Odd"


def test_compile_auto_stays_on_the_written_gradient_on_cpu() -> None:
    agent = _agent("mappo-shared-noid-continuous", "auto")
    agent.config.compile = "auto"
    agent.compile_after_s = 0.0
    agent.learn(_data(agent, 0))
    assert agent.compile_seconds == 0 and agent._step_fn is None
