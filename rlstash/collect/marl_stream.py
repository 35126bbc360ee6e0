"""MultiAgentStreamCollector: steps of a multi-agent vector env as a ``[T, E]`` chunk for a
multi-agent stream (:mod:`rlstash.storage.stream_agents`), for off-policy MARL (QMIX, VDN).

::

    collector = MultiAgentStreamCollector(env, steps=600)   # one agent group, same-step resets
    batch = collector.collect(agent)      # {"obs": [T, E, A, D], "action": [T, E, A], ...}
    replay.extend(batch)                  # a StreamStorage of agent_step_spec (autoreset SameStep)

Per step the agent acts on the group's observations [E, A, D] (flattened per agent; a dict
observation's keys concatenated in sorted order), the env steps, and the step is laid out as the
stream's fields: ``obs``, ``obs/state``, ``obs/action_mask`` (bits), ``obs/mask`` (the agents
that acted), ``action`` and ``reward`` (0 where an agent did not act), and the env's episode
end: ``truncated`` where the env ended with an agent truncated (a time limit, a restarted
worker), else ``terminated``. Where an env ended (same-step autoreset) the ``final_`` fields
hold its ended episode's last values: the final observations, the agents still acting after
the last step (``mask`` and not terminated), all actions available, and the ended episode's
last global state (the env's ``final_state``, :func:`~rlstash.envs.multiagent.final_state`:
the mixer's input where a truncated episode is bootstrapped). Nothing is read on the host: T
steps fill one chunk (each value copied in as it is read), one ``extend``.
"""

from __future__ import annotations

from typing import Any

import torch

from rlstash.collect.multiagent import EpisodeStats
from rlstash.envs.multiagent import (
    MultiAgentStep,
    MultiAgentVectorEnv,
    final_state,
    flatten_obs,
)
from rlstash.storage.stream_agents import ACTION_MASK, MASK, STATE, pack_bits

OBS_FIELDS = ("obs", STATE, ACTION_MASK, MASK)


class MultiAgentStreamCollector:
    """Collects ``steps`` steps of every env of ``env`` (one agent group) per :meth:`collect`."""

    def __init__(self, env: MultiAgentVectorEnv, steps: int, seed: int | None = None) -> None:
        if len(env.groups) != 1:
            raise ValueError(
                f"env: has agent groups {sorted(env.groups)}; the multi-agent stream holds one "
                "group (agents with identical spaces): use an env whose agents are alike"
            )
        self.env, self.steps_per_batch = env, int(steps)
        self.group = next(iter(env.groups))
        self.n_agents, self.num_envs = len(env.groups[self.group]), env.num_envs
        self.stats = EpisodeStats(env.num_envs, self.n_agents, env.device)
        self.last: MultiAgentStep = env.reset(seed=seed)
        self.has_state = self.last.state is not None
        self.has_action_mask = self.last.action_mask[self.group] is not None

    def fields(self, step: MultiAgentStep) -> dict[str, torch.Tensor]:
        """The observation fields of ``step`` (what an action is taken from)."""
        g = self.group
        out = {"obs": flatten_obs(step.obs[g]), MASK: step.mask[g]}
        if self.has_state:
            out[STATE] = step.state.reshape(self.num_envs, -1).float()
        if self.has_action_mask:
            out[ACTION_MASK] = pack_bits(step.action_mask[g])
        return out

    @torch.no_grad()
    def collect(self, agent: Any) -> dict[str, torch.Tensor]:
        """``steps`` steps of every env by ``agent`` (``act(obs, action_mask) -> (action,
        env action, _)``): the stream's fields [T, E, ...] plus the ``final_`` ones.

        Each value is copied into the chunk when it is read: an env's tensors may be views
        that its next step overwrites (PettingZoo's pool: shared memory)."""
        g, T = self.group, self.steps_per_batch
        chunk: dict[str, torch.Tensor] = {}

        def put(t: int, values: dict[str, torch.Tensor]) -> None:
            for k, v in values.items():
                if k not in chunk:
                    chunk[k] = torch.empty((T, *v.shape), dtype=v.dtype, device=v.device)
                chunk[k][t].copy_(v)

        for t in range(T):
            step = self.last
            obs = self.fields(step)
            obs.pop(MASK)  # which agents act in this step: the step's own mask, below
            put(t, obs)
            _, action, _ = agent.act(obs["obs"], step.action_mask[g])
            action = action.to(self.env.device)
            nxt = self.env.step({g: action})
            m = nxt.mask[g]  # the agents that acted in this step
            truncated = nxt.env_done & nxt.truncated[g].any(-1)  # [E]
            row = {MASK: m, "action": torch.where(m, action, 0),
                   "reward": torch.where(m, nxt.reward[g], 0.0),
                   "terminated": nxt.env_done & ~truncated, "truncated": truncated}  # fmt: skip
            final = self.fields(nxt)  # rows read only where an env ended
            if nxt.final_obs is not None:
                final["obs"] = flatten_obs(nxt.final_obs[g])
                if self.has_state:
                    final[STATE] = final_state(nxt).reshape(self.num_envs, -1).float()
            final[MASK] = m & ~nxt.terminated[g]
            if self.has_action_mask:
                final[ACTION_MASK] = torch.full_like(final[ACTION_MASK], 255)
            row.update({"final_" + k: v for k, v in final.items()})
            put(t, row)
            self.stats.add(nxt.reward[g] * m, nxt.env_done)
            self.last = nxt
        return chunk

    def close(self) -> None:
        self.env.close()


__all__ = ["OBS_FIELDS", "MultiAgentStreamCollector"]
