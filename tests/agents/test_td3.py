"""TD3: the target against a hand computation, clipped smoothing noise, delayed actor and target
updates, acting noise and warm-up, state round trip, and learning a small deterministic task."""

from __future__ import annotations

import pytest
import torch

from rlstash.agents.td3 import TD3, TD3Config


def _batch(b=16, obs_dim=3, act_dim=2, seed=0, low=-2.0, high=2.0):
    g = torch.Generator().manual_seed(seed)
    return {
        "obs": torch.randn(b, obs_dim, generator=g),
        "action": low + (high - low) * torch.rand(b, act_dim, generator=g),
        "reward": torch.randn(b, generator=g),
        "next_obs": torch.randn(b, obs_dim, generator=g),
        "terminated": torch.rand(b, generator=g) < 0.3,
        "discount": torch.full((b,), 0.9),
    }


def _agent(**kw):
    return TD3((3,), 2, low=-2.0, high=2.0, config=TD3Config(net_arch=(8, 5), **kw))


def _q_by_hand(critic, obs, action):
    """[2, B]: each member's MLP written out with its own weights (no EnsembleMLP call)."""
    out = []
    for m in range(2):
        x = torch.cat([obs, action], -1)
        layers = list(zip(critic.mlp.weights, critic.mlp.biases))
        for i, (w, b) in enumerate(layers):
            x = x @ w[m] + b[m]
            x = torch.relu(x) if i < len(layers) - 1 else x
        out.append(x.squeeze(-1))
    return torch.stack(out)


def test_td_target_equals_hand_computation_with_clipped_smoothing_noise():
    agent = _agent(target_noise_clip=0.3)
    batch = _batch()
    # perturb the targets so that they differ from the online nets
    for p in agent.nets["critic_target"].parameters():
        p.add_(0.1)
    noise = torch.linspace(-1.0, 1.0, 32).reshape(16, 2)  # partly beyond the clip
    with torch.no_grad():
        a_next = agent.nets["actor_target"](batch["next_obs"])
        a_next = (a_next + noise.clamp(-0.3, 0.3)).clamp(-1, 1)
        q = _q_by_hand(agent.nets["critic_target"], batch["next_obs"], a_next)
        want = batch["reward"] + 0.9 * torch.where(batch["terminated"], 0.0, q.min(0).values)
    torch.testing.assert_close(agent.td_target(batch, noise), want)
    # no discount field: gamma
    del batch["discount"]
    got = agent.td_target(batch, noise)
    want_gamma = batch["reward"] + 0.99 * torch.where(batch["terminated"], 0.0, q.min(0).values)
    torch.testing.assert_close(got, want_gamma)


def test_drawn_smoothing_noise_is_clipped():
    agent = _agent(target_policy_noise=1e6, target_noise_clip=0.25)
    batch = _batch()
    state = agent.learn_gen.get_state()
    eps = torch.randn((16, 2), generator=agent.learn_gen)  # what td_target will draw
    agent.learn_gen.set_state(state)
    drawn = agent.td_target(batch)
    saturated = 0.25 * torch.sign(eps)  # |1e6 eps| > 0.25 for all of them
    torch.testing.assert_close(drawn, agent.td_target(batch, saturated))
    assert not torch.allclose(drawn, agent.td_target(batch, torch.zeros(16, 2)))


def test_critic_loss_is_the_sum_of_the_critics_mse():
    agent = _agent()
    batch = _batch()
    agent.learn_gen.manual_seed(5)
    y = agent.td_target(batch)
    agent.learn_gen.manual_seed(5)
    action = batch["action"] / 2.0
    with torch.no_grad():
        q = _q_by_hand(agent.nets["critic"], batch["obs"], action)
    metrics = agent.update(batch)
    want = ((q[0] - y) ** 2).mean() + ((q[1] - y) ** 2).mean()
    torch.testing.assert_close(metrics["critic_loss"], want)
    torch.testing.assert_close(metrics["td_error"], (q - y).abs().mean(0))


def test_actor_and_targets_update_every_policy_delay_updates():
    agent = _agent(policy_delay=3, tau=0.5)
    names = ("actor", "actor_target", "critic", "critic_target")

    def snapshot():
        return {n: [p.detach().clone() for p in agent.nets[n].parameters()] for n in names}

    def changed(before, after):
        return {n for n in names if any(not torch.equal(a, b) for a, b in zip(before[n], after[n]))}

    for k in range(1, 7):
        before = snapshot()
        agent.update(_batch(seed=k))
        after = snapshot()
        if k % 3 == 0:
            assert changed(before, after) == set(names), k
            for t, p_old, p in zip(
                after["critic_target"], before["critic_target"], after["critic"]
            ):
                torch.testing.assert_close(t, 0.5 * p_old + 0.5 * p)
        else:
            assert changed(before, after) == {"critic"}, k
    assert agent.updates == 6


def test_actor_loss_reads_the_first_critic_only():
    """J(pi) = -mean Q_1(s, pi(s)) with the critic just updated and the actor before its step."""
    agent = _agent(policy_delay=1)
    batch = _batch()
    with torch.no_grad():
        a_pi = agent.nets["actor"](batch["obs"])
    metrics = agent.update(batch)
    with torch.no_grad():
        q = _q_by_hand(agent.nets["critic"], batch["obs"], a_pi)  # the critic after its step
    torch.testing.assert_close(metrics["actor_loss"], -q[0].mean())
    assert not torch.allclose(q[0].mean(), q[1].mean())  # Q_2 would give another loss


def test_act_warm_up_uniform_then_policy_plus_noise_within_bounds():
    agent = TD3((3,), 2, low=[-1.0, 0.0], high=[3.0, 10.0], config=TD3Config(
        net_arch=(8,), random_steps=500, exploration_noise=0.1))  # fmt: skip
    obs = torch.randn(500, 3)
    warm = agent.act(obs)  # env_steps 0 < 500: uniform over the box
    assert agent.env_steps == 500
    assert warm[:, 0].min() >= -1 and warm[:, 0].max() <= 3 and warm[:, 1].max() <= 10
    assert warm[:, 1].std() > 2.0  # uniform over [0, 10] has std 2.9; the policy would not
    det = agent.act(obs, deterministic=True)
    assert agent.env_steps == 500
    noisy = agent.act(obs)
    assert noisy[:, 0].min() >= -1 and noisy[:, 1].max() <= 10
    spread = (noisy - det) / torch.tensor([2.0, 5.0])  # back in [-1, 1] units
    assert 0.07 < float(spread[:, 0].std()) < 0.13  # N(0, 0.1^2), some of it clipped
    with pytest.raises(ValueError, match="mask"):
        agent.act(obs, mask=torch.ones(500, 2, dtype=torch.bool))


def test_state_dict_round_trip_continues_identically():
    a = _agent(policy_delay=2)
    for k in range(3):
        a.update(_batch(seed=k))
    a.act(torch.randn(4, 3))
    b = _agent(policy_delay=2, seed=7)
    b.load_state_dict(a.state_dict())
    assert b.updates == 3 and b.env_steps == 4
    ma, mb = a.update(_batch(seed=9)), b.update(_batch(seed=9))  # update 4: actor step too
    torch.testing.assert_close(ma["critic_loss"], mb["critic_loss"])
    torch.testing.assert_close(ma["actor_loss"], mb["actor_loss"])
    for name in a.nets:
        for p, q in zip(a.nets[name].parameters(), b.nets[name].parameters()):
            torch.testing.assert_close(p, q)
    torch.testing.assert_close(a.act(torch.ones(2, 3)), b.act(torch.ones(2, 3)))
    with pytest.raises(ValueError, match="td3"):
        b.load_state_dict({"algo": "sac"})


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="policy_delay"):
        TD3Config(policy_delay=0)
    with pytest.raises(ValueError, match="target_noise_clip"):
        TD3Config(target_noise_clip=-1.0)
    with pytest.raises(TypeError, match="TD3Config"):
        TD3((3,), 2, -1, 1, config=object())
    with pytest.raises(ValueError, match="low/high"):
        TD3((3,), 2, 1.0, -1.0)


def test_learns_a_deterministic_one_step_task():
    """Reward -(a - a*(s))^2 with a*(s) = 0.8 tanh(2 s_0 - s_1), episodes of one step: the
    critic learns Q(s, a) = r and the actor its argmax a*(s) (mean error 0.57 at the start)."""
    cfg = TD3Config(net_arch=(32, 32), learning_rate=1e-2, policy_delay=2, seed=3)
    agent = TD3((2,), 1, -1.0, 1.0, cfg)
    g = torch.Generator().manual_seed(1)

    def best(s):
        return 0.8 * torch.tanh(2 * s[:, :1] - s[:, 1:])

    def error():
        s = torch.randn(256, 2, generator=g)
        return float((agent.act(s, deterministic=True) - best(s)).abs().mean())

    before = error()
    for _ in range(400):
        s = torch.randn(64, 2, generator=g)
        a = 2 * torch.rand(64, 1, generator=g) - 1
        batch = {
            "obs": s,
            "action": a,
            "reward": -((a - best(s)) ** 2).squeeze(-1),
            "next_obs": s,
            "terminated": torch.ones(64, dtype=torch.bool),
        }
        agent.update(batch)
    assert before > 0.4 and error() < 0.15
