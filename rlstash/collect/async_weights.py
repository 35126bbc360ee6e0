"""Policy weights in shared memory: written by the collector, read by every worker.

The block is laid out once from the policy's state dict (``policy_state_dict()`` for agents,
``state_dict()`` for modules; nested dicts are flattened to leaf paths). Tensor leaves are
stored as raw bytes (any dtype, bfloat16 included); other leaves (ints, strings: an agent's
``algo`` and ``env_steps``) are pickled into a small fixed area. Nothing is pickled per step:
a worker compares one int64 (the version) between chunks and copies the tensors only when it
changed.

Consistency is a seqlock: the writer makes ``header[seq]`` odd, writes, bumps the version,
makes it even again; a reader copies the tensors into its policy, then checks that ``seq``
did not move (else copies again). No lock or semaphore is shared between processes, so
nothing can leak or stay held by a killed worker.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from rlstash.collect.async_layout import EXTRAS_BYTES, HEADER_EXTRAS, HEADER_SEQ, HEADER_VERSION
from rlstash.core import PolicyWeights
from rlstash.device import torch_dtype
from rlstash.envs.shm import SharedArrays
from rlstash.spec import describe_value, dtype_name

Path = tuple[str, ...]
LOAD_TIMEOUT = 10.0  # seconds a reader retries while the writer keeps writing


def policy_state(policy: Any) -> dict[str, Any] | None:
    """``policy.policy_state_dict()`` (agents), ``policy.state_dict()`` (modules) or None."""
    if isinstance(policy, PolicyWeights):
        return policy.policy_state_dict()
    fn = getattr(policy, "state_dict", None)  # a module's, or a user object's
    return fn() if callable(fn) else None


def load_policy_state(policy: Any, state: dict[str, Any]) -> None:
    """The inverse of :func:`policy_state`."""
    if isinstance(policy, PolicyWeights):
        policy.load_policy_state_dict(state)
    else:
        policy.load_state_dict(state)


def flatten(state: Mapping[str, Any], path: Path = ()) -> list[tuple[Path, Any]]:
    """Leaves of a nested dict in insertion order: ``[(("nets", "q", "0.weight"), t), ...]``."""
    out: list[tuple[Path, Any]] = []
    for key, value in state.items():
        if isinstance(value, Mapping):
            out += flatten(value, (*path, str(key)))
        else:
            out.append(((*path, str(key)), value))
    return out


def unflatten(leaves: list[tuple[Path, Any]]) -> dict[str, Any]:
    """Nested dicts from ``(path, value)`` leaves."""
    root: dict[str, Any] = {}
    for path, value in leaves:
        node = root
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return root


def weight_spec(state: Mapping[str, Any] | None) -> dict[str, Any]:
    """``{"tensors": [(path, shape, dtype name, nbytes)], "others": [path]}`` of a state dict."""
    tensors, others = [], []
    for path, value in flatten(state or {}):
        if isinstance(value, torch.Tensor):
            dtype = str(value.dtype).removeprefix("torch.")
            nbytes = value.numel() * value.element_size()
            tensors.append((path, tuple(value.shape), dtype, nbytes))
        else:
            others.append(path)
    return {"tensors": tensors, "others": others}


def _name(path: Path) -> str:
    return "/".join(path)


class SharedWeights:
    """The weights block of a mapped segment (see :mod:`rlstash.collect.async_layout`)."""

    def __init__(self, shared: SharedArrays, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.header = shared["weights/header"]  # [4] int64
        self.extras = shared["weights/extras"]  # [EXTRAS_BYTES] uint8
        self.views: list[torch.Tensor] = []
        for i, (_, shape, dtype, _) in enumerate(spec["tensors"]):
            raw = torch.from_numpy(shared[f"weights/{i}"])  # [nbytes] uint8 over shared memory
            self.views.append(raw.view(torch_dtype(dtype)).reshape(shape))

    @property
    def version(self) -> int:
        return int(self.header[HEADER_VERSION])

    # --- the collector's side ---------------------------------------------------------
    def check(self, state: Any) -> tuple[list[torch.Tensor], bytes]:
        """Validate a whole state dict against the layout; its tensors and pickled extras.

        Raises:
            TypeError: ``state`` is not a dict.
            ValueError: keys, shapes or dtypes differ from the layout, or the non-tensor
                leaves pickle to more than ``EXTRAS_BYTES``.
        """
        if not isinstance(state, Mapping):
            raise TypeError(f"state_dict: expected a dict of tensors, got {type(state).__name__}")
        leaves = dict(flatten(state))
        want = [p for p, *_ in self.spec["tensors"]] + list(self.spec["others"])
        missing = [_name(p) for p in want if p not in leaves]
        extra = [_name(p) for p in leaves if p not in set(want)]
        if missing or extra:
            raise ValueError(
                f"state_dict: keys differ from the workers' policy; missing {missing}, "
                f"unexpected {extra}"
            )
        tensors = []
        for path, shape, dtype, _ in self.spec["tensors"]:
            t = leaves[path]
            if (
                not isinstance(t, torch.Tensor)
                or tuple(t.shape) != shape
                or dtype_name(t.dtype) != dtype
            ):
                raise ValueError(
                    f"state_dict[{_name(path)!r}]: expected a tensor of shape {list(shape)} "
                    f"{dtype} (the workers' policy), got {describe_value(t)}"
                )
            tensors.append(t.detach())
        extras = pickle.dumps([leaves[p] for p in self.spec["others"]])
        if len(extras) > EXTRAS_BYTES:
            raise ValueError(
                f"state_dict: its non-tensor values pickle to {len(extras)} bytes, more than "
                f"the {EXTRAS_BYTES} reserved; keep large data in tensors"
            )
        return tensors, extras

    def write(self, state: Any) -> int:
        """Validate (nothing written on error), write, bump the version; the new version."""
        tensors, extras = self.check(state)
        h = self.header
        h[HEADER_SEQ] += 1  # odd: readers wait or retry
        try:
            for view, t in zip(self.views, tensors):
                view.copy_(t)  # a CUDA tensor is copied to the host synchronously
            self.extras[: len(extras)] = np.frombuffer(extras, np.uint8)
            h[HEADER_EXTRAS] = len(extras)
            h[HEADER_VERSION] += 1
        finally:
            h[HEADER_SEQ] += 1  # even: consistent again
        return int(h[HEADER_VERSION])

    # --- a worker's side --------------------------------------------------------------
    def load_into(self, policy: Any, have: int) -> int:
        """Load the weights into ``policy`` if their version differs from ``have``; the
        version now in ``policy``. Retries while the collector writes (seqlock)."""
        h = self.header
        if int(h[HEADER_VERSION]) == have:
            return have
        deadline = time.monotonic() + LOAD_TIMEOUT
        while time.monotonic() < deadline:
            seq = int(h[HEADER_SEQ])
            if seq & 1:
                time.sleep(1e-4)
                continue
            version, n = int(h[HEADER_VERSION]), int(h[HEADER_EXTRAS])
            try:
                others = pickle.loads(self.extras[:n].tobytes()) if n else []
                leaves = [(p, v) for (p, *_), v in zip(self.spec["tensors"], self.views)]
                leaves += list(zip(self.spec["others"], others))
                load_policy_state(policy, unflatten(leaves))  # copies out of shared memory
            except Exception:
                if int(h[HEADER_SEQ]) != seq:
                    continue  # read while being written: try again
                raise
            if int(h[HEADER_SEQ]) == seq:
                return version
        raise TimeoutError(f"policy weights kept changing for {LOAD_TIMEOUT} s while loading")
