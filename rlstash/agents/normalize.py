"""Running mean/std normalisation of observations and rewards (as SB3's VecNormalize and
CleanRL's NormalizeObservation/NormalizeReward wrappers), as modules whose statistics are
buffers: they live on the learner's device and travel in the agent's state dict.

Batched update (Chan et al.'s parallel variance), for a batch of ``b`` rows with mean m_b and
variance v_b merged into (mean m, variance v, count c)::

    d = m_b - m;  c' = c + b;  m' = m + d b / c'
    v' = (v c + v_b b + d^2 c b / c') / c'

Observations: x -> clip((x - m) / sqrt(v + eps), -clip, clip). Rewards are divided by the
standard deviation of the discounted return ``ret <- gamma ret + r`` (reset when an episode
ends), then clipped; their mean is not subtracted (the sign of a reward is kept).
"""

from __future__ import annotations

import torch
from torch import nn


class RunningMeanStd(nn.Module):
    """Mean and variance of everything passed to :meth:`update`, per feature of ``shape``."""

    def __init__(self, shape: tuple[int, ...] = (), epsilon: float = 1e-4):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(float(epsilon), dtype=torch.float64))

    @torch.no_grad()
    def update(self, x: torch.Tensor, weight: torch.Tensor | None = None) -> None:
        """Merge the rows of ``x`` [B, *shape] (rows with ``weight`` 0 left out; no host read)."""
        x = x.reshape(-1, *self.mean.shape).to(torch.float64)
        if weight is None:
            w = torch.ones(x.shape[0], dtype=torch.float64, device=x.device)
        else:
            w = weight.reshape(-1).to(torch.float64)
        w = w.reshape(-1, *([1] * self.mean.dim()))  # [B, 1...]
        b = w.sum()
        safe_b = b.clamp_min(1e-12)
        batch_mean = (w * x).sum(0) / safe_b
        batch_var = (w * (x - batch_mean) ** 2).sum(0) / safe_b
        delta = batch_mean - self.mean
        total = self.count + b
        self.mean += delta * b / total
        self.var.copy_(
            (self.var * self.count + batch_var * b + delta**2 * self.count * b / total) / total
        )
        self.count.copy_(total)


class ObsNormalizer(nn.Module):
    """obs -> clip((obs - mean) / sqrt(var + eps), -clip, clip) as float32."""

    def __init__(self, shape: tuple[int, ...], clip: float = 10.0, eps: float = 1e-8):
        super().__init__()
        self.rms = RunningMeanStd(tuple(shape))
        self.clip, self.eps = float(clip), float(eps)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        mean, var = self.rms.mean.float(), self.rms.var.float()
        return ((obs.float() - mean) / torch.sqrt(var + self.eps)).clamp(-self.clip, self.clip)


class RewardScaler(nn.Module):
    """Scales rewards by the running std of the discounted return (module docstring).

    ``scale(reward, done, valid)`` takes a [T, N] rollout: it runs ``ret`` over T (a row-wise
    scan; ``ret`` [N] persists across rollouts), updates the statistics with the valid rows,
    then returns clip(r / sqrt(var + eps), -clip, clip)."""

    def __init__(self, gamma: float, clip: float = 10.0, eps: float = 1e-8):
        super().__init__()
        self.rms = RunningMeanStd(())
        self.register_buffer("ret", torch.zeros(0, dtype=torch.float64))
        self.gamma, self.clip, self.eps = float(gamma), float(clip), float(eps)

    @torch.no_grad()
    def scale(self, reward: torch.Tensor, done: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        T, N = reward.shape
        if self.ret.shape[0] != N:
            self.ret = torch.zeros(N, dtype=torch.float64, device=reward.device)
        returns = torch.empty(T, N, dtype=torch.float64, device=reward.device)
        ret = self.ret
        for t in range(T):
            ret = self.gamma * ret + reward[t].to(torch.float64)
            returns[t] = ret
            ret = ret * (~done[t]).to(torch.float64)
        self.ret = ret
        self.rms.update(returns, valid.to(torch.float64))
        std = torch.sqrt(self.rms.var + self.eps).float()
        return (reward / std).clamp(-self.clip, self.clip)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        key = prefix + "ret"
        if key in state_dict:  # its size is the number of envs, known after the first rollout
            self.ret = torch.zeros_like(state_dict[key], device=self.ret.device)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
