"""PPO: the clipped-surrogate math against a dense reference, target-KL early stop, masks,
the chunked huge action head against a dense one, normalisation round trips, Gaussian
log-probabilities, checkpoints, and a short CartPole run that must learn."""

import copy
import io
import math

import numpy as np
import pytest
import torch

from rlstash.agents.actions import ActionMask, LinearActionHead, pack_mask
from rlstash.agents.categorical import log_prob_entropy
from rlstash.agents.normalize import RunningMeanStd
from rlstash.agents.ppo import PPO, PPOConfig
from rlstash.spec import Spec
from rlstash.storage.rollout import RolloutStorage

N_ACT = 5


def _rollout(T=6, N=4, obs_dim=3, n=N_ACT, seed=0, mask=None, continuous=0):
    g = torch.Generator().manual_seed(seed)
    fields = {"obs": ((obs_dim,), "float32")}
    if continuous:
        fields["action"] = ((continuous,), "float32")
        action = torch.randn(T, N, continuous, generator=g)
    else:
        fields["action"] = ((), "int64")
        action = torch.randint(0, n, (T, N), generator=g)
    if mask is not None:
        fields["action_mask"] = (tuple(mask.shape[2:]), mask.dtype)
    ro = RolloutStorage(Spec(fields), T, N)
    batch = {
        "obs": torch.randn(T, N, obs_dim, generator=g),
        "action": action,
        "reward": torch.randn(T, N, generator=g),
        "terminated": torch.rand(T, N, generator=g) < 0.15,
        "truncated": torch.rand(T, N, generator=g) < 0.1,
    }
    if mask is not None:
        batch["action_mask"] = mask
    ro.add(batch, torch.randn(N, obs_dim, generator=g))
    return ro


def _perturb(agent, scale=0.3, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in agent.nets["policy"].parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))


def _reference_losses(agent, data, idx, clip):
    """Dense, independent formulas (torch.distributions) for one minibatch."""
    net, cfg = agent.nets["policy"], agent.config
    x, a = data["obs"][idx], data["action"][idx]
    dist = torch.distributions.Categorical(logits=net.head(net.actor_trunk(x)))
    ratio = torch.exp(dist.log_prob(a) - data["logp"][idx])
    adv = data["advantages"][idx]
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    pg = torch.max(-adv * ratio, -adv * torch.clamp(ratio, 1 - clip, 1 + clip)).mean()
    v = net.value(x)
    v_loss = ((v - data["returns"][idx]) ** 2).mean()
    if cfg.clip_range_vf is not None:
        old = data["values"][idx]
        vc = old + torch.clamp(v - old, -cfg.clip_range_vf, cfg.clip_range_vf)
        v_loss = torch.max((v - data["returns"][idx]) ** 2, (vc - data["returns"][idx]) ** 2).mean()
    clip_frac = ((ratio - 1).abs() > clip).float().mean()
    kl = ((ratio - 1) - torch.log(ratio)).mean()
    return pg, v_loss, dist.entropy().mean(), kl, clip_frac


@pytest.mark.parametrize("clip_vf", [None, 0.1])
@pytest.mark.parametrize("all_valid", [False, True])  # weighted rows / the unweighted fast path
def test_minibatch_losses_equal_a_dense_reference(clip_vf, all_valid):
    agent = PPO(
        (3,), N_ACT, config=PPOConfig(net_arch=(8,), clip_range_vf=clip_vf, minibatch_size=24)
    )
    ro = _rollout()
    ro.valid.fill_(True)  # every row weighs 1, as in the reference
    ro.all_valid = all_valid
    data = agent.prepare(ro)
    _perturb(agent)  # ratios away from 1, many clipped
    idx = torch.arange(24)
    with torch.no_grad():
        want = _reference_losses(agent, data, idx, 0.2)
    stats = agent._minibatch(data, None if all_valid else idx, 0.2)
    for got, ref, name in zip(stats[:5], want, ("pg", "v", "entropy", "kl", "clipfrac")):
        assert got.item() == pytest.approx(ref.item(), rel=1e-4, abs=1e-6), name
    assert 0 < want[4] < 1  # some ratios clipped, some not


def test_clipped_rows_give_no_policy_gradient():
    agent = PPO((3,), N_ACT, config=PPOConfig(net_arch=(8,), minibatch_size=24, vf_coef=0.0))
    data = agent.prepare(_rollout())
    _perturb(agent, scale=2.0)
    net = agent.nets["policy"]
    x, a, adv = data["obs"], data["action"], data["advantages"]
    logp, _ = agent.log_prob_entropy(x, a)
    ratio = torch.exp(logp - data["logp"])
    # rows where the clipped term is the max (and constant): ratio beyond the clip range in the
    # direction the advantage favours
    clipped = ((adv > 0) & (ratio > 1.2)) | ((adv < 0) & (ratio < 0.8))
    assert clipped.any() and (~clipped).any()
    u = net.embed(x).detach().requires_grad_(True)
    lp, _ = log_prob_entropy(net.head, u, a, agent.config.action_chunk)
    r = torch.exp(lp - data["logp"])
    torch.max(-adv * r, -adv * r.clamp(0.8, 1.2)).sum().backward()
    assert torch.all(u.grad[clipped] == 0)
    assert torch.any(u.grad[~clipped] != 0)


def test_target_kl_stops_the_epochs_early():
    ro = _rollout(T=16, N=4)
    base = {"net_arch": (16,), "minibatch_size": 16, "n_epochs": 8, "learning_rate": 0.05}
    free = PPO((3,), N_ACT, config=PPOConfig(**base))
    assert free.update(ro)["epochs"] == 8
    capped = PPO((3,), N_ACT, config=PPOConfig(target_kl=1e-6, **base))
    out = capped.update(ro)
    assert out["epochs"] == 1
    assert capped.updates == 4  # one epoch of 4 minibatches
    assert out["approx_kl"].item() > 1e-6


def test_metrics_stay_tensors_and_annealing_follows_env_steps():
    agent = PPO((3,), N_ACT, config=PPOConfig(net_arch=(8,), minibatch_size=8, n_epochs=2,
                                              anneal_lr=True, anneal_clip_range=True,
                                              total_steps=100))  # fmt: skip
    agent.env_steps = 25
    out = agent.update(_rollout())
    for key in ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "grad_norm"):
        assert isinstance(out[key], torch.Tensor) and out[key].dim() == 0
    assert out["learning_rate"] == pytest.approx(3e-4 * 0.75)
    assert out["clip_range"] == pytest.approx(0.2 * 0.75)
    assert agent.optims["policy"].param_groups[0]["lr"] == pytest.approx(3e-4 * 0.75)


@pytest.mark.parametrize("packed", [False, True])
def test_masks_are_honoured_in_act_and_update(packed):
    agent = PPO((3,), N_ACT, config=PPOConfig(net_arch=(8,), minibatch_size=24, action_chunk=2))
    g = torch.Generator().manual_seed(3)
    m = torch.rand(6, 4, N_ACT, generator=g) < 0.5
    m[..., 1] = True
    obs = torch.randn(24, 3, generator=g)
    flat = m.reshape(24, N_ACT)
    arg = pack_mask(flat) if packed else flat
    for det in (False, True):
        for _ in range(5):
            a = agent.act(obs, deterministic=det, mask=arg)
            assert flat[torch.arange(24), a].all()
    stored = pack_mask(flat).reshape(6, 4, -1) if packed else m
    ro = _rollout(mask=stored)
    ro.action.copy_(agent.act(ro.flat("obs"), mask=arg).reshape(6, 4))
    data = agent.prepare(ro)
    net = agent.nets["policy"]
    with torch.no_grad():
        logits = net.head(net.actor_trunk(data["obs"])).masked_fill(~flat, float("-inf"))
        want = torch.log_softmax(logits, 1).gather(1, data["action"][:, None]).squeeze(1)
    torch.testing.assert_close(data["logp"], want)
    agent.update(ro)  # runs with masks through the chunked path (chunk 2 < 5 actions)
    empty = flat.clone()
    empty[3] = False
    with pytest.raises(ValueError, match="row 3 has no available action"):
        agent.act(obs, mask=empty)


@pytest.mark.parametrize("use_mask", [False, True])
def test_chunked_head_equals_dense_head_values_and_gradients(use_mask):
    g = torch.Generator().manual_seed(0)
    head = LinearActionHead(6, 37)
    u = torch.randn(9, 6, generator=g)
    a = torch.randint(0, 37, (9,), generator=g)
    mask = None
    if use_mask:
        m = torch.rand(9, 37, generator=g) < 0.4
        m[torch.arange(9), a] = True
        mask = ActionMask(m, 37)
    w_lp, w_h = torch.randn(9, generator=g), torch.randn(9, generator=g)
    results = []
    for chunk in (5, 37):  # 5 < 37: the chunked autograd function; 37: dense log-softmax
        head.zero_grad()
        uu = u.clone().requires_grad_(True)
        logp, ent = log_prob_entropy(head, uu, a, chunk, mask)
        ((w_lp * logp).sum() + (w_h * ent).sum()).backward()
        results.append((logp.detach(), ent.detach(), uu.grad, head.weight.grad.clone(),
                        head.bias_.grad.clone()))  # fmt: skip
    for chunked, dense in zip(*results):
        torch.testing.assert_close(chunked, dense, rtol=1e-5, atol=1e-6)


def test_hundred_thousand_actions_update_without_dense_scores():
    n = 100_000
    cfg = PPOConfig(net_arch=(16,), minibatch_size=32, n_epochs=1, action_chunk=4096)
    agent = PPO((3,), n, config=cfg)
    ro = _rollout(T=8, N=4, n=n)
    before = agent.nets["policy"].head.weight.detach().clone()
    out = agent.update(ro)
    assert math.isfinite(out["policy_loss"].item())
    assert not torch.equal(before, agent.nets["policy"].head.weight)
    a = agent.act(torch.randn(7, 3))
    assert a.shape == (7,) and a.dtype == torch.int64 and int(a.max()) < n


def test_running_mean_std_equals_numpy_over_all_batches():
    rng = np.random.default_rng(0)
    rms = RunningMeanStd((3,), epsilon=0.0)
    parts = [rng.normal(2.0, 3.0, size=(k, 3)) for k in (5, 17, 1, 40)]
    for p in parts:
        rms.update(torch.from_numpy(p))
    data = np.concatenate(parts)
    np.testing.assert_allclose(rms.mean.numpy(), data.mean(0), rtol=1e-10)
    np.testing.assert_allclose(rms.var.numpy(), data.var(0), rtol=1e-10)
    weighted = RunningMeanStd((3,), epsilon=0.0)
    w = torch.tensor([1.0] * 5 + [0.0] * 17 + [1.0] + [0.0] * 40)
    weighted.update(torch.from_numpy(data), w)
    keep = data[w.numpy() > 0]
    np.testing.assert_allclose(weighted.mean.numpy(), keep.mean(0), rtol=1e-10)


def test_normalisation_statistics_round_trip_through_a_checkpoint():
    cfg = PPOConfig(net_arch=(8,), minibatch_size=12, n_epochs=1, norm_obs=True, norm_reward=True)
    agent = PPO((3,), N_ACT, config=cfg)
    for seed in range(3):
        agent.update(_rollout(seed=seed))
    rms = agent.nets["obs_norm"].rms
    assert rms.count.item() > 1 and not torch.allclose(
        rms.mean, torch.zeros(3, dtype=torch.float64)
    )
    assert agent.nets["reward_scaler"].ret.shape == (4,)
    buf = io.BytesIO()
    torch.save(agent.state_dict(), buf)
    buf.seek(0)
    other = PPO((3,), N_ACT, config=copy.deepcopy(cfg))
    other.load_state_dict(torch.load(buf, weights_only=False))
    for name in ("obs_norm", "reward_scaler"):
        for (k, a), (_, b) in zip(agent.nets[name].state_dict().items(),
                                  other.nets[name].state_dict().items()):  # fmt: skip
            torch.testing.assert_close(a, b, msg=f"{name}.{k}")
    obs = torch.randn(10, 3) * 5
    torch.testing.assert_close(
        agent.act(obs, deterministic=True), other.act(obs, deterministic=True)
    )
    torch.testing.assert_close(agent.act(obs), other.act(obs))  # the sampling generator too


@pytest.mark.parametrize("bound", ["clip", "tanh"])
def test_gaussian_log_prob_entropy_and_bounds(bound):
    low, high = np.array([-1.0, 0.0], np.float32), np.array([1.0, 4.0], np.float32)
    cfg = PPOConfig(net_arch=(8,), bound=bound, log_std_init=-0.5)
    agent = PPO((3,), bounds=(low, high), config=cfg)
    net = agent.nets["policy"]
    obs = torch.randn(50, 3)
    a = agent.act(obs)
    det = agent.act(obs, deterministic=True)
    lo, hi = torch.from_numpy(low), torch.from_numpy(high)
    assert ((det >= lo) & (det <= hi)).all()
    logp, ent = net.log_prob_entropy(obs, a)
    normal = torch.distributions.Normal(net.mean(obs), net.log_std.exp())
    if bound == "clip":
        assert ((a < lo) | (a > hi)).any()  # unclipped samples: the env clips (ClipAction)
        torch.testing.assert_close(logp, normal.log_prob(a).sum(-1))
        torch.testing.assert_close(ent, normal.entropy().sum(-1))
    else:
        assert ((a >= lo) & (a <= hi)).all()
        half = (hi - lo) / 2
        y = (a - lo) / half - 1
        x = torch.atanh(y.clamp(-1 + 1e-6, 1 - 1e-6))
        want = normal.log_prob(x).sum(-1) - torch.log((1 - y**2) * half).sum(-1)
        torch.testing.assert_close(logp, want, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(ent, -logp)
    out = agent.update(_rollout(continuous=2))
    assert math.isfinite(out["policy_loss"].item())


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"clip_range": 0.0}, "clip_range: expected > 0"),
        ({"gae_lambda": 1.5}, r"gae_lambda: expected a value in \[0, 1\]"),
        ({"target_kl": -1.0}, "target_kl: expected > 0 or None"),
        ({"net_arch": (0,)}, "net_arch"),
        ({"ent_coef": -0.1}, "ent_coef: expected >= 0"),
    ],
)
def test_config_errors_name_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PPOConfig(**kwargs)


def test_constructor_and_update_errors():
    with pytest.raises(ValueError, match="exactly one of n_actions"):
        PPO((3,))
    with pytest.raises(ValueError, match="bound: 'tanh' needs finite"):
        PPO((3,), bounds=(np.array([-np.inf]), np.array([np.inf])), config=PPOConfig(bound="tanh"))
    agent = PPO((3,), N_ACT, config=PPOConfig(net_arch=(8,)))
    empty = RolloutStorage(Spec({"obs": ((3,), "float32"), "action": ((), "int64")}), 2, 2)
    with pytest.raises(ValueError, match="call add first"):
        agent.update(empty)
    with pytest.raises(ValueError, match=r"obs: expected shape \[N, 3\]"):
        agent.act(torch.zeros(2, 4))


@pytest.mark.slow
def test_ppo_learns_cartpole_quickly():
    from rlstash.collect.sync import Collector
    from rlstash.envs import ProcessPoolVectorEnv

    torch.manual_seed(0)
    cfg = PPOConfig.for_env("CartPole-v1", total_steps=60_000, seed=1)
    agent = PPO((4,), 2, config=cfg)
    spec = Spec({"obs": ((4,), "float32"), "action": ((), "int64")})
    with ProcessPoolVectorEnv("CartPole-v1", num_envs=cfg.num_envs, num_workers=0, seed=0) as env:
        collector = Collector(env, agent.act, cfg.rollout_steps * cfg.num_envs)
        rollout = RolloutStorage(
            spec, cfg.rollout_steps, cfg.num_envs, same_step=collector.same_step
        )
        steps = 0
        while steps < 60_000 and not collector.stats.mean_return(20) >= 200:
            rollout.add(collector.collect(), collector.next_obs)
            agent.update(rollout)
            steps += cfg.rollout_steps * cfg.num_envs
    assert collector.stats.mean_return(20) >= 200, (steps, collector.stats.mean_return(20))


def test_to_reseats_the_flat_parameters_and_keeps_adam_state():
    agent = PPO((3,), N_ACT, config=PPOConfig(net_arch=(8,), minibatch_size=24, n_epochs=1))
    agent.update(_rollout())
    state = agent.optims["policy"].state_dict()["state"][0]
    agent.to("cpu")
    moved = agent.optims["policy"].state_dict()["state"][0]
    torch.testing.assert_close(moved["exp_avg"], state["exp_avg"])
    assert (
        agent.groups["policy"].flat.params[0].data_ptr()
        == agent.groups["policy"].flat.param.data_ptr()
    )
    before = agent.groups["policy"].flat.param.detach().clone()
    agent.update(_rollout(seed=1))
    assert not torch.equal(before, agent.groups["policy"].flat.param)
    head = agent.nets["policy"].head.weight.reshape(-1)
    assert any(torch.equal(head, v.reshape(-1)) for v in agent.groups["policy"].flat.params)


def test_image_policy_runs_its_shared_cnn_once_per_minibatch_with_the_same_loss():
    """A shared Nature CNN gives the policy's features and V(s) in one forward per minibatch
    (not one for each); loss and gradients equal the two-forward reference."""
    cfg = PPOConfig(clip_range_vf=0.1, vf_coef=0.25, ent_coef=0.01)
    agent = PPO((4, 84, 84), 4, config=cfg)
    net = agent.nets["policy"]
    _perturb(agent, scale=0.02)
    g = torch.Generator().manual_seed(3)
    B = 6
    mb = {
        "obs": torch.randint(0, 256, (B, 4, 84, 84), dtype=torch.uint8, generator=g),
        "action": torch.randint(0, 4, (B,), generator=g),
        "logp": -torch.rand(B, generator=g) - 1.0,
        "advantages": torch.randn(B, generator=g),
        "returns": torch.randn(B, generator=g),
        "values": torch.randn(B, generator=g),
    }
    calls = []
    hook = net.actor_trunk[0].register_forward_hook(lambda *_: calls.append(1))
    try:
        loss, stats = agent._loss(mb, 0.1)
    finally:
        hook.remove()
    assert len(calls) == 1  # was 2: once in log_prob_entropy, once in value
    params = [p for p in net.parameters() if p.requires_grad]
    got = torch.autograd.grad(loss, params)

    x, a = mb["obs"], mb["action"]  # the reference: policy and value each run the trunk
    dist = torch.distributions.Categorical(logits=net.head(net.actor_trunk(x)))
    ratio = torch.exp(dist.log_prob(a) - mb["logp"])
    adv = (mb["advantages"] - mb["advantages"].mean()) / (mb["advantages"].std() + 1e-8)
    pg = torch.max(-adv * ratio, -adv * ratio.clamp(0.9, 1.1)).mean()
    v, old, ret = net.value(x), mb["values"], mb["returns"]
    vc = old + (v - old).clamp(-0.1, 0.1)
    v_loss = torch.max((v - ret) ** 2, (vc - ret) ** 2).mean()
    ref = pg + 0.25 * v_loss - 0.01 * dist.entropy().mean()
    want = torch.autograd.grad(ref, params)
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(stats[1], v_loss.detach(), rtol=1e-5, atol=1e-6)
    for gw, ww in zip(got, want):
        torch.testing.assert_close(gw, ww, rtol=1e-4, atol=1e-6)
