"""The body of :class:`~rlstash.envs.process_pool.ProcessPoolVectorEnv`'s constructor: its
arguments checked into one :class:`PoolSetup` (before any process starts), the layout chosen
(:func:`rlstash.envs.auto.default_layout` when none is given) and the backend started
(torch-free)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlstash.envs import auto, config, pool_async
from rlstash.envs.backend import Backend
from rlstash.envs.cpus import usable_cpus
from rlstash.envs.gym_worker import GymWorkerBackend, check_worker
from rlstash.envs.inprocess import InProcessBackend
from rlstash.envs.launch import child_environ
from rlstash.envs.process_backend import ProcessBackend


@dataclass
class PoolSetup:
    """A pool's checked arguments: what the backend is built from."""

    fns: list[Callable]
    mode: str  # "next_step" | "same_step" | "disabled"
    workers: int | str  # an int, or "auto" (timed choice)
    caller: int  # envs in the caller's share
    method: str  # start method of the workers
    timeouts: config.Timeouts
    restarts: int
    obs_mode: str | tuple
    copy: bool
    shared_memory: bool
    daemon: bool
    seed: int | None
    environ: dict[str, str]
    rng: np.random.Generator
    resolve: Callable[[list, list], tuple]
    batch_size: int | None = None  # asynchronous batches (rlstash.envs.pool_async)

    @property
    def num_envs(self) -> int:
        """N, the number of envs."""
        return len(self.fns)

    def processes(self, workers: int, caller: int = 0) -> ProcessBackend:
        """A (not yet started) multi-process backend of ``workers`` processes and ``caller``
        envs in this process."""
        return ProcessBackend(
            self.fns,
            workers,
            self.mode,
            self.method,
            self.environ,
            self.timeouts,
            self.restarts,
            self.rng,
            caller,
        )


def check(
    env_fns: Any,
    num_envs: int | None,
    num_workers: int | str | None,
    seed: int | None,
    *,
    step_timeout: float | None,
    start_timeout: float | None,
    max_restarts: int,
    autoreset_mode: Any,
    env_kwargs: Mapping[str, Any] | None,
    worker_env: Mapping[str, str] | None,
    context: str | None,
    copy: bool,
    observation_mode: str | tuple,
    shared_memory: bool,
    daemon: bool,
    max_concurrency: int | None,
    worker: Callable | None,
    caller_envs: int | None,
    batch_size: int | None = None,
) -> PoolSetup:
    """Every argument checked (ValueError/TypeError naming it) and the layout resolved:
    explicit ``num_workers``/``caller_envs`` as given, else :func:`auto.default_layout`
    (with ``batch_size``: :func:`pool_async.default_workers` workers, no caller's share)."""
    fns = config.factories(env_fns, num_envs, env_kwargs)
    n = len(fns)
    mode = config.autoreset_mode(autoreset_mode)
    batch = pool_async.check_batch_size(batch_size, n)
    timeouts = config.Timeouts(
        start=config.step_timeout(start_timeout, "start_timeout"),
        step=config.step_timeout(step_timeout),
    )
    shared = config.flag("shared_memory", shared_memory)
    if batch is not None and num_workers is None and caller_envs is None:
        workers = pool_async.default_workers(n, batch, usable_cpus())
        workers, caller = config.cap_workers(workers, max_concurrency), 0
    else:
        workers, caller = _layout(
            num_workers, caller_envs, n, max_concurrency, worker, timeouts.step, worker_env
        )
    if batch is not None:
        pool_async.check_layout(workers, caller, mode, worker is not None, n, batch)
    obs_mode = config.observation_mode(observation_mode)
    seed = config.seed(seed)
    return PoolSetup(
        fns=fns,
        mode=mode,
        workers=workers,
        caller=caller,
        method=config.start_method(context),
        timeouts=timeouts,
        restarts=config.check_positive_int("max_restarts", max_restarts, minimum=0),
        obs_mode=obs_mode,
        copy=config.flag("copy", copy),
        shared_memory=shared,
        daemon=config.flag("daemon", daemon),
        seed=seed,
        environ=child_environ(config.worker_env(worker_env)),
        rng=np.random.default_rng(seed),
        resolve=config.space_resolver(obs_mode, shared),
        batch_size=batch,
    )


def _layout(
    num_workers: int | str | None,
    caller_envs: int | None,
    n: int,
    max_concurrency: int | None,
    worker: Callable | None,
    step_timeout: float | None,
    worker_env: Mapping[str, str] | None,
) -> tuple[int | str, int]:
    """``(workers, caller_envs)``: the default layout when neither is given, else as given
    (checked by :func:`config.num_workers`, :func:`config.caller_envs`)."""
    if num_workers is None and caller_envs is None:
        # the caller's share gives up containment: not when a hang must be bounded
        # (step_timeout), envs need the workers' environment (worker_env), steps are capped
        # (max_concurrency) or gymnasium's protocol runs them (worker)
        contained = (
            step_timeout is not None
            or worker_env is not None
            or max_concurrency is not None
            or worker is not None
        )
        workers, caller = auto.default_layout(n, usable_cpus(), contained)
        return config.cap_workers(workers, max_concurrency), caller
    workers = config.cap_workers(config.num_workers(num_workers, n), max_concurrency)
    return config.caller_envs(caller_envs or 0, workers, num_workers, n)


def start(
    setup: PoolSetup,
    worker: Callable | None,
    num_workers: int | str | None,
    context: str | None,
    max_concurrency: int | None,
) -> tuple[Backend, dict, dict[str, float]]:
    """Build and start the backend: gymnasium's worker protocol (``worker``), the timed
    choice (``"auto"``), in-process (0) or worker processes (with the caller's share).
    Returns the started backend, the envs' description and the rates the timed choice
    measured (empty otherwise)."""
    if worker is not None:
        check_worker(worker, num_workers)
        if setup.caller:
            raise ValueError(f"caller_envs: expected 0 with a custom worker, got {setup.caller}")
        gym_options = {
            "context": context, "shared_memory": setup.shared_memory, "daemon": setup.daemon,
            "observation_mode": setup.obs_mode, "max_concurrency": max_concurrency,
        }  # fmt: skip
        backend: Backend = GymWorkerBackend(setup.fns, worker, setup.mode, gym_options)
        return backend, auto.start(backend, setup.resolve), {}
    if setup.workers == "auto":
        return auto.choose(
            setup.fns, setup.mode, setup.restarts, setup.rng, setup.processes, setup.resolve
        )
    if setup.workers == 0:
        backend = InProcessBackend(setup.fns, setup.mode, setup.restarts, setup.rng)
    else:
        backend = setup.processes(int(setup.workers), setup.caller)
    return backend, auto.start(backend, setup.resolve), {}
