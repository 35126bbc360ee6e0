"""The multi-agent layout's checks (rlstash.envs.multiagent): actions refused with the group or
agent named, groups formed from agent spaces, dict observations flattened."""

from __future__ import annotations

import pytest
import torch
from gymnasium import spaces

from rlstash.envs.multiagent import (
    MultiAgentStep,
    MultiAgentVectorEnv,
    check_actions,
    flat_obs_dim,
    flatten_obs,
    group_agents,
)

BOX = spaces.Box(-1.0, 1.0, (2,))
GROUPS = {"agents": ("agent_0", "agent_1", "agent_2")}
CPU = torch.device("cpu")


def test_actions_by_group_and_by_agent_give_the_same_tensor() -> None:
    a = torch.rand(4, 3, 2)
    by_group = check_actions({"agents": a}, GROUPS, {"agents": BOX}, 4, CPU)
    by_agent = check_actions(
        {f"agent_{i}": a[:, i] for i in range(3)}, GROUPS, {"agents": BOX}, 4, CPU
    )
    assert torch.equal(by_group["agents"], a) and torch.equal(by_agent["agents"], a)


@pytest.mark.parametrize(
    "actions, match",
    [
        ({"agnet_0": torch.zeros(4, 2)}, "unknown group or agent 'agnet_0'"),
        ({"agents": torch.zeros(4, 2, 2)}, r"'agents' expected shape \[4, 3, 2\].*got \[4, 2, 2\]"),
        ({"agent_0": torch.zeros(4, 2), "agent_1": torch.zeros(4, 2)}, "no action for agent 'agent_2'"),
        ({"agent_0": torch.zeros(4, 2), "agent_1": torch.zeros(4, 3), "agent_2": torch.zeros(4, 2)},
         r"actions\['agent_1'\]: 'agent_1' expected shape \[4, 2\]"),
        ({"agents": torch.zeros(4, 3, 2), "agent_1": torch.zeros(4, 2)}, "agent 'agent_1' given both"),
    ],
)  # fmt: skip
def test_bad_actions_are_refused_naming_the_agent(actions: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        check_actions(actions, GROUPS, {"agents": BOX}, 4, CPU)


def test_action_dtypes_are_checked_per_kind() -> None:
    with pytest.raises(TypeError, match="'agents' expected float actions, got torch.int64"):
        check_actions({"agents": torch.zeros(4, 3, 2, dtype=torch.int64)}, GROUPS,
                      {"agents": BOX}, 4, CPU)  # fmt: skip
    disc = {"agents": spaces.Discrete(5)}
    with pytest.raises(TypeError, match="'agents' expected integer action indices"):
        check_actions({"agents": torch.zeros(4, 3)}, GROUPS, disc, 4, CPU)
    out = check_actions({"agents": torch.zeros(4, 3, dtype=torch.int32)}, GROUPS, disc, 4, CPU)
    assert out["agents"].dtype == torch.int64
    with pytest.raises(TypeError, match="expected a dict of tensors by group"):
        check_actions(torch.zeros(4, 3), GROUPS, disc, 4, CPU)  # type: ignore[arg-type]


def test_groups_follow_the_spaces() -> None:
    agents = ["adversary_0", "agent_0", "agent_1"]
    obs = {"adversary_0": spaces.Box(-1, 1, (8,)), "agent_0": spaces.Box(-1, 1, (10,)),
           "agent_1": spaces.Box(-1, 1, (10,))}  # fmt: skip
    act = dict.fromkeys(agents, spaces.Discrete(5))
    assert group_agents(agents, obs, act) == {"adversary": ("adversary_0",),
                                              "agent": ("agent_0", "agent_1")}  # fmt: skip
    same = dict.fromkeys(agents, spaces.Box(-1, 1, (10,)))
    assert group_agents(agents, same, act) == {"agents": tuple(agents)}
    with pytest.raises(ValueError, match="agent 'agent_1': no action space"):
        group_agents(agents, same, {"adversary_0": act["agent_0"], "agent_0": act["agent_0"]})


def test_dict_observations_flatten_in_sorted_key_order() -> None:
    obs = {"vel": torch.full((4, 3, 2), 2.0), "pos": torch.ones(4, 3, 2, 2)}
    flat = flatten_obs(obs)
    assert flat.shape == (4, 3, 6)
    assert torch.equal(flat[..., :4], torch.ones(4, 3, 4))  # "pos" first
    space = spaces.Dict({"pos": spaces.Box(-1, 1, (2, 2)), "vel": spaces.Box(-1, 1, (2,))})
    assert flat_obs_dim(space) == 6


class _FakeEnv:
    """The smallest env of the protocol (for the runtime check)."""

    num_envs, device, groups = 2, CPU, GROUPS
    observation_spaces = {"agents": BOX}
    action_spaces = {"agents": BOX}
    state_space = None

    def reset(self, *, seed: int | None = None) -> MultiAgentStep:
        raise NotImplementedError

    def step(self, actions: dict) -> MultiAgentStep:
        raise NotImplementedError

    def close(self) -> None:
        pass


def test_protocol_is_runtime_checkable() -> None:
    assert isinstance(_FakeEnv(), MultiAgentVectorEnv)
    assert not isinstance(object(), MultiAgentVectorEnv)
