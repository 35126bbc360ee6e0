"""MAPPO and IPPO (Yu et al. 2022; de Witt et al. 2020): PPO per agent, with a centralised or
a per-agent critic, over a [T, E, A] rollout (:class:`~rlstash.storage.marl_rollout.MultiAgentRollout`).

::

    actor   pi(a_i | o_i [, onehot(i)])            shared by all agents (default) or one per agent
    critic  MAPPO: V_i(s [, onehot(i)])            s = the env's global state, or the
                                                   concatenation of every agent's observation
            IPPO:  V_i(o_i [, onehot(i)])
    A, R = GAE(lambda) per agent over T            (the agent's own reward: a team reward is
                                                   the same value for each agent)
    for each of n_epochs passes, for each shuffled minibatch of minibatch_size env steps:
        rho    = exp(log pi(a|o) - old log pi(a|o))                 per agent row
        L_pi   = sum_m max(-A rho, -A clip(rho, 1 - eps, 1 + eps)) / sum m - c_ent H
        L_V    = vf_coef sum_m (V - R)^2 / sum m
        actor and critic each: clip its gradient norm to max_grad_norm, a fused Adam step

``m`` is the agent's ``mask``: an agent done early (or absent) contributes nothing after its
done. With a shared critic and no agent id the centralised value is computed once per env and
repeated for each agent (BenchMARL's ``share_param_critic``). Continuous actions follow a
tanh-normal policy as BenchMARL's (loc and a ``biased_softplus_1.0`` scale from the actor, the
sample u ~ N(loc, scale) squashed: a = low + (high - low)(tanh u + 1) / 2); the rollout keeps u,
whose Gaussian log-density gives the ratio (the tanh Jacobian is the same under both policies
and cancels). Discrete actions are categorical, unavailable ones (``action_mask``) never chosen.

Defaults are BenchMARL's (``conf/algorithm/mappo.yaml``, ``experiment/base_experiment.yaml``):
lr 5e-5, Adam eps 1e-6, grad clip 5, gamma 0.99, lambda 0.9, clip 0.2, entropy 0, [256, 256]
tanh MLPs, no advantage normalisation. Metrics stay on the device: nothing is read on the host
during an update.

Speed (bench/marl_update.py): the permutations of all passes are drawn up front (the same
generator sequence as one per pass), each pass gathers its shuffled rows once (minibatches are
contiguous slices), Adam is the fused kernel on each flat vector without ``torch.optim``'s
per-step Python, and with ``compile`` (PPOConfig's setting, same meaning) each minibatch is one
``torch.compile``d step: the losses, their gradient by ``torch.func`` over both flat vectors,
clipping and Adam in place (:mod:`rlstash.agents.compiled`). By default (``backward='auto'``)
the gradient is written out instead of taken by autograd (:mod:`rlstash.agents.marl_grad`:
the same update to float rounding, at the compiled step's speed on CPU without compiling, so
``compile='auto'`` stays on it there); ``repr(agent)`` and :attr:`MAPPO.update_path` say
which path runs.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from gymnasium import spaces

from rlstash.agents.base import (
    COMPILE_DEFAULT,
    COMPILE_HELP,
    ConfigMixin,
    check_compile,
    check_fractions,
    check_non_negative,
    check_positive,
    compile_after_s,
    hp,
    seeded_init,
)
from rlstash.agents.compiled import CompiledStep, FlatAdam, Functional
from rlstash.agents.gae import gae
from rlstash.agents.marl_grad import MAPPOGrad, unsupported
from rlstash.agents.marl_nets import AgentMLP, biased_softplus, with_agent_id
from rlstash.settings import check_types
from rlstash.storage.marl_rollout import MultiAgentRollout

BACKWARDS = ("auto", "written", "autograd")
METRICS = ("policy_loss", "value_loss", "approx_kl", "clip_fraction", "actor_grad_norm",
           "critic_grad_norm")  # fmt: skip


@dataclass
class MAPPOConfig(ConfigMixin):
    """MAPPO/IPPO hyperparameters (BenchMARL's defaults)."""

    learning_rate: float = hp(5e-5, "Adam learning rate of actor and critic.")
    adam_eps: float = hp(1e-6, "Adam epsilon.")
    num_envs: int = hp(
        10, "Envs collected from in parallel (a rollout is rollout_steps x num_envs)."
    )
    rollout_steps: int = hp(600, "Steps per env per rollout (BenchMARL: 6000 frames / 10 envs).")
    minibatch_size: int = hp(400, "Env steps (each with all its agents) per gradient step.")
    n_epochs: int = hp(45, "Passes over each rollout.")
    gamma: float = hp(0.99, "Discount factor.")
    gae_lambda: float = hp(0.9, "GAE lambda.")
    bootstrap_truncated: bool = hp(
        True, "Bootstrap an episode cut by a time limit (or a restart) from V(its final "
        "observation); False: no bootstrap, as if it terminated (BenchMARL's VMAS tasks: "
        "TorchRL's VmasEnv reports the horizon as terminated)."
    )  # fmt: skip
    clip_range: float = hp(0.2, "Clip range of the probability ratio.")
    ent_coef: float = hp(0.0, "Entropy bonus coefficient.")
    vf_coef: float = hp(1.0, "Value loss coefficient.")
    max_grad_norm: float = hp(5.0, "Clip the actor's and the critic's gradient norm to this.")
    net_arch: tuple[int, ...] = hp((256, 256), "Hidden layers of the actor and the critic.")
    activation: str = hp("tanh", "Hidden activation: tanh or relu.")
    share_params: bool = hp(True, "One actor and one critic for all agents (False: one per agent).")
    agent_id: bool = hp(True, "Shared networks take a one-hot agent id input.")
    centralised: bool = hp(True, "Critic over the global state (MAPPO); False: own obs (IPPO).")
    total_steps: int = hp(1_000_000, "Env steps of the run (informational).")
    seed: int = hp(0, "Seed of the network init and of the policy's sampling.")
    compile: bool | str = hp(COMPILE_DEFAULT, COMPILE_HELP)
    backward: str = hp(
        "auto", "Gradient of the eager update: 'written' (written out, rlstash.agents.marl_grad),"
        " 'autograd', or 'auto' (written where it applies; on CPU it also stands in for "
        "compile='auto')."
    )  # fmt: skip

    def __post_init__(self) -> None:
        self.net_arch = tuple(self.net_arch)
        check_types(self)
        check_compile(self)
        if self.backward not in BACKWARDS:
            raise ValueError(
                f"backward: expected one of {', '.join(BACKWARDS)}, got {self.backward!r}"
            )
        check_positive(
            learning_rate=self.learning_rate,
            adam_eps=self.adam_eps,
            num_envs=self.num_envs,
            rollout_steps=self.rollout_steps,
            minibatch_size=self.minibatch_size,
            n_epochs=self.n_epochs,
            clip_range=self.clip_range,
            max_grad_norm=self.max_grad_norm,
        )
        check_fractions(gamma=self.gamma, gae_lambda=self.gae_lambda)
        check_non_negative(ent_coef=self.ent_coef, vf_coef=self.vf_coef)


class MAPPO:
    """MAPPO (``config.centralised``) or IPPO for one group of ``n_agents`` agents with
    observations of ``obs_dim`` floats (module docstring). Give ``n_actions`` (discrete) or
    ``bounds`` = (low, high) arrays of one agent's Box; ``state_dim`` when the env has a global
    state (else MAPPO's critic takes the ``n_agents * obs_dim`` concatenated observations)."""

    def __init__(
        self,
        n_agents: int,
        obs_dim: int,
        n_actions: int | None = None,
        bounds: tuple[Any, Any] | None = None,
        state_dim: int | None = None,
        config: MAPPOConfig | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        cfg = self.config = config if config is not None else MAPPOConfig()
        if (n_actions is None) == (bounds is None):
            raise ValueError(
                "MAPPO: give exactly one of n_actions (discrete) or bounds (continuous)"
            )
        self.n_agents, self.obs_dim, self.n_actions = n_agents, obs_dim, n_actions
        self.state_dim, self.device = state_dim, torch.device(device)
        self.algo = "mappo" if cfg.centralised else "ippo"
        A, per_agent = n_agents, None if cfg.share_params else n_agents
        ids = A if (cfg.share_params and cfg.agent_id) else 0
        if bounds is not None:
            low = torch.as_tensor(bounds[0], dtype=torch.float32, device=self.device)
            high = torch.as_tensor(bounds[1], dtype=torch.float32, device=self.device)
            self.low, self.span = low, high - low
            self.act_dim = int(low.numel())
            n_out = 2 * self.act_dim
        else:
            self.act_dim, n_out = 0, int(n_actions)
        critic_in = (state_dim or A * obs_dim) if cfg.centralised else obs_dim
        # a shared centralised critic without ids gives every agent the same value: run it once
        self._critic_once = cfg.centralised and cfg.share_params and not cfg.agent_id
        with seeded_init(cfg.seed):
            self.actor = AgentMLP(obs_dim + ids, cfg.net_arch, n_out, per_agent, cfg.activation)
            self.critic = AgentMLP(critic_in + (0 if self._critic_once else ids), cfg.net_arch,
                                   1, per_agent, cfg.activation)  # fmt: skip
        self.actor.to(self.device)
        self.critic.to(self.device)
        self.actor_opt = FlatAdam([self.actor], cfg.learning_rate, cfg.adam_eps)
        self.critic_opt = FlatAdam([self.critic], cfg.learning_rate, cfg.adam_eps)
        self.gen = torch.Generator(device=self.device)
        self.gen.manual_seed(cfg.seed)
        self.updates = 0
        self.functional = Functional(
            {"actor": self.actor, "critic": self.critic},
            {"actor": self.actor_opt, "critic": self.critic_opt},
        )
        self.compile_timer = [0.0]  # seconds the compiled steps' first calls took
        self.eager_update_s = 0.0  # wall seconds of eager minibatch steps ("auto" counts them)
        self.compile_after_s = compile_after_s()
        self._compiling = False  # compile="auto" decided to compile: it stays compiled
        self._step_fn: CompiledStep | None = None
        self._written: MAPPOGrad | None = None
        why = unsupported(self)
        self.autograd_why = "backward='autograd'" if cfg.backward == "autograd" else why
        if cfg.backward == "written" and why is not None:
            raise ValueError(
                f"backward: 'written' covers AgentMLP actors and critics, this agent has {why};"
                " use backward='auto' (autograd here) or 'autograd'"
            )

    def __repr__(self) -> str:
        kind = "discrete" if self.n_actions is not None else "continuous"
        params = "shared" if self.config.share_params else "per-agent"
        return (f"{self.algo.upper()}(agents={self.n_agents}, {kind}, {params} parameters, "
                f"update={self.update_path})")  # fmt: skip

    @property
    def update_path(self) -> str:
        """How :meth:`learn` computes its gradient now: 'compiled', 'written' or 'autograd
        (<why>)'."""
        if self._compiling or self.config.compile is True:
            return "compiled"
        return "written" if self.autograd_why is None else f"autograd ({self.autograd_why})"

    def written_grad(self) -> MAPPOGrad | None:
        """The written-out gradient (:mod:`rlstash.agents.marl_grad`) over the current
        optimizer groups, or None where autograd computes it (``autograd_why``)."""
        if self.autograd_why is not None:
            return None
        if self._written is None or self._written.groups != (self.actor_opt, self.critic_opt):
            self._written = MAPPOGrad(self)
        return self._written

    @property
    def compile_seconds(self) -> float:
        """Wall seconds the compiled steps' first calls took (0 without ``compile``)."""
        return self.compile_timer[0]

    # --- networks ------------------------------------------------------------------------------

    def _actor_in(self, obs: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        return with_agent_id(obs) if cfg.share_params and cfg.agent_id else obs

    def dist_params(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(loc, scale) [..., A, act_dim] of the tanh-normal, or (logits [..., A, n], None)."""
        out = self.actor(self._actor_in(obs))
        if self.n_actions is not None:
            return out, None
        loc, raw = out.chunk(2, -1)
        return loc, biased_softplus(raw)

    def _critic_in(self, obs: torch.Tensor, state: torch.Tensor | None = None) -> torch.Tensor:
        """The critic's input [..., A, D'], or [..., 1, S] where the value is computed once
        per env for all its agents."""
        cfg = self.config
        if not cfg.centralised:
            return self._actor_in(obs)
        g = state if state is not None else obs.flatten(-2)  # [..., S] or [..., A * D]
        if self._critic_once:
            return g[..., None, :]
        g = g[..., None, :].expand(*obs.shape[:-1], g.shape[-1])  # [..., A, S]
        return self._actor_in(g) if cfg.share_params else g

    def values(self, obs: torch.Tensor, state: torch.Tensor | None = None) -> torch.Tensor:
        """V [..., A] of observations [..., A, D] (and the global state [..., S])."""
        v = self.critic(self._critic_in(obs, state)).squeeze(-1)
        return v.expand(*obs.shape[:-1]) if self._critic_once else v

    def log_prob(
        self, obs: torch.Tensor, action: torch.Tensor, action_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(log pi(action | obs) [..., A], entropy [..., A]); continuous: of the pre-tanh
        sample (module docstring; the entropy is the Gaussian's)."""
        p, scale = self.dist_params(obs)
        if scale is None:
            logits = p if action_mask is None else p.masked_fill(~action_mask, -1e9)
            logp_all = torch.log_softmax(logits, -1)
            ent = -(logp_all.exp() * logp_all).sum(-1)
            return logp_all.gather(-1, action[..., None]).squeeze(-1), ent
        z = (action - p) / scale
        log_scale = scale.log()
        logp = (-0.5 * z.square() - log_scale - 0.5 * math_log_2pi).sum(-1)
        ent = (0.5 + 0.5 * math_log_2pi + log_scale).sum(-1)
        return logp, ent

    # --- acting -----------------------------------------------------------------------------

    @torch.no_grad()
    def act(
        self, obs: torch.Tensor, action_mask: torch.Tensor | None = None,
        deterministic: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        """(stored action, env action, log pi) for observations [E, A, D]: continuous: the
        pre-tanh sample u [E, A, act_dim], the squashed action in the Box, log N(u); discrete:
        indices [E, A] twice. ``deterministic``: the mode (tanh of the loc; the argmax)."""
        p, scale = self.dist_params(obs)
        if scale is None:
            logits = p if action_mask is None else p.masked_fill(~action_mask, -1e9)
            if deterministic:
                a = logits.argmax(-1)
            else:
                probs = torch.softmax(logits, -1).reshape(-1, logits.shape[-1])
                a = torch.multinomial(probs, 1, generator=self.gen).reshape(logits.shape[:-1])
            logp = torch.log_softmax(logits, -1).gather(-1, a[..., None]).squeeze(-1)
            return a, a, logp
        if deterministic:
            u = p
        else:
            u = p + scale * torch.randn(p.shape, generator=self.gen, device=p.device)
        z = (u - p) / scale
        logp = (-0.5 * z.square() - scale.log() - 0.5 * math_log_2pi).sum(-1)
        return u, self.squash(u), logp

    def squash(self, u: torch.Tensor) -> torch.Tensor:
        """The env action of a pre-tanh sample: low + (high - low)(tanh u + 1) / 2."""
        return self.low + self.span * (torch.tanh(u) + 1) * 0.5

    # --- learning ---------------------------------------------------------------------------

    def losses(self, mb: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The losses of a minibatch of B env steps (fields [B, A, ...]: obs, action, logp,
        advantages, returns, mask; state [B, S] where the env has one; action_mask)."""
        cfg = self.config
        m = mb["mask"]  # [B, A]: rows with False contribute nothing (where, not a product:
        n = m.sum().clamp_min(1).float()  # their data may be anything, even inf)
        logp, ent = self.log_prob(mb["obs"], mb["action"], mb.get("action_mask"))
        log_ratio = torch.where(m, logp - mb["logp"], 0.0)
        ratio = log_ratio.exp()
        adv = torch.where(m, mb["advantages"], 0.0)
        surr = torch.minimum(adv * ratio, adv * ratio.clamp(1 - cfg.clip_range, 1 + cfg.clip_range))
        ent = torch.where(m, ent, 0.0)
        policy = -surr.sum() / n - cfg.ent_coef * ent.sum() / n
        v = self.values(mb["obs"], mb.get("state"))
        err = torch.where(m, v - mb["returns"], 0.0)
        value = cfg.vf_coef * err.square().sum() / n
        with torch.no_grad():
            kl = ((ratio - 1) - log_ratio).sum() / n
            clipped = ((ratio - 1).abs() > cfg.clip_range).float().sum() / n
        return {"policy_loss": policy, "value_loss": value, "approx_kl": kl,
                "clip_fraction": clipped}  # fmt: skip

    @torch.no_grad()
    def advantages(self, rollout: MultiAgentRollout) -> tuple[torch.Tensor, torch.Tensor]:
        """(advantages, returns) [T, E, A] by GAE per agent (:func:`rlstash.agents.gae.gae`):
        the next value is V(row t + 1), or where the episode ended at t the final
        observation's value the collector stored (0 for terminated agents: no bootstrap; no
        bootstrap at any episode end with ``bootstrap_truncated=False``)."""
        T, E, A = rollout.steps, rollout.num_envs, rollout.n_agents
        v = self.values(rollout.obs, rollout.state)  # [T + 1, E, A]
        next_v = torch.where(rollout.cont, v[1:], rollout.final_value)
        terminated = rollout.terminated
        if not self.config.bootstrap_truncated:  # every episode end is terminal
            terminated = terminated | ~rollout.cont
        flat = lambda x: x.reshape(T, E * A)  # noqa: E731
        adv, ret = gae(flat(rollout.reward), flat(v[:T]), flat(next_v), flat(terminated),
                       flat(rollout.cont), self.config.gamma, self.config.gae_lambda)  # fmt: skip
        return adv.reshape(T, E, A), ret.reshape(T, E, A)

    def update(self, rollout: MultiAgentRollout) -> dict[str, torch.Tensor]:
        """``n_epochs`` passes of shuffled minibatches of env steps over ``rollout``; returns the
        last pass's mean metrics (0-dim tensors on the device)."""
        adv, ret = self.advantages(rollout)
        rows = rollout.frames
        data = {
            "obs": rollout.obs[:-1], "action": rollout.action, "logp": rollout.logp,
            "advantages": adv, "returns": ret, "mask": rollout.mask,
        }  # fmt: skip
        if rollout.state is not None:
            data["state"] = rollout.state[:-1]
        if rollout.action_mask is not None:
            data["action_mask"] = rollout.action_mask
        data = {k: v.reshape(rows, *v.shape[2:]) for k, v in data.items()}  # [T * E, ...]
        return self.learn(data)

    def learn(self, data: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``n_epochs`` passes of shuffled minibatches over prepared rows (fields [N, A, ...]
        as :meth:`losses` takes them); returns the last pass's mean metrics."""
        cfg = self.config
        rows = next(iter(data.values())).shape[0]
        perms = [torch.randperm(rows, generator=self.gen, device=self.device)
                 for _ in range(cfg.n_epochs)]  # fmt: skip
        stats: list[torch.Tensor] = []
        for perm in perms:
            shuffled = {k: v[perm] for k, v in data.items()}  # one gather per field and pass
            stats = [self._minibatch({k: v[i : i + cfg.minibatch_size] for k, v in shuffled.items()})
                     for i in range(0, rows, cfg.minibatch_size)]  # fmt: skip
        self.updates += 1
        return dict(zip(METRICS, torch.stack(stats).mean(0).unbind()))

    def _minibatch(self, mb: dict[str, torch.Tensor]) -> torch.Tensor:
        """One gradient step of actor and critic; the METRICS as one [6] tensor."""
        if self._compile_now():
            if self._step_fn is None:
                key = lambda: tuple(vars(self.config).values())  # noqa: E731
                self._step_fn = CompiledStep(self._step, self.compile_timer, key)
            return self._step_fn(mb)
        start = time.perf_counter()
        written = self.written_grad()
        if written is not None:
            row = written.step(mb)
            self.eager_update_s += time.perf_counter() - start
            return row
        cfg = self.config
        out = self.losses(mb)
        self.actor_opt.flat.zero_grad()
        self.critic_opt.flat.zero_grad()
        (out["policy_loss"] + out["value_loss"]).backward()
        a_norm = self.actor_opt.fused_step(cfg.max_grad_norm)
        c_norm = self.critic_opt.fused_step(cfg.max_grad_norm)
        row = torch.stack([out["policy_loss"].detach(), out["value_loss"].detach(),
                           out["approx_kl"], out["clip_fraction"], a_norm, c_norm])  # fmt: skip
        self.eager_update_s += time.perf_counter() - start
        return row

    def _compile_now(self) -> bool:
        """``compile`` true, or 'auto' once eager steps took ``compile_after_s`` seconds."""
        mode = self.config.compile
        if mode != "auto":
            return bool(mode)
        if self.device.type == "cpu" and self.written_grad() is not None:
            return False  # the written gradient outruns the compiled step on CPU
        if not self._compiling and self.eager_update_s >= self.compile_after_s:
            self._compiling = True
        return self._compiling

    def _step(self, mb: dict[str, torch.Tensor]) -> torch.Tensor:
        """The eager step as one function of tensors (compiled): :meth:`losses` with the
        networks' weights read from the two flat vectors, the gradient of policy + value loss
        with respect to both by ``torch.func``, then clipping and Adam in place."""
        fn, cfg = self.functional, self.config

        def loss_of(va: torch.Tensor, vc: torch.Tensor) -> tuple[torch.Tensor, Any]:
            swap = {**fn.params("actor", va), **fn.params("critic", vc)}
            out = torch.func.functional_call(
                fn.root, swap, (self.losses, mb), strict=False, tie_weights=False
            )
            return out["policy_loss"] + out["value_loss"], out

        va, vc = self.actor_opt.flat.param.detach(), self.critic_opt.flat.param.detach()
        (ga, gc), out = torch.func.grad(loss_of, argnums=(0, 1), has_aux=True)(va, vc)
        a_norm = self.actor_opt.apply(ga, cfg.max_grad_norm)
        c_norm = self.critic_opt.apply(gc, cfg.max_grad_norm)
        return torch.stack([out["policy_loss"], out["value_loss"], out["approx_kl"],
                            out["clip_fraction"], a_norm, c_norm]).detach()  # fmt: skip

    def check_finite(self, metrics: Mapping[str, Any] | None = None, params: bool = False) -> None:
        """Raise :class:`~rlstash.finite.NonFiniteError` when a loss metric (:data:`METRICS`) of
        the latest update (or, with ``params``, a weight) is NaN or +-inf (one host read)."""
        from rlstash.finite import raise_unless_finite

        ts = [v for k, v in (metrics or {}).items() if k in METRICS and isinstance(v, torch.Tensor)]
        if params:
            ts += [self.actor_opt.flat.param, self.critic_opt.flat.param]
        raise_unless_finite(self.algo, self.updates, ts)

    # --- checkpoints ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Networks, optimizers and the sampling generator's state."""
        return {
            "actor": self.actor.state_dict(), "critic": self.critic.state_dict(),
            "actor_opt": self.actor_opt.state_dict(), "critic_opt": self.critic_opt.state_dict(),
            "gen": self.gen.get_state(), "updates": self.updates,
        }  # fmt: skip

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load what :meth:`state_dict` wrote (same sizes and settings)."""
        self.actor.load_state_dict(state["actor"])
        self.critic.load_state_dict(state["critic"])
        self.actor_opt.load_state_dict(state["actor_opt"])
        self.critic_opt.load_state_dict(state["critic_opt"])
        self._step_fn = None  # it read the old optimizer state tensors: rebuild
        self.gen.set_state(state["gen"])
        self.updates = int(state["updates"])


def build_agent(
    sizes: tuple[Any, ...], act_space: Any, config: Any, device: torch.device | str
) -> MAPPO:
    """``rlstash train``'s builder (:mod:`rlstash.train.algos`): ``sizes`` = (n_agents, obs_dim, state_dim or None)."""
    n_agents, obs_dim, state_dim = sizes
    if isinstance(act_space, spaces.Discrete):
        return MAPPO(n_agents, obs_dim, n_actions=int(act_space.n), state_dim=state_dim,
                     config=config, device=device)  # fmt: skip
    bounds = (act_space.low, act_space.high)
    return MAPPO(n_agents, obs_dim, bounds=bounds, state_dim=state_dim, config=config,
                 device=device)  # fmt: skip


math_log_2pi = 1.8378770664093453  # log(2 pi)


@dataclass
class IPPOConfig(MAPPOConfig):
    """IPPO: MAPPO's settings with a per-agent critic over its own observation."""

    centralised: bool = hp(False, "Critic over the global state (MAPPO); False: own obs (IPPO).")
