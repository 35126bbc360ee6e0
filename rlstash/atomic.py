"""Atomic file writes: a reader sees the old file or the new one, never half of one.

:func:`write_atomic` is the one way rlstash replaces a file (a disk storage's ``meta.json``,
a stream's bookkeeping, a saved buffer, a checkpoint's files): the bytes go to a temp file in
the same directory, which is fsynced, renamed over the target with ``os.replace`` (atomic on
POSIX), and then the directory is fsynced so the rename itself survives a power loss. On any
failure (a full disk, a signal) the temp file is removed and the old file is left as it was.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

__all__ = ["fsync_dir", "write_atomic"]

TMP_MARK = ".tmp."  # temp files are named ``.<name>.tmp.<pid>``


def fsync_dir(path: str | os.PathLike) -> None:
    """fsync the directory ``path`` (makes renames and new entries in it durable)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_name(path: Path) -> Path:
    """The temp file :func:`write_atomic` uses for ``path`` in this process."""
    return path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}")


def write_atomic(path: str | os.PathLike, data: bytes | Callable[[BinaryIO], object]) -> Path:
    """Replace ``path`` with ``data`` atomically: temp file, fsync, ``os.replace``, fsync dir.

    ``data`` is the bytes to write, or a function given the open binary file that writes
    them (e.g. ``lambda f: torch.save(obj, f)``), so large objects are streamed, not copied.
    Returns ``path``. On failure nothing is left behind and the old file is intact.
    """
    path = Path(path)
    tmp = temp_name(path)
    try:
        with open(tmp, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path
