"""TensorStorage: one preallocated tensor per field, on any torch device.

Rows live in ``tensors[name]`` of shape ``[capacity, *field.shape]`` and the field's dtype.
The byte footprint is planned and checked against free memory *before* allocating
(invariant I2). Writes validate the whole batch first, so a bad batch writes nothing (I8).
Reads and writes are those of :class:`~rlstash.storage.arrays.ArrayStorage` (numpy views on
the CPU, torch ops on other devices), which :class:`~rlstash.storage.disk.MemmapStorage`
shares over memory-mapped files.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from rlstash.core import check_capacity
from rlstash.device import resolve_device
from rlstash.memory import plan
from rlstash.spec import Spec
from rlstash.storage.arrays import (
    _CARRIERS,
    ArrayStorage,
    as_spec,
    numpy_view,
    put_rows,
    spec_mismatch,
)
from rlstash.storage.disk_layout import read_data


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zero tensor; on the CPU allocated by numpy and touched at once.

    numpy asks the kernel for transparent huge pages on large arrays (``madvise``), torch's
    allocator does not: with 2 MB pages a random gather from gigabytes of rows misses the
    TLB far less (measured ~5-8% faster on 900 KB batches from 2.8 GB). ``fill(0)`` commits
    the memory now, as ``torch.zeros`` does, so a shortage shows at creation.
    """
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    carrier = _CARRIERS.get(dtype, dtype)  # numpy has no bfloat16
    arr = np.empty(shape, dtype=numpy_view(torch.empty(0, dtype=carrier)).dtype)
    arr.fill(0)
    t = torch.from_numpy(arr)
    return t if carrier == dtype else t.view(dtype)


class TensorStorage(ArrayStorage):
    """One tensor ``[capacity, *field.shape]`` per field on ``device``, zero-filled.

    The footprint is planned and checked before allocating; with ``allow_overcommit=False``
    a storage that does not fit raises :class:`~rlstash.memory.InsufficientMemoryError`
    naming the bytes needed and free and the fix.
    """

    def __init__(
        self,
        spec: Spec | Mapping,
        capacity: int,
        device: str | torch.device = "cpu",
        allow_overcommit: bool = False,
    ) -> None:
        self.spec = as_spec(spec)
        self.capacity = check_capacity(capacity)
        self.device = resolve_device(device, "device", allow_none=False)
        self.plan = plan(self.spec, capacity, "ram", self.device).check(allow_overcommit)
        tensors = {
            name: _zeros((capacity, *f.shape), f.dtype, self.device)
            for name, f in self.spec.items()
        }  # [capacity, *shape] each
        arrays = None
        if self.device.type == "cpu":
            arrays = {name: numpy_view(t) for name, t in tensors.items()}
        self._bind(tensors, arrays)

    def __repr__(self) -> str:
        return (
            f"TensorStorage({self.spec!r}, capacity={self.capacity}, device={str(self.device)!r})"
        )

    def state_dict(self) -> dict[str, Any]:
        """``{"kind", "spec", "capacity", "device", "data"}``; CPU data are references, not copies."""
        self._check_open()
        data = {k: t if t.device.type == "cpu" else t.to("cpu") for k, t in self.tensors.items()}
        return {
            "kind": "TensorStorage",
            "spec": self.spec.to_dict(),
            "capacity": self.capacity,
            "device": str(self.device),
            "data": data,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Copy the data of a :meth:`state_dict` in, after checking its spec and capacity.

        A :class:`~rlstash.storage.disk.MemmapStorage` state (a ``path``, no ``data``) is read
        from its files.
        """
        self._check_open()
        if "data" not in state and "path" in state:
            state = {**state, "data": read_data(state)}
        self._load_arrays(state)

    def close(self) -> None:
        """Drop the tensors (idempotent); reads and writes then raise."""
        self.tensors, self._arrays, self._np_fields, self._np_write = {}, None, None, None
        self._out_key, self._out_arrays, self._put_arrays = None, [], None
        self._pool.clear()
        self._closed = True

    def __enter__(self) -> TensorStorage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = [
    "ArrayStorage",
    "TensorStorage",
    "as_spec",
    "numpy_view",
    "put_rows",
    "spec_mismatch",
]
