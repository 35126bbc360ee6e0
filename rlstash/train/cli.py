"""The ``rlstash`` command: train | eval | verify | plan | doctor | bench.

Each subcommand is a thin function over the library; parsing stays here. Every error is one
line on stderr, ``rlstash <command>: error: <what>; <fix>``, exit 2, nothing written: parser
errors of every subcommand (:class:`Parser`, the class of every subparser too) and the
library's refusals (:func:`main`: ValueError, TypeError, MemoryError, ImportError and the
OSErrors of a bad path); a fault while running (a full disk: another OSError) is one line,
exit 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from rlstash.spec import Field, Spec, parse_dtype
from rlstash.train.flags import int_at_least

if TYPE_CHECKING:
    from rlstash.diag.memory import MemoryPlan


def parse_field(text: str) -> tuple[str, Field]:
    """``"obs=4x84x84:uint8"`` -> ("obs", Field((4, 84, 84), uint8)); ``"action=:int64"`` a scalar."""
    name, sep, rest = text.partition("=")
    shape_text, sep2, dtype_text = rest.rpartition(":")
    if not sep or not sep2 or not name or not dtype_text:
        raise ValueError(
            f"--field: expected NAME=SHAPE:DTYPE such as obs=4x84x84:uint8 or action=:int64, got {text!r}"
        )
    try:
        shape = tuple(int(s) for s in shape_text.split("x")) if shape_text else ()
    except ValueError:
        raise ValueError(
            f"--field {name}: shape must be integers joined by 'x' (4x84x84), got {shape_text!r}"
        ) from None
    if any(d < 1 for d in shape):
        raise ValueError(
            f"--field {name}: every dimension must be >= 1, got {shape_text!r}; e.g. 4x84x84, "
            f"or {name}=:{dtype_text} for a scalar"
        )
    try:
        dtype = parse_dtype(dtype_text)
    except TypeError as exc:
        raise ValueError(f"--field {name}: {exc}") from None
    return name, Field(shape, dtype)


def parse_fields(texts: Sequence[str]) -> Spec:
    """A spec from repeated ``--field`` values; a name given twice is an error."""
    fields: dict[str, Field] = {}
    given: dict[str, str] = {}
    for text in texts:
        name, f = parse_field(text)
        if name in fields:
            raise ValueError(
                f"--field {name}: given twice ({given[name]!r} and {text!r}); give one --field "
                "per name"
            )
        fields[name], given[name] = f, text
    return Spec(fields)


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


def cmd_plan(args: argparse.Namespace) -> int:
    result, stream = build_plan(args)
    print(result.format_table())
    if stream:
        print()
        print(stream)
    if not result.fits:
        from rlstash.diag.memory import InsufficientMemoryError

        try:
            result.check()
        except InsufficientMemoryError as exc:
            print(f"\ndoes not fit: {exc}")
    return 0 if result.fits else 1


def build_plan(args: argparse.Namespace) -> tuple[MemoryPlan, str]:
    """The memory plan of ``rlstash plan``'s settings (checked first; nothing is allocated)
    and, for the naive layout, the stream layout's figures beside it."""
    from rlstash.diag.memory import plan

    _check_plan_args(args)
    if args.field and args.env:
        raise ValueError("--field/--env: give either --field (repeatable) or --env, not both")
    if args.env:
        spec = _env_spec(args.env, next_obs=True)
    else:
        spec = parse_fields(args.field) if args.field else Spec(_ATARI)
    sampler = _plan_sampler(args.sampler)
    common = dict(storage=args.storage, device=args.device, path=args.path, sampler=sampler)
    comp = _plan_compression(args)  # train's rules: refused here as train would refuse it
    if args.layout == "naive":
        if comp is not None:
            raise ValueError("--compress: compressed frames need --layout stream")
        return plan(spec, args.capacity, **common), _stream_figures(spec, args)
    from rlstash.storage.stream import StreamStorage
    from rlstash.storage.stream_spec import slot_spec, transition_step

    step, k, stacked = transition_step(spec, args.frame_stack)
    if "action" not in step or not any(k == "obs" or k.startswith("obs/") for k in step):
        raise ValueError(
            f"--layout stream: needs fields 'obs' and 'action', got {list(spec)}; add them with "
            "--field or use --layout naive"
        )
    slots = args.capacity // args.num_envs * args.num_envs
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


def _plan_compression(args: argparse.Namespace) -> Any:
    """The FrameCompression of ``--compress`` (None without it, or 'none'), checked by the
    rules of ``rlstash train --compress`` (:func:`rlstash.train.config.check_compression`:
    the same function), the budget against the plan's lanes; errors name the flag."""
    from rlstash.settings import SettingError
    from rlstash.train.config import check_compression, flag

    lanes = args.capacity // args.num_envs if args.layout == "stream" else None
    try:
        return check_compression(
            args.compress or "none", args.compress_budget, args.compress_delta, args.storage,
            args.device, lane_slots=lanes, row_frames=args.frame_stack + 1,
            device_setting="device",
        )  # fmt: skip
    except SettingError as exc:
        raise ValueError(exc.text(flag(exc.name))) from None


def _check_plan_args(args: argparse.Namespace) -> None:
    """One-line errors naming the flag and the fix, before anything else happens (the counts
    are checked by their flags' type, :func:`rlstash.train.flags.int_at_least`)."""
    device = _plan_device(args.device)
    if args.storage != "ram" and device != "cpu":
        raise ValueError(
            f"--device: a {args.storage} storage lives on the CPU, got {args.device!r}; drop "
            "--device (batches go to a device when sampled) or use --storage ram"
        )
    if args.storage == "disk" and args.path is None:
        raise ValueError("--path: --storage disk needs a directory, e.g. --path runs/buffer")
    if args.layout == "stream" and args.capacity < 2 * args.num_envs:
        raise ValueError(
            f"--capacity: the stream layout needs at least 2 slots per env, got {args.capacity} "
            f"for {args.num_envs} envs; raise --capacity or lower --num-envs"
        )


def _plan_device(text: str) -> str:
    """``"cpu"`` or ``"cuda[:N]"``; anything else is a ValueError naming ``--device``."""
    import torch

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError, TypeError):
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise ValueError(
            f"--device: expected cpu, cuda or cuda:N (rlstash storages live in RAM or on an "
            f"NVIDIA GPU), got {text!r}; e.g. --device cuda:0"
        )
    return device.type


def _plan_sampler(name: str) -> Any:
    from rlstash.sampler import PrioritizedSampler, SequenceSampler, UniformSampler

    if name == "prioritized":
        return PrioritizedSampler()
    if name == "sequence":
        return SequenceSampler(1)  # its per-row state does not depend on the window length
    return UniformSampler()


def _stream_figures(spec: Spec, args: argparse.Namespace) -> str:
    """The stream layout's bytes next to the naive (obs + next_obs) layout, when it applies."""
    from rlstash.diag.layouts import compare_layouts

    if "action" not in spec or not any(k == "obs" or k.startswith("obs/") for k in spec):
        return ""  # the stream layout needs an obs and an action field
    return compare_layouts(
        spec, args.capacity, num_envs=args.num_envs, frame_stack=args.frame_stack
    )


def cmd_doctor(args: argparse.Namespace) -> int:
    from rlstash.diag.doctor import diagnose

    report = diagnose(args.run_dir)
    print(report.format())
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="rlstash", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    sp = sub.add_parser("plan", help="exact bytes a buffer needs per place, and whether it fits")
    sp.add_argument(
        "--field",
        action="append",
        default=[],
        help="NAME=SHAPE:DTYPE, e.g. obs=4x84x84:uint8 (repeat)",
    )
    sp.add_argument("--env", help="derive fields from a gymnasium env id, e.g. CartPole-v1")
    sp.add_argument(
        "--capacity", type=int_at_least(1), default=1_000_000, help="rows (transitions) to hold"
    )
    sp.add_argument(
        "--storage", default="ram", choices=["ram", "disk", "shm"], help="where rows live"
    )
    sp.add_argument("--device", default="cpu", help="device of a RAM storage (cpu, cuda:0, ...)")
    sp.add_argument("--path", default=None, help="directory of a disk storage")
    sp.add_argument(
        "--sampler",
        default="uniform",
        choices=["uniform", "prioritized", "sequence"],
        help="the buffer's sampler: its per-row state is counted (prioritized: ~19 B per row)",
    )
    sp.add_argument(
        "--layout",
        default="naive",
        choices=["naive", "stream"],
        help="naive: store the fields as given; stream: StreamStorage lanes (frames once, "
        "next obs rebuilt), its lane bookkeeping counted",
    )
    sp.add_argument(
        "--num-envs", type=int_at_least(1), default=8, help="envs feeding the stream layout"
    )
    sp.add_argument(
        "--frame-stack",
        type=int_at_least(1),
        default=4,
        help="frames per observation (stream layout stores single frames)",
    )
    sp.add_argument(
        "--compress",
        default=None,
        help="stream layout: compress pixel frames with this codec (none, lz4 or zstd; the "
        "extra 'compress'; as rlstash train --compress); the arena is sized by --compress-budget",
    )
    sp.add_argument(
        "--compress-budget",
        type=float,
        default=0.5,
        help="planned stored bytes per frame as a fraction of a raw frame (Atari frames "
        "take ~0.04 with lz4; frames that compress worse keep fewer transitions, never more bytes)",
    )
    sp.add_argument(
        "--compress-delta",
        action="store_true",
        help="code each frame against the previous frame of its env (smaller, slower reads)",
    )
    sp.set_defaults(func=cmd_plan)

    sd = sub.add_parser("doctor", help="what matters for RL runs on this machine")
    sd.add_argument("--run-dir", default="runs", help="where runs and disk buffers go")
    sd.set_defaults(func=cmd_doctor)

    _add_optional_commands(sub)
    return p


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line, ``<prog>: error: <message>; see <prog>
    --help``, exit 2 (argparse prints its usage and then the error). ``add_subparsers`` makes
    the subcommands' parsers of this class too, so every subcommand registered on the
    ``rlstash`` parser gets it; arguments no parser knew name the subcommand they came with."""

    def error(self, message: str) -> NoReturn:
        self.exit(
            2, one_line(self.prog, f"{message.removeprefix('argument ')}; see {self.prog} --help")
        )

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            command = getattr(ns, "command", None)
            prog = f"{self.prog} {command}" if command else self.prog
            self.exit(
                2, one_line(prog, f"unrecognized arguments: {' '.join(extras)}; see {prog} --help")
            )
        return ns


def one_line(prog: str, message: str) -> str:
    """``"<prog>: error: <message>"`` on one line (line breaks in ``message`` become spaces)."""
    return f"{prog}: error: {' '.join(str(message).split())}\n"


def _add_optional_commands(sub: argparse._SubParsersAction) -> None:
    """train / eval / bench live in their own modules; register them when present."""
    for module in (
        "rlstash.train.cli_train",
        "rlstash.train.cli_bench",
        "rlstash.train.cli_verify",
    ):
        try:
            mod = __import__(module, fromlist=["register"])
        except ImportError:
            continue
        mod.register(sub)


BAD_INPUT = (
    ValueError, TypeError, MemoryError, ImportError, FileNotFoundError, FileExistsError,
    NotADirectoryError, IsADirectoryError, PermissionError,
)  # fmt: skip
"""What the library raises for bad input (settings, paths, missing packages): exit 2."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``rlstash <command> ...``; every error is one line on stderr (module docstring):
    exit 2 for bad input (:data:`BAD_INPUT`), 1 for another OSError (a full disk), 130 on
    Ctrl-C."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error already printed
        return exc.code if isinstance(exc.code, int) else 2
    prog = f"rlstash {args.command}"
    try:
        return int(args.func(args) or 0)
    except BAD_INPUT as exc:
        sys.stderr.write(one_line(prog, exc))
        return 2
    except OSError as exc:  # a full disk during a checkpoint: one line
        sys.stderr.write(one_line(prog, exc))
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
