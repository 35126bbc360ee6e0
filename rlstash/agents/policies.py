"""Actor-critic networks of PPO: a categorical policy over any number of actions (through the
chunked action heads of :mod:`rlstash.agents.actions`) and a Gaussian policy with a
state-independent log std, each beside a separate value network (SB3's MlpPolicy layout).
Image observations get one Nature CNN shared by actor and critic, each with its own output
layer on the 512 features (CleanRL's ppo_atari, SB3's CnnPolicy).

Initialisation as SB3/CleanRL (``ortho_init``): orthogonal weights with gain sqrt(2) in hidden
layers, 0.01 on the policy's output layer and 1 on the value output; zero biases.

Gaussian bounds (``bound``):

- ``"clip"`` (SB3, CleanRL): a ~ N(mu, sigma^2) unbounded; log-probabilities are those of the
  unbounded sample, and the *env* clips it to the action space (the training builder wraps the
  env in ``gymnasium.wrappers.ClipAction``, as CleanRL does). ``act(deterministic=True)``
  returns mu clipped to the bounds.
- ``"tanh"``: a = low + (tanh(x) + 1) (high - low) / 2 with x ~ N(mu, sigma^2);
  log pi(a) = log N(x) - sum log(1 - tanh(x)^2) - sum log((high - low) / 2), x = atanh(.) of the
  stored action; entropy is estimated by -log pi of the stored action (no closed form; SB3's
  estimate for squashed distributions).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from rlstash.agents.actions import ActionFeatures, ActionHead, EmbeddingActionHead, LinearActionHead
from rlstash.agents.nets import NatureCNN, is_image

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}
LOG_2PI = math.log(2 * math.pi)


def trunk(obs_shape: Sequence[int], hidden: Sequence[int], activation: str) -> nn.Sequential:
    """Observation -> features: the Nature CNN for images, else flatten + MLP (``.out_dim``)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation: expected one of {sorted(ACTIVATIONS)}, got {activation!r}")
    if is_image(obs_shape):
        cnn = NatureCNN(obs_shape)
        seq = nn.Sequential(cnn)
        seq.out_dim = cnn.out_dim
        return seq
    layers: list[nn.Module] = [nn.Flatten()]
    dim = int(np.prod(obs_shape))
    for width in hidden:
        layers += [nn.Linear(dim, width), ACTIVATIONS[activation]()]
        dim = width
    seq = nn.Sequential(*layers)
    seq.out_dim = dim
    return seq


def ortho_(module: nn.Module, gain: float) -> None:
    """Orthogonal weights with ``gain`` and zero biases for every Linear/Conv2d in ``module``."""
    for m in module.modules():
        if isinstance(m, nn.Linear | nn.Conv2d):
            nn.init.orthogonal_(m.weight, gain)
            nn.init.zeros_(m.bias)


class ActorCritic(nn.Module):
    """An actor trunk (policy features) and a critic (trunk + scalar value head); for image
    observations both use the same trunk (``shared_trunk``)."""

    def __init__(self, obs_shape: Sequence[int], net_arch: Sequence[int], activation: str):
        super().__init__()
        self.actor_trunk = trunk(obs_shape, net_arch, activation)
        self.shared_trunk = is_image(obs_shape)
        critic = self.actor_trunk if self.shared_trunk else trunk(obs_shape, net_arch, activation)
        self.value_head = nn.Linear(critic.out_dim, 1)
        self.critic = nn.Sequential(critic, self.value_head)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """V(s) [B] for preprocessed observations [B, *obs_shape] (float)."""
        return self.critic(obs).squeeze(-1)

    def features_and_value(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(actor trunk features [B, d], V(s) [B]): a shared trunk (images) runs once for
        both, as ``value_head(actor_trunk(s))`` is ``critic(s)`` then."""
        feat = self.actor_trunk(obs)  # [B, d]
        if self.shared_trunk:
            return feat, self.value_head(feat).squeeze(-1)
        return feat, self.value(obs)

    def init_ortho(self, policy_out: nn.Module | None) -> None:
        ortho_(self.actor_trunk, math.sqrt(2))
        ortho_(self.critic, math.sqrt(2))
        ortho_(self.value_head, 1.0)
        if policy_out is not None:
            ortho_(policy_out, 0.01)


class CategoricalActorCritic(ActorCritic):
    """pi(.|s) = softmax over ``n`` actions of ``head(actor_trunk(s))`` (a linear or an
    embedding head; chunked reductions make 10^5+ actions cheap)."""

    def __init__(
        self,
        obs_shape: Sequence[int],
        n: int,
        net_arch: Sequence[int],
        activation: str = "tanh",
        action_head: str = "linear",
        embed_dim: int = 64,
        features: ActionFeatures | None = None,
        learn_embeddings: bool = True,
        ortho_init: bool = True,
    ):
        super().__init__(obs_shape, net_arch, activation)
        dim = self.actor_trunk.out_dim
        if action_head == "linear":
            if features is not None:
                raise ValueError("action_features: only used with action_head='embedding'")
            self.head: ActionHead = LinearActionHead(dim, n)
        elif action_head == "embedding":
            self.head = EmbeddingActionHead(dim, n, embed_dim, features, learn_embeddings)
        else:
            raise ValueError(f"action_head: expected 'linear' or 'embedding', got {action_head!r}")
        if ortho_init:
            self.init_ortho(None)
            if isinstance(self.head, LinearActionHead):
                nn.init.orthogonal_(self.head.weight, 0.01)
                nn.init.zeros_(self.head.bias_)
            else:
                ortho_(self.head.proj, 0.01)

    def embed(self, obs: torch.Tensor) -> torch.Tensor:
        """u [B, k]: the state embedding the head scores actions against."""
        return self.head.project(self.actor_trunk(obs))

    def embed_features(self, feat: torch.Tensor) -> torch.Tensor:
        """:meth:`embed` from the actor trunk's features [B, d] (see features_and_value)."""
        return self.head.project(feat)


class GaussianActorCritic(ActorCritic):
    """pi(.|s) = N(mu(s), diag(exp(log_std))^2), log_std a learned vector (module docstring)."""

    def __init__(
        self,
        obs_shape: Sequence[int],
        low: np.ndarray,
        high: np.ndarray,
        net_arch: Sequence[int],
        activation: str = "tanh",
        log_std_init: float = 0.0,
        bound: str = "clip",
        ortho_init: bool = True,
    ):
        super().__init__(obs_shape, net_arch, activation)
        if bound not in ("clip", "tanh"):
            raise ValueError(f"bound: expected 'clip' or 'tanh', got {bound!r}")
        low, high = np.asarray(low, np.float32), np.asarray(high, np.float32)
        if bound == "tanh" and not (np.isfinite(low).all() and np.isfinite(high).all()):
            raise ValueError("bound: 'tanh' needs finite action bounds; use bound='clip'")
        act_dim = int(low.shape[0])
        self.bound = bound
        self.mu = nn.Linear(self.actor_trunk.out_dim, act_dim)
        self.log_std = nn.Parameter(torch.full((act_dim,), float(log_std_init)))
        self.register_buffer("low", torch.from_numpy(low))
        self.register_buffer("high", torch.from_numpy(high))
        if ortho_init:
            self.init_ortho(self.mu)

    def mean(self, obs: torch.Tensor) -> torch.Tensor:
        return self.mu(self.actor_trunk(obs))  # [B, act_dim]

    def sample(self, obs: torch.Tensor, gen: torch.Generator, deterministic: bool) -> torch.Tensor:
        """Env actions [B, act_dim] (module docstring for the two bounds)."""
        if not deterministic:
            shape = (obs.shape[0], self.mu.out_features)
            return self.explore(obs, torch.randn(shape, generator=gen, device=obs.device))
        x = self.mean(obs)
        if self.bound == "tanh":
            return self.low + (torch.tanh(x) + 1) * (self.high - self.low) / 2
        return torch.maximum(torch.minimum(x, self.high), self.low)

    def explore(self, obs: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
        """:meth:`sample` with the standard normal noise ``eps`` [B, act_dim] given."""
        x = self.mean(obs) + self.log_std.exp() * eps
        if self.bound == "tanh":
            return self.low + (torch.tanh(x) + 1) * (self.high - self.low) / 2
        return x

    def log_prob_entropy(
        self, obs: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(log pi(action|s) [B], entropy [B]) for stored actions [B, act_dim]."""
        return self.log_prob_entropy_features(self.actor_trunk(obs), action)

    def log_prob_entropy_features(
        self, feat: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`log_prob_entropy` from the actor trunk's features [B, d]."""
        mu, log_std = self.mu(feat), self.log_std  # [B, act_dim]
        if self.bound == "tanh":
            half = (self.high - self.low) / 2
            y = ((action - self.low) / half - 1).clamp(-1 + 1e-6, 1 - 1e-6)
            x = torch.atanh(y)
            logp = _normal_logp(x, mu, log_std) - (torch.log1p(-y.pow(2)) + torch.log(half)).sum(-1)
            return logp, -logp  # a one-sample estimate of H (as SB3 for squashed policies)
        entropy = (0.5 + 0.5 * LOG_2PI + log_std).sum().expand(mu.shape[0])  # [B]
        return _normal_logp(action, mu, log_std), entropy


def _normal_logp(x: torch.Tensor, mu: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    z = (x - mu) / log_std.exp()
    return (-0.5 * z.pow(2) - log_std - 0.5 * LOG_2PI).sum(-1)  # [B]
