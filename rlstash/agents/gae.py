"""Generalized advantage estimation (Schulman et al. 2016) over a [T, N] rollout, on its device.

For step t of env i (rows are time, columns envs)::

    delta_t = r_t + gamma (1 - terminated_t) V(s'_t) - V(s_t)
    A_t     = delta_t + gamma lambda c_t A_{t+1}          A_T = 0
    R_t     = A_t + V(s_t)                                 (the value target)

``s'_t`` is the observation the step led to: the next row's observation inside an episode, the
episode's *final* observation when it ended at t (a truncated episode bootstraps from it; a
terminated one does not bootstrap at all), and the observation after the rollout for the last
row (a running episode bootstraps from it). ``c_t`` is 1 where step t+1 continues the same
episode and 0 where the episode ended at t (terminated or truncated) or the next row is no real
step (a reset step, a restarted worker); the last row has c = 1 with A_T = 0, so a running
episode's tail is the one-step bootstrap ``delta_{T-1}``.

The recursion is a reverse scan over T with whole-row tensor operations: no element is read
on the host, so the rollout may live on a GPU without a per-step synchronization.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlstash.storage.rollout import RolloutStorage, obs_map


def gae(
    reward: torch.Tensor,
    value: torch.Tensor,
    next_value: torch.Tensor,
    terminated: torch.Tensor,
    cont: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages [T, N], returns [T, N]) as in the module docstring.

    ``reward``, ``value`` = V(s_t), ``next_value`` = V(s'_t): float [T, N]; ``terminated`` and
    ``cont`` (= c_t): bool [T, N]. All on one device; the result is on it too."""
    if not 0.0 <= gamma <= 1.0 or not 0.0 <= lam <= 1.0:
        raise ValueError(f"gamma, lam: expected values in [0, 1], got {gamma}, {lam}")
    shape = tuple(reward.shape)
    for name, t in (("value", value), ("next_value", next_value), ("terminated", terminated),
                    ("cont", cont)):  # fmt: skip
        if tuple(t.shape) != shape:
            raise ValueError(
                f"{name}: expected shape {list(shape)} (as reward), got {list(t.shape)}"
            )
    with torch.no_grad():
        not_term = (~terminated).to(reward.dtype)  # [T, N]
        delta = reward + gamma * not_term * next_value - value  # [T, N]
        decay = gamma * lam * cont.to(reward.dtype)  # [T, N]
        adv = torch.empty_like(delta)
        running = torch.zeros_like(delta[0])  # [N] = A_{t+1}
        for t in range(shape[0] - 1, -1, -1):
            running = delta[t] + decay[t] * running
            adv[t] = running
        return adv, adv + value


def rollout_gae(
    rollout: RolloutStorage,
    value_fn: Callable[[torch.Tensor], torch.Tensor],
    gamma: float,
    lam: float,
    reward: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(advantages, returns, values), each [T, N], of a rollout: ``value_fn`` maps observations
    [B, *obs_shape] (as stored; a dict of them for dict observations) to V [B]; it is evaluated once on the T + 1 observation rows
    (and on ``final_obs`` in same-step mode, where an episode ended). ``reward`` replaces the
    rollout's rewards (e.g. scaled ones)."""
    T, N = rollout.steps, rollout.num_envs
    with torch.no_grad():
        rows = obs_map(lambda x: x.reshape((T + 1) * N, *x.shape[2:]), rollout.obs)
        v_all = value_fn(rows).reshape(T + 1, N)
        next_v = v_all[1:]  # V(obs[t + 1]): the next obs, or (next-step mode) the final one
        if rollout.final_obs is not None:  # same-step autoreset: the final obs where it ended
            done = rollout.terminated | rollout.truncated
            next_v = torch.where(done, value_fn(rollout.flat("final_obs")).reshape(T, N), next_v)
        reward = rollout.reward if reward is None else reward
        adv, ret = gae(reward, v_all[:T], next_v, rollout.terminated, rollout.cont, gamma, lam)
    return adv, ret, v_all[:T]
