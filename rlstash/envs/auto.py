"""``num_workers="auto"``: time the in-process and the multi-process backends on the envs
at hand, interleaved, and keep the faster (torch-free)."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable

import numpy as np
from gymnasium.vector.utils import batch_space, iterate

from rlstash.envs.backend import Backend
from rlstash.envs.cpus import usable_cpus
from rlstash.envs.errors import AutoChoiceWarning, user_stacklevel
from rlstash.envs.inprocess import InProcessBackend
from rlstash.envs.process_backend import ProcessBackend
from rlstash.envs.shm import flatten_value


def start(backend: Backend, resolve: Callable[[list, list], tuple]) -> dict:
    """``backend.start(resolve)``; the backend is closed if that fails."""
    try:
        return backend.start(resolve)
    except BaseException:
        backend.close()
        raise


def choose(
    fns: list[Callable],
    mode: str,
    restarts: int,
    rng: np.random.Generator,
    processes: Callable[[int], ProcessBackend],
    resolve: Callable[[list, list], tuple],
) -> tuple[Backend, dict, dict[str, float]]:
    """Time a few steps in-process and with worker processes; returns the faster started
    backend (the other is closed), its description and the rates measured."""
    inproc = InProcessBackend(fns, mode, restarts, rng)
    described = start(inproc, resolve)
    w = min(usable_cpus(), len(fns))
    chosen: Backend = inproc
    if w < 2:
        timing = {"in_process": _StepTimer(inproc, described, len(fns)).rate()}
    else:
        procs = processes(w)
        try:
            start(procs, resolve)
            # interleaved short rounds, medians: a burst of other load hits both alike
            timers = [_StepTimer(b, described, len(fns)) for b in (inproc, procs)]
            rounds = [[t.rate(budget=0.04) for t in timers] for _ in range(_AUTO_ROUNDS)]
            rate_in, rate_procs = (float(np.median(r)) for r in zip(*rounds))
        except BaseException:
            procs.close()
            inproc.close()
            raise
        timing = {"in_process": rate_in, f"processes_{w}": rate_procs}
        chosen = procs if rate_procs > rate_in else inproc
        (inproc if chosen is procs else procs).close()
    where = f"{w} worker processes" if chosen is not inproc else "in-process (num_workers=0)"
    text = ", ".join(f"{k}: {v:,.0f} env steps/s" for k, v in timing.items())
    warnings.warn(
        f'ProcessPoolVectorEnv(num_workers="auto") chose {where} ({text}); pass num_workers '
        "explicitly to skip the timing",
        AutoChoiceWarning,
        stacklevel=user_stacklevel(),
    )
    return chosen, described, timing


_AUTO_ROUNDS = 5  # num_workers="auto": interleaved timing rounds per candidate


class _StepTimer:
    """Times env steps of a started ``backend`` with random actions (reset and one warm-up
    step on construction); ``rate()`` may be called repeatedly, interleaved with others."""

    def __init__(self, backend: Backend, described: dict, n: int):
        self.backend, self.n = backend, n
        space = batch_space(described["action_space"], n)
        space.seed(0)
        sample = space.sample()
        if backend.shared.layout.act_pickled:
            backend.actions = list(iterate(space, sample))  # type: ignore[attr-defined]
        for view, a in zip(backend.shared.leaves("act"), flatten_value(space, sample, "actions")):
            np.copyto(view, np.asarray(a), casting="unsafe")
        backend.reset([None] * n, None, None)
        backend.step_async()
        backend.step_wait(None)  # warm-up
        self.ended = backend.shared["terminated"] | backend.shared["truncated"]

    def rate(self, budget: float = 0.15) -> float:
        """Env steps per second over about ``budget`` seconds (at least 3 steps, at most 500)."""
        backend, ended = self.backend, self.ended
        steps, t0 = 0, time.perf_counter()
        while steps < 3 or (time.perf_counter() - t0 < budget and steps < 500):
            if backend.mode == "disabled" and ended.any():  # type: ignore[attr-defined]
                backend.reset([None] * self.n, None, ended)
            backend.step_async()
            backend.step_wait(None)
            np.logical_or(backend.shared["terminated"], backend.shared["truncated"], out=ended)
            steps += 1
        return steps * self.n / (time.perf_counter() - t0)
