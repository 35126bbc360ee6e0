"""Writes tests/data/lane_major/: StreamStorage saves made by rlstash before slot-major rows
(lane-major, rows ``e * L + s % L``), and the transitions that rlstash read from them.

Run once with the old code first on the path (it was run with the main branch at fc290c9):

    PYTHONPATH=<old checkout> .venv/bin/python tests/data/make_lane_major_saves.py

Files: ``ram.pt`` and ``frames.pt`` (``state_dict()`` of a RAM stream and of one with lz4
frames), ``disk/`` (a closed disk stream), and ``*_reads.pt``: ``{(lane, pos): transition}``
of every valid start as the old code read it (the disk one after reopening, as a reopen
drops the slots the last save did not vouch for). The streams wrapped their rings, with
episode ends, so a mis-mapped row changes the reads.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from rlstash.storage.frames import FrameCompression
from rlstash.storage.stream import ReadSpec, StreamStorage

OUT = Path(__file__).resolve().parent / "lane_major"
N, L, STEPS = 3, 8, 21


def spec(pixels: bool) -> dict:
    obs = ((4, 5), torch.uint8) if pixels else ((2,), torch.float32)
    return {"obs": obs, "action": ((), torch.int64)}


def steps(pixels: bool):
    """The batches every save was filled with: obs encode (env, step), ends at fixed steps."""
    for t in range(STEPS):
        e = np.arange(N)
        if pixels:
            obs = torch.from_numpy(
                (e[:, None, None] * 50 + t + np.zeros((N, 4, 5))).astype(np.uint8)
            )
        else:
            obs = torch.from_numpy(np.stack([e * 1.0, np.full(N, t * 1.0)], 1).astype(np.float32))
        term = torch.from_numpy((t + e) % 7 == 3)
        yield {"obs": obs, "action": torch.from_numpy(e * 100 + t), "reward": torch.full((N,), t * 0.5),
               "terminated": term, "truncated": torch.zeros(N, dtype=torch.bool)}  # fmt: skip


def reads(store: StreamStorage) -> dict:
    """{(lane, pos): transition} of every valid start, by the lane-major rows of the old code."""
    idx = np.flatnonzero(store.valid)
    got = store.read(idx)
    return {
        (int(r) // L, int(r) % L): {k: v[j].clone() for k, v in got.items()}
        for j, r in enumerate(idx)
    }


def main() -> int:
    kw = dict(reads=ReadSpec(n_step=2, gamma=0.5, frame_stack=2))
    if (OUT / "disk").exists():
        shutil.rmtree(OUT / "disk")
    OUT.mkdir(parents=True, exist_ok=True)
    for name, pixels, backing in (("ram", False, "ram"), ("frames", True, FrameCompression("lz4"))):
        store = StreamStorage(spec(pixels), N, N * L, backing=backing, **kw)
        for b in steps(pixels):
            store.extend(b)
        torch.save(store.state_dict(), OUT / f"{name}.pt")
        torch.save(reads(store), OUT / f"{name}_reads.pt")
    store = StreamStorage(spec(False), N, N * L, "disk", path=OUT / "disk", **kw)
    for b in steps(False):
        store.extend(b)
    store.close()
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "disk"
        shutil.copytree(OUT / "disk", copy)
        again = StreamStorage(spec(False), N, N * L, "disk", path=copy, **kw)
        torch.save(reads(again), OUT / "disk_reads.pt")
        again.close()
    print(f"wrote {OUT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
