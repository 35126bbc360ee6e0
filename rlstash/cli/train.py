"""``rlstash train``: argument parsing over :mod:`rlstash.train.loop`.

The train flags are derived from the settings dataclasses (:mod:`rlstash.cli.flags`); the
precedence is defaults < the env's preset < ``--config`` file < flags < ``--set``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from rlstash.cli.flags import Given, add_train_flags, given_flags, known_settings
from rlstash.cli.main import describe
from rlstash.settings import SettingError
from rlstash.train.config import TrainConfig

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]


def _config_file(path: str, given: Given) -> None:
    """A TOML file: run settings at the top level, agent settings under ``[agent]``; every
    error names the file (and the key: ``--config FILE: [agent] gamma: ...``)."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        if isinstance(exc, UnicodeDecodeError):
            why = f"not a UTF-8 text file ({exc.reason} at byte {exc.start})"
        raise ValueError(
            f"--config {path}: cannot read it as TOML: {why}; fix the file or the path"
        ) from None
    agent = data.pop("agent", {})
    if not isinstance(agent, dict):
        raise SettingError(
            f"--config {path}: agent", "an [agent] table of agent settings", agent,
            "write the agent settings under [agent], one 'name = value' per line",
        )  # fmt: skip
    for table, items in (("", data), ("[agent] ", agent)):
        for key, value in items.items():
            source = f"--config {path}: {table}{key}"
            if key not in known_settings():
                raise SettingError(
                    source, "a known setting", key, f"settings: {', '.join(known_settings())}"
                )
            given.put(key, value, source)


def settings_from_args(args: argparse.Namespace, given: Given) -> Given:
    """Record what ``rlstash train`` was given in ``given``: the --config file, then the flags,
    then --set (later ones win)."""
    if args.config:
        _config_file(args.config, given)
    given_flags(args, given)
    for item in args.set or []:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(
                f"--set: expected KEY=VALUE (any setting), got {item!r}; e.g. --set learning_rate=1e-3"
            )
        given.put_text(key, raw, f"--set {key}")
    return given


def cmd_train(args: argparse.Namespace) -> int:
    from rlstash.train.loop import train

    given = Given()
    try:
        settings_from_args(args, given)
        if args.resume:
            if given.sources:  # named with the run's own value where its manifest says it
                from rlstash.train.rundir import resume_conflict

                values = {**given.values, **given.agent}
                conflict = resume_conflict(Path(args.resume), values, given.sources)
                raise ValueError(
                    conflict
                    or f"--resume: continues a run with its saved settings, got "
                    f"{', '.join(sorted(set(given.sources.values())))}; drop them or start a new run"
                )
            train(resume=args.resume)
            return 0
        cfg = given.config()
        if args.show_config:
            print(resolved_toml(cfg))
            return 0
        result = train(cfg)
    except SettingError as exc:
        raise ValueError(given.explain(exc)) from None
    except ValueError as exc:  # a setting's range rule in an agent config or the builders
        raise ValueError(given.relabel(exc)) from None
    if not result.solved and result.last_eval == result.last_eval and cfg.threshold is not None:
        print(f"not solved within {result.steps} steps", file=sys.stderr)
    return 0


def resolved_toml(cfg: TrainConfig) -> str:
    """The run's settings after defaults and the env's preset, as a --config TOML file."""
    from rlstash.train import algos
    from rlstash.train.builders import probe_env

    cfg, _ = algos.resolve(cfg, probe_env(cfg.env, cfg.history).act_space)
    lines = [f"# rlstash train --config FILE: the settings of this run ({cfg.algo} on {cfg.env})"]
    for key, value in dataclasses.asdict(cfg).items():
        if key != "agent":
            lines.append(_toml_line(key, value))
    lines.append("\n[agent]")
    lines += [_toml_line(key, value) for key, value in sorted(cfg.agent.items())]
    return "\n".join(lines)


def _toml_line(key: str, value: Any) -> str:
    if value is None:
        return f"# {key} = (unset)"
    if isinstance(value, bool):
        return f"{key} = {str(value).lower()}"
    if isinstance(value, str):
        return f"{key} = {json.dumps(value)}"
    if isinstance(value, (tuple, list)):
        return f"{key} = [{', '.join(map(str, value))}]"
    return f"{key} = {value!r}"


def register(sub: argparse._SubParsersAction) -> None:
    t = sub.add_parser(
        "train",
        help="train an agent (default: DQN on CartPole-v1 until solved)",
        **describe(
            "Train an agent on an environment and write runs/<name>/: progress.csv, eval.csv,\n"
            "learning_curve.png and a checksummed checkpoint that --resume continues. Settings\n"
            "not given take the algorithm's defaults, then the env's tuned preset. Every setting\n"
            "below is also accepted as --set NAME=VALUE and in a --config TOML file (agent\n"
            "settings under [agent]).",
            "rlstash train --algo sac --env Pendulum-v1 --storage disk",
            "getting-started/",
        ),
    )
    t.add_argument(
        "--config", default=None, help="TOML file of settings ([agent] table for the agent)"
    )
    t.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="any setting by its name, e.g. --set learning_rate=1e-3 (repeat)",
    )
    t.add_argument(
        "--resume",
        default=None,
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR from its checkpoint",
    )
    t.add_argument(
        "--show-config",
        action="store_true",
        help="print the run's settings (defaults and the env's preset applied) as a --config "
        "file, and exit without training",
    )
    add_train_flags(t)
    t.set_defaults(func=cmd_train)
