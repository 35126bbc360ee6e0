"""Stopping worker processes and releasing what they held (torch-free).

Used by :class:`~rlstash.envs.process_backend.ProcessBackend` and the async collector's
fleet: CLOSE to every worker, wait for each to end, SIGKILL what is left, reap all, stop the
fork server, close the pipes and the shared segment, and say how a dead worker ended.
"""

from __future__ import annotations

import os
import time
from typing import Any

from rlstash.envs import protocol as P
from rlstash.envs.launch import Launcher, WorkerProcess

CLOSE_TIMEOUT = 5.0  # seconds for workers to close their envs before SIGKILL


def describe_exit(code: int | None) -> str:
    """``-11`` -> ``"signal 11 (SIGSEGV)"``; ``1`` -> ``"exit code 1"``."""
    if code is None:
        return "an unknown status"
    if code < 0:
        import signal

        try:
            return f"signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def stop_workers(procs: list[WorkerProcess], timeout: float = CLOSE_TIMEOUT) -> None:
    """CLOSE to all, wait up to ``timeout`` s for them to end (EOF), SIGKILL what is left,
    reap all."""
    for p in procs:
        if p.cmd_fd >= 0:
            try:
                P.send(p.cmd_fd, P.CLOSE)
            except (P.PeerGone, OSError):
                pass
    deadline = time.monotonic() + timeout
    for p in procs:
        if p.reply_fd >= 0:
            _wait_eof(p.reply_fd, deadline)
        p.kill()  # ended already in the normal case; the kill is then a no-op
        p.reap(timeout)


def death_text(proc: WorkerProcess, timeout: float = CLOSE_TIMEOUT) -> str:
    """Make sure ``proc`` is gone (SIGKILL, reap within ``timeout`` s) and say how it ended."""
    proc.kill()
    code = proc.reap(timeout)
    return f"worker process {proc.pid} ended with {describe_exit(code)}"


def release_workers(
    owner: int,
    procs: list[WorkerProcess],
    launcher: Launcher,
    shared: Any,
    mem_fd: int,
    timeout: float = CLOSE_TIMEOUT,
) -> None:
    """Stop ``procs`` (CLOSE, wait up to ``timeout`` s, SIGKILL, reap) and the launcher's fork
    server, unless this process is a forked copy of their ``owner`` (it must not stop them);
    then, always, close their pipes, the ``shared`` arrays (if any) and the segment's
    ``mem_fd`` (if >= 0)."""
    try:
        if os.getpid() == owner:
            try:
                stop_workers(procs, timeout)
            finally:
                launcher.close(timeout)
    finally:
        for p in procs:
            p.close_pipes()
        if shared is not None:
            shared.close()
        if mem_fd >= 0:
            os.close(mem_fd)


def _wait_eof(fd: int, deadline: float) -> None:
    """Discard replies until the worker closes its end (it exited) or the deadline."""
    while True:
        try:
            P.recv(fd, deadline)
        except (P.PeerGone, P.ReplyTimeout, OSError):
            return
