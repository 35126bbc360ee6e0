"""Actions are checked against the action space in the pool's process (torch-free).

An action outside the space would fail inside its env, in a worker (CartPole asserts, a table
lookup goes out of range): that worker would be restarted, the episodes of all its envs cut,
and one of ``max_restarts`` used up, for what is a bug in the caller's code. The pool checks
first, vectorized over the envs, and refuses with the env indices named; nothing is sent.

* Discrete, MultiDiscrete, MultiBinary: exact membership (``start <= a < start + n``; 0/1).
* Box: NaN is refused; values outside the bounds pass, as in gymnasium's vector envs (many
  envs clip, and a policy squashed into the bounds can exceed one by a rounding error).
* Spaces that are not laid out in shared memory (Text, Graph, Sequence, OneOf, custom):
  ``single_space.contains(action)`` per env.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

SHOWN = 5  # envs named in one error message


def leaf_spaces(space: spaces.Space) -> list[spaces.Space]:
    """The leaf spaces of ``space`` in :func:`rlstash.envs.shm.space_leaves` order."""
    if isinstance(space, spaces.Dict):
        return [leaf for s in space.spaces.values() for leaf in leaf_spaces(s)]
    if isinstance(space, spaces.Tuple):
        return [leaf for s in space.spaces for leaf in leaf_spaces(s)]
    return [space]


def bad_rows(space: spaces.Space, values: np.ndarray) -> np.ndarray:
    """Indices of the rows of ``values`` ([N, *leaf shape]) outside the leaf ``space``."""
    if isinstance(space, spaces.Discrete):
        start = int(space.start)
        bad = (values < start) | (values >= start + int(space.n))
    elif isinstance(space, spaces.MultiDiscrete):
        bad = (values < space.start) | (values >= space.start + space.nvec)
    elif isinstance(space, spaces.MultiBinary):
        bad = (values != 0) & (values != 1)
    elif isinstance(space, spaces.Box) and values.dtype.kind == "f":
        bad = np.isnan(values)
    else:
        return np.zeros(0, dtype=np.int64)
    if bad.ndim > 1:
        bad = bad.reshape(len(bad), -1).any(axis=1)
    return np.flatnonzero(bad)


def check_leaf(space: spaces.Space, values: np.ndarray, name: str) -> None:
    """Raise ValueError naming the envs whose action in ``values`` is outside ``space``."""
    rows = bad_rows(space, values)
    if rows.size:
        raise outside_error(name, space, rows.tolist(), [values[i] for i in rows[:SHOWN]])


def check_each(space: spaces.Space, actions: list[Any], name: str) -> None:
    """Per-env ``space.contains`` for spaces without an array layout."""
    rows = [i for i, a in enumerate(actions) if not _contains(space, a)]
    if rows:
        raise outside_error(name, space, rows, [actions[i] for i in rows[:SHOWN]])


def _contains(space: spaces.Space, action: Any) -> bool:
    """``space.contains(action)``; a ``contains`` that raises on the value cannot judge it:
    the action passes (the env decides), as it would in gymnasium's vector envs."""
    try:
        return bool(space.contains(action))
    except Exception:  # noqa: BLE001 - a custom space's contains may not handle the type
        return True


def outside_error(name: str, space: spaces.Space, rows: list[int], shown: list[Any]) -> ValueError:
    """The error for actions outside the space: which envs, their values, the space."""
    pairs = ", ".join(f"env {i}: {_short(v)}" for i, v in zip(rows, shown))
    more = f" and {len(rows) - SHOWN} more" if len(rows) > SHOWN else ""
    return ValueError(
        f"{name}: {len(rows)} action(s) outside the action space {space} ({pairs}{more}); "
        "nothing was sent to the envs. Fix the policy's output (e.g. clip or map it into "
        "the space)"
    )


def _short(value: Any) -> str:
    if isinstance(value, np.ndarray):
        text = np.array2string(value, threshold=8)
    elif isinstance(value, np.generic):
        text = repr(value.item())
    else:
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
