"""Small pure helpers of :class:`~rlstash.envs.process_pool.ProcessPoolVectorEnv`: typing
one env's value, the batched observation space, reset masks, action casts (torch-free)."""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium.vector.utils import batch_differing_spaces, batch_space


def element(value: Any) -> Any:
    """One env's value copied out of shared memory, typed as ``space.sample()`` types it:
    numpy scalars for Discrete (0-d rows), arrays otherwise, dicts/tuples kept."""
    if isinstance(value, dict):
        return {k: element(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(element(v) for v in value)
    return value.copy() if isinstance(value, np.ndarray) else value


def batched_obs_space(mode: str | tuple, described: dict, n: int) -> Any:
    """The batched observation space for ``observation_mode``, as AsyncVectorEnv builds it."""
    if isinstance(mode, tuple):
        return mode[0]
    if mode == "different":
        return batch_differing_spaces(described["observation_spaces"])
    return batch_space(described["observation_space"], n)


def is_flat(space: Any) -> bool:
    from gymnasium import spaces

    return not isinstance(space, (spaces.Dict, spaces.Tuple))


def castable(src: np.dtype, dst: np.dtype) -> bool:
    """Numbers may be cast, except floats into integer/bool fields (that would truncate)."""
    if src.kind not in "biuf":
        return False
    return not (src.kind == "f" and dst.kind in "biu")


def pop_reset_mask(options: dict | None, n: int) -> np.ndarray | None:
    if options is None or "reset_mask" not in options:
        return None
    mask = options.pop("reset_mask")
    if not isinstance(mask, np.ndarray) or mask.dtype != np.bool_ or mask.shape != (n,):
        got = f"{type(mask).__name__} {getattr(mask, 'dtype', '')} {getattr(mask, 'shape', '')}"
        raise ValueError(
            f"options['reset_mask']: expected a bool numpy array of shape ({n},), got {got}"
        )
    if not mask.any():
        raise ValueError("options['reset_mask']: expected at least one True value, got none")
    return mask
