"""Argument checks shared by the samplers (each raises ValueError/TypeError naming the field)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlstash.core import SampleContext
from rlstash.core import check_capacity as check_capacity  # the one check, re-exported

REJECTION_ROUNDS = 8  # redraws before an exact (O(capacity)) fallback


def check_batch_size(batch_size: Any) -> None:
    if type(batch_size) is int and batch_size > 0:
        return
    if not isinstance(batch_size, int | np.integer) or isinstance(batch_size, bool):
        raise TypeError(f"batch_size: expected an int, got {type(batch_size).__name__}")
    if batch_size <= 0:
        raise ValueError(f"batch_size: expected >= 1, got {batch_size}")


def check_ctx(ctx: SampleContext, capacity: int) -> None:
    """Cheap consistency checks of a sample context (attribute reads only)."""
    if (
        ctx.valid is None
        and ctx.capacity == capacity
        and 0 < ctx.size <= capacity
        and 0 <= ctx.cursor < capacity
    ):
        return  # the common case, in one expression
    if not capacity:
        raise RuntimeError("sampler: call reset(capacity) before sampling")
    if ctx.capacity != capacity:
        raise ValueError(
            f"ctx.capacity: the sampler was reset for {capacity} rows, got {ctx.capacity}"
        )
    if not 0 <= ctx.size <= capacity:
        raise ValueError(f"ctx.size: expected 0 <= size <= {capacity}, got {ctx.size}")
    if ctx.size == 0:
        raise ValueError("cannot sample from an empty buffer (size 0); write rows first")
    if not 0 <= ctx.cursor < capacity:
        raise ValueError(f"ctx.cursor: expected 0 <= cursor < {capacity}, got {ctx.cursor}")
    v = ctx.valid
    if v is not None and (
        not isinstance(v, np.ndarray) or v.dtype != np.bool_ or v.shape != (capacity,)
    ):
        got = f"{v.dtype}{list(v.shape)}" if isinstance(v, np.ndarray) else type(v).__name__
        raise ValueError(f"ctx.valid: expected a numpy bool[{capacity}] mask or None, got {got}")


def check_float(name: str, value: Any, low: float, strict: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise TypeError(f"{name}: expected a number, got {type(value).__name__}")
    value = float(value)
    if not np.isfinite(value) or value < low or (strict and value == low):
        rule = ">" if strict else ">="
        raise ValueError(f"{name}: expected a finite number {rule} {low}, got {value!r}")
    return value


def check_state(state: Any, kind: str, capacity: int) -> None:
    if not isinstance(state, dict) or state.get("kind") != kind:
        got = state.get("kind") if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"state: expected a {kind!r} sampler state, got {got!r}")
    if state.get("capacity") != capacity:
        raise ValueError(
            f"state: the saved sampler has capacity {state.get('capacity')}, this one {capacity}"
        )


def as_numpy(value: Any, name: str) -> np.ndarray:
    """A host numpy array from a numpy array, a torch tensor (detached, copied to host) or a list."""
    if isinstance(value, torch.Tensor):
        if value.requires_grad:
            value = value.detach()
        if not value.is_cpu:
            value = value.cpu()  # an explicit, synchronizing device-to-host copy
        return value.numpy()
    arr = np.asarray(value)
    if arr.dtype == object or arr.dtype.kind in "USV":
        raise TypeError(f"{name}: expected a numeric array or tensor, got {type(value).__name__}")
    return arr
