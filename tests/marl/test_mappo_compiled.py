"""MAPPO/IPPO's fast update (rlstash.agents.mappo): the compiled step (torch.compile of the
losses, their torch.func gradient and Adam in place) equals the eager update, and the eager
update equals the plain loop (one randperm per pass, minibatch gathers, autograd,
torch.optim.Adam) it replaced. The compiled tests use the ``aot_eager`` backend (the same
Dynamo/AOTAutograd tracing as inductor, without generating C++)."""

from __future__ import annotations

import pytest
import torch

from rlstash.agents.mappo import MAPPO, METRICS, IPPOConfig, MAPPOConfig
from tests.agents.conftest import aot_eager, no_cuda  # noqa: F401 (fixtures: compile on CPU)

A, D, ACT, N_ACT = 3, 4, 2, 5
LOW, HIGH = torch.tensor([-1.0, -2.0]), torch.tensor([1.0, 2.0])
CASES = {  # config class, share_params, agent_id, discrete
    "mappo-shared-continuous": (MAPPOConfig, True, True, False),
    "mappo-independent-discrete": (MAPPOConfig, False, True, True),
    "mappo-shared-noid-continuous": (MAPPOConfig, True, False, False),
    "ippo-shared-discrete": (IPPOConfig, True, True, True),
    "ippo-independent-continuous": (IPPOConfig, False, True, False),
}
# compiled cases (each compilation takes ~10 s, so two): continuous and discrete heads, shared
# and independent networks; 22 rows, minibatch 8, give minibatches of 8, 8 and 6 (two graphs),
# 16 rows one. IPPO differs from MAPPO only in the critic's input (the losses are shared, and
# every case's eager update equals the plain loop below)
COMPILED = {"mappo-shared-noid-continuous": 22, "mappo-independent-discrete": 16}


def _agent(case: str, **overrides) -> MAPPO:
    config_cls, share, agent_id, discrete = CASES[case]
    cfg = config_cls(net_arch=(16, 16), share_params=share, agent_id=agent_id, minibatch_size=8,
                     n_epochs=3, learning_rate=3e-3, seed=2, **overrides)  # fmt: skip
    if discrete:
        return MAPPO(A, D, n_actions=N_ACT, config=cfg)
    return MAPPO(A, D, bounds=(LOW, HIGH), config=cfg)


def _data(agent: MAPPO, seed: int, rows: int = 22) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    data = {
        "obs": torch.randn(rows, A, D, generator=g),
        "logp": torch.randn(rows, A, generator=g) - 1.0,
        "advantages": torch.randn(rows, A, generator=g),
        "returns": torch.randn(rows, A, generator=g),
        "mask": torch.rand(rows, A, generator=g) > 0.2,
    }
    if agent.n_actions is None:
        data["action"] = torch.randn(rows, A, ACT, generator=g)
    else:
        data["action"] = torch.randint(0, 3, (rows, A), generator=g)
        data["action_mask"] = torch.arange(N_ACT).expand(rows, A, N_ACT) < 3
    return data


def _params(agent: MAPPO) -> list[torch.Tensor]:
    out = []
    for group in (agent.actor_opt, agent.critic_opt):
        state = group.opt.state[group.flat.param]
        out += [group.flat.param, state["exp_avg"], state["exp_avg_sq"], state["step"]]
    return out


@pytest.mark.parametrize("case", sorted(COMPILED))
def test_compiled_update_equals_eager(case: str, aot_eager) -> None:  # noqa: F811
    torch._dynamo.utils.counters.clear()
    eager, comp = _agent(case, compile=False), _agent(case, compile=True)
    for i in range(2):
        rows = COMPILED[case]
        out_e, out_c = eager.learn(_data(eager, i, rows)), comp.learn(_data(comp, i, rows))
        for key in METRICS:
            assert out_c[key].item() == pytest.approx(out_e[key].item(), rel=1e-4, abs=1e-5), key
    for p_c, p_e in zip(_params(comp), _params(eager), strict=True):
        torch.testing.assert_close(p_c, p_e, rtol=1e-4, atol=1e-5)
    assert comp.compile_seconds > 0 and eager.compile_seconds == 0
    # one graph per minibatch size, none for anything else that changed
    sizes = 2 if COMPILED[case] % 8 else 1
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == sizes
    minibatches = -(-COMPILED[case] // 8)
    assert _params(comp)[3].item() == 2 * 3 * minibatches  # 2 updates x 3 passes x minibatches


def test_compile_auto_switches_after_the_eager_time(aot_eager) -> None:  # noqa: F811
    agent = _agent("mappo-shared-continuous", backward="autograd")  # (written: never compiles)
    assert agent.config.compile == "auto"
    agent.compile_after_s = float("inf")
    agent.learn(_data(agent, 0, 16))
    assert agent.compile_seconds == 0 and agent.eager_update_s > 0
    agent.compile_after_s = 0.0
    agent.learn(_data(agent, 1, 16))
    assert agent.compile_seconds > 0


def test_compile_setting_is_checked() -> None:
    with pytest.raises(Exception, match="compile"):
        MAPPOConfig(compile="sometimes")


def _reference_learn(agent: MAPPO, data: dict[str, torch.Tensor]) -> torch.Tensor:
    """The update loop before the fast path: a randperm per pass, a gather per minibatch,
    autograd, clipping and torch.optim.Adam's step; returns the last pass's mean metrics."""
    cfg = agent.config
    rows = data["obs"].shape[0]
    for _ in range(cfg.n_epochs):
        stats = []
        perm = torch.randperm(rows, generator=agent.gen)
        for idx in perm.split(cfg.minibatch_size):
            out = agent.losses({k: v[idx] for k, v in data.items()})
            agent.actor_opt.flat.zero_grad()
            agent.critic_opt.flat.zero_grad()
            (out["policy_loss"] + out["value_loss"]).backward()
            a = agent.actor_opt.flat.clip_grad_norm_(cfg.max_grad_norm)
            c = agent.critic_opt.flat.clip_grad_norm_(cfg.max_grad_norm)
            agent.actor_opt.opt.step()
            agent.critic_opt.opt.step()
            stats.append(torch.stack([out["policy_loss"], out["value_loss"], out["approx_kl"],
                                      out["clip_fraction"], a, c]).detach())  # fmt: skip
    return torch.stack(stats).mean(0)


@pytest.mark.parametrize("case", sorted(CASES))
def test_eager_update_equals_the_plain_loop(case: str) -> None:
    fast, plain = _agent(case, compile=False), _agent(case, compile=False)
    for i in range(2):
        out = fast.learn(_data(fast, i))
        ref = _reference_learn(plain, _data(plain, i))
        torch.testing.assert_close(torch.stack([out[k] for k in METRICS]), ref)
    for p_f, p_p in zip(_params(fast), _params(plain), strict=True):
        torch.testing.assert_close(p_f, p_p)
