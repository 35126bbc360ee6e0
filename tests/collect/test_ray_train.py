"""``rlstash train --ray local``: solves CartPole, resumes with the same command after Ctrl-C,
and leaves no Ray process or file behind (the scenario runs in subprocesses; inspected here)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.collect.ray_net import only_loopback
from tests.procs import die_with_parent

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.multiproc, only_loopback]


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that mention ``text``."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmd:
            found.append(f"{pid}: {cmd[:200]}")
    return found


@pytest.mark.timeout(900)  # ~1 min on a quiet machine; minutes when shared
def test_train_ray_local_solves_cartpole_and_resumes_with_the_same_command():
    tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths live below it
    env = {**os.environ, "TMPDIR": tmp, "PYTHONUNBUFFERED": "1"}
    cmd = [
        sys.executable, "-m", "rlstash", "train", "--ray", "local", "--ray-actors", "2",
        "--envs", "1", "--quiet", "--run-dir", f"{tmp}/runs", "--checkpoint-every", "2048",
    ]  # fmt: skip
    first = None
    try:
        first = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            preexec_fn=die_with_parent,
        )  # fmt: skip
        lines = []
        assert first.stdout is not None
        for line in first.stdout:  # Ctrl-C once a checkpoint exists
            lines.append(line)
            if "[eval] step 3072" in line:
                first.send_signal(signal.SIGINT)
                break
        out1 = "".join(lines) + first.communicate(timeout=120)[0]
        assert "interrupted at step" in out1, out1
        second = subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=600, preexec_fn=die_with_parent
        )
        out2 = second.stdout + second.stderr
        assert second.returncode == 0, out2
        assert "resumed at step" in out2 and "solved at step" in out2, out2
        deadline = time.monotonic() + 10
        while processes_mentioning(tmp) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not processes_mentioning(tmp), "Ray processes outlived the run"
        left = [f for f in os.listdir(tmp) if f.startswith(("rlstash-ray", "ray", "session_"))]
        assert not left, f"Ray left files in the temporary directory: {left}"
    finally:
        if first is not None and first.poll() is None:
            first.kill()
            first.wait()
        shutil.rmtree(tmp, ignore_errors=True)
