"""Helpers for ProcessPoolVectorEnv tests: finding our processes, /dev/shm snapshots, scripts in a
subprocess. The misbehaving envs themselves live in :mod:`rlstash.envs.testing` so that
worker processes can import them without ``tests`` on their path."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil

from rlstash.envs.launch import MARKER

ROOT = Path(__file__).resolve().parents[2]
SHM = Path("/dev/shm")


def shm_files() -> set[str]:
    """Names in /dev/shm (empty if there is no /dev/shm)."""
    return set(os.listdir(SHM)) if SHM.is_dir() else set()


def marked_processes(parent_pid: int) -> list[psutil.Process]:
    """Live (non-zombie) processes whose environment says they were started for
    ``parent_pid`` (the ``RLSTASH_PARENT_PID`` marker set on every worker and fork server)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get(MARKER) == str(parent_pid):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def alive(pids: list[int]) -> list[int]:
    """The pids that still run (zombies count as ended)."""
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def wait_gone(pids: list[int], timeout: float = 5.0) -> list[int]:
    """Wait until every pid ended; returns those still alive after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        left = alive(pids)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.02)


def start_script(code: str, *args: str) -> subprocess.Popen:
    """Run ``code`` in a fresh interpreter in its own session (its own process group), with
    stdin/stdout/stderr piped and ResourceWarnings shown. Stdout lines are collected by a
    thread into ``proc.lines`` (a queue) for :func:`wait_for_line`."""
    proc = subprocess.Popen(
        [sys.executable, "-W", "always::ResourceWarning", "-c", textwrap.dedent(code), *args],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    proc.lines = lines  # type: ignore[attr-defined]
    return proc


def wait_for_line(proc: subprocess.Popen, prefix: str, timeout: float = 30.0) -> str:
    """The next stdout line starting with ``prefix``; kills the script and fails otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = proc.lines.get(timeout=max(0.01, deadline - time.monotonic()))  # type: ignore[attr-defined]
        except queue.Empty:
            line = None
        if line is not None and line.startswith(prefix):
            return line.strip()
        if line is None:
            kill_tree(proc)
            err = proc.stderr.read() if proc.stderr else ""
            raise AssertionError(f"no line {prefix!r} within {timeout} s; stderr:\n{err}")


def finish(proc: subprocess.Popen, timeout: float = 20.0) -> str:
    """Wait for the script to end; its stderr (stdout was consumed by the pump thread)."""
    proc.wait(timeout)
    return proc.stderr.read() if proc.stderr else ""


def interrupt(proc: subprocess.Popen, settle_s: float) -> str:
    """Let the script run ``settle_s`` seconds, then send SIGINT to its whole process group
    (what Ctrl-C in a terminal does); its stderr once it ended."""
    time.sleep(settle_s)
    os.killpg(proc.pid, signal.SIGINT)
    return finish(proc)


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a script, its process group and everything it marked (test cleanup)."""
    pids = [p.pid for p in marked_processes(proc.pid)]
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        pass
