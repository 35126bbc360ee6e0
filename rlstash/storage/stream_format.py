"""Row layouts of :class:`~rlstash.storage.stream.StreamStorage` saves (the stream's lowest
layer: plain arrays in, plain arrays out), and the conversion of a lane-major ``state_dict``.

In stream format 2, ``layout = "slot_major"`` (saved in the stream's config: ``stream.npz``
beside a disk stream, ``state_dict()["config"]`` of a RAM one), slot number ``s`` of lane
``e`` lives at row ``(s % L) * N + e``: the N lanes' slots of one step are one contiguous block
of rows. Saves without a ``layout`` key are format 1, *lane-major*, rows ``e * L + s % L``.
A lane-major disk directory is converted by
:func:`rlstash.storage.stream_layout.convert_lane_major` (above the stream: it opens one).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

LAYOUT = "slot_major"  # rows (s % L) * N + e
LANE_MAJOR = "lane_major"  # rows e * L + s % L: saves without a "layout" key
PER_SLOT = ("flags", "ep")  # lane arrays with one entry per row


def saved_layout(config: Mapping[str, Any]) -> str:
    """The row layout of a saved stream's config (no key: lane-major, the old format)."""
    return str(config.get("layout", LANE_MAJOR))


def lane_to_slot_major(a: Any, num_envs: int, L: int) -> Any:
    """Rows of a lane-major array or tensor ``[N * L, ...]`` in slot-major order (a copy)."""
    if isinstance(a, torch.Tensor):
        return a.reshape(num_envs, L, *a.shape[1:]).transpose(0, 1).reshape(a.shape).clone()
    a = np.asarray(a)
    return np.ascontiguousarray(a.reshape(num_envs, L, *a.shape[1:]).swapaxes(0, 1)).reshape(
        a.shape
    )


def convert_state(state: Mapping[str, Any], num_envs: int, L: int) -> dict[str, Any]:
    """A lane-major stream ``state_dict`` rewritten slot-major (the input is not changed):
    the backing's rows (a TensorStorage's data, or the plain fields of compressed frames,
    whose arenas keep their own per-lane order) and the per-slot lane arrays."""
    from rlstash.storage.disk_layout import read_data

    def rows(backing: Mapping[str, Any]) -> dict[str, Any]:
        data = backing.get("data")
        if data is None and "path" in backing:  # a MemmapStorage state: read its files
            data = read_data(backing)
        if not isinstance(data, Mapping):
            raise ValueError("state: a lane-major save without backing data cannot be converted")
        out = {k: v for k, v in backing.items() if k != "path"}
        out["data"] = {k: lane_to_slot_major(v, num_envs, L) for k, v in data.items()}
        out["kind"] = "TensorStorage" if backing.get("kind") == "MemmapStorage" else out["kind"]
        return out

    backing = dict(state["backing"])
    if backing.get("kind") == "FrameBacking":
        backing["plain"] = rows(backing["plain"])
    else:
        backing = rows(backing)
    lanes = dict(state["lanes"])
    for k in PER_SLOT:
        lanes[k] = lane_to_slot_major(lanes[k], num_envs, L)
    config = {**state["config"], "layout": LAYOUT}
    return {**state, "config": config, "backing": backing, "lanes": lanes}


def refuse_lane_major(path: Path, config: Mapping[str, Any]) -> None:
    """The ValueError for a disk stream saved in another layout, naming the fix."""
    layout = saved_layout(config)
    if layout == LAYOUT:
        return
    if layout == LANE_MAJOR:
        raise ValueError(
            f"path: the stream at {path} was saved by an older rlstash in stream format 1, "
            f"lane-major rows (its stream.npz has no 'layout'); this rlstash reads format 2, "
            f"slot-major rows ('layout': {LAYOUT!r}). "
            f"Convert it once into a new directory with rlstash.storage.stream_layout."
            f"convert_lane_major({str(path)!r}, <new directory>) (the old one is left as it "
            "is), then open the new one"
        )
    raise ValueError(
        f"path: the stream at {path} has row layout {layout!r}; this rlstash reads {LAYOUT!r} "
        f"(and converts {LANE_MAJOR!r} saves): open it with the rlstash that wrote it"
    )


__all__ = [
    "LANE_MAJOR",
    "LAYOUT",
    "PER_SLOT",
    "convert_state",
    "lane_to_slot_major",
    "refuse_lane_major",
    "saved_layout",
]
