"""MultiAgentCollector: fills a [T, E, A] rollout from a multi-agent vector env, on its device.

::

    collector = MultiAgentCollector(env)              # a MultiAgentVectorEnv
    collector.collect(agent, rollout)                 # T steps of E envs, every agent
                                                      # (several groups: an agent per group
                                                      # and a GroupedRollout)
    collector.stats.returns_per_agent()               # mean episode return per agent (host read)

Per step: the agent acts on the group's observations [E, A, D] (flattened per agent; a dict
observation's keys concatenated in sorted order), the env steps, the rollout stores what came
back (:meth:`~rlstash.storage.marl_rollout.MultiAgentRollout.put`). Where an env's episode
ended (same-step autoreset) the critic evaluates the final observations once, then and there,
with the ended episode's last global state (``final_state``,
:func:`~rlstash.envs.multiagent.final_state`; never the new episode's first): the rollout
stores their value, not the observations. Episode returns are summed per agent on
the device; nothing is read on the host per step beyond what the env itself reads.

The agent: ``act(obs [E, A, D], action_mask, deterministic) -> (stored action, env action,
logp)`` and ``values(obs, state) -> [E, A]`` (:class:`rlstash.agents.mappo.MAPPO`). With
several groups each group's agent acts on its own observations and its critic's global input
is the env's state, or (none) every group's observations concatenated.
"""

from __future__ import annotations

from typing import Any

import torch

from rlstash.collect.episodes import episode_quota
from rlstash.envs.multiagent import (
    MultiAgentStep,
    MultiAgentVectorEnv,
    final_state,
    flatten_obs,
)
from rlstash.storage.marl_rollout import GroupedRollout


class EpisodeStats:
    """Returns of the episodes that ended, summed per agent on the device."""

    def __init__(self, num_envs: int, n_agents: int, device: torch.device) -> None:
        self.running = torch.zeros(num_envs, n_agents, device=device)  # [E, A]
        self.total = torch.zeros(n_agents, device=device)  # [A]: sum of ended episodes' returns
        self.episodes = torch.zeros((), dtype=torch.int64, device=device)
        self._seen = (0.0, 0)

    def add(self, reward: torch.Tensor, done: torch.Tensor) -> None:
        """Step rewards [E, A] and env ends [E] (whole-tensor, no host read)."""
        self.running += reward
        d = done[:, None].float()
        self.total += (self.running * d).sum(0)
        self.episodes += done.sum()
        self.running *= 1.0 - d

    def returns_per_agent(self) -> list[float]:
        """Mean return per agent of the episodes ended so far (one host read)."""
        n = max(int(self.episodes), 1)
        return (self.total / n).tolist()

    @property
    def count(self) -> int:
        """Episodes ended so far (one host read)."""
        return int(self.episodes)

    def mean_return(self) -> float:
        """Mean per-agent episode return of the episodes since the last call (nan: none)."""
        total, n = float(self.total.sum()), int(self.episodes)
        seen_total, seen_n = self._seen
        self._seen = (total, n)
        if n == seen_n:
            return float("nan")
        return (total - seen_total) / ((n - seen_n) * self.total.numel())


class MultiAgentCollector:
    """Steps ``env`` (module docstring), every agent group of it: with one group ``agent`` is
    one agent and ``rollout`` a :class:`~rlstash.storage.marl_rollout.MultiAgentRollout`; with
    several, ``agent`` has one agent per group (``agent.agents``, e.g. a
    :class:`~rlstash.agents.mappo_groups.GroupedMAPPO`) and ``rollout`` is a
    :class:`~rlstash.storage.marl_rollout.GroupedRollout`. Episode returns are kept for every
    agent of every group, in group order (:attr:`agent_names`)."""

    def __init__(self, env: MultiAgentVectorEnv, seed: int | None = None) -> None:
        self.env = env
        self.group = next(iter(env.groups))  # the first group (the only one, usually)
        self.agent_names = [a for members in env.groups.values() for a in members]
        self.n_agents = len(self.agent_names)
        self.num_envs = env.num_envs
        self.steps_per_batch = 0
        self.stats = EpisodeStats(env.num_envs, self.n_agents, env.device)
        self.last: MultiAgentStep = env.reset(seed=seed)

    def obs(self, step: MultiAgentStep | None = None, group: str | None = None) -> torch.Tensor:
        """A group's observations [E, A_g, D_g] of ``step`` (default: the latest step, the
        first group)."""
        step = step or self.last
        return flatten_obs(step.obs[group or self.group])

    def agents_of(self, agent: Any) -> dict[str, Any]:
        """The agent acting for each group: ``agent.agents`` (one per group), or ``agent``
        itself when the env has one group; refused naming the groups otherwise."""
        per_group = getattr(agent, "agents", None)
        if per_group is None and len(self.env.groups) == 1:
            return {self.group: agent}
        if per_group is None or set(per_group) != set(self.env.groups):
            have = "one agent" if per_group is None else f"agents for {sorted(per_group)}"
            raise ValueError(
                f"agent: the env has agent groups {sorted(self.env.groups)}, got {have}; give "
                "one agent per group (rlstash.agents.mappo_groups.GroupedMAPPO)"
            )
        return dict(per_group)

    def _joint(self, obs: dict[str, Any], state: torch.Tensor | None) -> torch.Tensor | None:
        """The critics' global input with several groups: the env's state, else every group's
        observations flattened and concatenated [E, sum_g A_g * D_g]."""
        if state is not None or len(self.env.groups) == 1:
            return state
        return torch.cat([flatten_obs(obs[g]).flatten(-2) for g in self.env.groups], -1)

    @torch.no_grad()
    def collect(self, agent: Any, rollout: Any) -> None:
        """Fill ``rollout`` with T steps of every env by ``agent`` (class docstring)."""
        agents = self.agents_of(agent)
        grouped = isinstance(rollout, GroupedRollout)
        parts = rollout.rollouts if grouped else {self.group: rollout}
        self.steps_per_batch = rollout.steps
        if grouped:
            rollout.start({g: self.obs(group=g) for g in parts}, self.last.state)
        else:
            rollout.start(self.obs(), self.last.state)
        for t in range(rollout.steps):
            step = self.last
            acted = {g: a.act(self.obs(step, g), step.action_mask[g]) for g, a in agents.items()}
            nxt = self.env.step({g: out[1] for g, out in acted.items()})
            joint = None
            if nxt.final_obs is not None:  # some env ended: V(its final obs and state)
                joint = self._joint(nxt.final_obs, final_state(nxt))
            for g, r in parts.items():
                final_value = None
                if nxt.final_obs is not None:
                    v = agents[g].values(flatten_obs(nxt.final_obs[g]), joint)
                    final_value = v * nxt.env_done[:, None]
                done = nxt.terminated[g] | nxt.truncated[g]
                stored, _, logp = acted[g]
                r.put(
                    t, stored, logp, nxt.mask[g], nxt.reward[g], nxt.terminated[g], done,
                    self.obs(nxt, g), None if grouped else nxt.state, final_value,
                    step.action_mask[g],
                )  # fmt: skip
            if grouped:
                rollout.put_state(t + 1, nxt.state)
            self.stats.add(self._rewards(nxt), nxt.env_done)
            self.last = nxt

    def _rewards(self, nxt: MultiAgentStep) -> torch.Tensor:
        """Every agent's reward of ``nxt`` [E, A] (group order), 0 where it did not act."""
        parts = [nxt.reward[g] * nxt.mask[g] for g in self.env.groups]
        return parts[0] if len(parts) == 1 else torch.cat(parts, 1)

    @torch.no_grad()
    def evaluate(
        self, agent: Any, episodes: int, deterministic: bool = True,
        on_step: Any = None,
    ) -> dict[str, Any]:  # fmt: skip
        """Run ``env`` (fresh, its own envs) for ``episodes`` episodes, acting by ``agent``:
        env ``i`` runs ``(episodes + i) // num_envs`` of them
        (:func:`~rlstash.collect.episodes.episode_quota`: with one per env, each env's first
        episode, as BenchMARL's evaluation; the first episodes to end would over-represent
        short ones). {"returns": [episodes] mean-over-agents returns, "lengths",
        "per_agent" [episodes, A] (every group's agents, :attr:`agent_names` order)} (host
        arrays, in the order the episodes ended). Resets the env first; ``on_step(step)`` (if
        given) sees the reset and every step."""
        import numpy as np

        target = episode_quota(episodes, self.num_envs)  # refuses a bad count before resetting
        agents = self.agents_of(agent)
        step = self.env.reset()
        if on_step is not None:
            on_step(step)
        E = self.num_envs
        count = np.zeros(E, np.int64)
        running = torch.zeros(E, self.n_agents, device=self.env.device)
        length = torch.zeros(E, dtype=torch.int64, device=self.env.device)
        done_returns: list[Any] = []
        lengths: list[int] = []
        while (count < target).any():
            acts = {g: a.act(self.obs(step, g), step.action_mask[g], deterministic)[1]
                    for g, a in agents.items()}  # fmt: skip
            nxt = self.env.step(acts)
            running += self._rewards(nxt)
            step = nxt
            if on_step is not None:
                on_step(step)
            length += 1
            ended = step.env_done.nonzero().flatten().tolist()  # evaluation: host reads are fine
            for i in ended:
                if count[i] < target[i]:  # an env past its quota runs on, uncounted
                    done_returns.append(running[i].cpu().numpy().copy())
                    lengths.append(int(length[i]))
                    count[i] += 1
            if ended:
                running[step.env_done] = 0
                length[step.env_done] = 0
        per_agent = np.stack(done_returns)
        return {"returns": per_agent.mean(1), "lengths": np.asarray(lengths),
                "per_agent": per_agent}  # fmt: skip

    def close(self) -> None:
        self.env.close()
