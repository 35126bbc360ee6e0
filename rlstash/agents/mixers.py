"""Value mixers of QMIX and VDN: the team's Q from each agent's chosen Q.

::

    VDN   (Sunehag et al. 2018):  Q_tot = sum_a Q_a
    QMIX  (Rashid et al. 2018):   h     = elu(Q [1, A] @ |W1(g)| [A, E] + b1(g))   # [1, E]
                                  Q_tot = h @ |W2(g)| [E, 1] + V(g)
          W1, b1, W2: linear hypernetworks of g; V: Linear(g, E) -> ReLU -> Linear(E, 1)

``g`` is the env's global state, or (where it has none) the concatenation of every agent's
observation. The absolute values make Q_tot monotonic in every Q_a (dQ_tot/dQ_a >= 0), so
each agent's greedy action is the team's. The layers and their sizes are TorchRL's
``QMixer`` (``mixing_embed_dim`` E = 32 in BenchMARL's ``qmix.yaml``), with torch's default
``nn.Linear`` initialisation.
"""

from __future__ import annotations

import torch
from torch import nn


class VDNMixer(nn.Module):
    """Q_tot = sum_a Q_a (no parameters); ``g`` is ignored."""

    def forward(self, q: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        """``q`` [..., A] -> [...]."""
        return q.sum(-1)


class QMixer(nn.Module):
    """The monotonic QMIX mixer over ``n_agents`` Qs conditioned on ``g`` of ``g_dim`` floats."""

    def __init__(self, n_agents: int, g_dim: int, embed_dim: int = 32) -> None:
        super().__init__()
        self.n_agents, self.embed_dim = n_agents, embed_dim
        self.hyper_w1 = nn.Linear(g_dim, embed_dim * n_agents)
        self.hyper_b1 = nn.Linear(g_dim, embed_dim)
        self.hyper_w2 = nn.Linear(g_dim, embed_dim)
        self.value = nn.Sequential(nn.Linear(g_dim, embed_dim), nn.ReLU(), nn.Linear(embed_dim, 1))

    def forward(self, q: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """``q`` [..., A] and ``g`` [..., G] -> Q_tot [...]."""
        lead = q.shape[:-1]
        w1 = self.hyper_w1(g).abs().reshape(*lead, self.n_agents, self.embed_dim)  # [..., A, E]
        b1 = self.hyper_b1(g)  # [..., E]
        h = torch.nn.functional.elu((q.unsqueeze(-2) @ w1).squeeze(-2) + b1)  # [..., E]
        w2 = self.hyper_w2(g).abs()  # [..., E]
        return (h * w2).sum(-1) + self.value(g).squeeze(-1)  # [...]


__all__ = ["QMixer", "VDNMixer"]
