"""MemmapStorage: one reserved file per field on disk; nothing committed is lost on a crash.

The directory layout and the commit protocol are described in
:mod:`rlstash.storage.disk_layout`. In short: every file (the field files, ``meta.json`` and
the 4 KiB ``commit.rec``) is reserved in full at creation (invariant I2), so a disk without
room is an error at creation that names the bytes needed and free and leaves nothing behind,
and a disk filled by someone else later cannot make a commit, ``flush`` or ``close`` fail.
Rows go into the memory maps first; :meth:`MemmapStorage.set_cursor` then stores a commit
record. After a SIGKILL at any moment, reopening the directory finds the position of the last
completed ``set_cursor`` (the buffer calls it at the end of every ``extend``) and every row it
counts; rows that were being overwritten when the process died are marked invalid
(:attr:`MemmapStorage.valid`), never counted half-written. After a power loss, the position
of the last :meth:`~MemmapStorage.flush` / :meth:`~MemmapStorage.close` is used (the only
places that fsync). A directory is open in at most one storage at a time (an exclusive
``flock`` on it).

Reads and writes are those of :class:`~rlstash.storage.arrays.ArrayStorage` over numpy views of
the memory maps (``np.take(out=)`` gathers); ``tensors`` holds ``torch.from_numpy`` views.
"""

from __future__ import annotations

import errno
import fcntl
import json
import operator
import os
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlstash.atomic import TMP_MARK, write_atomic
from rlstash.core import Index, check_capacity
from rlstash.memory import InsufficientMemoryError, disk_free, exact_bytes, plan
from rlstash.spec import Batch, Spec
from rlstash.storage.arrays import ArrayStorage, as_spec, spec_mismatch
from rlstash.storage.disk_layout import (
    COMMIT,
    COMMIT_BYTES,
    META,
    Commit,
    CommitLog,
    create_commit_file,
    file_names,
    meta_dict,
    open_maps,
    read_data,
    read_meta,
    ring_minus,
    ring_span,
    ring_union,
)

__all__ = ["MemmapStorage", "inspect"]


@dataclass
class _DiskState:
    """What the finalizer needs to close a storage nobody closed (shared with the storage)."""

    path: Path
    rec: Commit
    log: CommitLog | None = None
    extra_bytes: bytes | None = b"{}"  # None: the record's extra is {"total": rec.total}
    maps: list[np.memmap] = field(default_factory=list)
    lock_fd: int | None = None
    closed: bool = False


def _flush(st: _DiskState) -> None:
    for m in st.maps:
        m.flush()  # msync: data reach the disk before the record that counts them
    st.log.write(st.rec, st.extra_bytes, synced=True)
    st.log.sync()


def _close(st: _DiskState) -> None:
    """Flush and release (runs once: from close(), garbage collection or interpreter exit)."""
    if st.closed:
        return
    st.closed = True
    try:
        if st.log is not None and st.path.is_dir():  # a removed directory has nothing to keep
            _flush(st)
    finally:
        st.maps.clear()
        if st.log is not None:
            st.log.close()
        if st.lock_fd is not None:
            os.close(st.lock_fd)  # releases the flock
            st.lock_fd = None


def _lock(path: Path) -> int:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RuntimeError(
            f"path: {path} is already open in another MemmapStorage (this or another process); "
            "close that one first"
        ) from None
    return fd


def _disk_overhead(path: Path, spec: Spec, capacity: int) -> int:
    """Bytes beyond the data: each file rounded up to whole blocks, meta.json and its temp,
    commit.rec."""
    here = path
    while not here.exists() and here != here.parent:
        here = here.parent
    block = os.statvfs(here).f_frsize or 4096
    rounding = sum(-(capacity * f.row_bytes) % block for f in spec.values())
    return rounding + 2 * block + -(-COMMIT_BYTES // block) * block


def _reserve(path: Path, spec: Spec, capacity: int, needed: int) -> None:
    """Create ``path`` (and missing parents), fallocate every field file and ``commit.rec``,
    write ``meta.json``. All or nothing: on any failure everything created here is removed."""
    made: list[Path] = []  # directories and files we created, in order
    missing = []
    here = path
    while not here.exists():
        missing.append(here)
        here = here.parent
    free = disk_free(path)
    try:
        for d in reversed(missing):
            d.mkdir()
            made.append(d)
        for name, fname in file_names(spec).items():
            nbytes = capacity * spec[name].row_bytes
            fd = os.open(path / fname, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            made.append(path / fname)
            try:
                if nbytes:
                    os.posix_fallocate(fd, 0, nbytes)
            finally:
                os.close(fd)
        made.append(path / COMMIT)
        create_commit_file(path / COMMIT)
        made.append(path / META)
        write_atomic(path / META, json.dumps(meta_dict(spec, capacity), indent=1).encode())
    except BaseException as exc:
        for p in reversed(made):
            if p.is_dir():
                p.rmdir()
            else:
                p.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            p = plan(spec, capacity, "disk", path=path)
            raise InsufficientMemoryError(
                f"Not enough disk space at {path} for a disk storage of {capacity:,} rows: needs "
                f"{exact_bytes(needed)}, {exact_bytes(free)} free (reserving the files failed: "
                f"{exc.strerror}). Fix: a smaller capacity or a path on a filesystem with more "
                "free space. Nothing was left behind.",
                "disk",
                needed,
                free,
                p,
            ) from exc
        if isinstance(exc, OSError):
            raise OSError(
                exc.errno,
                f"cannot reserve the files of a disk storage at {path}: {exc.strerror} "
                "(the filesystem must support posix_fallocate); nothing was left behind",
            ) from exc
        raise


def _check_commit(rec: Commit, capacity: int, file: Path) -> None:
    ok = (
        0 <= rec.cursor < capacity
        and 0 <= rec.size <= capacity
        and 0 <= rec.hole_start < capacity
        and 0 <= rec.hole_len <= capacity
        and (rec.extra is None or isinstance(rec.extra, dict))
    )
    if not ok:
        raise ValueError(
            f"path: {file} is damaged: its record says cursor={rec.cursor} size={rec.size} "
            f"hole={rec.hole_start}+{rec.hole_len} for capacity {capacity}. Fix: restore the "
            "directory from a copy, or delete it and start a new storage"
        )


def inspect(path: str | os.PathLike) -> tuple[dict[str, Any], Commit, dict[str, np.ndarray]]:
    """Check the directory of a MemmapStorage without changing it (no lock, nothing written):
    ``meta.json``, ``commit.rec`` (its size, its newest record within the capacity) and each
    data file's exact size, as opening it does. Returns ``(meta, record, maps)``, ``maps``
    read-only memory maps ``[capacity, *shape]``; a ValueError naming a damaged file."""
    path = Path(path)
    meta = read_meta(path)
    rec = Commit(meta.get("cursor", 0), meta.get("size", 0))  # version 1: in meta.json
    if meta["version"] > 1:
        log = CommitLog(path / COMMIT, readonly=True)
        try:
            rec = log.read() or Commit()
        finally:
            log.close()
        _check_commit(rec, meta["capacity"], path / COMMIT)
    return meta, rec, open_maps(path, meta["spec"], meta["capacity"], "r")


class MemmapStorage(ArrayStorage):
    """Rows in one memory-mapped, fully reserved file per field under ``path``.

    Creating checks free disk space first (:func:`rlstash.memory.plan`, ``storage="disk"``)
    and raises :class:`~rlstash.memory.InsufficientMemoryError` (unless
    ``allow_overcommit``) before anything is created. A directory with a ``meta.json``
    reopens instead (same spec and capacity required) at its last committed position. The
    writer's position is ``cursor`` / ``size`` plus ``extra``, a small JSON-serializable dict
    for the caller (at most ~950 bytes as JSON); :meth:`set_cursor` commits all three (see
    :mod:`rlstash.storage.disk_layout` for what survives a crash).
    """

    def __init__(
        self,
        spec: Spec | Mapping,
        capacity: int,
        path: str | os.PathLike,
        allow_overcommit: bool = False,
    ) -> None:
        self.spec = as_spec(spec)
        self.capacity = check_capacity(capacity)
        self.device = torch.device("cpu")
        self.path = Path(path).absolute()
        file_names(self.spec)
        st = _DiskState(self.path, Commit())
        try:
            if (self.path / META).exists():
                self._resume(st)
            else:
                self._create(st, allow_overcommit)
            maps = open_maps(self.path, self.spec, self.capacity, "r+")
        except BaseException:
            if st.log is not None:
                st.log.close()
            if st.lock_fd is not None:
                os.close(st.lock_fd)
            raise
        st.maps = [m for m in maps.values() if isinstance(m, np.memmap)]
        arrays = {k: m.view(np.ndarray) for k, m in maps.items()}  # plain views: no memmap overhead
        tensors = {k: torch.from_numpy(a) for k, a in arrays.items()}  # [capacity, *shape]
        for k, f in self.spec.items():
            if tensors[k].dtype != f.dtype:
                tensors[k] = tensors[k].view(f.dtype)
        self._state = st
        self._hole = (st.rec.hole_start, st.rec.hole_len)  # rows a crash may have torn
        self._valid = self._valid_mask()
        self._finalizer = weakref.finalize(self, _close, st)
        self._bind(tensors, arrays)

    def _create(self, st: _DiskState, allow_overcommit: bool) -> None:
        if self.path.exists():
            if not self.path.is_dir():
                raise ValueError(f"path: {self.path} exists and is not a directory")
            if any(self.path.iterdir()):
                raise ValueError(
                    f"path: {self.path} is not empty and has no {META}: it is not a MemmapStorage "
                    "(or its creation was interrupted); use an empty or a new directory"
                )
        overhead = _disk_overhead(self.path, self.spec, self.capacity)
        self.plan = plan(
            self.spec, self.capacity, "disk", path=self.path,
            extra={"disk": {"block rounding, meta.json and commit.rec": overhead}},
        ).check(allow_overcommit)  # fmt: skip
        _reserve(self.path, self.spec, self.capacity, self.plan.place("disk").needed)
        st.lock_fd = _lock(self.path)
        st.log = CommitLog(self.path / COMMIT)

    def _resume(self, st: _DiskState) -> None:
        meta = read_meta(self.path)
        diff = spec_mismatch(self.spec, meta["spec"])
        if diff:
            raise ValueError(f"path: the storage at {self.path} has another spec: {diff}")
        if meta["capacity"] != self.capacity:
            raise ValueError(
                f"path: the storage at {self.path} has capacity {meta['capacity']}, "
                f"expected {self.capacity}"
            )
        self.plan = plan(self.spec, self.capacity, "disk", path=self.path)
        st.lock_fd = _lock(self.path)
        for stale in self.path.glob(f".{META}{TMP_MARK}*"):  # from a crash during a meta write
            stale.unlink(missing_ok=True)
        if meta["version"] == 1:  # the position is in meta.json: move it to a commit record
            extra = dict(meta.get("extra") or {})
            st.rec = Commit(meta["cursor"], meta["size"], extra=extra)
            if not (self.path / COMMIT).exists():
                create_commit_file(self.path / COMMIT)
            st.log = CommitLog(self.path / COMMIT)
            st.extra_bytes = st.log.encode_extra(extra)
            _flush(st)
            write_atomic(
                self.path / META, json.dumps(meta_dict(self.spec, self.capacity), indent=1).encode()
            )
            return
        st.log = CommitLog(self.path / COMMIT)
        st.rec = st.log.read() or Commit()
        _check_commit(st.rec, self.capacity, self.path / COMMIT)
        st.extra_bytes = None if st.rec.extra is None else st.log.encode_extra(st.rec.extra)

    @classmethod
    def open(cls, path: str | os.PathLike) -> MemmapStorage:
        """Reopen the storage at ``path`` with the spec and capacity of its ``meta.json``."""
        meta = read_meta(Path(path))
        return cls(meta["spec"], meta["capacity"], path)

    def __repr__(self) -> str:
        return f"MemmapStorage({self.spec!r}, capacity={self.capacity}, path={str(self.path)!r})"

    # ------------------------------------------------------------------ writer position
    @property
    def cursor(self) -> int:
        """Next write position (committed by :meth:`set_cursor`)."""
        return self._state.rec.cursor

    @property
    def size(self) -> int:
        """Rows stored (committed by :meth:`set_cursor`)."""
        return self._state.rec.size

    @property
    def extra(self) -> dict[str, Any]:
        """A small JSON-serializable dict committed with the position."""
        return self._state.rec.extra_dict()

    @property
    def valid(self) -> np.ndarray | None:
        """None, or after reopening from a crash in the middle of overwriting stored rows,
        ``bool[capacity]``: False for the rows that may be torn (until they are rewritten).
        Samplers never return a row outside it."""
        return self._valid

    def set_cursor(self, cursor: int, size: int, extra: Mapping[str, Any] | None = None) -> None:
        """Commit the writer's position (``0 <= cursor < capacity``, ``0 <= size <= capacity``):
        rows written before this call survive a crash of the process from now on."""
        st, cap = self._state, self.capacity
        if (  # the buffer's call on every extend: checked in one expression, no JSON
            type(extra) is dict
            and len(extra) == 1
            and type(total := extra.get("total")) is int
            and type(cursor) is int
            and type(size) is int
            and 0 <= cursor < cap
            and 0 <= size <= cap
            and not st.closed
        ):
            rec = st.rec
            rec.cursor, rec.size, rec.total, rec.extra, st.extra_bytes = (
                cursor,
                size,
                total,
                None,
                None,
            )
            rec.hole_start, rec.hole_len = self._hole
            st.log.write(rec, None)
            return
        if type(cursor) is not int or type(size) is not int:
            cursor, size = operator.index(cursor), operator.index(size)
        if not (0 <= cursor < cap) or not (0 <= size <= cap):
            raise ValueError(
                f"cursor/size: expected 0 <= cursor < {cap} and 0 <= size <= {cap}, got "
                f"cursor={cursor} size={size}"
            )
        if st.closed:
            self._check_open()
        rec = st.rec
        if extra is not None:
            if type(extra) is dict and len(extra) == 1 and type(extra.get("total")) is int:
                rec.total, rec.extra, st.extra_bytes = extra["total"], None, None  # no JSON
            else:
                data = st.log.encode_extra(extra)  # refuses what cannot be stored, first
                rec.extra, st.extra_bytes = dict(extra), data
        rec.cursor, rec.size = cursor, size
        rec.hole_start, rec.hole_len = self._hole
        st.log.write(rec, st.extra_bytes)

    # ------------------------------------------------------------------ writing
    def write(self, index: Index, batch: Batch, validate: bool = True) -> None:
        """:meth:`ArrayStorage.write`, committing a hole first when stored rows are overwritten."""
        batch, index = self._checked_write(index, batch, validate)
        span = self._before_write(index)
        super().write(index, batch, validate=False)
        if span is not None:
            self._after_write(span)

    def put(self, index: slice | np.ndarray, srcs: list[np.ndarray | torch.Tensor]) -> None:
        """:meth:`ArrayStorage.put`, committing a hole first when stored rows are overwritten."""
        st = self._state
        rec = st.rec
        if type(index) is slice and not self._hole[1]:  # the writer's case: no hole yet
            if rec.size == self.capacity:  # a full ring: these rows are about to be torn
                rec.hole_start, rec.hole_len = index.start, index.stop - index.start
                st.log.write(rec, st.extra_bytes)
            elif index.start < rec.size:
                self._before_write(index)
            ArrayStorage.put(self, index, srcs)
            return
        span = self._before_write(index)
        ArrayStorage.put(self, index, srcs)
        if span is not None:
            self._after_write(span)

    def _before_write(self, index: slice | np.ndarray) -> tuple[int, int] | None:
        """When ``index`` overwrites counted rows, commit them as a hole first; returns the
        written span then (None when only free rows are written)."""
        st = self._state
        size, cap = st.rec.size, self.capacity
        if not size:
            return None
        if size < cap and type(index) is slice and index.start >= size:
            return None  # the common case while filling: only rows past the stored ones
        start, n = ring_span(index, cap)
        if not n or (size < cap and start >= size and start + n <= cap):
            return None
        rec = st.rec
        rec.hole_start, rec.hole_len = ring_union(self._hole, (start, n), cap)
        st.log.write(rec, st.extra_bytes)
        return start, n

    def _after_write(self, span: tuple[int, int]) -> None:
        """The rows of ``span`` are whole again; the next record no longer marks them."""
        hole = ring_minus(self._hole, span, self.capacity)
        if hole != self._hole:
            self._hole = hole
            self._valid = self._valid_mask()

    def _valid_mask(self) -> np.ndarray | None:
        start, n = self._hole
        if not n:
            return None
        from rlstash.memory import check_host_state  # planned before it is allocated

        check_host_state("MemmapStorage's torn-row mask", {"valid": self.capacity}, self.capacity)
        valid = np.ones(self.capacity, dtype=bool)
        rows = (start + np.arange(n, dtype=np.int64)) % self.capacity
        valid[rows] = False
        return valid

    # ------------------------------------------------------------------ lifecycle
    def flush(self) -> None:
        """Sync the data pages (msync), then store and sync a commit record (survives a power
        loss from now on). Allocates nothing."""
        self._check_open()
        _flush(self._state)

    def close(self) -> None:
        """Flush and release the maps and the directory lock (idempotent)."""
        self._finalizer()
        self.tensors, self._arrays, self._np_fields, self._np_write = {}, None, None, None
        self._out_key, self._out_arrays, self._put_arrays = None, [], None
        self._pool.clear()
        self._closed = True

    def __enter__(self) -> MemmapStorage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Flushes, then references the directory: ``{"kind", "path", "spec", "capacity",
        "cursor", "size", "extra"}`` (no data copied)."""
        self.flush()
        rec = self._state.rec
        return {
            "kind": "MemmapStorage",
            "path": str(self.path),
            "spec": self.spec.to_dict(),
            "capacity": self.capacity,
            "cursor": rec.cursor,
            "size": rec.size,
            "extra": dict(rec.extra_dict()),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load a state: this directory's (position only), another directory's (its data are
        copied here) or a :class:`TensorStorage` state with ``data``. Then flushes.

        While rows are copied in, the committed position is empty: a crash then leaves an
        empty storage, never a mix counted as valid. A state that does not match changes
        nothing."""
        self._check_open()
        copy = None
        if "data" in state:
            copy = lambda: self._load_arrays(state)  # noqa: E731 - checks all, then copies
        else:
            diff = spec_mismatch(self.spec, Spec.from_dict(state["spec"]))
            if diff or int(state["capacity"]) != self.capacity:
                raise ValueError(
                    f"state: does not match this storage: {diff or 'capacity ' + str(state['capacity'])}"
                )
            if Path(state["path"]).absolute() != self.path:
                data = read_data(state)
                copy = lambda: [np.copyto(self._arrays[k], m) for k, m in data.items()]  # noqa: E731
        if copy is not None:
            rec = self._state.rec
            old = (rec.cursor, rec.size)
            self.set_cursor(0, 0)
            try:
                copy()
            except ValueError:
                self.set_cursor(*old)  # a state that does not match: checked before copying
                raise
            self._hole, self._valid = (0, 0), None
        cursor, size = int(state.get("cursor", 0)), int(state.get("size", 0))
        self.set_cursor(cursor, size, state.get("extra"))
        self.flush()
