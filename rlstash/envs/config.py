"""Argument checking for :class:`~rlstash.envs.process_pool.ProcessPoolVectorEnv` (torch-free).

Every bad argument raises ValueError/TypeError naming the argument, what was expected and
what came, before any process starts.
"""

from __future__ import annotations

import functools
import numbers
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode

from rlstash import autoreset
from rlstash.envs import registry
from rlstash.envs.cpus import usable_cpus
from rlstash.envs.errors import OversubscriptionWarning, SpaceMismatchError, user_stacklevel
from rlstash.envs.launch import START_METHODS, default_start_method
from rlstash.envs.shutdown import CLOSE_TIMEOUT

OVERSUBSCRIPTION = 2  # warn when workers > this many times the usable cores
START_TIMEOUT = 120.0  # default start_timeout: seconds for a worker to build its envs

MODE_ENUM = {  # the pool's internal names (rlstash.autoreset.TOKEN; spelled out: importing
    # rlstash.autoreset may be what first imports gymnasium, whose import hook imports this)
    "next_step": AutoresetMode.NEXT_STEP,
    "same_step": AutoresetMode.SAME_STEP,
    "disabled": AutoresetMode.DISABLED,
}


def factories(
    env_fns: str | Callable | Sequence[Callable],
    num_envs: int | None,
    env_kwargs: Mapping[str, Any] | None,
) -> list[Callable]:
    """One zero-argument factory per env from an env id, a factory, or a list of factories."""
    if env_kwargs is not None and not isinstance(env_kwargs, Mapping):
        raise TypeError(f"env_kwargs: expected a dict or None, got {type(env_kwargs).__name__}")
    kwargs = dict(env_kwargs or {})
    if isinstance(env_fns, str):
        one: Callable | None = functools.partial(registry.make, registry.spec(env_fns), **kwargs)
    elif callable(env_fns):
        one = functools.partial(env_fns, **kwargs) if kwargs else env_fns
    elif isinstance(env_fns, Sequence) and env_fns and all(callable(f) for f in env_fns):
        one = None
    else:
        raise TypeError(
            "env_fns: expected a gymnasium env id (str), an env factory (callable) or a "
            f"non-empty list of factories, got {type(env_fns).__name__}"
        )
    if one is not None:
        if num_envs is None:
            raise ValueError("num_envs: required with an env id or a single factory, got None")
        return [one] * check_positive_int("num_envs", num_envs)
    fns = list(env_fns)  # type: ignore[arg-type]
    if num_envs is not None and check_positive_int("num_envs", num_envs) != len(fns):
        raise ValueError(f"num_envs: {num_envs} given with {len(fns)} env factories")
    return [functools.partial(f, **kwargs) for f in fns] if kwargs else fns


def check_positive_int(name: str, value: Any, minimum: int = 1) -> int:
    """``value`` as an int >= minimum, else TypeError/ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected an int >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value}")
    return int(value)


def autoreset_mode(value: str | AutoresetMode) -> str:
    """The pool's internal name of a mode (``"next_step"``, ``"same_step"``, ``"disabled"``)
    from gymnasium's :class:`AutoresetMode` or its value (:func:`rlstash.autoreset.resolve`:
    the old spelling warns, anything else is a ValueError)."""
    return autoreset.TOKEN[autoreset.resolve(value)]


def num_workers(value: int | str | None, num_envs: int) -> int | str:
    """Resolve ``num_workers``: None -> usable cores (at most one per env); ``"auto"`` stays.

    Warns (:class:`OversubscriptionWarning`) when far more workers than cores are asked for.
    """
    if value == "auto":
        return "auto"
    cores = usable_cpus()
    if value is None:
        return min(cores, num_envs)
    if isinstance(value, str):
        raise ValueError(f"num_workers: expected an int >= 0, None or 'auto', got {value!r}")
    w = min(check_positive_int("num_workers", value, minimum=0), num_envs)
    if w > OVERSUBSCRIPTION * cores:
        warnings.warn(
            f"num_workers={w} worker processes for {cores} usable CPU core(s) "
            f"(affinity and cgroup quota): more than {OVERSUBSCRIPTION}x oversubscribed, "
            f"steps will be slower than with num_workers={cores}",
            OversubscriptionWarning,
            stacklevel=user_stacklevel(),
        )
    return w


def caller_envs(value: Any, workers: int | str, requested: Any, num_envs: int) -> tuple:
    """``(num_workers, caller_envs)``: ``caller_envs`` checked against the workers
    (``workers``: resolved by :func:`num_workers`; ``requested``: as the caller gave it).
    With ``num_workers=None`` the caller's core is not counted for workers."""
    k = check_positive_int("caller_envs", value, minimum=0)
    if k == 0:
        return workers, 0
    if workers == "auto":
        raise ValueError(
            f'caller_envs: num_workers="auto" chooses the caller\'s share itself, got '
            f"caller_envs={k}; pass an int num_workers with caller_envs, or caller_envs=0"
        )
    if requested is None:
        workers = max(1, min(usable_cpus() - 1, num_envs - k))
    if workers == 0:
        raise ValueError(
            f"caller_envs: expected 0 with num_workers=0 (every env steps in the caller "
            f"then), got {k}"
        )
    if k > num_envs - int(workers):
        raise ValueError(
            f"caller_envs: expected at most {num_envs - int(workers)} (num_envs={num_envs} "
            f"minus one env per worker, num_workers={workers}), got {k}"
        )
    return workers, k


def cap_workers(workers: int | str, max_concurrency: Any) -> int | str:
    """``num_workers`` capped by AsyncVectorEnv's ``max_concurrency`` (checked as it does)."""
    if max_concurrency is None:
        return workers
    if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, numbers.Integral):
        raise ValueError(
            f"`max_concurrency` must be an integer or None, got {type(max_concurrency)}."
        )
    if max_concurrency < 1:
        raise ValueError(f"`max_concurrency` must be a positive or None, got {max_concurrency}.")
    if workers == "auto":
        return "auto" if max_concurrency > 1 else 0
    return min(int(workers), int(max_concurrency))


def start_method(value: str | None, name: str = "context") -> str:
    """Default: forkserver where available, else spawn; fork only when asked."""
    if value is None:
        return default_start_method()
    if value not in START_METHODS:
        raise ValueError(f"{name}: expected one of {START_METHODS} or None, got {value!r}")
    return value


def step_timeout(value: float | None, name: str = "step_timeout") -> float | None:
    """Seconds > 0 (finite) or None; ValueError naming ``name`` otherwise."""
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not 0 < value < float("inf")
    ):
        raise ValueError(f"{name}: expected seconds > 0 or None, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Timeouts:
    """The bound of every wait for a worker process, from the pool's (or collector's)
    settings; one object, so that no wait has a bound of its own.

    * ``start``: a worker starts, builds its envs (INIT) and maps the shared memory
      (ATTACH): at the pool's start and at every restart (``start_timeout``).
    * ``step``: one step, reset or call (``step_timeout``).
    * ``restart``: the reset of a restarted worker's envs, the last part of a restart:
      ``step_timeout`` when set, else ``start_timeout`` (a restart is never waited on
      without a bound while the pool has one).
    * ``close``: a worker ends after CLOSE, or is reaped after SIGKILL.

    None waits (a worker that dies is still noticed at once: its pipe closes).
    """

    start: float | None = START_TIMEOUT
    step: float | None = None
    close: float = CLOSE_TIMEOUT

    @property
    def restart(self) -> float | None:
        return self.start if self.step is None else self.step

    def deadline(self, which: str) -> float | None:
        """``time.monotonic()`` + the ``which`` bound (``"start"``, ``"step"``), or None."""
        seconds = self._bound(which)
        return None if seconds is None else time.monotonic() + seconds

    def describe(self, which: str) -> str:
        """``"step_timeout=2.0 s"``: the setting that bounds ``which``, for error texts."""
        if which == "restart":
            which = "start" if self.step is None else "step"
        return f"{which}_timeout={self._bound(which)} s"

    def _bound(self, which: str) -> float | None:
        bounds = {"start": self.start, "step": self.step, "close": self.close}
        if which == "restart":
            return self.restart
        if which not in bounds:
            raise ValueError(f"which: expected one of {[*bounds, 'restart']}, got {which!r}")
        return bounds[which]


def seed(value: int | None) -> int | None:
    if value is None:
        return None
    return check_positive_int("seed", value, minimum=0)


def worker_env(value: Mapping[str, str] | None) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise TypeError(f"worker_env: expected a dict of str -> str, got {value!r}")
    return {k: str(v) for k, v in value.items()}


def observation_mode(value: Any) -> str | tuple:
    """``"same"``, ``"different"`` or a (batched, single) pair of spaces, as AsyncVectorEnv."""
    from gymnasium import Space

    if isinstance(value, tuple) and len(value) == 2:
        if not all(isinstance(s, Space) for s in value):
            raise TypeError(
                "observation_mode: expected both elements to be Spaces, got "
                f"{type(value[0])} and {type(value[1])}"
            )
        return value
    if isinstance(value, str) and value in ("same", "different"):
        return value
    raise ValueError(
        "Invalid `observation_mode`, expected: 'same' or 'different' or tuple of single and "
        f"batch observation space, actual got {value}"
    )


def space_resolver(mode: str | tuple, shared_memory: bool) -> Callable[[list, list], tuple]:
    """``resolve(observation_spaces, action_spaces)`` (one per env) -> the single
    (observation, action) spaces, checked as AsyncVectorEnv checks them for ``mode``, and
    whether observations travel pickled (``not shared_memory``).

    Raises:
        SpaceMismatchError: (a RuntimeError and a ValueError) naming the first env that
            differs.
    """
    from gymnasium.spaces.utils import is_space_dtype_shape_equiv

    def resolve(obs_spaces: list, act_spaces: list) -> tuple:
        act = act_spaces[0]
        bad = [i for i, s in enumerate(act_spaces) if s != act]
        if bad:
            raise SpaceMismatchError(
                f"Some environments have an action space different from `{act}`. In order "
                "to batch actions, the action spaces from all environments must be equal "
                f"(env {bad[0]}: {act_spaces[bad[0]]}; envs that differ: {bad})."
            )
        single = mode[1] if isinstance(mode, tuple) else obs_spaces[0]
        if mode == "same":
            bad = [i for i, s in enumerate(obs_spaces) if s != single]
            if bad:
                raise SpaceMismatchError(
                    "ProcessPoolVectorEnv(..., observation_mode='same') however some of the "
                    "sub-environments observation spaces are not equivalent. If this is "
                    "intentional, use `observation_mode='different'` instead "
                    f"(env {bad[0]}: {obs_spaces[bad[0]]}, env 0: {single})."
                )
        else:
            bad = [i for i, s in enumerate(obs_spaces) if not is_space_dtype_shape_equiv(s, single)]
            if bad:
                raise SpaceMismatchError(
                    "ProcessPoolVectorEnv(..., observation_mode='different' or custom space) "
                    "however the sub-environment's observation spaces do not share a common "
                    f"shape and dtype (env {bad[0]}: {obs_spaces[bad[0]]}, expected like "
                    f"{single})."
                )
        return single, act, not shared_memory

    return resolve


def flag(name: str, value: Any) -> bool:
    """A bool argument (``shared_memory``, ``copy``, ``daemon``); TypeError otherwise."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected True or False, got {value!r}")
    return bool(value)
