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
    processes: Callable[..., ProcessBackend],
    resolve: Callable[[list, list], tuple],
) -> tuple[Backend, dict, dict[str, float]]:
    """Time a few steps in-process, with W worker processes (W: the usable cores) and with
    W-1 workers + the caller's share of n // W envs; returns the fastest started backend
    (the others are closed), its description and the rates measured."""
    n = len(fns)
    inproc = InProcessBackend(fns, mode, restarts, rng)
    described = start(inproc, resolve)
    w = min(usable_cpus(), n)
    shapes = [(w, 0), (w - 1, n // w)] if w >= 2 else []
    backends: list[Backend] = [inproc]
    names = ["in_process"]
    try:
        for workers, caller in shapes:
            backends.append(processes(workers, caller))
            start(backends[-1], resolve)
            names.append(f"processes_{workers}" + (f"+caller_{caller}" if caller else ""))
        # interleaved short rounds, medians: a burst of other load hits all alike
        timers = [_StepTimer(b, described, n) for b in backends]
        budget = 0.04 if len(timers) > 1 else 0.15
        rounds = [[t.rate(budget=budget) for t in timers] for _ in range(_AUTO_ROUNDS)]
    except BaseException:
        for b in backends:
            b.close()
        raise
    rates = [float(np.median(r)) for r in zip(*rounds)]
    best = int(np.argmax(rates))
    for i, b in enumerate(backends):
        if i != best:
            b.close()
    chosen = backends[best]
    timing = dict(zip(names, rates))
    if chosen is inproc:
        where = "in-process (num_workers=0)"
    else:
        k = getattr(chosen, "caller_envs", 0)
        w = chosen.num_workers
        where = f"{w} worker process{'es' if w != 1 else ''}" + (
            f" + {k} envs in this process (caller_envs={k})" if k else ""
        )
    text = ", ".join(f"{k}: {v:,.0f} env steps/s" for k, v in timing.items())
    warnings.warn(
        f'ProcessPoolVectorEnv(num_workers="auto") chose {where} ({text}); pass num_workers '
        "(and caller_envs) explicitly to skip the timing",
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
