"""Watchdog of a private Ray instance (run as a script: ``python -I ray_watchdog.py PID
MARKER DIR``; standard library and psutil only, no torch, no Ray).

Ray ends the GCS and the raylet of a private instance when their driver dies (they get
``PR_SET_PDEATHSIG``), but not the agents the raylet starts (``ray::DashboardAgent``,
``ray::RuntimeEnvAgent``): after ``kill -9`` of the driver they run on, orphaned. After the
driver's death this process finds every process of the instance, wherever it was reparented,
by ``DIR`` (the instance's own temporary directory, unique to it): the environment variable
``MARKER=DIR`` they all inherited or, for Ray's ``ray::...`` processes (their title replaces
their command line and environment), a file open under ``DIR`` (Ray sends every process's
output to its log directory there). It stops them (SIGTERM, then SIGKILL) and removes
``DIR``; it never touches another process (a ``tail -f`` of a log there included).

It waits on its stdin (a pipe from the driver): ``done`` means the driver shut the instance
down itself (exit at once); end of file without it, or a new parent process, means the driver
died.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import sys
import time

import psutil

POLL = 0.5  # seconds between checks that the driver is still the parent
GRACE = 2.0  # seconds between SIGTERM and SIGKILL
SWEEPS = 3  # passes (a dying raylet may still start a process during the first)


def belongs(proc: psutil.Process, marker: str, directory: str) -> bool:
    """Whether ``proc`` is a process of the instance in ``directory`` (see the module doc)."""
    with contextlib.suppress(psutil.Error):
        if proc.environ().get(marker) == directory:
            return True
    inside = directory.rstrip(os.sep) + os.sep
    with contextlib.suppress(psutil.Error):
        title = proc.cmdline()
        if title and title[0].startswith("ray::"):
            return any(f.path.startswith(inside) for f in proc.open_files())
    return False


def marked(marker: str, directory: str) -> list[psutil.Process]:
    """Live processes of the instance in ``directory`` (this one excluded)."""
    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        with contextlib.suppress(psutil.Error):
            if proc.status() != psutil.STATUS_ZOMBIE and belongs(proc, marker, directory):
                found.append(proc)
    return found


def sweep(marker: str, value: str) -> None:
    """SIGTERM every marked process, SIGKILL what is left after ``GRACE`` s; a few passes."""
    for _ in range(SWEEPS):
        procs = marked(marker, value)
        if not procs:
            return
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.terminate()
        _, alive = psutil.wait_procs(procs, timeout=GRACE)
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(alive, timeout=GRACE)


def wait_for_driver(driver: int) -> bool:
    """Block until the driver says ``done`` (True) or is gone (False)."""
    fd = sys.stdin.fileno()
    got = b""
    while True:
        ready, _, _ = select.select([fd], [], [], POLL)
        if ready:
            chunk = os.read(fd, 64)
            got += chunk
            if b"done" in got:
                return True
            if not chunk:
                return False  # end of file: every copy of the driver's end is closed
        if os.getppid() != driver:
            return False


def main(argv: list[str]) -> int:
    driver, marker, directory = int(argv[0]), argv[1], argv[2]
    if wait_for_driver(driver):
        return 0
    time.sleep(POLL)  # Ray's own fate sharing ends the head processes first
    sweep(marker, directory)
    shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
