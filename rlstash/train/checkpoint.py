"""Atomic, checksummed checkpoints: a directory swapped in with renames, so a crash leaves the
last good one, and checked against its manifest before anything in it is used.

Layout of ``runs/<name>/checkpoint/``:

* ``state.pt``: agent with optimizers, counters, RNG states, rate limiter, config, settings;
* ``buffer.pt``: the replay buffer (a disk buffer is flushed in place and only its cursor,
  sampler state and bookkeeping are written; its directory is stored relative to the file,
  ``../buffer``, so a copied or moved run directory resumes from its own data);
* ``MANIFEST.json`` (:mod:`rlstash.manifest`): size and SHA-256 of ``state.pt`` and
  ``buffer.pt``, and the run's config and recorded settings as JSON (algorithm, env,
  ``net_arch``, observation and action spaces), written atomically after both;
* ``COMPLETE``: the step, written last: the directory is complete.

Writing goes to ``checkpoint.tmp/``; the checkpoint before the previous one
(``checkpoint.old/``) is removed, ``checkpoint/`` becomes ``checkpoint.old/`` and
``checkpoint.tmp/`` becomes ``checkpoint/``. ``checkpoint.old/`` is kept: it is what a damaged
checkpoint's fix points to. :func:`latest` finds the newest complete one, also after a crash
between the renames. A write that fails (a full disk) removes ``checkpoint.tmp/`` and raises
:class:`CheckpointError`, one line naming the file, the cause and that the previous checkpoint
is intact.

What the manifest covers, and why: the checkpoint's own files, hashed while they are written
(no second read). Not the data files of a disk buffer: they can hold many GB that a checkpoint
does not rewrite (it flushes them in place), and hashing them at every checkpoint would cost as
much as copying them. Those are checked where they are opened instead (``meta.json``,
``commit.rec`` and every data file's exact size, :mod:`rlstash.storage.disk_layout`), and
``rlstash verify RUN`` scans their rows for non-finite values.

Reading (:func:`load_state`): the manifest first, then (by the caller, before any tensor is
read) the recorded settings against what is asked for now (:func:`check_settings`), then each
file's size and SHA-256, then ``torch.load``. Every failure is one line,
:class:`~rlstash.manifest.DamagedFile` (a ValueError) naming the file, what is wrong and the
fix (:func:`fix_for`); :func:`reading` turns what loading a checkpoint's contents can raise
(EOFError, UnpicklingError, BadZipFile, OSError for a file cut short, a ``load_state_dict``
RuntimeError, a KeyError for a missing key) into the same. A checkpoint of an rlstash before manifests (``state.pt`` without
``format``) loads unchecked.
"""

from __future__ import annotations

import contextlib
import errno
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlstash import manifest
from rlstash.atomic import fsync_dir, write_atomic
from rlstash.manifest import DamagedFile

NAME = "checkpoint"
FORMAT = 2  # 1 (no "format" key): before manifests
KIND = "rlstash.checkpoint"
STATE, BUFFER = "state.pt", "buffer.pt"


class CheckpointError(OSError):
    """Writing a checkpoint failed (e.g. a full disk); the previous checkpoint is intact."""


class SettingsMismatch(ValueError):
    """A checkpoint made with other settings than those asked for (or than the env has now)."""


def save(run_dir: Path, state: dict[str, Any], buffer: Any | None = None) -> Path:
    """Write a checkpoint of ``state`` (and ``buffer`` via its ``save``) atomically, with its
    manifest (module docstring)."""
    tmp, final, old = run_dir / f"{NAME}.tmp", run_dir / NAME, run_dir / f"{NAME}.old"
    state = {**state, "format": FORMAT}
    writing = tmp
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)  # checkpoint/ stays: at most two copies
        tmp.mkdir(parents=True)
        writing = tmp / STATE
        entry = manifest.write_hashed(writing, lambda f: torch.save(state, f))
        if buffer is not None:
            writing = tmp / BUFFER
            buffer.save(writing)  # adds its own entry to the manifest
        writing = tmp / manifest.NAME
        manifest.record(tmp, {STATE: entry}, _recorded(state))
        writing = tmp / "COMPLETE"
        write_atomic(writing, str(state.get("step", "")).encode())
        fsync_dir(tmp)
    except (OSError, RuntimeError) as err:
        cause = _write_failure(err, run_dir)
        if cause is None:
            raise
        shutil.rmtree(tmp, ignore_errors=True)
        prev = latest(run_dir)
        kept = f"the previous checkpoint {prev} is intact" if prev else "no earlier checkpoint"
        todo = f"free space under {run_dir}" if "disk is full" in cause else "remove the cause"
        raise CheckpointError(
            f"checkpoint at step {state.get('step', '?')} not written: writing {writing} failed "
            f"({cause}); {kept}. Fix: {todo}, then continue with --resume {run_dir}"
        ) from err
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    fsync_dir(run_dir)
    return final


def _recorded(state: dict[str, Any]) -> dict[str, Any]:
    """What the manifest records besides the files: read before any tensor is loaded."""
    return {
        "kind": KIND,
        "checkpoint_format": FORMAT,
        "step": state.get("step"),
        "config": state.get("config", {}),
        "settings": state.get("settings", {}),
    }


def _write_failure(err: BaseException, run_dir: Path) -> str | None:
    """Why a checkpoint write failed, in words (None: not a write failure, re-raised). torch
    reports a failed write as a RuntimeError ("enforce fail at inline_container.cc...",
    "PytorchStreamWriter failed writing"); its OSError cause (or the free space) says more."""
    from rlstash.memory import disk_free, human_bytes

    exc: BaseException | None = err
    for _ in range(10):  # the OSError behind ``err`` (itself, or in its chain of causes)
        if exc is None or isinstance(exc, OSError):
            break
        exc = exc.__cause__ or exc.__context__
    if isinstance(exc, OSError):
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return f"the disk is full: {exc.strerror}"
        return exc.strerror or str(exc)
    text = str(err)
    if "enforce fail" not in text and "PytorchStreamWriter" not in text:
        return None
    try:
        free = disk_free(run_dir)
    except OSError:
        free = -1
    if 0 <= free < 1 << 20:
        return f"the disk is full: No space left on device ({human_bytes(free)} free)"
    return f"torch's writer failed; {human_bytes(max(free, 0))} free on that disk"


def latest(run_dir: Path) -> Path | None:
    """The newest complete checkpoint directory of a run, or None."""
    for name in (NAME, f"{NAME}.old"):
        path = run_dir / name
        if (path / "COMPLETE").exists():
            return path
    return None


def fix_for(ckpt: Path) -> str:
    """What to do about a damaged checkpoint: use the previous one when it is kept."""
    run, old = ckpt.parent, ckpt.parent / f"{NAME}.old"
    if ckpt.name == NAME and (old / "COMPLETE").exists():
        return (
            f"move it aside (mv {ckpt} {run / (NAME + '.damaged')}); the run then continues from "
            f"the previous checkpoint {old} (rlstash train --resume {run}; rlstash verify {run} "
            "checks it first)"
        )
    return f"no earlier checkpoint of {run} is kept: restore {ckpt} from a copy, or start a new run"


def read_manifest(ckpt: Path) -> dict[str, Any] | None:
    """The checked manifest of checkpoint ``ckpt``; None for a checkpoint of an rlstash before
    manifests (then :func:`load_state` decides whether it is one); DamagedFile otherwise."""
    try:
        man = manifest.read(ckpt)
    except DamagedFile as exc:
        raise exc.with_fix(fix_for(ckpt)) from None
    if man is None:
        return None
    file = ckpt / manifest.NAME
    if man.get("kind") != KIND or STATE not in man["files"]:
        raise DamagedFile(file, f"it is not a checkpoint's manifest (no {STATE})", fix_for(ckpt))
    if not isinstance(man.get("config"), dict) or not isinstance(man.get("settings"), dict):
        raise DamagedFile(file, "its 'config' or 'settings' is not a table", fix_for(ckpt))
    return man


def verify_file(ckpt: Path, name: str, man: dict[str, Any]) -> None:
    """Size and SHA-256 of ``ckpt/name`` against the manifest (DamagedFile with the fix)."""
    manifest.verify(ckpt / name, man, fix_for(ckpt))


def load_state(path: Path, man: dict[str, Any] | None | bool = True) -> dict[str, Any]:
    """The verified ``state.pt`` of checkpoint directory ``path`` (trusted files only: it is a
    pickle). ``man``: its manifest when already read (:func:`read_manifest`), else read here.
    A damaged, missing or unlisted file is a :class:`~rlstash.manifest.DamagedFile`."""
    if man is True:
        man = read_manifest(path)
    if man:
        verify_file(path, STATE, man)
    with reading(path / STATE):
        state = manifest.load_torch(path / STATE)
        if not isinstance(state, dict):
            raise TypeError(f"it holds a {type(state).__name__}, not a checkpoint's state")
        for key in ("step", "config", "agent"):
            state[key]  # noqa: B018 - a KeyError names the missing key
    if not man and state.get("format", 1) >= 2:  # written with a manifest, which is gone
        raise DamagedFile(
            path / manifest.NAME, f"it is missing ({STATE} was written with one)", fix_for(path)
        )
    return state


@contextlib.contextmanager
def reading(file: Path) -> Iterator[None]:
    """Turn what loading ``file`` (a checkpoint's) can raise into one DamagedFile line with
    the checkpoint's fix. A DamagedFile without a fix of its own gets that fix (one with its
    own, e.g. a missing disk buffer that both checkpoints use, keeps it); unpickling errors
    are already DamagedFiles (:func:`rlstash.manifest.load_torch`); RuntimeError
    (``load_state_dict`` of other shapes), KeyError (a missing key), OSError, TypeError,
    IndexError and AttributeError of a state that does not fit say that it does not load.
    Other errors pass unchanged."""
    fix = fix_for(file.parent)
    try:
        yield
    except DamagedFile as exc:  # a file's own damage: the earlier checkpoint is the fix
        raise (exc.with_fix(fix) if exc.fix == manifest.RESTORE else exc) from None
    except FileNotFoundError:
        raise DamagedFile(file, "it is missing", fix) from None
    except (RuntimeError, KeyError, TypeError, IndexError, AttributeError, OSError) as exc:
        raise DamagedFile(file, f"it does not load ({manifest.one_line(exc)})", fix) from None


# ---------------------------------------------------------------------------- settings
def describe_space(space: Any) -> str:
    """``Box(4,) float32``, ``Discrete(2)``: what the networks' shapes depend on."""
    if isinstance(space, gym.spaces.Discrete | gym.spaces.MultiBinary) and np.ndim(space.n) == 0:
        return f"{type(space).__name__}({int(space.n)})"
    if isinstance(space, gym.spaces.Space) and space.shape is not None:
        return f"{type(space).__name__}{tuple(space.shape)} {space.dtype or ''}".strip()
    return repr(space)


def settings(cfg: Any, info: Any) -> dict[str, Any]:
    """The settings a checkpoint records for its compatibility checks: algorithm, env,
    history, ``net_arch`` and the spaces the agent was built for (``cfg`` resolved,
    ``info`` the env's :class:`~rlstash.train.builders.EnvInfo`)."""
    return {
        "algo": cfg.algo,
        "env": cfg.env,
        "history": cfg.history,
        "net_arch": as_json(cfg.agent.get("net_arch")),
        "obs_space": describe_space(info.obs_space),
        "action_space": describe_space(info.act_space),
    }


def as_json(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples become lists), for comparisons."""
    return json.loads(json.dumps(value, default=str))


def check_settings(
    ckpt: Path, recorded: dict[str, Any], now: dict[str, Any], why: str, fix: str
) -> None:
    """Refuse a checkpoint whose ``recorded`` settings differ from ``now`` (those of the env as
    it is now, or those asked for), before any tensor is read: one line naming the setting,
    the checkpoint's value, the value now (``why`` says whose) and the ``fix``."""
    for key, value in now.items():
        if key in recorded and as_json(recorded[key]) != as_json(value):
            raise SettingsMismatch(
                f"checkpoint {ckpt}: {key} is {show_value(recorded[key])} in it, {why} "
                f"{show_value(value)}; {fix}"
            )


def show_value(value: Any) -> str:
    return f"'{value}'" if isinstance(value, str) else json.dumps(as_json(value))
