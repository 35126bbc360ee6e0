"""Dict observations for agents whose networks take one vector: the chosen keys, flattened and
concatenated in a fixed order (Stable-Baselines3's ``MultiInputPolicy`` does the same for
vector keys with its ``CombinedExtractor``).

Isaac Lab's envs return observation groups, ``{"policy": [N, 48], "critic": [N, 60]}``; other
simulators return nested dicts of state vectors. ``obs_keys`` picks what the networks see
(Isaac Lab's actor normally takes only ``"policy"``; the ``"critic"`` group holds privileged
state); by default every key, in the observation's own order. Nested keys are joined by ``/``,
as the collectors name the batch fields (``obs/<key>/<subkey>``).

Image keys (3 or more dimensions) are refused: an MLP over raw pixels is rarely what anyone
wants, and PPO's CNN takes a plain image observation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from rlstash.spec import flat_obs


class ObsLayout:
    """How a dict observation becomes the ``[B, dim]`` float vector the networks take.

    ``shapes``: the shape of each key (nested keys joined by ``/``), in the observation's
    order; ``keys``: the keys to use, in this order (None: all of ``shapes``).
    """

    def __init__(self, shapes: Mapping[str, Sequence[int]], keys: Sequence[str] | None = None):
        self.shapes = {str(k): tuple(int(d) for d in v) for k, v in shapes.items()}
        if not self.shapes:
            raise ValueError("obs_shape: expected a shape per key of the dict observation, got {}")
        chosen = list(self.shapes) if keys is None else [str(k) for k in keys]
        missing = [k for k in chosen if k not in self.shapes]
        if missing or not chosen or len(set(chosen)) != len(chosen):
            raise ValueError(
                f"obs_keys: expected distinct keys of the observation {list(self.shapes)}, got "
                f"{list(chosen)}; give a subset of those keys (or None for all)"
            )
        for k in chosen:
            if len(self.shapes[k]) >= 3:
                raise ValueError(
                    f"obs_keys: key {k!r} is an image {list(self.shapes[k])}; the networks take "
                    "vector keys of a dict observation (flattened and concatenated); leave it "
                    f"out with obs_keys={tuple(c for c in chosen if c != k)!r}"
                )
        self.keys = tuple(chosen)
        self.dim = sum(math.prod(self.shapes[k]) for k in self.keys)

    def flatten(self, obs: Any, lead: int = 1) -> torch.Tensor:
        """``obs`` (a nested dict, or keys joined by ``/``) as ``[*lead dims, dim]`` float32:
        the chosen keys, each flattened past the ``lead`` leading dims, concatenated."""
        if not isinstance(obs, Mapping):
            raise TypeError(
                f"obs: expected a dict observation with keys {list(self.keys)}, got "
                f"{type(obs).__name__}"
            )
        parts = flat_obs("", obs)
        out = []
        for k in self.keys:
            if k not in parts:
                raise ValueError(f"obs: missing key {k!r} (got {sorted(parts)})")
            t = parts[k]
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"obs[{k!r}]: expected a torch.Tensor, got {type(t).__name__}")
            if tuple(t.shape[lead:]) != self.shapes[k] or t.dim() != lead + len(self.shapes[k]):
                raise ValueError(
                    f"obs[{k!r}]: expected shape [{', '.join(['B'] * lead)}, "
                    f"{', '.join(map(str, self.shapes[k]))}], got {list(t.shape)}"
                )
            out.append(t.reshape(*t.shape[:lead], -1).float())
        if len({t.shape[:lead] for t in out}) > 1:
            raise ValueError(
                f"obs: the keys {list(self.keys)} have different leading dims "
                f"{[list(t.shape[:lead]) for t in out]}"
            )
        return out[0] if len(out) == 1 else torch.cat(out, -1)


def obs_shapes(space: Any) -> tuple[int, ...] | dict[str, tuple[int, ...]]:
    """The ``obs_shape`` an agent takes for a gymnasium observation space: its shape, or for a
    ``Dict`` space (nested too) the shape of each key, nested keys joined by ``/`` (the names
    of the ``obs/<key>`` fields in batches and rollouts)."""
    from rlstash.spec import space_fields

    fields = space_fields(space, "obs")
    if list(fields) == ["obs"]:
        return fields["obs"].shape
    return {name[len("obs/") :]: f.shape for name, f in fields.items()}
