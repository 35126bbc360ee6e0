"""Storages: preallocated struct-of-arrays, planned before allocation.

- :class:`TensorStorage`: one tensor per field on any torch device (RAM or a GPU).
- :class:`MemmapStorage`: one reserved file per field on disk, resumable.
"""

from collections.abc import Callable
from typing import Any

import torch

from rlstash.spec import Spec
from rlstash.storage.disk import MemmapStorage
from rlstash.storage.ram import ArrayStorage, TensorStorage


def storage_from_state(state: dict[str, Any], device: str | torch.device | None = None) -> Any:
    """Rebuild a storage from its ``state_dict()`` (by its ``kind``, see :func:`register_kind`).

    A RAM storage is reallocated (on ``device`` or its saved device) and filled; a disk
    storage is reopened in place at its path.
    """
    kind = state.get("kind")
    rebuild = _KINDS.get(kind) if isinstance(kind, str) else None
    if rebuild is None:
        raise ValueError(f"storage state: unknown kind {kind!r}; expected one of {sorted(_KINDS)}")
    return rebuild(state, device)


Rebuild = Callable[[dict[str, Any], "str | torch.device | None"], Any]
_KINDS: dict[str, Rebuild] = {}


def register_kind(kind: str, rebuild: Rebuild) -> None:
    """Let a storage kind take part in :func:`storage_from_state`: ``rebuild(state, device)``
    returns the storage a ``state_dict()`` whose ``"kind"`` is ``kind`` describes."""
    _KINDS[kind] = rebuild


def _tensor_storage(state: dict[str, Any], device: str | torch.device | None) -> TensorStorage:
    spec = Spec.from_dict(state["spec"])
    storage = TensorStorage(spec, int(state["capacity"]), device=device or state["device"])
    storage.load_state_dict(state)
    return storage


register_kind("TensorStorage", _tensor_storage)
register_kind("MemmapStorage", lambda state, device: MemmapStorage.open(state["path"]))

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
