"""Episode returns and lengths of collected rows, a ``[T, N]`` chunk at a time.

Row ``t`` of lane ``e`` belongs to the episode under way unless the row before ended one in
next-step autoreset mode (then it is the reset step: no reward, no length). With ``live``
that mask and ``done = (terminated | truncated) & live``, an episode ending at ``(t, e)``
has return ``R = ret_e + sum(reward[s..t, e] * live[s..t, e])`` and length
``L = len_e + sum(live[s..t, e])``, ``s`` the row after lane ``e``'s previous end in the
chunk (or its first row, ``ret_e``/``len_e`` carried from earlier chunks, else 0). With
column cumulative sums ``C`` of the live rewards (and of ``live``), ``R`` is
``C[t] - C[t_prev]`` (or ``ret_e + C[t]`` for the lane's first end in the chunk): a few
array operations per chunk whatever its size, instead of a Python loop per row.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np


@dataclass
class EpisodeStats:
    """Returns and lengths of finished episodes (most recent last)."""

    returns: deque = field(default_factory=lambda: deque(maxlen=100))
    lengths: deque = field(default_factory=lambda: deque(maxlen=100))
    count: int = 0

    def mean_return(self, last: int = 10) -> float:
        r = list(self.returns)[-last:]
        return float(np.mean(r)) if r else float("nan")


def episode_quota(episodes: int, num_envs: int) -> np.ndarray:
    """How many of ``episodes`` evaluation episodes each of ``num_envs`` envs runs: env ``i``
    runs ``(episodes + i) // num_envs`` (Stable-Baselines3's ``evaluate_policy`` split). An
    evaluator that instead kept the first ``episodes`` episodes to end over-represents short
    ones (an env whose episodes fail fast ends several before a long one ends once). Refuses
    an ``episodes`` that is not a positive int."""
    if isinstance(episodes, bool) or not isinstance(episodes, int) or episodes <= 0:
        raise ValueError(f"episodes: expected a positive int, got {episodes!r}")
    return np.array([(episodes + i) // num_envs for i in range(num_envs)], np.int64)


class EpisodeTracker:
    """Running returns and lengths of ``num_envs`` lanes; finished episodes go to ``stats``
    in row order (within a row, env order), as a row-by-row loop would append them."""

    def __init__(self, num_envs: int, same_step: bool = False) -> None:
        self.same_step = same_step
        self.stats = EpisodeStats()
        self.ret = np.zeros(num_envs, np.float64)
        self.len = np.zeros(num_envs, np.int64)
        self.after_done = np.zeros(num_envs, bool)  # next row of each lane is a reset step

    def reset(self) -> None:
        """Every lane starts a new episode (the env was reset)."""
        self.ret[:] = 0
        self.len[:] = 0
        self.after_done[:] = False

    def rows(self, reward: np.ndarray, terminated: np.ndarray, truncated: np.ndarray) -> None:
        """Account for the rows ``[T, N]`` (module docstring)."""
        reward = np.asarray(reward, np.float64).reshape(-1, len(self.ret))
        ended = (np.asarray(terminated) | np.asarray(truncated)).reshape(reward.shape)
        T = len(reward)
        if not ended.any() and not self.after_done.any():  # every row live, nothing ends
            self.ret += reward.sum(0)
            self.len += T
            return
        live = np.empty_like(ended)
        done = np.empty_like(ended)
        prev = self.after_done
        for t in range(T):  # two [N] operations a row: which rows are reset steps
            np.logical_not(prev, out=live[t])
            np.logical_and(ended[t], live[t], out=done[t])
            prev = done[t] if not self.same_step else np.zeros_like(done[t])
        csum = np.cumsum(np.where(live, reward, 0.0), axis=0)  # [T, N]
        clen = np.cumsum(live, axis=0, dtype=np.int64)
        t_at, e_at = np.nonzero(done.T)[::-1]  # ends, lane by lane, in row order
        if t_at.size:
            first = np.ones(t_at.size, bool)
            first[1:] = e_at[1:] != e_at[:-1]  # the lane's first end in this chunk
            before_r = np.where(first, -self.ret[e_at], np.roll(csum[t_at, e_at], 1))
            before_l = np.where(first, -self.len[e_at], np.roll(clen[t_at, e_at], 1))
            returns = csum[t_at, e_at] - before_r
            lengths = clen[t_at, e_at] - before_l
            order = np.lexsort((e_at, t_at))  # row order, env order within a row
            self.stats.returns.extend(returns[order].tolist())
            self.stats.lengths.extend(lengths[order].tolist())
            self.stats.count += int(t_at.size)
        last = np.full(len(self.ret), -1)
        np.maximum.at(last, e_at, t_at)  # the lane's last end in the chunk
        ended_lane = last >= 0
        rows = np.arange(len(self.ret))
        tail_r = csum[-1] - np.where(ended_lane, csum[last, rows], 0.0)
        tail_l = clen[-1] - np.where(ended_lane, clen[last, rows], 0)
        self.ret = np.where(ended_lane, 0.0, self.ret) + tail_r
        self.len = np.where(ended_lane, 0, self.len) + tail_l
        self.after_done = prev.copy()
