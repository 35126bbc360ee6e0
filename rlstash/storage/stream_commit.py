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

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from rlstash.atomic import write_atomic
from rlstash.core import Storage
from rlstash.manifest import one_line
from rlstash.storage.arrays import ArrayStorage
from rlstash.storage.disk_layout import COMMIT_BYTES, META, Commit, CommitLog, create_commit_file
from rlstash.storage.lanes import LANE_KEYS, Lanes
from rlstash.storage.stream_format import refuse_lane_major

NPZ = "stream.npz"  # the stream's settings (and, written by rlstash before, its lanes)
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

    def __init__(self, path: Path, num_envs: int, L: int, readonly: bool = False) -> None:
        self.path, self.num_envs, self.L = path, num_envs, L
        file, size = path / LANES_BIN, lanes_file_bytes(num_envs, L)
        got = file.stat().st_size if file.exists() else None
        if got != size:
            what = "it is missing" if got is None else f"it has {got:,} bytes"
            raise _damaged(file, f"{what}, expected {size:,} for {num_envs} lanes of {L} slots")
        self._map = np.memmap(file, dtype=np.uint8, mode="r" if readonly else "r+", shape=(size,))
        m = self._map.view(np.ndarray)
        slots, at = num_envs * L, _copies_at(num_envs, L)
        self.flags, self.ep = m[:slots], m[slots : 2 * slots]
        self._copies = m[at:].view(np.int64).reshape(4, len(PER_LANE), num_envs)
        self._log = CommitLog(path / LANES_REC, readonly=readonly)
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


def persist(backing: Any, lanes: Any, log: LaneLog, durable: bool, margin: int = 0) -> None:
    """Sync the data pages, then commit the lanes with a synced record (flush, close); a
    backing that is not ``durable`` (data on disk only once flushed) vouches for ``margin``
    more slots per lane."""
    try:
        backing.flush()  # msync: data reach the disk before the record that counts them
    except RuntimeError:
        if not (isinstance(backing, ArrayStorage) and backing.closed):
            raise  # a closed MemmapStorage flushed itself when it closed
    if durable:
        np.maximum(lanes.reserved, lanes.count, out=lanes.reserved)
    else:
        lanes.reserved[:] = lanes.count + margin
    log.commit(lanes, synced=True)


def close_books(backing: Any, lanes: Any, log: LaneLog, durable: bool) -> None:
    """:func:`persist`, then release the lanes' files (a stream's close or finalizer)."""
    try:
        persist(backing, lanes, log, durable)
    finally:
        log.close()


class LaneBooks:
    """The commit records of a disk stream's lanes, beside its data ``backing`` at ``path``:
    what the stream's writer calls before (:meth:`reserve`) and after (:meth:`committed`) an
    operation, and :meth:`persist` on flush. ``durable``: the backing's writes reach the page
    cache at once (a MemmapStorage); otherwise (a TieredStorage over a disk cold tier) the
    lanes commit only when flushed, vouching for ``margin`` more slots per lane each time."""

    def __init__(
        self, path: Path, log: LaneLog, lanes: Lanes, backing: Storage, durable: bool, margin: int
    ) -> None:
        self.path, self.log, self.lanes, self.backing = path, log, lanes, backing
        self.durable, self.margin = durable, margin

    def reserve(self, lanes: np.ndarray | None, grow: Any) -> None:
        """Before ``grow`` slots of each of ``lanes`` (None: all) are written: when they
        overwrite alive slots not vouched for yet, commit ``reserved = count + grow`` first
        (reopening drops them, never reads them torn). A backing that reaches the disk only
        when flushed is flushed and committed instead, vouching for ``margin`` more slots."""
        books = self.lanes
        sel = slice(None) if lanes is None else lanes
        need = books.count[sel] + grow
        if self.durable:
            # overwritten slots count - L .. need - L - 1 are alive when need - L > floor
            if (need > np.maximum(books.reserved[sel], books.floor[sel] + books.L)).any():
                books.reserved[sel] = np.maximum(books.reserved[sel], need)
                self.log.commit(books)
        elif (need > books.reserved[sel]).any():
            margin = max(self.margin, int(np.max(grow)))
            persist(self.backing, books, self.log, False, margin)

    def committed(self) -> None:
        """After an operation completed (its slots and flags written): commit the lanes."""
        if self.durable:
            books = self.lanes
            np.maximum(books.reserved, books.count, out=books.reserved)
            self.log.commit(books)

    def persist(self) -> None:
        """Sync the data and the lanes, then commit them with a synced record (flush)."""
        persist(self.backing, self.lanes, self.log, self.durable, self.margin)

    def commit_empty(self) -> None:
        """Commit lanes that hold nothing (before the data are replaced wholesale: a load)."""
        self.log.commit_empty()

    def commit(self) -> None:
        """Commit the lanes as they are (a load that failed: the old lanes count again)."""
        self.log.commit(self.lanes)

    def close(self) -> None:
        """:func:`close_books`: persist, then release the lanes' files (the stream's close
        or its finalizer)."""
        close_books(self.backing, self.lanes, self.log, self.durable)


# ----------------------------------------------------------------------------- the directory
def read_npz(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray] | None]:
    """``(settings, lanes)`` from the ``stream.npz`` of stream directory ``path``; ``lanes``
    only where an older rlstash saved them there (else None). Whatever a damaged file raises
    while it is read (a zip's BadZipFile or CRC error, a missing key, JSON that does not
    parse, an OSError) is one ValueError naming ``stream.npz``."""
    file = path / NPZ
    try:
        with np.load(file) as z:
            config = json.loads(str(z["config"]))
            lanes = {k: np.array(z[k]) for k in LANE_KEYS} if "count" in z else None
        if not isinstance(config, dict):
            raise TypeError(f"its settings are a {type(config).__name__}, not a dict")
    except FileNotFoundError:
        raise
    except Exception as exc:  # noqa: BLE001 - the class is "whatever damaged bytes raise"
        raise _damaged(file, f"it does not read ({one_line(exc)})") from None
    return config, lanes


def check_dir(path: Path) -> bool:
    """True when ``path`` holds a stream to resume; refuses a plain MemmapStorage and a
    stream saved in another row layout (before anything there is opened)."""
    resume = (path / NPZ).exists()
    if resume:
        refuse_lane_major(path, read_npz(path)[0])
    if (path / META).exists() and not resume:
        raise ValueError(
            f"path: {path} holds a MemmapStorage without {NPZ}: it is not a StreamStorage "
            "directory; use an empty or a new directory"
        )
    return resume


def inspect_stream(path: Path) -> str:
    """Check the lanes' bookkeeping of the disk stream at ``path`` without changing it (no
    lock, nothing written), as reopening it does: ``stream.npz`` reads and is of this
    rlstash's row layout, ``lanes.bin`` has its exact size, ``lanes.rec``'s newest record and
    the lanes it names are in range. Returns what was found, in words; a ValueError names a
    damaged file."""
    config, saved = read_npz(path)
    refuse_lane_major(path, config)
    N = int(config["num_envs"])
    L = int(config["capacity"]) // N
    if not (path / LANES_REC).exists():
        if saved is None:
            raise _damaged(path / LANES_REC, "it is missing (the lanes' commit records)")
        return f"{NPZ} holds the lanes of {N} envs (an older rlstash's; moved on reopening)"
    log = LaneLog(path, N, L, readonly=True)
    try:
        per_lane = log.read()
        reads = config.get("reads", {})
        slots = Lanes(
            N, L, reads.get("n_step", 1), reads.get("frame_stack", 1), (log.flags, log.ep)
        )
        if damage := slots.slot_damage():
            raise _damaged(path / LANES_BIN, damage)
    finally:
        log.close()
    held = "no commit yet" if per_lane is None else f"{int(per_lane['count'].sum()):,} steps"
    return f"{NPZ}, {LANES_BIN} and {LANES_REC} of {N} lanes x {L} slots ({held})"


def open_books(
    backing: Storage,
    path: Path,
    resume: bool,
    config: dict[str, Any],
    lanes_of: Any,
    margin: int,
) -> LaneBooks:
    """The lanes' bookkeeping beside the data ``backing`` at ``path``: made new, or
    (``resume``) reopened at the last commit; a directory of an older rlstash, whose
    ``stream.npz`` holds the lanes, is moved over to commit records once. ``config`` is the
    stream's settings (checked against, or written to, ``stream.npz``); ``lanes_of(slots)``
    makes the :class:`Lanes` on the mapped slot arrays ``(flags, ep)``. The lanes are
    committed synced; ``backing`` is closed on error."""
    from rlstash.storage.disk import MemmapStorage

    durable = isinstance(backing, MemmapStorage)
    N, log = int(config["num_envs"]), None
    L = int(config["capacity"]) // N
    try:
        saved = _saved_lanes(path, config) if resume else None
        if not (path / LANES_REC).exists():
            if resume and saved is None:
                raise _damaged(path / LANES_REC, "it is missing (the lanes' commit records)")
            log = LaneLog.create(path, N, L)
        else:
            log = LaneLog(path, N, L)
        lanes = lanes_of((log.flags, log.ep))
        if resume and (damage := lanes.slot_damage()):
            raise _damaged(path / LANES_BIN, damage)
        per_lane = log.read() if resume else None
        if per_lane is not None:
            lanes.restore(per_lane)
        elif saved is not None:
            lanes.load(saved)
            lanes.drop_unvouched()
        persist(backing, lanes, log, durable, margin)
        if not resume or saved is not None:  # last: the directory is a whole stream now
            settings = np.array(json.dumps(config))
            write_atomic(path / NPZ, lambda f: np.savez(f, config=settings))
        for stale in path.glob(f".{NPZ}.*"):
            stale.unlink(missing_ok=True)
    except BaseException:
        if log is not None:
            log.close()
        backing.close()
        raise
    return LaneBooks(path, log, lanes, backing, durable, margin)


def _saved_lanes(path: Path, config: dict[str, Any]) -> dict[str, np.ndarray] | None:
    """Checks the settings in ``stream.npz`` against ``config``; returns the lanes saved there
    by an older rlstash (None when they are in commit records)."""
    saved, lanes = read_npz(path)
    if saved != config:
        diff = {k: (saved.get(k), v) for k, v in config.items() if saved.get(k) != v}
        raise ValueError(f"path: the stream at {path} was made with other settings: {diff}")
    return lanes


__all__ = [
    "LANES_BIN",
    "LANES_REC",
    "NPZ",
    "LaneBooks",
    "LaneLog",
    "check_dir",
    "close_books",
    "disk_bytes",
    "inspect_stream",
    "lanes_file_bytes",
    "open_books",
    "persist",
    "read_npz",
]
