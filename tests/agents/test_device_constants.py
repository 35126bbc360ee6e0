"""No agent step moves a tensor the agent keeps (AgentBase.constants).

Seen on an H100 (issue 28): SAC's and TD3's acting step read the Box's center and scale as CPU
tensors and copied them to the device inside the step (``center.to(obs.device)``). Captured
into a CUDA graph, that copy fails ("Cannot copy between CPU and CUDA tensors during CUDA graph
capture"); uncaptured, it is a synchronous host-to-device copy in every call. The mechanism:
every tensor an agent keeps is placed on its devices when the agent is built or moved
(``AgentBase._build_actor``), so a step never needs ``.to`` on one. This test holds on CPU: it
fails if any kept tensor is ``.to``-ed while acting or updating.
"""

from __future__ import annotations

import pytest
import torch

from rlstash.agents.iql import IQL, IQLConfig
from rlstash.agents.td3_bc import TD3BC, TD3BCConfig
from tests.agents.test_compiled import AGENTS, SMALL, _continuous

ALL = {
    **AGENTS,
    "iql": (lambda c: IQL((3,), 2, -2.0, 2.0, IQLConfig(net_arch=SMALL, compile=c)), _continuous),
    "td3_bc": (
        lambda c: TD3BC((3,), 2, -2.0, 2.0, TD3BCConfig(net_arch=SMALL, compile=c)),
        _continuous,
    ),
}


def kept_tensors(agent) -> dict[int, str]:
    return {id(v): k for k, v in vars(agent).items() if isinstance(v, torch.Tensor)}


@pytest.mark.parametrize("name", sorted(ALL))
def test_no_step_moves_a_tensor_the_agent_keeps(name, monkeypatch):
    make, batch_of = ALL[name]
    agent = make(False)
    agent.env_steps = 10_000  # past TD3's uniform warm-up: its policy acts
    assert {"center", "scale"} <= set(agent.constants) or agent.n_actions is not None
    kept, moved = kept_tensors(agent), []
    real_to = torch.Tensor.to

    def to(self, *args, **kwargs):
        if id(self) in kept:
            moved.append(kept[id(self)])
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", to)
    obs = torch.randn(4, *agent.obs_shape)
    for i in range(3):
        agent.update(batch_of(i))
        agent.act(obs)
        agent.act(obs, deterministic=True)
    assert moved == [], f"{name}: moved per call: {sorted(set(moved))}"


@pytest.mark.parametrize("name", ["sac", "td3", "iql", "td3_bc"])
def test_box_constants_follow_the_agent_to_its_devices(name):
    agent = ALL[name][0](False)
    for key in agent.constants:
        assert getattr(agent, key).device == agent.device
        assert getattr(agent, f"act_{key}").device == agent.act_device
    agent.to("cpu", act_device="cpu")
    assert all(getattr(agent, f"act_{key}") is not None for key in agent.constants)


def _tensors(agent) -> dict[str, torch.Tensor]:
    """Every tensor a step can read: the agent's attributes, its groups' lr and Adam state."""
    out = {k: v for k, v in vars(agent).items() if isinstance(v, torch.Tensor)}
    for name, group in agent.groups.items():
        out[f"groups[{name}].lr"] = group.lr
        for i, t in enumerate(group.state_tensors()):
            out[f"groups[{name}].state[{i}]"] = t
    return out


@pytest.mark.parametrize("name", sorted(ALL))
def test_to_moves_every_tensor_a_step_reads(name, monkeypatch):
    """Seen on an H100 (issue 28): after ``agent.to("cuda")`` the Polyak weight ``tau_now`` was
    still a CPU tensor (built before ``to`` set the new device). Compiled, a CPU 0-dim tensor is
    passed by value at each call; captured into a CUDA graph, its value at capture time (0, no
    target update) was baked in, so graphed DQN/SAC/TD3 never moved their target networks.
    Here the move is to the ``meta`` device (no CUDA on CPU machines): every tensor must
    follow."""
    import rlstash.agents.base as base

    monkeypatch.setattr(
        base, "resolve_device", lambda d, *a, **k: None if d is None else torch.device(d)
    )
    monkeypatch.setattr(
        base, "make_generator", lambda dev, seed: torch.Generator().manual_seed(seed)
    )
    agent = ALL[name][0](False)
    agent.to("meta")
    left = {k: v.device for k, v in _tensors(agent).items() if v.device.type != "meta"}
    assert left == {}, f"{name}: still off the agent's device after to(): {left}"
