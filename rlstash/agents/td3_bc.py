"""TD3+BC (Fujimoto & Gu 2021): TD3 whose actor also imitates the dataset's actions, for
offline learning (``rlstash train --algo td3_bc --dataset NAME``).

Everything is TD3's (:mod:`rlstash.agents.td3`: twin critics, target policy smoothing, delayed
actor and target updates, Polyak targets) except the actor's objective, on the dataset actions
a_b rescaled to [-1, 1]::

    lambda = alpha / mean_B |Q_1(s, pi(s))|           (no gradient through lambda)
    J(pi)  = -lambda mean_B Q_1(s, pi(s)) + mean_B mean_A (pi(s) - a_b)^2

so the Q term has the scale of the behaviour-cloning term whatever the rewards' scale.
Defaults are the paper's and TorchRL's ``sota-implementations/td3_bc`` (alpha 2.5, lr 3e-4,
256 x 256 networks, policy delay 2, smoothing noise 0.2 clipped at 0.5, tau 0.005).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rlstash.agents.base import Batch, hp
from rlstash.agents.td3 import TD3, TD3Config


def td3_bc_actor_loss(
    q: torch.Tensor, pi: torch.Tensor, action: torch.Tensor, alpha: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(J(pi), lambda) from Q_1(s, pi(s)) [B], pi(s) [B, A] and the dataset actions [B, A]
    (both in [-1, 1]); lambda = alpha / mean|Q| is detached (module docstring)."""
    lam = alpha / q.abs().mean().detach()
    bc = ((pi - action) ** 2).mean()
    return -lam * q.mean() + bc, lam


@dataclass
class TD3BCConfig(TD3Config):
    """TD3+BC learner settings: TD3's plus ``alpha`` (defaults: the paper's / TorchRL's)."""

    learning_rate: float = hp(3e-4, "Adam step size of actor and critics.")
    net_arch: tuple[int, ...] = hp((256, 256), "MLP hidden widths of actor and critics.")
    random_steps: int = hp(0, "Uniform random actions for this many env steps when acting.")
    alpha: float = hp(2.5, "Weight of the Q term against behaviour cloning (lambda = alpha/|Q|).")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.alpha > 0:
            raise ValueError(f"alpha: expected > 0, got {self.alpha!r}; the paper uses 2.5")


class TD3BC(TD3):
    """TD3+BC over a Box action space with bounds ``low``/``high`` (arrays of act_dim)."""

    algo = "td3_bc"

    def __init__(
        self,
        obs_shape: tuple[int, ...],
        act_dim: int,
        low: Any,
        high: Any,
        config: TD3BCConfig | None = None,
        device: torch.device | str = "cpu",
        act_device: torch.device | str | None = None,
    ):
        if config is None:
            config = TD3BCConfig()
        if not isinstance(config, TD3BCConfig):
            raise TypeError(f"config: expected a TD3BCConfig, got {type(config).__name__}")
        super().__init__(obs_shape, act_dim, low, high, config, device, act_device)

    def _actor_loss(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """J(pi) of the module docstring (the critic's weights detached); aux: lambda."""
        nets, obs = self.nets, batch["obs"]
        action = (batch["action"] - self.center) / self.scale  # [B, A]
        pi = nets["actor"](obs)  # [B, A]
        q = nets["critic"](obs, pi, detach=True, member=0)  # [B]
        return td3_bc_actor_loss(q, pi, action, self.config.alpha)
