"""Autoreset modes: one spelling everywhere, gymnasium's (torch-free).

Every rlstash API that takes an autoreset mode (``ProcessPoolVectorEnv(autoreset_mode=)``,
``AsyncCollector(autoreset_mode=)``, the batched envs' ``autoreset_mode=``,
``StreamStorage(autoreset=)``) takes gymnasium's :class:`gymnasium.vector.AutoresetMode` or
its value: ``"NextStep"``, ``"SameStep"``, ``"Disabled"``. The old rlstash spelling
(``"next_step"``, ``"same_step"``, ``"disabled"``) still works for one release, with a
``DeprecationWarning`` naming the new one.

An env says which mode it follows in ``metadata["autoreset_mode"]``. One that says nothing is
read as gymnasium's default, ``NextStep`` (the default of ``SyncVectorEnv``,
``AsyncVectorEnv`` and what ``gymnasium.wrappers.vector.RecordEpisodeStatistics`` assumes
when the key is missing), on every collection path.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterable
from typing import Any

from gymnasium.vector import AutoresetMode

BY_TOKEN = {
    "next_step": AutoresetMode.NEXT_STEP,
    "same_step": AutoresetMode.SAME_STEP,
    "disabled": AutoresetMode.DISABLED,
}
"""The short names rlstash's internals and saved files use for the modes; as arguments they
are the old (deprecated) spelling."""

TOKEN = {mode: name for name, mode in BY_TOKEN.items()}
"""The short name of each mode (see :data:`BY_TOKEN`)."""

DEFAULT = AutoresetMode.NEXT_STEP
"""gymnasium's default: the mode of an env whose metadata does not say."""

STEP_MODES = (AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP)
"""The modes collectors and streams take (with ``Disabled`` nobody resets ended envs)."""


def resolve(
    value: Any, name: str = "autoreset_mode", allowed: Iterable[AutoresetMode] | None = None
) -> AutoresetMode:
    """The :class:`~gymnasium.vector.AutoresetMode` that ``value`` names.

    Takes the enum or its value (``"NextStep"``, ``"SameStep"``, ``"Disabled"``); the old
    spelling (``"next_step"``, ...) with a ``DeprecationWarning``. Anything else, or a mode
    outside ``allowed``, is a ValueError naming ``name``, what is accepted and the fix.
    """
    ok = list(AutoresetMode) if allowed is None else list(allowed)
    spelled = ", ".join(f"AutoresetMode.{m.name} ({m.value!r})" for m in ok)
    if isinstance(value, AutoresetMode):
        mode = value
    elif isinstance(value, str) and value in BY_TOKEN:
        mode = BY_TOKEN[value]
        warnings.warn(
            f"{name}={value!r} is the old rlstash spelling of gymnasium's autoreset modes; "
            f"use gymnasium.vector.AutoresetMode.{mode.name} (or {mode.value!r}); "
            f"{value!r} will be refused in the next release",
            DeprecationWarning,
            stacklevel=user_stacklevel(),
        )
    else:
        try:
            mode = AutoresetMode(value)
        except (ValueError, TypeError):
            raise ValueError(
                f"{name}: expected one of {spelled} (gymnasium.vector.AutoresetMode), got {value!r}"
            ) from None
    if mode not in ok:
        raise ValueError(f"{name}: expected one of {spelled}, got {mode.value!r}")
    return mode


def declared(env: Any) -> AutoresetMode | None:
    """The mode ``env.metadata["autoreset_mode"]`` declares, or None when it says nothing."""
    metadata = getattr(env, "metadata", None) or {}
    if "autoreset_mode" not in metadata:
        return None
    return resolve(metadata["autoreset_mode"], "env.metadata['autoreset_mode']")


def of_env(env: Any) -> AutoresetMode:
    """The mode an env follows: its declared one, else gymnasium's default (NextStep)."""
    mode = declared(env)
    return DEFAULT if mode is None else mode


def user_stacklevel() -> int:
    """``stacklevel`` for a ``warnings.warn`` called in :func:`resolve`: the first frame
    outside the rlstash package (the user's line)."""
    package = os.path.dirname(os.path.abspath(__file__))
    level, frame = 1, sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(package + os.sep):
        frame = frame.f_back
        level += 1
    return level


__all__ = ["BY_TOKEN", "DEFAULT", "STEP_MODES", "TOKEN", "declared", "of_env", "resolve"]
