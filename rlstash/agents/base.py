"""The Agent protocol: how an agent acts, learns, and moves its weights between devices.

An agent is used like this (the training loop in :mod:`rlstash.train.loop` is this, plus timing)::

    agent = DQN(obs_shape=(4,), n_actions=2, config=DQNConfig(learning_rate=1e-3))
    action = agent.act(obs)                    # obs [N, *obs_shape] -> action [N] int64, no grad
    buffer.extend({...})                       # actions stored as int64 indices (never one-hot)
    batch = buffer.sample(64, device=agent.device)
    metrics = agent.update(batch)              # {"loss": 0-dim Tensor, ...} + "td_error" [B]
    if agent.updates % 100 == 0:
        print(read_metrics(metrics))           # {"loss": float, ...}: one device-to-host copy
        agent.check_finite(metrics)            # NonFiniteError once a loss was NaN/inf
    sampler.update_priorities(idx, metrics["td_error"])    # prioritized replay, if used
    collector.load_policy(agent.policy_state_dict())       # explicit weight transfer to actors
    save(agent.state_dict())                   # networks, optimizers, counters, RNG

The batch contract (what the replay buffer delivers, already on ``agent.device``):

=================== ============================ =============================================
field               shape, dtype                 meaning
=================== ============================ =============================================
obs, next_obs       [B, *obs_shape]              uint8 pixels stay uint8; nets scale them
action              [B] int64 / [B, act_dim] f32 discrete index / continuous env action
reward              [B] float32                  n-step: already sum_k gamma^k r_{t+k}
terminated          [B] bool                     true end of the MDP (not a time-limit cut)
discount            [B] float32, optional        gamma^n for n-step returns; absent = gamma
weight              [B] float32, optional        importance weights; multiply per-sample losses
action_mask,        [B, ceil(n/8)] uint8 packed  available actions at obs / next_obs
next_action_mask    or [B, n] bool, optional     (numpy.packbits bit order); absent = all
=================== ============================ =============================================

Host reads: ``update`` never reads a device tensor back to the host (no ``.item()``, no ``if
tensor``): its scalar metrics are 0-dim tensors on ``agent.device`` (or host floats computed
from counters, such as epsilon), read together by :func:`read_metrics` when the caller logs.
Value checks of a batch (action indices in range) read it back, so they run on the first update
and then every ``value_check_every`` updates (the shape, dtype and device checks run on every
update; they read no data).

Finite losses (invariant I10): each update records on the device, without a host read (inside
the compiled step where it is compiled), whether its losses were finite, and counts the updates
until the first that was not. ``check_finite`` reads that once (call it when logging; the
training loop does, and before every checkpoint, where ``params=True`` also checks every
weight and optimizer state) and raises :class:`~rlstash.finite.NonFiniteError` naming the
update. ``act`` refuses a non-finite observation where acting runs on the CPU (there the check
costs no device read; on a GPU the buffers' ``extend`` checks what the env returned).

Devices: ``agent.device`` is where the learner lives; ``agent.act_device`` is where ``act`` runs.
When they differ, ``act`` uses a copy of the policy networks on ``act_device`` that changes only
when weights are moved explicitly: ``agent.sync_actor()`` or ``load_policy_state_dict``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from rlstash import finite
from rlstash.agents import compiled, planning
from rlstash.agents.actions import ActionMask
from rlstash.agents.compiled import FlatAdam, Functional, lerp_, polyak_pairs
from rlstash.agents.loss_watch import LossWatch
from rlstash.core import Agent  # noqa: F401 (the protocol, re-exported: rlstash.agents.Agent)
from rlstash.device import resolve_device
from rlstash.settings import SettingError, check_types, setting

Batch = dict[str, torch.Tensor]
FINITE_OBS_DEVICES = ("cpu",)  # where ``act`` checks its observations: a host read is free there


# --- configuration -------------------------------------------------------------------------


def hp(default: Any, help: str) -> Any:
    """A learner setting: its default and the help text the CLI shows for ``--key``."""
    return setting(default, help)


class ConfigMixin:
    """Shared helpers of the agents' settings dataclasses (learner settings only: the loop's
    live in :class:`rlstash.train.config.TrainConfig`, per-env presets in
    :mod:`rlstash.presets`, registered with their algorithm in :mod:`rlstash.train.algos`)."""

    PRESETS: dict[str, dict[str, Any]] = {}  # env id -> settings of this config (optional)

    @classmethod
    def for_env(cls, env_id: str | None = None, **overrides: Any) -> Any:
        """Defaults, then the config's own preset of ``env_id`` (if any), then ``overrides``.
        (The training app's run presets, loop settings included: :mod:`rlstash.train.algos`.)"""
        values = dict(cls.PRESETS.get(env_id, {})) if env_id else {}
        values.update(overrides)
        return cls(**values)

    @classmethod
    def help(cls) -> dict[str, str]:
        """Field name -> help text (for the CLI and --config files)."""
        return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(cls)}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def agent_config(config: Any, config_cls: type) -> Any:
    """An agent's ``config`` argument: ``config_cls()`` when None, else it must be one
    (TypeError naming the field)."""
    cfg = config if config is not None else config_cls()
    if not isinstance(cfg, config_cls):
        raise TypeError(f"config: expected a {config_cls.__name__}, got {type(cfg).__name__}")
    return cfg


def check_count(name: str, value: Any) -> int:
    """``value`` as an int >= 1 (a bool is no count; ValueError naming ``name``)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
    return value


def check_positive(**values: Any) -> None:
    """Each value > 0 (SettingError naming its field): ``check_positive(learning_rate=lr)``."""
    for name, value in values.items():
        if not value > 0:
            raise SettingError(name, "> 0", value, "give a positive value")


def check_fractions(**values: float) -> None:
    """Each value in [0, 1] (a ValueError naming its field): ``check_fractions(gamma=g)``."""
    for name, value in values.items():
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name}: expected a value in [0, 1], got {value}")


def check_non_negative(**values: float) -> None:
    """Each value >= 0 (a ValueError naming its field): ``check_non_negative(ent_coef=c)``."""
    for name, value in values.items():
        if value < 0:
            raise ValueError(f"{name}: expected >= 0, got {value}")


def check_common(config: Any) -> None:
    """Validation shared by every agent config (SettingError, a ValueError or TypeError, naming
    the field): each field's type (:func:`rlstash.settings.check_types`), then the ranges of
    ``learning_rate``, ``gamma`` and ``net_arch``."""
    check_types(config)
    check_compile(config)
    check_positive(learning_rate=config.learning_rate)
    if not 0.0 < config.gamma <= 1.0:
        raise SettingError("gamma", "a discount in (0, 1]", config.gamma, "e.g. 0.99")
    if any(h <= 0 for h in config.net_arch):
        raise SettingError("net_arch", "positive layer widths", config.net_arch, "e.g. 64,64")


def check_target(tau: float, target_update_interval: int = 1) -> None:
    """A target network's Polyak coefficient in (0, 1] and its update interval >= 1."""
    if not 0.0 < tau <= 1.0:
        raise SettingError("tau", "a Polyak coefficient in (0, 1]", tau, "1 = hard copy")
    if target_update_interval < 1:
        raise SettingError(
            "target_update_interval", ">= 1 update", target_update_interval, "give 1 or more"
        )


# --- batches -------------------------------------------------------------------------------


def same_device(a: torch.device, b: torch.device) -> bool:
    """Same device type, and same index when both name one."""
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def check_batch(
    batch: Mapping[str, Any],
    *,
    obs_shape: tuple[int, ...],
    device: torch.device,
    n_actions: int | None = None,
    act_dim: int | None = None,
    values: bool = True,
) -> int:
    """Validate a batch against the contract above; returns B. Raises naming the field.

    Shapes, dtypes and devices are checked from metadata; ``values`` also checks the data
    (action indices in range), which reads the batch back to the host."""
    if not isinstance(batch, Mapping):
        raise TypeError(f"batch: expected a dict of tensors, got {type(batch).__name__}")
    for key in ("obs", "action", "reward", "next_obs", "terminated"):
        if key not in batch:
            raise ValueError(f"batch: missing field {key!r}; got fields {sorted(batch)}")
    for key, value in batch.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"batch[{key!r}]: expected a torch.Tensor, got {type(value).__name__}")
        if not same_device(value.device, device):
            raise ValueError(
                f"batch[{key!r}]: expected a tensor on the learner device {device}, got one on "
                f"{value.device}; sample with device={str(device)!r}"
            )
    bsz = batch["obs"].shape[0] if batch["obs"].dim() > 0 else 0
    want = {"obs": (bsz, *obs_shape), "next_obs": (bsz, *obs_shape), "reward": (bsz,)}
    want.update({"terminated": (bsz,), "discount": (bsz,), "weight": (bsz,)})
    want["action"] = (bsz,) if n_actions is not None else (bsz, act_dim)
    for key, shape in want.items():
        if key in batch and tuple(batch[key].shape) != shape:
            raise ValueError(
                f"batch[{key!r}]: expected shape {list(shape)}, got {list(batch[key].shape)}"
            )
    for key in ("reward", "discount", "weight"):
        if key in batch and not batch[key].is_floating_point():
            raise TypeError(f"batch[{key!r}]: expected a float tensor, got {batch[key].dtype}")
    if batch["terminated"].dtype != torch.bool:
        raise TypeError(
            f"batch['terminated']: expected torch.bool, got {batch['terminated'].dtype}"
        )
    action = batch["action"]
    if n_actions is not None:
        if action.dtype != torch.int64:
            raise TypeError(f"batch['action']: expected int64 action indices, got {action.dtype}")
        if values and bsz and bool(((action < 0) | (action >= n_actions)).any()):
            bad = action[(action < 0) | (action >= n_actions)][0].item()
            raise ValueError(f"batch['action']: expected indices in [0, {n_actions}), got {bad}")
        for key in ("action_mask", "next_action_mask"):
            if key in batch:
                ActionMask(batch[key], n_actions, name=f"batch[{key!r}]", rows=bsz)
    elif not action.is_floating_point():
        raise TypeError(f"batch['action']: expected float continuous actions, got {action.dtype}")
    return bsz


@contextlib.contextmanager
def seeded_init(seed: int) -> Iterator[None]:
    """Build networks with torch's CPU generator seeded by ``seed``, restoring it afterwards
    (nn.Module initializers draw from the global CPU generator; CUDA is never touched)."""
    with torch.random.fork_rng(devices=[]), planning.meta_if_dry_run():
        torch.default_generator.manual_seed(int(seed))
        yield


def read_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The scalar metrics of an ``update`` as host floats, in their order, with one
    device-to-host copy per device (call it when logging: every ~100 updates, not every one).
    Host numbers pass through; tensors of more than one element (``"td_error"``) are left out."""
    scalars: dict[torch.device, list[tuple[str, torch.Tensor]]] = {}
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, torch.Tensor):
            if value.numel() == 1:
                scalars.setdefault(value.device, []).append((key, value))
                out[key] = math.nan  # placeholder keeps the order; filled below
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = float(value)
    for items in scalars.values():
        host = torch.stack([v.detach().reshape(()).float() for _, v in items]).tolist()
        out.update(zip((key for key, _ in items), host))
    return out


COMPILE_DEFAULT: bool | str = "auto"
COMPILE_AFTER_S = 60.0  # compile="auto": seconds of eager updates before compiling
COMPILE_AFTER_ENV = "RLSTASH_COMPILE_AFTER"  # overrides COMPILE_AFTER_S ("inf": never)
# compile="auto" with a known horizon (``planned_updates``): compile only while the eager time
# still ahead is at least this many times COMPILE_AFTER_S. A compiled update saves ~30-55% of
# an eager one here (bench/updates.py), and compiling takes about COMPILE_AFTER_S, so a run
# with less eager time left than ~3x that would lose more to compiling than it gains.
COMPILE_REPAY = 3.0
COMPILE_HELP = (
    "torch.compile the whole update (forward, backward, Adam, targets) into one step; on CUDA "
    "also a CUDA graph, with the exploration step. true: from the first update; false: never; "
    "auto: once the run's eager updates have taken 60 s (env RLSTASH_COMPILE_AFTER) and, when "
    "the run's length is known, the eager time still ahead is >= 3x that, so a run too short "
    "to repay a compilation (~5-150 s) never compiles and a long one loses at most about "
    "that. The compile time is reported."
)


def check_compile(config: Any) -> None:
    """``config.compile``: true, false or 'auto' (SettingError naming the field)."""
    if not isinstance(config.compile, bool) and config.compile != "auto":
        raise SettingError("compile", "true, false or 'auto'", config.compile, "e.g. compile=auto")


def compile_after_s() -> float:
    """Seconds of eager updates after which ``compile='auto'`` compiles (``COMPILE_AFTER_S``,
    or the ``RLSTASH_COMPILE_AFTER`` environment variable: a number of seconds, or 'inf')."""
    text = os.environ.get(COMPILE_AFTER_ENV, "").strip()
    if not text:
        return COMPILE_AFTER_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value >= 0:
        raise SettingError(COMPILE_AFTER_ENV, "seconds >= 0 or 'inf'", text, "e.g. 60")
    return value


def flat_adam(agent: Any, *names: str, lr: float, eps: float = 1e-8) -> Any:
    """A builder of the :class:`FlatAdam` over ``agent.nets[name]`` for ``names`` (for
    ``AgentBase._setup``; called once the networks are on the learner's device)."""
    return lambda: FlatAdam([agent.nets[name] for name in names], lr, eps)


def make_generator(device: torch.device, seed: int) -> torch.Generator:
    """A seeded torch.Generator on ``device`` (CPU generators never touch CUDA)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed))
    return gen


# --- shared agent plumbing -----------------------------------------------------------------


class AgentBase(LossWatch):
    """Devices, the acting copy, counters, generators and (de)serialization for every agent
    (and the watch of its losses: :class:`~rlstash.agents.loss_watch.LossWatch`).

    A subclass builds its networks on CPU, then calls ``_setup(nets, policy_names, optims)``:
    ``nets`` holds every module with weights (targets included), ``policy_names`` the ones
    ``act`` needs, and ``optims`` maps a name to a function building an optimizer once the
    networks are on ``device``.
    """

    algo = "agent"
    config: Any  # the agent's settings dataclass
    n_actions: int | None = None  # discrete actions (None: continuous)
    value_check_every = 100  # updates between value checks of the batch (they read it back)
    # Tensor attributes the steps read (a Box's center/scale): kept on the learner's device and,
    # as ``act_<name>``, on the acting device, so no step copies them per call (a host-to-device
    # copy inside a captured CUDA graph fails; outside one it is a synchronous copy per call).
    constants: tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Each agent's constructor first counts its networks in a dry run and refuses what
        does not fit before allocating (:mod:`rlstash.agents.planning`)."""
        super().__init_subclass__(**kwargs)
        if "__init__" in cls.__dict__:
            cls.__init__ = planning.planned(cls.__dict__["__init__"])  # type: ignore[method-assign]

    def _values_due(self) -> bool:
        """Whether this update checks the batch's values: the first, then every
        ``value_check_every`` (each check reads the batch back to the host)."""
        return self.updates % self.value_check_every == 0

    def _init_devices(self, device: Any, act_device: Any, seed: int) -> None:
        self.device = resolve_device(device, "device", allow_none=False)
        self.act_device = resolve_device(act_device, "act_device") or self.device
        self.seed = int(seed)
        self.updates = 0  # gradient steps taken
        self.eager_update_s = 0.0  # wall seconds of eager updates (compile="auto" counts them)
        self.compile_after_s = compile_after_s()
        # updates the run will take in all (set by the trainer; None: unknown), for "auto"
        self.planned_updates: int | None = None
        self._auto_compiling = False  # "auto" decided to compile: it stays compiled
        self.env_steps = 0  # env steps acted (non-deterministic act calls), drives epsilon
        self.learn_gen = make_generator(self.device, self.seed)
        self.act_gen = make_generator(self.act_device, self.seed + 1)
        self._new_loss_watch()

    def _setup(
        self, nets: dict[str, nn.Module], policy_names: tuple[str, ...], groups: dict
    ) -> None:
        """``groups`` maps a name to a function building its :class:`FlatAdam` (a flat vector
        and fused Adam over some of ``nets``) once the networks are on ``device``."""
        planning.stop_if_dry_run(self, nets, policy_names)  # a dry run ends here: networks counted
        self.nets = {name: net.to(self.device) for name, net in nets.items()}
        self.policy_names = policy_names
        self._group_builders = groups
        self.compile_timer = [0.0]  # seconds spent compiling steps (config.compile)
        self._build_groups()
        self._build_actor()

    def _build_groups(self) -> None:
        """(Re)build the flat optimizer groups over the current networks; compiled steps are
        rebuilt on their next call (they read the groups' tensors)."""
        self.groups: dict[str, FlatAdam] = {n: build() for n, build in self._group_builders.items()}
        self.optims = {name: group.opt for name, group in self.groups.items()}
        self.functional = Functional(self.nets, self.groups)
        self.tau_now = torch.zeros((), device=self.device)  # a compiled step's Polyak weight
        self._steps: dict[str, Any] = {}

    def _polyak(self, key: str, target: str, source: str) -> None:
        """In a compiled step: net ``target`` <- lerp toward net ``source`` (of group ``key``)
        by ``tau_now`` (tau on the updates that move targets, else 0)."""
        lerp_(*polyak_pairs(self.functional, key, target, source), self.tau_now)

    @property
    def compile_seconds(self) -> float:
        """Wall seconds the compiled steps' first calls took (0 without ``compile``)."""
        return self.compile_timer[0]

    def _compiled(self, name: str, fn: Any, device: torch.device | None = None) -> Any:
        """The step ``fn`` compiled once (on its first call) and kept under ``name``; on CUDA
        also captured into a CUDA graph (:class:`rlstash.agents.compiled.GraphedStep`)."""
        step = self._steps.get(name)
        if step is None:
            device = device if device is not None else self.device
            step = self._steps[name] = compiled.compiled_step(
                fn, device, self.compile_timer, self._compile_key
            )
        return step

    def _compile_key(self) -> tuple:
        """What a compiled step reads as constants besides its inputs: the settings (a change
        means new guards, i.e. a recompilation, not a stale graph)."""
        return tuple(vars(self.config).values())

    def _compile_now(self) -> bool:
        """Whether this update runs compiled: ``config.compile`` true, or 'auto' once the eager
        updates have taken ``compile_after_s`` seconds (module ``COMPILE_HELP``)."""
        mode = self.config.compile
        if mode != "auto":
            return bool(mode)
        if not self._auto_compiling and self.eager_update_s >= self.compile_after_s:
            self._auto_compiling = self._worth_compiling()
        return self._auto_compiling

    def _worth_compiling(self) -> bool:
        """Whether the eager time still ahead (``planned_updates`` left at the mean eager
        update time so far) is >= ``COMPILE_REPAY`` x ``compile_after_s``; True when the
        horizon is unknown."""
        if self.planned_updates is None or self.updates == 0:
            return True
        left = max(0, self.planned_updates - self.updates)
        return left * self.eager_update_s / self.updates >= COMPILE_REPAY * self.compile_after_s

    @contextlib.contextmanager
    def _eager_timed(self) -> Iterator[None]:
        """Time an eager update (its host wall time: on CUDA, until its kernels are queued)."""
        start = time.perf_counter()
        yield
        self.eager_update_s += time.perf_counter() - start

    def _act_step(self, rows: int, fn: Any) -> Any:
        """The exploration step ``fn`` compiled and captured (one graph per batch size) when
        ``config.compile`` and ``act_device`` is CUDA, where launches dominate acting; None
        (act eagerly) elsewhere."""
        if not (self.act_device.type in compiled.GRAPH_DEVICES and self._compile_now()):
            return None
        return self._compiled(f"act-{rows}", fn, self.act_device)

    def _shares_actor(self) -> bool:
        """Whether ``act`` runs on the learner's networks (same device) or on a copy."""
        return same_device(self.act_device, self.device)

    def _build_actor(self) -> None:
        for name in self.constants:  # moved with the networks (to() and set-up call this)
            value = getattr(self, name)
            setattr(self, name, value.to(self.device))
            setattr(self, f"act_{name}", value.to(self.act_device))
        if self._shares_actor():
            self.actor = {name: self.nets[name] for name in self.policy_names}
        else:  # an explicit copy; it changes only through sync_actor / load_policy_state_dict
            self.actor = {
                n: copy.deepcopy(self.nets[n]).to(self.act_device) for n in self.policy_names
            }
            for net in self.actor.values():
                net.requires_grad_(False)

    def sync_actor(self) -> None:
        """Copy the learner's policy weights into the acting copy (no-op when they are shared)."""
        if any(self.actor[n] is not self.nets[n] for n in self.policy_names):
            self.load_policy_state_dict(self.policy_state_dict())

    def policy_state_dict(self) -> dict[str, Any]:
        nets = {name: self.nets[name].state_dict() for name in self.policy_names}
        return {"algo": self.algo, "nets": nets, "env_steps": self.env_steps}

    def load_policy_state_dict(self, state: dict[str, Any]) -> None:
        self._check_algo(state)
        for name in self.policy_names:
            self.actor[name].load_state_dict(state["nets"][name])
        self.env_steps = int(state.get("env_steps", self.env_steps))

    def state_dict(self) -> dict[str, Any]:
        return {
            "algo": self.algo,
            "config": self.config.to_dict(),
            "nets": {name: net.state_dict() for name, net in self.nets.items()},
            "optims": {name: opt.state_dict() for name, opt in self.optims.items()},
            "counters": {
                "updates": self.updates,
                "env_steps": self.env_steps,
                "eager_update_s": self.eager_update_s,
            },
            "rng": {
                "learn": (self.device.type, self.learn_gen.get_state()),
                "act": (self.act_device.type, self.act_gen.get_state()),
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._check_algo(state)
        for name, net in self.nets.items():
            net.load_state_dict(state["nets"][name])
        for name, group in self.groups.items():  # older per-parameter states are converted
            group.load_state_dict(state["optims"][name], f"state['optims'][{name!r}]")
        self._steps = {}  # new optimizer state tensors: graphs capture them anew
        self.updates = int(state["counters"]["updates"])
        self._new_loss_watch()  # counting from the loaded update on
        self.env_steps = int(state["counters"]["env_steps"])
        self.eager_update_s = float(state["counters"].get("eager_update_s", 0.0))
        for key, gen, dev in (
            ("learn", self.learn_gen, self.device),
            ("act", self.act_gen, self.act_device),
        ):
            dev_type, gen_state = state["rng"][key]
            if dev_type == dev.type:  # generator states do not transfer across device types
                gen.set_state(gen_state)
        self.sync_actor()

    def to(self, device: Any, act_device: Any | None = None) -> AgentBase:
        """Move the learner (networks and optimizer state) and the acting copy; returns self.

        Generators on a new device type are reseeded from the old generator (their states do
        not transfer across device types)."""
        device = resolve_device(device, "device", allow_none=False)
        act_device = resolve_device(act_device, "act_device") or device
        optim_states = {name: group.state_dict() for name, group in self.groups.items()}
        if device != self.device:
            seed = int(torch.randint(0, 2**62, (1,), generator=self.learn_gen, device=self.device))
            self.learn_gen = make_generator(device, seed)
        if act_device != self.act_device:
            seed = int(
                torch.randint(0, 2**62, (1,), generator=self.act_gen, device=self.act_device)
            )
            self.act_gen = make_generator(act_device, seed)
        # the new devices first: everything built below (tau_now, the groups) is built there
        self.device, self.act_device = device, act_device
        for net in self.nets.values():
            net.to(device)
        self._build_groups()  # a move breaks the flat vectors' sharing: re-seat them
        for name, group in self.groups.items():
            group.load_state_dict(optim_states[name])  # casts state to the params' new device
        self._loss_ok = self._loss_ok.to(device)  # the compiled steps are rebuilt (above)
        self._finite_updates = self._finite_updates.to(device)
        self._build_actor()
        return self

    def _prepare_mask(self, mask: Any, n: int, rows: int) -> ActionMask | None:
        """The ``mask`` argument of ``act`` on ``act_device``, validated (None: all available)."""
        if mask is None:
            return None
        if not isinstance(mask, torch.Tensor):
            raise TypeError(f"mask: expected a torch.Tensor or None, got {type(mask).__name__}")
        return ActionMask(mask.to(self.act_device), n, "mask", rows)

    @staticmethod
    def _check_available(best: torch.Tensor) -> None:
        """Raise if a row's best available score is -inf (its mask allows no action)."""
        empty = torch.isneginf(best)
        if bool(empty.any()):
            raise ValueError(f"mask: row {int(empty.nonzero()[0])} has no available action")

    def _check_algo(self, state: Mapping[str, Any]) -> None:
        if not isinstance(state, Mapping) or state.get("algo") != self.algo:
            got = state.get("algo") if isinstance(state, Mapping) else type(state).__name__
            raise ValueError(f"state: expected a state dict of a {self.algo} agent, got {got!r}")

    def _prepare_obs(self, obs: torch.Tensor, obs_shape: tuple[int, ...]) -> torch.Tensor:
        if not isinstance(obs, torch.Tensor):
            raise TypeError(
                f"obs: expected a torch.Tensor [N, *{obs_shape}], got {type(obs).__name__}"
            )
        if tuple(obs.shape[1:]) != tuple(obs_shape) or obs.dim() != len(obs_shape) + 1:
            raise ValueError(
                f"obs: expected shape [N, {', '.join(map(str, obs_shape))}], got {list(obs.shape)}"
            )
        obs = obs.to(self.act_device)
        if obs.is_floating_point() and obs.device.type in FINITE_OBS_DEVICES:  # I10
            finite.check_finite({"obs": obs}, envs=obs.shape[0], refused="no action was chosen",
                                fix="make the env return finite observations")  # fmt: skip
        return obs
