"""Asynchronous batches: step whichever envs are ready, each env's steps into its own lane.

An env pool in asynchronous mode (EnvPool with ``batch_size < num_envs``:
:class:`~rlstash.envs.envpool_env.EnvPoolVectorEnv`) answers ``recv()`` with the results of
the first ``batch_size`` envs that finished their step, whichever they are, and takes the
next actions for exactly those envs with ``send(actions, env_ids)``; slow envs no longer hold
the fast ones back. :class:`AsyncBatchCollector` runs that loop::

    env = EnvPoolVectorEnv("ALE/Pong-v5", num_envs=32, batch_size=16, seed=0)
    collector = AsyncBatchCollector(env, policy)     # policy(obs [B, ...], env_ids [B]) -> [B]
    collector.collect_into(stream, steps=10_000)     # a StreamStorage of num_envs lanes

The policy sees a batch of the ready envs with their ids. Each env's step (the observation
its action was taken from, the action, then the reward and flags its result brings) is queued
for that env; as soon as every env has a step queued, one step per env goes to the storage
in one ``extend``: row ``e`` is env ``e``'s oldest queued step. A stream storage's lanes are
independent rings, so env ``e``'s lane receives exactly the steps env ``e`` took, in its own
order, however the envs interleaved: episode boundaries (next-step autoreset, recognised per
lane), final observations and frame stacks are those of a synchronous run of the same env
with the same actions (``tests/collect/test_async_batches.py`` checks this property). Steps
still queued when collection stops stay queued for the next call.

The env protocol (EnvPool's): ``num_envs``; ``async_reset()`` (every env resets, the results
arrive through ``recv``); ``recv() -> (obs, reward, terminated, truncated, info)`` for B
ready envs with ``info["env_id"]`` ([B] ints); ``send(actions, env_ids)``; next-step
autoreset (an env's step after an episode end returns its reset observation, reward 0 and no
flags, and ignores the action).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

AsyncPolicy = Callable[[np.ndarray, np.ndarray], Any]


class AsyncBatchCollector:
    """The ready-envs loop of the module docstring, into a storage of ``num_envs`` lanes."""

    def __init__(self, env: Any, policy: AsyncPolicy) -> None:
        """``env``: an asynchronous env pool (module docstring); ``policy(obs, env_ids)``:
        actions ``[B, ...]`` for the observations ``[B, ...]`` of the envs ``env_ids``."""
        for name in ("async_reset", "recv", "send"):
            if not callable(getattr(env, name, None)):
                raise TypeError(
                    f"env: expected an asynchronous env pool with async_reset/recv/send "
                    f"(EnvPoolVectorEnv(..., batch_size=B)), got {type(env).__name__} "
                    f"without {name}(); use rlstash.Collector for synchronous envs"
                )
        self.env, self.policy = env, policy
        self.num_envs = int(env.num_envs)
        self._obs: list[Any] = [None] * self.num_envs  # the observation each env acts from
        self._act: list[Any] = [None] * self.num_envs  # the action sent, awaiting its result
        self._queued: list[deque] = [deque() for _ in range(self.num_envs)]
        self.env_steps = 0  # results received (every env step, reset steps included)
        self._started = False

    def reset(self) -> None:
        """Reset every env (their first observations arrive with the next ``recv``)."""
        self.env.async_reset()
        self._obs = [None] * self.num_envs
        self._act = [None] * self.num_envs
        for q in self._queued:
            q.clear()
        self._started = True

    def step_ready(self) -> np.ndarray:
        """Receive one batch of ready envs, queue their steps, send their next actions;
        returns their ids."""
        if not self._started:
            self.reset()
        obs, reward, terminated, truncated, info = self.env.recv()
        ids = np.asarray(info["env_id"], dtype=np.int64)
        for j, e in enumerate(ids.tolist()):
            if self._act[e] is not None:  # the result of env e's last action
                self._queued[e].append(
                    (self._obs[e], self._act[e], reward[j], terminated[j], truncated[j])
                )
                self.env_steps += 1
            self._obs[e] = np.array(obs[j])  # the env may reuse its buffer
        actions = np.asarray(self.policy(obs, ids))
        for j, e in enumerate(ids.tolist()):
            self._act[e] = actions[j]
        self.env.send(actions, ids)
        return ids

    def ready_rows(self) -> int:
        """Whole steps of all envs queued (what the storage can take now)."""
        return min(len(q) for q in self._queued)

    def pop_rows(self) -> dict[str, torch.Tensor] | None:
        """One queued step of every env as a ``[N, ...]`` batch (row ``e``: env ``e``'s oldest
        queued step), or None while some env has none."""
        if self.ready_rows() == 0:
            return None
        rows = [q.popleft() for q in self._queued]
        obs, act, rew, term, trunc = zip(*rows)
        return {
            "obs": torch.as_tensor(np.stack(obs)),
            "action": torch.as_tensor(np.stack(act)),
            "reward": torch.as_tensor(np.asarray(rew, dtype=np.float32)),
            "terminated": torch.as_tensor(np.asarray(term, dtype=bool)),
            "truncated": torch.as_tensor(np.asarray(trunc, dtype=bool)),
        }

    def collect_into(self, storage: Any, steps: int) -> int:
        """Step ready envs until at least ``steps`` env steps were received, writing every
        complete row of steps into ``storage`` (``extend``, one step per lane); returns the
        rows written."""
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
            raise ValueError(f"steps: expected an int >= 1, got {steps!r}")
        target, rows = self.env_steps + steps, 0
        while self.env_steps < target:
            self.step_ready()
            while (batch := self.pop_rows()) is not None:
                storage.extend(batch)
                rows += 1
        return rows
