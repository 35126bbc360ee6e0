"""The env contract the :class:`~rlstash.collect.sync.Collector` checks at the first reset and
step (invariant I11), so that a misread env fails loudly before anything is stored.

* **Which path.** A batched torch env is found by its ``device``, looked for through its
  wrappers (:func:`find_device`): gymnasium's ``VectorWrapper`` forwards no attributes, so a
  ``RecordEpisodeStatistics`` around a GPU env would otherwise hide it and every step would
  cross to the host. The first layer, outside in, that says where its outputs live decides:
  one with a ``device`` attribute (``None``: host arrays), or gymnasium's array-conversion
  wrappers (``NumpyToTorch``, ``JaxToTorch``, ``JaxToNumpy``: their target).
* **The step tuple.** gymnasium's five values ``(obs, reward, terminated, truncated, info)``.
  rsl_rl's ``VecEnv`` (Isaac Lab's ``RslRlVecEnvWrapper``, Genesis's and legged_gym's envs)
  returns ``(obs, rewards, dones, extras)``, or in its first version ``(obs, privileged_obs,
  rewards, dones, extras)``: five values, read as gymnasium's they would be misread (rewards as
  ``terminated``). Such an env is recognised (it has rsl_rl's ``get_observations`` and is no
  gymnasium ``VectorEnv``; or its step returns 4 values ending with a dict, or 5 whose second
  is None or whose third, gymnasium's ``terminated``, is a float tensor while the fourth is
  bool or integer) and refused with the fix, :func:`rlstash.envs.from_rsl_rl`.
* **Shapes, dtypes, devices.** ``reward`` real-valued ``[N]``, ``terminated``/``truncated``
  bool ``[N]``, every observation field ``[N, ...]``, all on the env's device (batched path)
  or host arrays (host path). A reward ``[N, 1]`` is refused, never broadcast.
* **The autoreset mode.** ``metadata["autoreset_mode"]``, else gymnasium's default,
  ``NextStep`` (:mod:`rlstash.autoreset`). An env that does not declare its mode is watched
  for evidence of another: final observations in ``info`` (``final_obs``,
  ``final_observation``), or a step right after an episode end that is no reset step (a
  next-step reset step has reward 0 and no flags) refuse, naming the declaration to add
  (:class:`UndeclaredNextStep`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from gymnasium.vector import VectorEnv

FINAL_KEYS = (("final_obs", "_final_obs"), ("final_observation", "_final_observation"))
FROM_RSL_RL = "wrap it: Collector(rlstash.envs.from_rsl_rl(env), ...)"


def as_device(value: Any) -> torch.device | None:
    """``value`` as a torch device, or None (not one)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return torch.device(value)
    except (TypeError, RuntimeError, ValueError):
        return None


def same_device(actual: torch.device, expected: torch.device) -> bool:
    """A tensor's device (indexed on CUDA) is ``expected``; an ``expected`` without an index
    (``"cuda"``, as many envs name theirs) takes any index of its type."""
    if actual.type != expected.type:
        return False
    return expected.index is None or actual.index == expected.index


def find_device(env: Any) -> tuple[torch.device | None, tuple[str, ...]]:
    """Where a (wrapped) env's outputs live: ``(device or None for host arrays, the names of
    the wrappers looked through to find it)`` (see the module docstring)."""
    passed: list[str] = []
    layer, seen = env, set()
    while layer is not None and id(layer) not in seen:
        seen.add(id(layer))
        xp = getattr(layer, "_target_xp", None)  # gymnasium's ArrayConversion wrappers
        if xp is not None:
            if getattr(xp, "__name__", "").rpartition(".")[2] != "torch":
                return None, tuple(passed)
            target = getattr(layer, "_target_device", None)
            return as_device(target) or torch.device("cpu"), tuple(passed)
        if hasattr(layer, "device"):  # the layer's own: VectorWrapper forwards no attributes
            return as_device(layer.device), tuple(passed)
        inner = getattr(layer, "env", None)
        if inner is None:
            unwrapped = getattr(layer, "unwrapped", None)
            inner = unwrapped if unwrapped is not layer else None
        if inner is not None:
            passed.append(type(layer).__name__)
        layer = inner
    return None, tuple(passed)


def looks_like_rsl_rl(env: Any) -> bool:
    """rsl_rl's ``VecEnv`` interface (``get_observations``) on an env that is no gymnasium
    ``VectorEnv``."""
    return callable(getattr(env, "get_observations", None)) and not isinstance(env, VectorEnv)


def rsl_rl_refusal(env: Any, what: str) -> TypeError:
    """The error for an rsl_rl-style env given where a gymnasium vector env belongs."""
    return TypeError(
        f"env: {type(env).__name__} {what}: rsl_rl's VecEnv interface (Isaac Lab's "
        "RslRlVecEnvWrapper, Genesis's and legged_gym's envs), not gymnasium's step (obs, "
        "reward, terminated, truncated, info), so its values would be misread (rewards as "
        f"flags); {FROM_RSL_RL}"
    )


def describe(x: Any) -> str:
    """What a value is, for error messages: dtype, shape and device of a tensor or array."""
    if isinstance(x, torch.Tensor):
        return f"a {x.dtype} tensor {list(x.shape)} on {x.device}"
    if isinstance(x, np.ndarray):
        return f"a {x.dtype} array {list(x.shape)}"
    if isinstance(x, Mapping):
        return "a dict {" + ", ".join(f"{k!r}: {describe(v)}" for k, v in x.items()) + "}"
    return f"a {type(x).__name__}"


def split_step(env: Any, result: Any) -> tuple[Any, Any, Any, Any, Any]:
    """gymnasium's five step values, or a TypeError naming what the env returned instead
    (rsl_rl's step tuples: with the fix)."""
    if isinstance(result, tuple) and len(result) == 4 and isinstance(result[3], Mapping):
        raise rsl_rl_refusal(env, "returned 4 values from step, (obs, rewards, dones, extras)")
    if not isinstance(result, tuple) or len(result) != 5:
        n = len(result) if isinstance(result, tuple) else None
        raise TypeError(
            "env.step: expected gymnasium's 5 values (obs, reward, terminated, truncated, "
            f"info), got {describe(result) if n is None else f'{n} values'}; return them so"
        )
    reward, terminated, truncated = result[1:4]
    if reward is None or (_kind(terminated) == "f" and _kind(truncated) in "biu"):
        raise rsl_rl_refusal(
            env,
            "returned (obs, privileged_obs, rewards, dones, extras) from step (the second "
            "value is None, or the third, gymnasium's terminated, holds float rewards and the "
            "fourth integer or bool dones)",
        )
    return result


def _kind(x: Any) -> str:
    """numpy's dtype kind of a tensor or array: ``b`` bool, ``f`` float, ``i``/``u`` int, ..."""
    if not isinstance(x, torch.Tensor):
        return np.asarray(x).dtype.kind
    if x.dtype.is_floating_point:
        return "f"
    if x.dtype == torch.bool:
        return "b"
    return "c" if x.dtype.is_complex else "i"


def check_step(
    env: Any, result: Any, num_envs: int, device: torch.device | None
) -> tuple[Any, Any, Any, Any, Any]:
    """A first step's values checked: the tuple (:func:`split_step`), ``reward`` real-valued
    and ``terminated``/``truncated`` bool, each ``[N]``, on ``device`` (None: host arrays),
    ``info`` a dict. Returns the five values."""
    obs, reward, terminated, truncated, info = split_step(env, result)
    check_vector("reward", reward, num_envs, device, "fiu", "a real-valued")
    check_vector("terminated", terminated, num_envs, device, "b", "a bool")
    check_vector("truncated", truncated, num_envs, device, "b", "a bool")
    if not isinstance(info, Mapping):
        raise TypeError(f"info: expected a dict (gymnasium's step info), got {describe(info)}")
    return obs, reward, terminated, truncated, info


def check_vector(
    name: str, x: Any, n: int, device: torch.device | None, kinds: str, what: str
) -> None:
    """One value per env: shape ``[n]``, a dtype of ``kinds``, on ``device`` (None: host)."""
    if device is None and not isinstance(x, (torch.Tensor, Mapping, type(None))):
        x = np.asarray(x)
    where = f" on {device}" if device is not None else " (host array)"
    expected = f"{what} {'tensor' if device is not None else 'array'} of shape [{n}]{where}"
    if device is not None and not isinstance(x, torch.Tensor):
        fix = f"return a torch tensor on {device}, the env's device"
    elif device is not None and not same_device(x.device, device):
        fix = f"return it on {device}, the env's device"
    elif device is None and (isinstance(x, Mapping) or x is None):
        fix = "return one value per env"
    elif device is None and isinstance(x, torch.Tensor) and x.device.type != "cpu":
        fix = (
            f"the env steps on {x.device} but has no 'device' attribute (nor an env inside "
            "its wrappers), so the Collector took the host path; give it one"
        )
    elif tuple(x.shape) == (n, 1):
        fix = f"squeeze it to [{n}] in the env ({name}.squeeze(-1))"
    elif tuple(x.shape) != (n,):
        fix = f"return one value per env, shape [{n}]"
    elif _kind(x) not in kinds:
        fix = "return bool flags (.bool())" if kinds == "b" else "return float rewards (.float())"
    else:
        return
    raise ValueError(f"{name}: expected {expected}, got {describe(x)}; {fix}")


def check_host_obs(obs: Any, n: int) -> None:
    """Observations the host path can take: one numeric array ``[n, ...]`` (not a dict, not a
    tensor on an accelerator), else a TypeError naming the field and the fix."""
    if isinstance(obs, Mapping):
        raise TypeError(
            f"observations: got {describe(obs)} from an env the Collector steps on the host (it "
            "has no 'device' attribute, nor an env inside its wrappers), which takes one "
            "array; a batched torch env: give it (or its outermost wrapper) a 'device' "
            "attribute and its dicts of tensors stay there; a numpy env: flatten them "
            "(gymnasium.wrappers.vector.FlattenObservation)"
        )
    if isinstance(obs, torch.Tensor) and obs.device.type != "cpu":
        raise TypeError(
            f"observations: got {describe(obs)} from an env with no 'device' attribute (nor an "
            "env inside its wrappers), so the Collector took the host path and every step "
            f"would cross to the host; give the env a 'device' attribute ({str(obs.device)!r})"
        )
    try:
        shape = tuple(obs.shape) if isinstance(obs, torch.Tensor) else np.shape(obs)
        kind = _kind(obs)
    except ValueError:  # ragged: a tuple of differently shaped arrays
        shape, kind = (), "O"
    if kind not in "biuf" or not shape or shape[0] != n:
        raise TypeError(
            f"observations: expected a numeric array [{n}, ...] (one row per env), got "
            f"{describe(obs)}; return observations batched along the first dimension"
        )


def check_leading(name: str, t: torch.Tensor, n: int) -> None:
    """An observation field of a batched env: leading dimension ``n``."""
    if t.dim() == 0 or t.shape[0] != n:
        raise ValueError(
            f"{name}: expected [{n}, ...] (one row per env: num_envs = {n}), got "
            f"{describe(t)}; return observations batched along the first dimension"
        )


class UndeclaredNextStep:
    """Watches an env that does not declare ``metadata["autoreset_mode"]`` (so it is read as
    gymnasium's default, NextStep) for evidence of same-step autoreset, and refuses on it:

    * ``info`` carries final observations (:data:`FINAL_KEYS`): :meth:`info`;
    * the step right after an episode end is no reset step, which in NextStep mode has
      reward 0 and no flags: :meth:`rows`, once per batch (on an accelerator one blocking
      read per batch, paid only by envs that leave their mode undeclared).
    """

    def __init__(self, ended: Any) -> None:
        self.ended = ended  # [N] bool, a tensor or an array: the last step's done flags

    def reset(self) -> None:
        self.ended[...] = False

    def info(self, info: Mapping) -> None:
        for key, _ in FINAL_KEYS:
            if key in info:
                raise ValueError(
                    f"env: info has {key!r}, final observations reported with the step that "
                    "ended an episode (same-step autoreset), but the env does not declare "
                    "metadata['autoreset_mode'] and was read as gymnasium's default, NextStep; "
                    f"{_DECLARE}"
                )

    def rows(self, reward: Any, terminated: Any, truncated: Any) -> None:
        """Steps ``[T, N]`` (tensors or arrays, like ``ended``): after an end, a reset step."""
        done = terminated | truncated
        after = done[:-1]
        first = self.ended & ((reward[0] != 0) | done[0])
        rest = after & ((reward[1:] != 0) | done[1:])
        self.ended = done[-1].clone() if isinstance(done, torch.Tensor) else done[-1].copy()
        if not (bool(first.any()) or bool(rest.any())):
            return
        t, i = _first_true(first, rest)
        raise ValueError(
            f"env: env {i} ended an episode and its next step (row {t} of the batch) has "
            f"reward {float(reward[t][i])!r}, done {bool(done[t][i])}: no reset step as in "
            "NextStep autoreset (reward 0, no flags), so the env resets within step "
            "(SameStep); it does not declare metadata['autoreset_mode'] and was read as "
            f"gymnasium's default, NextStep; {_DECLARE}"
        )


_DECLARE = (
    "declare it: env.metadata['autoreset_mode'] = gymnasium.vector.AutoresetMode.SAME_STEP, "
    "reporting final observations in info['final_obs'] (or NEXT_STEP, if that is what it "
    f"does; an rsl_rl-style env: {FROM_RSL_RL})"
)


def _first_true(first: Any, rest: Any) -> tuple[int, int]:
    """(row, env) of the first violation: row 0 from ``first`` [N], rows 1.. from ``rest``."""
    if bool(first.any()):
        return 0, int(np.flatnonzero(_host(first))[0])
    t, i = np.nonzero(_host(rest))
    return int(t[0]) + 1, int(i[0])


def _host(x: Any) -> np.ndarray:
    return x.cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
