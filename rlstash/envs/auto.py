"""How a pool lays its envs out over processes (torch-free): the default rule
(:func:`default_layout`, no timing) and ``num_workers="auto"`` (:func:`choose`: time the
in-process and the multi-process backends on the envs at hand, interleaved, keep the faster).

The default rule: with C usable cores (affinity, cgroup quota) and N envs,
``C - 1`` worker processes and ``N // C`` envs stepped by the caller itself (its share,
:mod:`rlstash.envs.caller_share`), so every core steps about N / C envs and the caller works
instead of waiting. It needs no measurement: on 2 cores that layout was the fastest (or within
the timing spread, 2%) of every layout in every cell measured, whatever the step cost, from
CartPole (~5 us/step) over HalfCheetah (~30 us) to a 200 us env, and 8, 32 and 256 envs
(``bench/results/collect.md``, 2026-11-24, idle machine: env steps/s as a multiple of the
one-process loop; best other layout in brackets):

=============== ======= ===================== ========================
env             N       C - 1 workers + caller C workers (old default)
=============== ======= ===================== ========================
CartPole-v1     8 / 32  1.18x / 1.59x         0.48x / 0.94x
Pendulum-v1     8 / 32  1.39x / 1.73x         0.60x / 0.98x
HalfCheetah-v5  8 / 32  1.41x / 1.75x         0.73x / 1.35x
Burn 200 us     8 / 32  1.94x / 1.94x         1.83x / 1.92x
CartPole-v1     256     1.91x                 1.64x
=============== ======= ===================== ========================

Why the step cost does not matter: C workers put C + 1 busy threads (the caller gathers and
scatters) on C cores, so a worker waits for the caller's wake-up every step; with the
caller's share the critical path has C threads on C cores, and the caller's own share costs
what a worker's costs. Cheap steps gain most (the per-step messages are a larger part), costly
steps tie. With fewer than 2 cores or 2 envs, or when the caller must not step envs (a
``step_timeout`` to bound hangs, a ``worker_env`` the envs need, ``max_concurrency``,
gymnasium's ``worker``), the rule gives min(C, N) workers and no share, the old default.
"""

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


def default_layout(num_envs: int, cores: int, contained: bool = False) -> tuple[int, int]:
    """``(num_workers, caller_envs)`` for a pool given neither (see the module docstring):
    ``C - 1`` workers and ``N // C`` envs in the caller for C >= 2 usable cores and N >= 2
    envs; ``min(C, N)`` workers and no share with fewer, or when ``contained`` (every env
    must step in a worker process)."""
    if contained or cores < 2 or num_envs < 2:
        return max(1, min(cores, num_envs)), 0
    share = max(1, num_envs // cores)
    return max(1, min(cores - 1, num_envs - share)), share


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
        k = chosen.caller_envs
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
