"""The multi-agent layout: a vector of multi-agent envs whose agents form a fixed axis.

A :class:`MultiAgentVectorEnv` steps ``num_envs`` copies of an env with several agents. Agents
with identical spaces share a *group* (one group ``"agents"`` when all agents are alike, as
TorchRL and BenchMARL group them); within a group the agents are a fixed axis ``A_g`` in the
env's own order (PettingZoo's ``possible_agents``, VMAS's ``agents``)::

    env.groups              {"agents": ("agent_0", "agent_1", "agent_2")}
    env.observation_spaces  {"agents": Box(-inf, inf, (18,))}    # ONE agent's space per group
    env.action_spaces       {"agents": Box(-1, 1, (2,))}
    step = env.reset(seed=0)                  # a MultiAgentStep
    step.obs["agents"]                        # [E, A_g, 18] on env.device
    step = env.step({"agents": actions})      # actions [E, A_g, 2] (discrete: [E, A_g] int64)

Every tensor of a :class:`MultiAgentStep` is ``[E, A_g, ...]`` per group (``state`` and
``env_done`` are per env). An env whose agents are all done resets in the same step
("same_step" autoreset): ``obs``/``state`` hold the new episode's first values and
``final_obs``/``final_state`` the ended episode's last observations and global state (what a
truncated episode is bootstrapped from: :func:`final_state` hands it to the collectors and
refuses an env with a state that gives none). ``mask`` says which agents acted: an agent
done early (or absent) has ``mask`` False until its env resets; its rows contribute nothing to
losses and are never sampled.

Errors name the group or agent: :func:`check_actions` refuses unknown group/agent names and
wrong shapes or dtypes with a ValueError/TypeError saying what was expected, what came, and the
fix; :func:`group_agents` refuses agent spaces that cannot form groups.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from gymnasium import spaces

ObsPart = Any  # a tensor [E, A_g, ...], or a dict of them by key (a dict observation)


@dataclass
class MultiAgentStep:
    """One step (or reset) of a :class:`MultiAgentVectorEnv`, every tensor on its device.

    ``obs``: per group [E, A_g, *obs_shape] (dict observations: a dict of those by key);
    ``reward`` [E, A_g] float32 (a team reward repeats the same value for each agent);
    ``terminated``/``truncated``/``mask`` [E, A_g] bool; ``action_mask`` [E, A_g, n] bool for
    discrete actions with masks, else None; ``state`` [E, *state_shape] or None; ``env_done``
    [E] bool (the env reset in this step); ``final_obs`` per group [E, A_g, ...] with the ended
    episodes' last observations in the rows where ``env_done`` (None when no env ended);
    ``final_state`` [E, *state_shape] their last global states in those rows (None when the
    env has no state or no env ended)."""

    obs: dict[str, ObsPart]
    reward: dict[str, torch.Tensor]
    terminated: dict[str, torch.Tensor]
    truncated: dict[str, torch.Tensor]
    mask: dict[str, torch.Tensor]
    action_mask: dict[str, torch.Tensor | None]
    state: torch.Tensor | None
    env_done: torch.Tensor
    final_obs: dict[str, ObsPart] | None = None
    final_state: torch.Tensor | None = None


@runtime_checkable
class MultiAgentVectorEnv(Protocol):
    """``num_envs`` multi-agent envs stepped together (module docstring)."""

    num_envs: int
    device: torch.device
    groups: dict[str, tuple[str, ...]]
    observation_spaces: dict[str, Any]
    action_spaces: dict[str, Any]
    state_space: Any

    def reset(self, *, seed: int | None = None) -> MultiAgentStep: ...

    def step(self, actions: dict[str, torch.Tensor]) -> MultiAgentStep: ...

    def close(self) -> None: ...


def final_state(step: MultiAgentStep) -> torch.Tensor | None:
    """The global states the episodes that ended in ``step`` ended in, [E, *state_shape]
    (rows valid where ``env_done``): ``step.final_state``; None where the env has no state or
    no env ended. What a critic or mixer over the global state bootstraps a truncated episode
    from (never ``step.state``: there those rows hold the new episode's first state).

    Raises:
        ValueError: the env has a global state and an episode ended, but the step carries no
            ``final_state``.
    """
    if step.state is None or step.final_obs is None:
        return None
    if step.final_state is None:
        raise ValueError(
            "env: an episode ended (same-step autoreset) in an env with a global state, but "
            "its MultiAgentStep has final_state None, so the ended episode's last state is "
            "lost (step.state holds the new episode's first); set final_state [E, "
            "*state_shape] to the ended episodes' last state() where env_done"
        )
    return step.final_state


def group_agents(
    agents: Sequence[str], obs_spaces: Mapping[str, Any], act_spaces: Mapping[str, Any]
) -> dict[str, tuple[str, ...]]:
    """Groups of ``agents`` (in their order): one group ``"agents"`` when every agent has the
    same observation and action space, else one group per distinct pair of spaces, named after
    the prefix of its first agent's name (``"adversary_0"`` -> ``"adversary"``, made unique).
    A ValueError names an agent without a space."""
    for name, of_agent in (("observation", obs_spaces), ("action", act_spaces)):
        missing = [a for a in agents if a not in of_agent]
        if missing:
            raise ValueError(
                f"agent {missing[0]!r}: no {name} space (spaces given for {sorted(of_agent)}); "
                "give every agent an observation and an action space"
            )
    keys: dict[str, list[str]] = {}
    firsts: dict[str, str] = {}
    for agent in agents:
        key = f"{obs_spaces[agent]!r}|{act_spaces[agent]!r}"
        keys.setdefault(key, []).append(agent)
        firsts.setdefault(key, agent)
    if len(keys) == 1:
        return {"agents": tuple(agents)}
    out: dict[str, tuple[str, ...]] = {}
    for key, members in keys.items():
        base = firsts[key].rsplit("_", 1)[0] or firsts[key]
        name, i = base, 1
        while name in out:
            name, i = f"{base}_{i}", i + 1
        out[name] = tuple(members)
    return out


def action_shape(space: Any) -> tuple[tuple[int, ...], bool]:
    """(one agent's action shape, whether discrete) of a gymnasium space (sources convert
    theirs at the boundary, e.g. :func:`rlstash.envs.vmas.to_gymnasium`): Discrete -> ((),
    True), Box -> (shape, False). A TypeError names the space otherwise."""
    if isinstance(space, spaces.Discrete):
        return (), True
    if not isinstance(space, spaces.Box):
        raise TypeError(f"action space {space!r}: expected a Discrete or a Box")
    return tuple(int(s) for s in space.shape), False


def check_actions(
    actions: Mapping[str, Any],
    groups: Mapping[str, Sequence[str]],
    action_spaces: Mapping[str, Any],
    num_envs: int,
    device: torch.device,
) -> dict[str, torch.Tensor]:
    """``actions`` checked and put on ``device`` per group: [E, A_g, *act_shape] float32 for a
    Box, [E, A_g] int64 for a Discrete. ``actions`` is keyed by group (a tensor per group) or by
    agent name (a tensor [E, *act_shape] per agent, stacked here in the group's order); every
    agent must get one. Unknown names, missing agents, wrong shapes, dtypes or devices are
    refused naming the group or agent, what was expected, what came, and the fix."""
    if not isinstance(actions, Mapping):
        raise TypeError(
            f"actions: expected a dict of tensors by group ({sorted(groups)}), got "
            f"{type(actions).__name__}"
        )
    owner = {agent: g for g, members in groups.items() for agent in members}
    unknown = [k for k in actions if k not in groups and k not in owner]
    if unknown:
        raise ValueError(
            f"actions: unknown group or agent {unknown[0]!r}; expected the groups "
            f"{sorted(groups)} (or agent names {list(owner)}): fix the key"
        )
    out: dict[str, torch.Tensor] = {}
    for group, members in groups.items():
        shape, discrete = action_shape(action_spaces[group])
        if group in actions:
            extra = [a for a in members if a in actions]
            if extra:
                raise ValueError(
                    f"actions: agent {extra[0]!r} given both alone and in its group {group!r}; "
                    "give each agent's action once"
                )
            what, value = f"actions[{group!r}]", actions[group]
            want = (num_envs, len(members), *shape)
            out[group] = _checked(what, value, want, discrete, device, group)
            continue
        missing = [a for a in members if a not in actions]
        if missing:
            raise ValueError(
                f"actions: no action for agent {missing[0]!r} (group {group!r}); give "
                f"actions[{group!r}] [E, A_g, ...] or one tensor per agent"
            )
        parts = [
            _checked(f"actions[{a!r}]", actions[a], (num_envs, *shape), discrete, device, a)
            for a in members
        ]
        out[group] = torch.stack(parts, 1)
    return out


def _checked(
    what: str, value: Any, shape: tuple[int, ...], discrete: bool, device: torch.device,
    name: str,
) -> torch.Tensor:  # fmt: skip
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{what}: expected a torch.Tensor for {name!r}, got {type(value).__name__}")
    if tuple(value.shape) != shape:
        kind = "int64 indices" if discrete else "float actions"
        raise ValueError(
            f"{what}: {name!r} expected shape {list(shape)} ({kind}: [E, A_g, ...] per group, "
            f"[E, ...] per agent), got {list(value.shape)}; fix the policy's output shape"
        )
    if discrete and (value.is_floating_point() or value.dtype == torch.bool):
        raise TypeError(f"{what}: {name!r} expected integer action indices, got {value.dtype}")
    if not discrete and not value.is_floating_point():
        raise TypeError(f"{what}: {name!r} expected float actions, got {value.dtype}")
    if value.device != device and not (value.device.type == device.type and device.index is None):
        raise ValueError(
            f"{what}: {name!r} expected a tensor on {device} (the env's device), got "
            f"{value.device}; move it there with .to({str(device)!r})"
        )
    return value.long() if discrete else value.float()


def flat_obs_dim(space: Any) -> int:
    """Elements of one observation of ``space`` (a Box, or a Dict of Boxes: their sum)."""
    if isinstance(space, spaces.Dict):
        return sum(flat_obs_dim(s) for s in space.spaces.values())
    n = 1
    for s in space.shape:
        n *= int(s)
    return n


def flatten_obs(obs: ObsPart, lead: int = 2) -> torch.Tensor:
    """An observation part [*lead dims, ...] as [*lead dims, D] float32; a dict observation's
    tensors flattened and concatenated in sorted key order."""
    if isinstance(obs, Mapping):
        return torch.cat([flatten_obs(obs[k], lead) for k in sorted(obs)], -1)
    return obs.reshape(*obs.shape[:lead], -1).float()
