"""PPO (Schulman et al. 2017): clipped surrogate, GAE(lambda), categorical or Gaussian policies.

One update consumes one [T, N] rollout (:class:`rlstash.storage.rollout.RolloutStorage`)::

    old log pi, V(s), V(s')   under the current networks, once for all T * N rows
    A, R = GAE(lambda)        (rlstash.agents.gae; truncated episodes bootstrap from V(final obs))
    for each of n_epochs epochs, for each shuffled minibatch of minibatch_size valid-weighted rows:
        A_n     = (A - mean A) / (std A + 1e-8)                        per minibatch
        rho     = exp(log pi(a|s) - old log pi(a|s))
        L_pi    = mean max(-A_n rho, -A_n clip(rho, 1 - eps, 1 + eps))
        L_V     = mean (V(s) - R)^2, or with clip_range_vf:
                  mean max((V - R)^2, (V_old + clip(V - V_old, -eps_v, eps_v) - R)^2)
        L       = L_pi + vf_coef L_V - ent_coef mean H(pi(.|s))
        clip the global gradient norm to max_grad_norm, Adam step (fused)
    stop after an epoch whose mean approx KL E[(rho - 1) - log rho] exceeds target_kl

Rows that are no real step (reset steps of next-step autoreset, restarted workers) take part
with weight 0. Learning rate and clip range anneal linearly to 0 over ``total_steps`` env steps
when asked. Observation normalisation (running mean/std, statistics frozen during a rollout and
updated after its update, so behaviour and update see the same inputs) and reward scaling by
the running std of the discounted return are options; their statistics are in the state dict.

The eager update of MLP actor-critics (flat observations, a linear categorical head over at most
``action_chunk`` actions without masks, or a Gaussian with bound 'clip') computes this loss's
gradient written out, with no autograd graph (:mod:`rlstash.agents.ppo_grad`; ``backward``
setting): on CartPole's (64, 64) nets it halves the update's time. Other networks use autograd.

Metrics stay on the device as 0-dim tensors; nothing is read on the host per minibatch
(``target_kl`` reads one number per epoch). Categorical policies never build a one-hot or a
[B, n] tensor beyond ``action_chunk`` columns (:mod:`rlstash.agents.categorical`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rlstash.agents.actions import ActionFeatures, ActionMask, chunked_argmax, gumbel_scores
from rlstash.agents.base import (
    COMPILE_DEFAULT,
    COMPILE_HELP,
    AgentBase,
    ConfigMixin,
    agent_config,
    check_compile,
    check_count,
    check_fractions,
    check_non_negative,
    check_positive,
    flat_adam,
    hp,
    seeded_init,
)
from rlstash.agents.categorical import log_prob_entropy
from rlstash.agents.dict_obs import ObsLayout
from rlstash.agents.gae import rollout_gae
from rlstash.agents.normalize import ObsNormalizer, RewardScaler
from rlstash.agents.policies import CategoricalActorCritic, GaussianActorCritic
from rlstash.agents.ppo_grad import PPOGrad, normalized_advantages, unsupported
from rlstash.presets import CLEANRL_MUJOCO as CLEANRL_MUJOCO  # the former names, re-exported
from rlstash.presets import PPO_PRESETS
from rlstash.presets import ZOO_HALF_CHEETAH as ZOO_HALF_CHEETAH
from rlstash.settings import check_types
from rlstash.storage.rollout import RolloutStorage

# The per-env presets (the RL Zoo's and CleanRL's tuned entries) live with every algorithm's in
# rlstash.presets; PPOConfig.for_env reads them.
PRESETS = PPO_PRESETS
BACKWARDS = ("auto", "written", "autograd")
METRICS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "grad_norm")


@dataclass
class PPOConfig(ConfigMixin):
    """PPO hyperparameters (Stable-Baselines3's defaults; presets per env in ``PRESETS``)."""

    learning_rate: float = hp(3e-4, "Adam learning rate (start value when annealed).")
    anneal_lr: bool = hp(False, "Anneal the learning rate linearly to 0 over total_steps.")
    num_envs: int = hp(
        1, "Envs collected from in parallel (a rollout is rollout_steps x num_envs)."
    )
    rollout_steps: int = hp(2048, "Steps per env per rollout, T (SB3: n_steps).")
    minibatch_size: int = hp(64, "Rows of the T x N rollout per gradient step (SB3: batch_size).")
    n_epochs: int = hp(10, "Passes over each rollout.")
    gamma: float = hp(0.99, "Discount factor.")
    gae_lambda: float = hp(0.95, "GAE lambda.")
    clip_range: float = hp(0.2, "Clip range of the probability ratio.")
    anneal_clip_range: bool = hp(False, "Anneal the clip range linearly to 0 over total_steps.")
    clip_range_vf: float | None = hp(None, "Clip range of the value change (None: no clipping).")
    normalize_advantage: bool = hp(True, "Normalize advantages per minibatch.")
    ent_coef: float = hp(0.0, "Entropy bonus coefficient.")
    vf_coef: float = hp(0.5, "Value loss coefficient.")
    max_grad_norm: float = hp(0.5, "Clip the global gradient norm to this.")
    target_kl: float | None = hp(None, "Stop the epochs once an epoch's mean approx KL exceeds it.")
    norm_obs: bool = hp(False, "Normalize observations by running mean/std (clipped).")
    norm_reward: bool = hp(False, "Scale rewards by the running std of discounted returns.")
    clip_obs: float = hp(10.0, "Clip normalized observations to +-this.")
    clip_reward: float = hp(10.0, "Clip scaled rewards to +-this.")
    net_arch: tuple[int, ...] = hp((64, 64), "Hidden layers of the policy and value networks.")
    activation: str = hp("tanh", "Hidden activation: tanh or relu.")
    ortho_init: bool = hp(True, "Orthogonal initialization (SB3/CleanRL).")
    log_std_init: float = hp(0.0, "Initial log std of Gaussian policies.")
    bound: str = hp("clip", "Gaussian bounds: 'clip' (env clips samples) or 'tanh' (squash).")
    action_head: str = hp("linear", "'linear' (a weight row per action) or 'embedding'.")
    action_embed_dim: int = hp(64, "Learned action-embedding width (embedding head).")
    learn_action_embeddings: bool = hp(True, "Learn the action table; False keeps features fixed.")
    action_chunk: int = hp(8192, "Actions scored per chunk; extra memory O(batch * chunk).")
    adam_eps: float = hp(1e-5, "Adam epsilon.")
    obs_keys: tuple[str, ...] | None = hp(
        None, "Dict observations: the keys the networks take, flattened and concatenated in "
        "this order (nested keys joined by '/'; None: all, in the observation's order)."
    )  # fmt: skip
    total_steps: int = hp(1_000_000, "Env steps of the run (the annealing horizon).")
    seed: int = hp(0, "Seed of the network init and of the policy's sampling.")
    compile: bool | str = hp(COMPILE_DEFAULT, COMPILE_HELP)
    backward: str = hp(
        "auto", "Gradient of the eager update: 'written' (the loss's gradient written out for "
        "MLP actor-critics, rlstash.agents.ppo_grad), 'autograd', or 'auto' (written where it "
        "applies)."
    )  # fmt: skip

    PRESETS = PRESETS

    def __post_init__(self) -> None:
        self.net_arch = tuple(self.net_arch)
        if isinstance(self.obs_keys, str):
            self.obs_keys = (self.obs_keys,)
        elif self.obs_keys is not None:
            self.obs_keys = tuple(self.obs_keys)
        check_types(self)
        check_compile(self)
        check_positive(
            learning_rate=self.learning_rate,
            num_envs=self.num_envs,
            rollout_steps=self.rollout_steps,
            minibatch_size=self.minibatch_size,
            n_epochs=self.n_epochs,
            clip_range=self.clip_range,
            max_grad_norm=self.max_grad_norm,
            action_chunk=self.action_chunk,
            total_steps=self.total_steps,
            clip_obs=self.clip_obs,
            clip_reward=self.clip_reward,
            adam_eps=self.adam_eps,
        )
        check_fractions(gamma=self.gamma, gae_lambda=self.gae_lambda)
        check_non_negative(ent_coef=self.ent_coef, vf_coef=self.vf_coef)
        for name, value in (("clip_range_vf", self.clip_range_vf), ("target_kl", self.target_kl)):
            if value is not None and not value > 0:
                raise ValueError(f"{name}: expected > 0 or None (off), got {value!r}")
        if self.backward not in BACKWARDS:
            raise ValueError(
                f"backward: expected one of {', '.join(BACKWARDS)}, got {self.backward!r}"
            )
        if any((not isinstance(h, int)) or h <= 0 for h in self.net_arch):
            raise ValueError(f"net_arch: expected positive layer widths, got {self.net_arch!r}")


class PPO(AgentBase):
    """PPO over ``n_actions`` discrete actions or a Box of ``bounds`` = (low, high).

    ``obs_shape``: the observation's shape, or for dict observations a dict of shapes by key
    (nested keys joined by ``/``; :func:`rlstash.obs_shapes` of the env's observation space): the
    networks then take the keys ``config.obs_keys`` flattened and concatenated
    (:class:`~rlstash.agents.dict_obs.ObsLayout`), and ``act``, the rollout and the
    normaliser take the dicts as the env returns them."""

    algo = "ppo"

    def __init__(
        self,
        obs_shape: tuple[int, ...] | Mapping[str, tuple[int, ...]],
        n_actions: int | None = None,
        bounds: tuple[np.ndarray, np.ndarray] | None = None,
        config: PPOConfig | None = None,
        device: torch.device | str = "cpu",
        act_device: torch.device | str | None = None,
        action_features: torch.Tensor | ActionFeatures | None = None,
    ):
        cfg = self.config = agent_config(config, PPOConfig)
        if (n_actions is None) == (bounds is None):
            raise ValueError("PPO: give exactly one of n_actions (discrete) or bounds (continuous)")
        if n_actions is not None:
            check_count("n_actions", n_actions)
        self.obs_layout: ObsLayout | None = None
        if isinstance(obs_shape, Mapping):
            self.obs_layout = ObsLayout(obs_shape, cfg.obs_keys)
            obs_shape = (self.obs_layout.dim,)
        elif cfg.obs_keys is not None:
            raise ValueError(
                f"obs_keys: set to {cfg.obs_keys!r}, but the observation is not a dict (shape "
                f"{tuple(obs_shape)}); drop obs_keys"
            )
        self.obs_shape, self.n_actions = tuple(obs_shape), n_actions
        if isinstance(action_features, torch.Tensor):
            action_features = ActionFeatures(action_features)
        self._init_devices(device, act_device, cfg.seed)
        with seeded_init(cfg.seed):
            if n_actions is not None:
                policy: Any = CategoricalActorCritic(
                    self.obs_shape, n_actions, cfg.net_arch, cfg.activation, cfg.action_head,
                    cfg.action_embed_dim, action_features, cfg.learn_action_embeddings,
                    cfg.ortho_init,
                )  # fmt: skip
            else:
                low, high = bounds
                policy = GaussianActorCritic(self.obs_shape, low, high, cfg.net_arch, cfg.activation,
                                             cfg.log_std_init, cfg.bound, cfg.ortho_init)  # fmt: skip
        nets: dict[str, Any] = {"policy": policy}
        names: tuple[str, ...] = ("policy",)
        if cfg.norm_obs:
            nets["obs_norm"], names = (
                ObsNormalizer(self.obs_shape, cfg.clip_obs),
                ("policy", "obs_norm"),
            )
        if cfg.norm_reward:
            nets["reward_scaler"] = RewardScaler(cfg.gamma, cfg.clip_reward)
        policy_group = flat_adam(self, "policy", lr=cfg.learning_rate, eps=cfg.adam_eps)
        why = unsupported(policy, n_actions, cfg.action_chunk)
        self._autograd_why = "backward='autograd'" if cfg.backward == "autograd" else why
        if cfg.backward == "written":
            if why is not None:
                raise ValueError(
                    f"backward: 'written' covers MLP actor-critics, this one has {why}; use "
                    "backward='auto' (autograd here) or 'autograd'"
                )
        self._setup(nets, names, {"policy": policy_group})
        self._written: PPOGrad | None = None
        self.clip_now = torch.zeros((), device=self.device)  # a compiled step's clip range

    # --- acting ----------------------------------------------------------------------------

    def _pre(self, obs: torch.Tensor, nets: dict[str, Any]) -> torch.Tensor:
        """Observations as the networks take them: normalized, or float (uint8 images kept)."""
        if "obs_norm" in nets:
            return nets["obs_norm"](obs)
        return obs if obs.dtype == torch.uint8 and obs.dim() == 4 else obs.float()

    @torch.no_grad()
    def act(
        self, obs: torch.Tensor, deterministic: bool = False, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """a ~ pi(.|s) ([N] int64 or [N, act_dim] float) on ``act_device``; the mode when
        ``deterministic``. Masked discrete actions are never chosen. Gaussian 'clip' samples
        are not clipped (the env clips them; see :mod:`rlstash.agents.policies`)."""
        if self.obs_layout is not None:
            obs = self.obs_layout.flatten(obs)  # [N, dim]
        obs = self._prepare_obs(obs, self.obs_shape)  # [N, *obs_shape]
        rows, net = obs.shape[0], self.actor["policy"]
        x = self._pre(obs, self.actor)
        if self.n_actions is None:
            if deterministic:
                return net.sample(x, self.act_gen, True)  # [N, act_dim]
            eps = torch.randn((rows, net.mu.out_features), generator=self.act_gen, device=x.device)
            self.env_steps += rows
            graphed = self._act_step(rows, net.explore)  # compiled and graphed on CUDA
            return (graphed if graphed is not None else net.explore)(x, eps)  # [N, act_dim]
        else:
            amask = self._prepare_mask(mask, self.n_actions, rows)
            if amask is None and self.n_actions <= self.config.action_chunk:  # small: dense
                graphed = self._act_step(rows, self._logits)  # the network's forward, on CUDA
                logits = (graphed if graphed is not None else self._logits)(x)  # [N, n]
                self.env_steps += 0 if deterministic else rows
                if deterministic:
                    return logits.argmax(1)
                probs = torch.softmax(logits, 1)  # [N, n]
                return torch.multinomial(probs, 1, generator=self.act_gen).squeeze(1)
            logit_fn = net.head.score_fn(net.embed(x))  # chunks of [N, c]
            if not deterministic:
                logit_fn = gumbel_scores(logit_fn, self.act_gen)  # argmax = a sample of pi
            best, action = chunked_argmax(logit_fn, self.n_actions, self.config.action_chunk, amask)
            if amask is not None:
                self._check_available(best)
        self.env_steps += 0 if deterministic else rows
        return action

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        """The acting policy's logits [N, n] of all actions (dense: n <= action_chunk); the
        sampling (torch.multinomial, from ``act_gen``) stays outside any graph."""
        net = self.actor["policy"]
        return torch.nn.functional.linear(net.embed(x), net.head.table(), net.head.bias())

    def log_prob_entropy(
        self, x: torch.Tensor, action: torch.Tensor, mask: ActionMask | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(log pi(action|s) [B], H(pi(.|s)) [B]) for preprocessed observations ``x``."""
        return self._policy_terms(self.nets["policy"].actor_trunk(x), action, mask)

    def _policy_terms(
        self, feat: torch.Tensor, action: torch.Tensor, mask: ActionMask | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(log pi(action|s) [B], H(pi(.|s)) [B]) from the actor trunk's features [B, d]."""
        net = self.nets["policy"]
        if self.n_actions is None:
            return net.log_prob_entropy_features(feat, action)
        u = net.embed_features(feat)  # [B, k]
        return log_prob_entropy(net.head, u, action, self.config.action_chunk, mask)

    # --- learning --------------------------------------------------------------------------

    def progress_remaining(self) -> float:
        """1 at the start of the run, 0 after ``total_steps`` env steps (annealing)."""
        return max(0.0, 1.0 - self.env_steps / self.config.total_steps)

    def update(self, rollout: RolloutStorage) -> dict[str, Any]:
        """One PPO update on ``rollout`` (module docstring); metrics as 0-dim device tensors
        (means over the minibatches run) plus the host numbers ``epochs``, ``learning_rate``
        and ``clip_range``."""
        cfg = self.config
        if not isinstance(rollout, RolloutStorage) or not rollout.filled:
            raise ValueError(
                "rollout: expected a RolloutStorage holding a rollout (call add first)"
            )
        data = self.prepare(rollout)
        progress = self.progress_remaining()
        lr = cfg.learning_rate * (progress if cfg.anneal_lr else 1.0)
        clip = cfg.clip_range * (progress if cfg.anneal_clip_range else 1.0)
        self.groups["policy"].set_lr(lr)
        self.clip_now.fill_(clip)
        per_epoch = -(-rollout.size // cfg.minibatch_size)
        rows = torch.empty((cfg.n_epochs * per_epoch, len(METRICS)), device=self.device)
        batches, epochs = 0, 0
        for _ in range(cfg.n_epochs):
            epochs += 1
            epoch_kl, epoch_batches = torch.zeros((), device=self.device), 0
            for idx in rollout.minibatches(cfg.minibatch_size, self.learn_gen):
                idx = None if idx is None else idx.to(self.device)
                stats = self._minibatch(data, idx, clip)  # [len(METRICS)]
                rows[batches] = stats
                epoch_kl += stats[3]
                batches, epoch_batches = batches + 1, epoch_batches + 1
            if cfg.target_kl is not None and float(epoch_kl) / epoch_batches > cfg.target_kl:
                break  # one host read per epoch, only with target_kl
        if "obs_norm" in self.nets:  # the next rollout sees statistics that include this one
            self.nets["obs_norm"].rms.update(data["raw_obs"], data["valid"])
        self.sync_actor()
        # each minibatch step's loss terms finite? (one watch per rollout, no host read)
        self._watch_updates(torch.isfinite(rows[:batches, :3]).all(1))
        out: dict[str, Any] = dict(zip(METRICS, (rows[:batches].sum(0) / batches).unbind()))
        out["explained_variance"] = data["explained_variance"]
        out.update(epochs=epochs, learning_rate=lr, clip_range=clip)
        return out

    def _minibatch(
        self, data: dict[str, torch.Tensor], idx: torch.Tensor | None, clip: float
    ) -> torch.Tensor:
        """One gradient step on rows ``idx`` (None: all rows); returns the METRICS as one [6]
        tensor. Rows that are no real step weigh 0 (unless the rollout has none). With
        ``config.compile`` one compiled step per minibatch size (:meth:`_step`)."""
        names = ["obs", "action", "logp", "advantages", "returns", "values"]
        names += [name for name in ("action_mask",) if name in data]
        if not data["all_valid"]:
            names.append("valid")
        mb = {name: data[name] if idx is None else data[name][idx] for name in names}
        self.updates += 1
        if self._compile_now():
            return self._compiled(f"minibatch-{mb['obs'].shape[0]}", self._step)(mb, self.clip_now)
        written = None if "action_mask" in mb else self.written_grad()
        with self._eager_timed():
            if written is not None:
                return written.step(mb, clip)
            loss, stats = self._loss(mb, clip)
            norm = self.groups["policy"].step(loss, self.config.max_grad_norm)
            return torch.stack([*stats, norm]).detach()

    def written_grad(self) -> PPOGrad | None:
        """The written-out gradient (:mod:`rlstash.agents.ppo_grad`) when ``config.backward``
        and the networks allow it, over the current optimizer group; None: autograd."""
        if self._autograd_why is not None:
            return None
        if self._written is None or self._written.group is not self.groups["policy"]:
            self._written = PPOGrad(self.nets["policy"], self.groups["policy"], self.config)
        return self._written

    def _worth_compiling(self) -> bool:
        """``compile='auto'`` leaves the written-out gradient eager on CPU: the compiled step
        runs at 0.86-1.10x its rate there (bench/results/updates.md, ppo-256 and ppo-64), not
        worth a compilation. (On CUDA a compiled step is also a CUDA graph: the usual rule.)"""
        if self.device.type == "cpu" and self.written_grad() is not None:
            return False
        return super()._worth_compiling()

    def _step(self, mb: dict[str, torch.Tensor], clip: torch.Tensor) -> torch.Tensor:
        """:meth:`_loss`, its gradient by ``torch.func`` and Adam in place, as one function of
        tensors (compiled; rlstash.agents.compiled)."""
        grad, (_, stats) = self.functional.grad(self._loss, "policy", mb, clip)
        norm = self.groups["policy"].apply(grad, self.config.max_grad_norm)
        return torch.stack([*stats, norm]).detach()

    def _loss(
        self, mb: dict[str, torch.Tensor], clip: float | torch.Tensor
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """(L, (policy loss, value loss, entropy, approx KL, clip fraction)) of a minibatch
        (module docstring); a "valid" field weighs its rows (0: no real step)."""
        cfg, net = self.config, self.nets["policy"]
        w = mb["valid"].float() if "valid" in mb else None  # [B]
        n_w = None if w is None else w.sum().clamp_min(1.0)

        def mean(t: torch.Tensor) -> torch.Tensor:
            return t.mean() if w is None else (w * t).sum() / n_w

        mask = ActionMask(mb["action_mask"], self.n_actions) if "action_mask" in mb else None
        feat, value = net.features_and_value(mb["obs"])  # [B, d], [B]: a shared CNN runs once
        logp, entropy = self._policy_terms(feat, mb["action"], mask)  # [B], [B]
        adv = mb["advantages"]  # [B]
        if cfg.normalize_advantage:
            adv = normalized_advantages(adv, w)
        log_ratio = logp - mb["logp"]
        ratio = log_ratio.exp()
        pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip))  # [B]
        ret, old_v = mb["returns"], mb["values"]
        v_loss = (value - ret) ** 2
        if cfg.clip_range_vf is not None:
            clipped = old_v + (value - old_v).clamp(-cfg.clip_range_vf, cfg.clip_range_vf)
            v_loss = torch.maximum(v_loss, (clipped - ret) ** 2)
        policy_loss, value_loss, ent = mean(pg), mean(v_loss), mean(entropy)
        loss = policy_loss + cfg.vf_coef * value_loss - cfg.ent_coef * ent
        with torch.no_grad():
            kl = mean((ratio - 1) - log_ratio)
            clip_frac = mean(((ratio - 1).abs() > clip).float())
        return loss, (policy_loss.detach(), value_loss.detach(), ent.detach(), kl, clip_frac)

    @torch.no_grad()
    def prepare(self, rollout: RolloutStorage) -> dict[str, torch.Tensor]:
        """Flat [T * N] tensors on the learner's device: preprocessed obs, action, valid,
        old log pi, V(s), GAE advantages and returns, explained variance."""
        rollout = rollout.to(self.device)
        reward = rollout.reward
        if "reward_scaler" in self.nets:
            done = rollout.terminated | rollout.truncated
            reward = self.nets["reward_scaler"].scale(reward, done, rollout.valid)
        # a rollout with action masks takes the autograd update, values included
        written = None if rollout.action_mask is not None else self.written_grad()
        adv, ret, values = rollout_gae(rollout, lambda obs: self._values(obs, written),
                                       self.config.gamma, self.config.gae_lambda, reward)  # fmt: skip
        raw = self._flat_obs(rollout.flat("obs"))  # [T * N, ...]
        data = {"obs": self._pre(raw, self.nets), "raw_obs": raw,
                "action": rollout.flat("action"), "valid": rollout.valid.reshape(-1),
                "values": values.reshape(-1), "advantages": adv.reshape(-1),
                "returns": ret.reshape(-1)}  # fmt: skip
        mask = None
        if rollout.action_mask is not None:
            data["action_mask"] = rollout.flat("action_mask")
            mask = ActionMask(data["action_mask"], self.n_actions)
        data["logp"] = self._old_logp(data["obs"], data["action"], mask, written)
        data["all_valid"] = rollout.all_valid  # a host bool: no weighting needed
        w = data["valid"].float()
        resid, target = data["returns"] - data["values"], data["returns"]
        data["explained_variance"] = 1 - _wvar(resid, w) / _wvar(target, w).clamp_min(1e-12)
        return data

    def _values(self, obs: torch.Tensor, written: PPOGrad | None) -> torch.Tensor:
        """V(s) [B] of stored observations, in pieces of 4096 rows (as ``written`` computes
        it when given)."""
        obs = self._flat_obs(obs)
        value = self.nets["policy"].value if written is None else written.value
        return torch.cat([value(self._pre(part, self.nets)) for part in obs.split(4096)])

    def _flat_obs(self, obs: Any) -> torch.Tensor:
        """Stored observations [B, ...] as the networks take them (dicts flattened)."""
        return obs if self.obs_layout is None else self.obs_layout.flatten(obs)

    def _old_logp(
        self, x: torch.Tensor, action: torch.Tensor, mask: ActionMask | None,
        written: PPOGrad | None,
    ) -> torch.Tensor:  # fmt: skip
        """log pi(a|s) of the behaviour policy, in pieces of a minibatch (bounded memory); as
        ``written`` computes it when given (so the first epoch's ratio is exactly 1)."""
        huge = self.n_actions is not None and self.n_actions > self.config.action_chunk
        size, parts = (self.config.minibatch_size if huge else 4096), []
        for start in range(0, x.shape[0], size):
            sl = slice(start, start + size)
            if written is not None:
                parts.append(written.log_prob(x[sl], action[sl]))
                continue
            m = None if mask is None else ActionMask(mask.mask[sl], self.n_actions)
            parts.append(self.log_prob_entropy(x[sl], action[sl], m)[0])
        return torch.cat(parts)


def _wvar(t: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    n = w.sum().clamp_min(1.0)
    mean = (w * t).sum() / n
    return (w * (t - mean) ** 2).sum() / n
