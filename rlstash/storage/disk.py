"""MemmapStorage: one reserved file per field on disk, resumable after a crash.

Layout of the directory ``path``::

    meta.json           {"format", "version", "spec", "capacity", "cursor", "size", "extra", "files"}
    obs.bin             capacity * row_bytes(obs) bytes, rows back to back (C order)
    obs__pixels.bin     field "obs/pixels" ("/" becomes "__")

Every file is reserved in full with ``os.posix_fallocate`` at creation (invariant I2): a
disk without room is an error at creation that names the bytes needed and free, and leaves
nothing behind, never a SIGBUS or a short write later. ``meta.json`` is written atomically
(temp file, fsync, ``os.replace``, fsync of the directory) by :meth:`MemmapStorage.flush`
and :meth:`MemmapStorage.close`, after the data pages were synced, so it never claims rows
that are not on disk. Opening a directory that holds a ``meta.json`` resumes it (data,
``cursor``, ``size``, ``extra``) once its spec and capacity match. A directory is open in at
most one storage at a time (an exclusive ``flock`` on it).

Reads and writes are those of :class:`~rlstash.storage.ram.ArrayStorage` over numpy views of
the memory maps (``np.take(out=)`` gathers); ``tensors`` holds ``torch.from_numpy`` views.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlstash.diag.memory import InsufficientMemoryError, disk_free, exact_bytes, plan
from rlstash.spec import Spec
from rlstash.storage.ram import ArrayStorage, as_spec, check_capacity, numpy_view, spec_mismatch

FORMAT = "rlstash.memmap"
VERSION = 1
META = "meta.json"
_TMP_PREFIX = ".meta.json.tmp."


def field_filename(name: str) -> str:
    """The file of field ``name``: ``"obs/pixels"`` -> ``"obs__pixels.bin"``."""
    return name.replace("/", "__") + ".bin"


def _file_names(spec: Spec) -> dict[str, str]:
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


def _plain(extra: dict[str, Any]) -> bool:
    """True when every item is ``str -> int``: JSON-serializable without trying (the buffer's
    ``{"total": n}``, on every extend)."""
    for k, v in extra.items():
        if type(k) is not str or type(v) is not int:
            return False
    return True


def _np_dtype(dtype: torch.dtype) -> np.dtype:
    return numpy_view(torch.zeros(0, dtype=dtype)).dtype  # bfloat16 -> int16 bit patterns


@dataclass
class _DiskState:
    """What the finalizer needs to close a storage nobody closed (shared with the storage)."""

    path: Path
    spec: Spec
    capacity: int
    cursor: int = 0
    size: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    maps: list[np.memmap] = field(default_factory=list)
    lock_fd: int | None = None
    closed: bool = False


def _meta(st: _DiskState) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": VERSION,
        "spec": st.spec.to_dict(),
        "capacity": st.capacity,
        "cursor": st.cursor,
        "size": st.size,
        "extra": st.extra,
        "files": _file_names(st.spec),
    }


def write_meta(path: Path, meta: Mapping[str, Any]) -> None:
    """Write ``path/meta.json`` atomically: temp file, fsync, ``os.replace``, fsync the dir."""
    tmp = path / f"{_TMP_PREFIX}{os.getpid()}"
    data = json.dumps(meta, indent=1).encode()
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path / META)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def read_meta(path: Path) -> dict[str, Any]:
    """The parsed ``path/meta.json``, checked for format and version."""
    try:
        meta = json.loads((path / META).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"path: cannot read {path / META}: {exc}") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"path: {path / META} is not the metadata of a MemmapStorage")
    if meta.get("version") != VERSION:
        raise ValueError(
            f"path: {path / META} has format version {meta.get('version')}, this rlstash reads {VERSION}"
        )
    return meta


def _flush(st: _DiskState) -> None:
    for m in st.maps:
        m.flush()  # msync: data reach the disk before the metadata that counts them
    write_meta(st.path, _meta(st))


def _close(st: _DiskState) -> None:
    """Flush and release (runs once: from close(), garbage collection or interpreter exit)."""
    if st.closed:
        return
    st.closed = True
    try:
        if st.maps and st.path.is_dir():  # a directory removed by its owner has nothing to keep
            _flush(st)
    finally:
        st.maps.clear()
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
    """Bytes beyond the data: each file rounded up to whole blocks, meta.json and its temp."""
    here = path
    while not here.exists() and here != here.parent:
        here = here.parent
    block = os.statvfs(here).f_frsize or 4096
    rounding = sum(-(capacity * f.row_bytes) % block for f in spec.values())
    return rounding + 2 * block


def _reserve(path: Path, spec: Spec, capacity: int, needed: int, meta: Mapping[str, Any]) -> None:
    """Create ``path`` (and missing parents), fallocate every field file, write ``meta.json``.

    All or nothing: on any failure everything created here is removed again.
    """
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
        for name, fname in _file_names(spec).items():
            nbytes = capacity * spec[name].row_bytes
            fd = os.open(path / fname, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            made.append(path / fname)
            try:
                if nbytes:
                    os.posix_fallocate(fd, 0, nbytes)
            finally:
                os.close(fd)
        made.append(path / META)
        write_meta(path, meta)
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


def _open_maps(path: Path, spec: Spec, capacity: int, mode: str) -> dict[str, np.ndarray]:
    """Memory maps ``[capacity, *shape]`` of every field file (checked for size)."""
    maps: dict[str, np.ndarray] = {}
    for name, fname in _file_names(spec).items():
        f = spec[name]
        shape = (capacity, *f.shape)
        nbytes = capacity * f.row_bytes
        fp = path / fname
        size = fp.stat().st_size if fp.exists() else None
        if size != nbytes:
            got = "is missing" if size is None else f"has {size:,} bytes"
            raise ValueError(f"path: {fp} {got}, expected {nbytes:,} bytes; the storage is damaged")
        if nbytes == 0:
            maps[name] = np.zeros(shape, dtype=_np_dtype(f.dtype))
        else:
            maps[name] = np.memmap(fp, dtype=_np_dtype(f.dtype), mode=mode, shape=shape)
    return maps


def read_data(state: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The data of a :meth:`MemmapStorage.state_dict` as copy-on-write maps (file unchanged)."""
    spec = Spec.from_dict(state["spec"])
    return _open_maps(Path(state["path"]), spec, int(state["capacity"]), "c")


class MemmapStorage(ArrayStorage):
    """Rows in one memory-mapped, fully reserved file per field under ``path``.

    Creating checks free disk space first (:func:`rlstash.diag.memory.plan`, ``storage="disk"``)
    and raises :class:`~rlstash.diag.memory.InsufficientMemoryError` (unless
    ``allow_overcommit``) before anything is created. A directory with a ``meta.json``
    reopens instead (same spec and capacity required). The writer's position is kept in
    ``cursor`` / ``size`` (set them with :meth:`set_cursor`; persisted by :meth:`flush` and
    :meth:`close`), plus ``extra``, a small JSON-serializable dict for the caller.
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
        _file_names(self.spec)
        st = _DiskState(self.path, self.spec, self.capacity)
        if (self.path / META).exists():
            self._resume(st)
        else:
            self._create(st, allow_overcommit)
        try:
            maps = _open_maps(self.path, self.spec, self.capacity, "r+")
        except BaseException:
            os.close(st.lock_fd)
            raise
        st.maps = [m for m in maps.values() if isinstance(m, np.memmap)]
        arrays = {k: m.view(np.ndarray) for k, m in maps.items()}  # plain views: no memmap overhead
        tensors = {k: torch.from_numpy(a) for k, a in arrays.items()}  # [capacity, *shape]
        for k, f in self.spec.items():
            if tensors[k].dtype != f.dtype:
                tensors[k] = tensors[k].view(f.dtype)
        self._state = st
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
            extra={"disk": {"block rounding and meta.json": overhead}},
        ).check(allow_overcommit)  # fmt: skip
        _reserve(self.path, self.spec, self.capacity, self.plan.place("disk").needed, _meta(st))
        st.lock_fd = _lock(self.path)

    def _resume(self, st: _DiskState) -> None:
        meta = read_meta(self.path)
        diff = spec_mismatch(self.spec, Spec.from_dict(meta["spec"]))
        if diff:
            raise ValueError(f"path: the storage at {self.path} has another spec: {diff}")
        if int(meta["capacity"]) != self.capacity:
            raise ValueError(
                f"path: the storage at {self.path} has capacity {meta['capacity']}, "
                f"expected {self.capacity}"
            )
        st.cursor, st.size = int(meta["cursor"]), int(meta["size"])
        st.extra = dict(meta.get("extra") or {})
        self.plan = plan(self.spec, self.capacity, "disk", path=self.path)
        st.lock_fd = _lock(self.path)
        for stale in self.path.glob(f"{_TMP_PREFIX}*"):  # from a crash during a meta write
            stale.unlink(missing_ok=True)

    @classmethod
    def open(cls, path: str | os.PathLike) -> MemmapStorage:
        """Reopen the storage at ``path`` with the spec and capacity of its ``meta.json``."""
        meta = read_meta(Path(path))
        return cls(Spec.from_dict(meta["spec"]), int(meta["capacity"]), path)

    def __repr__(self) -> str:
        return f"MemmapStorage({self.spec!r}, capacity={self.capacity}, path={str(self.path)!r})"

    # ------------------------------------------------------------------ writer position
    @property
    def cursor(self) -> int:
        """Next write position (persisted by :meth:`flush`)."""
        return self._state.cursor

    @property
    def size(self) -> int:
        """Rows stored (persisted by :meth:`flush`)."""
        return self._state.size

    @property
    def extra(self) -> dict[str, Any]:
        """A small JSON-serializable dict persisted with the metadata."""
        return self._state.extra

    def set_cursor(self, cursor: int, size: int, extra: Mapping[str, Any] | None = None) -> None:
        """Record the writer's position (``0 <= cursor < capacity``, ``0 <= size <= capacity``)."""
        if not (0 <= cursor < self.capacity) or not (0 <= size <= self.capacity):
            raise ValueError(
                f"cursor/size: expected 0 <= cursor < {self.capacity} and 0 <= size <= "
                f"{self.capacity}, got cursor={cursor} size={size}"
            )
        if extra is not None:
            extra = dict(extra)
            if not _plain(extra):
                json.dumps(extra)  # refuse what cannot be persisted, before changing anything
            self._state.extra = extra
        self._state.cursor, self._state.size = int(cursor), int(size)

    # ------------------------------------------------------------------ lifecycle
    def flush(self) -> None:
        """Sync the data pages (msync), then write ``meta.json`` atomically."""
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
        st = self._state
        return {
            "kind": "MemmapStorage",
            "path": str(self.path),
            "spec": self.spec.to_dict(),
            "capacity": self.capacity,
            "cursor": st.cursor,
            "size": st.size,
            "extra": dict(st.extra),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load a state: this directory's (position only), another directory's (its data are
        copied here) or a :class:`TensorStorage` state with ``data``. Then flushes."""
        self._check_open()
        if "data" in state:
            self._load_arrays(state)
        else:
            diff = spec_mismatch(self.spec, Spec.from_dict(state["spec"]))
            if diff or int(state["capacity"]) != self.capacity:
                raise ValueError(
                    f"state: does not match this storage: {diff or 'capacity ' + str(state['capacity'])}"
                )
            src = Path(state["path"]).absolute()
            if src != self.path:
                for name, m in read_data(state).items():
                    np.copyto(self._arrays[name], m)
        cursor, size = int(state.get("cursor", 0)), int(state.get("size", 0))
        self.set_cursor(cursor, size, state.get("extra"))
        self.flush()
