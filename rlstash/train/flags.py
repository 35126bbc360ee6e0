"""Deprecated: the flag layer moved to :mod:`rlstash.cli.flags`; this re-export goes in the
next release."""

from rlstash.moved import moved_names

_PUBLIC = [
    "AGENT_DEST", "GROUPS", "Given", "add_train_flags", "agent_settings", "compute_device",
    "flag", "given_flags", "int_at_least", "ints_at_least", "known_settings", "positive_float",
    "setting_type",
]  # fmt: skip
__getattr__ = moved_names(__name__, dict.fromkeys(_PUBLIC, "rlstash.cli.flags"))
