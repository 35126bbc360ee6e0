"""``rlstash train`` and ``rlstash eval``: argument parsing over :mod:`rlstash.train.loop`."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from rlstash.train.loop import TrainConfig

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]


def _workers(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--workers: expected an int >= 0 or 'auto', got {text!r}"
        ) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"--workers: expected an int >= 0 or 'auto', got {text!r}")
    return value


def _config_file(path: str) -> dict[str, Any]:
    """A TOML file with run settings at the top level and agent settings under ``[agent]``."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"--config {path}: {exc}") from None
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"--config {path}: unknown settings {unknown}; known: {sorted(known)}")
    return data


def cmd_train(args: argparse.Namespace) -> int:
    from rlstash.train.loop import train

    if args.resume:
        train(resume=args.resume)
        return 0
    values: dict[str, Any] = _config_file(args.config) if args.config else {}
    for f in dataclasses.fields(TrainConfig):
        given = getattr(args, f.name, None)
        if given is not None and f.name != "agent":
            values[f.name] = given
    agent = dict(values.get("agent", {}))
    for item in args.set or []:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ValueError(f"--set: expected KEY=VALUE (an agent setting), got {item!r}")
        agent[key] = _literal(raw)
    values["agent"] = agent
    result = train(TrainConfig(**values))
    if (
        not result.solved
        and result.last_eval == result.last_eval
        and TrainConfig(**values).threshold is not None
    ):
        print(f"not solved within {result.steps} steps", file=sys.stderr)
    return 0


def _literal(raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def cmd_eval(args: argparse.Namespace) -> int:
    from rlstash.train.evaluate import evaluate_run

    out = evaluate_run(Path(args.run), episodes=args.episodes, seed=args.seed)
    r = out["returns"]
    print(
        f"{args.run}: {len(r)} episodes, return mean {r.mean():.2f} +- {r.std():.2f} (min {r.min():.1f}, max {r.max():.1f}), length mean {out['lengths'].mean():.1f}"
    )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    t = sub.add_parser("train", help="train an agent (default: DQN on CartPole-v1 until solved)")
    t.add_argument(
        "--algo",
        choices=["dqn", "sac"],
        default=None,
        help="dqn, or sac (continuous or discrete actions)",
    )
    t.add_argument("--env", default=None, help="gymnasium env id (default CartPole-v1)")
    t.add_argument("--steps", type=int, default=None, help="env steps at most (default 100000)")
    t.add_argument("--seed", type=int, default=None)
    t.add_argument("--envs", type=int, default=None, help="environments in parallel (default 1)")
    t.add_argument(
        "--workers",
        type=_workers,
        default=None,
        help="env worker processes: 0 (in-process), N, or auto",
    )
    t.add_argument(
        "--storage",
        choices=["ram", "disk", "tiered"],
        default=None,
        help="where the replay buffer lives",
    )
    t.add_argument("--device", default=None, help="learner device: auto, cpu, cuda, cuda:N")
    t.add_argument(
        "--buffer-device",
        dest="buffer_device",
        default=None,
        help="device of a RAM buffer / the hot tier",
    )
    t.add_argument(
        "--run-dir", dest="run_dir", default=None, help="parent directory of runs (default runs)"
    )
    t.add_argument("--name", default=None, help="run name (default <algo>-<env>-s<seed>)")
    t.add_argument(
        "--history",
        type=int,
        default=None,
        metavar="K",
        help="feed the agent windows of the last K observations through an LSTM (0 = off)",
    )
    t.add_argument("--eval-every", dest="eval_every", type=int, default=None)
    t.add_argument("--eval-episodes", dest="eval_episodes", type=int, default=None)
    t.add_argument("--checkpoint-every", dest="checkpoint_every", type=int, default=None)
    t.add_argument(
        "--threshold", type=float, default=None, help="stop once evaluations stay at or above this"
    )
    t.add_argument(
        "--patience", type=int, default=None, help="evaluations in a row above the threshold"
    )
    t.add_argument(
        "--quiet", action="store_true", default=None, help="plain log lines, no progress bar"
    )
    t.add_argument(
        "--config", default=None, help="TOML file of settings ([agent] table for the agent)"
    )
    t.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="an agent setting, e.g. --set learning_rate=1e-3",
    )
    t.add_argument(
        "--resume",
        default=None,
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR from its checkpoint",
    )
    t.set_defaults(func=cmd_train)

    e = sub.add_parser("eval", help="run a saved policy and print return statistics")
    e.add_argument("run", help="run directory (runs/<name>)")
    e.add_argument("--episodes", type=int, default=10)
    e.add_argument("--seed", type=int, default=12345)
    e.set_defaults(func=cmd_eval)
