"""The on-disk layout of a :class:`~rlstash.storage.disk.MemmapStorage` directory.

::

    meta.json       {"format", "version", "spec", "capacity", "files"}: written once, at creation
    commit.rec      4096 bytes, reserved at creation: the commit records (writer position)
    obs.bin         capacity * row_bytes(obs) bytes, rows back to back (C order)
    obs__pixels.bin field "obs/pixels" ("/" becomes "__")

Commit order (invariant I7). Rows are written into the memory maps first; only then is a
commit record naming the new ``cursor``/``size`` stored into ``commit.rec`` (itself a shared
memory map: a store, no system call). Both land in the kernel's page cache, which outlives
the process: after a SIGKILL at any moment, reopening finds every row of every completed
``extend`` and nothing more. Before rows that are already counted are overwritten (a full
ring), a record first marks them as a *hole* (``hole_start``, ``hole_len``, rows on the ring),
so a kill in the middle of that write leaves them invalid, never half-written and counted.

``commit.rec`` holds four 1024-byte slots: two *live* slots written on every commit (they
alternate, so a torn record leaves the previous one intact) and two *synced* slots written by
``flush``/``close`` after the data pages were msynced. Each record carries its sequence number
at both ends (a record cut short has two different ones) and the machine's boot id. Reopening takes the newest valid record; live records of
another boot are ignored, because a power loss may have dropped page-cache writes: then the
last synced record (the last ``flush``/``close``) is used. Durability: a killed process loses
nothing committed; a power loss or kernel crash loses what was committed after the last
``flush``/``close`` (fsync happens only there).

Nothing is allocated after creation: commits store into reserved pages, ``meta.json`` is never
rewritten, so a disk filled by someone else later cannot make ``flush``/``close`` fail.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlstash.spec import Spec

FORMAT = "rlstash.memmap"
VERSION = 2  # 1: cursor, size and extra in meta.json (still read)
META = "meta.json"
COMMIT = "commit.rec"
COMMIT_BYTES = 4096
_SLOT = 1024
_MAGIC = b"RLSTCMT1"
# magic, seq, boot id, cursor, size, hole start, hole length, total, bytes of extra JSON (-1:
# none, extra is {"total": total}); the JSON follows; seq again in the slot's last 8 bytes
_HEAD = struct.Struct("<8sQ16sqqqqqi")
_TAIL = struct.Struct("<Q")
_TAIL_AT = _SLOT - _TAIL.size
MAX_EXTRA = _SLOT - _HEAD.size - _TAIL.size  # bytes of JSON for ``extra``
_HEAD_SIZE = _HEAD.size
_pack_head, _pack_tail = _HEAD.pack_into, _TAIL.pack_into


def field_filename(name: str) -> str:
    """The file of field ``name``: ``"obs/pixels"`` -> ``"obs__pixels.bin"``."""
    return name.replace("/", "__") + ".bin"


def file_names(spec: Spec) -> dict[str, str]:
    """field -> file name, checked to be distinct, valid file names."""
    names = {k: field_filename(k) for k in spec}
    seen: dict[str, str] = {}
    for k, fname in names.items():
        if fname in seen:
            raise ValueError(
                f"fields {seen[fname]!r} and {k!r} would share the file {fname!r}; rename one"
            )
        if "\0" in fname or len(fname.encode()) > 255:
            raise ValueError(f"field {k!r}: cannot be a file name ({fname!r})")
        seen[fname] = k
    return names


def np_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype a field is stored as (numpy has no bfloat16: int16 bit patterns)."""
    try:
        return torch.empty(0, dtype=dtype).numpy().dtype
    except TypeError:
        return np.dtype(f"i{torch.empty(0, dtype=dtype).element_size()}")


def meta_dict(spec: Spec, capacity: int) -> dict[str, Any]:
    """The content of ``meta.json`` for a new storage."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "spec": spec.to_dict(),
        "capacity": capacity,
        "files": file_names(spec),
    }


# ---------------------------------------------------------------------------- meta.json
def read_meta(path: Path) -> dict[str, Any]:
    """The parsed and checked ``path/meta.json``; ValueError naming the file and the key.

    Checked: format, version, a spec that parses, a positive int capacity, (version 2) the
    data files named for the spec's fields, and (version 1)
    ``0 <= cursor < capacity``, ``0 <= size <= capacity`` and a dict ``extra``. ``meta["spec"]``
    is returned as a :class:`Spec`.
    """
    file = path / META
    try:
        meta = json.loads(file.read_text())
    except FileNotFoundError:
        raise _damaged(file, "it is missing") from None
    except ValueError as exc:  # not UTF-8, not JSON: cut short or overwritten
        raise _damaged(file, f"it does not parse ({exc})") from None
    except OSError as exc:
        raise ValueError(f"path: cannot read {file}: {exc}") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"path: {file} is not the metadata of a MemmapStorage")
    if meta.get("version") not in (1, VERSION):
        raise ValueError(
            f"path: {file} has format version {meta.get('version')!r}, this rlstash reads "
            f"1 and {VERSION}"
        )
    capacity = _int_key(meta, "capacity", file, 1, None)
    try:
        meta["spec"] = Spec.from_dict(meta["spec"])
    except Exception as exc:  # noqa: BLE001 - any malformed spec: one clear error
        raise _damaged(file, f"its 'spec' does not parse ({type(exc).__name__}: {exc})") from exc
    if meta["version"] > 1 and meta.get("files") != file_names(meta["spec"]):
        raise _damaged(
            file,
            f"its 'files' {meta.get('files')!r} are not those of its spec "
            f"{file_names(meta['spec'])!r}",
        )
    if meta["version"] == 1:
        _int_key(meta, "cursor", file, 0, capacity - 1)
        _int_key(meta, "size", file, 0, capacity)
        if not isinstance(meta.get("extra", {}), dict):
            raise _damaged(file, f"'extra' is {meta['extra']!r}, expected a dict")
    return meta


def _int_key(meta: dict[str, Any], key: str, file: Path, lo: int, hi: int | None) -> int:
    if key not in meta:
        raise _damaged(file, f"the key {key!r} is missing")
    v = meta[key]
    if type(v) is not int or v < lo or (hi is not None and v > hi):
        rule = f"an int >= {lo}" if hi is None else f"an int in [{lo}, {hi}]"
        raise _damaged(file, f"{key!r} is {v!r}, expected {rule}")
    return v


def _damaged(file: Path, what: str) -> ValueError:
    return ValueError(
        f"path: {file} is damaged: {what}. Fix: restore the directory from a copy, or delete "
        "it and start a new storage"
    )


# ---------------------------------------------------------------------------- commit records
def _boot_id() -> bytes:
    try:
        text = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return bytes.fromhex(text.replace("-", ""))[:16].ljust(16, b"\0")
    except (OSError, ValueError):
        return bytes(16)  # unknown: live records are trusted (no reboot detection)


BOOT_ID = _boot_id()


@dataclass
class Commit:
    """One commit record: rows ``[0, size)`` are stored (all once full), minus the ``hole_len``
    rows from ``hole_start`` on the ring, which may be torn. ``extra`` is the caller's dict;
    ``{"total": n}`` (the buffer's, on every extend) is kept as ``total`` without JSON."""

    cursor: int = 0
    size: int = 0
    hole_start: int = 0
    hole_len: int = 0
    total: int = 0
    extra: dict[str, Any] | None = field(default_factory=dict)  # None: {"total": total}

    def extra_dict(self) -> dict[str, Any]:
        return {"total": self.total} if self.extra is None else self.extra


class CommitLog:
    """The records in ``commit.rec`` (see the module docstring), through a shared memory map
    (``readonly``: a read-only one, for inspecting a directory without changing it).

    A slot holds ``seq`` first and again in its last 8 bytes; a record counts only when both
    match, so a write cut short (the stores run in order: head, extra, tail) never counts.
    A disk StreamStorage keeps its lanes' records in ``lanes.rec`` the same way
    (:mod:`rlstash.storage.stream_commit`: the record in slot ``i`` names the lanes' copy ``i``).
    """

    def __init__(self, path: Path, readonly: bool = False) -> None:
        try:
            fd = os.open(path, os.O_RDONLY if readonly else os.O_RDWR)
        except FileNotFoundError:
            raise _damaged(
                path, "it is missing (the commit records: how many rows are stored)"
            ) from None
        try:
            size = os.fstat(fd).st_size
            if size != COMMIT_BYTES:
                raise _damaged(path, f"it has {size:,} bytes, expected {COMMIT_BYTES:,}")
            access = mmap.ACCESS_READ if readonly else mmap.ACCESS_WRITE
            self._map = mmap.mmap(fd, COMMIT_BYTES, access=access)
        finally:
            os.close(fd)
        self.path = path
        self._seq = 0
        self._live, self._synced = 0, 2 * _SLOT  # offsets of the next live and synced slot
        self.slot = -1  # the slot (0-3) of the record :meth:`read` returned last; -1: none

    def read(self) -> Commit | None:
        """The newest valid record (live ones of this boot only), or None when there is none.

        The next write of each kind (live, synced) then goes to the slot that does not hold
        the newest valid record of that kind, so a write cut short never destroys it."""
        best: tuple[int, int, Commit] | None = None
        newest = [(0, 0), (0, 2)]  # per kind: (seq, slot) of its newest valid record
        for slot in range(4):
            got = self._parse(slot)
            if got is None:
                continue
            seq, boot, rec = got
            self._seq = max(self._seq, seq)
            newest[slot // 2] = max(newest[slot // 2], (seq, slot))
            if slot < 2 and boot != BOOT_ID:
                continue  # a live record from before a reboot: its rows may not be on disk
            if best is None or seq > best[0]:
                best = (seq, slot, rec)
        (live_seq, live), (synced_seq, synced) = newest
        self._live = (1 - live) * _SLOT if live_seq else 0
        self._synced = (5 - synced) * _SLOT if synced_seq else 2 * _SLOT
        self.slot = -1 if best is None else best[1]
        return None if best is None else best[2]

    def next_slot(self, synced: bool = False) -> int:
        """The slot (0-3) the next :meth:`write` of that kind stores into."""
        return (self._synced if synced else self._live) // _SLOT

    def _parse(self, slot: int) -> tuple[int, bytes, Commit] | None:
        off = slot * _SLOT
        magic, seq, boot, cursor, size, h0, hn, total, n = _HEAD.unpack_from(self._map, off)
        (tail,) = _TAIL.unpack_from(self._map, off + _SLOT - _TAIL.size)
        if magic != _MAGIC or seq != tail or not seq or n > MAX_EXTRA:
            return None
        extra: dict[str, Any] | None = None
        if n >= 0:
            try:
                extra = json.loads(self._map[off + _HEAD.size : off + _HEAD.size + n])
            except ValueError:
                return None
        return seq, boot, Commit(cursor, size, h0, hn, total, extra)

    @staticmethod
    def encode_extra(extra: Mapping[str, Any]) -> bytes:
        """``extra`` as JSON bytes, checked to fit in a record."""
        data = json.dumps(dict(extra), separators=(",", ":")).encode()
        if len(data) > MAX_EXTRA:
            raise ValueError(
                f"extra: {len(data)} bytes as JSON, at most {MAX_EXTRA} fit in a commit record; "
                "keep it small (counters), store the rest elsewhere"
            )
        return data

    def write(self, rec: Commit, extra: bytes | None, synced: bool = False) -> None:
        """Store ``rec`` in the next live or synced slot; ``extra``: JSON from
        :meth:`encode_extra`, or None when ``rec.extra`` is None (``{"total": rec.total}``)."""
        self._seq = seq = self._seq + 1
        if synced:
            off = self._synced
            self._synced = 5 * _SLOT - off  # 2 <-> 3
        else:
            off = self._live
            self._live = _SLOT - off  # 0 <-> 1
        m = self._map
        if extra is None:
            _pack_head(
                m, off, _MAGIC, seq, BOOT_ID, rec.cursor, rec.size, rec.hole_start,
                rec.hole_len, rec.total, -1,
            )  # fmt: skip
        else:
            n = len(extra)
            _pack_head(
                m, off, _MAGIC, seq, BOOT_ID, rec.cursor, rec.size, rec.hole_start,
                rec.hole_len, rec.total, n,
            )  # fmt: skip
            m[off + _HEAD_SIZE : off + _HEAD_SIZE + n] = extra
        _pack_tail(m, off + _TAIL_AT, seq)

    def sync(self) -> None:
        """msync the records to disk."""
        self._map.flush()

    def close(self) -> None:
        """Release the map (idempotent)."""
        if not self._map.closed:
            self._map.close()


# ---------------------------------------------------------------------------- holes (ring intervals)
def ring_span(index: slice | np.ndarray, capacity: int) -> tuple[int, int]:
    """(start, length) of the smallest ring interval holding every row of ``index``."""
    if type(index) is slice:
        return index.start, index.stop - index.start
    if index.size == 0:
        return 0, 0
    first = int(index[0])
    return first, int(((index - first) % capacity).max()) + 1


def ring_union(a: tuple[int, int], b: tuple[int, int], capacity: int) -> tuple[int, int]:
    """A ring interval holding both ``a`` and ``b`` (the shorter of the two candidates)."""
    if not a[1]:
        return b
    if not b[1]:
        return a
    from_a = max(a[1], (b[0] - a[0]) % capacity + b[1])
    from_b = max(b[1], (a[0] - b[0]) % capacity + a[1])
    return (a[0], min(from_a, capacity)) if from_a <= from_b else (b[0], min(from_b, capacity))


def ring_minus(hole: tuple[int, int], done: tuple[int, int], capacity: int) -> tuple[int, int]:
    """``hole`` without the rows of ``done`` when they cover its start (else ``hole``)."""
    into = (hole[0] - done[0]) % capacity
    if not hole[1] or into >= done[1]:
        return hole
    covered = done[1] - into
    if covered >= hole[1]:
        return (0, 0)
    return ((hole[0] + covered) % capacity, hole[1] - covered)


def create_commit_file(path: Path) -> None:
    """Create ``path`` reserved at :data:`COMMIT_BYTES` bytes with no record in it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.posix_fallocate(fd, 0, COMMIT_BYTES)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------- data files
def open_maps(path: Path, spec: Spec, capacity: int, mode: str) -> dict[str, np.ndarray]:
    """Memory maps ``[capacity, *shape]`` of every field file, each checked to have exactly
    ``capacity * row_bytes`` bytes first (a ValueError naming the file otherwise)."""
    maps: dict[str, np.ndarray] = {}
    for name, fname in file_names(spec).items():
        f = spec[name]
        shape = (capacity, *f.shape)
        nbytes = capacity * f.row_bytes
        fp = path / fname
        size = fp.stat().st_size if fp.exists() else None
        if size != nbytes:  # cut short, grown, or gone: refused before anything is mapped
            got = "it is missing" if size is None else f"it has {size:,} bytes"
            raise _damaged(
                fp, f"{got}, expected {nbytes:,} (capacity {capacity} x {f.row_bytes} B)"
            )
        if nbytes == 0:
            maps[name] = np.zeros(shape, dtype=np_dtype(f.dtype))
        else:
            maps[name] = np.memmap(fp, dtype=np_dtype(f.dtype), mode=mode, shape=shape)
    return maps


def read_data(state: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The data of a :meth:`MemmapStorage.state_dict` as copy-on-write maps (file unchanged)."""
    spec = Spec.from_dict(state["spec"])
    return open_maps(Path(state["path"]), spec, int(state["capacity"]), "c")
