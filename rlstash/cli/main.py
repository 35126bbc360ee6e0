"""The ``rlstash`` command: train | eval | plan | doctor | bench | verify | push | pull.

Each subcommand is a module of :mod:`rlstash.cli` with a ``register(sub)`` and a thin
``cmd_*`` function over the library; this module joins them. Every error is one
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
from typing import Any, NoReturn

COMMANDS = ("plan", "doctor", "train", "eval", "verify", "bench", "push", "pull", "export")
"""The subcommands, each a module of :mod:`rlstash.cli` with a ``register(sub)``."""

DOCS = "http://127.0.0.1:8000/"
"""Where the documentation site is: ``python3 run.py docs --serve`` serves it here (change
this one constant where the site is hosted)."""

ABOUT = f"""\
rlstash trains reinforcement-learning agents and keeps their experience: it steps many
environments in parallel worker processes, stores transitions in replay buffers in RAM, on a
GPU or on disk (memory planned before it is allocated), and trains DQN, SAC, TD3 or PPO,
leaving a run directory you can evaluate, verify and resume.

start here:
  rlstash train                              train DQN on CartPole-v1 until solved
  rlstash train --algo sac --env Pendulum-v1
  rlstash <command> --help                   what a command does, its flags and defaults

documentation: {DOCS} (built and served by: python3 run.py docs --serve)"""


def describe(what: str, example: str, page: str = "reference/cli/") -> dict[str, Any]:
    """``add_parser`` keywords that make a command's ``--help`` speak to its user: what it
    does, one example, and where the documentation is (``page`` under :data:`DOCS`)."""
    return {
        "description": f"{what}\n\nexample:\n  {example}\n\ndocumentation: {DOCS}{page}",
        "formatter_class": argparse.RawDescriptionHelpFormatter,
    }


def build_parser() -> argparse.ArgumentParser:
    """The ``rlstash`` parser: a :class:`Parser` with every command of :data:`COMMANDS`."""
    import importlib

    p = Parser(
        prog="rlstash", description=ABOUT, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"rlstash.cli.{name}").register(sub)
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
            command = vars(ns).get("command")
            prog = f"{self.prog} {command}" if command else self.prog
            self.exit(
                2, one_line(prog, f"unrecognized arguments: {' '.join(extras)}; see {prog} --help")
            )
        return ns


def one_line(prog: str, message: str | BaseException) -> str:
    """``"<prog>: error: <message>"`` on one line (line breaks in ``message`` become spaces;
    an exception without a message, e.g. ``MemoryError()``, is named by its type)."""
    text = " ".join(str(message).split())
    if not text and isinstance(message, BaseException):
        text = type(message).__name__
    return f"{prog}: error: {text}\n"


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
