"""What the in-process and the multi-process backends of a pool share (torch-free).

A backend steps the envs and writes into :class:`~rlstash.envs.shm.SharedArrays`; the pool
validates arguments, writes actions and assembles gymnasium-style results. ``reset`` and
``step_wait`` return info *parts* ``(first_env, infos)``: each block of envs batched into
gymnasium's array form (:func:`~rlstash.envs.infos.batch_infos`), merged by the pool. Every backend
method that can meet a failed env group returns the pool indices of the envs that were
restarted, and records a :class:`RestartEvent`; past ``max_restarts`` failures of one group
it closes itself and raises :class:`WorkerFailedError`.

Restart report modes (the ``restarted`` flag of a reset): ``NO_REPORT`` for a restart during
``reset`` (the reset observation is what reset returns anyway), ``REPORT_NOW`` during a step
(flags of this step say truncated), ``REPORT_NEXT`` elsewhere (``call``, ``set_attr``): the
next step does not step those envs but reports them truncated, so an episode is never
stitched to the fresh one.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rlstash.envs.errors import (
    RestartEvent,
    WorkerFailedError,
    WorkerRestartWarning,
    user_stacklevel,
)
from rlstash.envs.shm import SharedArrays

NO_REPORT, REPORT_NOW, REPORT_NEXT = 0, 1, 2


def _log_like_gymnasium(env: int, trace: str) -> None:
    """The three ``gymnasium.logger.error`` lines AsyncVectorEnv writes before re-raising."""
    from gymnasium import logger

    logger.error(f"Received the following error from Worker-{env} - Shutting it down")
    logger.error(f"{trace}")
    logger.error("Raising the last exception back to the main process.")


class Backend:
    """Restart bookkeeping shared by both backends, and the attributes the pool reads of
    any backend (defaults: no caller share, no worker slots, open, no shared arrays yet)."""

    shared: SharedArrays | None = None
    num_workers: int
    caller_envs: int = 0
    slots: Sequence[Any] = ()
    closed: bool = False

    def __init__(self, max_restarts: int, seed_rng: np.random.Generator) -> None:
        self.max_restarts = max_restarts
        self.seed_rng = seed_rng
        self.events: list[RestartEvent] = []
        self.failures: dict[int, int] = {}
        self.deferred: list[int] = []  # envs restarted outside a step, reported next step

    def fresh_seeds(self, k: int) -> list[int]:
        """``k`` new reset seeds from the pool's generator (a restart never repeats seeds)."""
        return [int(s) for s in self.seed_rng.integers(0, 2**31 - 1, size=k)]

    def record_failure(
        self,
        worker: int,
        envs: tuple[int, ...],
        reason: str,
        error: str,
        exitcode: int | None,
        command: str,
        pid: int = 0,
        exc: BaseException | None = None,
    ) -> RestartEvent:
        """Count a failure; warn; raise WorkerFailedError (after closing) past the budget.

        With ``max_restarts=0`` an exception raised in an env (``exc``) is re-raised as it
        is, like gymnasium's AsyncVectorEnv does (its ``__cause__`` is the WorkerFailedError
        that holds the worker's traceback)."""
        count = self.failures.get(worker, 0) + 1
        self.failures[worker] = count
        event = RestartEvent(worker, envs, reason, error, exitcode, count, command, pid)
        self.events.append(event)
        if count > self.max_restarts:
            mine = [e for e in self.events if e.worker == worker]
            self.close()
            failed = WorkerFailedError(worker, envs, count, self.max_restarts, error, mine)
            if self.max_restarts == 0 and reason == "exception" and exc is not None:
                _log_like_gymnasium(getattr(exc, "env_index", envs[0]), error)
                raise exc from failed
            raise failed
        span = f"{envs[0]}..{envs[-1]}" if len(envs) > 1 else str(envs[0])
        warnings.warn(
            f"env worker {worker} (envs {span}) {reason} during {command}; restarting it "
            f"({count}/{self.max_restarts}); its episodes end as truncated. "
            f"Error: {error.strip().splitlines()[-1] if error.strip() else reason}",
            WorkerRestartWarning,
            stacklevel=user_stacklevel(),
        )
        return event

    def take_deferred(self) -> list[int]:
        out, self.deferred = self.deferred, []
        return out

    # Interface (implemented by both backends) -------------------------------------------
    def start(self, resolve: Callable[[list, list], tuple]) -> dict[str, Any]:
        raise NotImplementedError

    def reset_async(
        self, seeds: list[int | None], options: dict | None, mask: np.ndarray | None
    ) -> None:
        raise NotImplementedError

    def reset_wait(self, timeout: float | None) -> tuple[list[tuple[int, dict]], list[int]]:
        raise NotImplementedError

    def reset(
        self, seeds: list[int | None], options: dict | None, mask: np.ndarray | None
    ) -> tuple[list[tuple[int, dict]], list[int]]:
        """Reset (the masked) envs; returns info parts and the restarted envs."""
        self.reset_async(seeds, options, mask)
        return self.reset_wait(None)

    def step_async(self) -> None:
        raise NotImplementedError

    def step_wait(self, timeout: float | None) -> tuple[list[tuple[int, dict]], list[int]]:
        raise NotImplementedError

    def call(self, name: str, args: tuple, kwargs: dict) -> list[Any]:
        raise NotImplementedError

    def call_async(self, name: str, args: tuple, kwargs: dict) -> None:
        """Start ``call``; the default runs nothing until :meth:`call_wait`."""
        self._pending_call = (name, args, kwargs)

    def call_wait(self, timeout: float | None) -> list[Any]:
        """Results of :meth:`call_async`; the default runs the call now (``timeout``: an
        in-process call cannot be interrupted, so it is not used)."""
        name, args, kwargs = self._pending_call
        return self.call(name, args, kwargs)

    def set_attr(self, name: str, values: list[Any]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError
