"""``rlstash plan``: the exact bytes a replay buffer needs per place, and whether it fits.

Its settings are :class:`PlanConfig`, whose replay fields are ``rlstash train``'s
(:class:`~rlstash.train.config.ReplayConfig`: ``--storage``, ``--buffer-size``,
``--buffer-device``, ``--compress*``, the same names, help and rules); the rest (the fields,
the sampler, the layout, the env and frame counts) are plan's own. Nothing is allocated.

With a multi-agent ``--algo`` (mappo, ippo) it plans the [T, E, A] rollout ``rlstash train``
would allocate for ``--env``, ``--envs`` and ``--env-kwargs`` (train's fields) on
``--buffer-device``: the rollout's own plan (:meth:`~rlstash.storage.marl_rollout.
MultiAgentRollout.plan`), refused with the rollout's own line when it does not fit. With an
off-policy one (qmix, vdn) it plans the multi-agent stream replay of ``--buffer-size`` slots
over ``--envs`` lanes (:func:`rlstash.train.marl_offpolicy.plan_stream`).
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlstash.cli.fields import parse_fields
from rlstash.cli.flags import add_config_flags, config_from_args, relabel
from rlstash.cli.main import describe
from rlstash.settings import SettingError, check_types
from rlstash.settings import setting as s
from rlstash.spec import Field, Spec
from rlstash.train.config import (
    TrainConfig,
    check_compression,
    check_replay_fields,
    flag,
    replay_field,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from rlstash.memory import MemoryPlan

RENAMED = {"buffer_size": ("--capacity",), "buffer_device": ("--device",)}
"""Plan's flag names before they became train's: still accepted, with a deprecation warning."""


@dataclass
class PlanConfig:
    """Settings of ``rlstash plan`` (its flags: ``rlstash plan --help``)."""

    field: tuple[str, ...] = s(
        (), "NAME=SHAPE:DTYPE, e.g. obs=4x84x84:uint8 (repeat)", repeat=True, metavar="SPEC"
    )
    env: str = s("", "Derive fields from a gymnasium env id, e.g. CartPole-v1.")
    buffer_size: int = replay_field("buffer_size", 1_000_000)
    storage: str = replay_field("storage")
    buffer_device: str = replay_field("buffer_device")
    path: str = s("", "Directory of a disk storage.")
    sampler: str = s(
        "uniform",
        "The buffer's sampler: its per-row state is counted (prioritized: ~19 B per row).",
        choices=("uniform", "prioritized", "sequence"),
    )
    layout: str = s(
        "naive",
        "naive: store the fields as given; stream: StreamStorage lanes (frames once, next obs "
        "rebuilt), its lane bookkeeping counted.",
        choices=("naive", "stream"),
    )
    num_envs: int = s(8, "Envs feeding the stream layout.", at_least=1)
    frame_stack: int = s(
        4, "Frames per observation (stream layout stores single frames).", at_least=1
    )
    compress: str = replay_field("compress")
    compress_budget: float = replay_field("compress_budget")
    compress_delta: bool = replay_field("compress_delta")
    algo: str = s(
        "",
        "A multi-agent algorithm (mappo, ippo): plan the [T, E, A] rollout rlstash train "
        "--algo ALGO --env ENV --envs N allocates (on --buffer-device) instead of a replay; "
        "qmix, vdn: their multi-agent stream replay of --buffer-size slots.",
    )
    envs: int | None = s(
        None, "With --algo: the envs of the rollout, as rlstash train --envs (default: the "
        "preset's; the rollout keeps its frames: rollout_steps = 6000 // envs).", at_least=1,
    )  # fmt: skip
    env_kwargs: str = dataclasses.field(
        default="", metadata=TrainConfig.__dataclass_fields__["env_kwargs"].metadata
    )

    def __post_init__(self) -> None:
        check_types(self)
        _check_algo(self)
        _plan_device(self.buffer_device)
        check_replay_fields(self)
        if self.storage == "tiered":
            raise SettingError(
                "storage", "ram or disk (plan one tier at a time)", "tiered",
                "plan the hot tier with --storage ram and the cold one with --storage disk",
            )  # fmt: skip
        if self.storage != "ram" and _plan_device(self.buffer_device) != "cpu":
            raise SettingError(
                "buffer_device", f"cpu: a {self.storage} storage lives on the CPU",
                self.buffer_device,
                "drop --buffer-device (batches go to a device when sampled) or use --storage ram",
            )  # fmt: skip
        if self.storage == "disk" and not self.path:
            raise SettingError(
                "path", "a directory with --storage disk", self.path, "e.g. --path runs/buffer"
            )
        if self.layout == "stream" and self.buffer_size < 2 * self.num_envs:
            raise SettingError(
                "buffer_size", f"at least 2 slots per env in the stream layout "
                f"({2 * self.num_envs} for {self.num_envs} envs)", self.buffer_size,
                "raise --buffer-size or lower --num-envs",
            )  # fmt: skip
        if self.field and self.env:
            raise ValueError("--field/--env: give either --field (repeatable) or --env, not both")


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``rlstash plan`` to the ``rlstash`` parser."""
    p = sub.add_parser(
        "plan",
        help="exact bytes a buffer needs per place, and whether it fits",
        **describe(
            "Print the exact bytes a replay buffer will take in RAM, on each GPU and on disk,\n"
            "field by field, and whether it fits what is free here. Nothing is allocated.",
            "rlstash plan --env CartPole-v1 --layout stream --num-envs 8 --buffer-size 100000",
            "concepts/#specs-and-plans",
        ),
    )
    add_config_flags(p, PlanConfig, renamed=RENAMED)
    p.set_defaults(func=cmd_plan)


def plan_config(args: argparse.Namespace | PlanConfig) -> PlanConfig:
    """The :class:`PlanConfig` of parsed ``rlstash plan`` flags (errors name the flag)."""
    return args if isinstance(args, PlanConfig) else config_from_args(PlanConfig, args)


def _env_spec(env_id: str, next_obs: bool) -> Spec:
    from rlstash.envs.registry import make

    try:
        env = make(env_id)
    except Exception as exc:  # noqa: BLE001 - gymnasium raises several kinds
        raise ValueError(f"--env: cannot make {env_id!r}: {exc}") from None
    try:
        return Spec.for_transitions(env.observation_space, env.action_space, next_obs=next_obs)
    finally:
        env.close()


_ATARI = {  # the default: an Atari-sized buffer (Nature DQN: 1M transitions of 4x84x84 frames)
    "obs": Field((4, 84, 84), "uint8"),
    "action": Field((), "int64"),
    "reward": Field((), "float32"),
    "terminated": Field((), "bool"),
    "truncated": Field((), "bool"),
    "next_obs": Field((4, 84, 84), "uint8"),
}


def _check_algo(cfg: PlanConfig) -> None:
    """``--algo`` names a multi-agent algorithm with its ``--env``; ``--envs`` and
    ``--env-kwargs`` come with it (SettingErrors naming the field)."""
    from rlstash.train import algos

    if not cfg.algo:
        for name, value in (("envs", cfg.envs), ("env_kwargs", cfg.env_kwargs)):
            if value:
                raise SettingError(
                    name, "a rollout's setting, given with --algo mappo|ippo", value,
                    "add --algo mappo (or ippo), or drop it (--num-envs: the stream layout's envs)",
                )  # fmt: skip
        return
    multi = sorted(n for n, a in algos.ALGOS.items() if a.store in ("multiagent", "marl_replay"))
    if cfg.algo not in multi:
        raise SettingError(
            "algo", f"a multi-agent algorithm ({', '.join(multi)}): plan plans its rollout",
            cfg.algo, "drop --algo to plan a replay buffer (--env, --field)",
        )  # fmt: skip
    if not cfg.env:
        raise SettingError(
            "env", f"the multi-agent env --algo {cfg.algo} trains", cfg.env,
            "e.g. --env vmas/navigation or --env pettingzoo:mpe2.simple_spread_v3",
        )  # fmt: skip
    if cfg.storage != "ram" or cfg.field:
        raise SettingError(
            "storage" if cfg.storage != "ram" else "field",
            f"none with --algo {cfg.algo}: its rollout lives in memory, its fields are the env's",
            cfg.storage if cfg.storage != "ram" else cfg.field, "drop it",
        )  # fmt: skip


def cmd_plan(args: argparse.Namespace) -> int:
    """Print the plan of ``rlstash plan``'s flags: exit 0 when it fits, 1 when not."""
    from rlstash.memory import InsufficientMemoryError

    if plan_config(args).algo:
        result, head, refuse = build_rollout_plan(args)
        print(head)
        print()
        print(result.format_table())
        if not result.fits:
            try:
                refuse()  # the rollout's own refusal, as rlstash train would print it
                result.check()
            except InsufficientMemoryError as exc:
                print(f"\ndoes not fit: {exc}")
        return 0 if result.fits else 1
    result, stream = build_plan(args)
    print(result.format_table())
    if stream:
        print()
        print(stream)
    if not result.fits:
        try:
            result.check()
        except InsufficientMemoryError as exc:
            print(f"\ndoes not fit: {exc}")
    return 0 if result.fits else 1


def build_rollout_plan(
    args: argparse.Namespace | PlanConfig,
) -> tuple[MemoryPlan, str, Callable[[], None]]:
    """(the memory plan of the multi-agent rollout of ``--algo``, ``--env``, ``--envs`` and
    ``--env-kwargs`` on ``--buffer-device``, a line naming its sizes, a call raising the
    rollout's refusal when it does not fit): :func:`rlstash.train.marl.plan_rollout`, the
    settings resolved as ``rlstash train`` resolves them. Nothing is allocated."""
    import functools

    import torch

    from rlstash.storage.marl_rollout import MultiAgentRollout
    from rlstash.train import algos, marl

    args = plan_config(args)
    device = torch.device(args.buffer_device)
    given = dict(algo=args.algo, env=args.env, env_kwargs=args.env_kwargs, device=str(device))
    if algos.ALGOS[args.algo].store == "marl_replay":
        return _stream_plan(args, given, device)
    try:
        cfg = TrainConfig(**given, envs=args.envs or 1)
        result, sizes = marl.plan_rollout(cfg, device)
    except SettingError as exc:
        raise ValueError(relabel(exc, PlanConfig)) from None
    state = "none" if sizes["state_dim"] is None else f"[T + 1, E, {sizes['state_dim']}]"
    if "groups" in sizes:  # several agent groups: a GroupedRollout
        return _grouped_head(args, result, sizes, state, device)
    T, E, A = sizes["steps"], sizes["num_envs"], sizes["n_agents"]
    head = (
        f"MultiAgentRollout of --algo {args.algo} on {args.env}: T={T} steps x E={E} envs x "
        f"A={A} agents; obs [T + 1, E, A, {sizes['obs_dim']}], state {state}, action "
        f"[T, E, A{''.join(f', {d}' for d in sizes['action_shape'])}], mask and flags "
        f"[T, E, A]. Rows are envs: each field below is one env's [T, A, ...]"
    )
    refuse = functools.partial(MultiAgentRollout.check_fits, result.fields, T, E, A, device)
    return result, head, refuse


def _stream_plan(
    args: PlanConfig, given: dict[str, Any], device: Any
) -> tuple[MemoryPlan, str, Callable[[], None]]:
    """:func:`build_rollout_plan` of an off-policy multi-agent ``--algo``: its stream replay."""
    from rlstash.train import marl_offpolicy

    try:
        cfg = TrainConfig(**given, envs=args.envs or 1, buffer_size=args.buffer_size)
        result, sizes = marl_offpolicy.plan_stream(cfg, device)
    except SettingError as exc:
        raise ValueError(relabel(exc, PlanConfig)) from None
    fields = ", ".join(f"{k} {f.describe()}" for k, f in sizes["spec"].items())
    head = (
        f"StreamStorage of --algo {args.algo} on {args.env}: {sizes['slots']:,} slots over "
        f"{sizes['num_envs']} envs (lanes), a slot: one env step of A={sizes['n_agents']} "
        f"agents ({fields}); next observations are rebuilt from the next slot. Rows are slots"
    )
    return result, head, result.check


def _grouped_head(
    args: PlanConfig, result: MemoryPlan, sizes: dict[str, Any], state: str, device: Any
) -> tuple[MemoryPlan, str, Callable[[], None]]:
    """:func:`build_rollout_plan`'s answer for an env of several agent groups."""
    import functools

    from rlstash.storage.marl_rollout import GroupedRollout

    T, E, groups = sizes["steps"], sizes["num_envs"], sizes["groups"]
    parts = "; ".join(
        f"{g}: A={s['n_agents']} agents, obs [T + 1, E, A, {s['obs_dim']}], action "
        f"[T, E, A{''.join(f', {d}' for d in s['action_shape'])}]"
        for g, s in groups.items()
    )
    head = (
        f"GroupedRollout of --algo {args.algo} on {args.env}: T={T} steps x E={E} envs, "
        f"{len(groups)} agent groups ({parts}); state {state}. Rows are envs: each field below "
        "is one env's <group>/<field>"
    )
    n = sum(s["n_agents"] for s in groups.values())
    refuse = functools.partial(GroupedRollout.check_fits, result.fields, T, E, n, device)
    return result, head, refuse


def build_plan(args: argparse.Namespace | PlanConfig) -> tuple[MemoryPlan, str]:
    """The memory plan of ``rlstash plan``'s settings (checked first; nothing is allocated)
    and, for the naive layout, the stream layout's figures beside it; an error names the
    flag."""
    args = plan_config(args)
    try:
        return _build_plan(args)
    except SettingError as exc:
        raise ValueError(relabel(exc, PlanConfig)) from None


def _build_plan(args: PlanConfig) -> tuple[MemoryPlan, str]:
    from rlstash.memory import plan

    if args.env:
        spec = _env_spec(args.env, next_obs=True)
    else:
        spec = parse_fields(args.field) if args.field else Spec(_ATARI)
    sampler = _plan_sampler(args.sampler)
    common = dict(
        storage=args.storage, device=args.buffer_device, path=args.path or None, sampler=sampler
    )
    comp = _plan_compression(args)  # train's rules: refused here as train would refuse it
    if args.layout == "naive":
        if comp is not None:
            raise ValueError("--compress: compressed frames need --layout stream")
        return plan(spec, args.buffer_size, **common), _stream_figures(spec, args)
    from rlstash.storage.stream import StreamStorage
    from rlstash.storage.stream_spec import slot_spec, transition_step

    step, k, stacked = transition_step(spec, args.frame_stack)
    if "action" not in step or not any(k == "obs" or k.startswith("obs/") for k in step):
        raise ValueError(
            f"--layout stream: needs fields 'obs' and 'action', got {list(spec)}; add them with "
            "--field or use --layout naive"
        )
    slots = args.buffer_size // args.num_envs * args.num_envs
    parts = StreamStorage.plan_bytes(step, slots, k, stacked, args.num_envs, comp)
    overhead = {"stream: lane bookkeeping": parts.pop("bookkeeping")}
    stored = slot_spec(step, k, stacked)
    if comp is None:
        return plan(stored, slots, overhead=overhead, **common), ""
    from rlstash.storage.frame_backing import compression_note

    packed = Spec({n: f for n, f in stored.items() if n in parts})
    overhead.update({f"frames: {n}": b for n, b in parts.items() if n not in packed})
    note = compression_note(stored, comp, args.num_envs, slots // args.num_envs)
    return plan(packed, slots, overhead=overhead, **common), note


def _plan_compression(args: argparse.Namespace | PlanConfig) -> Any:
    """The FrameCompression of ``--compress`` (None without it, or 'none'), checked by the
    rules of ``rlstash train --compress`` (:func:`rlstash.train.config.check_compression`:
    the same function), the budget against the plan's lanes; errors name the flag."""
    args = plan_config(args)
    lanes = args.buffer_size // args.num_envs if args.layout == "stream" else None
    try:
        return check_compression(
            args.compress, args.compress_budget, args.compress_delta, args.storage,
            args.buffer_device, lane_slots=lanes, row_frames=args.frame_stack + 1,
        )  # fmt: skip
    except SettingError as exc:
        raise ValueError(exc.text(flag(exc.name))) from None


def _plan_device(text: str) -> str:
    """``"cpu"`` or ``"cuda[:N]"``; anything else (``auto`` too: plan a place) is a
    ValueError naming ``--buffer-device``."""
    import torch

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError, TypeError):
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise ValueError(
            f"--buffer-device: expected cpu, cuda or cuda:N (rlstash storages live in RAM or on "
            f"an NVIDIA GPU), got {text!r}; e.g. --buffer-device cuda:0"
        )
    return device.type


def _plan_sampler(name: str) -> Any:
    from rlstash.sampler import PrioritizedSampler, SequenceSampler, UniformSampler

    if name == "prioritized":
        return PrioritizedSampler()
    if name == "sequence":
        return SequenceSampler(1)  # its per-row state does not depend on the window length
    return UniformSampler()


def _stream_figures(spec: Spec, args: PlanConfig) -> str:
    """The stream layout's bytes next to the naive (obs + next_obs) layout, when it applies."""
    from rlstash.diag.layouts import compare_layouts

    if "action" not in spec or not any(k == "obs" or k.startswith("obs/") for k in spec):
        return ""  # the stream layout needs an obs and an action field
    return compare_layouts(
        spec, args.buffer_size, num_envs=args.num_envs, frame_stack=args.frame_stack
    )
