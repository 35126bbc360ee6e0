"""How a :class:`~rlstash.storage.stream.StreamStorage` opens its parts: the checks of a
backing, device and path that go together, the backing storage itself with its lanes (and,
beside a disk backing, their commit records), and the backing of a saved state.

::

    backing             storage            lanes                  commit records
    "ram"               TensorStorage      new, in RAM            none
    FrameCompression    FrameBacking       new, in RAM            none
    "disk"              MemmapStorage      on lanes.bin (mapped)  lanes.rec
    factory             what it returns    new (no path) or on lanes.bin (with a path)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from rlstash.core import Storage
from rlstash.device import resolve_device
from rlstash.spec import Spec
from rlstash.storage.disk import MemmapStorage
from rlstash.storage.frame_backing import FrameBacking
from rlstash.storage.frames import FrameCompression, frame_fields
from rlstash.storage.lanes import Lanes
from rlstash.storage.ram import TensorStorage
from rlstash.storage.stream_commit import LaneBooks, check_dir, open_books
from rlstash.storage.stream_spec import obs_names

LanesOf = Callable[..., Lanes]  # (slots=None) -> Lanes: the stream's lanes, on given slot arrays


def check_place(
    backing: Any, device: Any, path: str | os.PathLike | None, slot_spec: Spec
) -> tuple[Path | None, bool]:
    """Refuse a backing, device and path that do not go together; returns the absolute
    path (or None) and whether a stream there resumes (refusing what is no stream)."""
    dev = resolve_device(device, "device", allow_none=False)
    if isinstance(backing, FrameCompression):
        if path is not None or dev.type != "cpu":
            raise ValueError(
                f"backing: compressed frames live in host RAM (no path, device 'cpu'), got "
                f"path={path!r}, device={str(device)!r}; deliver batches to a GPU with "
                "ReplayBuffer(device=...)"
            )
        obs_keys = obs_names(slot_spec)
        if not frame_fields(slot_spec, obs_keys):
            raise ValueError(
                f"backing: FrameCompression compresses uint8 pixel obs fields (2+ dims), but "
                f"the obs fields are {[slot_spec[k].describe() for k in obs_keys]}; "
                "use backing='ram'"
            )
    elif backing == "disk":
        if path is None:
            raise ValueError("path: backing='disk' needs a directory path, got None")
        if dev.type != "cpu":
            raise ValueError(
                f"device: a disk backing lives on the CPU, got {str(device)!r}; deliver "
                "batches to a device with ReplayBuffer(device=...)"
            )
    elif backing != "ram" and not callable(backing):
        raise ValueError(f"backing: expected 'ram', 'disk' or a factory, got {backing!r}")
    if path is None or backing == "ram":
        return None, False
    path = Path(path).absolute()
    return path, check_dir(path)


def open_backing(
    backing: Any,
    slot_spec: Spec,
    lanes_of: LanesOf,
    device: Any,
    place: tuple[Path | None, bool],
    overcommit: bool,
    config: dict[str, Any],
) -> tuple[Storage, Lanes, LaneBooks | None]:
    """The backing storage of ``config["capacity"]`` slots of ``slot_spec``, the lanes
    (``lanes_of(slots)``) and, at a path (``place``: the path and whether it resumes, from
    :func:`check_place`), their commit records beside it."""
    path, resume = place
    capacity = int(config["capacity"])
    if isinstance(backing, FrameCompression):
        keys, lanes = frame_fields(slot_spec, obs_names(slot_spec)), lanes_of()
        return FrameBacking(slot_spec, lanes, backing, keys, overcommit), lanes, None
    if backing == "ram":
        return TensorStorage(slot_spec, capacity, device, overcommit), lanes_of(), None
    if backing == "disk":
        store = MemmapStorage(slot_spec, capacity, path, overcommit)
    else:
        store = backing(slot_spec, capacity)
        if not isinstance(store, Storage) or store.capacity != capacity or store.spec != slot_spec:
            raise ValueError(
                f"backing: the factory must return a storage of spec {slot_spec!r} and "
                f"capacity {capacity}, got {store!r}"
            )
        if path is None:
            return store, lanes_of(), None
    margin = max(2, capacity // int(config["num_envs"]) // 16)  # tiered: steps between flushes
    books = open_books(store, path, resume, config, lanes_of, margin)
    return store, books.lanes, books


def saved_backing(
    state: Mapping[str, Any], device: str | torch.device | None
) -> tuple[Any, Any, Any, bool]:
    """What rebuilds the backing of a stream's ``state_dict``: ``(backing, device, path,
    load)``, where ``load`` says the state's data must then be loaded (a RAM backing is
    reallocated; a disk one reopens its directory)."""
    saved = state["backing"]
    kind = saved.get("kind")
    if kind == "FrameBacking":
        return FrameCompression(**state["config"]["frames"]), "cpu", None, True
    if kind == "MemmapStorage":
        return "disk", "cpu", saved["path"], False
    if kind == "TieredStorage" and saved["cold"].get("kind") == "MemmapStorage":
        return _tiered_factory(saved, device), "cpu", saved["cold"]["path"], False
    if kind != "TensorStorage":
        raise TypeError(f"state: cannot rebuild a {kind} backing")
    return "ram", device or state["device"], None, True


def _tiered_factory(
    state: Mapping[str, Any], device: str | torch.device | None
) -> Callable[[Spec, int], Storage]:
    """Reopens a TieredStorage's disk cold tier under an empty hot tier (on ``device`` or the
    saved one); the stream's lanes beside it say which slots hold data."""
    from rlstash.storage.tiered import TieredStorage

    def make(spec: Spec, capacity: int) -> Storage:
        hot = TensorStorage(spec, int(state["hot"]["capacity"]), device or state["hot"]["device"])
        cold = MemmapStorage(spec, capacity, state["cold"]["path"])
        return TieredStorage(hot, cold, block=int(state["block"]))

    return make


__all__ = ["check_place", "open_backing", "saved_backing"]
