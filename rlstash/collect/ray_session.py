"""The Ray connection of a :class:`~rlstash.collect.ray.RayCollector`.

Ray is optional (``pip install 'rlstash[ray]'``); it is imported only here and in the actor
module, with an install hint when missing. Three cases::

    RaySession(None)            # Ray already initialized by the caller: used as is, left open
    RaySession("local")         # a private single-node instance in a temporary directory,
                                # shut down and removed by close()
    RaySession("10.0.0.5:6379") # connect to a running cluster; close() disconnects only

A private instance keeps every file it writes (sockets, logs, spilled objects) under one
``rlstash-ray-*`` temporary directory, so ``close()`` leaves nothing behind. Its processes
carry that directory in the environment variable :data:`SESSION_MARKER`; a watchdog process
(:mod:`rlstash.collect.ray_watchdog`) kills them and removes the directory when this process
dies without ``close()`` (kill -9): Ray stops its head processes with their driver, but not
the agents the raylet starts.

A cluster address is tried first (:func:`check_reachable`: a TCP connection and the start
of a gRPC exchange, within ``CONNECT_TIMEOUT`` seconds): ``ray.init`` itself retries an
address where nothing answers for many minutes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

import psutil

LOCAL_OBJECT_STORE_BYTES = 512 * 1024**2  # object store of a private local instance
STOP_TIMEOUT = 5.0  # seconds Ray's processes get to exit before they are killed
CONNECT_TIMEOUT = 10.0  # seconds a cluster address has to answer before it is refused
INSTALL_HINT = "pip install 'rlstash[ray]' (or pip install 'ray>=2.10')"
SESSION_MARKER = "RLSTASH_RAY_SESSION"  # env var naming the private instance's directory
# an HTTP/2 client preface and an empty SETTINGS frame: a gRPC server (Ray's GCS, a Ray
# Client server) answers with a SETTINGS frame (type 4) of its own
_H2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_H2_SETTINGS = 4


class RayUnreachableError(ConnectionError, ValueError):
    """No Ray cluster answers at the address given. A ``ConnectionError``, and a
    ``ValueError`` (the address is a setting: ``rlstash train --ray`` exits 2 with it)."""


def import_ray() -> Any:
    """The ``ray`` module, or an ImportError with the install command."""
    try:
        import ray
    except ImportError:
        raise ImportError(
            f"RayCollector needs Ray, which is not installed: {INSTALL_HINT}"
        ) from None
    return ray


class RaySession:
    """Connects to (or starts) Ray for a collector; ``close()`` undoes only what it did."""

    def __init__(self, address: str | None, num_cpus: int) -> None:
        ray = import_ray()
        self.owned, self.temp_dir = False, None
        self._watchdog: subprocess.Popen | None = None
        if address is not None and not isinstance(address, str):
            raise TypeError(
                f"address: expected None, 'local' or a cluster address 'host:port', got {address!r}"
            )
        if ray.is_initialized():
            if address is not None:
                raise ValueError(
                    f"address: Ray is already initialized in this process, got address={address!r}; "
                    "pass address=None to use that connection, or ray.shutdown() first"
                )
            return
        if address is None:
            address = "local"
        if address == "local":
            self._start_local(ray, num_cpus)
        else:
            check_reachable(address)
            ray.init(address=address, logging_level=logging.WARNING)
        self.owned = True

    def _start_local(self, ray: Any, num_cpus: int) -> None:
        """A private instance under a new temporary directory, its processes marked with it
        (:data:`SESSION_MARKER`) and watched: they end when this process dies, however."""
        self.temp_dir = tempfile.mkdtemp(prefix="rlstash-ray-")
        self._owner = os.getpid()
        self._watchdog = start_watchdog(self.temp_dir)
        saved = os.environ.get(SESSION_MARKER)
        os.environ[SESSION_MARKER] = self.temp_dir  # inherited by every Ray process
        try:
            ray.init(
                address="local",
                num_cpus=num_cpus,
                num_gpus=0,
                include_dashboard=False,
                object_store_memory=LOCAL_OBJECT_STORE_BYTES,
                _temp_dir=self.temp_dir,
                log_to_driver=False,
                logging_level=logging.WARNING,
            )
        except BaseException:
            self.owned = True  # close() stops what started
            self.close()
            raise
        finally:
            if saved is None:
                os.environ.pop(SESSION_MARKER, None)
            else:
                os.environ[SESSION_MARKER] = saved

    def close(self) -> None:
        """Shut Ray down if this session started or connected it. A private instance: every
        process it started (raylet, GCS, workers: an actor killed a moment before may still
        be finishing a task) is waited for and, after ``STOP_TIMEOUT`` s, killed; then its
        temporary directory is removed."""
        procs = self._private_processes()
        if self.owned:
            self.owned = False
            import ray

            ray.shutdown()
        _, alive = psutil.wait_procs(procs, timeout=STOP_TIMEOUT)
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(alive, timeout=STOP_TIMEOUT)
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            self.temp_dir = None
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            stop_watchdog(watchdog, stand_down=os.getpid() == self._owner)

    def _private_processes(self) -> list[psutil.Process]:
        """The processes of the private instance: this process's children that name its
        temporary directory (raylet, GCS, agents) and all their descendants (workers)."""
        if self.temp_dir is None or not self.owned:
            return []
        found: dict[int, psutil.Process] = {}
        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if self.temp_dir in " ".join(child.cmdline()):
                    found[child.pid] = child
                    for p in child.children(recursive=True):
                        found[p.pid] = p
        return list(found.values())


def start_watchdog(temp_dir: str) -> subprocess.Popen:
    """Start :mod:`rlstash.collect.ray_watchdog` for the private instance in ``temp_dir``:
    a small process in its own session (Ctrl-C does not reach it) that waits for this
    process; if it dies without :func:`stop_watchdog`, the watchdog kills every process
    marked with ``temp_dir`` and removes the directory."""
    from rlstash.collect import ray_watchdog

    env = {k: v for k, v in os.environ.items() if k != SESSION_MARKER}
    return subprocess.Popen(
        [sys.executable, "-I", ray_watchdog.__file__, str(os.getpid()), SESSION_MARKER, temp_dir],
        stdin=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )


def stop_watchdog(watchdog: subprocess.Popen, stand_down: bool = True) -> None:
    """``stand_down``: tell the watchdog that the instance was shut down (it exits without
    killing anything) and reap it; else (a forked copy of the process that started it) only
    close this copy's end of its pipe."""
    assert watchdog.stdin is not None
    if stand_down:
        with contextlib.suppress(OSError):
            watchdog.stdin.write(b"done\n")
            watchdog.stdin.flush()
    with contextlib.suppress(OSError):
        watchdog.stdin.close()
    if not stand_down:
        return
    try:
        watchdog.wait(STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        watchdog.kill()
        watchdog.wait()


def check_reachable(
    address: str,
    timeout: float = CONNECT_TIMEOUT,
    name: str = "address",
    local: str = "address='local'",
) -> None:
    """Refuse a cluster ``address`` (``host:port``, ``ray://host:port`` or ``"auto"``) where
    no gRPC server answers within ``timeout`` seconds, with :class:`RayUnreachableError`
    naming the setting ``name``, the address, what happened and the fix (``local``: how the
    caller asks for a private Ray). Ray's own ``ray.init`` would retry for many minutes."""

    def refuse(reason: str) -> RayUnreachableError:
        return RayUnreachableError(
            f"{name}: no Ray cluster answers at {address} ({reason}); start one there "
            f"(ray start --head on that machine) or give the address it printed, or use "
            f"{local} for a private single-node Ray"
        )

    try:
        target = _resolve(address)
    except ConnectionError as exc:
        raise refuse(str(exc).split(". ")[0]) from None
    host, _, port_text = target.removeprefix("ray://").rpartition(":")
    host = host.strip("[]")
    deadline = time.monotonic() + timeout
    try:
        port = int(port_text)
        with socket.create_connection((host, port), timeout=timeout) as sock:
            if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
                return  # a TLS handshake comes first: the TCP connection must do
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            sock.sendall(_H2_HELLO)
            head = _recv_exact(sock, 9)
    except (ValueError, OverflowError):
        raise refuse("expected host:port with a port up to 65535") from None
    except ConnectionRefusedError:
        raise refuse("connection refused: nothing listens there") from None
    except TimeoutError:
        raise refuse(f"no answer within {timeout:g} s") from None
    except socket.gaierror as exc:
        raise refuse(f"unknown host {host!r}: {exc.strerror}") from None
    except (OSError, EOFError) as exc:
        raise refuse(getattr(exc, "strerror", None) or str(exc)) from None
    if head[3] != _H2_SETTINGS:
        raise refuse("something answers there, but not a Ray cluster")


def _resolve(address: str) -> str:
    """``"auto"`` as Ray resolves it (``RAY_ADDRESS``, then the last ``ray start``); a
    ConnectionError when there is none."""
    if address != "auto":
        return address
    try:
        from ray._private.services import canonicalize_bootstrap_address_or_die
    except ImportError:  # pragma: no cover - Ray moved it: ray.init resolves it alone
        return address
    return canonicalize_bootstrap_address_or_die("auto")


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError("the connection was closed without an answer")
        data += chunk
    return data
