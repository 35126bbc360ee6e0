"""Row layouts of :class:`~rlstash.storage.stream.StreamStorage` saves, and the conversion
of saves made before slot-major rows.

In stream format 2, ``layout = "slot_major"`` (saved in the stream's config: ``stream.npz``
beside a disk stream, ``state_dict()["config"]`` of a RAM one), slot number ``s`` of lane
``e`` lives at row ``(s % L) * N + e``: the N lanes' slots of one step are one contiguous block of rows. Saves
without a ``layout`` key are format 1, *lane-major*, rows ``e * L + s % L`` (rlstash before).

* A lane-major ``state_dict`` (RAM, or compressed frames) is converted when it is loaded
  (one permutation of the rows of each field and of the per-slot flags, in memory).
* A lane-major disk directory is refused when it is opened (its data would have to be
  rewritten): :func:`convert_lane_major` copies it once into a new directory, slot-major,
  leaving the old one as it is.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from rlstash import autoreset as modes
from rlstash.spec import Spec
from rlstash.storage.disk_layout import open_maps
from rlstash.storage.stream import ReadSpec, StreamStorage
from rlstash.storage.stream_commit import NPZ, read_npz
from rlstash.storage.stream_format import (
    LANE_MAJOR,
    LAYOUT,
    PER_SLOT,
    convert_state,
    lane_to_slot_major,
    refuse_lane_major,
    saved_layout,
)

CHUNK_BYTES = 64 << 20  # disk conversion: rows copied per step, at most about this many bytes


def convert_lane_major(src: str | os.PathLike, dst: str | os.PathLike) -> Path:
    """Copy the lane-major disk stream at ``src`` into a new slot-major one at ``dst``.

    ``src`` is only read (a stream directory whose ``stream.npz`` has no ``layout``; its
    writer must be closed). ``dst`` must not exist or be empty. The copy holds exactly the
    transitions that reopening ``src`` would have held; open it with ``StreamStorage(...,
    backing="disk", path=dst)`` and the same settings (or ``ReplayBuffer.load`` of a
    checkpoint, after pointing it at ``dst``). Returns ``dst`` as an absolute path.
    """
    src, dst = Path(src).absolute(), Path(dst).absolute()
    if not (src / NPZ).exists():
        raise ValueError(f"src: {src} holds no {NPZ}: it is not a StreamStorage directory")
    if dst.exists() and any(dst.iterdir()):
        raise ValueError(f"dst: {dst} is not empty; give a new or an empty directory")
    cfg, arrays = read_npz(src)
    if saved_layout(cfg) != LANE_MAJOR:
        raise ValueError(f"src: the stream at {src} is already {saved_layout(cfg)!r}")
    if arrays is None:
        raise ValueError(f"src: {src / NPZ} holds no lanes: it is not a lane-major stream")
    N, cap = int(cfg["num_envs"]), int(cfg["capacity"])
    L = cap // N
    kw = dict(autoreset=modes.BY_TOKEN[cfg["autoreset"]], reads=ReadSpec(**cfg["reads"]))
    store = StreamStorage(
        Spec.from_dict(cfg["spec"]), N, cap, "disk", path=dst,
        stacked_input=cfg["stacked_input"], **kw,
    )  # fmt: skip
    try:
        old = open_maps(src, store.slot_spec, cap, "r")
        row_bytes = max(1, sum(f.row_bytes for f in store.slot_spec.values()))
        step = max(1, CHUNK_BYTES // (row_bytes * N))  # lane positions per copy
        for p in range(0, L, step):
            q = min(L, p + step)
            part = {
                k: torch.from_numpy(
                    np.ascontiguousarray(a.reshape(N, L, *a.shape[1:])[:, p:q].swapaxes(0, 1))
                ).reshape((q - p) * N, *a.shape[1:])
                for k, a in old.items()
            }
            part = {k: v.view(store.slot_spec[k].dtype) for k, v in part.items()}
            store.backing.write(slice(p * N, q * N), part, validate=False)
        for k in PER_SLOT:
            arrays[k] = lane_to_slot_major(arrays[k], N, L)
        store.lanes.load(arrays)
        store.lanes.drop_unvouched()  # as reopening src would: slots it may have overwritten
        store.flush()
    finally:
        store.close()
    return dst


__all__ = [
    "LANE_MAJOR",
    "LAYOUT",
    "PER_SLOT",
    "convert_lane_major",
    "convert_state",
    "lane_to_slot_major",
    "refuse_lane_major",
    "saved_layout",
]
