"""Ray faults (issue 22, class 5): an unreachable cluster address is refused in one line
within 30 s (Ray's own retries took more than 7 minutes), and a ``--ray local`` driver killed
with SIGKILL leaves no Ray process behind (Ray's agents outlived it).

Run only inside a loopback-only network namespace (``python3 run.py test`` does that with
``unshare -n``). Every process a scenario starts carries a unique environment variable
(:data:`TAG`), so these tests find, and clean up, only their own processes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.collect.ray_net import only_loopback
from tests.procs import die_with_parent

pytestmark = [pytest.mark.ray, pytest.mark.multiproc, only_loopback]

ROOT = Path(__file__).resolve().parents[2]
TAG = "RLSTASH_TEST_RAY_FAULT"  # its value: the scenario's own temporary directory


def _ours(proc: psutil.Process, tmp: str) -> bool:
    with contextlib.suppress(psutil.Error):
        if proc.environ().get(TAG) == tmp or any(tmp in arg for arg in proc.cmdline()):
            return True
    with contextlib.suppress(psutil.Error):  # Ray's agents: title and environment rewritten
        return any(f.path.startswith(tmp + os.sep) for f in proc.open_files())
    return False


def tagged(tmp: str) -> list[psutil.Process]:
    """Live processes of the scenario in ``tmp``: its :data:`TAG` in their environment, ``tmp``
    in their command line, or a file open below ``tmp`` (Ray's logs)."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if (
                proc.pid != os.getpid()
                and proc.status() != psutil.STATUS_ZOMBIE
                and _ours(proc, tmp)
            ):
                found.append(proc)
    return found


def describe(procs: list[psutil.Process]) -> list[str]:
    out = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            out.append(f"{p.pid}: {' '.join(p.cmdline())[:120]}")
    return out


def kill_tagged(value: str) -> None:
    """SIGKILL what a failed scenario left (only processes with this scenario's tag)."""
    procs = tagged(value)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(procs, timeout=10)


@contextlib.contextmanager
def scenario_dir(prefix: str):
    """A short temporary directory (Ray's socket paths live below it) and the scenario's
    environment (``TMPDIR`` and :data:`TAG` point at it); afterwards every tagged process is
    killed and the directory removed, whatever happened."""
    tmp = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    env = {**os.environ, "TMPDIR": tmp, TAG: tmp, "PYTHONUNBUFFERED": "1"}
    try:
        yield tmp, env
    finally:
        kill_tagged(tmp)
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def not_ray(listen: bool):
    """A loopback address where no Ray is: a port bound but not listening (connections are
    refused), or a server that accepts connections and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    stop = threading.Event()
    accepted: list[socket.socket] = []
    if listen:
        sock.listen()
        sock.settimeout(0.2)

        def accept() -> None:
            while not stop.is_set():
                with contextlib.suppress(OSError):
                    accepted.append(sock.accept()[0])

        threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"127.0.0.1:{sock.getsockname()[1]}"
    finally:
        stop.set()
        for conn in accepted:
            conn.close()
        sock.close()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("listen", [False, True], ids=["nothing-listens", "silent-server"])
def test_unreachable_address_fails_in_one_line_within_30_s(listen):
    with scenario_dir("ru") as (tmp, env), not_ray(listen) as address:
        cmd = [sys.executable, "-m", "rlstash", "train", "--ray", address, "--quiet",
               "--run-dir", f"{tmp}/runs"]  # fmt: skip
        t0 = time.monotonic()
        try:
            out = subprocess.run(
                cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
                preexec_fn=die_with_parent,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            pytest.fail(f"rlstash train --ray {address} still ran after 120 s")
        took = time.monotonic() - t0
        assert out.returncode == 2, out.stdout + out.stderr
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1, out.stderr
        assert lines[0].startswith(
            f"rlstash train: error: --ray: no Ray cluster answers at {address}"
        )
        assert "ray start --head" in lines[0] and "--ray local" in lines[0]
        assert took <= 30, f"{took:.0f} s to refuse {address}"
        assert not Path(tmp, "runs").exists()  # nothing written


def _wait_for_actor(tmp: str, driver: subprocess.Popen, timeout: float) -> None:
    """Until the run's Ray actor is up (the raylet and its agents are, then)."""
    deadline = time.monotonic() + timeout
    names: list[str] = []
    while time.monotonic() < deadline:
        assert driver.poll() is None, driver.communicate()[0]
        names = describe(tagged(tmp))
        if any("ray::ChunkActor" in n for n in names):
            return
        time.sleep(0.5)
    pytest.fail(f"no Ray actor after {timeout:.0f} s: {names}")


@pytest.mark.slow
@pytest.mark.timeout(600)  # ~40 s on a quiet machine; Ray starts slowly on a loaded one
def test_killed_ray_local_driver_leaves_no_ray_process():
    with scenario_dir("rk") as (tmp, env):
        cmd = [sys.executable, "-m", "rlstash", "train", "--ray", "local", "--ray-actors", "1",
               "--envs", "1", "--quiet", "--run-dir", f"{tmp}/runs"]  # fmt: skip
        driver = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            preexec_fn=die_with_parent,
        )  # fmt: skip
        try:
            _wait_for_actor(tmp, driver, timeout=300)
            time.sleep(2)  # the raylet's agents are up with the actor; let them settle
            before = describe(tagged(tmp))
            driver.kill()  # SIGKILL: no finalizer, no atexit
            driver.wait()
            deadline = time.monotonic() + 30
            while tagged(tmp) and time.monotonic() < deadline:
                time.sleep(0.5)
            left = describe(tagged(tmp))
        finally:
            if driver.poll() is None:
                driver.kill()
            driver.communicate()
        assert any("Agent" in n for n in before), "\n".join(before)  # they used to stay
        assert left == [], f"left 30 s after SIGKILL of the driver: {left}"
        assert not list(Path(tmp).glob("rlstash-ray-*")), "the Ray instance's directory stayed"
