"""A run directory: held by one process at a time, and its checkpoint opened with every check.

::

    with hold(run_dir):                       # refuses a run another trainer holds (its PID)
        ckpt, state = read_checkpoint(run_dir)  # manifest, settings, checksums, then torch.load
        ...

:func:`hold` takes an exclusive ``fcntl.flock`` on ``<run_dir>/trainer.lock`` for as long as
the trainer (or ``rlstash verify``) runs, and writes its PID into the file. The kernel releases
the lock when the process ends, however it ends, so a SIGKILLed trainer's run can be resumed at
once and a stale PID in the file means nothing. A second trainer with the same ``--name``, or a
``--resume`` of a run that is still training, is refused with :class:`RunInUse` (a ValueError:
one line naming the PID) before it writes anything. Env workers are started from a fork server
or with ``spawn`` (fresh processes that inherit no descriptor), so they never hold the lock.

:func:`read_checkpoint` opens the newest complete checkpoint (:mod:`rlstash.train.checkpoint`):
its manifest, then the settings it records against those asked for and against the env as it
is now (both before any tensor is read), then ``state.pt``'s checksum, then ``torch.load``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from rlstash.manifest import DamagedFile
from rlstash.settings import field_values
from rlstash.train import checkpoint

LOCK = "trainer.lock"
_IGNORED = ("quiet", "run_dir", "name")  # where and how loudly: not the run's settings


class RunInUse(ValueError):
    """Another live process holds the run directory."""


@dataclasses.dataclass
class Held:
    """A held run directory; ``created``: the outermost directory :func:`hold` made (removed
    again if the block fails before ``keep`` is set)."""

    run_dir: Path
    fd: int
    created: Path | None
    keep: bool = False


@contextlib.contextmanager
def hold(run_dir: Path, create: bool = True, doing: str = "rlstash train") -> Iterator[Held]:
    """Hold ``run_dir`` exclusively for the block (module docstring). With ``create`` a
    missing directory is made; if the block then fails before ``held.keep`` is set (a run
    refused while it is set up), what was made is removed again: nothing is left behind."""
    created = None
    if create and not run_dir.exists():
        created = run_dir
        while not created.parent.exists():
            created = created.parent
        run_dir.mkdir(parents=True, exist_ok=True)
    try:
        held = Held(run_dir, _lock(run_dir, doing), created)
    except BaseException:
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise
    try:
        yield held
    except BaseException:
        if created is not None and not held.keep:
            shutil.rmtree(created, ignore_errors=True)
        raise
    finally:
        os.close(held.fd)  # releases the lock


def _lock(run_dir: Path, doing: str) -> int:
    """An fd holding the exclusive flock on ``run_dir/trainer.lock`` (RunInUse if taken)."""
    path = run_dir / LOCK
    for _ in range(10):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            pid, what = holder(path)
            who = f"PID {pid} ({what})" if pid else "another process"
            raise RunInUse(
                f"run_dir: {run_dir} is in use by {who}, which holds {path}; one process at a "
                f"time: wait for it to end or stop it{f' (kill {pid})' if pid else ''}, or pick "
                "another --name"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False  # removed by a process that gave up the directory: lock the new one
        if same:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {doing}\n".encode(), 0)
            return fd
        os.close(fd)
    raise RunInUse(f"run_dir: {run_dir} keeps being removed while it is locked; try again")


def holder(lock_file: Path) -> tuple[int | None, str]:
    """The PID and role (``rlstash train``, ``rlstash verify``) written in a lock file: its
    holder's while it is held; ``(None, "")`` when unreadable."""
    try:
        pid, _, what = lock_file.read_text().strip().partition(" ")
        return int(pid), what
    except (OSError, ValueError):
        return None, ""


# ---------------------------------------------------------------------------- checkpoints
def read_checkpoint(
    run_dir: Path, requested: Any | None = None
) -> tuple[Path, dict[str, Any], dict[str, Any] | None]:
    """``(checkpoint dir, state, manifest)`` of the newest complete checkpoint of ``run_dir``,
    checked in this order: the manifest; the settings it records against ``requested`` (a
    TrainConfig, e.g. ``train(cfg, resume=...)``: its algorithm, env and history, and what it
    sets apart from the defaults) and against the env now, before any tensor is read;
    ``state.pt``'s size and SHA-256; ``torch.load``. ValueError lines otherwise."""
    from rlstash.envs.make import is_multiagent, probe_env

    ckpt = checkpoint.latest(run_dir)
    if ckpt is None:
        raise ValueError(
            f"run: no complete checkpoint in {run_dir}; start a new run (rlstash train --name ...)"
        )
    newest = run_dir / checkpoint.NAME
    if ckpt != newest and newest.exists():  # not the crash between the renames: it is damaged
        raise DamagedFile(
            newest, "it has no COMPLETE marker (written last)", checkpoint.fix_for(newest)
        )
    man = checkpoint.read_manifest(ckpt)
    if man is not None:
        config = man["config"]
        if requested is not None:
            checkpoint.check_settings(
                ckpt, _flat(config), _asked(requested), "the config asks for",
                "a run resumes with its own settings: call train(resume=...) without a config, "
                "or start a new run under another run_name",
            )  # fmt: skip
        if is_multiagent(config.get("env", "")):  # its agents, groups and their spaces
            from rlstash.train.marl import settings_now

            spaces = settings_now(config)
        else:
            info = probe_env(config.get("env", ""), config.get("history", 0))
            spaces = {
                "obs_space": checkpoint.describe_space(info.obs_space),
                "action_space": checkpoint.describe_space(info.act_space),
            }
        checkpoint.check_settings(
            ckpt, man["settings"], spaces, f"the env {config.get('env')} now has",
            "its networks do not fit it: make the env as it was when the run was trained, or "
            "start a new run",
        )  # fmt: skip
    state = checkpoint.load_state(ckpt, man)
    if man is None and requested is not None:
        checkpoint.check_settings(
            ckpt, _flat(state["config"]), _asked(requested), "the config asks for",
            "a run resumes with its own settings: call train(resume=...) without a config",
        )  # fmt: skip
    return ckpt, state, man


def _asked(cfg: Any) -> dict[str, Any]:
    """What ``cfg`` asks of a resumed run, named as :func:`_flat` names a recorded config:
    the run's identity (algorithm, env, history) always, every other setting where it differs
    from the default (where it was given), and the agent settings it gives."""
    from rlstash.train.config import TrainConfig

    default = TrainConfig()
    given, defaults = field_values(cfg), field_values(default)
    out = {k: given[k] for k in ("algo", "env", "history")}
    for name, value in given.items():
        if name not in (*out, "agent", *_IGNORED) and value != defaults[name]:
            out[name] = value
    out.update({f"agent.{k}": v for k, v in (cfg.agent or {}).items()})
    return out


def _flat(config: Mapping[str, Any]) -> dict[str, Any]:
    """A recorded config with its agent settings as ``agent.NAME``."""
    out = {k: v for k, v in config.items() if k != "agent"}
    out.update({f"agent.{k}": v for k, v in (config.get("agent") or {}).items()})
    return out


def recorded_config(run_dir: Path) -> dict[str, Any] | None:
    """The config of the newest checkpoint as its manifest records it (no tensor is read);
    None when there is no readable one."""
    ckpt = checkpoint.latest(run_dir)
    try:
        man = checkpoint.read_manifest(ckpt) if ckpt is not None else None
    except ValueError:
        return None
    return None if man is None else man["config"]


def resume_conflict(
    run_dir: Path, given: Mapping[str, Any], labels: Mapping[str, str]
) -> str | None:
    """For ``rlstash train --resume RUN`` given settings: the first one that differs from the
    run's recorded config, as one line naming the flag, the checkpoint's value, the value
    given and the fix; None when none differs (or the run has no readable manifest)."""
    config = recorded_config(run_dir)
    if config is None:
        return None
    for name, value in given.items():
        saved = config.get(name, config.get("agent", {}).get(name))
        if saved is not None and checkpoint.as_json(saved) != checkpoint.as_json(value):
            label = labels.get(name, name)
            return (
                f"{label}: the run in {run_dir} was trained with {name} = "
                f"{checkpoint.show_value(saved)}, got {checkpoint.show_value(value)}; --resume continues a "
                f"run with its own settings: drop {label}, or start a new run with another --name"
            )
    return None
