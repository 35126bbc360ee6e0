"""Registers rlstash's gymnasium ids on ``import rlstash`` without importing gymnasium.

Importing gymnasium costs a large part of a second, and ``import rlstash`` must stay light
(env worker processes import it). So: if gymnasium is already imported, the ids are
registered now; otherwise a one-shot import hook registers them right after gymnasium's own
``import`` finishes, whichever order the user imports things in. Registration imports
neither torch nor the env modules (entry points are strings).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType
from typing import Any

_TARGET = "gymnasium"


def register_envs() -> None:
    """Register ``rlstash/CartPole-v1`` and ``rlstash/Pendulum-v1`` (idempotent)."""
    from gymnasium.envs.registration import register, registry

    from rlstash.envs.batched import ENV_IDS

    for env_id, kwargs in ENV_IDS.items():
        if env_id not in registry:
            register(id=env_id, **kwargs)


class _Loader(importlib.abc.Loader):
    """Runs gymnasium's own loader, then registers the ids."""

    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        register_envs()

    def __getattr__(self, name: str) -> Any:  # resource readers etc. of the real loader
        return getattr(self.inner, name)


class _Hook(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader of the real ``gymnasium`` spec, once."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != _TARGET:
            return None
        _remove_hook()
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def _remove_hook() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Hook)]


def install() -> None:
    """Register now if gymnasium is loaded, else once it is (see the module docstring)."""
    if _TARGET in sys.modules:
        try:
            register_envs()
        except ImportError:  # gymnasium half-imported (rlstash imported from inside it)
            pass
        return
    if not any(isinstance(f, _Hook) for f in sys.meta_path):
        sys.meta_path.insert(0, _Hook())
