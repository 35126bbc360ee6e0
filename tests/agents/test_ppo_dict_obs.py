"""PPO and RolloutStorage with dict observations (Isaac Lab's observation groups): the chosen
keys, flattened and concatenated, give exactly what PPO on that vector gives; the rollout
holds ``obs/<key>`` fields; bad input is refused before anything is written."""

from __future__ import annotations

import pytest
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

import rlstash
from rlstash.agents.dict_obs import ObsLayout
from rlstash.agents.ppo import PPO, PPOConfig
from rlstash.collect import Collector
from rlstash.settings import field_types, parse_text
from rlstash.spec import Spec
from rlstash.storage.rollout import RolloutStorage
from tests.collect.test_dict_obs import DictObsEnv

T, N = 6, 4


def _data(same_step: bool, seed: int = 0, dim: int = 5, act_dim: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    data = {
        "obs": torch.randn(T, N, dim, generator=g),
        "reward": torch.randn(T, N, generator=g),
        "terminated": torch.rand(T, N, generator=g) < 0.15,
        "truncated": torch.rand(T, N, generator=g) < 0.1,
        "next": torch.randn(N, dim, generator=g),
    }
    if act_dim:
        data["action"] = torch.randn(T, N, act_dim, generator=g)
    else:
        data["action"] = torch.randint(0, 3, (T, N), generator=g)
    if same_step:
        data["final_obs"] = torch.randn(T, N, dim, generator=g)
    return data


def _split(x: torch.Tensor) -> dict:
    """A 5-vector as a nested dict: {"a": x[..., :2], "b": {"c": x[..., 2:]}}."""
    return {"a": x[..., :2], "b": {"c": x[..., 2:]}}


def _action_spec(act_dim: int) -> dict:
    return {"action": ((act_dim,), "float32") if act_dim else ((), "int64")}


def _rollouts(same_step: bool, act_dim: int = 0) -> tuple[RolloutStorage, RolloutStorage]:
    d = _data(same_step, act_dim=act_dim)
    flags = {k: d[k] for k in ("action", "reward", "terminated", "truncated")}
    plain = RolloutStorage(
        Spec({"obs": ((5,), "float32"), **_action_spec(act_dim)}), T, N, same_step=same_step
    )
    batch = {**flags, "obs": d["obs"]}
    if same_step:
        batch["final_obs"] = d["final_obs"]
    plain.add(batch, d["next"])
    spec = Spec({"obs/a": ((2,), "float32"), "obs/b/c": ((3,), "float32"), **_action_spec(act_dim)})
    dicts = RolloutStorage(spec, T, N, same_step=same_step)
    batch = {**flags, "obs/a": d["obs"][..., :2], "obs/b/c": d["obs"][..., 2:]}
    if same_step:
        batch.update(
            {"final_obs/a": d["final_obs"][..., :2], "final_obs/b/c": d["final_obs"][..., 2:]}
        )
    dicts.add(batch, _split(d["next"]))  # next_obs as the env returns it: nested
    return plain, dicts


@pytest.mark.parametrize("same_step", [False, True])
@pytest.mark.parametrize("act_dim", [0, 2])
def test_dict_obs_ppo_equals_ppo_on_the_concatenated_vector(same_step, act_dim):
    """Same seed, same data: actions, metrics and parameters after two updates are identical
    (observation normalisation and reward scaling on; discrete and Gaussian policies)."""
    cfg = PPOConfig(net_arch=(16,), minibatch_size=8, n_epochs=2, norm_obs=True, norm_reward=True)
    kind = {"bounds": (-torch.ones(act_dim).numpy(), torch.ones(act_dim).numpy())} if act_dim else {"n_actions": 3}  # fmt: skip
    plain = PPO((5,), config=cfg, **kind)
    dicts = PPO({"a": (2,), "b/c": (3,)}, config=cfg, **kind)
    x = torch.randn(7, 5, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(dicts.act(_split(x), deterministic=True), plain.act(x, True))
    ro_plain, ro_dict = _rollouts(same_step, act_dim)
    for _ in range(2):
        m_plain, m_dict = plain.update(ro_plain), dicts.update(ro_dict)
    for key in ("policy_loss", "value_loss", "approx_kl"):
        assert torch.equal(m_plain[key], m_dict[key]), key
    for (name, p), q in zip(
        plain.nets["policy"].named_parameters(), dicts.nets["policy"].parameters()
    ):
        assert torch.equal(p, q), name
    assert torch.equal(plain.nets["obs_norm"].rms.mean, dicts.nets["obs_norm"].rms.mean)
    torch.testing.assert_close(dicts.act(_split(x), deterministic=True), plain.act(x, True))


def test_obs_keys_pick_and_order_the_keys():
    """obs_keys=("b/c", "a") concatenates b/c then a; ("a",) leaves the rest out (Isaac Lab's
    actor takes the "policy" group only)."""
    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(1))
    layout = ObsLayout({"a": (2,), "b/c": (3,)}, ("b/c", "a"))
    assert torch.equal(layout.flatten(_split(x)), torch.cat([x[:, 2:], x[:, :2]], 1))
    cfg = PPOConfig(net_arch=(8,), obs_keys=("a",))
    only_a = PPO({"a": (2,), "b/c": (3,)}, 3, config=cfg)
    plain = PPO((2,), 3, config=PPOConfig(net_arch=(8,)))
    assert only_a.obs_shape == (2,)
    torch.testing.assert_close(only_a.act(_split(x), True), plain.act(x[:, :2], True))
    assert PPOConfig(obs_keys="policy").obs_keys == ("policy",)
    tp = field_types(PPOConfig)["obs_keys"]  # as --agent obs_keys=... is parsed
    assert parse_text("obs_keys", "policy,critic/max", tp) == ("policy", "critic/max")
    assert parse_text("net_arch", "64x64", field_types(PPOConfig)["net_arch"]) == (64, 64)


def test_obs_shapes_of_gymnasium_spaces():
    sp = spaces.Dict({"policy": spaces.Box(-1, 1, (3,)), "critic": spaces.Dict({"a": spaces.Box(-1, 1, (2, 2))})})  # fmt: skip
    assert rlstash.obs_shapes(sp) == {"critic/a": (2, 2), "policy": (3,)}
    assert rlstash.obs_shapes(spaces.Box(-1, 1, (4,))) == (4,)
    agent = PPO(rlstash.obs_shapes(sp), 2, config=PPOConfig(net_arch=(8,)))
    assert agent.obs_shape == (7,)  # 2 * 2 + 3, "critic/a" first: the space's order


@pytest.mark.parametrize(
    ("shapes", "keys", "match"),
    [
        ({"a": (2,)}, ("z",), r"obs_keys: expected distinct keys of the observation \['a'\]"),
        ({"a": (2,)}, ("a", "a"), "obs_keys: expected distinct keys"),
        ({"a": (2,), "img": (3, 8, 8)}, None, r"obs_keys: key 'img' is an image \[3, 8, 8\].*obs_keys=\('a',\)"),
        ({}, None, "obs_shape: expected a shape per key"),
    ],
)  # fmt: skip
def test_layout_errors_name_the_key_and_the_fix(shapes, keys, match):
    with pytest.raises(ValueError, match=match):
        ObsLayout(shapes, keys)


def test_bad_dict_observations_are_refused():
    agent = PPO({"a": (2,), "b/c": (3,)}, 3, config=PPOConfig(net_arch=(8,)))
    with pytest.raises(
        TypeError, match=r"obs: expected a dict observation with keys \['a', 'b/c'\]"
    ):
        agent.act(torch.zeros(2, 5))
    with pytest.raises(ValueError, match=r"obs: missing key 'b/c' \(got \['a'\]\)"):
        agent.act({"a": torch.zeros(2, 2)})
    with pytest.raises(ValueError, match=r"obs\['b/c'\]: expected shape \[B, 3\], got \[2, 4\]"):
        agent.act({"a": torch.zeros(2, 2), "b": {"c": torch.zeros(2, 4)}})
    with pytest.raises(
        ValueError, match=r"obs_keys: set to \('a',\), but the observation is not a dict"
    ):
        PPO((5,), 3, config=PPOConfig(obs_keys=("a",)))


def test_rollout_refuses_a_bad_dict_batch_and_writes_nothing():
    _, ro = _rollouts(same_step=False)
    before = {k: v.clone() for k, v in ro.obs.items()}
    d = _data(False, seed=5)
    batch = {k: d[k] for k in ("action", "reward", "terminated", "truncated")}
    batch.update({"obs/a": d["obs"][..., :2], "obs/b/c": d["obs"][..., 2:]})
    with pytest.raises(ValueError, match=r"next_obs: missing key 'b/c' \(got \['a'\]\)"):
        ro.add(batch, {"a": torch.zeros(N, 2)})
    with pytest.raises(TypeError, match="next_obs: expected a dict of"):
        ro.add(batch, torch.zeros(N, 5))
    with pytest.raises(ValueError, match=r"next_obs/b/c: expected shape \[4, 3\], got \[4, 2\]"):
        ro.add(batch, {"a": torch.zeros(N, 2), "b/c": torch.zeros(N, 2)})
    with pytest.raises(ValueError, match=r"batch: missing field 'obs/b/c'"):
        ro.add({k: v for k, v in batch.items() if k != "obs/b/c"}, _split(d["next"]))
    for k, v in ro.obs.items():
        assert torch.equal(v, before[k]), k
    with pytest.raises(
        ValueError, match=r"spec: unexpected fields \['obs/a', 'obs'\]|spec: unexpected fields"
    ):
        RolloutStorage(Spec({"obs": ((2,), "float32"), "obs/a": ((2,), "float32"), "action": ((), "int64")}), T, N)  # fmt: skip


def test_rollout_dict_obs_layout_and_bytes():
    plain, dicts = _rollouts(same_step=True)
    assert set(dicts.obs) == {"a", "b/c"} and set(dicts.final_obs) == {"a", "b/c"}
    assert torch.equal(torch.cat([dicts.obs["a"], dicts.obs["b/c"]], -1), plain.obs)
    flat = dicts.flat("obs")
    assert flat["a"].shape == (T * N, 2) and flat["b/c"].shape == (T * N, 3)
    assert dicts.nbytes == plain.nbytes


@pytest.mark.parametrize("mode", [AutoresetMode.SAME_STEP, AutoresetMode.NEXT_STEP])
def test_batched_dict_env_collector_rollout_and_update(mode):
    """Isaac Lab shaped env (groups, one nested) -> Collector -> RolloutStorage -> PPO with
    obs_keys=("policy",): equal to PPO on the plain env's vectors, step for step."""
    n, steps = 8, 16
    spec = Spec({"obs/policy": ((4,), "float32"), "obs/critic/sq": ((4,), "float32"),
                 "obs/critic/x": ((1,), "float32"), "action": ((), "int64")})  # fmt: skip
    cfg = PPOConfig(net_arch=(16,), minibatch_size=32, n_epochs=2, norm_obs=True)
    dict_cfg = PPOConfig(**{**cfg.__dict__, "obs_keys": ("policy",)})
    from rlstash.envs.batched.cartpole import CartPoleVectorEnv

    out = []
    for agent, env, ro_spec in (
        (PPO({"policy": (4,), "critic/sq": (4,), "critic/x": (1,)}, 2, config=dict_cfg), DictObsEnv(n, mode), spec),
        (PPO((4,), 2, config=cfg), CartPoleVectorEnv(num_envs=n, autoreset_mode=mode), Spec({"obs": ((4,), "float32"), "action": ((), "int64")})),
    ):  # fmt: skip
        c = Collector(env, agent.act, frames_per_batch=n * steps, seed=3)
        ro = RolloutStorage(ro_spec, steps, n, same_step=c.same_step)
        for _ in range(3):
            ro.add(c.collect(), c.next_obs)
            agent.update(ro)
        out.append([p.detach().clone() for p in agent.nets["policy"].parameters()])
    for p, q in zip(*out):
        assert torch.equal(p, q)
