"""Discrete SAC (Christodoulou 2019) with exact expectations over actions, for huge action sets.

With pi(.|s) = softmax(l(s)) over the available actions A(s), every expectation over actions
is an exact sum, computed chunk by chunk (:mod:`rlstash.agents.actions`):

    V(s')  = sum_{a in A(s')} pi(a|s') [min_i Q_target_i(s', a) - alpha log pi(a|s')]
    y      = r + d (1 - terminated) V(s')                 d = batch "discount" (gamma^n) or gamma
    J(Q)   = E[w 0.5 sum_i (Q_i(s, a_b) - y)^2]           Q_i(s, a_b): a gather, no one-hot
    J(pi)  = E_s[sum_{a in A(s)} pi(a|s) (alpha log pi(a|s) - min_i Q_i(s, a))]
    J(a)   = E_s[log alpha (H(pi(.|s)) - H_target(s))]    (alpha falls when H > H_target)

Target entropy: ``target_entropy`` nats if set, else H_target(s) = ratio * log|A(s)| (|A(s)| = n
without a mask). Christodoulou used ratio 0.98, a near-uniform policy; for large n that keeps
alpha high and the policy spread over ~n^0.98 actions, so the default ratio is lower (0.5:
about sqrt(n) actions' worth of entropy at the target). Set it per task.

Memory per update: parameters, their gradients and Adam moments (for the linear head: 2 x n x d
per network), plus O(B * chunk) for every reduction over actions and for the policy gradient
(:func:`soft_policy_objective`), never O(B * n).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch

from rlstash.agents.actions import (
    ActionFeatures,
    ActionMask,
    chunked_argmax,
    gumbel_noise,
    gumbel_scores,
    soft_policy_objective,
    softmax_stats,
)
from rlstash.agents.base import (
    AgentBase,
    Batch,
    agent_config,
    check_batch,
    check_count,
    check_positive,
    flat_adam,
    hp,
    seeded_init,
)
from rlstash.agents.nets import LogAlpha, make_discrete_net, polyak_update
from rlstash.agents.sac import SACBaseConfig


@dataclass
class DiscreteSACConfig(SACBaseConfig):
    """Discrete-SAC hyperparameters (SAC defaults of Stable-Baselines3 where they apply)."""

    target_entropy_ratio: float = hp(0.5, "Entropy target = ratio * log(#available actions).")
    target_entropy: float | None = hp(None, "Fixed entropy target in nats (overrides the ratio).")
    action_head: str = hp("linear", "'linear' (a weight row per action) or 'embedding'.")
    action_embed_dim: int = hp(64, "Learned action-embedding width (embedding head, no features).")
    learn_action_embeddings: bool = hp(True, "Learn the action table; False keeps features fixed.")
    action_chunk: int = hp(8192, "Actions scored per chunk; extra memory O(batch * chunk).")
    history_hidden: int = hp(0, "LSTM width over (k, obs_dim) windows; 0 = no LSTM.")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(action_chunk=self.action_chunk)
        if not 0.0 <= self.target_entropy_ratio <= 1.0:
            raise ValueError(
                f"target_entropy_ratio: expected a value in [0, 1], got {self.target_entropy_ratio}"
            )


class DiscreteSAC(AgentBase):
    """Discrete SAC over ``n_actions`` actions (tested with 10^5; chunked for 10^6 and more)."""

    algo = "sac_discrete"

    def __init__(
        self,
        obs_shape: tuple[int, ...],
        n_actions: int,
        config: DiscreteSACConfig | None = None,
        device: torch.device | str = "cpu",
        act_device: torch.device | str | None = None,
        action_features: torch.Tensor | ActionFeatures | None = None,
    ):
        cfg = self.config = agent_config(config, DiscreteSACConfig)
        check_count("n_actions", n_actions)
        self.obs_shape, self.n_actions = tuple(obs_shape), n_actions
        if isinstance(action_features, torch.Tensor):
            action_features = ActionFeatures(action_features)
        self._init_devices(device, act_device, cfg.seed)
        args = (self.obs_shape, n_actions, cfg.net_arch, cfg.action_head, cfg.action_embed_dim,
                action_features, cfg.learn_action_embeddings, cfg.history_hidden)  # fmt: skip
        with seeded_init(cfg.seed):
            actor, q1, q2 = (
                make_discrete_net(*args),
                make_discrete_net(*args),
                make_discrete_net(*args),
            )
        nets = {"actor": actor, "q1": q1, "q2": q2, "alpha": LogAlpha(cfg.init_alpha)}
        nets["q1_target"] = copy.deepcopy(q1).requires_grad_(False)
        nets["q2_target"] = copy.deepcopy(q2).requires_grad_(False)
        lr = cfg.learning_rate
        groups = {"actor": flat_adam(self, "actor", lr=lr), "critic": flat_adam(self, "q1", "q2", lr=lr),
                  "alpha": flat_adam(self, "alpha", lr=lr)}  # fmt: skip
        self._setup(nets, ("actor",), groups)

    @property
    def alpha(self) -> float:
        return float(self.nets["alpha"]().detach())

    def act(
        self, obs: torch.Tensor, deterministic: bool = False, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """a ~ pi(.|s) (Gumbel-max in chunks), or argmax_a pi(a|s) when deterministic; [N] int64
        on ``act_device``; masked actions are never chosen."""
        obs = self._prepare_obs(obs, self.obs_shape)  # [N, *obs_shape]
        rows, n, chunk = obs.shape[0], self.n_actions, self.config.action_chunk
        mask = self._prepare_mask(mask, n, rows)
        with torch.no_grad():
            if not deterministic and mask is None and n <= chunk:  # one chunk: graphable
                noise = gumbel_noise((rows, n), self.act_gen, self.act_device)  # [N, n]
                self.env_steps += rows
                graphed = self._act_step(rows, self._sample)
                return (graphed if graphed is not None else self._sample)(obs, noise)
            actor = self.actor["actor"]
            logit_fn = actor.head.score_fn(actor.embed(obs))  # chunks of [N, c]
            if not deterministic:
                logit_fn = gumbel_scores(logit_fn, self.act_gen)  # argmax = a sample of pi
            best, action = chunked_argmax(logit_fn, n, chunk, mask)  # [N], [N]
            if mask is not None:  # unmasked rows always have an action (no host read)
                self._check_available(best)
            self.env_steps += 0 if deterministic else rows
            return action

    def _sample(self, obs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """a ~ pi(.|s) [N] by Gumbel-max with the noise [N, n] given (one chunk of actions, no
        mask: what ``act`` draws in its chunk loop; compiled and CUDA-graphed on CUDA)."""
        actor = self.actor["actor"]
        logit_fn = actor.head.score_fn(actor.embed(obs))
        return chunked_argmax(
            lambda start, stop: logit_fn(start, stop) + noise[:, start:stop],
            self.n_actions, self.config.action_chunk, None,
        )[1]  # fmt: skip

    def entropy_target(self, mask: ActionMask | None, rows: int) -> torch.Tensor:
        """H_target(s) [B]: ``target_entropy`` or ratio * log|A(s)| (|A(s)| >= 1)."""
        cfg = self.config
        if cfg.target_entropy is not None:
            return torch.full((rows,), float(cfg.target_entropy), device=self.device)
        if mask is None:
            return torch.full(
                (rows,), cfg.target_entropy_ratio * math.log(self.n_actions), device=self.device
            )
        return cfg.target_entropy_ratio * torch.log(
            mask.count(self.config.action_chunk).clamp_min(1).float()
        )

    def _min_q(self, names: tuple[str, str], obs: torch.Tensor):  # -> ScoreFn of min_i Q_i(s, .)
        (n1, n2), nets = names, self.nets
        u1, u2 = nets[n1].embed(obs), nets[n2].embed(obs)  # [B, k], [B, k]
        h1, h2 = nets[n1].head, nets[n2].head
        return lambda start, stop: torch.minimum(
            h1.scores(u1, start, stop), h2.scores(u2, start, stop)
        )

    @torch.no_grad()
    def td_target(self, batch: Batch, alpha: torch.Tensor | float) -> torch.Tensor:
        """y = r + d (1 - terminated) V(s'), V(s') = E_pi[min_i Q_target_i - alpha log pi], [B]."""
        n, chunk, next_obs = self.n_actions, self.config.action_chunk, batch["next_obs"]
        next_mask = ActionMask.of(batch.get("next_action_mask"), n, "next_action_mask")
        actor = self.nets["actor"]
        q_min = self._min_q(("q1_target", "q2_target"), next_obs)
        st = softmax_stats(actor.head.score_fn(actor.embed(next_obs)), n, chunk, next_mask, q_min)
        soft_v = (st.mean_value + alpha * st.entropy).masked_fill(batch["terminated"], 0.0)  # [B]
        return batch["reward"] + batch.get("discount", self.config.gamma) * soft_v

    def update(self, batch: Batch) -> dict[str, Any]:
        """One step on J(Q), then J(pi), then J(alpha) (module docstring), then Polyak targets.
        With ``config.compile`` one compiled step (:meth:`_step`)."""
        cfg, n = self.config, self.n_actions
        check_batch(
            batch, obs_shape=self.obs_shape, device=self.device, n_actions=n,
            values=self._values_due(),
        )  # fmt: skip
        self.updates += 1
        due = self.updates % cfg.target_update_interval == 0
        if self._compile_now():
            self.tau_now.fill_(cfg.tau if due else 0.0)  # the step's Polyak weight
            return self._compiled("update", self._step)(batch)
        with self._eager_timed():
            return self._eager(batch, due)

    def _eager(self, batch: Batch, due: bool) -> dict[str, Any]:
        """The update with autograd and the eager optimizers (``due``: move the targets)."""
        cfg, nets, groups, n = self.config, self.nets, self.groups, self.n_actions
        alpha = nets["alpha"]().detach()  # [] on the device (no host read)
        y = self.td_target(batch, alpha)  # [B]
        critic_loss, (q1, q2) = self._critic_loss(batch, y)
        critic_norm = groups["critic"].step(critic_loss, cfg.max_grad_norm)
        # actor: exact expectation over available actions, chunked, against the updated critics
        mask = ActionMask.of(batch.get("action_mask"), n, "action_mask")
        with torch.no_grad():
            q_min = self._min_q(("q1", "q2"), batch["obs"])
        u_pi = nets["actor"].embed(batch["obs"])  # [B, k]
        objective, entropy = soft_policy_objective(
            nets["actor"].head, u_pi, q_min, alpha, cfg.action_chunk, mask
        )  # [B], [B]
        actor_loss = objective.mean()
        actor_norm = groups["actor"].step(actor_loss, cfg.max_grad_norm)
        alpha_loss, target_h = self._alpha_loss(batch, entropy)
        if cfg.autotune_alpha:
            groups["alpha"].step(alpha_loss)
        if due:
            polyak_update(nets["q1_target"], nets["q1"], cfg.tau)
            polyak_update(nets["q2_target"], nets["q2"], cfg.tau)
        losses = {"critic_loss": critic_loss, "actor_loss": actor_loss, "alpha_loss": alpha_loss}
        self._watch(*losses.values())
        return self._metrics(losses, alpha, entropy, target_h, q1, q2, y, critic_norm, actor_norm)

    def _critic_loss(self, batch: Batch, y: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        """(J(Q), (Q_1(s, a_b), Q_2(s, a_b)) [B] each) for targets y [B]."""
        nets, obs, action = self.nets, batch["obs"], batch["action"]
        q1 = nets["q1"].head.score_actions(nets["q1"].embed(obs), action)  # [B]
        q2 = nets["q2"].head.score_actions(nets["q2"].embed(obs), action)  # [B]
        critic_per = 0.5 * ((q1 - y) ** 2 + (q2 - y) ** 2)  # [B]
        if "weight" in batch:
            critic_per = critic_per * batch["weight"]
        return critic_per.mean(), (q1, q2)

    def _alpha_loss(self, batch: Batch, entropy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(J(alpha), H_target(s) [B]) from the policy's entropy [B]."""
        mask = ActionMask.of(batch.get("action_mask"), self.n_actions, "action_mask")
        target_h = self.entropy_target(mask, entropy.shape[0])  # [B]
        loss = (self.nets["alpha"].log_alpha * (entropy - target_h).detach()).mean()
        return loss, target_h

    def _actor_objective(
        self, batch: Batch, alpha: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(J(pi), H(pi(.|s)) [B]) by one streaming softmax pass that autograd (torch.func)
        differentiates: the compiled step's form of :func:`soft_policy_objective` (same value
        and gradient; its backward keeps [B, chunk] per chunk, so O(B n) memory)."""
        n, chunk, obs, actor = (
            self.n_actions,
            self.config.action_chunk,
            batch["obs"],
            self.nets["actor"],
        )
        mask = ActionMask.of(batch.get("action_mask"), n, "action_mask")
        with torch.no_grad():
            q_min = self._min_q(("q1", "q2"), obs)
        st = softmax_stats(actor.head.score_fn(actor.embed(obs)), n, chunk, mask, q_min)
        return (-alpha * st.entropy - st.mean_value).mean(), st.entropy.detach()

    def _step(self, batch: Batch) -> dict[str, Any]:
        """The eager update's arithmetic as a function of tensors (compiled; gradients by
        ``torch.func``, Adam and the targets' lerp in place: rlstash.agents.compiled)."""
        cfg, fn, groups = self.config, self.functional, self.groups
        alpha = fn.call(lambda: self.nets["alpha"]().detach(), None, None)  # []
        y = fn.call(self.td_target, None, None, batch, alpha)  # [B]
        grad, (critic_loss, (q1, q2)) = fn.grad(self._critic_loss, "critic", batch, y)
        critic_norm = groups["critic"].apply(grad, cfg.max_grad_norm)
        grad, (actor_loss, entropy) = fn.grad(self._actor_objective, "actor", batch, alpha)
        actor_norm = groups["actor"].apply(grad, cfg.max_grad_norm)
        grad, (alpha_loss, target_h) = fn.grad(self._alpha_loss, "alpha", batch, entropy)
        if cfg.autotune_alpha:
            groups["alpha"].apply(grad)
        self._polyak("critic", "q1_target", "q1")
        self._polyak("critic", "q2_target", "q2")
        losses = {"critic_loss": critic_loss, "actor_loss": actor_loss, "alpha_loss": alpha_loss}
        self._watch(*losses.values())
        return self._metrics(losses, alpha, entropy, target_h, q1, q2, y, critic_norm, actor_norm)

    @staticmethod
    def _metrics(losses: dict, alpha: torch.Tensor, entropy: torch.Tensor, target_h: torch.Tensor,
                 q1: torch.Tensor, q2: torch.Tensor, y: torch.Tensor, critic_norm: Any,
                 actor_norm: Any) -> dict[str, Any]:  # fmt: skip
        return {  # 0-dim tensors on the device: no host read here (read_metrics when logging)
            **{name: loss.detach() for name, loss in losses.items()},
            "alpha": alpha,
            "entropy": entropy.mean(),
            "target_entropy": target_h.mean(),
            "q_mean": q1.detach().mean(),
            "critic_grad_norm": critic_norm,
            "actor_grad_norm": actor_norm,
            "td_error": (0.5 * ((q1 - y).abs() + (q2 - y).abs())).detach(),  # [B]
        }
