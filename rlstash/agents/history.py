"""Bounded history: an LSTM over a fixed window of the last k steps, and an online window.

Field report 004: a history module that kept every step of an episode grew until memory ran
out. Here the summary of step t is a function of steps t-k+1..t only::

    h_t = LSTM(o_{t-k+1}, ..., o_t)[-1]          # [B, hidden], no state carried across calls

Training feeds windows [B, k, obs_dim] from the sequence sampler; acting keeps, per env, a
fixed ring of the last k observations (:class:`HistoryWindow`), so memory is
num_envs * k * obs_dim values however long episodes get. Windows are left-padded: at the start
of an episode only the last ``lengths[i]`` steps of row i are real, and the LSTM runs over
exactly those steps (a packed sequence), so padding never changes the summary.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence


class HistorySummarizer(nn.Module):
    """[B, k, obs_dim] window (+ optional lengths [B] in 1..k) -> [B, hidden]."""

    def __init__(self, obs_dim: int, hidden: int, window: int, num_layers: int = 1):
        super().__init__()
        for name, value in (("obs_dim", obs_dim), ("hidden", hidden), ("window", window)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        self.obs_dim, self.window, self.out_dim = obs_dim, window, hidden
        self.lstm = nn.LSTM(obs_dim, hidden, num_layers=num_layers, batch_first=True)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        if x.dim() != 3 or x.shape[1] != self.window or x.shape[2] != self.obs_dim:
            raise ValueError(
                f"x: expected a window [B, {self.window}, {self.obs_dim}], got {list(x.shape)}"
            )
        x = x.float()  # [B, k, obs_dim]
        if lengths is None:
            _, (h, _) = self.lstm(x)
            return h[-1]  # [B, hidden]
        if lengths.shape != (x.shape[0],) or bool(((lengths < 1) | (lengths > self.window)).any()):
            raise ValueError(
                f"lengths: expected [B] values in 1..{self.window}, got {lengths.tolist()}"
            )
        k = self.window
        steps = torch.arange(k, device=x.device)  # [k]
        src = (steps[None, :] + (k - lengths)[:, None]) % k  # [B, k]: real steps first
        right_padded = x.gather(1, src[:, :, None].expand(-1, -1, x.shape[2]))  # [B, k, obs_dim]
        packed = pack_padded_sequence(
            right_padded, lengths.cpu(), batch_first=True, enforce_sorted=False
        )
        _, (h, _) = self.lstm(packed)
        return h[-1]  # [B, hidden], in the input's row order


class HistoryWindow:
    """The last ``window`` observations of each of ``num_envs`` envs, for acting.

    One preallocated ring [num_envs, window, obs_dim] and a write cursor shared by all envs
    (they step together); nothing grows with episode length::

        hist = HistoryWindow(num_envs=8, window=16, obs_dim=4)
        x, lengths = hist.push(obs, first=is_first_step)   # [8, 16, 4] left-padded, [8]
        h = summarizer(x, lengths)
    """

    def __init__(
        self,
        num_envs: int,
        window: int,
        obs_dim: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ):
        for name, value in (("num_envs", num_envs), ("window", window), ("obs_dim", obs_dim)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        self.num_envs, self.window, self.obs_dim = num_envs, window, obs_dim
        self.ring = torch.zeros(num_envs, window, obs_dim, dtype=dtype, device=device)
        self.lengths = torch.zeros(num_envs, dtype=torch.int64, device=device)
        self.cursor = 0  # slot the next observation goes to

    @property
    def nbytes(self) -> int:
        return self.ring.numel() * self.ring.element_size() + self.lengths.numel() * 8

    def reset(self, envs: torch.Tensor | None = None) -> None:
        """Forget the history of ``envs`` (bool [num_envs]); of every env when None."""
        if envs is None:
            self.ring.zero_()
            self.lengths.zero_()
        else:
            self.ring[envs] = 0
            self.lengths[envs] = 0

    def push(
        self, obs: torch.Tensor, first: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append one observation per env [num_envs, obs_dim]; ``first`` (bool [num_envs]) marks
        envs whose observation starts a new episode (their history is cleared first).
        Returns ``(window [num_envs, k, obs_dim], lengths [num_envs])``."""
        if tuple(obs.shape) != (self.num_envs, self.obs_dim):
            raise ValueError(
                f"obs: expected shape [{self.num_envs}, {self.obs_dim}], got {list(obs.shape)}"
            )
        if first is not None:
            if first.dtype != torch.bool or tuple(first.shape) != (self.num_envs,):
                raise ValueError(
                    f"first: expected bool [{self.num_envs}], got {first.dtype} {list(first.shape)}"
                )
            self.reset(first)
        self.ring[:, self.cursor] = obs
        self.cursor = (self.cursor + 1) % self.window
        self.lengths.add_(1).clamp_(max=self.window)
        return self.view(), self.lengths.clone()

    def view(self) -> torch.Tensor:
        """[num_envs, k, obs_dim], oldest first (zeros before an episode's first step)."""
        order = (
            self.cursor + torch.arange(self.window, device=self.ring.device)
        ) % self.window  # [k]
        return self.ring.index_select(1, order)


def transitions_from_windows(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Windowed transitions for a history agent from a sequence-sampler batch.

    ``batch``: a :class:`~rlstash.sampler.SequenceSampler` sample of ``k`` consecutive 1-step
    transitions per row (``obs`` and ``next_obs`` [B, k, obs_dim], the other fields [B, k, ...];
    the sampler never lets a window cross an episode end). Returns the transition of each
    window's last step with windowed observations:

    - ``obs``: the window o_{t-k+1} .. o_t [B, k, obs_dim];
    - ``next_obs``: o_{t-k+2} .. o_{t+1} (the window shifted by one step) [B, k, obs_dim];
    - every other field: its value at step t ([B, ...]).

    Feed it to an agent built with ``obs_shape=(k, obs_dim)`` and ``history_hidden > 0``.
    Windows are whole (no padding): the first k - 1 steps of an episode only appear inside
    windows, never as their last step. n-step reads are refused (their ``next_obs`` is not one
    step ahead).
    """
    for key in ("obs", "next_obs"):
        if key not in batch:
            raise ValueError(f"batch: expected field {key!r} (a sequence-sampler sample)")
    obs, nxt = batch["obs"], batch["next_obs"]
    if obs.dim() != 3 or nxt.shape != obs.shape:
        raise ValueError(
            "batch['obs'], batch['next_obs']: expected windows [B, k, obs_dim] of equal shape, "
            f"got {list(obs.shape)} and {list(nxt.shape)}"
        )
    if "discount" in batch and bool((batch["discount"] != batch["discount"][:, :1]).any()):
        raise ValueError("batch['discount']: varies within a window; expected 1-step reads")
    out = {k: v[:, -1] for k, v in batch.items() if k not in ("obs", "next_obs")}
    out["obs"] = obs
    out["next_obs"] = torch.cat([obs[:, 1:], nxt[:, -1:]], dim=1)
    return out
