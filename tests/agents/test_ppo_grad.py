"""PPO's written-out gradient (rlstash.agents.ppo_grad) against the autograd update: the same
parameters, Adam state and metrics after several updates for every option it covers, the
networks it leaves to autograd, the first epoch's exact ratio of 1, and FlatAdam.fused_step
against torch.optim's step."""

import pytest
import torch

from rlstash.agents import ppo_grad
from rlstash.agents.compiled import FlatAdam
from rlstash.agents.ppo import PPO, PPOConfig
from rlstash.agents.ppo_grad import PPOGrad, unsupported
from rlstash.spec import Spec
from rlstash.storage.rollout import RolloutStorage

N_ACT = 4


def _rollout(T=8, N=4, obs_shape=(3,), continuous=0, invalid=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    fields = {"obs": (obs_shape, "float32")}
    if continuous:
        fields["action"] = ((continuous,), "float32")
        action = 2 * torch.randn(T, N, continuous, generator=g)
    else:
        fields["action"] = ((), "int64")
        action = torch.randint(0, N_ACT, (T, N), generator=g)
    ro = RolloutStorage(Spec(fields), T, N)
    ro.add(
        {
            "obs": torch.randn(T, N, *obs_shape, generator=g),
            "action": action,
            "reward": torch.randn(T, N, generator=g),
            "terminated": torch.rand(T, N, generator=g) < 0.15,
            "truncated": torch.rand(T, N, generator=g) < 0.1,
        },
        torch.randn(N, *obs_shape, generator=g),
    )
    if invalid:  # rows that are no real step weigh 0 (next-step autoreset's reset rows)
        ro.valid.copy_(torch.rand(T, N, generator=g) > 0.25)
        ro.all_valid = False
    return ro


def _pair(obs_shape=(3,), continuous=0, **settings):
    base = dict(
        net_arch=(16, 16), minibatch_size=8, n_epochs=3, learning_rate=1e-2, clip_range=0.02, seed=5
    )
    base.update(settings)

    def make(backward):
        cfg = PPOConfig(**base, backward=backward)
        if continuous:
            bounds = (-torch.ones(continuous), torch.ones(continuous))
            return PPO(obs_shape, bounds=bounds, config=cfg)
        return PPO(obs_shape, N_ACT, config=cfg)

    return make("autograd"), make("written")


def _assert_same(a, b, atol=2e-5):
    for (name, p), q in zip(a.nets["policy"].named_parameters(), b.nets["policy"].parameters()):
        torch.testing.assert_close(q, p, atol=atol, rtol=1e-4, msg=name)
    sa = a.groups["policy"].opt.state[a.groups["policy"].flat.param]
    sb = b.groups["policy"].opt.state[b.groups["policy"].flat.param]
    assert float(sa["step"]) == float(sb["step"]) > 0
    for key in ("exp_avg", "exp_avg_sq"):
        torch.testing.assert_close(sb[key], sa[key], atol=atol, rtol=1e-3, msg=key)


CASES = {
    "tanh": {},
    "relu": {"activation": "relu"},
    "entropy_bonus": {"ent_coef": 0.05},
    "value_clipping": {"clip_range_vf": 0.05},
    "weighted_rows": {"invalid": True},
    "raw_advantages": {"normalize_advantage": False},
    "obs_and_reward_norm": {"norm_obs": True, "norm_reward": True},
    "one_hidden_layer": {"net_arch": (24,)},
    "three_layers_no_clip_annealed": {
        "net_arch": (8, 12, 8),
        "max_grad_norm": 1e9,
        "anneal_lr": True,
        "anneal_clip_range": True,
        "total_steps": 400,
    },  # fmt: skip
    "full_batch": {"minibatch_size": 32},
    "image_shaped_flat_obs": {"obs_shape": (2, 3)},
}


@pytest.mark.parametrize("continuous", [0, 2], ids=["categorical", "gaussian"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_written_update_equals_autograd(case, continuous):
    settings = dict(CASES[case])
    invalid = settings.pop("invalid", False)
    obs_shape = settings.pop("obs_shape", (3,))
    if continuous:
        settings.setdefault("ent_coef", 0.01)  # the log std's entropy term too
    a, b = _pair(obs_shape, continuous, **settings)
    assert a.written_grad() is None and isinstance(b.written_grad(), PPOGrad)
    for seed in range(3):
        ro = _rollout(obs_shape=obs_shape, continuous=continuous, invalid=invalid, seed=seed)
        out_a, out_b = a.update(ro), b.update(ro)
        for key in ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction",
                    "grad_norm", "explained_variance"):  # fmt: skip
            assert float(out_b[key]) == pytest.approx(float(out_a[key]), rel=1e-4, abs=1e-5), key
    assert a.updates == b.updates == 3 * 3 * (32 // a.config.minibatch_size)
    assert 0 < float(out_b["clip_fraction"]) < 1 or case == "three_layers_no_clip_annealed"
    _assert_same(a, b)


def test_torch_tanh_branch_equals_autograd(monkeypatch):
    """The trunk's torch.tanh branch (GPUs) on CPU: same update as autograd."""
    monkeypatch.setattr(ppo_grad, "SIGMOID_TANH", ())
    a, b = _pair(ent_coef=0.01)
    for seed in range(2):
        a.update(_rollout(seed=seed)), b.update(_rollout(seed=seed))
    _assert_same(a, b)


def test_first_minibatch_of_an_update_has_a_ratio_of_exactly_one():
    agent = PPO((3,), N_ACT, config=PPOConfig(net_arch=(16,), minibatch_size=32, n_epochs=1))
    out = agent.update(_rollout())  # one minibatch: the behaviour policy's own numbers
    assert float(out["approx_kl"]) == 0.0 and float(out["clip_fraction"]) == 0.0


@pytest.mark.parametrize(
    "kind, settings, why",
    [
        ("image", {}, "image observations"),
        ("discrete", {"action_head": "embedding"}, "embedding action head"),
        ("discrete", {"action_chunk": 2}, "more actions than action_chunk"),
        ("gaussian", {"bound": "tanh"}, "bound='tanh'"),
    ],
)
def test_networks_it_does_not_cover_keep_autograd(kind, settings, why):
    cfg = dict(net_arch=(8,), minibatch_size=8, **settings)
    if kind == "image":
        make = lambda backward: PPO((4, 36, 36), N_ACT, config=PPOConfig(**cfg, backward=backward))  # noqa: E731
    elif kind == "gaussian":
        bounds = (-torch.ones(2), torch.ones(2))
        make = lambda backward: PPO((3,), bounds=bounds, config=PPOConfig(**cfg, backward=backward))  # noqa: E731
    else:
        make = lambda backward: PPO((3,), N_ACT, config=PPOConfig(**cfg, backward=backward))  # noqa: E731
    agent = make("auto")
    assert agent.written_grad() is None
    assert why in unsupported(agent.nets["policy"], agent.n_actions, agent.config.action_chunk)
    with pytest.raises(
        ValueError, match=r"backward: 'written' covers MLP actor-critics.*" + why[:12]
    ):
        make("written")


def test_masked_rollouts_take_the_autograd_update():
    a, b = _pair()
    g = torch.Generator().manual_seed(1)
    mask = torch.rand(8, 4, N_ACT, generator=g) < 0.6
    mask[..., 0] = True
    masked = RolloutStorage(
        Spec({"obs": ((3,), "float32"), "action": ((), "int64"),
              "action_mask": ((N_ACT,), "bool")}), 8, 4,
    )  # fmt: skip
    masked.add(
        {"obs": torch.randn(8, 4, 3, generator=g), "action": torch.zeros(8, 4, dtype=torch.long),
         "reward": torch.randn(8, 4, generator=g), "terminated": torch.rand(8, 4) < 0.1,
         "truncated": torch.zeros(8, 4, dtype=torch.bool), "action_mask": mask},
        torch.randn(4, 3, generator=g),
    )  # fmt: skip
    a.update(masked), b.update(masked)
    for p, q in zip(a.nets["policy"].parameters(), b.nets["policy"].parameters()):
        assert torch.equal(p, q)  # both ran autograd: bit for bit


def test_backward_setting_is_checked():
    with pytest.raises(ValueError, match="backward: expected one of auto, written, autograd"):
        PPOConfig(backward="manual")


def test_written_update_follows_a_reseated_group():
    agent = PPO((3,), N_ACT, config=PPOConfig(net_arch=(8,), minibatch_size=16, n_epochs=1))
    agent.update(_rollout())
    first = agent.written_grad()
    agent.to("cpu")  # re-seats the flat vectors: a new group
    assert agent.written_grad() is not first
    before = agent.groups["policy"].flat.param.detach().clone()
    agent.update(_rollout(seed=1))
    assert not torch.equal(before, agent.groups["policy"].flat.param)
    head, flat = agent.nets["policy"].head.weight, agent.groups["policy"].flat
    assert head.data_ptr() in {p.data_ptr() for p in flat.params}
    view = agent.written_grad().grads[id(head)]  # where the head's gradient is written
    assert view.untyped_storage().data_ptr() == flat.grad.untyped_storage().data_ptr()


@pytest.mark.parametrize("clip", [None, 0.1])
def test_fused_step_equals_torch_optims_step(clip):
    torch.manual_seed(0)
    nets = [torch.nn.Linear(5, 7), torch.nn.Linear(7, 2)]
    twin = [torch.nn.Linear(5, 7), torch.nn.Linear(7, 2)]
    for n, t in zip(nets, twin):
        t.load_state_dict(n.state_dict())
    a, b = FlatAdam(nets, lr=1e-2, eps=1e-5), FlatAdam(twin, lr=1e-2, eps=1e-5)
    for i in range(4):
        grad = torch.randn(a.flat.grad.shape, generator=torch.Generator().manual_seed(i))
        a.flat.zero_grad()
        loss = (a.flat.param * grad).sum()  # d loss / d param = grad
        norm_a = a.step(loss, clip)
        b.flat.grad.copy_(grad)
        norm_b = b.fused_step(clip)
        assert torch.equal(b.flat.param, a.flat.param)
        assert float(norm_b) == pytest.approx(float(norm_a) if clip else 0.0)
    state_a, state_b = a.opt.state[a.flat.param], b.opt.state[b.flat.param]
    for key in ("step", "exp_avg", "exp_avg_sq"):
        assert torch.equal(state_a[key], state_b[key]), key


def test_near_deterministic_policy_gradient_equals_autograd():
    """Saturated tanh units and a policy with p ~ 1: the regime where a hand-written softmax or
    tanh derivative would go wrong first."""
    a, b = _pair(net_arch=(32, 32), minibatch_size=32, n_epochs=4)
    for agent in (a, b):
        with torch.no_grad():
            agent.nets["policy"].head.weight.mul_(3000.0)
            agent.nets["policy"].actor_trunk[1].weight.mul_(8.0)
    out_a, out_b = a.update(_rollout()), b.update(_rollout())
    assert float(out_a["entropy"]) < 0.3
    assert float(out_b["entropy"]) == pytest.approx(float(out_a["entropy"]), rel=1e-4)
    _assert_same(a, b, atol=1e-4)
