"""The caller's share (``caller_envs``): a block of a pool's envs stepped in the calling
process while the worker processes step theirs (torch-free).

With W workers on W cores the caller sleeps through every step. With ``caller_envs=k`` the
last k envs step here instead, during ``step_wait`` (as with ``num_workers=0``), after the
STEP messages went out, so the caller's core works too: on 2 cores, 1 worker + the caller
beat 2 workers when an env step costs tens of microseconds (HalfCheetah).

:class:`CallerShare` stands in for a worker process in
:class:`~rlstash.envs.process_backend.ProcessBackend`: commands are queued by :meth:`send` and
run by :meth:`run` with the worker's own code (:class:`~rlstash.envs.worker.Worker`) against
the same shared segment, so replies (infos in shared memory or pickled) are read the same
way. An env that raises is handled like a worker that raised: the share is rebuilt from its
factories with fresh seeds (its episodes end as truncated), up to ``max_restarts``. A hang or
a segfault in the caller's envs cannot be contained; ``step_timeout`` does not apply to them.
"""

from __future__ import annotations

import os

from rlstash.envs.worker import Worker


class CallerShare:
    """One block of envs in this process, behind the interface of a worker process
    (:class:`~rlstash.envs.launch.WorkerProcess`: ``pid``, ``kill``, ``reap``, ``close_pipes``;
    no pipes: ``cmd_fd``/``reply_fd`` are -1)."""

    cmd_fd = reply_fd = -1
    exitcode: int | None = None

    def __init__(self, mem_fd: int) -> None:
        self.pid = os.getpid()
        self.worker = Worker(mem_fd)
        self._queued: tuple[bytes, bytes] | None = None

    def send(self, tag: bytes, payload: bytes = b"") -> None:
        """Queue a command; :meth:`run` executes it (the pool's wait for its reply)."""
        self._queued = (tag, payload)

    def run(self) -> bytes:
        """Execute the queued command; its OK payload. An env's exception propagates."""
        assert self._queued is not None, "CallerShare.run without a command"
        (tag, payload), self._queued = self._queued, None
        return self.worker.handle(tag, payload)

    @property
    def queued(self) -> bool:
        """A command waits to be run."""
        return self._queued is not None

    def kill(self) -> None:
        """Close the envs (errors swallowed: closing must finish) and drop the mapping."""
        self._queued = None
        if self.exitcode is None:
            self.exitcode = 0
            try:
                self.worker.close()
            except Exception:  # noqa: BLE001 - best effort while closing or restarting
                pass

    def reap(self, timeout: float) -> int | None:  # noqa: ARG002 - WorkerProcess interface
        """Nothing to wait for: the envs were closed by :meth:`kill`."""
        self.kill()
        return None

    def close_pipes(self) -> None:
        """No pipes."""
