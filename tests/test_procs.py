"""tests/procs.py: a child started with ``die_with_parent`` ends when its parent is killed."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.procs import die_with_parent

PARENT = """
import subprocess, sys, time
from tests.procs import die_with_parent
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                         preexec_fn=die_with_parent)
print(child.pid, flush=True)
time.sleep(120)
"""


@pytest.mark.skipif(die_with_parent is None, reason="PR_SET_PDEATHSIG is Linux only")
def test_a_child_started_with_die_with_parent_ends_when_its_parent_is_killed():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT], cwd=root, stdout=subprocess.PIPE, text=True
    )
    try:
        child = psutil.Process(int(parent.stdout.readline()))
        parent.send_signal(signal.SIGKILL)  # no finally, no atexit: only the kernel can act
        parent.wait(10)
        deadline = time.monotonic() + 10
        while child.is_running() and child.status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the child outlived its killed parent"
            time.sleep(0.05)
    finally:
        parent.kill()
        parent.wait(10)
