"""MAPPO/IPPO over several agent groups: one :class:`~rlstash.agents.mappo.MAPPO` per group.

Agents with different observation or action spaces form separate groups (as TorchRL and
BenchMARL group them, :func:`rlstash.envs.multiagent.group_agents`); each group has its own
actor and critic (shared within the group, or per agent, as its config says), learns on its own
[T, E, A_g] rollout and keeps its own optimizers::

    agent = GroupedMAPPO({"adversary": MAPPO(1, 8, n_actions=5, state_dim=28, ...),
                          "agent": MAPPO(2, 10, n_actions=5, state_dim=28, ...)})
    collector.collect(agent, rollout)          # rollout: a GroupedRollout
    metrics = agent.update(rollout)            # each group's update; "policy_loss_agent", ...

MAPPO's centralised critic of every group sees the same global input: the env's state where it
has one, else every group's observations concatenated (``state_dim`` = sum_g A_g * D_g; the
:class:`~rlstash.storage.marl_rollout.GroupedRollout` builds it for the update, the collector
for final observations). IPPO's critics see their agent's own observation. The metrics are each
group's (``<metric>_<group>``) and their mean over groups (``<metric>``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from rlstash.agents.mappo import MAPPO, METRICS
from rlstash.storage.marl_rollout import GroupedRollout


class GroupedMAPPO:
    """One :class:`MAPPO` (or IPPO) per agent group (module docstring). ``agents``: group
    name -> its agent, all MAPPO or all IPPO, on one device."""

    def __init__(self, agents: Mapping[str, MAPPO]) -> None:
        if not isinstance(agents, Mapping) or not agents:
            raise ValueError(f"agents: expected a dict of group name -> MAPPO, got {agents!r}")
        self.agents: dict[str, MAPPO] = dict(agents)
        first = next(iter(self.agents.values()))
        for g, a in self.agents.items():
            if a.algo != first.algo or a.device != first.device:
                raise ValueError(
                    f"agents[{g!r}]: {a.algo} on {a.device}, but the first group's agent is "
                    f"{first.algo} on {first.device}; give every group the same algorithm "
                    "and device"
                )
        self.config, self.algo, self.device = first.config, first.algo, first.device
        self.planned_updates = 0

    @property
    def updates(self) -> int:
        """Updates done (every group updates once per rollout)."""
        return min(a.updates for a in self.agents.values())

    @property
    def compile_seconds(self) -> float:
        """Wall seconds the groups' compiled steps' first calls took."""
        return sum(a.compile_seconds for a in self.agents.values())

    def parameters(self) -> list[torch.nn.Module]:
        """Every group's actor and critic."""
        return [m for a in self.agents.values() for m in (a.actor, a.critic)]

    def update(self, rollout: GroupedRollout) -> dict[str, torch.Tensor]:
        """Each group's :meth:`MAPPO.update` on its view of ``rollout`` (its critic's global
        input joined in); per-group metrics and their mean over groups (0-dim tensors)."""
        joint = self.algo == "mappo"
        out: dict[str, torch.Tensor] = {}
        for g, agent in self.agents.items():
            for k, v in agent.update(rollout.view(g, joint=joint)).items():
                out[f"{k}_{g}"] = v
        n = len(self.agents)
        for k in METRICS:
            parts = [out[f"{k}_{g}"] for g in self.agents if f"{k}_{g}" in out]
            if parts:
                out[k] = torch.stack(parts).sum() / n
        return out

    def check_finite(self, metrics: Mapping[str, Any] | None = None, params: bool = False) -> None:
        """:meth:`MAPPO.check_finite` of every group (the mean metrics stand for all)."""
        for i, agent in enumerate(self.agents.values()):
            agent.check_finite(metrics if i == 0 else None, params)

    def state_dict(self) -> dict[str, Any]:
        """Every group's :meth:`MAPPO.state_dict`, by group."""
        return {"groups": {g: a.state_dict() for g, a in self.agents.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load what :meth:`state_dict` wrote; a ValueError names a group that is missing or
        extra."""
        saved = state.get("groups") if isinstance(state, Mapping) else None
        if not isinstance(saved, Mapping) or set(saved) != set(self.agents):
            have = sorted(saved) if isinstance(saved, Mapping) else "no groups"
            raise ValueError(
                f"agent state: holds groups {have}, expected {sorted(self.agents)}; load a "
                "checkpoint of a run with the same env and groups"
            )
        for g, agent in self.agents.items():
            agent.load_state_dict(saved[g])


__all__ = ["GroupedMAPPO"]
