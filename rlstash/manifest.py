"""Checksummed files: a directory's ``MANIFEST.json`` lists what was saved in it, and a file
is checked against it before it is read.

::

    {"format": "rlstash.manifest", "version": 1,
     "files": {"buffer.pt": {"bytes": 123456, "sha256": "9f86d0..."}},
     ...}                                  # the writer's own keys (a checkpoint's settings)

:func:`write_hashed` writes a file atomically (:func:`rlstash.atomic.write_atomic`) and hashes
the bytes as they are written, so saving reads nothing back; :func:`record` then adds the
file's entry to the manifest, itself replaced atomically. :func:`verify` checks a file's size
and SHA-256 (the digest ``sha256sum`` prints) against its directory's manifest and raises
:class:`DamagedFile` (a ValueError: one line naming the file, what is wrong and the fix).
Used by :meth:`rlstash.replay.ReplayBuffer.save`/``load`` and by the training checkpoints
(:mod:`rlstash.train.checkpoint`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from rlstash.atomic import write_atomic

__all__ = [
    "NAME", "DamagedFile", "digest", "load_torch", "one_line", "read", "record", "verify",
    "write_hashed",
]  # fmt: skip

NAME = "MANIFEST.json"
FORMAT = "rlstash.manifest"
VERSION = 1
_CHUNK = 1 << 20
RESTORE = "restore it from a copy"


class DamagedFile(ValueError):
    """A file that is missing, of the wrong size or checksum, or that does not load: one line
    naming the file, what is wrong and the fix (``file``, ``what``, ``fix`` kept apart, so a
    caller that knows a better fix, e.g. an earlier checkpoint, can say it instead)."""

    def __init__(self, file: str | os.PathLike, what: str, fix: str = RESTORE) -> None:
        self.file, self.what, self.fix = Path(file), what, fix
        super().__init__(f"{self.file} is damaged: {what}; fix: {fix}")

    def with_fix(self, fix: str) -> DamagedFile:
        """The same finding with another fix."""
        return DamagedFile(self.file, self.what, fix)


class _Hashing:
    """A binary file that hashes what is written through it (``torch.save`` writes in order)."""

    def __init__(self, f: BinaryIO) -> None:
        self.f, self.sha, self.bytes = f, hashlib.sha256(), 0

    def write(self, data: Any) -> int:
        self.sha.update(data)
        self.bytes += memoryview(data).nbytes
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()


def digest(path: str | os.PathLike) -> dict[str, Any]:
    """``{"bytes", "sha256"}`` of the file at ``path``, read in 1 MiB chunks."""
    sha, n = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            sha.update(chunk)
            n += len(chunk)
    return {"bytes": n, "sha256": sha.hexdigest()}


def write_hashed(path: str | os.PathLike, data: bytes | Callable[[Any], object]) -> dict[str, Any]:
    """:func:`~rlstash.atomic.write_atomic` of ``data`` (bytes, or a function given the open
    file, e.g. ``lambda f: torch.save(obj, f)``); returns the file's ``{"bytes", "sha256"}``,
    hashed while it was written (re-read only if the writer did not write in order)."""
    box: list[_Hashing] = []

    def write(f: BinaryIO) -> None:
        h = _Hashing(f)
        box.append(h)
        if callable(data):
            data(h)
        else:
            h.write(data)

    path = write_atomic(path, write)
    h = box[0]
    if h.bytes != os.stat(path).st_size:  # a writer that seeked: hash what is on disk
        return digest(path)
    return {"bytes": h.bytes, "sha256": h.sha.hexdigest()}


def read(directory: str | os.PathLike) -> dict[str, Any] | None:
    """The checked ``MANIFEST.json`` of ``directory``; None when there is none;
    :class:`DamagedFile` when it does not parse or lacks its keys."""
    file = Path(directory) / NAME
    try:
        text = file.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise DamagedFile(file, f"it cannot be read ({exc.strerror or exc})") from None
    try:
        man = json.loads(text)
    except ValueError as exc:
        raise DamagedFile(file, f"it is not valid JSON ({exc})") from None
    if not isinstance(man, dict) or man.get("format") != FORMAT:
        raise DamagedFile(file, f"it is not an rlstash manifest (format {_get(man, 'format')!r})")
    if man.get("version") != VERSION:
        raise DamagedFile(
            file,
            f"manifest version {man.get('version')!r}, this rlstash reads {VERSION}",
            "read it with the rlstash that wrote it",
        )
    files = man.get("files")
    ok = isinstance(files, dict) and all(
        isinstance(e, dict)
        and type(e.get("bytes")) is int
        and isinstance(e.get("sha256"), str)
        and len(e["sha256"]) == 64
        for e in files.values()
    )
    if not ok:
        raise DamagedFile(file, "its 'files' entries are not {name: {bytes, sha256}}")
    return man


def load_torch(path: str | os.PathLike) -> Any:
    """``torch.load`` of a file rlstash wrote (trusted: it is a pickle). Unpickling damaged
    bytes can raise almost any exception (UnpicklingError, UnicodeDecodeError, OverflowError
    and MemoryError of a flipped length, ValueError of an unknown opcode, AttributeError,
    TypeError, ImportError of a flipped class name, ...), so every Exception but a missing
    file becomes one :class:`DamagedFile` naming ``path``; a missing file stays
    FileNotFoundError for the caller to name."""
    import torch

    try:
        return torch.load(path, weights_only=False)
    except FileNotFoundError:
        raise
    except Exception as exc:  # noqa: BLE001 - the class is "whatever damaged bytes raise"
        raise DamagedFile(path, f"it does not load ({one_line(exc)})") from None


def one_line(exc: BaseException) -> str:
    """``Type: message`` of an exception on one line, at most ~200 characters."""
    text = " ".join(str(exc).split())
    text = text if len(text) <= 200 else text[:197] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _get(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, dict) else None


def record(
    directory: str | os.PathLike,
    files: Mapping[str, Mapping[str, Any]],
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """Add ``files`` (name -> ``{"bytes", "sha256"}``) and the keys of ``extra`` to the
    manifest of ``directory`` (created when missing; a damaged one is replaced), atomically."""
    directory = Path(directory)
    try:
        man = read(directory) or {}
    except DamagedFile:
        man = {}
    entries = dict(man.get("files", {}))
    entries.update(
        {k: {"bytes": int(v["bytes"]), "sha256": str(v["sha256"])} for k, v in files.items()}
    )
    out = {**man, **(extra or {}), "format": FORMAT, "version": VERSION, "files": entries}
    text = json.dumps(out, indent=1, sort_keys=True, default=_jsonable)
    return write_atomic(directory / NAME, text.encode())


def _jsonable(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    return str(value)


def verify(
    path: str | os.PathLike, man: Mapping[str, Any] | None = None, fix: str = RESTORE
) -> dict[str, Any]:
    """Check the file at ``path`` against ``man`` (default: its directory's manifest, which
    must list it): it exists, has the recorded size, then the recorded SHA-256. Returns its
    entry; :class:`DamagedFile` naming what differs otherwise."""
    path = Path(path)
    if man is None:
        man = read(path.parent)
        if man is None:
            raise DamagedFile(
                path,
                f"no {NAME} beside it (it lists the size and checksum of each saved file)",
                f"copy {NAME} along with it, or restore both from a copy",
            )
    entry = man["files"].get(path.name)
    if entry is None:
        raise DamagedFile(path, f"{path.parent / NAME} does not list it", fix)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise DamagedFile(path, f"it is missing ({NAME} lists it)", fix) from None
    if size != entry["bytes"]:
        raise DamagedFile(path, f"{size:,} bytes, {NAME} says {entry['bytes']:,}", fix)
    got = digest(path)["sha256"]
    if got != entry["sha256"]:
        raise DamagedFile(
            path, f"its SHA-256 {got[:12]}... differs from {entry['sha256'][:12]}... in {NAME}", fix
        )
    return dict(entry)
