"""Deprecated: ``rlstash bench`` moved to :mod:`rlstash.cli.bench`; this re-export goes in the
next release."""

from rlstash.moved import moved_names

__getattr__ = moved_names(__name__, dict.fromkeys(["cmd_bench", "register"], "rlstash.cli.bench"))
