"""Starting, stopping and reaping worker processes (torch-free).

Three start methods, none of which re-imports the caller's ``__main__`` in the child:

* ``forkserver`` (default where available): a per-pool fork server (:mod:`forkserver`) that
  imported only numpy/gymnasium forks each worker; restarts are cheap.
* ``spawn``: a fresh ``python -c`` interpreter per worker.
* ``fork``: ``os.fork()`` of the calling process (only when asked: the child inherits the
  caller's modules, torch included, and its threads' locks).

Children get :func:`child_environ`: CUDA hidden (``CUDA_VISIBLE_DEVICES=""``), one thread per
math library, and ``RLSTASH_PARENT_PID`` naming the pool's process (a marker to find them).
SIGINT is blocked while a child starts and ignored by the child: Ctrl-C reaches the parent,
which stops its workers itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import rlstash
from rlstash.envs.forkserver import ForkServerClient

START_METHODS = ("forkserver", "spawn", "fork")
WORKER_DEFAULT_ENV = {
    "CUDA_VISIBLE_DEVICES": "",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "NUMEXPR_NUM_THREADS": "1",
    "VECLIB_MAXIMUM_THREADS": "1",
}
MARKER = "RLSTASH_PARENT_PID"
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(rlstash.__file__)))


def default_start_method() -> str:
    """``forkserver`` where Unix sockets can pass descriptors (Linux, macOS), else ``spawn``."""
    import socket

    if hasattr(socket, "send_fds") and hasattr(socket, "AF_UNIX"):
        return "forkserver"
    return "spawn"


def child_environ(overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """The parent's environment + :data:`WORKER_DEFAULT_ENV` + marker + ``overrides``."""
    env = dict(os.environ)
    env.update(WORKER_DEFAULT_ENV)
    env[MARKER] = str(os.getpid())
    env.update({str(k): str(v) for k, v in (overrides or {}).items()})
    return env


def start_python(code: str, pass_fds: Sequence[int], env: Mapping[str, str]) -> subprocess.Popen:
    """``python -c code`` with SIGINT ignored from its first instruction on."""
    prologue = (
        "import signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
        f"sys.path.insert(0, {_PACKAGE_ROOT!r}); "
    )
    # Block SIGINT while forking so a Ctrl-C cannot hit the child before it ignores SIGINT;
    # the blocked mask is inherited through exec and lifted by the child itself.
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        return subprocess.Popen(
            [sys.executable, "-c", prologue + code],
            pass_fds=tuple(pass_fds),
            env=dict(env),
            close_fds=True,
        )
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class WorkerProcess:
    """One worker: its pid, the parent's pipe ends, and how to kill and reap it."""

    def __init__(self, pid: int, cmd_fd: int, reply_fd: int, reaper: object) -> None:
        self.pid = pid
        self.cmd_fd = cmd_fd  # parent writes commands here
        self.reply_fd = reply_fd  # parent reads replies here
        self._reaper = reaper  # Popen | ForkServerClient | None (fork: we are the parent)
        self.exitcode: int | None = None

    def kill(self) -> None:
        """SIGKILL (no-op once reaped)."""
        if self.exitcode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def reap(self, timeout: float) -> int | None:
        """Wait up to ``timeout`` s for the exit; the exit code (negative: signal) or None."""
        if self.exitcode is not None:
            return self.exitcode
        r = self._reaper
        if isinstance(r, subprocess.Popen):
            try:
                self.exitcode = r.wait(timeout)
            except subprocess.TimeoutExpired:
                return None
        elif isinstance(r, ForkServerClient):
            if not r.alive():
                return None  # the server ended: its children were killed and reaped by init
            self.exitcode = r.reap(self.pid)
        else:
            self.exitcode = _waitpid(self.pid, timeout)
        return self.exitcode

    def close_pipes(self) -> None:
        fds, self.cmd_fd, self.reply_fd = (self.cmd_fd, self.reply_fd), -1, -1
        for fd in fds:
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass


def _waitpid(pid: int, timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return -1
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            return None
        time.sleep(0.001)


class Launcher:
    """Starts workers with one start method; owns the fork server if there is one."""

    def __init__(
        self,
        method: str,
        env: Mapping[str, str],
        spawn_code: Callable[[int, int, int], str] | None = None,
        server_code: Callable[[list[int]], str] | None = None,
        start_timeout: float | None = None,
    ) -> None:
        """``spawn_code(cmd_fd, reply_fd, mem_fd)``: the ``python -c`` program of a spawned
        worker; ``server_code(fds)``: that of the fork server. Defaults: the env pool's worker
        (:mod:`rlstash.envs.worker`) and fork server. The AsyncCollector passes its own, which
        import torch (CUDA hidden) first. ``start_timeout``: seconds the fork server may take
        to fork a worker (None: wait)."""
        if method not in START_METHODS:
            raise ValueError(f"start_method: expected one of {START_METHODS}, got {method!r}")
        if os.name != "posix":  # pragma: no cover - pipes and descriptor passing need POSIX
            raise NotImplementedError(
                f"ProcessPoolVectorEnv worker processes need Linux or macOS, this is {sys.platform}; "
                "use num_workers=0 (envs stepped in this process)"
            )
        self.method = method
        self.env = dict(env)
        self.server: ForkServerClient | None = None
        self.spawn_code = spawn_code or (
            lambda c, r, m: f"from rlstash.envs.worker import main; main({c}, {r}, {m})"
        )
        self.server_code = server_code
        self.start_timeout = start_timeout

    def start(self, mem_fd: int, siblings: Sequence[WorkerProcess] = ()) -> WorkerProcess:
        """Start one worker serving on new pipes and the shared segment ``mem_fd``."""
        cmd_r, cmd_w = os.pipe()
        reply_r, reply_w = os.pipe()
        try:
            if self.method == "forkserver":
                pid, reaper = self._fork_from_server([cmd_r, reply_w, mem_fd])
            elif self.method == "spawn":
                code = self.spawn_code(cmd_r, reply_w, mem_fd)
                reaper = start_python(code, [cmd_r, reply_w, mem_fd], self.env)
                pid = reaper.pid
            else:
                pid, reaper = self._fork(cmd_r, reply_w, mem_fd, [cmd_w, reply_r], siblings), None
        except BaseException:
            for fd in (cmd_r, cmd_w, reply_r, reply_w):
                os.close(fd)
            raise
        os.close(cmd_r)
        os.close(reply_w)
        return WorkerProcess(pid, cmd_w, reply_r, reaper)

    def _fork_from_server(self, fds: list[int]) -> tuple[int, ForkServerClient]:
        """Fork via the server, starting it (again, if it died) when needed."""
        for attempt in (0, 1):
            if self.server is None or not self.server.alive():
                if self.server is not None:
                    self.server.close()
                self.server = ForkServerClient(self._start_server, self.start_timeout)
            try:
                return self.server.fork(fds), self.server
            except (OSError, EOFError):
                if attempt:
                    raise
                self.server.close()
                self.server = None
        raise AssertionError("unreachable")

    def _start_server(self, code: str, fds: list[int]) -> Any:
        """Start the fork server: ``code`` is the env pool's server program."""
        return start_python(self.server_code(fds) if self.server_code else code, fds, self.env)

    def _fork(
        self, cmd_r: int, reply_w: int, mem_fd: int, mine: list[int], siblings: Sequence
    ) -> int:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        pid = os.fork()
        if pid:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
            return pid
        code = 1
        try:  # the child: never returns into the caller's stack
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
            for fd in mine + [fd for w in siblings for fd in (w.cmd_fd, w.reply_fd) if fd >= 0]:
                os.close(fd)
            os.environ.update(self.env)
            from rlstash.envs.worker import serve

            code = serve(cmd_r, reply_w, mem_fd)
        finally:
            os._exit(code)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the fork server (if any; waits up to ``timeout`` s before killing it);
        workers should have been stopped first."""
        server, self.server = self.server, None
        if server is not None:
            server.close(timeout)
