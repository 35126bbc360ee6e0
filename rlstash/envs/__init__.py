"""Parallel environments: :class:`ProcessPoolVectorEnv` (torch-free worker processes over
shared memory, a drop-in for ``gymnasium.vector.AsyncVectorEnv``).

Nothing under ``rlstash.envs`` imports torch, so worker processes stay small and can never
touch CUDA (invariant I1); the batched torch envs (:mod:`rlstash.envs.batched`) and
:func:`from_rsl_rl` (rsl_rl-style envs such as Isaac Lab's and Genesis's as batched torch
envs: :mod:`rlstash.envs.rsl_rl`) load torch only when used.

``EnvPool`` is the former name of :class:`ProcessPoolVectorEnv`; it still resolves (to the
same class) with a one-time ``FutureWarning``, and will be removed. It was renamed because
``EnvPool`` is the name of sail-sg/envpool, a different (C++) library.
"""

from __future__ import annotations

import warnings
from typing import Any

from rlstash.envs.cpus import usable_cpus
from rlstash.envs.errors import (
    AutoChoiceWarning,
    OversubscriptionWarning,
    RestartEvent,
    WorkerFailedError,
    WorkerRestartWarning,
)
from rlstash.envs.process_pool import ProcessPoolVectorEnv

__all__ = [
    "AutoChoiceWarning",
    "OversubscriptionWarning",
    "ProcessPoolVectorEnv",
    "RestartEvent",
    "WorkerFailedError",
    "WorkerRestartWarning",
    "from_rsl_rl",
    "usable_cpus",
]

_LAZY = {"from_rsl_rl": "rlstash.envs.rsl_rl"}  # torch-backed: imported on first use

_RENAMED = {"EnvPool": ProcessPoolVectorEnv}
_warned: set[str] = set()


def __getattr__(name: str) -> Any:
    """``from_rsl_rl`` (imports torch, so only when asked for); ``EnvPool``: the old name of
    :class:`ProcessPoolVectorEnv` (warns once per process)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    if name not in _RENAMED:
        raise AttributeError(f"module 'rlstash.envs' has no attribute {name!r}")
    new = _RENAMED[name]
    if name not in _warned:
        _warned.add(name)
        warnings.warn(
            f"rlstash: {name} was renamed {new.__name__} (same class, same arguments); "
            f"import {new.__name__} instead, {name} will be removed",
            FutureWarning,
            stacklevel=_caller_level(),
        )
    return new


def _caller_level() -> int:
    """``stacklevel`` pointing at the user's import line (past rlstash's own lazy loader;
    importlib's frames are skipped by ``warnings.warn`` itself)."""
    import os
    import sys

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    level, frame = 1, sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if "importlib" in name and "_bootstrap" in name:
            frame = frame.f_back  # warnings.warn does not count these frames itself
            continue
        if not name.startswith(package):
            break
        frame = frame.f_back
        level += 1
    return level
