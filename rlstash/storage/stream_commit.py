"""Commit records of a disk :class:`~rlstash.storage.stream.StreamStorage`'s lanes: nothing
completed is lost on a crash.

A disk stream's directory holds the slots (a :class:`~rlstash.storage.disk.MemmapStorage`:
field files, ``meta.json``, ``commit.rec``), its settings (``stream.npz``, written once at
creation) and its lanes' bookkeeping::

    lanes.bin   flags [N * L] uint8, episode positions [N * L] uint8 (the slots' own, updated
                in place), then 4 copies of the per-lane arrays, int64 [5, N] each:
                count, floor, next_ep, reserved, pending
    lanes.rec   4096 bytes: commit records (:class:`~rlstash.storage.disk_layout.CommitLog`,
                the design of ``commit.rec``); the record in slot ``i`` names copy ``i``

Commit order (invariant I7), the one of ``MemmapStorage``: the slots' data and flags are
written into the memory maps first; then the per-lane arrays go into the copy of the record
slot that is written next, and the record itself last (both stores into shared maps, no system
call). A record counts only when whole, and the next write never goes to the slot of the
newest record, so after a SIGKILL at any moment reopening finds the lanes of the last
completed operation (``extend``, ``end_episodes``, an ``open_steps`` commit) with every slot it
counts. Before an operation overwrites slots that are alive (a full ring), a record first
vouches for the slots it will write (``reserved``): reopening drops those as possibly torn
(:meth:`~rlstash.storage.lanes.Lanes.drop_unvouched`). Flags of alive slots changed by an
operation that did not complete are those the reopened stream's first ``end_episodes`` sets
anyway (the step from each lane's last slot dropped, the one before it truncated).

``flush``/``close`` msync the data and ``lanes.bin`` and then write a *synced* record, the one
used after a power loss (live records of another boot are ignored): durability is that of
``MemmapStorage``, a killed process loses nothing completed, a power loss what came after the
last ``flush``/``close``. Both files are reserved in full at creation (invariant I2).

A backing whose data do not reach the disk on every write (a TieredStorage over a disk cold
tier) commits only when it is flushed, vouching for ``margin`` more slots per lane each time.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from rlstash.storage.disk_layout import COMMIT_BYTES, Commit, CommitLog, create_commit_file

LANES_BIN = "lanes.bin"
LANES_REC = "lanes.rec"
PER_LANE = ("count", "floor", "next_ep", "reserved", "pending")  # rows of a copy
_ALIGN = 64


def _copies_at(num_envs: int, L: int) -> int:
    return -(-2 * num_envs * L // _ALIGN) * _ALIGN


def lanes_file_bytes(num_envs: int, L: int) -> int:
    """Bytes of ``lanes.bin``: two per slot, then 4 copies of 5 int64 per lane."""
    return _copies_at(num_envs, L) + 4 * len(PER_LANE) * 8 * num_envs


def disk_bytes(num_envs: int, L: int) -> dict[str, int]:
    """What the lanes' bookkeeping takes on disk, by file (for the memory plan)."""
    return {LANES_BIN: lanes_file_bytes(num_envs, L), LANES_REC: COMMIT_BYTES}


def _damaged(file: Path, what: str) -> ValueError:
    return ValueError(
        f"path: {file} is damaged: {what}. Fix: restore the directory from a copy, or delete "
        "it and start a new stream"
    )


class LaneLog:
    """``lanes.bin`` and ``lanes.rec`` of a stream directory, memory-mapped (module docstring).

    :attr:`flags` and :attr:`ep` are the slots' arrays (a :class:`~rlstash.storage.lanes.Lanes`
    works on them in place); :meth:`commit` stores the per-lane arrays and a record.
    """

    def __init__(self, path: Path, num_envs: int, L: int) -> None:
        self.path, self.num_envs, self.L = path, num_envs, L
        file, size = path / LANES_BIN, lanes_file_bytes(num_envs, L)
        got = file.stat().st_size if file.exists() else None
        if got != size:
            what = "it is missing" if got is None else f"it has {got:,} bytes"
            raise _damaged(file, f"{what}, expected {size:,} for {num_envs} lanes of {L} slots")
        self._map = np.memmap(file, dtype=np.uint8, mode="r+", shape=(size,))
        m = self._map.view(np.ndarray)
        slots, at = num_envs * L, _copies_at(num_envs, L)
        self.flags, self.ep = m[:slots], m[slots : 2 * slots]
        self._copies = m[at:].view(np.int64).reshape(4, len(PER_LANE), num_envs)
        self._log = CommitLog(path / LANES_REC)
        self._rec = Commit(extra=None)

    @classmethod
    def create(cls, path: Path, num_envs: int, L: int) -> LaneLog:
        """Reserve both files in full (``lanes.rec`` last: its presence means both are whole),
        replacing any left by an interrupted creation."""
        (path / LANES_REC).unlink(missing_ok=True)
        fd = os.open(path / LANES_BIN, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.posix_fallocate(fd, 0, lanes_file_bytes(num_envs, L))
        finally:
            os.close(fd)
        create_commit_file(path / LANES_REC)
        return cls(path, num_envs, L)

    def read(self) -> dict[str, np.ndarray] | None:
        """The per-lane arrays of the newest record, checked, or None when there is none."""
        rec = self._log.read()
        if rec is None:
            return None
        c = self._copies[self._log.slot]
        count, floor, next_ep, reserved, pending = (c[i].copy() for i in range(len(PER_LANE)))
        ok = (
            int(count[0]) == rec.total
            and (count >= 0).all()
            and (floor >= 0).all()
            and (floor <= count).all()
            and (reserved >= count).all()
            and (reserved <= count + self.L).all()
            and (next_ep >= 0).all()
            and np.isin(pending, (0, 1)).all()
        )
        if not ok:
            raise _damaged(
                self.path / LANES_BIN,
                f"the lanes of record {self._log.slot} in {LANES_REC} are out of range "
                f"(count {count.tolist()[:8]}, floor {floor.tolist()[:8]}, reserved "
                f"{reserved.tolist()[:8]})",
            )
        return {
            "count": count,
            "floor": floor,
            "next_ep": next_ep,
            "reserved": reserved,
            "pending": pending != 0,
        }

    def commit(self, lanes: Any, synced: bool = False) -> None:
        """Store the per-lane arrays of ``lanes`` into the next record slot's copy, then the
        record. ``synced``: msync ``lanes.bin`` first and the record after (flush/close)."""
        c = self._copies[self._log.next_slot(synced)]
        c[:4] = lanes.per_lane  # count, floor, next_ep, reserved
        c[4] = lanes.pending
        rec = self._rec
        rec.total = int(c[0, 0])  # checked against the copy when read
        if synced:
            self._map.flush()
        self._log.write(rec, None, synced)
        if synced:
            self._log.sync()

    def commit_empty(self) -> None:
        """Commit lanes that hold nothing (before data are replaced wholesale: a load)."""
        n = self.num_envs
        self.commit(SimpleNamespace(per_lane=np.zeros((4, n), np.int64), pending=np.zeros(n)))

    def close(self) -> None:
        """Release both maps (idempotent)."""
        self._log.close()
        self.flags = self.ep = self._copies = np.zeros(0, np.uint8)
        self._map = None


__all__ = ["LANES_BIN", "LANES_REC", "LaneLog", "disk_bytes", "lanes_file_bytes"]
