"""SAC for continuous actions: twin critics, Polyak target critics, a tanh-squashed Gaussian
actor, and automatic entropy tuning (Haarnoja et al. 2018, as in Stable-Baselines3).

The actor works in [-1, 1]^A; ``act`` rescales to the Box bounds given at construction and the
critics see actions rescaled back to [-1, 1]. Log-probabilities and the entropy target
(-act_dim) are those of the squashed [-1, 1] actions, as in Stable-Baselines3.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rlstash.agents.base import (
    COMPILE_DEFAULT,
    COMPILE_HELP,
    AgentBase,
    Batch,
    ConfigMixin,
    agent_config,
    check_batch,
    check_common,
    check_count,
    check_target,
    flat_adam,
    hp,
    seeded_init,
)
from rlstash.agents.nets import LogAlpha, TwinCritic, make_encoder, polyak_update


@dataclass
class SACBaseConfig(ConfigMixin):
    """Hyperparameters shared by :class:`SACConfig` and the discrete SAC's config
    (Stable-Baselines3's SAC defaults)."""

    learning_rate: float = hp(3e-4, "Adam step size of actor, critics and temperature.")
    gamma: float = hp(0.99, "Discount per step; a batch's 'discount' field (gamma^n) overrides it.")
    tau: float = hp(0.005, "Polyak coefficient of the target critics.")
    target_update_interval: int = hp(1, "Updates between target-critic updates.")
    init_alpha: float = hp(1.0, "Initial entropy temperature alpha.")
    autotune_alpha: bool = hp(True, "Learn alpha so that the policy's entropy tracks its target.")
    max_grad_norm: float | None = hp(None, "Clip each network's gradient L2 norm; None = off.")
    net_arch: tuple[int, ...] = hp(
        (256, 256), "MLP hidden widths of actor and critics (unused after the Nature CNN)."
    )
    seed: int = hp(0, "Seed of network init and the agent's torch generators.")
    compile: bool | str = hp(COMPILE_DEFAULT, COMPILE_HELP)

    def __post_init__(self) -> None:
        self.net_arch = tuple(self.net_arch)
        check_common(self)
        check_target(self.tau, self.target_update_interval)
        if not self.init_alpha > 0:
            raise ValueError(f"init_alpha: expected > 0, got {self.init_alpha}")


@dataclass
class SACConfig(SACBaseConfig):
    """SAC learner settings (defaults: Stable-Baselines3's; loop settings and per-env presets:
    :mod:`rlstash.train`)."""

    target_entropy: float | None = hp(None, "Entropy target; None = -act_dim.")
    log_std_min: float = hp(-20.0, "Lower clamp of the actor's log standard deviation.")
    log_std_max: float = hp(2.0, "Upper clamp of the actor's log standard deviation.")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.log_std_min < self.log_std_max:
            raise ValueError(
                f"log_std_min: expected < log_std_max, got {self.log_std_min} >= {self.log_std_max}"
            )


def squashed_log_prob(u: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """log pi(a) [B] of a = tanh(u), u ~ N(mean, exp(log_std)^2), all [B, A]:

    log pi(a) = sum_i log N(u_i; mean_i, std_i) - log(1 - tanh(u_i)^2)
    log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u))      (exact, stable for large |u|)
    """
    normal = -0.5 * ((u - mean) / log_std.exp()) ** 2 - log_std - 0.5 * math.log(2 * math.pi)
    correction = 2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))
    return (normal - correction).sum(-1)


class SquashedGaussianActor(nn.Module):
    """obs -> (mean, log_std) [B, A]; actions tanh(mean + std * eps) in [-1, 1]^A."""

    def __init__(
        self,
        obs_shape: tuple[int, ...],
        act_dim: int,
        net_arch: tuple[int, ...],
        log_std_range: tuple[float, float],
    ):
        super().__init__()
        self.encoder = make_encoder(obs_shape, net_arch)
        self.head = nn.Linear(self.encoder.out_dim, 2 * act_dim)  # mean and log_std
        self.log_std_range = log_std_range

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, log_std = self.head(self.encoder(obs)).chunk(2, dim=-1)  # [B, A], [B, A]
        return mean, log_std.clamp(*self.log_std_range)

    def sample(
        self, obs: torch.Tensor, generator: torch.Generator, deterministic: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(a [B, A] in [-1, 1], log pi(a|s) [B]); reparameterized (gradients flow through a)."""
        mean, log_std = self(obs)
        if deterministic:
            u = mean
        else:
            eps = torch.randn(mean.shape, generator=generator, device=mean.device)  # [B, A]
            u = mean + log_std.exp() * eps
        return torch.tanh(u), squashed_log_prob(u, mean, log_std)

    def rsample(self, obs: torch.Tensor, eps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`sample` with the standard normal noise ``eps`` [B, A] given."""
        mean, log_std = self(obs)
        u = mean + log_std.exp() * eps
        return torch.tanh(u), squashed_log_prob(u, mean, log_std)


def _bound(value: Any, name: str, act_dim: int) -> torch.Tensor:
    t = torch.as_tensor(np.asarray(value, dtype=np.float32)).reshape(-1)
    if t.numel() == 1:
        t = t.expand(act_dim).clone()
    if t.shape != (act_dim,) or not bool(torch.isfinite(t).all()):
        raise ValueError(
            f"{name}: expected {act_dim} finite bounds, got {np.asarray(value).tolist()}"
        )
    return t


def bounds(low: Any, high: Any, act_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(center, scale) [A], [A] of a Box with finite ``low`` < ``high`` (scalars broadcast):
    an action in [-1, 1]^A maps to center + scale * a."""
    low_t, high_t = _bound(low, "low", act_dim), _bound(high, "high", act_dim)
    if not bool((low_t < high_t).all()):
        raise ValueError(
            f"low/high: expected low < high, got {low_t.tolist()} and {high_t.tolist()}"
        )
    return (high_t + low_t) / 2, (high_t - low_t) / 2


def box_agent_setup(
    agent: Any, config: Any, config_cls: type, obs_shape: tuple[int, ...], act_dim: int,
    low: Any, high: Any,
) -> Any:  # fmt: skip
    """The checks and attributes every Box-action agent (SAC, TD3) starts with: ``config``
    (``config_cls()`` when None), ``obs_shape``, ``act_dim``, ``center``/``scale`` [A]."""
    cfg = agent.config = agent_config(config, config_cls)
    check_count("act_dim", act_dim)
    agent.obs_shape, agent.act_dim = tuple(obs_shape), act_dim
    agent.center, agent.scale = bounds(low, high, act_dim)  # [A], [A]
    return cfg


def twin_critic_loss(
    critic: nn.Module, batch: Batch, action: torch.Tensor, y: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(J(Q) = E[w scale sum_i (Q_i(s, a_b) - y)^2], Q [2, B]) of twin critics, for actions
    a_b [B, A] in [-1, 1] and targets y [B]; w = the batch's "weight" or 1 (SAC: scale 0.5,
    TD3: 1, as Stable-Baselines3)."""
    q = critic(batch["obs"], action)  # [2, B]
    per_sample = scale * ((q - y) ** 2).sum(0)  # [B]
    if "weight" in batch:
        per_sample = per_sample * batch["weight"]
    return per_sample.mean(), q


class SAC(AgentBase):
    """SAC over a Box action space with bounds ``low``/``high`` (arrays of act_dim, finite)."""

    algo = "sac"
    constants = ("center", "scale")  # the Box, on the devices (AgentBase.constants)

    def __init__(
        self,
        obs_shape: tuple[int, ...],
        act_dim: int,
        low: Any,
        high: Any,
        config: SACConfig | None = None,
        device: torch.device | str = "cpu",
        act_device: torch.device | str | None = None,
    ):
        cfg = box_agent_setup(self, config, SACConfig, obs_shape, act_dim, low, high)
        self.target_entropy = float(
            cfg.target_entropy if cfg.target_entropy is not None else -act_dim
        )
        self._init_devices(device, act_device, cfg.seed)
        with seeded_init(cfg.seed):
            actor = SquashedGaussianActor(
                self.obs_shape, act_dim, cfg.net_arch, (cfg.log_std_min, cfg.log_std_max)
            )
            critic = TwinCritic(self.obs_shape, act_dim, cfg.net_arch)
        nets = {"actor": actor, "critic": critic, "alpha": LogAlpha(cfg.init_alpha)}
        nets["critic_target"] = copy.deepcopy(critic).requires_grad_(False)
        lr = cfg.learning_rate
        groups = {name: flat_adam(self, name, lr=lr) for name in ("actor", "critic", "alpha")}
        self._setup(nets, ("actor",), groups)

    @property
    def alpha(self) -> float:
        return float(self.nets["alpha"]().detach())

    def act(
        self, obs: torch.Tensor, deterministic: bool = False, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Actions [N, act_dim] float32 within [low, high] on ``act_device`` (mask: unused)."""
        if mask is not None:
            raise ValueError("mask: continuous actions take no availability mask, got a tensor")
        obs = self._prepare_obs(obs, self.obs_shape)
        dev, rows = self.act_device, obs.shape[0]
        with torch.no_grad():
            if deterministic:
                a, _ = self.actor["actor"].sample(obs, self.act_gen, True)  # [N, A] in [-1, 1]
                return self.act_center + self.act_scale * a
            eps = torch.randn((rows, self.act_dim), generator=self.act_gen, device=dev)  # [N, A]
            self.env_steps += rows
            graphed = self._act_step(rows, self._act)
            return graphed(obs, eps) if graphed is not None else self._act(obs, eps)

    def _act(self, obs: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
        """Actions in [low, high] for observations and standard normal noise [N, A]."""
        mean, log_std = self.actor["actor"](obs)  # rsample's action, without log pi (unused)
        a = torch.tanh(mean + log_std.exp() * eps)  # [N, A] in [-1, 1]
        return self.act_center + self.act_scale * a

    @torch.no_grad()
    def td_target(
        self,
        batch: Batch,
        alpha: torch.Tensor,
        next_sample: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """y = r + d (1 - terminated) (min_i Q_target_i(s', a') - alpha log pi(a'|s')), a' ~ pi(.|s')
        with d the batch "discount" (gamma^n) or gamma. [B]. ``next_sample``: (a', log pi(a'|s'))
        already drawn (``update`` draws them in the same actor pass as a ~ pi(.|s))."""
        nets, next_obs = self.nets, batch["next_obs"]
        if next_sample is None:
            next_sample = nets["actor"].sample(next_obs, self.learn_gen)
        next_a, next_logp = next_sample  # [B, A], [B]
        next_q = nets["critic_target"](next_obs, next_a).amin(0)  # [B]
        soft_v = (next_q - alpha * next_logp).masked_fill(batch["terminated"], 0.0)  # [B]
        return batch["reward"] + batch.get("discount", self.config.gamma) * soft_v

    def update(self, batch: Batch) -> dict[str, Any]:
        """One SAC step (Stable-Baselines3's order):

        1. J(alpha) = -E[log alpha (log pi(a|s) + target_entropy)],       a ~ pi(.|s)
        2. J(Q) = E[w 0.5 sum_i (Q_i(s, a_b) - y)^2],  y from :meth:`td_target`
        3. J(pi) = E[alpha log pi(a|s) - min_i Q_i(s, a)]                  (reparameterized a)
        4. every target_update_interval updates: theta_target <- (1 - tau) theta_target + tau theta

        With ``config.compile`` the same losses run as one compiled step (:meth:`_step`)."""
        cfg = self.config
        check_batch(batch, obs_shape=self.obs_shape, device=self.device, act_dim=self.act_dim)
        action = (batch["action"] - self.center) / self.scale
        bsz = action.shape[0]
        # the noise of one actor pass over s and s' (rows B.. are s'), drawn outside any graph
        eps = torch.randn((2 * bsz, self.act_dim), generator=self.learn_gen, device=self.device)
        self.updates += 1
        due = self.updates % cfg.target_update_interval == 0
        if self._compile_now():
            self.tau_now.fill_(cfg.tau if due else 0.0)  # the step's Polyak weight
            return self._compiled("update", self._step)(batch, action, eps)
        with self._eager_timed():
            out = self._eager(batch, action, eps)
            if due:
                polyak_update(self.nets["critic_target"], self.nets["critic"], cfg.tau)
        return out

    def _eager(self, batch: Batch, action: torch.Tensor, eps: torch.Tensor) -> dict[str, Any]:
        cfg, nets, groups, obs = self.config, self.nets, self.groups, batch["obs"]
        bsz = obs.shape[0]
        # one actor pass over s and s' (half the kernel launches of two); rows B.. are s'
        a_all, logp_all = nets["actor"].rsample(torch.cat([obs, batch["next_obs"]]), eps)
        a_pi, logp_pi = a_all[:bsz], logp_all[:bsz]  # [B, A], [B]
        next_sample = (a_all[bsz:].detach(), logp_all[bsz:].detach())
        alpha_loss = self._alpha_loss(logp_pi.detach())
        if cfg.autotune_alpha:
            groups["alpha"].step(alpha_loss)
        alpha = nets["alpha"]().detach()  # []
        y = self.td_target(batch, alpha, next_sample)  # [B]
        critic_loss, q = self._critic_loss(batch, action, y)
        critic_norm = groups["critic"].step(critic_loss, cfg.max_grad_norm)
        actor_loss = self._actor_loss(obs, a_pi, logp_pi, alpha)
        actor_norm = groups["actor"].step(actor_loss, cfg.max_grad_norm)
        losses = {"critic_loss": critic_loss, "actor_loss": actor_loss, "alpha_loss": alpha_loss}
        self._watch(*losses.values())
        return self._metrics(losses, alpha, logp_pi, q, y, critic_norm, actor_norm)

    def _step(self, batch: Batch, action: torch.Tensor, eps: torch.Tensor) -> dict[str, Any]:
        """:meth:`_eager`'s arithmetic as a function of tensors (compiled): gradients by
        ``torch.func`` through the same loss code, Adam and Polyak in place (rlstash.agents.
        compiled). The actor runs forward once on s (kept for its backward) and once on s'."""
        cfg, fn, groups, obs = self.config, self.functional, self.groups, batch["obs"]
        bsz, rsample = obs.shape[0], self.nets["actor"].rsample
        actor_vec = groups["actor"].flat.param.detach()
        (a_pi, logp_pi), actor_vjp = torch.func.vjp(
            lambda v: fn.call(rsample, "actor", v, obs, eps[:bsz]), actor_vec
        )
        next_sample = fn.call(rsample, None, None, batch["next_obs"], eps[bsz:])
        grad, (alpha_loss, _) = fn.grad(lambda lp: (self._alpha_loss(lp), lp), "alpha", logp_pi)
        if cfg.autotune_alpha:
            groups["alpha"].apply(grad)
        alpha = fn.call(lambda: self.nets["alpha"]().detach(), None, None)  # []
        y = fn.call(self.td_target, None, None, batch, alpha, next_sample)  # [B]
        grad, (critic_loss, q) = fn.grad(self._critic_loss, "critic", batch, action, y)
        critic_norm = groups["critic"].apply(grad, cfg.max_grad_norm)

        def actor_objective(a: torch.Tensor, lp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            loss = fn.call(self._actor_loss, None, None, obs, a, lp, alpha)
            return loss, loss

        grads, actor_loss = torch.func.grad(actor_objective, argnums=(0, 1), has_aux=True)(
            a_pi, logp_pi
        )
        actor_norm = groups["actor"].apply(actor_vjp(grads)[0], cfg.max_grad_norm)
        self._polyak("critic", "critic_target", "critic")
        losses = {"critic_loss": critic_loss, "actor_loss": actor_loss, "alpha_loss": alpha_loss}
        self._watch(*losses.values())
        return self._metrics(losses, alpha, logp_pi, q, y, critic_norm, actor_norm)

    def _alpha_loss(self, logp_pi: torch.Tensor) -> torch.Tensor:
        """J(alpha) from log pi(a|s) [B] (detached)."""
        return -(self.nets["alpha"].log_alpha * (logp_pi.detach() + self.target_entropy)).mean()

    def _critic_loss(
        self, batch: Batch, action: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return twin_critic_loss(self.nets["critic"], batch, action, y, 0.5)

    def _actor_loss(
        self, obs: torch.Tensor, a_pi: torch.Tensor, logp_pi: torch.Tensor, alpha: torch.Tensor
    ) -> torch.Tensor:
        """J(pi); gradients reach a_pi and log pi only (the critics' weights are detached)."""
        q_pi = self.nets["critic"](obs, a_pi, detach=True).amin(0)  # [B]
        return (alpha * logp_pi - q_pi).mean()

    @staticmethod
    def _metrics(
        losses: dict[str, torch.Tensor],
        alpha: torch.Tensor,
        logp_pi: torch.Tensor,
        q: torch.Tensor,
        y: torch.Tensor,
        critic_norm: torch.Tensor | float,
        actor_norm: torch.Tensor | float,
    ) -> dict[str, Any]:
        return {  # 0-dim tensors on the device: no host read here (read_metrics when logging)
            **{name: loss.detach() for name, loss in losses.items()},
            "alpha": alpha,
            "entropy": -logp_pi.detach().mean(),
            "q_mean": q[0].detach().mean(),
            "critic_grad_norm": critic_norm,
            "actor_grad_norm": actor_norm,
            "td_error": (q - y).abs().mean(0).detach(),  # [B]
        }
