"""Child processes of the test run that cannot outlive it.

A test's ``finally`` stops what it started, but not when the test runner itself is killed
(SIGKILL, an outer ``timeout``): then a trainer started with ``--steps 10000000`` would run on
as an orphan for hours. ``die_with_parent`` as ``preexec_fn`` makes the kernel send SIGKILL
to the child when the thread that started it dies (Linux ``PR_SET_PDEATHSIG``; it survives the
``exec`` of run.py into the trainer). Elsewhere it is None: no ``preexec_fn``.
"""

from __future__ import annotations

import ctypes
import signal
import sys
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1


def _make() -> Callable[[], None] | None:
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here, not in the child

    def die_with_parent() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)

    return die_with_parent


die_with_parent = _make()


def kill_when_ready_at_random_moments(procs: list, low: float, high: float) -> None:
    """Wait for each writer's ``ready`` line (its stderr in the failure, where piped), then
    SIGKILL them one by one at sorted seeded-random delays in [``low``, ``high``] s."""
    import random
    import time

    for proc in procs:
        line = proc.stdout.readline().strip()
        assert line == "ready", proc.stderr.read() if proc.stderr else line
    start = time.monotonic()
    delays = sorted(random.Random(0).uniform(low, high) for _ in procs)
    for proc, delay in zip(procs, delays):
        time.sleep(max(0.0, start + delay - time.monotonic()))
        proc.kill()
