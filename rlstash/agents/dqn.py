"""DQN: double DQN with a target network, n-step targets, epsilon-greedy acting.

Works for any number of discrete actions: argmax over actions runs in chunks, Q(s, a) of the
taken action is a gather, and actions are int64 indices (never one-hot).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from rlstash.agents.actions import ActionFeatures, ActionMask, chunked_argmax, sample_uniform
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
    check_positive,
    check_target,
    flat_adam,
    hp,
    seeded_init,
)
from rlstash.agents.nets import make_discrete_net, polyak_update
from rlstash.agents.schedules import epsilon_schedule


@dataclass
class DQNConfig(ConfigMixin):
    """DQN learner settings (defaults: Stable-Baselines3's). The loop's settings (batch size,
    replay size, n-step, update schedule) and per-env presets: :mod:`rlstash.train`."""

    learning_rate: float = hp(1e-4, "Adam step size.")
    lr_schedule: str = hp(
        "constant", "'constant', or 'linear': learning_rate * (1 - env_steps / total_steps)."
    )
    gamma: float = hp(0.99, "Discount per step; a batch's 'discount' field (gamma^n) overrides it.")
    total_steps: int = hp(
        1_000_000, "Horizon of the epsilon and learning-rate schedules, in env steps."
    )
    target_update_interval: int = hp(
        2500, "Updates between target updates (SB3's 10,000 env steps at train_freq 4)."
    )
    tau: float = hp(1.0, "Target update: 1 = hard copy, < 1 = Polyak average tau*online.")
    exploration_fraction: float = hp(0.1, "Fraction of total_steps over which epsilon decays.")
    exploration_initial_eps: float = hp(1.0, "Epsilon at step 0.")
    exploration_final_eps: float = hp(0.05, "Epsilon after the decay.")
    max_grad_norm: float | None = hp(10.0, "Clip the global gradient L2 norm to this; None = off.")
    net_arch: tuple[int, ...] = hp((64, 64), "MLP hidden widths (unused after the Nature CNN).")
    action_head: str = hp("linear", "'linear' (a weight row per action) or 'embedding'.")
    action_embed_dim: int = hp(64, "Learned action-embedding width (embedding head, no features).")
    learn_action_embeddings: bool = hp(True, "Learn the action table; False keeps features fixed.")
    action_chunk: int = hp(8192, "Actions scored per chunk; extra memory O(batch * chunk).")
    history_hidden: int = hp(0, "LSTM width over (k, obs_dim) windows; 0 = no LSTM.")
    seed: int = hp(0, "Seed of network init and the agent's torch generators.")
    compile: bool | str = hp(COMPILE_DEFAULT, COMPILE_HELP)

    def __post_init__(self) -> None:
        self.net_arch = tuple(self.net_arch)
        check_common(self)
        check_positive(total_steps=self.total_steps, action_chunk=self.action_chunk)
        check_target(self.tau, self.target_update_interval)
        epsilon_schedule(
            self.exploration_initial_eps,
            self.exploration_final_eps,
            self.exploration_fraction,
            self.total_steps,
        )
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ValueError(f"max_grad_norm: expected > 0 or None, got {self.max_grad_norm}")
        if self.lr_schedule not in ("constant", "linear"):
            raise ValueError(
                f"lr_schedule: expected 'constant' or 'linear', got {self.lr_schedule!r}"
            )


class DQN(AgentBase):
    """Double DQN (van Hasselt et al. 2016) over ``n_actions`` discrete actions.

    ``act`` is epsilon-greedy over the available actions: epsilon follows the linear schedule
    at ``env_steps`` (advanced by every non-deterministic ``act`` call by its batch size)."""

    algo = "dqn"

    def __init__(
        self,
        obs_shape: tuple[int, ...],
        n_actions: int,
        config: DQNConfig | None = None,
        device: torch.device | str = "cpu",
        act_device: torch.device | str | None = None,
        action_features: torch.Tensor | ActionFeatures | None = None,
    ):
        cfg = self.config = agent_config(config, DQNConfig)
        check_count("n_actions", n_actions)
        self.obs_shape, self.n_actions = tuple(obs_shape), n_actions
        if isinstance(action_features, torch.Tensor):
            action_features = ActionFeatures(action_features)
        self._init_devices(device, act_device, cfg.seed)
        with seeded_init(cfg.seed):
            q = make_discrete_net(
                self.obs_shape, n_actions, cfg.net_arch, cfg.action_head, cfg.action_embed_dim,
                action_features, cfg.learn_action_embeddings, cfg.history_hidden,
            )  # fmt: skip
        target = copy.deepcopy(q).requires_grad_(False)
        group = {"q": flat_adam(self, "q", lr=cfg.learning_rate)}
        self._setup({"q": q, "q_target": target}, ("q",), group)
        self.schedule = epsilon_schedule(
            cfg.exploration_initial_eps, cfg.exploration_final_eps,
            cfg.exploration_fraction, cfg.total_steps,
        )  # fmt: skip

    @property
    def epsilon(self) -> float:
        return self.schedule(self.env_steps)

    @property
    def learning_rate(self) -> float:
        """The Adam step size now: constant, or linear to 0 at total_steps (RL Zoo's lin_)."""
        cfg = self.config
        if cfg.lr_schedule == "constant":
            return cfg.learning_rate
        return cfg.learning_rate * max(0.0, 1.0 - self.env_steps / cfg.total_steps)

    def act(
        self, obs: torch.Tensor, deterministic: bool = False, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Epsilon-greedy actions [N] int64 on ``act_device``; masked actions never chosen."""
        obs = self._prepare_obs(obs, self.obs_shape)  # [N, *obs_shape]
        rows, n, chunk, dev = (
            obs.shape[0],
            self.n_actions,
            self.config.action_chunk,
            self.act_device,
        )
        mask = self._prepare_mask(mask, n, rows)
        with torch.no_grad():
            if deterministic or mask is not None:
                q = self.actor["q"]
                best, greedy = chunked_argmax(q.head.score_fn(q.embed(obs)), n, chunk, mask)  # [N]
                if mask is not None:  # unmasked rows always have an action (no host read)
                    self._check_available(best)
                if deterministic:
                    return greedy
            # the draws come first (the network draws nothing: the same stream either way)
            explore = torch.rand(rows, generator=self.act_gen, device=dev) < self.epsilon  # [N]
            random = sample_uniform(rows, n, chunk, self.act_gen, dev, mask)  # [N]
            self.env_steps += rows
            if mask is not None:
                return torch.where(explore, random, greedy)
            graphed = self._act_step(rows, self._explore)
            return (graphed if graphed is not None else self._explore)(obs, explore, random)

    def _explore(
        self, obs: torch.Tensor, explore: torch.Tensor, random: torch.Tensor
    ) -> torch.Tensor:
        """Epsilon-greedy actions [N] (no mask) given the draws: ``explore`` [N] bool (take the
        random action) and ``random`` [N] (compiled and CUDA-graphed with compile on CUDA)."""
        q, n, chunk = self.actor["q"], self.n_actions, self.config.action_chunk
        _, greedy = chunked_argmax(q.head.score_fn(q.embed(obs)), n, chunk, None)  # [N]
        return torch.where(explore, random, greedy)

    @torch.no_grad()
    def td_target(self, batch: Batch) -> torch.Tensor:
        """y = r + d (1 - terminated) Q_target(s', argmax_{a' available} Q_online(s', a')), [B].

        d is the batch's "discount" (gamma^n, n-step; r is then sum_{k<n} gamma^k r_{t+k}) or
        gamma. A next state without available actions (all-zero next mask) bootstraps 0."""
        n, chunk, next_obs = self.n_actions, self.config.action_chunk, batch["next_obs"]
        q, target = self.nets["q"], self.nets["q_target"]
        next_mask = ActionMask.of(batch.get("next_action_mask"), n, "next_action_mask")
        best, next_a = chunked_argmax(
            q.head.score_fn(q.embed(next_obs)), n, chunk, next_mask
        )  # [B]
        next_q = target.head.score_actions(target.embed(next_obs), next_a)  # [B]
        next_q = next_q.masked_fill(batch["terminated"] | torch.isneginf(best), 0.0)  # [B]
        return batch["reward"] + batch.get("discount", self.config.gamma) * next_q  # [B]

    def update(self, batch: Batch) -> dict[str, Any]:
        """One gradient step on L = mean_i w_i Huber(Q(s_i, a_i) - y_i) (y: :meth:`td_target`;
        w: the batch's "weight" or 1), clipped to max_grad_norm; then every
        target_update_interval updates theta_target <- (1 - tau) theta_target + tau theta.
        With ``config.compile`` the same loss runs as one compiled step (:meth:`_step`)."""
        cfg = self.config
        check_batch(
            batch, obs_shape=self.obs_shape, device=self.device, n_actions=self.n_actions,
            values=self._values_due(),
        )  # fmt: skip
        if cfg.lr_schedule != "constant":
            self.groups["q"].set_lr(self.learning_rate)
        self.updates += 1
        due = self.updates % cfg.target_update_interval == 0
        if self._compile_now():
            self.tau_now.fill_(cfg.tau if due else 0.0)  # the step's Polyak weight
            out = self._compiled("update", self._step)(batch)
        else:
            with self._eager_timed():
                out = self._eager(batch, due)
        return {**out, "epsilon": self.epsilon, "learning_rate": self.learning_rate}

    def _eager(self, batch: Batch, due: bool) -> dict[str, Any]:
        """The update with autograd and the eager optimizer (``due``: move the target)."""
        y = self.td_target(batch)  # [B]
        loss, q = self._loss(batch, y)
        grad_norm = self.groups["q"].step(loss, self.config.max_grad_norm)
        if due:
            polyak_update(self.nets["q_target"], self.nets["q"], self.config.tau)
        self._watch(loss)
        return self._metrics(loss, q, y, grad_norm)

    def _loss(self, batch: Batch, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(L, Q(s, a) [B]) for the targets y [B]."""
        q_net = self.nets["q"]
        q = q_net.head.score_actions(q_net.embed(batch["obs"]), batch["action"])  # [B]
        per_sample = F.smooth_l1_loss(q, y, reduction="none")  # [B]
        if "weight" in batch:
            per_sample = per_sample * batch["weight"]
        return per_sample.mean(), q

    def _step(self, batch: Batch) -> dict[str, Any]:
        """The eager update's arithmetic as a function of tensors (compiled): the gradient by
        ``torch.func`` through :meth:`_loss`, Adam and the target lerp in place."""
        fn = self.functional
        y = fn.call(self.td_target, None, None, batch)  # [B]
        grad, (loss, q) = fn.grad(self._loss, "q", batch, y)
        grad_norm = self.groups["q"].apply(grad, self.config.max_grad_norm)
        self._polyak("q", "q_target", "q")
        self._watch(loss)
        return self._metrics(loss, q, y, grad_norm)

    @staticmethod
    def _metrics(
        loss: torch.Tensor, q: torch.Tensor, y: torch.Tensor, grad_norm: torch.Tensor | float
    ) -> dict[str, Any]:
        return {  # 0-dim tensors on the device: no host read here (read_metrics when logging)
            "loss": loss.detach(),
            "q_mean": q.detach().mean(),
            "grad_norm": grad_norm,
            "td_error": (q - y).abs().detach(),  # [B]
        }
