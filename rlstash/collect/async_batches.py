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

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from rlstash.core import missing_members

AsyncPolicy = Callable[[np.ndarray, np.ndarray], Any]


@runtime_checkable
class AsyncEnvPool(Protocol):
    """The env protocol of the module docstring (EnvPool's with ``batch_size < num_envs``)."""

    num_envs: int

    def async_reset(self) -> None: ...

    def recv(self) -> tuple[Any, ...]: ...

    def send(self, actions: Any, env_ids: Any) -> None: ...


class AsyncBatchCollector:
    """The ready-envs loop of the module docstring, into a storage of ``num_envs`` lanes."""

    def __init__(self, env: Any, policy: AsyncPolicy, queue: int = 64) -> None:
        """``env``: an asynchronous env pool (module docstring); ``policy(obs, env_ids)``:
        actions ``[B, ...]`` for the observations ``[B, ...]`` of the envs ``env_ids``;
        ``queue``: steps each env may have queued at first (the queues grow when an env runs
        further ahead of the slowest)."""
        missing = missing_members(env, AsyncEnvPool)
        if missing:
            raise TypeError(
                f"env: expected an asynchronous env pool with async_reset/recv/send "
                f"(EnvPoolVectorEnv(..., batch_size=B)), got {type(env).__name__} "
                f"without {', '.join(missing)}; use rlstash.Collector for synchronous envs"
            )
        self.env, self.policy = env, policy
        self.num_envs = n = int(env.num_envs)
        self._cap = max(2, int(queue))
        self._q: dict[str, np.ndarray] | None = None  # field -> [N, cap, ...], per-env rings
        self._head = np.zeros(n, dtype=np.int64)  # oldest queued step of each env
        self._tail = np.zeros(n, dtype=np.int64)  # steps queued so far (head..tail)
        self._obs: np.ndarray | None = None  # [N, ...] the observation each env acts from
        self._act: np.ndarray | None = None  # [N, ...] its action, awaiting its result
        self._acted = np.zeros(n, dtype=bool)  # an action was sent since the last reset
        self.env_steps = 0  # results received (every env step, reset steps included)
        self._started = False

    def reset(self) -> None:
        """Reset every env (their first observations arrive with the next ``recv``)."""
        self.env.async_reset()
        self._head[:] = 0
        self._tail[:] = 0
        self._acted[:] = False
        self._started = True

    def step_ready(self) -> np.ndarray:
        """Receive one batch of ready envs, queue their steps, send their next actions;
        returns their ids."""
        if not self._started:
            self.reset()
        obs, reward, terminated, truncated, info = self.env.recv()
        ids = np.asarray(info["env_id"], dtype=np.int64)
        obs = np.asarray(obs)
        if self._obs is None:
            self._obs = np.zeros((self.num_envs, *obs.shape[1:]), dtype=obs.dtype)
        done = self._acted[ids]  # these results end a step: queue (obs, action, result)
        if done.any():
            e = ids[done]
            self._queue(e, self._obs[e], self._act[e], reward, terminated, truncated, done)
            self.env_steps += int(done.sum())
        self._obs[ids] = obs
        actions = np.asarray(self.policy(obs, ids))
        if self._act is None:
            self._act = np.zeros((self.num_envs, *actions.shape[1:]), dtype=actions.dtype)
        self._act[ids] = actions
        self._acted[ids] = True
        self.env.send(actions, ids)
        return ids

    def _queue(self, envs, obs, act, reward, term, trunc, rows) -> None:
        if self._q is None:
            n, cap = self.num_envs, self._cap
            self._q = {
                "obs": np.zeros((n, cap, *obs.shape[1:]), obs.dtype),
                "action": np.zeros((n, cap, *act.shape[1:]), act.dtype),
                "reward": np.zeros((n, cap), np.float32),
                "terminated": np.zeros((n, cap), bool),
                "truncated": np.zeros((n, cap), bool),
            }
        if int((self._tail[envs] - self._head[envs]).max()) >= self._cap:
            self._grow()
        slot = self._tail[envs] % self._cap
        q = self._q
        q["obs"][envs, slot] = obs
        q["action"][envs, slot] = act
        q["reward"][envs, slot] = np.asarray(reward)[rows]
        q["terminated"][envs, slot] = np.asarray(term)[rows]
        q["truncated"][envs, slot] = np.asarray(trunc)[rows]
        self._tail[envs] += 1

    def _grow(self) -> None:
        """Double the rings, keeping each env's queued steps in order."""
        assert self._q is not None
        cap, n = self._cap, self.num_envs
        order = (self._head[:, None] + np.arange(cap)[None, :]) % cap  # oldest first
        lanes = np.arange(n)[:, None]
        for k, a in self._q.items():
            grown = np.zeros((n, 2 * cap, *a.shape[2:]), a.dtype)
            grown[:, :cap] = a[lanes, order]
            self._q[k] = grown
        self._tail -= self._head
        self._head[:] = 0
        self._cap = 2 * cap

    def ready_rows(self) -> int:
        """Whole steps of all envs queued (what the storage can take now)."""
        return int((self._tail - self._head).min())

    def queued(self) -> np.ndarray:
        """Steps queued per env ([N])."""
        return self._tail - self._head

    def pop_rows(self) -> dict[str, torch.Tensor] | None:
        """One queued step of every env as a ``[N, ...]`` batch (row ``e``: env ``e``'s oldest
        queued step), or None while some env has none."""
        if self._q is None or self.ready_rows() == 0:
            return None
        slot = self._head % self._cap
        lanes = np.arange(self.num_envs)
        batch = {k: torch.from_numpy(a[lanes, slot]) for k, a in self._q.items()}
        self._head += 1
        return batch

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
