"""Asynchronous batches: step whichever envs are ready, each env's steps into its own lane.

An env pool in asynchronous mode (EnvPool with ``batch_size < num_envs``:
:class:`~rlstash.envs.envpool_env.EnvPoolVectorEnv`; rlstash's own workers:
``ProcessPoolVectorEnv(..., batch_size=B)``, :mod:`rlstash.envs.pool_async`) answers ``recv()`` with the results of
the first ``batch_size`` envs that finished their step, whichever they are, and takes the
next actions for exactly those envs with ``send(actions, env_ids)``; slow envs no longer hold
the fast ones back. :class:`AsyncBatchCollector` runs that loop::

    env = EnvPoolVectorEnv("ALE/Pong-v5", num_envs=32, batch_size=16, seed=0)
    collector = AsyncBatchCollector(env, policy)     # policy(obs [B, ...], env_ids [B]) -> [B]
    collector.collect_into(stream, steps=10_000)     # a StreamStorage of num_envs lanes

The policy sees a batch of the ready envs with their ids. Each env's step (the observation
its action was taken from, the action, then the reward and flags its result brings) is queued
for that env; rows of one step per env go to the storage, ``[T, N]`` batches of ``extend``
(column ``e``: env ``e``'s oldest queued steps; ``collect_into`` writes every 8 complete rows,
``collect`` returns ``frames_per_batch / N`` of them, as :class:`~rlstash.collect.sync.Collector`
batches are laid out, for the training loop). A stream storage's lanes are
independent rings, so env ``e``'s lane receives exactly the steps env ``e`` took, in its own
order, however the envs interleaved: episode boundaries (next-step autoreset, recognised per
lane), final observations and frame stacks are those of a synchronous run of the same env
with the same actions (``tests/collect/test_async_batches.py`` checks this property;
``tests/envs/test_pool_async.py`` on the process pool against its synchronous run). A step
whose result says ``infos["worker_restarted"]`` (the pool restarted that env's worker) goes to
the storage with ``restarted``: the stream ends the episode at the last real observation, as
for the synchronous collector's batches. Steps still queued when collection stops stay queued
for the next call.

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

from rlstash.collect.episodes import EpisodeStats, EpisodeTracker
from rlstash.core import missing_members

AsyncPolicy = Callable[[np.ndarray, np.ndarray], Any]
FIELDS = ("obs", "action", "reward", "terminated", "truncated", "restarted")


@runtime_checkable
class AsyncEnvPool(Protocol):
    """The env protocol of the module docstring (EnvPool's with ``batch_size < num_envs``)."""

    num_envs: int

    def async_reset(self) -> None: ...

    def recv(self) -> tuple[Any, ...]: ...

    def send(self, actions: Any, env_ids: Any) -> None: ...


class AsyncBatchCollector:
    """The ready-envs loop of the module docstring, into a storage of ``num_envs`` lanes.

    Each env's steps are rows of a ring ``[cap, N, ...]`` per field: env ``e``'s ``k``-th
    step (counted since the last reset) is at ``[k % cap, e]``. Every row popped takes one
    step of every env, so the rows popped so far are the same ``head`` for all envs: rows
    ``head..head+T`` are one (or, across the ring's end, two) slices, ``[T, N]`` batches with
    no per-env gather. A result's observation and the action chosen for it go into the env's
    next row at once; the reward and flags its next result brings complete that row."""

    def __init__(
        self, env: Any, policy: AsyncPolicy, queue: int = 64, frames_per_batch: int | None = None
    ) -> None:
        """``env``: an asynchronous env pool (module docstring); ``policy(obs, env_ids)``:
        actions ``[B, ...]`` for the observations ``[B, ...]`` of the envs ``env_ids``;
        ``queue``: steps each env may have queued at first (the rings double when an env
        runs further ahead of the slowest); ``frames_per_batch``: env steps per
        :meth:`collect` batch (a multiple of ``num_envs``; default ``num_envs``)."""
        missing = missing_members(env, AsyncEnvPool)
        if missing:
            raise TypeError(
                f"env: expected an asynchronous env pool with async_reset/recv/send "
                f"(EnvPoolVectorEnv(..., batch_size=B)), got {type(env).__name__} "
                f"without {', '.join(missing)}; use rlstash.Collector for synchronous envs"
            )
        self.env, self.policy = env, policy
        self.num_envs = n = int(env.num_envs)
        frames = n if frames_per_batch is None else frames_per_batch
        if isinstance(frames, bool) or not isinstance(frames, int) or frames < n or frames % n:
            raise ValueError(
                f"frames_per_batch: expected a multiple of num_envs ({n}), got {frames!r}"
            )
        self.steps_per_batch = frames // n
        self._cap = 1 << max(1, int(queue) - 1).bit_length()  # a power of two >= queue
        self._q: dict[str, np.ndarray] | None = None  # field -> [cap, N, ...] rings
        self._head = 0  # rows popped (the same for every env)
        self._tail = np.zeros(n, dtype=np.int64)  # complete steps of each env
        self._acted = np.zeros(n, dtype=bool)  # row tail[e] holds obs and action
        self._lanes = np.arange(n)
        self.env_steps = 0  # results received that end a step (reset results not counted)
        self.frames = 0  # env steps handed out as rows (collect, collect_into)
        self._episodes = EpisodeTracker(n)
        self._started = False

    @property
    def stats(self) -> EpisodeStats:
        """Returns and lengths of the episodes finished in the rows handed out."""
        return self._episodes.stats

    def reset(self) -> None:
        """Reset every env (their first observations arrive with the next ``recv``); steps
        still queued are dropped."""
        self.env.async_reset()
        self._head = 0
        self._tail[:] = 0
        self._acted[:] = False
        self._episodes.reset()
        self._started = True

    def step_ready(self) -> np.ndarray:
        """Receive one batch of ready envs, queue their steps, send their next actions;
        returns their ids."""
        if not self._started:
            self.reset()
        obs, reward, terminated, truncated, info = self.env.recv()
        ids = np.asarray(info["env_id"], dtype=np.int64)
        obs = np.asarray(obs)
        if self._q is None:
            self._q = self._rings(obs)
        q, tail = self._q, self._tail
        done = self._acted[ids]  # these results complete the row their action started
        if done.all():
            e, rows = ids, slice(None)
        else:
            rows = np.flatnonzero(done)
            e = ids[rows]
        if len(e):
            slot = tail[e] & (self._cap - 1)
            q["reward"][slot, e] = np.asarray(reward)[rows]
            q["terminated"][slot, e] = np.asarray(terminated)[rows]
            q["truncated"][slot, e] = np.asarray(truncated)[rows]
            gone = info.get("worker_restarted")  # the pool restarted their worker
            q["restarted"][slot, e] = False if gone is None else np.asarray(gone, bool)[rows]
            tail[e] += 1
            self.env_steps += len(e)
        t = tail[ids]
        if int(t.max()) - self._head >= self._cap:
            self._grow()
            q = self._q
        slot = t & (self._cap - 1)
        q["obs"][slot, ids] = obs
        actions = np.asarray(self.policy(obs, ids))
        if "action" not in q:
            q["action"] = np.zeros((self._cap, self.num_envs, *actions.shape[1:]), actions.dtype)
        q["action"][slot, ids] = actions
        self._acted[ids] = True
        self.env.send(actions, ids)
        return ids

    def _rings(self, obs: np.ndarray) -> dict[str, np.ndarray]:
        cap, n = self._cap, self.num_envs
        return {
            "obs": np.zeros((cap, n, *obs.shape[1:]), obs.dtype),
            "reward": np.zeros((cap, n), np.float32),
            "terminated": np.zeros((cap, n), bool),
            "truncated": np.zeros((cap, n), bool),
            "restarted": np.zeros((cap, n), bool),
        }

    def _grow(self) -> None:
        """Double the rings, each row moving to its slot in the larger ring."""
        assert self._q is not None
        cap = self._cap
        rows = self._head + np.arange(cap)  # every row that may be in use, oldest first
        old, new = rows & (cap - 1), rows & (2 * cap - 1)
        for k, a in self._q.items():
            grown = np.zeros((2 * cap, *a.shape[1:]), a.dtype)
            grown[new] = a[old]
            self._q[k] = grown
        self._cap = 2 * cap

    def ready_rows(self) -> int:
        """Whole steps of all envs queued (what the storage can take now)."""
        return int(self._tail.min()) - self._head

    def queued(self) -> np.ndarray:
        """Steps queued per env ([N])."""
        return self._tail - self._head

    def pop(self, rows: int | None = None) -> dict[str, torch.Tensor] | None:
        """``rows`` queued steps of every env (default: all whole rows) as a ``[T, N, ...]``
        batch (column ``e``: env ``e``'s oldest queued steps, in order; ``restarted`` only
        when some step of it is), or None while a row is missing."""
        ready = self.ready_rows()
        T = ready if rows is None else min(rows, ready)
        if self._q is None or T <= 0:
            return None
        first = self._head & (self._cap - 1)
        end = first + T
        parts = {}
        for k in FIELDS:
            a = self._q[k]
            parts[k] = (
                a[first:end].copy()
                if end <= self._cap
                else np.concatenate((a[first:], a[: end - self._cap]))
            )
        if not parts["restarted"].any():  # only then: the stream ends those episodes (I7)
            del parts["restarted"]
        self._head += T
        self.frames += T * self.num_envs
        self._episodes.rows(parts["reward"], parts["terminated"], parts["truncated"])
        return {k: torch.from_numpy(v) for k, v in parts.items()}

    def pop_rows(self) -> dict[str, torch.Tensor] | None:
        """One queued step of every env as a ``[N, ...]`` batch (row ``e``: env ``e``'s oldest
        queued step), or None while some env has none."""
        batch = self.pop(1)
        return None if batch is None else {k: v[0] for k, v in batch.items()}

    def collect(self) -> dict[str, torch.Tensor]:
        """Step ready envs until ``frames_per_batch / num_envs`` whole rows are queued; return
        them as a ``[T, N]`` batch (a :class:`~rlstash.collect.sync.Collector` batch's
        layout: obs, action, reward, terminated, truncated, restarted when a worker was)."""
        T = self.steps_per_batch
        while self.ready_rows() < T:
            self.step_ready()
        batch = self.pop(T)
        assert batch is not None
        return batch

    def collect_into(self, storage: Any, steps: int, chunk: int = 8) -> int:
        """Step ready envs until at least ``steps`` more env steps were received, writing
        the complete rows into ``storage`` as ``[T, N]`` batches (one step per lane and row):
        whenever ``chunk`` rows are complete, and every complete row before returning (a
        storage's ``extend`` costs about the same for 1 row or 8); returns the rows written."""
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
            raise ValueError(f"steps: expected an int >= 1, got {steps!r}")
        target, rows = self.env_steps + steps, 0
        while True:
            done = self.env_steps >= target
            if self.ready_rows() >= (1 if done else chunk):
                batch = self.pop()
                assert batch is not None
                storage.extend(batch)
                rows += len(batch["reward"])
            if done:
                return rows
            self.step_ready()
