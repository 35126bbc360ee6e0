"""Agents' ``update`` reads nothing back to the host (issue 9, device truth).

On a GPU every ``.item()``, ``if tensor`` or ``float(tensor)`` waits for the device to finish
(a device-to-host sync per update). Metrics stay 0-dim tensors on the device and are read
together by ``read_metrics`` when the caller logs. These tests count the Python-level host
reads of tensors during updates (on CPU, where the same code runs)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest
import torch

from rlstash.agents import base
from rlstash.agents.actions import pack_mask
from rlstash.agents.base import read_metrics
from rlstash.agents.dqn import DQN, DQNConfig
from rlstash.agents.sac import SAC, SACConfig
from rlstash.agents.sac_discrete import DiscreteSAC, DiscreteSACConfig
from rlstash.agents.td3 import TD3, TD3Config

READS = ("item", "tolist", "numpy", "__bool__", "__float__", "__int__")


@contextlib.contextmanager
def count_host_reads() -> Iterator[list[str]]:
    """Record every Python-level read of a tensor's values (the calls that sync a GPU)."""
    seen: list[str] = []
    originals = {name: getattr(torch.Tensor, name) for name in READS}

    def wrap(name: str, fn: Callable) -> Callable:
        def counted(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
            seen.append(name)
            return fn(self, *args, **kwargs)

        return counted

    for name, fn in originals.items():
        setattr(torch.Tensor, name, wrap(name, fn))
    try:
        yield seen
    finally:
        for name, fn in originals.items():
            setattr(torch.Tensor, name, fn)


def _discrete_batch(b: int, obs_dim: int, n: int, seed: int, masks: bool) -> dict:
    g = torch.Generator().manual_seed(seed)
    batch = {
        "obs": torch.randn(b, obs_dim, generator=g),
        "action": torch.randint(0, n, (b,), generator=g),
        "reward": torch.randn(b, generator=g),
        "next_obs": torch.randn(b, obs_dim, generator=g),
        "terminated": torch.rand(b, generator=g) < 0.2,
        "discount": torch.full((b,), 0.99**3),
        "weight": torch.rand(b, generator=g) + 0.5,
    }
    if masks:
        mask = torch.rand(b, n, generator=g) < 0.7
        mask[torch.arange(b), batch["action"]] = True
        batch["action_mask"] = pack_mask(mask)
        batch["next_action_mask"] = mask
    return batch


def _continuous_batch(b: int, obs_dim: int, act_dim: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "obs": torch.randn(b, obs_dim, generator=g),
        "action": 2 * torch.rand(b, act_dim, generator=g) - 1,
        "reward": torch.randn(b, generator=g),
        "next_obs": torch.randn(b, obs_dim, generator=g),
        "terminated": torch.rand(b, generator=g) < 0.2,
        "weight": torch.rand(b, generator=g) + 0.5,
    }


def _agents() -> dict[str, tuple[Callable, Callable]]:
    """name -> (make agent, make batch(seed))."""
    small = (16, 16)
    dqn_cfg = dict(net_arch=small, lr_schedule="linear", total_steps=1000, target_update_interval=3)
    return {
        "dqn": (
            lambda: DQN((4,), 5, DQNConfig(**dqn_cfg)),
            lambda s: _discrete_batch(8, 4, 5, s, masks=True),
        ),
        "dqn-embedding": (
            lambda: DQN((4,), 300, DQNConfig(**dqn_cfg, action_head="embedding", action_chunk=64)),
            lambda s: _discrete_batch(8, 4, 300, s, masks=True),
        ),
        "dqn-history": (
            lambda: DQN((3, 4), 5, DQNConfig(**dqn_cfg, history_hidden=8)),
            lambda s: {
                **_discrete_batch(8, 12, 5, s, masks=False),
                "obs": torch.randn(8, 3, 4),
                "next_obs": torch.randn(8, 3, 4),
            },
        ),
        "sac": (
            lambda: SAC((3,), 2, -1.0, 1.0, SACConfig(net_arch=small)),
            lambda s: _continuous_batch(8, 3, 2, s),
        ),
        "sac-clipped": (
            lambda: SAC((3,), 2, -1.0, 1.0, SACConfig(net_arch=small, max_grad_norm=1.0)),
            lambda s: _continuous_batch(8, 3, 2, s),
        ),
        "td3": (
            lambda: TD3((3,), 2, -1.0, 1.0, TD3Config(net_arch=small, policy_delay=2)),
            lambda s: _continuous_batch(8, 3, 2, s),
        ),
        "td3-clipped": (
            lambda: TD3((3,), 2, -1.0, 1.0, TD3Config(net_arch=small, max_grad_norm=1.0)),
            lambda s: _continuous_batch(8, 3, 2, s),
        ),
        "sac_discrete": (
            lambda: DiscreteSAC(
                (4,), 300, DiscreteSACConfig(net_arch=small, action_chunk=64, max_grad_norm=1.0)
            ),
            lambda s: _discrete_batch(8, 4, 300, s, masks=True),
        ),
    }


@pytest.mark.parametrize("name", sorted(_agents()))
def test_update_reads_nothing_back_except_on_value_check_steps(name):
    make, batch_of = _agents()[name]
    agent = make()
    agent.value_check_every = 20  # the default is 100; fewer updates keep the test fast
    batches = [batch_of(seed) for seed in range(4)]
    agent.update(batches[0])  # update 0: checks values (reads the actions back)
    with count_host_reads() as reads:
        for i in range(1, agent.value_check_every):
            metrics = agent.update(batches[i % len(batches)])
    assert reads == [], f"{name}: {len(reads)} host reads in {agent.value_check_every - 1} updates"
    for key, value in metrics.items():
        assert isinstance(value, torch.Tensor | float), key
        if isinstance(value, torch.Tensor) and key != "td_error":
            assert value.dim() == 0 and not value.requires_grad, key
    # the logging step: one read for all scalars
    with count_host_reads() as reads:
        logged = read_metrics(metrics)
    assert reads == ["tolist"]
    assert "td_error" not in logged and all(isinstance(v, float) for v in logged.values())


def test_value_checks_still_run_on_schedule():
    agent = DQN((4,), 5, DQNConfig(net_arch=(8,)))
    good, bad = _discrete_batch(8, 4, 5, 0, False), _discrete_batch(8, 4, 5, 1, False)
    bad["action"][3] = 7
    with pytest.raises(ValueError, match=r"batch\['action'\]: expected indices in \[0, 5\), got 7"):
        agent.update(bad)  # the first update checks values
    agent.value_check_every = 2
    agent.update(good)  # update 0: checked
    agent.update(good)  # update 1: not checked
    with pytest.raises(ValueError, match="got 7"):
        agent.update(bad)  # update 2: checked


def test_read_metrics_equals_the_values_in_order():
    metrics = {
        "loss": torch.tensor(1.5),
        "epsilon": 0.25,
        "grad_norm": torch.tensor([2.0]),
        "td_error": torch.ones(4),
        "flag": True,
    }
    assert read_metrics(metrics) == {"loss": 1.5, "epsilon": 0.25, "grad_norm": 2.0}
    assert list(read_metrics(metrics)) == ["loss", "epsilon", "grad_norm"]


def test_unmasked_act_reads_nothing_back(monkeypatch):
    # as on a GPU: there act leaves the observations' finiteness to the buffers (on the CPU it
    # checks them, a free read: tests/faults/test_finite.py)
    monkeypatch.setattr(base, "FINITE_OBS_DEVICES", ())
    dqn = DQN((4,), 3, DQNConfig(net_arch=(8,)))
    dsac = DiscreteSAC((4,), 3, DiscreteSACConfig(net_arch=(8,)))
    td3 = TD3((4,), 2, -1.0, 1.0, TD3Config(net_arch=(8,), random_steps=5))
    obs = torch.randn(5, 4)
    with count_host_reads() as reads:
        dqn.act(obs), dsac.act(obs), dqn.act(obs, deterministic=True)
        td3.act(obs), td3.act(obs), td3.act(obs, deterministic=True)  # warm-up, then noise
    assert reads == []
