"""MultiAgentCollector: fills a [T, E, A] rollout from a multi-agent vector env, on its device.

::

    collector = MultiAgentCollector(env)              # a MultiAgentVectorEnv, one agent group
    collector.collect(agent, rollout)                 # T steps of E envs, every agent
    collector.stats.returns_per_agent()               # mean episode return per agent (host read)

Per step: the agent acts on the group's observations [E, A, D] (flattened per agent; a dict
observation's keys concatenated in sorted order), the env steps, the rollout stores what came
back (:meth:`~rlstash.storage.marl_rollout.MultiAgentRollout.put`). Where an env's episode
ended (same-step autoreset) the critic evaluates the final observations once, then and there:
the rollout stores their value, not the observations. Episode returns are summed per agent on
the device; nothing is read on the host per step beyond what the env itself reads.

The agent: ``act(obs [E, A, D], action_mask, deterministic) -> (stored action, env action,
logp)`` and ``values(obs, state) -> [E, A]`` (:class:`rlstash.agents.mappo.MAPPO`).
"""

from __future__ import annotations

from typing import Any

import torch

from rlstash.envs.multiagent import MultiAgentStep, MultiAgentVectorEnv, flatten_obs


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
    """Steps ``env`` (module docstring); ``group``: the agent group to collect (default: the
    only one; envs with several groups need one agent per group, not yet supported here)."""

    def __init__(self, env: MultiAgentVectorEnv, seed: int | None = None) -> None:
        if len(env.groups) != 1:
            raise ValueError(
                f"env: has agent groups {sorted(env.groups)}; MultiAgentCollector trains one "
                "group (agents with identical spaces): use an env whose agents are alike"
            )
        self.env = env
        self.group = next(iter(env.groups))
        self.n_agents = len(env.groups[self.group])
        self.num_envs = env.num_envs
        self.steps_per_batch = 0
        self.stats = EpisodeStats(env.num_envs, self.n_agents, env.device)
        self.last: MultiAgentStep = env.reset(seed=seed)

    def obs(self, step: MultiAgentStep | None = None) -> torch.Tensor:
        """The group's observations [E, A, D] of ``step`` (default: the latest)."""
        step = step or self.last
        return flatten_obs(step.obs[self.group])

    @torch.no_grad()
    def collect(self, agent: Any, rollout: Any) -> None:
        """Fill ``rollout`` with T steps of every env by ``agent``."""
        g = self.group
        self.steps_per_batch = rollout.steps
        rollout.start(self.obs(), self.last.state)
        for t in range(rollout.steps):
            step = self.last
            stored, env_action, logp = agent.act(self.obs(step), step.action_mask[g])
            nxt = self.env.step({g: env_action})
            final_value = None
            if nxt.final_obs is not None:  # some env ended: V(its final observations)
                # (a global final state is not part of the layout: MAPPO without one takes
                # the concatenated final observations; with one, the next state stands in)
                final = flatten_obs(nxt.final_obs[g])
                v = agent.values(final, nxt.state)
                final_value = v * nxt.env_done[:, None]
            done = nxt.terminated[g] | nxt.truncated[g]
            rollout.put(
                t, stored, logp, step.mask[g], nxt.reward[g], nxt.terminated[g], done,
                self.obs(nxt), nxt.state, final_value, step.action_mask[g],
            )  # fmt: skip
            self.stats.add(nxt.reward[g] * step.mask[g], nxt.env_done)
            self.last = nxt

    @torch.no_grad()
    def evaluate(self, agent: Any, episodes: int, deterministic: bool = True) -> dict[str, Any]:
        """Run ``env`` (fresh, its own envs) until ``episodes`` episodes ended, acting by
        ``agent``; {"returns": [episodes] mean-over-agents returns, "lengths", "per_agent"
        [episodes, A]} (host arrays). Resets the env first."""
        import numpy as np

        g = self.group
        step = self.env.reset()
        E = self.num_envs
        running = torch.zeros(E, self.n_agents, device=self.env.device)
        length = torch.zeros(E, dtype=torch.int64, device=self.env.device)
        done_returns: list[Any] = []
        lengths: list[int] = []
        while len(done_returns) < episodes:
            _, env_action, _ = agent.act(self.obs(step), step.action_mask[g], deterministic)
            step = self.env.step({g: env_action})
            running += step.reward[g] * step.mask[g]
            length += 1
            ended = step.env_done.nonzero().flatten().tolist()  # evaluation: host reads are fine
            for i in ended:
                done_returns.append(running[i].cpu().numpy().copy())
                lengths.append(int(length[i]))
            if ended:
                running[step.env_done] = 0
                length[step.env_done] = 0
        per_agent = np.stack(done_returns[:episodes])
        return {"returns": per_agent.mean(1), "lengths": np.asarray(lengths[:episodes]),
                "per_agent": per_agent}  # fmt: skip

    def close(self) -> None:
        self.env.close()
