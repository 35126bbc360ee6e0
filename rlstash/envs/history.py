"""Env factories for workers (torch-free: env workers import this module): observation windows
for history agents, and clipped actions for Gaussian PPO.

``make_windowed(env_id, k)`` is ``gym.make(env_id)`` wrapped in gymnasium's
``FrameStackObservation(k, padding_type="reset")``: each observation is the env's last k
observations ``[k, *obs_shape]``, oldest first, the start of an episode padded with its first
observation. That is exactly how :class:`~rlstash.storage.StreamStorage` rebuilds frame
stacks, so a stream buffer with ``stacked_input=True`` stores each observation once and
samples the very windows the policy acted on.
"""

from __future__ import annotations

from typing import Any


def make_windowed(env_id: str, window: int, **kwargs: Any) -> Any:
    """``gym.make(env_id, **kwargs)`` whose observations are windows of the last ``window``."""
    from gymnasium.wrappers import FrameStackObservation

    from rlstash.envs.registry import make

    if isinstance(window, bool) or not isinstance(window, int) or window < 2:
        raise ValueError(f"window: expected an int >= 2, got {window!r}")
    return FrameStackObservation(make(env_id, **kwargs), window, padding_type="reset")


def make_clipped(env_id: str, **kwargs: Any) -> Any:
    """``gym.make(env_id, **kwargs)`` wrapped in ``ClipAction``: a Gaussian policy's unbounded
    samples are clipped to the action space by the env (as CleanRL does for PPO)."""
    from gymnasium.wrappers import ClipAction

    from rlstash.envs.registry import make

    return ClipAction(make(env_id, **kwargs))
