"""Evaluation over a vector env: each env runs its share of the episodes
(rlstash.collect.episodes.episode_quota), so an env whose episodes end fast is not counted
more often than one whose episodes are long. The class: any evaluator that keeps "the first N
episodes to end" (the multi-agent one did: its VMAS balance evaluations over-counted falls).

Both evaluators, single-agent (Collector.rollout) and multi-agent
(MultiAgentCollector.evaluate), over envs where env 0's episodes last 1 step with return -1
and the others' last 5 steps with return +5: 4 episodes on 4 envs are one per env."""

from __future__ import annotations

import gymnasium as gym
import torch
from gymnasium import spaces

from rlstash.collect.multiagent import MultiAgentCollector
from rlstash.collect.sync import Collector
from rlstash.envs.multiagent import MultiAgentStep
from tests.test_video import Blink

LENGTHS = [1, 5, 5, 5]  # env 0 ends at once (a fall), the others run 5 steps


class ShortOrLong(Blink):
    """Blink's episodes of ``length`` steps, each step rewarded -1 if length is 1, else +1."""

    def step(self, action):
        obs, _, term, trunc, info = super().step(action)
        return obs, -1.0 if self.length == 1 else 1.0, term, trunc, info


def test_single_agent_rollout_runs_each_envs_share() -> None:
    env = gym.vector.SyncVectorEnv([lambda n=n: ShortOrLong(n) for n in LENGTHS])
    c = Collector(env, lambda obs: torch.zeros(len(LENGTHS), dtype=torch.int64), 4)
    out = c.rollout(episodes=4, seed=0)
    env.close()
    assert sorted(out["returns"].tolist()) == [-1.0, 5.0, 5.0, 5.0]


class MultiShortOrLong:
    """A MultiAgentVectorEnv of len(LENGTHS) envs x 2 agents, same-step autoreset."""

    groups = {"agents": ("a0", "a1")}
    observation_spaces = {"agents": spaces.Box(-1.0, 1.0, (1,))}
    action_spaces = {"agents": spaces.Box(-1.0, 1.0, (1,))}
    state_space = None
    device = torch.device("cpu")

    def __init__(self) -> None:
        self.num_envs = len(LENGTHS)
        self.length = torch.tensor(LENGTHS)
        self.t = torch.zeros(self.num_envs, dtype=torch.int64)

    def _step(self, reward: torch.Tensor, done: torch.Tensor) -> MultiAgentStep:
        E, A = self.num_envs, 2
        obs = {"agents": torch.zeros(E, A, 1)}
        term = done[:, None].expand(E, A).clone()
        return MultiAgentStep(
            obs=obs, reward={"agents": reward[:, None].expand(E, A).clone()},
            terminated={"agents": term}, truncated={"agents": torch.zeros(E, A, dtype=torch.bool)},
            mask={"agents": torch.ones(E, A, dtype=torch.bool)}, action_mask={"agents": None},
            state=None, env_done=done, final_obs=obs if bool(done.any()) else None,
        )  # fmt: skip

    def reset(self, *, seed: int | None = None) -> MultiAgentStep:
        self.t.zero_()
        return self._step(torch.zeros(self.num_envs), torch.zeros(self.num_envs, dtype=torch.bool))

    def step(self, actions: dict[str, torch.Tensor]) -> MultiAgentStep:
        self.t += 1
        done = self.t >= self.length
        reward = torch.where(self.length == 1, -1.0, 1.0)
        self.t[done] = 0  # same-step autoreset
        return self._step(reward, done)

    def close(self) -> None:
        pass


class ZeroAgent:
    def act(self, obs, action_mask=None, deterministic=False):  # noqa: ANN001, ANN201
        a = torch.zeros(*obs.shape[:-1], 1)
        return a, a, torch.zeros(obs.shape[:-1])


def test_multi_agent_evaluate_runs_each_envs_share() -> None:
    c = MultiAgentCollector(MultiShortOrLong())
    out = c.evaluate(ZeroAgent(), episodes=4)
    assert sorted(out["returns"].tolist()) == [-1.0, 5.0, 5.0, 5.0]
    assert sorted(out["lengths"].tolist()) == [1, 5, 5, 5]
    assert out["per_agent"].shape == (4, 2)
    more = c.evaluate(ZeroAgent(), episodes=6)  # envs 2 and 3 run two each
    assert sorted(more["returns"].tolist()) == [-1.0, 5.0, 5.0, 5.0, 5.0, 5.0]
