"""Deprecated: the ``rlstash`` command moved to :mod:`rlstash.cli` (this re-export goes in
the next release; each name warns once used)."""

from rlstash.moved import moved_names

_NAMES = {
    **dict.fromkeys(
        ["main", "build_parser", "Parser", "one_line", "BAD_INPUT"], "rlstash.cli.main"
    ),
    **dict.fromkeys(["parse_field", "parse_fields"], "rlstash.cli.fields"),
    **dict.fromkeys(
        ["build_plan", "cmd_plan", "_plan_compression", "PlanConfig"], "rlstash.cli.plan"
    ),
    "cmd_doctor": "rlstash.cli.doctor",
}
__getattr__ = moved_names(__name__, _NAMES)
