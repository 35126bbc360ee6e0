"""QMIX and VDN (rlstash.agents.qmix): the loss equals its hand computation on a small batch
(shared and independent parameters, with and without a global state, both team rewards), an
absent agent's rows never reach the loss, the QMIX mixer is monotonic, the compiled update
equals the eager one (``aot_eager``: Dynamo's tracing without generating C++), and acting never
picks an unavailable action."""

from __future__ import annotations

import pytest
import torch

from rlstash.agents.mixers import QMixer
from rlstash.agents.qmix import METRICS, QMIX, QMIXConfig, VDNConfig
from rlstash.storage.stream_agents import pack_bits, unpack_bits
from tests.agents.conftest import aot_eager, no_cuda  # noqa: F401 (fixtures: compile on CPU)

A, D, N, S, B = 3, 4, 5, 6, 7


@pytest.fixture(autouse=True)
def _one_thread():
    """Small updates on one thread (two threads on a loaded 2-core machine spin: ~20x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _agent(mixer: str, share: bool = True, state: bool = True, **kw) -> QMIX:
    cls = QMIXConfig if mixer == "qmix" else VDNConfig
    kw = {"compile": False, "learning_rate": 1e-2, **kw}
    cfg = cls(net_arch=(8,), share_params=share, mixing_embed_dim=4, seed=3, **kw)
    return QMIX(A, D, N, S if state else None, cfg)


def _batch(seed: int, state: bool = True) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    avail = torch.rand(B, A, N, generator=g) > 0.3
    avail[..., 0] = True
    batch = {
        "obs": torch.randn(B, A, D, generator=g),
        "next_obs": torch.randn(B, A, D, generator=g),
        "action": torch.randint(0, N, (B, A), generator=g),
        "reward": torch.randn(B, A, generator=g),
        "terminated": torch.rand(B, generator=g) > 0.7,
        "discount": torch.full((B,), 0.9),
        "obs/mask": torch.rand(B, A, generator=g) > 0.25,
        "next_obs/mask": torch.rand(B, A, generator=g) > 0.25,
        "next_obs/action_mask": pack_bits(avail),
    }
    batch["obs/mask"][0] = False  # a row where no agent acted: weight 0
    if state:
        batch["obs/state"] = torch.randn(B, S, generator=g)
        batch["next_obs/state"] = torch.randn(B, S, generator=g)
    return batch


def _q(agent: QMIX, net: str, obs: torch.Tensor, a: int) -> torch.Tensor:
    """Agent a's Q [B, n] by hand: its own weights, or the shared ones with its one-hot id."""
    layers = [m for m in agent.nets[net].net if isinstance(m, torch.nn.Module)]
    x = obs[:, a]
    if agent.config.share_params:
        x = torch.cat([x, torch.nn.functional.one_hot(torch.tensor(a), A).float().expand(B, A)], -1)
    k = 0 if agent.config.share_params else a
    for layer in layers:
        if hasattr(layer, "weight"):
            x = x @ layer.weight[k] + layer.bias[k]
        else:
            x = layer(x)
    return x


def _mix(agent: QMIX, net: str, q: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    if agent.config.mixer == "vdn":
        return q.sum(-1)
    m = agent.nets[net]
    out = []
    for b in range(B):  # one row at a time, as the paper writes it
        w1 = m.hyper_w1(g[b]).abs().reshape(A, -1)
        h = torch.nn.functional.elu(q[b] @ w1 + m.hyper_b1(g[b]))
        out.append(h @ m.hyper_w2(g[b]).abs() + m.value(g[b])[0])
    return torch.stack(out)


def _hand_loss(agent: QMIX, batch: dict[str, torch.Tensor], state: bool) -> torch.Tensor:
    m, nm = batch["obs/mask"], batch["next_obs/mask"]
    avail = unpack_bits(batch["next_obs/action_mask"], N)
    chosen, nxt = torch.zeros(B, A), torch.zeros(B, A)
    for a in range(A):
        q = _q(agent, "q", batch["obs"], a)
        chosen[:, a] = torch.where(m[:, a], q.gather(1, batch["action"][:, a : a + 1])[:, 0], 0)
        best = _q(agent, "q", batch["next_obs"], a).masked_fill(~avail[:, a], -1e30).argmax(1)
        qt = _q(agent, "q_target", batch["next_obs"], a).gather(1, best[:, None])[:, 0]
        nxt[:, a] = torch.where(nm[:, a], qt, 0.0)
    g = batch["obs/state"] if state else batch["obs"].reshape(B, -1)
    ng = batch["next_obs/state"] if state else batch["next_obs"].reshape(B, -1)
    r = (batch["reward"] * m).sum(1)
    if agent.config.team_reward == "mean":
        r = r / m.sum(1).clamp_min(1)
    y = r + 0.9 * (~batch["terminated"]).float() * _mix(agent, "mixer_target", nxt, ng).detach()
    err = (_mix(agent, "mixer", chosen, g) - y) ** 2
    valid = m.any(1)
    return (err * valid).sum() / valid.sum()


CASES = [("qmix", True, True, "mean"), ("qmix", False, False, "sum"),
         ("vdn", True, False, "mean"), ("vdn", False, True, "sum")]  # fmt: skip


@pytest.mark.parametrize(("mixer", "share", "state", "team"), CASES)
def test_loss_equals_the_hand_computation(mixer: str, share: bool, state: bool, team: str) -> None:
    agent = _agent(mixer, share, state, team_reward=team)
    with torch.no_grad():  # targets differ from the online nets (as after some updates)
        for p in agent.nets["q_target"].parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    batch = _batch(0, state)
    loss, _ = agent.loss(batch, agent.td_target(batch))
    torch.testing.assert_close(loss, _hand_loss(agent, batch, state), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("share", [True, False])
def test_an_absent_agents_rows_never_reach_the_loss(share: bool) -> None:
    agent = _agent("qmix", share)
    batch = _batch(1)
    batch["obs/mask"][:, 1] = False  # agent 1 never acts in these rows...
    batch["next_obs/mask"][:, 1] = False
    other = {k: v.clone() for k, v in batch.items()}
    other["obs"][:, 1] = 1e6  # ...so whatever its rows hold changes nothing
    other["next_obs"][:, 1] = float("nan")
    other["action"][:, 1] = N - 1
    other["reward"][:, 1] = float("inf")
    grads = []
    for b in (batch, other):
        agent.opt.flat.zero_grad()
        loss, _ = agent.loss(b, agent.td_target(b))
        loss.backward()
        grads.append((loss.detach(), agent.opt.flat.grad.clone()))
    assert torch.isfinite(grads[0][0])
    torch.testing.assert_close(grads[1], grads[0])
    if not share:  # agent 1's own network gets no gradient at all
        w = agent.nets["q"].net[0].weight
        start = agent.functional.layout["q"][0][1]
        per_agent = w[0].numel()
        assert not grads[0][1][start + per_agent : start + 2 * per_agent].any()


def test_qmix_mixer_is_monotonic_in_every_agent_q() -> None:
    torch.manual_seed(0)
    mixer = QMixer(A, S, 8)
    q = torch.randn(64, A, requires_grad=True)
    g = torch.randn(64, S)
    (grad,) = torch.autograd.grad(mixer(q, g).sum(), q)
    assert (grad >= 0).all() and (grad > 0).any()


def test_compiled_update_equals_eager(aot_eager) -> None:  # noqa: F811
    # one case (a compilation takes ~10 s): QMIX's step holds VDN's (the mixer is a module)
    eager, comp = _agent("qmix"), _agent("qmix", compile=True)
    for i in range(2):
        out_e, out_c = eager.update(_batch(i)), comp.update(_batch(i))
        for key in METRICS:
            assert out_c[key].item() == pytest.approx(out_e[key].item(), rel=1e-4, abs=1e-5), key
    for name in ("q", "mixer", "q_target", "mixer_target"):  # targets moved in the graph too
        for p_c, p_e in zip(comp.nets[name].parameters(), eager.nets[name].parameters()):
            torch.testing.assert_close(p_c, p_e, rtol=1e-4, atol=1e-5)
    assert comp.compile_seconds > 0 and eager.compile_seconds == 0


def test_acting_respects_action_masks_and_the_update_moves_the_targets() -> None:
    agent = _agent("qmix", exploration_initial_eps=1.0, exploration_final_eps=1.0)
    avail = torch.zeros(50, A, N, dtype=torch.bool)
    avail[..., 2] = True
    avail[:, 0, 4] = True
    for deterministic in (False, True):
        a, env_a, _ = agent.act(torch.randn(50, A, D), avail, deterministic)
        assert a is env_a and avail.gather(-1, a[..., None]).all()
    before = [p.clone() for p in agent.nets["q_target"].parameters()]
    out = agent.update(_batch(3))
    assert set(METRICS) <= set(out) and agent.updates == 1
    assert any((p != b).any() for p, b in zip(agent.nets["q_target"].parameters(), before))
    state = agent.state_dict()
    twin = _agent("qmix")
    twin.load_state_dict(state)
    torch.testing.assert_close(twin.update(_batch(4))["loss"], agent.update(_batch(4))["loss"])


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="team_reward"):
        QMIXConfig(team_reward="max")
    with pytest.raises(ValueError, match="mixer"):
        QMIXConfig(mixer="qtran")


@pytest.mark.parametrize("mixer", ["qmix", "vdn"])
def test_a_one_step_team_game_is_learned(mixer: str) -> None:
    # each agent's reward is its action index except agent 0, whose best action (4) is masked
    # out: the greedy joint action is (3, 4, 4), found through the team's value alone
    agent = _agent(mixer, learning_rate=3e-2)
    g = torch.Generator().manual_seed(0)
    avail = torch.ones(64, A, N, dtype=torch.bool)
    avail[:, 0, 4] = False
    for _ in range(150):
        action = torch.randint(0, N, (64, A), generator=g)
        action[:, 0] = action[:, 0].clamp(max=3)
        batch = {
            "obs": torch.zeros(64, A, D), "next_obs": torch.zeros(64, A, D), "action": action,
            "reward": action.float(), "terminated": torch.ones(64, dtype=torch.bool),
            "obs/mask": torch.ones(64, A, dtype=torch.bool),
            "next_obs/mask": torch.ones(64, A, dtype=torch.bool),
            "obs/state": torch.zeros(64, S), "next_obs/state": torch.zeros(64, S),
        }  # fmt: skip
        agent.update(batch)
    greedy, _, _ = agent.act(torch.zeros(1, A, D), avail[:1], deterministic=True)
    assert greedy.tolist() == [[3, 4, 4]]
