"""Atomic checkpoints: a directory swapped in with renames, so a crash leaves the last good one.

Layout of ``runs/<name>/checkpoint/``: ``state.pt`` (agent with optimizers, counters, RNG
states, rate limiter, config) and ``buffer.pt`` (the replay buffer; a disk buffer is flushed in
place and only its cursor and sampler state are written). Writing goes to
``checkpoint.tmp/``; then ``checkpoint/`` becomes ``checkpoint.old/``, ``checkpoint.tmp/``
becomes ``checkpoint/`` and ``checkpoint.old/`` is removed. :func:`latest` finds the newest
complete one, also after a crash between the renames. A write that fails (a full disk) removes
``checkpoint.tmp/`` and raises :class:`CheckpointError`, one line saying that the previous
checkpoint is intact.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from rlstash.atomic import fsync_dir, write_atomic

NAME = "checkpoint"


class CheckpointError(OSError):
    """Writing a checkpoint failed (e.g. a full disk); the previous checkpoint is intact."""


def save(run_dir: Path, state: dict[str, Any], buffer: Any | None = None) -> Path:
    """Write a checkpoint of ``state`` (and ``buffer`` via its ``save``) atomically."""
    tmp, final, old = run_dir / f"{NAME}.tmp", run_dir / NAME, run_dir / f"{NAME}.old"
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        write_atomic(tmp / "state.pt", lambda f: torch.save(state, f))
        if buffer is not None:
            buffer.save(tmp / "buffer.pt")
        write_atomic(tmp / "COMPLETE", str(state.get("step", "")).encode())
        fsync_dir(tmp)
    except (OSError, RuntimeError) as err:
        exc = _os_error(err)  # torch.save reports a full disk as a RuntimeError
        if exc is None:
            raise
        shutil.rmtree(tmp, ignore_errors=True)
        prev = latest(run_dir)
        kept = f"the previous checkpoint {prev} is intact" if prev else "no earlier checkpoint"
        raise CheckpointError(
            f"checkpoint at step {state.get('step', '?')} not written ({exc.strerror or exc}: "
            f"{exc.filename or tmp}); {kept}. Fix: free space under {run_dir}, then continue "
            f"with --resume {run_dir}"
        ) from exc
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    tmp.rename(final)
    fsync_dir(run_dir)
    shutil.rmtree(old, ignore_errors=True)
    return final


def _os_error(exc: BaseException | None) -> OSError | None:
    """The OSError behind ``exc`` (itself, or in its chain of causes), if any."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, OSError):
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


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
