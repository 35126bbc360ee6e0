"""Read back what an offline W&B run wrote (``<dir>/wandb/offline-run-*/run-<id>.wandb``).

The file is W&B's transaction log: a 7-byte header (``:W&B``, magic 0xBEE1, version 1), then
32 KiB blocks of records (7-byte header: CRC32, length uint16, type FULL/FIRST/MIDDLE/LAST),
each payload a ``wandb_internal_pb2.Record`` protobuf.
"""

from __future__ import annotations

import struct
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


def offline_runs(run_dir: Path) -> list[OfflineRun]:
    """Every offline W&B run written under ``run_dir/wandb``, oldest first."""
    files = sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    return [read(p) for p in files]
