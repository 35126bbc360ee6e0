"""IQL, implicit Q-learning (Kostrikov et al. 2021), for offline learning from a dataset
(``rlstash train --algo iql --dataset NAME``): it never queries Q at actions outside the data.

Networks: a value V(s), twin critics Q_1, Q_2 with Polyak targets, and a tanh-squashed
Gaussian actor (SAC's, :mod:`rlstash.agents.sac`), all working on actions in [-1, 1]^A (the
dataset actions a_b are rescaled from the Box bounds). Per update, all three losses are taken
at the same parameters (TorchRL's ``IQLLoss``), each network stepping on its own loss::

    q_t    = min_i Q_target_i(s, a_b)                               (no gradient)
    J(V)   = mean_B |tau - 1(q_t - V(s) < 0)| (q_t - V(s))^2       expectile tau (0.7)
    y      = r + d (1 - terminated) V(s')                          (no gradient)
    J(Q)   = mean_B sum_i (Q_i(s, a_b) - y)^2
    J(pi)  = -mean_B min(exp(beta (q_t - V(s))), max_weight) log pi(a_b | s)   beta: temperature
    theta_target <- (1 - tau_polyak) theta_target + tau_polyak theta            (critics)

``d`` is the batch's "discount" (gamma^n) or gamma. Acting: tanh(mean) when deterministic
(evaluation), a sample of pi otherwise. Defaults: TorchRL's ``sota-implementations/iql``
offline settings (lr 3e-4, 256 x 256, expectile 0.7, temperature 3, tau 0.005).
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
from rlstash.agents.sac import SquashedGaussianActor, box_agent_setup, squashed_log_prob
from rlstash.agents.sac import twin_critic_loss as _twin_critic_loss

ATANH_EDGE = 1 - 1e-6  # dataset actions on the Box's edge are pulled this far inside for atanh


def expectile_loss(diff: torch.Tensor, expectile: float) -> torch.Tensor:
    """mean |expectile - 1(diff < 0)| diff^2 of ``diff`` = q_t - V(s) [B]."""
    weight = torch.where(diff < 0, 1.0 - expectile, expectile)
    return (weight * diff**2).mean()


def awr_actor_loss(
    log_prob: torch.Tensor, advantage: torch.Tensor, temperature: float, max_weight: float
) -> torch.Tensor:
    """-mean min(exp(temperature * advantage), max_weight) * log_prob (both [B]; the weight
    takes no gradient)."""
    weight = torch.exp(temperature * advantage.detach()).clamp(max=max_weight)
    return -(weight * log_prob).mean()


@dataclass
class IQLConfig(ConfigMixin):
    """IQL learner settings (defaults: TorchRL's sota-implementations/iql, offline)."""

    learning_rate: float = hp(3e-4, "Adam step size of actor, value and critics.")
    gamma: float = hp(0.99, "Discount per step; a batch's 'discount' field (gamma^n) overrides it.")
    tau: float = hp(0.005, "Polyak coefficient of the target critics.")
    expectile: float = hp(0.7, "Expectile of the value loss, in (0, 1); 0.5 = mean (SARSA).")
    temperature: float = hp(3.0, "beta of the advantage weights exp(beta * (Q - V)).")
    max_weight: float = hp(100.0, "Upper clip of the advantage weights.")
    log_std_min: float = hp(-20.0, "Lower clamp of the actor's log standard deviation.")
    log_std_max: float = hp(2.0, "Upper clamp of the actor's log standard deviation.")
    max_grad_norm: float | None = hp(None, "Clip each network's gradient L2 norm; None = off.")
    net_arch: tuple[int, ...] = hp((256, 256), "MLP hidden widths of actor, value and critics.")
    seed: int = hp(0, "Seed of network init and the agent's torch generators.")
    compile: bool | str = hp(COMPILE_DEFAULT, COMPILE_HELP)

    def __post_init__(self) -> None:
        self.net_arch = tuple(self.net_arch)
        check_common(self)
        if not 0.0 < self.expectile < 1.0:
            raise ValueError(f"expectile: expected a value in (0, 1), got {self.expectile!r}")
        check_target(self.tau)
        check_positive(temperature=self.temperature, max_weight=self.max_weight)
        if not self.log_std_min < self.log_std_max:
            raise ValueError(
                f"log_std_min: expected < log_std_max, got {self.log_std_min} >= {self.log_std_max}"
            )
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ValueError(f"max_grad_norm: expected > 0 or None, got {self.max_grad_norm}")


class ValueNet(nn.Module):
    """obs -> V(s) [B]."""

    def __init__(self, obs_shape: tuple[int, ...], net_arch: tuple[int, ...]):
        super().__init__()
        self.encoder = make_encoder(obs_shape, net_arch)
        self.head = nn.Linear(self.encoder.out_dim, 1)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(obs)).squeeze(-1)


class IQL(AgentBase):
    """IQL over a Box action space with bounds ``low``/``high`` (arrays of act_dim, finite)."""

    algo = "iql"
    constants = ("center", "scale")  # the Box, on the devices (AgentBase.constants)

    def __init__(
        self,
        obs_shape: tuple[int, ...],
        act_dim: int,
        low: Any,
        high: Any,
        config: IQLConfig | None = None,
        device: torch.device | str = "cpu",
        act_device: torch.device | str | None = None,
    ):
        cfg = box_agent_setup(self, config, IQLConfig, obs_shape, act_dim, low, high)
        self._init_devices(device, act_device, cfg.seed)
        with seeded_init(cfg.seed):
            actor = SquashedGaussianActor(
                self.obs_shape, act_dim, cfg.net_arch, (cfg.log_std_min, cfg.log_std_max)
            )
            critic = TwinCritic(self.obs_shape, act_dim, cfg.net_arch)
            value = ValueNet(self.obs_shape, cfg.net_arch)
        nets = {"actor": actor, "critic": critic, "value": value}
        nets["critic_target"] = copy.deepcopy(critic).requires_grad_(False)
        lr = cfg.learning_rate
        groups = {name: flat_adam(self, name, lr=lr) for name in ("actor", "critic", "value")}
        self._setup(nets, ("actor",), groups)

    def act(
        self, obs: torch.Tensor, deterministic: bool = False, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Actions [N, act_dim] float32 within [low, high] on ``act_device`` (mask: unused)."""
        if mask is not None:
            raise ValueError("mask: continuous actions take no availability mask, got a tensor")
        obs = self._prepare_obs(obs, self.obs_shape)
        with torch.no_grad():
            if not deterministic:
                self.env_steps += obs.shape[0]
            a, _ = self.actor["actor"].sample(obs, self.act_gen, deterministic)  # [N, A]
            return self.act_center + self.act_scale * a

    # ------------------------------------------------------------------ losses
    def _targets(self, batch: Batch, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(q_t [B], y [B]) of the module docstring, without gradients."""
        with torch.no_grad():
            q_t = self.nets["critic_target"](batch["obs"], action).amin(0)
            v_next = self.nets["value"](batch["next_obs"]).masked_fill(batch["terminated"], 0.0)
            y = batch["reward"] + batch.get("discount", self.config.gamma) * v_next
        return q_t, y

    def _value_loss(self, obs: torch.Tensor, q_t: torch.Tensor) -> tuple[torch.Tensor, Any]:
        v = self.nets["value"](obs)  # [B]
        return expectile_loss(q_t - v, self.config.expectile), v.detach()

    def _actor_loss(
        self, obs: torch.Tensor, action: torch.Tensor, advantage: torch.Tensor
    ) -> tuple[torch.Tensor, Any]:
        mean, log_std = self.nets["actor"](obs)  # [B, A]
        u = torch.atanh(action.clamp(-ATANH_EDGE, ATANH_EDGE))
        log_prob = squashed_log_prob(u, mean, log_std)  # [B]
        cfg = self.config
        return awr_actor_loss(log_prob, advantage, cfg.temperature, cfg.max_weight), log_prob

    def _critic_loss(
        self, batch: Batch, action: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return _twin_critic_loss(self.nets["critic"], batch, action, y, 1.0)

    # ------------------------------------------------------------------ update
    def update(self, batch: Batch) -> dict[str, Any]:
        """One IQL step (module docstring); with ``config.compile`` one compiled step."""
        check_batch(batch, obs_shape=self.obs_shape, device=self.device, act_dim=self.act_dim)
        action = (batch["action"] - self.center) / self.scale
        self.updates += 1
        if self._compile_now():
            self.tau_now.fill_(self.config.tau)
            return self._compiled("update", self._step)(batch, action)
        with self._eager_timed():
            return self._eager(batch, action)

    def _eager(self, batch: Batch, action: torch.Tensor) -> dict[str, Any]:
        cfg, groups, obs = self.config, self.groups, batch["obs"]
        q_t, y = self._targets(batch, action)
        value_loss, v = self._value_loss(obs, q_t)
        actor_loss, _ = self._actor_loss(obs, action, q_t - v)
        critic_loss, q = self._critic_loss(batch, action, y)
        norms = {
            "value_grad_norm": groups["value"].step(value_loss, cfg.max_grad_norm),
            "actor_grad_norm": groups["actor"].step(actor_loss, cfg.max_grad_norm),
            "critic_grad_norm": groups["critic"].step(critic_loss, cfg.max_grad_norm),
        }
        polyak_update(self.nets["critic_target"], self.nets["critic"], cfg.tau)
        losses = {"value_loss": value_loss, "actor_loss": actor_loss, "critic_loss": critic_loss}
        self._watch(*losses.values())
        return self._metrics(losses, norms, q, y, q_t - v)

    def _step(self, batch: Batch, action: torch.Tensor) -> dict[str, Any]:
        """:meth:`_eager` as a function of tensors (compiled; rlstash.agents.compiled)."""
        cfg, fn, groups, obs = self.config, self.functional, self.groups, batch["obs"]
        q_t, y = fn.call(self._targets, None, None, batch, action)
        grad_v, (value_loss, v) = fn.grad(self._value_loss, "value", obs, q_t)
        grad_a, (actor_loss, _) = fn.grad(self._actor_loss, "actor", obs, action, q_t - v)
        grad_q, (critic_loss, q) = fn.grad(self._critic_loss, "critic", batch, action, y)
        norms = {
            "value_grad_norm": groups["value"].apply(grad_v, cfg.max_grad_norm),
            "actor_grad_norm": groups["actor"].apply(grad_a, cfg.max_grad_norm),
            "critic_grad_norm": groups["critic"].apply(grad_q, cfg.max_grad_norm),
        }
        self._polyak("critic", "critic_target", "critic")
        losses = {"value_loss": value_loss, "actor_loss": actor_loss, "critic_loss": critic_loss}
        self._watch(*losses.values())
        return self._metrics(losses, norms, q, y, q_t - v)

    @staticmethod
    def _metrics(
        losses: dict[str, torch.Tensor],
        norms: dict[str, Any],
        q: torch.Tensor,
        y: torch.Tensor,
        advantage: torch.Tensor,
    ) -> dict[str, Any]:
        return {  # 0-dim tensors on the device: no host read here (read_metrics when logging)
            **{name: loss.detach() for name, loss in losses.items()},
            **norms,
            "q_mean": q[0].detach().mean(),
            "advantage_mean": advantage.detach().mean(),
            "td_error": (q - y).abs().mean(0).detach(),  # [B]
        }
