"""Nothing leaks (invariant I6): Ctrl-C, exit without close, garbage collection and a killed
parent all end every worker; nothing appears in /dev/shm; no resource_tracker warnings."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from rlstash.envs import ProcessPoolVectorEnv
from rlstash.envs.testing import CountEnv
from tests.envs.helpers import (
    ROOT,
    finish,
    interrupt,
    kill_tree,
    marked_processes,
    shm_files,
    start_script,
    wait_for_line,
    wait_gone,
)

pytestmark = pytest.mark.multiproc

COLLECT = """
import os, sys, numpy as np
from rlstash.envs import ProcessPoolVectorEnv
method = sys.argv[1] if len(sys.argv) > 1 else "{method}"
pool = ProcessPoolVectorEnv("{env}", 8, num_workers=4, context=method, seed=0, env_kwargs={kwargs})
pool.reset()
actions = np.zeros(8, dtype=np.int64)
for i in range(20):
    pool.step(actions)
print("PIDS", " ".join(map(str, pool.worker_pids)), flush=True)
print("STEPPING", flush=True)
sys.stdin.readline()  # the test took its snapshot
{tail}
"""
FOREVER = "while True:\n    pool.step(actions)"
BAD_WORDS = ("leaked", "resource_tracker", "ResourceWarning", "rlstash/envs/worker.py")


def _run(method: str, tail: str, env: str = "CartPole-v1", kwargs: str = "None"):
    before = shm_files()
    proc = start_script(COLLECT.format(method=method, tail=tail, env=env, kwargs=kwargs))
    try:
        pids = [int(p) for p in wait_for_line(proc, "PIDS").split()[1:]]
        wait_for_line(proc, "STEPPING")
        workers = [p.pid for p in marked_processes(proc.pid)]
        assert set(pids) <= set(workers) and len(workers) >= 4
        proc.stdin.write("go\n")
        proc.stdin.flush()
    except BaseException:
        kill_tree(proc)
        raise
    return proc, workers, before


def _check_clean(proc, workers, before, stderr):
    assert wait_gone(workers) == [], f"workers left: {workers}"
    assert marked_processes(proc.pid) == []
    assert shm_files() <= before
    for word in BAD_WORDS:
        assert word not in stderr, stderr


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_ctrl_c_to_the_process_group(method):
    proc, workers, before = _run(method, FOREVER)
    try:
        stderr = interrupt(proc, 0.2)  # while it steps
    finally:
        kill_tree(proc)
    assert "KeyboardInterrupt" in stderr
    _check_clean(proc, workers, before, stderr)


def test_normal_exit_without_close():
    proc, workers, before = _run("forkserver", "print('DONE', flush=True)")
    try:
        stderr = finish(proc)
    finally:
        kill_tree(proc)
    assert proc.returncode == 0, stderr
    _check_clean(proc, workers, before, stderr)
    assert stderr.strip() == ""


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_parent_killed_workers_exit(method):
    hang = "import time\ntime.sleep(3600)"
    proc, workers, before = _run(method, hang)
    os.kill(proc.pid, signal.SIGKILL)
    try:
        finish(proc)
        assert wait_gone(workers, timeout=5) == []
        assert shm_files() <= before  # anonymous segments vanish with their last user
    finally:
        kill_tree(proc)


def test_parent_killed_while_a_worker_hangs_in_an_env():
    tail = "pool.step_async(actions)\nimport time\ntime.sleep(3600)"
    env = "rlstash.envs.testing:rlstash/Hang-v0"
    proc, workers, before = _run("spawn", tail, env=env, kwargs="dict(hang_at=21)")
    time.sleep(0.2)  # the workers are now asleep in HangEnv.step
    os.kill(proc.pid, signal.SIGKILL)
    try:
        finish(proc)
        assert wait_gone(workers, timeout=5) == []  # the watchdog thread ends them
    finally:
        kill_tree(proc)


def test_garbage_collection_stops_workers():
    pool = ProcessPoolVectorEnv(CountEnv, 4, num_workers=2)
    pool.reset()
    pool.step(np.zeros(4, dtype=np.int64))
    pids = pool.worker_pids
    del pool
    gc.collect()
    assert wait_gone(pids, timeout=5) == []
    assert marked_processes(os.getpid()) == []


FD_AFTER_CLOSE = r"""
import gc, os, sys
import numpy as np
gc.disable()  # nothing may depend on garbage collection
from rlstash.envs import ProcessPoolVectorEnv
from rlstash.envs.testing import CountEnv

def memfds():
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if "rlstash_" in os.readlink(f"/proc/self/fd/{fd}"):
                out.append(fd)
        except OSError:
            pass
    return out

def mapped():
    with open("/proc/self/maps") as f:
        return [line for line in f if "rlstash_" in line]

workers = int(sys.argv[1])
pool = ProcessPoolVectorEnv(CountEnv, 4, num_workers=workers)
pool.copy = False
obs, _ = pool.reset(seed=0)
obs, *_ = pool.step(np.zeros(4, dtype=np.int64))
before = len(memfds()) if workers else 1
pool.close()
print("fds", before, len(memfds()))
print("view", float(obs.sum()))  # a copy=False view stays readable after close
del obs, _
gc.collect()
print("maps", len(mapped()))
"""


@pytest.mark.parametrize("workers", [0, 2])
def test_close_releases_the_shared_memory_fd_without_gc(workers):
    """Issue 9: the segment's fd goes at close(), not when the pool is garbage collected;
    the mapping goes when the last view is gone."""
    out = subprocess.run(
        [sys.executable, "-c", FD_AFTER_CLOSE, str(workers)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines())
    assert lines["fds"].split() == ["1", "0"], out.stdout
    assert float(lines["view"]) >= 0
    assert lines["maps"] == "0", out.stdout


def test_messages_queued_in_a_pipe_are_read_one_at_a_time():
    """A reader must not swallow the next message: STEP and CLOSE written before the worker
    reads either are two messages (the first read used to take 4096 bytes and drop the rest)."""
    from rlstash.envs import protocol as P

    r, w = os.pipe()
    try:
        P.send(w, P.STEP)
        P.send(w, P.CLOSE, b"x" * 10)
        P.send(w, P.OK, b"y")
        assert P.recv(r) == (P.STEP, b"")
        assert P.recv(r, time.monotonic() + 5) == (P.CLOSE, b"x" * 10)
        assert P.recv(r) == (P.OK, b"y")
    finally:
        os.close(r)
        os.close(w)


@pytest.mark.filterwarnings("ignore:.*pending call:UserWarning")
def test_close_right_after_step_async_does_not_wait_for_the_kill():
    """The Ctrl-C exit that waited CLOSE_TIMEOUT: the pool wrote STEP, was interrupted and
    wrote CLOSE before the (descheduled) worker read the STEP; the worker read both at once,
    dropped CLOSE and waited for a command until it was killed. SIGSTOP makes the race
    deterministic."""
    from rlstash.envs.shutdown import CLOSE_TIMEOUT

    pool = ProcessPoolVectorEnv(CountEnv, 2, num_workers=1, seed=0)
    pid = pool.worker_pids[0]
    resume = None
    try:
        pool.reset()
        pool.step(np.zeros(2, dtype=np.int64))
        os.kill(pid, signal.SIGSTOP)
        pool.step_async(np.zeros(2, dtype=np.int64))  # STEP waits unread in the pipe
        resume = threading.Timer(0.3, os.kill, (pid, signal.SIGCONT))
        resume.start()
        t0 = time.monotonic()
        pool.close()
        took = time.monotonic() - t0
    finally:
        if resume is not None:
            resume.join()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        pool.close()
    assert wait_gone([pid]) == []
    assert took < CLOSE_TIMEOUT / 2, f"close took {took:.1f} s: the worker missed CLOSE"


def test_spinner_returns_when_readable_and_stops_spinning_after_a_long_wait():
    """The bounded poll before a blocking read (workers + the caller's share on enough
    cores): it ends as soon as a message is there, and after a wait longer than its budget
    the next wait does not spin at all (a slow caller costs no CPU)."""
    from rlstash.envs import protocol as P

    r, w = os.pipe()
    try:
        patient = P.Spinner(r, 5.0)
        P.send(w, P.STEP)
        t0 = time.perf_counter()
        patient.wait()
        assert time.perf_counter() - t0 < 2.5  # readable: no full spin
        assert P.recv(r) == (P.STEP, b"")
        patient.done()
        assert patient.short
        spinner = P.Spinner(r, 0.05)
        spinner.wait()  # nothing comes: spins the whole budget
        time.sleep(0.06)
        P.send(w, P.STEP)
        P.recv(r)
        spinner.done()
        assert not spinner.short
        t0 = time.process_time()
        spinner.wait()  # right after a long wait: no spin
        assert time.process_time() - t0 < 0.02
    finally:
        os.close(r)
        os.close(w)
