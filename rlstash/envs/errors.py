"""Errors and events of an :class:`~rlstash.envs.process_pool.ProcessPoolVectorEnv` (torch-free)."""

from __future__ import annotations

import multiprocessing
import os
import sys
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RestartEvent:
    """A worker that failed and was restarted (or gave up, if it was the last straw).

    Attributes:
        worker: index of the worker in the pool.
        envs: pool indices of the envs it holds; their episodes ended as truncated.
        reason: ``"exception"`` (an env raised), ``"died"`` (the process ended: segfault,
            kill -9, ...) or ``"timeout"`` (no answer within ``step_timeout``).
        error: the exception text with its traceback, or how the process ended.
        exitcode: the process's exit code (negative: the signal that ended it), if known.
        count: how many times this worker has failed so far (1 for the first failure).
        command: what the worker was doing (``"step"``, ``"reset"``, ``"start"``, ...).
    """

    worker: int
    envs: tuple[int, ...]
    reason: str
    error: str
    exitcode: int | None
    count: int
    command: str = ""
    pid: int = field(default=0, compare=False)


class WorkerFailedError(RuntimeError):
    """A worker failed more than ``max_restarts`` times (or could not start).

    The message names the worker, its envs, its failure count and the last error text; the
    same facts are attributes: ``worker``, ``envs``, ``failures``, ``max_restarts``,
    ``last_error`` and ``events`` (its :class:`RestartEvent` list).
    The pool is closed when this is raised.
    """

    def __init__(
        self,
        worker: int,
        envs: tuple[int, ...],
        failures: int,
        max_restarts: int,
        last_error: str,
        events: list[RestartEvent],
        starting: bool = False,
    ) -> None:
        self.worker = worker
        self.envs = envs
        self.failures = failures
        self.max_restarts = max_restarts
        self.last_error = last_error
        self.events = list(events)
        span = f"{envs[0]}..{envs[-1]}" if len(envs) > 1 else str(envs[0]) if envs else "-"
        if starting:
            what = "could not start its envs; the pool is closed. Error"
        else:
            what = (
                f"failed {failures} time(s), more than max_restarts={max_restarts}; "
                "the pool is closed. Last error"
            )
        super().__init__(f"env worker {worker} (envs {span}) {what}:\n{last_error}")


class WaitTimeoutError(multiprocessing.TimeoutError, TimeoutError):
    """``reset_wait``/``step_wait(timeout=...)``: the envs did not answer within the caller's
    timeout. Both ``TimeoutError`` and ``multiprocessing.TimeoutError`` (what gymnasium's
    AsyncVectorEnv raises) catch it. The workers are not restarted; their late answers are
    discarded before the next command."""


class SpaceMismatchError(RuntimeError, ValueError):
    """The envs of a pool do not have compatible spaces. A ``RuntimeError`` like gymnasium's
    AsyncVectorEnv raises, and a ``ValueError`` (bad input) as rlstash's checks raise."""


class WorkerRestartWarning(UserWarning):
    """A worker failed and was restarted; its envs' episodes were ended as truncated."""


class OversubscriptionWarning(UserWarning):
    """Far more worker processes were asked for than CPU cores are usable."""


class AutoChoiceWarning(UserWarning):
    """``num_workers="auto"`` measured both ways and says which it chose."""


def user_stacklevel() -> int:
    """``stacklevel`` for ``warnings.warn`` called right here that points at the first frame
    outside ``rlstash/envs`` (the user's line), however deep the call came from."""
    here = os.path.dirname(os.path.abspath(__file__))
    level, frame = 1, sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(here):
        frame = frame.f_back
        level += 1
    return level
