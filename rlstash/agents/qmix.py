"""QMIX and VDN (Rashid et al. 2018; Sunehag et al. 2018): value decomposition for a team of
agents with discrete actions, learned off-policy from a multi-agent stream
(:mod:`rlstash.storage.stream_agents`: batches [B, A, ...]).

::

    Q_a(o_a, .)  = Q(o_a [, onehot(a)])        one network shared by all agents (default, with
                                               an agent id) or one per agent (share_params False)
    q_a          = m_a Q_a(o_a, u_a)           m_a: the agent acted (mask); absent agents count 0
    Q_tot        = mix(q, g)                   VDN: sum_a q_a; QMIX: a monotonic hypernetwork
                                               over g (:mod:`rlstash.agents.mixers`)
    a*_a         = argmax_{u available} Q_a(o'_a, u)                       (online net)
    y            = r + d (1 - terminated) mix'(m'_a Q'_a(o'_a, a*_a), g')  (target nets)
    L            = sum_b v_b (Q_tot - y)^2 / sum_b v_b,   v_b = any_a m_a  (l2, BenchMARL's)

``g`` is the env's global state, or the concatenation of every agent's observation where it has
none. ``r`` is the team reward: ``team_reward="mean"`` (default, BenchMARL's: the mean of the
rewards of the agents that acted, which is the env's shared reward when it shares one) or
``"sum"``. ``d`` is the batch's ``discount`` (gamma^n). ``m'`` is the next step's mask: an agent
done early adds nothing to the next value. The targets move by Polyak averaging with ``tau``
after every update (BenchMARL: soft updates, tau 0.005). Acting is epsilon-greedy per agent over
its available actions; epsilon decays linearly from 0.8 to 0.01 over the first third of the
run's env steps (BenchMARL's ``exploration_eps_init/end`` and ``exploration_anneal_frames``).

The update is DQN's machinery (:mod:`rlstash.agents.compiled`): one fused-Adam flat vector over
the Q network and the mixer, ``compile`` ('auto': compiled once eager updates took
``compile_after_s`` seconds) runs the whole step (target, loss, gradient by ``torch.func``,
clipping, Adam, Polyak) as one graph; no host read in either path (metrics stay 0-dim tensors
on the device until logged).
"""

from __future__ import annotations

import copy
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
    check_positive,
    compile_after_s,
    hp,
    seeded_init,
)
from rlstash.agents.compiled import CompiledStep, FlatAdam, Functional, lerp_, polyak_pairs
from rlstash.agents.marl_nets import AgentMLP, with_agent_id
from rlstash.agents.mixers import QMixer, VDNMixer
from rlstash.agents.schedules import epsilon_schedule
from rlstash.settings import SettingError, check_types
from rlstash.storage.stream_agents import ACTION_MASK, MASK, STATE, unpack_bits

METRICS = ("loss", "q_tot_mean", "target_mean", "grad_norm")
MIXERS = ("qmix", "vdn")
TEAM_REWARDS = ("mean", "sum")


@dataclass
class QMIXConfig(ConfigMixin):
    """QMIX settings: BenchMARL's (``conf/algorithm/qmix.yaml``: mixing_embed_dim 32, l2 loss,
    delayed (target) values, shared parameters; ``conf/experiment/base_experiment.yaml``: lr
    5e-5, Adam eps 1e-6, gradient norm clip 5, gamma 0.99, soft target updates tau 0.005,
    epsilon 0.8 -> 0.01 over a third of the run, 10 envs; ``conf/model/layers/mlp.yaml``:
    [256, 256] tanh)."""

    mixer: str = hp("qmix", "'qmix' (monotonic hypernetwork) or 'vdn' (sum of agent Qs).")
    learning_rate: float = hp(5e-5, "Adam learning rate (Q network and mixer).")
    adam_eps: float = hp(1e-6, "Adam epsilon.")
    num_envs: int = hp(10, "Envs collected from in parallel (the stream's lanes).")
    gamma: float = hp(0.99, "Discount; a batch's 'discount' (gamma^n) overrides it.")
    tau: float = hp(0.005, "Polyak weight of the target networks after every update.")
    max_grad_norm: float = hp(5.0, "Clip the gradient's global L2 norm to this.")
    net_arch: tuple[int, ...] = hp((256, 256), "Hidden layers of the agent Q network.")
    activation: str = hp("tanh", "Hidden activation: tanh or relu.")
    share_params: bool = hp(True, "One Q network for all agents (False: one per agent).")
    agent_id: bool = hp(True, "A shared Q network takes a one-hot agent id input.")
    mixing_embed_dim: int = hp(32, "QMIX mixer width.")
    team_reward: str = hp(
        "mean", "'mean' of the acting agents' rewards (the shared reward; BenchMARL) or 'sum'."
    )
    exploration_initial_eps: float = hp(0.8, "Epsilon at step 0.")
    exploration_final_eps: float = hp(0.01, "Epsilon after the decay.")
    exploration_fraction: float = hp(1 / 3, "Fraction of total_steps over which epsilon decays.")
    total_steps: int = hp(3_000_000, "Env steps of the run (the epsilon schedule's horizon).")
    seed: int = hp(0, "Seed of the network init and of exploration.")
    compile: bool | str = hp(COMPILE_DEFAULT, COMPILE_HELP)

    def __post_init__(self) -> None:
        self.net_arch = tuple(self.net_arch)
        check_types(self)
        check_compile(self)
        for name, value, allowed in (("mixer", self.mixer, MIXERS),
                                     ("team_reward", self.team_reward, TEAM_REWARDS),
                                     ("activation", self.activation, ("tanh", "relu"))):  # fmt: skip
            if value not in allowed:
                raise SettingError(name, f"one of {allowed}", value, f"e.g. {name}={allowed[0]}")
        check_positive(
            learning_rate=self.learning_rate, adam_eps=self.adam_eps, num_envs=self.num_envs,
            max_grad_norm=self.max_grad_norm, mixing_embed_dim=self.mixing_embed_dim,
            total_steps=self.total_steps,
        )  # fmt: skip
        check_fractions(gamma=self.gamma)
        if not 0.0 < self.tau <= 1.0:
            raise SettingError("tau", "a value in (0, 1]", self.tau, "e.g. tau=0.005")
        epsilon_schedule(self.exploration_initial_eps, self.exploration_final_eps,
                         self.exploration_fraction, self.total_steps)  # fmt: skip


@dataclass
class VDNConfig(QMIXConfig):
    """VDN: QMIX's settings with the sum mixer (BenchMARL's ``conf/algorithm/vdn.yaml``)."""

    mixer: str = hp("vdn", "'qmix' (monotonic hypernetwork) or 'vdn' (sum of agent Qs).")


class QMIX:
    """QMIX or VDN (``config.mixer``) for ``n_agents`` agents with observations of ``obs_dim``
    floats and ``n_actions`` discrete actions each; ``state_dim`` when the env has a global
    state (module docstring)."""

    def __init__(
        self,
        n_agents: int,
        obs_dim: int,
        n_actions: int,
        state_dim: int | None = None,
        config: QMIXConfig | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        cfg = self.config = config if config is not None else QMIXConfig()
        self.n_agents, self.obs_dim, self.n_actions = n_agents, obs_dim, n_actions
        self.state_dim, self.device = state_dim, torch.device(device)
        self.algo = cfg.mixer
        A = n_agents
        ids = A if (cfg.share_params and cfg.agent_id) else 0
        with seeded_init(cfg.seed):
            q = AgentMLP(obs_dim + ids, cfg.net_arch, n_actions,
                         None if cfg.share_params else A, cfg.activation)  # fmt: skip
            g_dim = state_dim or A * obs_dim
            mixer = QMixer(A, g_dim, cfg.mixing_embed_dim) if cfg.mixer == "qmix" else VDNMixer()
        q.to(self.device)
        mixer.to(self.device)
        self.nets = torch.nn.ModuleDict({
            "q": q, "mixer": mixer,
            "q_target": copy.deepcopy(q).requires_grad_(False),
            "mixer_target": copy.deepcopy(mixer).requires_grad_(False),
        })  # fmt: skip
        self.opt = FlatAdam([q, mixer], cfg.learning_rate, cfg.adam_eps)
        self.functional = Functional(dict(self.nets), {"q": self.opt})
        self.tau_now = torch.tensor(cfg.tau, device=self.device)
        self.gen = torch.Generator(device=self.device)
        self.gen.manual_seed(cfg.seed)
        self.schedule = epsilon_schedule(cfg.exploration_initial_eps, cfg.exploration_final_eps,
                                         cfg.exploration_fraction, cfg.total_steps)  # fmt: skip
        self.updates = self.env_steps = 0
        self.compile_timer = [0.0]
        self.eager_update_s = 0.0
        self.compile_after_s = compile_after_s()
        self._compiling = False
        self._step_fn: CompiledStep | None = None
        self._pairs = self._target_pairs()

    @property
    def compile_seconds(self) -> float:
        """Wall seconds the compiled step's first call took (0 without ``compile``)."""
        return self.compile_timer[0]

    @property
    def epsilon(self) -> float:
        return self.schedule(self.env_steps)

    def _target_pairs(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        targets, sources = polyak_pairs(self.functional, "q", "q_target", "q")
        if self.config.mixer == "qmix":
            t, s = polyak_pairs(self.functional, "q", "mixer_target", "mixer")
            targets, sources = targets + t, sources + s
        return targets, sources

    # --- values --------------------------------------------------------------------------

    def q_values(self, net: torch.nn.Module, obs: torch.Tensor) -> torch.Tensor:
        """Q [..., A, n] of observations [..., A, D] by ``net`` (online or target)."""
        cfg = self.config
        return net(with_agent_id(obs) if cfg.share_params and cfg.agent_id else obs)

    @staticmethod
    def mixer_input(obs: torch.Tensor, state: torch.Tensor | None) -> torch.Tensor:
        """g: the global state [..., S], or every agent's observation concatenated [..., A*D]."""
        return state if state is not None else obs.flatten(-2)

    def team_reward(self, reward: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The team reward [B] of per-agent rewards [B, A] of the agents that acted (``mask``)."""
        r = torch.where(mask, reward, 0.0).sum(-1)
        if self.config.team_reward == "sum":
            return r
        return r / mask.sum(-1).clamp_min(1)

    @torch.no_grad()
    def td_target(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """y [B] (module docstring): double Q, the online net picks, the target nets value."""
        nets, nobs = self.nets, batch["next_obs"]
        q_next = self.q_values(nets["q"], nobs)  # [B, A, n]
        if "next_" + ACTION_MASK in batch:
            avail = unpack_bits(batch["next_" + ACTION_MASK], self.n_actions)  # [B, A, n]
            q_next = q_next.masked_fill(~avail, -torch.inf)
        best = q_next.argmax(-1, keepdim=True)  # [B, A, 1]
        q_target = self.q_values(nets["q_target"], nobs).gather(-1, best).squeeze(-1)  # [B, A]
        q_target = torch.where(batch["next_" + MASK], q_target, 0.0)
        g = self.mixer_input(nobs, batch.get("next_" + STATE))
        next_tot = torch.where(batch["terminated"], 0.0, nets["mixer_target"](q_target, g))  # [B]
        r = self.team_reward(batch["reward"], batch[MASK])  # [B]
        return r + batch.get("discount", self.config.gamma) * next_tot

    def loss(
        self, batch: Mapping[str, torch.Tensor], y: torch.Tensor
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """(L, (Q_tot [B], valid rows [B])) for the targets ``y`` [B] (module docstring):
        rows of agents with mask False add nothing (``where``: their data may be anything)."""
        m = batch[MASK]  # [B, A]
        q = self.q_values(self.nets["q"], batch["obs"])  # [B, A, n]
        chosen = q.gather(-1, batch["action"].unsqueeze(-1)).squeeze(-1)  # [B, A]
        chosen = torch.where(m, chosen, 0.0)
        q_tot = self.nets["mixer"](chosen, self.mixer_input(batch["obs"], batch.get(STATE)))
        valid = m.any(-1)  # [B]: some agent acted
        err = torch.where(valid, q_tot - y, 0.0)
        return err.square().sum() / valid.sum().clamp_min(1), (q_tot, valid)

    # --- acting ----------------------------------------------------------------------------

    @torch.no_grad()
    def act(
        self, obs: torch.Tensor, action_mask: torch.Tensor | None = None,
        deterministic: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, None]:  # fmt: skip
        """(action, the same action for the env, None) [E, A] int64 for observations
        [E, A, D]: greedy over the available actions (``action_mask`` [E, A, n] bool), or
        epsilon-greedy per agent (the multi-agent collectors' acting contract, as MAPPO's)."""
        q = self.q_values(self.nets["q"], obs.to(self.device))  # [E, A, n]
        if action_mask is not None:
            action_mask = action_mask.to(self.device)
            q = q.masked_fill(~action_mask, -torch.inf)
        greedy = q.argmax(-1)  # [E, A]
        if deterministic:
            return greedy, greedy, None
        shape = greedy.shape
        explore = torch.rand(shape, generator=self.gen, device=self.device) < self.epsilon
        if action_mask is None:
            random = torch.randint(self.n_actions, shape, generator=self.gen, device=self.device)
        else:  # uniform over the available actions (all, where an agent has none)
            w = action_mask.reshape(-1, self.n_actions).float()
            w = torch.where(w.sum(-1, keepdim=True) > 0, w, 1.0)
            random = torch.multinomial(w, 1, generator=self.gen).reshape(shape)
        self.env_steps += shape[0]
        a = torch.where(explore, random, greedy)
        return a, a, None

    # --- learning --------------------------------------------------------------------------

    def update(self, batch: Mapping[str, torch.Tensor]) -> dict[str, Any]:
        """One gradient step on a sampled batch [B, A, ...]; then the targets move by tau.
        Returns :data:`METRICS` (0-dim tensors on the device) and ``epsilon``."""
        self._check_batch(batch)
        keys = ["obs", "next_obs", "action", "reward", "terminated", MASK, "next_" + MASK]
        keys += [k for k in ("discount", STATE, "next_" + STATE, "next_" + ACTION_MASK)
                 if k in batch]  # fmt: skip
        data = {k: batch[k] for k in keys}
        self.updates += 1
        if self._compile_now():
            if self._step_fn is None:
                key = lambda: tuple(vars(self.config).values())  # noqa: E731
                self._step_fn = CompiledStep(self._step, self.compile_timer, key)
            row = self._step_fn(data)
        else:
            start = time.perf_counter()
            y = self.td_target(data)
            loss, (q_tot, valid) = self.loss(data, y)
            norm = self.opt.step(loss, self.config.max_grad_norm)
            lerp_(*self._pairs, self.tau_now)
            row = self._metrics(loss, q_tot, y, valid, norm)
            self.eager_update_s += time.perf_counter() - start
        return {**dict(zip(METRICS, row.unbind())), "epsilon": self.epsilon}

    @staticmethod
    def _metrics(
        loss: torch.Tensor, q_tot: torch.Tensor, y: torch.Tensor, valid: torch.Tensor,
        norm: torch.Tensor | float,
    ) -> torch.Tensor:  # fmt: skip
        n = valid.sum().clamp_min(1)
        norm = torch.as_tensor(norm, dtype=loss.dtype, device=loss.device)
        return torch.stack([loss.detach(), (q_tot.detach() * valid).sum() / n,
                            (y * valid).sum() / n, norm]).detach()  # fmt: skip

    def _step(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The eager update as one function of tensors (compiled): the target with the
        weights read from the flat vector, the gradient by ``torch.func``, clipping, Adam and
        the Polyak lerp in place."""
        fn = self.functional
        y = fn.call(self.td_target, None, None, batch)
        grad, (loss, (q_tot, valid)) = fn.grad(self.loss, "q", batch, y)
        norm = self.opt.apply(grad, self.config.max_grad_norm)
        lerp_(*self._target_pairs(), self.tau_now)  # views made in the graph (as DQN's)
        return self._metrics(loss, q_tot, y, valid, norm)

    def _compile_now(self) -> bool:
        """``compile`` true, or 'auto' once eager updates took ``compile_after_s`` seconds."""
        mode = self.config.compile
        if mode != "auto":
            return bool(mode)
        if not self._compiling and self.eager_update_s >= self.compile_after_s:
            self._compiling = True
        return self._compiling

    def _check_batch(self, batch: Mapping[str, torch.Tensor]) -> None:
        """Shapes, dtypes and device of the fields the update reads (no data read)."""
        A, D = self.n_agents, self.obs_dim
        want = {"obs": ((A, D), torch.float32), "action": ((A,), torch.int64),
                "reward": ((A,), torch.float32), MASK: ((A,), torch.bool),
                "terminated": ((), torch.bool)}  # fmt: skip
        if self.state_dim is not None:
            want[STATE] = ((self.state_dim,), torch.float32)
        for k, (shape, dtype) in want.items():
            v = batch.get(k)
            if not isinstance(v, torch.Tensor) or tuple(v.shape[1:]) != shape or v.dtype != dtype:
                got = f"{v.dtype} {list(v.shape)}" if isinstance(v, torch.Tensor) else repr(v)
                raise ValueError(
                    f"batch[{k!r}]: expected {dtype} [B, {', '.join(map(str, shape))}] "
                    f"({self.algo}: a multi-agent stream's sample), got {got}"
                )
            if v.device.type != self.device.type:
                raise ValueError(
                    f"batch[{k!r}]: on {v.device}, the learner is on {self.device}; sample "
                    f"with device={str(self.device)!r}"
                )

    def check_finite(self, metrics: Mapping[str, Any] | None = None, params: bool = False) -> None:
        """Raise :class:`~rlstash.finite.NonFiniteError` when the latest loss (or, with
        ``params``, a weight) is NaN or +-inf (one host read)."""
        from rlstash.finite import raise_unless_finite

        ts = [v for k, v in (metrics or {}).items() if k in METRICS and isinstance(v, torch.Tensor)]
        if params:
            ts.append(self.opt.flat.param)
        raise_unless_finite(self.algo, self.updates, ts)

    # --- checkpoints -----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Networks (online and target), the optimizer, counters and the exploration RNG."""
        return {"nets": self.nets.state_dict(), "opt": self.opt.state_dict(),
                "gen": self.gen.get_state(), "updates": self.updates,
                "env_steps": self.env_steps}  # fmt: skip

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load what :meth:`state_dict` wrote (same sizes and settings)."""
        self.nets.load_state_dict(state["nets"])
        self.opt.load_state_dict(state["opt"])
        self._step_fn = None  # it read the old optimizer state tensors: rebuild
        self._pairs = self._target_pairs()
        self.gen.set_state(state["gen"])
        self.updates, self.env_steps = int(state["updates"]), int(state["env_steps"])


def build_agent(
    sizes: tuple[Any, ...], act_space: Any, config: Any, device: torch.device | str
) -> QMIX:
    """``rlstash train``'s builder (:mod:`rlstash.train.algos`): ``sizes`` = (n_agents,
    obs_dim, state_dim or None); ``act_space`` one agent's Discrete."""
    n_agents, obs_dim, state_dim = sizes
    if not isinstance(act_space, spaces.Discrete):
        raise ValueError(f"algo {config.mixer}: needs Discrete actions per agent, got {act_space}")
    return QMIX(n_agents, obs_dim, int(act_space.n), state_dim, config, device)


__all__ = ["METRICS", "QMIX", "QMIXConfig", "VDNConfig", "build_agent"]
