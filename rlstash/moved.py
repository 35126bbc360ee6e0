"""Re-exports of renamed modules, for one release: the old name warns and hands the new one.

A moved module's old file keeps ``__getattr__ = moved_names(__name__, {name: new_module})``;
``old.name`` then imports ``new_module`` (by its name: no import edge from the old package up
to the new one), warns with a DeprecationWarning naming the new path, and returns the object.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any


def moved_names(old: str, names: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``old`` that finds each of ``names`` in its new module."""

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        new = names[name]
        warnings.warn(
            f"{old}.{name} moved to {new}.{name}; import it from {new} ({old} goes in the "
            "next release)",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(new), name)

    return __getattr__
