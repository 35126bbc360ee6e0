"""Atomic checkpoints: a directory swapped in with renames, so a crash leaves the last good one.

Layout of ``runs/<name>/checkpoint/``: ``state.pt`` (agent with optimizers, counters, RNG
states, rate limiter, config) and ``buffer.pt`` (the replay buffer; a disk buffer is flushed in
place and only its cursor and sampler state are written). Writing goes to
``checkpoint.tmp/``; then ``checkpoint/`` becomes ``checkpoint.old/``, ``checkpoint.tmp/``
becomes ``checkpoint/`` and ``checkpoint.old/`` is removed. :func:`latest` finds the newest
complete one, also after a crash between the renames.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch

NAME = "checkpoint"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _save(obj: Any, path: Path) -> None:
    with path.open("wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def save(run_dir: Path, state: dict[str, Any], buffer: Any | None = None) -> Path:
    """Write a checkpoint of ``state`` (and ``buffer`` via its ``save``) atomically."""
    tmp, final, old = run_dir / f"{NAME}.tmp", run_dir / NAME, run_dir / f"{NAME}.old"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    _save(state, tmp / "state.pt")
    if buffer is not None:
        buffer.save(tmp / "buffer.pt")
    (tmp / "COMPLETE").write_text(str(state.get("step", "")))
    _fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    tmp.rename(final)
    _fsync_dir(run_dir)
    shutil.rmtree(old, ignore_errors=True)
    return final


def latest(run_dir: Path) -> Path | None:
    """The newest complete checkpoint directory of a run, or None."""
    for name in (NAME, f"{NAME}.old"):
        path = run_dir / name
        if (path / "COMPLETE").exists():
            return path
    return None


def load_state(path: Path) -> dict[str, Any]:
    """The ``state.pt`` of a checkpoint directory (trusted files only: it is a pickle)."""
    return torch.load(path / "state.pt", weights_only=False)
