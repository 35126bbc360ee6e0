"""The ``rlstash`` command: train | eval | plan | doctor | bench.

Each subcommand is a thin function over the library; parsing stays here.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rlstash.spec import Field, Spec, parse_dtype


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
    try:
        dtype = parse_dtype(dtype_text)
    except TypeError as exc:
        raise ValueError(f"--field {name}: {exc}") from None
    return name, Field(shape, dtype)


def _env_spec(env_id: str, next_obs: bool) -> Spec:
    import gymnasium as gym

    try:
        env = gym.make(env_id)
    except Exception as exc:  # noqa: BLE001 - gymnasium raises several kinds
        raise ValueError(f"--env: cannot make {env_id!r}: {exc}") from None
    try:
        return Spec.for_transitions(env.observation_space, env.action_space, next_obs=next_obs)
    finally:
        env.close()


def cmd_plan(args: argparse.Namespace) -> int:
    from rlstash.diag.memory import plan

    if args.field and args.env:
        raise ValueError("plan: give either --field (repeatable) or --env, not both")
    if args.env:
        spec = _env_spec(args.env, next_obs=True)
    elif args.field:
        spec = Spec(dict(parse_field(f) for f in args.field))
    else:  # the default: an Atari-sized buffer (Nature DQN: 1M transitions of 4x84x84 frames)
        spec = Spec(
            {
                "obs": Field((4, 84, 84), "uint8"),
                "action": Field((), "int64"),
                "reward": Field((), "float32"),
                "terminated": Field((), "bool"),
                "truncated": Field((), "bool"),
                "next_obs": Field((4, 84, 84), "uint8"),
            }
        )
    result = plan(spec, args.capacity, storage=args.storage, device=args.device, path=args.path)
    print(result.format_table())
    stream = _stream_figures(spec, args)
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


def _stream_figures(spec: Spec, args: argparse.Namespace) -> str:
    """The stream layout's bytes next to the naive (obs + next_obs) layout, when it applies."""
    try:
        from rlstash.storage.stream import compare_layouts
    except ImportError:
        return ""
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
    p = argparse.ArgumentParser(prog="rlstash", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    sp = sub.add_parser("plan", help="exact bytes a buffer needs per place, and whether it fits")
    sp.add_argument(
        "--field",
        action="append",
        default=[],
        help="NAME=SHAPE:DTYPE, e.g. obs=4x84x84:uint8 (repeat)",
    )
    sp.add_argument("--env", help="derive fields from a gymnasium env id, e.g. CartPole-v1")
    sp.add_argument("--capacity", type=int, default=1_000_000, help="rows (transitions) to hold")
    sp.add_argument(
        "--storage", default="ram", choices=["ram", "disk", "shm"], help="where rows live"
    )
    sp.add_argument("--device", default="cpu", help="device of a RAM storage (cpu, cuda:0, ...)")
    sp.add_argument("--path", default=None, help="directory of a disk storage")
    sp.add_argument("--num-envs", type=int, default=8, help="envs feeding the stream layout")
    sp.add_argument(
        "--frame-stack",
        type=int,
        default=4,
        help="frames per observation (stream layout stores single frames)",
    )
    sp.set_defaults(func=cmd_plan)

    sd = sub.add_parser("doctor", help="what matters for RL runs on this machine")
    sd.add_argument("--run-dir", default="runs", help="where runs and disk buffers go")
    sd.set_defaults(func=cmd_doctor)

    _add_optional_commands(sub)
    return p


def _add_optional_commands(sub: argparse._SubParsersAction) -> None:
    """train / eval / bench live in their own modules; register them when present."""
    for module in ("rlstash.train.cli_train",):
        try:
            mod = __import__(module, fromlist=["register"])
        except ImportError:
            continue
        mod.register(sub)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, TypeError, MemoryError) as exc:
        print(f"rlstash {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"rlstash {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
