"""Directories named in saved storage states: relative in a file, absolute in memory.

A disk storage's ``state_dict`` names its directory (``{"kind": "MemmapStorage", "path":
...}``, also inside a stream's ``backing`` or a tiered storage's ``cold`` tier). Saved as it
is, the absolute path would tie the file to where it was written: a copied run directory
would resume against the original's data, a moved one against a directory that is gone.
:func:`relative` rewrites every such path relative to the directory of the file that stores
it (``checkpoint/buffer.pt`` -> ``../buffer``) before saving; :func:`resolve` turns them back
into absolute paths against the file's directory *now*, and refuses a directory that is not
there (or lacks the files it was saved with) instead of creating an empty one.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rlstash.manifest import DamagedFile

__all__ = ["relative", "resolve"]

_SAVED = "saved_path"  # the absolute path at save time: for error messages only


def _walk(state: Any, change: Callable[[dict[str, Any]], dict[str, Any]]) -> Any:
    """A copy of ``state`` with ``change`` applied to every storage state that names a path."""
    if isinstance(state, Mapping):
        out = {k: _walk(v, change) for k, v in state.items()}
        if "kind" in out and isinstance(out.get("path"), str):
            out = change(out)
        return out
    return state


def relative(state: Mapping[str, Any], base: str | os.PathLike) -> dict[str, Any]:
    """``state`` with every storage ``path`` relative to the directory ``base``."""
    base = os.path.abspath(base)

    def change(s: dict[str, Any]) -> dict[str, Any]:
        path = os.path.abspath(s["path"])
        return {**s, "path": os.path.relpath(path, base), _SAVED: path}

    return _walk(state, change)


def resolve(state: Mapping[str, Any], file: str | os.PathLike) -> dict[str, Any]:
    """``state`` (read from ``file``) with every storage ``path`` absolute, resolved against
    ``file``'s directory (absolute paths, from files saved by an older rlstash, are kept).
    :class:`~rlstash.manifest.DamagedFile` naming ``file`` when a directory is missing or
    lacks its metadata (a disk storage's ``meta.json``, a disk stream's bookkeeping)."""
    file = Path(file)
    base = file.absolute().parent

    def change(s: dict[str, Any]) -> dict[str, Any]:
        path = os.path.normpath(base / s["path"])
        saved = s.get(_SAVED)
        _check_dir(file, Path(path), s, saved)
        out = {k: v for k, v in s.items() if k != _SAVED}
        out["path"] = path
        return out

    out = _walk(state, change)
    _check_streams(file, out)
    return out


def _check_dir(file: Path, path: Path, state: Mapping[str, Any], saved: str | None) -> None:
    from rlstash.storage.disk_layout import META

    moved = f", written at {saved}" if saved and os.path.normpath(saved) != str(path) else ""
    if not path.is_dir():
        raise DamagedFile(
            path,
            f"it does not exist ({file.name} refers to it, the {state['kind']} directory{moved})",
            f"keep {file.name} and {path.name}/ where they were to each other (copy or move a "
            f"run directory as a whole), or restore {path} from a copy",
        )
    if state["kind"] == "MemmapStorage" and not (path / META).is_file():
        raise DamagedFile(
            path / META,
            f"it is missing (the {state['kind']} directory's metadata; {file.name} refers to it)",
            f"restore {path} from a copy",
        )


def stream_dirs(state: Any) -> list[str]:
    """The directories of the disk streams in a storage state (a tiered one's disk tier)."""
    if not isinstance(state, Mapping):
        return []
    if state.get("kind") == "StreamStorage":
        path = _first_path(state.get("backing"))
        return [] if path is None else [path]
    return [p for value in state.values() for p in stream_dirs(value)]


def _check_streams(file: Path, state: Any) -> None:
    """A disk stream's directory must hold its bookkeeping file beside the data."""
    from rlstash.storage.stream_commit import NPZ

    for path in stream_dirs(state):
        if not (Path(path) / NPZ).is_file():
            raise DamagedFile(
                Path(path) / NPZ,
                f"it is missing (the disk stream's bookkeeping: which slots hold which steps; "
                f"{file.name} refers to it)",
                f"restore {path} from a copy",
            )


def _first_path(state: Any) -> str | None:
    if not isinstance(state, Mapping):
        return None
    if "kind" in state and isinstance(state.get("path"), str):
        return state["path"]
    for value in state.values():
        found = _first_path(value)
        if found is not None:
            return found
    return None
