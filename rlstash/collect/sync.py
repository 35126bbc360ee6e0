"""Collector: the policy runs in this process, one forward pass for all envs per step.

Two paths, chosen by the env: a host env (a ProcessPoolVectorEnv, gymnasium's numpy vector envs) and a
batched torch env with a ``device`` attribute, found through its wrappers (GPU simulators,
``rlstash/CartPole-v1``), whose tensors stay on that device (:mod:`rlstash.collect.batched`).
On both, the first reset and step are checked (:mod:`rlstash.collect.env_contract`: the
step tuple, ``[N]`` rewards and bool flags, observations ``[N, ...]``) and the autoreset mode
is the env's ``metadata["autoreset_mode"]``, else gymnasium's default, NextStep.

::

    pool = ProcessPoolVectorEnv("CartPole-v1", num_envs=8, seed=0)
    collector = Collector(pool, policy, frames_per_batch=256, device="cpu")
    for batch in collector:          # stream layout, shape [T, N]: obs, action, reward,
        rb.extend(batch)             # terminated, truncated (+ final_obs in same-step mode)

``policy`` maps observations ``[N, *obs_shape]`` on ``device`` to actions ``[N, ...]``. On a
CUDA device observations go there through pinned staging and actions come back with a
synchronized copy (invariant I4); with ``device="cpu"`` no CUDA API is touched (I1). The
caller's current CUDA stream is used unless ``cuda_stream="dedicated"``.

A batch also has ``restarted`` [T, N] (bool) when an ProcessPoolVectorEnv worker was restarted during
it: those steps never happened; the stream storage ends the episodes there as truncated at
the last real observation, never stitched and never bootstrapped from a reset observation.

Row ``t`` of a batch holds the observation the action was taken from. With gymnasium's
next-step autoreset the step after an episode end is a reset step (its action is ignored,
its reward is 0); the stream storage recognises it from the previous row's done flag. In
same-step mode ``final_obs[t]`` holds the last observation of an episode ending at ``t``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from rlstash import autoreset
from rlstash.collect.batched import BatchedPath, host
from rlstash.collect.env_contract import (
    UndeclaredNextStep,
    check_host_obs,
    check_step,
    find_device,
    looks_like_rsl_rl,
    rsl_rl_refusal,
)
from rlstash.collect.episodes import EpisodeStats, EpisodeTracker, episode_quota
from rlstash.core import Acts
from rlstash.device import Delivery, is_cuda, resolve_device
from rlstash.spec import Batch

Policy = Callable[[torch.Tensor], torch.Tensor]


class Collector:
    """Steps a vectorized env with a policy and yields fixed-size time-major batches."""

    def __init__(
        self,
        env: Any,
        policy: Policy,
        frames_per_batch: int,
        device: str | torch.device | None = None,
        cuda_stream: str = "current",
        total_frames: int | None = None,
        seed: int | None = None,
    ) -> None:
        if looks_like_rsl_rl(env):
            raise rsl_rl_refusal(env, "has get_observations() and is no gymnasium VectorEnv")
        n = int(env.num_envs)
        if not isinstance(frames_per_batch, int) or frames_per_batch < n:
            raise ValueError(
                f"frames_per_batch: expected an int >= num_envs ({n}), got {frames_per_batch!r}"
            )
        if frames_per_batch % n:
            raise ValueError(
                f"frames_per_batch: {frames_per_batch} is not a multiple of num_envs ({n}); "
                f"use {frames_per_batch // n * n} or {(frames_per_batch // n + 1) * n}"
            )
        if not callable(policy):
            raise TypeError(
                f"policy: expected a callable obs -> actions, got {type(policy).__name__}"
            )
        self.env, self.policy, self.num_envs = env, policy, n
        self.steps_per_batch = frames_per_batch // n
        self.total_frames = total_frames
        self.frames = 0
        on, wrappers = find_device(env)
        self.batched: BatchedPath | None = None
        self._watch: UndeclaredNextStep | None = None
        if on is not None:  # a batched torch env: the policy runs on its device
            if cuda_stream not in ("current", "dedicated"):
                raise ValueError(
                    f"cuda_stream: expected 'current' or 'dedicated', got {cuda_stream!r}"
                )
            _check_same_device(device, on)
            self.device = on
            self.batched = BatchedPath(env, on, cuda_stream, wrappers)
            self.same_step = self.batched.same_step
        else:
            self.device = resolve_device(device, "device") or torch.device("cpu")
            self.to_device = Delivery(self.device, False, stream=cuda_stream)
            declared = autoreset.declared(env)
            self.same_step = declared == AutoresetMode.SAME_STEP
            if declared is None:  # gymnasium's default, NextStep: watched for same-step signs
                self._watch = UndeclaredNextStep(np.zeros(n, bool))
        self._seed = seed
        self._obs: np.ndarray | None = None
        self._episodes = EpisodeTracker(n, self.same_step)
        self._stats = self._episodes.stats

    def __iter__(self) -> Iterator[Batch]:
        while self.total_frames is None or self.frames < self.total_frames:
            yield self.collect()

    @property
    def next_obs(self) -> Any:
        """The observations the next batch starts from, [N, *obs_shape] (after a batch: the
        observation after its last step, which on-policy learners bootstrap from); on the host
        for host envs, on the env's device (a copy) for batched envs, a dict of them when the
        env's observations are dicts."""
        if self._obs is None:
            self.reset()
        if self.batched is not None:
            return _clone(self._obs)
        return torch.from_numpy(np.array(self._obs, copy=True))

    @property
    def stats(self) -> EpisodeStats:
        """Returns and lengths of finished episodes (batched envs: up to the last batch)."""
        if self.batched is not None and self.batched.log.pending:
            s = self._stats
            s.count += self.batched.log.drain(s.returns, s.lengths)
        return self._stats

    def reset(self, seed: int | None = None) -> None:
        """Reset the env (with ``seed``, or the collector's seed the first time)."""
        seed, self._seed = (seed if seed is not None else self._seed), None
        if self.batched is not None:
            self.batched.reset(seed)
            self._obs = self.batched.obs
            return
        self._obs, _ = self.env.reset(seed=seed)
        check_host_obs(self._obs, self.num_envs)
        if self._watch is not None:
            self._watch.reset()
        self._episodes.reset()

    @torch.no_grad()
    def act(self, obs: Any) -> Any:
        """One forward pass for all envs. Host envs: the actions are a host array, safe to
        read. Batched envs: a tensor on the env's device, queued on the stream."""
        if self.batched is not None:
            return self.batched.act(self.policy, obs)
        obs_t = self.to_device({"obs": torch.from_numpy(np.asarray(obs))})["obs"]
        actions = self.policy(obs_t)
        if is_cuda(actions.device):
            actions = actions.to("cpu")  # blocking device->host copy: complete when it returns
        return actions.numpy()

    def collect_into(self, target: Any) -> np.ndarray:
        """Collect one batch into ``target`` (a StreamStorage, a ReplayBuffer over one, or
        anything with ``extend``); returns the slots written.

        A batched env with next-step autoreset writes each step straight into the stream's
        slots: one copy per field and step, no ``[T, N]`` batch (the stream's rows are
        slot-major, so a step of all envs is one block; :mod:`rlstash.storage.stream_direct`).
        Otherwise, and where the stream cannot take steps so, ``target.extend(self.collect())``.
        """
        if self._obs is None:
            self.reset()
        if self.batched is None:
            return target.extend(self.collect())
        T, N = self.steps_per_batch, self.num_envs
        index = self.batched.collect_into(self.policy, T, target)
        self._obs = self.batched.obs
        self.frames += T * N
        return index

    def collect(self) -> Batch:
        """Step every env ``frames_per_batch / num_envs`` times; return a [T, N] batch."""
        if self._obs is None:
            self.reset()
        T, N = self.steps_per_batch, self.num_envs
        if self.batched is not None:
            batch = self.batched.collect(self.policy, T)
            self._obs = self.batched.obs
            self.frames += T * N
            return batch
        rows: dict[str, list[np.ndarray]] = {
            k: [] for k in ("obs", "action", "reward", "terminated", "truncated")
        }
        finals: list[np.ndarray] = []
        rewards: list[np.ndarray] = []  # as the env gave them, for the episode returns
        restarted = np.zeros((T, N), bool)
        for t in range(T):
            obs = np.array(self._obs, copy=True)
            actions = self.act(obs)
            next_obs, reward, term, trunc, info = self._step(actions, t)
            rows["obs"].append(obs)
            rows["action"].append(np.asarray(actions))
            rewards.append(np.asarray(reward, np.float64))
            rows["reward"].append(rewards[-1].astype(np.float32))
            rows["terminated"].append(np.asarray(term, bool))
            rows["truncated"].append(np.asarray(trunc, bool))
            if self.same_step:
                finals.append(_final_obs(next_obs, info, term | trunc))
            if "worker_restarted" in info:  # ProcessPoolVectorEnv: these envs' steps never happened
                restarted[t] = np.asarray(info["worker_restarted"], bool)
            self._obs = next_obs
        self.frames += T * N
        stacked = {k: np.stack(v) for k, v in rows.items()}
        self._episodes.rows(np.stack(rewards), stacked["terminated"], stacked["truncated"])
        batch = {k: torch.from_numpy(v) for k, v in stacked.items()}
        if self.same_step:
            batch["final_obs"] = torch.from_numpy(np.stack(finals))
        if restarted.any():  # only then: the stream storage ends those episodes cleanly (I7)
            batch["restarted"] = torch.from_numpy(restarted)
        return batch

    def _step(self, actions: np.ndarray, t: int) -> tuple[Any, Any, Any, Any, Any]:
        """``env.step`` on the host path; the first step of a batch checked (``check_step``),
        an env with an undeclared autoreset mode watched at each step."""
        result = self.env.step(actions)
        if t == 0:
            result = check_step(self.env, result, self.num_envs, None)
        if self._watch is not None:
            _, reward, term, trunc, info = result
            self._watch.info(info)
            r, te, tr = (np.asarray(x)[None] for x in (reward, term, trunc))
            self._watch.rows(r, te, tr)
        return result

    @torch.no_grad()
    def rollout(
        self,
        policy: Any = None,
        episodes: int = 10,
        deterministic: bool = True,
        seed: int | None = None,
    ) -> dict[str, np.ndarray]:
        """Run ``episodes`` full episodes on this collector's env (evaluation).

        ``policy`` is a callable obs -> actions or an agent with ``act(obs, deterministic)``
        (default: the collector's policy). Env ``i`` runs ``(episodes + i) // num_envs``
        episodes, so short episodes are not over-represented. Returns host arrays
        ``returns`` and ``lengths``; the env is reset afterwards.
        """
        target = episode_quota(episodes, self.num_envs)  # refuses a bad count first
        saved = self.policy
        self.policy = _as_policy(policy or self.policy, deterministic)
        try:
            returns, lengths = _run_episodes(self, target, seed)
        finally:
            self.policy = saved
            self._obs = None
        return {"returns": np.asarray(returns), "lengths": np.asarray(lengths)}


def _as_policy(policy: Any, deterministic: bool) -> Policy:
    if isinstance(policy, Acts):
        act = policy.act
        return lambda obs: act(obs, deterministic=deterministic)
    return policy


def _run_episodes(
    c: Collector, target: np.ndarray, seed: int | None
) -> tuple[list[float], list[int]]:
    n = c.num_envs
    count = np.zeros(n, np.int64)
    ret, length = np.zeros(n), np.zeros(n, np.int64)
    returns: list[float] = []
    lengths: list[int] = []
    after_done = np.zeros(n, bool)
    obs, _ = c.env.reset(seed=seed)
    if c.batched is None:
        check_host_obs(obs, n)
    while (count < target).any():
        obs, reward, term, trunc, _ = c.env.step(c.act(obs))
        live = (count < target) & ~after_done
        ret += np.where(live, host(reward), 0.0)  # batched envs: a blocking copy (I4)
        length += live
        done = (host(term) | host(trunc)) & live
        for i in np.flatnonzero(done):
            returns.append(float(ret[i]))
            lengths.append(int(length[i]))
            ret[i] = length[i] = 0
            count[i] += 1
        after_done = done if not c.same_step else np.zeros(n, bool)
    return returns, lengths


def _check_same_device(device: Any, on: torch.device) -> None:
    """A batched env fixes the collector's device: ``device`` may only repeat it."""
    if device is None:
        return
    asked = torch.device(device) if not isinstance(device, torch.device) else device
    if asked.type != on.type or (asked.index is not None and asked.index != on.index):
        raise ValueError(
            f"device: the env steps on {on} and the policy must run there (batches stay on the "
            f"env's device), got device={str(device)!r}; pass device=None or {str(on)!r}"
        )


def _final_obs(next_obs: np.ndarray, info: dict, done: np.ndarray) -> np.ndarray:
    out = np.zeros_like(next_obs)
    if "final_obs" in info:
        mask = info.get("_final_obs", done)
        for i in np.flatnonzero(mask):
            out[i] = info["final_obs"][i]
    return out


def _clone(obs: Any) -> Any:
    """A copy of a batched env's observation: a tensor, or a (nested) dict of tensors."""
    if isinstance(obs, Mapping):
        return {k: _clone(v) for k, v in obs.items()}
    return obs.clone()
