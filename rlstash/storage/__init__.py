"""Storages: preallocated struct-of-arrays, planned before allocation.

- :class:`TensorStorage`: one tensor per field on any torch device (RAM or a GPU).
- :class:`MemmapStorage`: one reserved file per field on disk, resumable.
"""

from typing import Any

import torch

from rlstash.spec import Spec
from rlstash.storage.disk import MemmapStorage
from rlstash.storage.ram import ArrayStorage, TensorStorage


def storage_from_state(state: dict[str, Any], device: str | torch.device | None = None) -> Any:
    """Rebuild a storage from its ``state_dict()`` (by its ``kind``).

    A RAM storage is reallocated (on ``device`` or its saved device) and filled; a disk
    storage is reopened in place at its path.
    """
    kind = state.get("kind")
    if kind == "TensorStorage":
        spec = Spec.from_dict(state["spec"])
        storage = TensorStorage(spec, int(state["capacity"]), device=device or state["device"])
        storage.load_state_dict(state)
        return storage
    if kind == "MemmapStorage":
        return MemmapStorage.open(state["path"])
    rebuild = _EXTRA_KINDS.get(str(kind))
    if rebuild is None:
        raise ValueError(
            f"storage state: unknown kind {kind!r}; expected TensorStorage or MemmapStorage"
        )
    return rebuild(state, device)


_EXTRA_KINDS: dict[str, Any] = {}


def register_kind(kind: str, rebuild: Any) -> None:
    """Let another storage module (stream, tiered) take part in :func:`storage_from_state`."""
    _EXTRA_KINDS[kind] = rebuild


from rlstash.storage.bootstrap import BootstrapMask  # noqa: E402
from rlstash.storage.stream import ReadSpec, StreamStorage  # noqa: E402
from rlstash.storage.tiered import TieredStorage  # noqa: E402

__all__ = [
    "ArrayStorage",
    "BootstrapMask",
    "MemmapStorage",
    "ReadSpec",
    "StreamStorage",
    "TensorStorage",
    "TieredStorage",
    "register_kind",
    "storage_from_state",
]
