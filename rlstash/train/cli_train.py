"""Deprecated: ``rlstash train`` moved to :mod:`rlstash.cli.train` (``cmd_eval`` to
:mod:`rlstash.cli.eval`); this re-export goes in the next release."""

from rlstash.moved import moved_names

_NAMES = {
    **dict.fromkeys(
        ["cmd_train", "register", "resolved_toml", "settings_from_args", "tomllib"],
        "rlstash.cli.train",
    ),
    "cmd_eval": "rlstash.cli.eval",
}
__getattr__ = moved_names(__name__, _NAMES)
