"""What a :class:`~rlstash.storage.stream.StreamStorage` stores and rebuilds: the read settings
(:class:`ReadSpec`), the fields ``extend`` takes per env step (:func:`step_spec`), the fields of
its slots (:func:`slot_spec`: one frame per observation when frames are stacked), and a
transition spec seen as a stream step (:func:`transition_step`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from rlstash.spec import Field, Spec
from rlstash.storage.ram import as_spec


@dataclass(frozen=True)
class ReadSpec:
    """What a read rebuilds: ``n_step`` returns with ``gamma``, stacks of ``frame_stack``."""

    n_step: int = 1
    gamma: float = 0.99
    frame_stack: int = 1

    def __post_init__(self) -> None:
        for name, v in (("n_step", self.n_step), ("frame_stack", self.frame_stack)):
            if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= 255:
                raise ValueError(f"{name}: expected an int in [1, 255], got {v!r}")
        if not isinstance(self.gamma, (int, float)) or not 0.0 <= float(self.gamma) <= 1.0:
            raise ValueError(f"gamma: expected a float in [0, 1], got {self.gamma!r}")


def obs_names(spec: Spec) -> list[str]:
    """Observation fields: ``obs`` and ``obs/<key>`` (flattened Dict spaces)."""
    return [k for k in spec if k == "obs" or k.startswith("obs/")]


def step_spec(spec: Spec | Mapping) -> Spec:
    """The fields ``extend`` takes per env: ``spec`` plus reward/terminated/truncated defaults.
    ``reward`` is a float scalar, or ``[A]`` (one per agent of a multi-agent step:
    :mod:`rlstash.storage.stream_agents`; n-step returns are summed per agent)."""
    spec = as_spec(spec)
    if not obs_names(spec) or "action" not in spec:
        raise ValueError(
            f"spec: expected fields 'obs' (or 'obs/<key>') and 'action', got {list(spec)}"
        )
    fields = dict(spec.items())
    fields.setdefault("reward", Field((), torch.float32))
    for name in ("terminated", "truncated"):
        fields.setdefault(name, Field((), torch.bool))
        if fields[name] != Field((), torch.bool):
            raise ValueError(f"spec: field {name!r} must be ():bool, got {fields[name].describe()}")
    if len(fields["reward"].shape) > 1 or not fields["reward"].dtype.is_floating_point:
        raise ValueError(
            f"spec: field 'reward' must be a float scalar (or [A]: one per agent), got "
            f"{fields['reward'].describe()}"
        )
    for name in ("next_obs", "done", "discount", "final_obs"):
        if any(k == name or k.startswith(name + "/") for k in fields):
            raise ValueError(f"spec: field name {name!r} is reserved by StreamStorage")
    return Spec(fields)


def slot_spec(spec: Spec | Mapping, frame_stack: int = 1, stacked_input: bool = False) -> Spec:
    """The backing storage's fields: one frame per obs field, action, reward and extras."""
    spec = step_spec(spec)
    fields: dict[str, Field] = {}
    for name, f in spec.items():
        if name in ("terminated", "truncated"):
            continue  # kept as bits in the lane bookkeeping
        if name in obs_names(spec) and stacked_input:
            if not f.shape or f.shape[0] != frame_stack:
                raise ValueError(
                    f"spec: field {name!r} is {f.describe()}; stacked_input=True expects "
                    f"[frame_stack={frame_stack}, ...] per row"
                )
            f = Field(f.shape[1:], f.dtype)
        fields[name] = f
    return Spec(fields)


def sample_spec(slots: Spec, obs_keys: list[str], frame_stack: int) -> Spec:
    """Per-row fields of a stream's ``read`` of slots ``slots``: obs stacked ``[k, ...]``,
    their ``next_`` twins, flags, discount, the other fields as stored."""
    k, fields = frame_stack, {}
    for name, f in slots.items():
        if name in obs_keys:
            f = Field((k, *f.shape) if k > 1 else f.shape, f.dtype)
            fields["next_" + name] = f
        fields[name] = f
    for name in ("terminated", "truncated", "done"):
        fields[name] = Field((), torch.bool)
    fields["discount"] = Field((), torch.float32)
    return Spec(fields)


def transition_step(spec: Spec | Mapping, frame_stack: int) -> tuple[Spec, int, bool]:
    """A transition spec as a stream step: ``(spec without next_obs, frames, stacked_input)``.

    An observation with at least 3 dims whose first equals ``frame_stack`` (> 1) is taken as
    stacked frames (gymnasium's FrameStackObservation): the stream stores its newest frame only.
    """
    spec = as_spec(spec)
    step = Spec(
        {k: f for k, f in spec.items() if k != "next_obs" and not k.startswith("next_obs/")}
    )
    stacked = frame_stack > 1 and all(
        len(step[k].shape) >= 3 and step[k].shape[0] == frame_stack for k in obs_names(step)
    )
    return step, frame_stack if stacked else 1, stacked
