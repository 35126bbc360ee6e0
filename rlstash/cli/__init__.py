"""The ``rlstash`` command line: one module per command, each command's flags one dataclass.

``main`` (:mod:`rlstash.cli.main`) joins ``plan``, ``doctor``, ``train``, ``eval`` and
``bench`` (:mod:`rlstash.cli.plan`, ...); every error is one line, exit 2. Each command's
flags are the fields of its settings dataclass (``PlanConfig``, ``EvalConfig``,
``DoctorConfig``, ``BenchConfig``; ``TrainConfig`` and the agents' configs for ``train``),
whose help strings are the ``--help`` text (CleanRL's ``Args``), made into argparse flags by
:mod:`rlstash.cli.flags`. ``plan`` shares ``train``'s replay fields
(:class:`~rlstash.train.config.ReplayConfig`: names, help, rules).

Why our own :mod:`rlstash.settings` / :mod:`rlstash.cli.flags` and not ``tyro`` (1.0.x on
PyPI): ``rlstash train`` needs what tyro does not give — settings of every registered
algorithm's agent config as flags, a ``--config`` TOML file and ``--set NAME=VALUE`` layered
over the env's preset, each error naming where the value came from (flag, file entry or
``--set``) — so the train path stays on ``flags.py`` either way; tyro for the four small
commands would add a dependency (and its own: rich, docstring-parser, typeguard, shtab) and a
second error format (tyro prints a multi-line boxed report) beside our one-line, exit-2
errors, to save ~60 lines of ``add_config_flags``.
"""

from rlstash.cli.fields import parse_field, parse_fields
from rlstash.cli.main import BAD_INPUT, Parser, build_parser, main, one_line
from rlstash.cli.plan import PlanConfig, build_plan

__all__ = [
    "BAD_INPUT",
    "Parser",
    "PlanConfig",
    "build_parser",
    "build_plan",
    "main",
    "one_line",
    "parse_field",
    "parse_fields",
]
