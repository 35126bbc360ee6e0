"""Where a :class:`~rlstash.storage.stream.StreamStorage`'s slots live: the backing layer.

The stream's reader and writer see the slots through one small protocol, :class:`SlotRows`,
never through the attributes of a particular storage. :func:`slot_rows` wraps the storage a
stream was built on, once, by its type:

==================  ==============================================================  ========
storage             rows gathered by                                                 in place
==================  ==============================================================  ========
TensorStorage,      one gather per field from its ``tensors`` (numpy ``take`` on the  yes (CPU)
MemmapStorage       CPU, ``index_select`` on a GPU, ordered after its writes: I4)
FrameBacking        frames decoded from their arenas, other fields as above           no
any other storage   one ``read`` of every distinct row needed (a TieredStorage)       no
==================  ==============================================================  ========

"In place" is :meth:`SlotRows.step_tensors`: the slot tensors a collector may fill itself
(:mod:`rlstash.storage.stream_direct`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Protocol

import numpy as np
import torch

from rlstash.core import Index, PersistentStorage, Storage
from rlstash.device import upload
from rlstash.spec import Batch
from rlstash.storage.arrays import ArrayStorage, numpy_view
from rlstash.storage.frame_backing import FrameBacking


class SlotRows(Protocol):
    """The slots of a stream as its reader and writer use them.

    ``gather_rows(req, out, direct)`` returns, for each ``name`` of ``req``, the rows
    ``req[name]`` (an int array of any shape ``[*S]``) of the stored field ``name`` (``next_x``
    reads field ``x``) as a tensor ``[*S, *shape]``; the fields in ``direct`` go straight into
    ``out[name]`` when it fits. ``write(rows, data)`` stores validated slot rows.
    """

    storage: Storage  # the stream's ``backing``
    device: torch.device

    def write(self, rows: Index, data: Batch) -> None: ...

    def gather_rows(
        self, req: Mapping[str, np.ndarray], out: Batch | None, direct: Collection[str]
    ) -> Batch: ...

    def step_tensors(self) -> dict[str, torch.Tensor] | None:
        """The slot tensors ``[capacity, ...]`` a writer may fill in place (contiguous, on
        the CPU), or None where the slots cannot be written so."""
        ...

    def flush(self) -> None: ...


class _Rows:
    """What every backing's rows share: the storage, its device, writes and flush."""

    def __init__(self, storage: Storage) -> None:
        self.storage, self.device = storage, torch.device(storage.device)
        self._persistent = isinstance(storage, PersistentStorage)

    def write(self, rows: Index, data: Batch) -> None:
        """Store validated rows (looked up on the storage each time: it may be wrapped)."""
        self.storage.write(rows, data, validate=False)

    def step_tensors(self) -> dict[str, torch.Tensor] | None:
        return None

    def flush(self) -> None:
        """Sync a storage that keeps its data in files; nothing for one in RAM."""
        if self._persistent:
            self.storage.flush()  # type: ignore[attr-defined]


class ArrayRows(_Rows):
    """Rows of an :class:`~rlstash.storage.arrays.ArrayStorage` (TensorStorage, MemmapStorage):
    one gather per field from its tensors."""

    storage: ArrayStorage

    def gather_rows(
        self, req: Mapping[str, np.ndarray], out: Batch | None, direct: Collection[str]
    ) -> Batch:
        """:meth:`SlotRows.gather_rows`."""
        order = self.storage.order  # a GPU backing: after its writes (I4)
        if order is not None:
            order.before_read()
        res = gather_tensors(self.storage.tensors, req, out, direct)
        if order is not None:
            order.after_read()
        return res

    def step_tensors(self) -> dict[str, torch.Tensor] | None:
        """The storage's tensors when they are on the CPU and contiguous."""
        tensors = self.storage.tensors
        if self.device.type != "cpu" or any(not t.is_contiguous() for t in tensors.values()):
            return None
        return tensors


class FrameRows(_Rows):
    """Rows of a :class:`~rlstash.storage.frame_backing.FrameBacking`: frame fields decoded
    from their arenas, the other fields gathered from its plain tensors."""

    storage: FrameBacking

    def gather_rows(
        self, req: Mapping[str, np.ndarray], out: Batch | None, direct: Collection[str]
    ) -> Batch:
        """:meth:`SlotRows.gather_rows`."""
        frames = self.storage
        res: Batch = {}
        plain = {}
        for name, r in req.items():
            field = name.removeprefix("next_")
            if field in frames.arenas:  # compressed frames: decoded here
                res[name] = frames.gather_frames(field, r, None if out is None else out.get(name))
            else:
                plain[name] = r
        res.update(gather_tensors(frames.tensors, plain, out, direct))
        return {name: res[name] for name in req}  # the order of ``req``

    def flush(self) -> None:
        """Nothing to sync (RAM)."""


class ReadRows(_Rows):
    """Rows of any other storage (e.g. a TieredStorage): one ``read`` of every distinct row
    needed, then each request picked from it."""

    def gather_rows(
        self, req: Mapping[str, np.ndarray], out: Batch | None, direct: Collection[str]
    ) -> Batch:
        """:meth:`SlotRows.gather_rows` (``out`` and ``direct`` unused: one read serves all)."""
        flat = np.concatenate([r.reshape(-1) for r in req.values()])
        uniq, inv = np.unique(flat, return_inverse=True)
        rows, at, res = self.storage.read(uniq), 0, {}
        for name, r in req.items():
            src = rows[name.removeprefix("next_")]
            sel = torch.from_numpy(inv[at : at + r.size]).to(src.device)
            res[name] = src.index_select(0, sel).reshape(*r.shape, *src.shape[1:])
            at += r.size
        return res


def slot_rows(storage: Storage) -> SlotRows:
    """The :class:`SlotRows` of a stream's backing ``storage``, chosen by its type."""
    if isinstance(storage, FrameBacking):
        return FrameRows(storage)
    if isinstance(storage, ArrayStorage):
        return ArrayRows(storage)
    return ReadRows(storage)


def gather_tensors(
    tensors: Mapping[str, torch.Tensor],
    req: Mapping[str, np.ndarray],
    out: Batch | None,
    direct: Collection[str],
) -> Batch:
    """Gather the rows ``req[name]`` of ``tensors[name]`` (``next_x`` reads ``x``); the
    fields in ``direct`` go straight into ``out`` when it fits. CPU rows are bounds-checked
    once per row array (fields share them) and taken with numpy."""
    res: Batch = {}
    checked: set[int] = set()  # the row arrays checked
    sels = _device_rows(tensors, req)
    for name, r in req.items():
        field = name.removeprefix("next_")
        t = tensors[field]
        dst = out_for(out, name, r.size, t) if field in direct else None
        if t.device.type == "cpu":
            a = numpy_view(t)
            o = None if dst is None else numpy_view(dst).reshape(r.size, *a.shape[1:])
            idx = r.reshape(-1)
            if id(r) not in checked and idx.size and (idx.min() < 0 or idx.max() >= len(a)):
                raise IndexError(f"{name}: slots outside [0, {len(a)}): {idx.min()}..{idx.max()}")
            checked.add(id(r))  # every field has the same rows (the capacity)
            # mode="clip" after that check: numpy buffers ``out`` for mode="raise" (~3x slower)
            v = torch.from_numpy(np.take(a, idx, axis=0, out=o, mode="clip"))
            v = v.view(t.dtype) if v.dtype != t.dtype else v
        else:
            sel = sels[id(r)]
            o = None if dst is None else dst.view(r.size, *t.shape[1:])
            v = t.index_select(0, sel) if o is None else torch.index_select(t, 0, sel, out=o)
        res[name] = v.reshape(*r.shape, *t.shape[1:])
    return res


def _device_rows(
    tensors: Mapping[str, torch.Tensor], req: Mapping[str, np.ndarray]
) -> dict[int, torch.Tensor]:
    """The distinct row arrays of ``req`` read from tensors off the CPU, on their device (one
    :func:`~rlstash.device.upload` per device, no host wait), by ``id``."""
    by_device: dict[torch.device, dict[int, np.ndarray]] = {}
    for name, r in req.items():
        dev = tensors[name.removeprefix("next_")].device
        if dev.type != "cpu":
            by_device.setdefault(dev, {})[id(r)] = r.reshape(-1)
    sels: dict[int, torch.Tensor] = {}
    for dev, rows in by_device.items():
        sels.update(zip(rows, upload(list(rows.values()), dev)))
    return sels


def out_for(out: Batch | None, name: str, rows: int, t: torch.Tensor) -> torch.Tensor | None:
    """``out[name]`` when a gather can fill it in place (contiguous, same dtype and device)."""
    dst = None if out is None else out.get(name)
    if dst is None or dst.dtype != t.dtype or dst.device != t.device or not dst.is_contiguous():
        return None
    return dst if dst.numel() == rows * t[0].numel() else None


__all__ = [
    "ArrayRows",
    "FrameRows",
    "ReadRows",
    "SlotRows",
    "gather_tensors",
    "out_for",
    "slot_rows",
]
