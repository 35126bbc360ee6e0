"""A small fork server owned by one pool (torch-free).

Why not ``multiprocessing``'s forkserver or spawn: both re-import the parent's ``__main__``
module in every child, so a training script that imports torch at the top gives every env
worker a copy of torch (hundreds of MB, and CUDA initialisation hazards, field report 000).
This server is a fresh interpreter that imports only numpy, gymnasium, cloudpickle and the
worker module, then forks one child per request. Children run :func:`worker.serve` with the
pipes and the shared-memory descriptor passed over a Unix socket (``SCM_RIGHTS``).

Requests (client -> server) on the control socket, each answered before the next:

* ``b"F"`` + descriptors ``[cmd_r, reply_w, mem_fd]``: fork a worker; answer its pid (8 bytes).
* ``b"W"`` + pid (8 bytes): reap that child (the client killed it or saw it exit); answer its
  exit code, negative for a signal, or ``NOT_REAPED`` if it did not end within 5 s.

The server exits on end of file on the control socket (the pool closed it, or the pool's
process died). Its children receive SIGKILL when it exits (``PR_SET_PDEATHSIG`` on Linux; the
server is single-threaded, so this is safe) and watch their parent besides.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable

_PID = struct.Struct("<q")
NOT_REAPED = -(1 << 40)
PRELOAD = ("numpy", "gymnasium", "cloudpickle", "rlstash.envs.worker")


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _set_parent_death_signal() -> None:
    """Linux only: get SIGKILL when the fork server (our parent) ends."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):  # pragma: no cover - best effort
        pass


def _child(sock: socket.socket, fds: list[int], server_pid: int) -> None:
    code = 1
    try:
        sock.close()
        _set_parent_death_signal()
        if os.getppid() != server_pid:  # the server died before prctl took effect
            os._exit(3)
        from rlstash.envs.worker import serve

        code = serve(*fds)
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _reap(pid: int) -> int:
    deadline = time.monotonic() + 5.0
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return NOT_REAPED
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            return NOT_REAPED
        time.sleep(0.001)


def main(ctl_fd: int) -> None:
    """Server loop (runs in its own interpreter, started by :class:`ForkServerClient`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    sock = socket.socket(fileno=ctl_fd)
    me = os.getpid()
    try:
        while True:
            msg, fds, _, _ = socket.recv_fds(sock, 1, 3)
            if not msg:
                break
            if msg == b"F":
                pid = os.fork()
                if pid == 0:
                    _child(sock, fds, me)
                for fd in fds:
                    os.close(fd)
                sock.sendall(_PID.pack(pid))
            elif msg == b"W":
                (pid,) = _PID.unpack(_recv_exact(sock, _PID.size))
                sock.sendall(_PID.pack(_reap(pid)))
            else:
                break
    except (EOFError, ConnectionError):
        pass
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


class ForkServerClient:
    """The pool's end of a fork server: ``fork(fds) -> pid``, ``reap(pid)``, ``close()``."""

    def __init__(
        self, start: Callable[[str, list[int]], subprocess.Popen], timeout: float | None = None
    ) -> None:
        """``start(code, pass_fds)`` launches ``python -c code`` (see :mod:`launch`);
        ``timeout``: seconds a fork may take (the first one includes the server's imports)
        before ``TimeoutError``; None waits."""
        self.timeout = timeout
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            code = f"from rlstash.envs.forkserver import main; main({theirs.fileno()})"
            self.proc = start(code, [theirs.fileno()])
        finally:
            theirs.close()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def fork(self, fds: list[int]) -> int:
        """Fork a worker that serves on ``fds = [cmd_r, reply_w, mem_fd]``; returns its pid.
        ``TimeoutError`` (an OSError) when the server does not answer within ``timeout``."""
        self._sock.settimeout(self.timeout)
        try:
            socket.send_fds(self._sock, [b"F"], fds)
            return _PID.unpack(_recv_exact(self._sock, _PID.size))[0]
        finally:
            self._sock.settimeout(None)  # reap: the server answers within its own 5 s

    def reap(self, pid: int) -> int | None:
        """Exit code of a child that ended (negative: signal), None if it did not end."""
        self._sock.sendall(b"W" + _PID.pack(pid))
        code = _PID.unpack(_recv_exact(self._sock, _PID.size))[0]
        return None if code == NOT_REAPED else code

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self, timeout: float = 5.0) -> None:
        """Close the control socket (the server exits, its children get SIGKILL); wait."""
        self._sock.close()
        try:
            self.proc.wait(timeout)
        except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired
            self.proc.kill()
            self.proc.wait()
