"""Discrete SAC: exact chunked expectations, masks, and 100,000 actions without one-hot."""

import copy

import pytest
import torch

from rlstash.agents.actions import ActionMask, pack_mask
from rlstash.agents.base import read_metrics
from rlstash.agents.dqn import DQN, DQNConfig
from rlstash.agents.sac_discrete import DiscreteSAC, DiscreteSACConfig

N = 13


def _batch(b=8, n=N, obs_dim=4, seed=0, masks=None):
    g = torch.Generator().manual_seed(seed)
    batch = {
        "obs": torch.randn(b, obs_dim, generator=g),
        "action": torch.randint(0, n, (b,), generator=g),
        "reward": torch.randn(b, generator=g),
        "next_obs": torch.randn(b, obs_dim, generator=g),
        "terminated": torch.rand(b, generator=g) < 0.25,
        "discount": torch.rand(b, generator=g),
    }
    if masks is not None:
        batch["action_mask"], batch["next_action_mask"] = masks
    return batch


def _mask(b=8, n=N, seed=1, empty_row=None):
    m = torch.rand(b, n, generator=torch.Generator().manual_seed(seed)) < 0.5
    m[:, 2] = True
    if empty_row is not None:
        m[empty_row] = False
    return m


def _reference_target(agent, batch, alpha, next_mask):
    nets = agent.nets
    with torch.no_grad():
        logits = nets["actor"](batch["next_obs"])  # [B, n]
        q = torch.minimum(
            nets["q1_target"](batch["next_obs"]), nets["q2_target"](batch["next_obs"])
        )
        avail = torch.ones_like(logits, dtype=torch.bool) if next_mask is None else next_mask
        logp = torch.log_softmax(logits.masked_fill(~avail, float("-inf")), 1)
        v = torch.where(avail, logp.exp() * (q - alpha * logp), torch.zeros_like(q)).sum(1)
        v = v.masked_fill(batch["terminated"] | ~avail.any(1), 0.0)
        return batch["reward"] + batch["discount"] * v


@pytest.mark.parametrize("form", [None, "bool", "packed"])
def test_td_target_equals_unchunked_reference(form):
    agent = DiscreteSAC((4,), N, DiscreteSACConfig(net_arch=(16,), action_chunk=4))
    m = _mask(empty_row=5)
    masks = None if form is None else ((m, m) if form == "bool" else (pack_mask(m), pack_mask(m)))
    batch = _batch(masks=masks)
    y = agent.td_target(batch, 0.7)
    torch.testing.assert_close(y, _reference_target(agent, batch, 0.7, None if form is None else m))


def test_chunked_update_equals_unchunked_update_and_critic_loss_is_a_gather():
    m = _mask()
    batch = _batch(masks=(pack_mask(m), m))
    small = DiscreteSAC((4,), N, DiscreteSACConfig(net_arch=(16,), action_chunk=3, seed=1))
    whole = DiscreteSAC((4,), N, DiscreteSACConfig(net_arch=(16,), action_chunk=64, seed=1))
    y = whole.td_target(batch, whole.alpha)
    with torch.no_grad():
        rows = torch.arange(8)
        q1 = whole.nets["q1"](batch["obs"])[rows, batch["action"]]
        q2 = whole.nets["q2"](batch["obs"])[rows, batch["action"]]
    want_critic = float((0.5 * ((q1 - y) ** 2 + (q2 - y) ** 2)).mean())
    m_small, m_whole = read_metrics(small.update(batch)), read_metrics(whole.update(batch))
    assert m_whole["critic_loss"] == pytest.approx(want_critic, rel=1e-5)
    for key in ("critic_loss", "actor_loss", "alpha_loss", "entropy", "target_entropy"):
        assert m_small[key] == pytest.approx(m_whole[key], rel=1e-5, abs=1e-6), key
    for name in small.nets:
        for (pname, p), q in zip(
            small.nets[name].named_parameters(), whole.nets[name].parameters()
        ):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=f"{name}.{pname}")


def test_entropy_target_and_temperature_direction():
    agent = DiscreteSAC((4,), N, DiscreteSACConfig(net_arch=(16,), target_entropy_ratio=0.5))
    m = _mask()
    target = agent.entropy_target(ActionMask(pack_mask(m), N), 8)
    torch.testing.assert_close(target, 0.5 * torch.log(m.sum(1).float()))
    torch.testing.assert_close(
        agent.entropy_target(None, 2), torch.full((2,), 0.5 * torch.log(torch.tensor(13.0)).item())
    )
    for fixed, direction in ((-5.0, -1), (50.0, 1)):
        agent = DiscreteSAC((4,), N, DiscreteSACConfig(net_arch=(16,), target_entropy=fixed))
        agent.update(_batch())
        assert (agent.alpha - 1.0) * direction > 0


def test_act_never_chooses_masked_actions():
    agent = DiscreteSAC((4,), N, DiscreteSACConfig(net_arch=(16,), action_chunk=5))
    obs = torch.randn(300, 4)
    m = _mask(300, seed=3)
    for mask in (m, pack_mask(m)):
        for deterministic in (False, True):
            a = agent.act(obs, deterministic=deterministic, mask=mask)
            assert a.dtype == torch.int64 and m[torch.arange(300), a].all()
    logits = agent.nets["actor"](obs).masked_fill(~m, float("-inf"))
    assert torch.equal(agent.act(obs, deterministic=True, mask=m), logits.argmax(1))
    assert agent.env_steps == 600
    m[4] = False
    with pytest.raises(ValueError, match="row 4 has no available action"):
        agent.act(obs, mask=m)


def test_fixed_action_features_are_held_once():
    features = torch.randn(N, 6)
    agent = DiscreteSAC(
        (4,),
        N,
        DiscreteSACConfig(net_arch=(16,), action_head="embedding", learn_action_embeddings=False),
        action_features=features,
    )
    tables = {
        id(agent.nets[k].head.table()) for k in ("actor", "q1", "q2", "q1_target", "q2_target")
    }
    assert len(tables) == 1
    assert all(
        p.dim() == 0 or p.shape[0] != N for net in agent.nets.values() for p in net.parameters()
    )
    metrics = agent.update(_batch(masks=(_mask(), _mask(seed=2))))
    assert torch.isfinite(metrics["td_error"]).all()
    clone = copy.deepcopy(agent.nets["q1"])
    assert clone.head.table() is agent.nets["q1"].head.table()


def _no_one_hot(*args, **kwargs):
    raise AssertionError("one_hot was called")


@pytest.mark.parametrize("packed", [False, True])
def test_100k_actions_train_without_one_hot(monkeypatch, packed):
    monkeypatch.setattr(torch.nn.functional, "one_hot", _no_one_hot)
    monkeypatch.setattr(torch, "one_hot", _no_one_hot, raising=False)
    n, b = 100_000, 32
    g = torch.Generator().manual_seed(0)
    m = torch.rand(b, n, generator=g) < 0.5
    m[:, 7] = True
    mask = pack_mask(m) if packed else m
    batch = _batch(b=b, n=n, obs_dim=8, masks=(mask, mask))
    batch["action"] = torch.where(m[torch.arange(b), batch["action"]], batch["action"], 7)
    sac = DiscreteSAC((8,), n, DiscreteSACConfig(net_arch=(16,), action_chunk=16_384))
    for _ in range(3):
        metrics = sac.update(batch)
        assert torch.isfinite(metrics["td_error"]).all() and metrics["entropy"] > 0
    a = sac.act(batch["obs"], mask=mask)
    assert m[torch.arange(b), a].all()
    dqn = DQN((8,), n, DQNConfig(net_arch=(16,), action_chunk=16_384))
    for _ in range(3):
        dqn.update(batch)
    assert m[torch.arange(b), dqn.act(batch["obs"], mask=mask)].all()


def test_state_dict_round_trip_and_bad_config():
    a = DiscreteSAC((4,), N, DiscreteSACConfig(net_arch=(16,), seed=1))
    b = DiscreteSAC((4,), N, DiscreteSACConfig(net_arch=(16,), seed=2))
    a.update(_batch())
    b.load_state_dict(a.state_dict())
    obs = torch.randn(5, 4)
    assert torch.equal(a.act(obs), b.act(obs))
    assert a.update(_batch(seed=3))["actor_loss"] == b.update(_batch(seed=3))["actor_loss"]
    with pytest.raises(ValueError, match="target_entropy_ratio"):
        DiscreteSACConfig(target_entropy_ratio=2.0)
    with pytest.raises(ValueError, match="action_chunk"):
        DiscreteSACConfig(action_chunk=0)
    with pytest.raises(ValueError, match="learn_action_embeddings"):
        DiscreteSAC(
            (4,), N, DiscreteSACConfig(action_head="embedding", learn_action_embeddings=False)
        )
