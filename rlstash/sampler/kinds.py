"""Sampler kinds by name: how a saved ``state_dict`` (its ``"kind"``) becomes a new sampler.

Each built-in sampler module registers its kind (``register_kind("uniform", rebuild)``), as
the storage kinds do (:func:`rlstash.storage.register_kind`); a buffer's
:meth:`~rlstash.replay.ReplayBuffer.load` rebuilds its sampler with :func:`sampler_from_state`.
A user's own sampler may register its kind too, or be given to ``load`` as ``sampler``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlstash.core import Sampler

Rebuild = Callable[[dict[str, Any]], Sampler]
_KINDS: dict[str, Rebuild] = {}


def register_kind(kind: str, rebuild: Rebuild) -> None:
    """Let :func:`sampler_from_state` rebuild samplers whose ``state_dict()["kind"]`` is
    ``kind``: ``rebuild(state)`` returns a new sampler with the saved settings (not yet
    loaded: the buffer calls its ``load_state_dict``)."""
    _KINDS[kind] = rebuild


def sampler_from_state(state: dict[str, Any], path: Any = "state") -> Sampler:
    """A new sampler of a registered kind with the settings of a saved ``state_dict`` (not
    yet loaded); ValueError naming ``path`` and the fix for a kind nobody registered."""
    kind = state.get("kind") if isinstance(state, dict) else None
    rebuild = _KINDS.get(kind) if isinstance(kind, str) else None
    if rebuild is None:
        raise ValueError(
            f"{path}: the saved sampler is of kind {kind!r}, which rlstash cannot rebuild by "
            "itself; fix: pass sampler=<a new sampler of that kind> to ReplayBuffer.load"
        )
    return rebuild(state)


__all__ = ["register_kind", "sampler_from_state"]
