"""TD3 (Fujimoto et al. 2018, as in Stable-Baselines3): a deterministic tanh actor, twin
critics, target policy smoothing, and actor and target updates every ``policy_delay`` updates.

The actor works in [-1, 1]^A; ``act`` rescales to the Box bounds given at construction and the
critics see actions rescaled back to [-1, 1]. Noise scales are in that [-1, 1] space (SB3's
``NormalActionNoise(0, sigma)`` on the scaled action). Per update k = 1, 2, ...:

    a'  = clip(pi_target(s') + clip(eps, -c, c), -1, 1),      eps ~ N(0, sigma_target^2)
    y   = r + d (1 - terminated) min_i Q_target_i(s', a')     d = batch "discount" or gamma
    J(Q)  = E[w sum_i (Q_i(s, a_b) - y)^2]                     (SB3: sum of the critics' MSE)
    every policy_delay-th update (k % policy_delay == 0):
    J(pi) = -E[Q_1(s, pi(s))]
    theta_target <- (1 - tau) theta_target + tau theta         (critics and actor)

Acting: ``pi(s) + N(0, exploration_noise^2)`` clipped to [-1, 1], and uniform random actions
for the first ``random_steps`` env steps (SB3's warm-up, which it ties to ``learning_starts``);
deterministic: ``pi(s)``. Presets per env: :mod:`rlstash.train.algos`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rlstash.agents.base import (
    COMPILE_DEFAULT,
    COMPILE_HELP,
    AgentBase,
    Batch,
    ConfigMixin,
    check_batch,
    check_common,
    check_positive,
    check_target,
    flat_adam,
    hp,
    seeded_init,
)
from rlstash.agents.nets import TwinCritic, make_encoder, polyak_update
from rlstash.agents.sac import box_agent_setup, twin_critic_loss


@dataclass
class TD3Config(ConfigMixin):
    """TD3 learner settings (defaults: Stable-Baselines3's). The loop's settings (batch size,
    replay size, n-step, update schedule) and per-env presets: :mod:`rlstash.train`."""

    learning_rate: float = hp(1e-3, "Adam step size of actor and critics.")
    gamma: float = hp(0.99, "Discount per step; a batch's 'discount' field (gamma^n) overrides it.")
    random_steps: int = hp(
        100, "act() samples uniformly in the box for this many env steps (SB3: learning_starts)."
    )
    tau: float = hp(0.005, "Polyak coefficient of the target actor and critics.")
    policy_delay: int = hp(2, "Critic updates per actor and target update.")
    target_policy_noise: float = hp(0.2, "Std of the smoothing noise on target actions.")
    target_noise_clip: float = hp(0.5, "The smoothing noise is clipped to +-this.")
    exploration_noise: float = hp(0.1, "Std of the Gaussian noise added to actions when acting.")
    max_grad_norm: float | None = hp(None, "Clip each network's gradient L2 norm; None = off.")
    net_arch: tuple[int, ...] = hp(
        (400, 300), "MLP hidden widths of actor and critics (unused after the Nature CNN)."
    )
    seed: int = hp(0, "Seed of network init and the agent's torch generators.")
    compile: bool | str = hp(COMPILE_DEFAULT, COMPILE_HELP)

    def __post_init__(self) -> None:
        self.net_arch = tuple(self.net_arch)
        check_common(self)
        check_target(self.tau)
        check_positive(policy_delay=self.policy_delay)
        if self.random_steps < 0:
            raise ValueError(f"random_steps: expected >= 0 env steps, got {self.random_steps}")
        for name, std in (
            ("target_policy_noise", self.target_policy_noise),
            ("target_noise_clip", self.target_noise_clip),
            ("exploration_noise", self.exploration_noise),
        ):
            if not std >= 0:
                raise ValueError(f"{name}: expected a std >= 0, got {std!r}")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ValueError(f"max_grad_norm: expected > 0 or None, got {self.max_grad_norm}")


class DeterministicActor(nn.Module):
    """obs -> tanh(MLP(obs)) [B, A] in [-1, 1]^A."""

    def __init__(self, obs_shape: tuple[int, ...], act_dim: int, net_arch: tuple[int, ...]):
        super().__init__()
        self.encoder = make_encoder(obs_shape, net_arch)
        self.head = nn.Linear(self.encoder.out_dim, act_dim)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.head(self.encoder(obs)))


class TD3(AgentBase):
    """TD3 over a Box action space with bounds ``low``/``high`` (arrays of act_dim, finite)."""

    algo = "td3"
    constants = ("center", "scale")  # the Box, on the devices (AgentBase.constants)

    def __init__(
        self,
        obs_shape: tuple[int, ...],
        act_dim: int,
        low: Any,
        high: Any,
        config: TD3Config | None = None,
        device: torch.device | str = "cpu",
        act_device: torch.device | str | None = None,
    ):
        cfg = box_agent_setup(self, config, TD3Config, obs_shape, act_dim, low, high)
        self._init_devices(device, act_device, cfg.seed)
        with seeded_init(cfg.seed):
            actor = DeterministicActor(self.obs_shape, act_dim, cfg.net_arch)
            critic = TwinCritic(self.obs_shape, act_dim, cfg.net_arch)
        nets = {"actor": actor, "critic": critic}
        nets["actor_target"] = copy.deepcopy(actor).requires_grad_(False)
        nets["critic_target"] = copy.deepcopy(critic).requires_grad_(False)
        lr = cfg.learning_rate
        self._setup(nets, ("actor",), {n: flat_adam(self, n, lr=lr) for n in ("actor", "critic")})
        self._actor_metrics: dict[str, Any] = {"actor_loss": 0.0, "actor_grad_norm": 0.0}

    def act(
        self, obs: torch.Tensor, deterministic: bool = False, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Actions [N, act_dim] float32 within [low, high] on ``act_device`` (mask: unused)."""
        if mask is not None:
            raise ValueError("mask: continuous actions take no availability mask, got a tensor")
        obs = self._prepare_obs(obs, self.obs_shape)
        rows, dev, gen = obs.shape[0], self.act_device, self.act_gen
        with torch.no_grad():
            if deterministic:
                a = self.actor["actor"](obs)  # [N, A]
            elif self.env_steps < self.config.random_steps:  # warm-up: uniform in the box
                a = 2 * torch.rand((rows, self.act_dim), generator=gen, device=dev) - 1
            else:
                noise = torch.randn((rows, self.act_dim), generator=gen, device=dev)
                self.env_steps += rows
                graphed = self._act_step(rows, self._act)
                return graphed(obs, noise) if graphed is not None else self._act(obs, noise)
            if not deterministic:
                self.env_steps += rows
            return self.act_center + self.act_scale * a

    def _act(self, obs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """Exploration actions in [low, high]: pi(s) + sigma * noise, clipped to [-1, 1]."""
        a = (self.actor["actor"](obs) + self.config.exploration_noise * noise).clamp(-1, 1)
        return self.act_center + self.act_scale * a

    @torch.no_grad()
    def td_target(self, batch: Batch, noise: torch.Tensor | None = None) -> torch.Tensor:
        """y [B] (module docstring); ``noise`` [B, A]: the unclipped smoothing noise eps
        (drawn from the learner's generator when None)."""
        cfg, nets, next_obs = self.config, self.nets, batch["next_obs"]
        next_a = nets["actor_target"](next_obs)  # [B, A]
        if noise is None:
            noise = cfg.target_policy_noise * torch.randn(
                next_a.shape, generator=self.learn_gen, device=next_a.device
            )
        clip = cfg.target_noise_clip
        next_a = (next_a + noise.clamp(-clip, clip)).clamp(-1.0, 1.0)
        next_q = nets["critic_target"](next_obs, next_a).amin(0)  # [B]
        next_q = next_q.masked_fill(batch["terminated"], 0.0)
        return batch["reward"] + batch.get("discount", cfg.gamma) * next_q  # [B]

    def update(self, batch: Batch) -> dict[str, Any]:
        """One critic step; every ``policy_delay``-th update also the actor and the targets.
        With ``config.compile`` each is one compiled step (:meth:`_critic_step`,
        :meth:`_actor_step`)."""
        cfg = self.config
        check_batch(batch, obs_shape=self.obs_shape, device=self.device, act_dim=self.act_dim)
        action = (batch["action"] - self.center) / self.scale
        noise = cfg.target_policy_noise * torch.randn(
            action.shape, generator=self.learn_gen, device=self.device
        )  # [B, A]: the target smoothing noise, drawn outside any graph
        self.updates += 1
        actor_due = self.updates % cfg.policy_delay == 0
        if self._compile_now():
            out = self._compiled("critic", self._critic_step)(batch, action, noise)
            if actor_due:
                self.tau_now.fill_(cfg.tau)
                self._actor_metrics = self._compiled("actor", self._actor_step)(batch)
            return {**out, **self._actor_metrics}
        with self._eager_timed():
            return self._eager(batch, action, noise, actor_due)

    def _eager(
        self, batch: Batch, action: torch.Tensor, noise: torch.Tensor, actor_due: bool
    ) -> dict[str, Any]:
        """The update with autograd and the eager optimizers (``actor_due``: the delayed actor
        step and the targets' update too)."""
        cfg, groups = self.config, self.groups
        y = self.td_target(batch, noise)  # [B]
        critic_loss, q = twin_critic_loss(self.nets["critic"], batch, action, y, 1.0)
        critic_norm = groups["critic"].step(critic_loss, cfg.max_grad_norm)
        self._watch(critic_loss)
        if actor_due:
            actor_loss, _ = self._actor_loss(batch)
            actor_norm = groups["actor"].step(actor_loss, cfg.max_grad_norm)
            self._watch(actor_loss, counted=True)
            polyak_update(self.nets["critic_target"], self.nets["critic"], cfg.tau)
            polyak_update(self.nets["actor_target"], self.nets["actor"], cfg.tau)
            self._actor_metrics = {"actor_loss": actor_loss.detach(), "actor_grad_norm": actor_norm}
        return {**self._critic_metrics(critic_loss, q, y, critic_norm), **self._actor_metrics}

    def _actor_loss(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """J(pi) = -E[Q_1(s, pi(s))], the critic's weights detached (twice: loss and aux)."""
        nets, obs = self.nets, batch["obs"]
        loss = -nets["critic"](obs, nets["actor"](obs), detach=True, member=0).mean()
        return loss, loss

    def _critic_step(self, batch: Batch, action: torch.Tensor, noise: torch.Tensor) -> dict:
        """The critic update as a function of tensors (compiled; rlstash.agents.compiled)."""
        fn = self.functional
        y = fn.call(self.td_target, None, None, batch, noise)  # [B]
        loss_fn = lambda *a: twin_critic_loss(self.nets["critic"], *a, 1.0)  # noqa: E731
        grad, (critic_loss, q) = fn.grad(loss_fn, "critic", batch, action, y)
        critic_norm = self.groups["critic"].apply(grad, self.config.max_grad_norm)
        self._watch(critic_loss)
        return self._critic_metrics(critic_loss, q, y, critic_norm)

    def _actor_step(self, batch: Batch) -> dict:
        """The actor update and both targets' lerp as a function of tensors (compiled)."""
        grad, (actor_loss, _) = self.functional.grad(self._actor_loss, "actor", batch)
        actor_norm = self.groups["actor"].apply(grad, self.config.max_grad_norm)
        self._polyak("critic", "critic_target", "critic")
        self._polyak("actor", "actor_target", "actor")
        self._watch(actor_loss, counted=True)
        return {"actor_loss": actor_loss.detach(), "actor_grad_norm": actor_norm}

    @staticmethod
    def _critic_metrics(
        critic_loss: torch.Tensor, q: torch.Tensor, y: torch.Tensor, norm: torch.Tensor | float
    ) -> dict[str, Any]:
        return {  # 0-dim tensors on the device: no host read here (read_metrics when logging)
            "critic_loss": critic_loss.detach(),
            "q_mean": q[0].detach().mean(),
            "critic_grad_norm": norm,
            "td_error": (q - y).abs().mean(0).detach(),  # [B]
        }
