"""Env ids of packages that register their envs on import (torch-free).

gymnasium only knows the ids of packages that were imported: ``ALE/Pong-v5`` fails with
"Namespace ALE not found" until ``gymnasium.register_envs(ale_py)`` ran, ``dm_control/...``
ids need shimmy. :func:`make` (used by the pool's workers and ``rlstash train``) imports the
package an id needs first:

* ``ALE/...``: ale-py (``pip install 'rlstash[atari]'``);
* ``dm_control/...``: shimmy with dm_control (``pip install 'rlstash[dmc]'``);
* ``module:EnvId``: imports ``module`` (which registers ``EnvId``), then makes ``EnvId``;
  refused when ``EnvId`` is one of gymnasium's own envs, which the module did not register
  (``envpool:CartPole-v1`` would otherwise train gymnasium's CartPole: EnvPool registers
  nothing with gymnasium, its envs are a backend, ``--env-backend envpool``);
* ``pettingzoo:<module>`` is multi-agent: refused here (:mod:`rlstash.envs.pettingzoo`);
* MuJoCo ids (``HalfCheetah-v5``...) are gymnasium's own (``pip install 'rlstash[mujoco]'``).
"""

from __future__ import annotations

import importlib
from typing import Any

FAMILIES = {  # id namespace -> (package that registers it, rlstash extra that installs it)
    "ALE": ("ale_py", "atari"),
    "dm_control": ("shimmy", "dmc"),
}


def register_family(env_id: str) -> None:
    """Import what ``env_id`` needs so that gymnasium knows it (see the module docstring).

    Raises:
        ModuleNotFoundError: naming the package and the extra that installs it.
    """
    import gymnasium

    if env_id.startswith("pettingzoo:"):
        raise ValueError(
            f"env id {env_id!r}: a PettingZoo Parallel env is multi-agent, not a gymnasium id; "
            "make it with rlstash.envs.make.make_multiagent_env (or PettingZooVectorEnv)"
        )
    if ":" in env_id:
        module, name = env_id.split(":", 1)
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ModuleNotFoundError(
                f"env id {env_id!r}: cannot import module {module!r} ({exc}); the part "
                "before ':' must be an importable module that registers the env"
            ) from exc
        check_registered_by(module, name)
        return
    namespace = env_id.split("/", 1)[0] if "/" in env_id else None
    if namespace not in FAMILIES:
        return
    package, extra = FAMILIES[namespace]
    try:
        registrar = importlib.import_module(package)
    except ImportError as exc:
        raise ModuleNotFoundError(
            f"env id {env_id!r} needs the {package} package, which is not installed "
            f"({exc}); install it with: pip install 'rlstash[{extra}]'"
        ) from exc
    gymnasium.register_envs(registrar)


BACKEND_MODULES = {"envpool": "--env-backend envpool (library: EnvPoolVectorEnv)"}
"""Modules that are env backends, not gymnasium registrations: named in ``module:EnvId``."""


def _gymnasium_own(spec: Any) -> bool:
    """Whether ``spec`` is one of gymnasium's own envs: its entry points (env and vector env)
    in gymnasium.envs."""
    for entry in (spec.entry_point, spec.vector_entry_point):
        if entry is None:
            continue
        where = entry if isinstance(entry, str) else getattr(entry, "__module__", "") or ""
        if not where.startswith("gymnasium.envs."):
            return False
    return True


def check_registered_by(module: str, name: str) -> None:
    """``module:name`` must make an env the module registered, not gymnasium's own ``name``
    (see the module docstring); a ValueError naming the id and the fix otherwise."""
    import gymnasium

    try:
        spec = gymnasium.spec(name)
    except gymnasium.error.Error:
        return  # gymnasium.make reports the unknown id
    top = module.split(".", 1)[0]
    if top == "gymnasium" or not _gymnasium_own(spec):
        return
    if top in BACKEND_MODULES:
        raise ValueError(
            f"env: {module}:{name} names the {top} backend as a module; {top} registers no "
            f"gymnasium envs, so gymnasium's own {name} would run. Give the id and the backend: "
            f"--env {name} {BACKEND_MODULES[top]}"
        )
    raise ValueError(
        f"env: {module}:{name}: module {module!r} does not register {name!r}, so gymnasium's "
        f"own {name} would run; give --env {name} for it, or the id {module!r} registers"
    )


def make(env_id: Any, **kwargs: Any) -> Any:
    """``gymnasium.make(env_id, **kwargs)`` after :func:`register_family`."""
    import gymnasium

    if isinstance(env_id, str):
        register_family(env_id)
    return gymnasium.make(env_id, **kwargs)


def spec(env_id: str) -> Any:
    """The EnvSpec of ``env_id`` if gymnasium knows it after :func:`register_family` (so
    workers need not register it), else the id itself (resolved again in the worker)."""
    import gymnasium

    register_family(env_id)
    try:
        return gymnasium.spec(env_id)
    except gymnasium.error.Error:
        return env_id
