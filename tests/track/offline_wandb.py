"""Read back what an offline W&B run wrote (``<dir>/wandb/offline-run-*/run-<id>.wandb``).

The file is W&B's transaction log: a 7-byte header (``:W&B``, magic 0xBEE1, version 1), then
32 KiB blocks of records (7-byte header: CRC32, length uint16, type FULL/FIRST/MIDDLE/LAST),
each payload a ``wandb_internal_pb2.Record`` protobuf.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


@dataclass
class OfflineRun:
    """One offline run file's run record, history keys and rows, config and tags."""

    path: Path
    run_id: str = ""
    project: str = ""
    tags: list[str] = field(default_factory=list)
    resumed: bool = False
    history: list[dict[str, str]] = field(default_factory=list)
    config: dict[str, str] = field(default_factory=dict)

    @property
    def keys(self) -> set[str]:
        return {k for row in self.history for k in row if not k.startswith("_")}


def records(path: Path) -> list[bytes]:
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    pos, out, buf = 7, [], b""
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # the rest of a block too short for a header: padding
            pos += BLOCK - pos % BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == FULL:
            out.append(chunk)
        elif kind == FIRST:
            buf = chunk
        elif kind == MIDDLE:
            buf += chunk
        elif kind == LAST:
            out.append(buf + chunk)
    return out


def read(path: Path) -> OfflineRun:
    from wandb.proto import wandb_internal_pb2 as pb

    run = OfflineRun(path)
    for raw in records(path):
        rec = pb.Record()
        rec.ParseFromString(raw)
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            run.run_id, run.project = rec.run.run_id, rec.run.project
            run.tags = list(rec.run.tags)
            run.resumed = bool(rec.run.resumed)
        elif kind == "history":
            run.history.append(
                {i.key or "/".join(i.nested_key): i.value_json for i in rec.history.item}
            )
        elif kind == "config":
            run.config.update({u.key: u.value_json for u in rec.config.update})
    return run


def offline_runs(run_dir: Path, wait_s: float = 60.0) -> list[OfflineRun]:
    """Every offline W&B run written under ``run_dir/wandb``, oldest first.

    W&B's core service writes the transaction log in its own process, and ``run.finish()`` can
    return before its last block reaches the file (seen on a loaded machine: a file without
    its run record, complete a moment later). So a file is read again, for up to ``wait_s``
    seconds, until it holds its run record."""
    files = sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    return [_complete(p, wait_s) for p in files]


def _complete(path: Path, wait_s: float) -> OfflineRun:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            run = read(path)
        except Exception:  # noqa: BLE001 - a file caught mid-write (empty, a cut record)
            if time.monotonic() > deadline:
                raise
        else:
            if run.run_id or time.monotonic() > deadline:
                return run
        time.sleep(0.2)
