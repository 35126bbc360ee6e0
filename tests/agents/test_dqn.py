"""DQN: hand-computed targets, double-DQN, target updates, masks, a bandit it must fit."""

import io

import pytest
import torch

from rlstash.agents import base as agent_base
from rlstash.agents.actions import pack_mask
from rlstash.agents.dqn import DQN, DQNConfig
from rlstash.agents.nets import NatureCNN, polyak_update
from rlstash.agents.schedules import LinearSchedule, epsilon_schedule


def _linear_dqn(**cfg):
    """obs [B, 1], Q(s, a) = W[a] s + b[a] (net_arch=()), 2 actions."""
    agent = DQN((1,), 2, DQNConfig(net_arch=(), **cfg))
    with torch.no_grad():
        agent.nets["q"].head.weight.copy_(
            torch.tensor([[1.0], [-1.0]])
        )  # online argmax: a=0 iff s'>0
        agent.nets["q"].head.bias_.zero_()
        agent.nets["q_target"].head.weight.copy_(torch.tensor([[2.0], [3.0]]))
        agent.nets["q_target"].head.bias_.copy_(torch.tensor([0.0, 10.0]))
    return agent


def _batch(next_obs, reward, terminated, **extra):
    b = len(reward)
    batch = {
        "obs": torch.zeros(b, 1),
        "action": torch.zeros(b, dtype=torch.int64),
        "reward": torch.tensor(reward),
        "next_obs": torch.tensor(next_obs).reshape(b, 1),
        "terminated": torch.tensor(terminated),
    }
    batch.update(extra)
    return batch


def test_td_target_table_double_dqn_nstep_terminated():
    agent = _linear_dqn(gamma=0.9)
    # s'   online argmax   Q_target(s', a*)   (a max over the target would give 3 s' + 10)
    # 1.0  a=0             2.0
    # -1.0 a=1             -3 + 10 = 7.0
    # 2.0  a=0             4.0
    batch = _batch([1.0, -1.0, 2.0, 1.0], [1.0, 0.5, -1.0, 2.0], [False, False, False, True])
    y = agent.td_target(batch)
    torch.testing.assert_close(
        y, torch.tensor([1 + 0.9 * 2.0, 0.5 + 0.9 * 7.0, -1 + 0.9 * 4.0, 2.0])
    )
    # n-step: the batch's discount (gamma^n) replaces gamma, per row
    batch["discount"] = torch.tensor([0.81, 0.729, 1.0, 0.5])
    y = agent.td_target(batch)
    torch.testing.assert_close(
        y, torch.tensor([1 + 0.81 * 2.0, 0.5 + 0.729 * 7.0, -1 + 1.0 * 4.0, 2.0])
    )


def test_td_target_honours_next_action_mask():
    agent = _linear_dqn(gamma=0.5)
    mask = torch.tensor([[False, True], [True, False], [False, False]])
    for m in (mask, pack_mask(mask)):
        batch = _batch([1.0, -1.0, 1.0], [0.0, 0.0, 1.0], [False, False, False], next_action_mask=m)
        # row 0: a=0 masked -> a=1: 3 + 10; row 1: a=1 masked -> a=0: -2; row 2: nothing -> 0
        torch.testing.assert_close(agent.td_target(batch), torch.tensor([6.5, -1.0, 1.0]))


def test_update_huber_weights_td_error_and_gradient_clipping():
    agent = _linear_dqn(gamma=0.9, learning_rate=1e-3, max_grad_norm=10.0)
    batch = _batch([1.0, -1.0, 2.0], [1.0, 0.5, -1.0], [False, False, True])
    batch["obs"] = torch.tensor([[0.5], [2.0], [-3.0]])
    batch["action"] = torch.tensor([0, 1, 1])
    batch["weight"] = torch.tensor([1.0, 0.5, 2.0])
    y = agent.td_target(batch)
    q = torch.tensor([0.5, -2.0, 3.0])  # W[a] s
    huber = torch.nn.functional.smooth_l1_loss(q, y, reduction="none")
    metrics = agent.update(batch)
    assert metrics["loss"] == pytest.approx(float((huber * batch["weight"]).mean()), rel=1e-6)
    torch.testing.assert_close(metrics["td_error"], (q - y).abs())
    assert not metrics["td_error"].requires_grad
    assert metrics["grad_norm"] > 0


def test_hard_target_update_every_n_updates_and_polyak_math():
    agent = DQN((3,), 4, DQNConfig(target_update_interval=3, learning_rate=1e-2))
    batch = {
        "obs": torch.randn(8, 3),
        "action": torch.randint(0, 4, (8,)),
        "reward": torch.randn(8),
        "next_obs": torch.randn(8, 3),
        "terminated": torch.zeros(8, dtype=torch.bool),
    }
    online, target = agent.nets["q"], agent.nets["q_target"]
    for i in range(1, 4):
        agent.update(batch)
        same = all(torch.equal(a, b) for a, b in zip(online.parameters(), target.parameters()))
        assert same == (i == 3)
    a, b = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    old = [p.detach().clone() for p in a.parameters()]
    polyak_update(a, b, 0.25)
    for p, p_old, s in zip(a.parameters(), old, b.parameters()):
        torch.testing.assert_close(p, 0.75 * p_old + 0.25 * s)


def test_dqn_fits_a_two_state_bandit_in_200_updates():
    # 2 states (one-hot obs) x 3 arms, every step terminal: Q(s, a) must become r(s, a)
    rewards = torch.tensor([[0.0, 1.0, -1.0], [0.5, -0.5, 2.0]])
    agent = DQN((2,), 3, DQNConfig(learning_rate=1e-2, net_arch=(32,), target_update_interval=1))
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        s = torch.randint(0, 2, (32,), generator=gen)
        a = torch.randint(0, 3, (32,), generator=gen)
        obs = torch.nn.functional.one_hot(s, 2).float()  # a test-side state encoding
        agent.update(
            {
                "obs": obs,
                "action": a,
                "reward": rewards[s, a],
                "next_obs": obs,
                "terminated": torch.ones(32, dtype=torch.bool),
            }
        )
    q = agent.nets["q"](torch.eye(2))
    torch.testing.assert_close(q, rewards, atol=0.1, rtol=0)
    assert agent.act(torch.eye(2), deterministic=True).tolist() == [1, 2]


def test_act_epsilon_greedy_masks_and_counters():
    agent = DQN((3,), 10, DQNConfig(exploration_fraction=0.5, total_steps=100))
    obs = torch.randn(64, 3)
    greedy = agent.act(obs, deterministic=True)
    assert greedy.dtype == torch.int64 and greedy.shape == (64,) and agent.env_steps == 0
    torch.testing.assert_close(greedy, agent.nets["q"](obs).argmax(1))
    mask = torch.rand(64, 10, generator=torch.Generator().manual_seed(0)) < 0.3
    mask[:, 3] = True
    for m in (mask, pack_mask(mask)):
        for _ in range(5):
            a = agent.act(obs, mask=m)  # epsilon ~ 1: mostly random, never masked
            assert mask[torch.arange(64), a].all()
        a = agent.act(obs, deterministic=True, mask=m)
        ref = agent.nets["q"](obs).masked_fill(~mask, float("-inf")).argmax(1)
        assert torch.equal(a, ref)
    assert agent.env_steps == 640 and agent.epsilon == pytest.approx(0.05)
    mask[7] = False
    with pytest.raises(ValueError, match="row 7 has no available action"):
        agent.act(obs, mask=mask)


def test_schedules():
    s = epsilon_schedule(1.0, 0.04, 0.16, 50_000)
    assert (
        s.duration == 8000 and s(0) == 1.0 and s(4000) == pytest.approx(0.52) and s(10**6) == 0.04
    )
    assert LinearSchedule(1.0, 0.0, 0)(0) == 0.0
    with pytest.raises(ValueError, match="exploration_fraction"):
        epsilon_schedule(1.0, 0.0, 1.5, 10)
    with pytest.raises(ValueError, match="step"):
        s(-1)


def test_state_dict_round_trip_resumes_identically():
    cfg = DQNConfig(learning_rate=1e-2, seed=3)
    a, b = DQN((3,), 5, cfg), DQN((3,), 5, DQNConfig(seed=4))
    batch = {
        "obs": torch.randn(8, 3),
        "action": torch.randint(0, 5, (8,)),
        "reward": torch.randn(8),
        "next_obs": torch.randn(8, 3),
        "terminated": torch.zeros(8, dtype=torch.bool),
    }
    a.update(batch)
    a.act(torch.randn(4, 3))
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    b.load_state_dict(torch.load(buf))
    assert b.updates == 1 and b.env_steps == 4
    obs = torch.randn(16, 3)
    assert torch.equal(a.act(obs), b.act(obs))  # same weights, same generator state
    ma, mb = a.update(batch), b.update(batch)  # same optimizer state
    assert ma["loss"] == mb["loss"]
    with pytest.raises(ValueError, match="expected a state dict of a dqn agent"):
        b.load_state_dict({"algo": "sac"})


def test_separate_actor_copy_moves_weights_only_explicitly(monkeypatch):
    monkeypatch.setattr(
        agent_base.AgentBase, "_shares_actor", lambda self: False
    )  # force an acting copy
    agent = DQN((3,), 4, DQNConfig(learning_rate=0.1))
    assert agent.actor["q"] is not agent.nets["q"]
    batch = {
        "obs": torch.randn(8, 3),
        "action": torch.randint(0, 4, (8,)),
        "reward": torch.randn(8) * 10,
        "next_obs": torch.randn(8, 3),
        "terminated": torch.ones(8, dtype=torch.bool),
    }
    before = agent.actor["q"].head.weight.clone()
    agent.update(batch)
    assert torch.equal(agent.actor["q"].head.weight, before)  # unchanged until moved
    agent.sync_actor()
    assert torch.equal(agent.actor["q"].head.weight, agent.nets["q"].head.weight)
    other = DQN((3,), 4, DQNConfig(seed=9))
    other.load_policy_state_dict(agent.policy_state_dict())
    obs = torch.randn(5, 3)
    assert torch.equal(other.act(obs, deterministic=True), agent.act(obs, deterministic=True))


def test_batch_validation_errors_name_the_field():
    agent = DQN((3,), 4)
    good = {
        "obs": torch.randn(2, 3),
        "action": torch.tensor([0, 3]),
        "reward": torch.zeros(2),
        "next_obs": torch.randn(2, 3),
        "terminated": torch.zeros(2, dtype=torch.bool),
    }
    cases = [
        ({"action": None}, KeyError, None),
        ({"action": torch.tensor([0, 3], dtype=torch.int32)}, TypeError, "int64 action indices"),
        ({"action": torch.tensor([0, 4])}, ValueError, r"indices in \[0, 4\), got 4"),
        ({"obs": torch.randn(2, 4)}, ValueError, r"batch\['obs'\]: expected shape \[2, 3\]"),
        ({"terminated": torch.zeros(2)}, TypeError, "terminated"),
        ({"reward": torch.zeros(2, dtype=torch.int64)}, TypeError, "reward"),
        ({"weight": torch.ones(3)}, ValueError, "weight"),
        ({"next_action_mask": torch.ones(2, 4, dtype=torch.int64)}, TypeError, "next_action_mask"),
        ({"reward": torch.empty(2, device="meta")}, ValueError, "learner device cpu"),
    ]
    for change, exc, match in cases:
        batch = dict(good, **change)
        if change.get("action", 0) is None:
            del batch["action"]
            exc, match = ValueError, "missing field 'action'"
        with pytest.raises(exc, match=match):
            agent.update(batch)
    assert agent.updates == 0
    with pytest.raises(ValueError, match=r"obs: expected shape \[N, 3\]"):
        agent.act(torch.randn(2, 5))
    with pytest.raises(ValueError, match="n_actions"):
        DQN((3,), 0)
    with pytest.raises(ValueError, match="gamma"):
        DQNConfig(gamma=1.5)
    with pytest.raises(ValueError, match="action_head"):
        DQN((3,), 4, DQNConfig(action_head="onehot"))


def test_nature_cnn_on_uint8_pixels():
    cnn = NatureCNN((4, 84, 84))
    x = torch.randint(0, 256, (2, 4, 84, 84), dtype=torch.uint8)
    torch.testing.assert_close(cnn(x), cnn(x.float() / 255.0))
    agent = DQN((4, 84, 84), 6, DQNConfig(net_arch=(7,)))
    assert isinstance(agent.nets["q"].encoder.features, NatureCNN)
    assert agent.act(x).shape == (2,)
    agent.update(
        {
            "obs": x,
            "action": torch.tensor([0, 5]),
            "reward": torch.zeros(2),
            "next_obs": x,
            "terminated": torch.zeros(2, dtype=torch.bool),
        }
    )


def test_help_covers_every_setting():
    cfg = DQNConfig(seed=5)
    assert set(DQNConfig.help()) == set(cfg.to_dict()) and all(DQNConfig.help().values())


def test_config_holds_learner_settings_only():
    """The loop's settings (replay size, batch, n-step, update schedule) are TrainConfig's."""
    names = set(DQNConfig.help())
    loop = {"batch_size", "buffer_size", "learning_starts", "train_freq", "gradient_steps"}
    assert not names & (loop | {"n_steps"})


def test_wrong_type_names_the_field():
    with pytest.raises(TypeError, match="learning_rate: expected a float, got 'abc'"):
        DQNConfig(learning_rate="abc")
    with pytest.raises(TypeError, match="net_arch"):
        DQNConfig(net_arch=("64",))


def test_agents_follow_the_protocol_and_move_devices_explicitly():
    from rlstash.agents import SAC, Agent, DiscreteSAC

    agents = [DQN((3,), 4), SAC((3,), 2, low=-1, high=1), DiscreteSAC((3,), 4)]
    for agent in agents:
        assert isinstance(agent, Agent)
        assert agent.device == torch.device("cpu") and agent.act_device == torch.device("cpu")
    agent = agents[0]
    batch = {
        "obs": torch.randn(8, 3),
        "action": torch.randint(0, 4, (8,)),
        "reward": torch.randn(8),
        "next_obs": torch.randn(8, 3),
        "terminated": torch.zeros(8, dtype=torch.bool),
    }
    agent.update(batch)
    group = agent.groups["q"]  # one flat vector and its Adam state
    steps = float(group.opt.state[group.flat.param]["step"])
    assert agent.to("cpu", act_device="cpu") is agent
    group = agent.groups["q"]  # re-seated by the move
    assert float(group.opt.state[group.flat.param]["step"]) == steps == 1.0
    weight = agent.nets["q"].head.weight  # still a view of the (new) flat vector
    assert weight.untyped_storage().data_ptr() == group.flat.param.untyped_storage().data_ptr()
    agent.update(batch)
    assert agent.updates == 2


@pytest.mark.parametrize(
    "field, value",
    [
        ("learning_rate", 0.0),
        ("tau", 0.0),
        ("net_arch", (64, 0)),
        ("target_update_interval", 0),
        ("exploration_final_eps", 1.5),
        ("max_grad_norm", 0.0),
        ("action_chunk", -1),
    ],
)
def test_config_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        DQNConfig(**{field: value})
