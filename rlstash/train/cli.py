"""Deprecated: the ``rlstash`` command moved to :mod:`rlstash.cli` (this re-export goes in
the next release; each name warns once used)."""

from rlstash.moved import moved_names

_PUBLIC = [
    "BAD_INPUT", "Parser", "PlanConfig", "build_parser", "build_plan", "main", "one_line",
    "parse_field", "parse_fields",
]  # fmt: skip
_NAMES = {
    **dict.fromkeys(_PUBLIC, "rlstash.cli"),
    **dict.fromkeys(["cmd_plan", "_plan_compression"], "rlstash.cli.plan"),
    "cmd_doctor": "rlstash.cli.doctor",
}
__getattr__ = moved_names(__name__, _NAMES)
