"""AsyncCollector: worker processes with their own CPU copy of the policy run ahead of the
learner and hand over fixed-size trajectory chunks through shared memory.

::

    collector = AsyncCollector("CartPole-v1", make_policy, num_workers=2,
                               frames_per_batch=256, envs_per_worker=4, seed=0)
    with collector:
        for batch in collector:                 # [T, N] stream layout, N = 2 * 4 lanes
            rb.extend(batch)                    # StreamStorage(num_envs=N) takes it as is
            limiter.on_insert(256)
            ...train...
            collector.update_policy_weights(agent.policy_state_dict())

How it works (sample-factory style):

* Each worker process steps ``envs_per_worker`` envs with its own copy of the policy, built
  by ``policy_factory()`` inside the worker after CUDA was hidden (``CUDA_VISIBLE_DEVICES=""``
  before torch is imported, ``torch.set_num_threads(1)``); it writes chunks of T steps into
  a ring of ``slots_per_worker`` shared-memory slots and sends only the slot index.
* A batch is the concatenation of one chunk of every worker, in worker order: lanes
  ``w * n .. (w + 1) * n - 1`` are worker ``w``'s envs, always the same, so a
  ``StreamStorage(num_envs=N)`` extends with every batch and each lane's batches follow
  each other in time. Fields as :class:`~rlstash.collect.sync.Collector`: ``obs`` (the
  observation each action was taken from), ``action``, ``reward`` (float32), ``terminated``,
  ``truncated`` (+ ``final_obs`` in same-step mode), gymnasium next-step autoreset by default.
* What must not reach the storage is in attributes of the :class:`AsyncBatch` (a dict):
  ``policy_version`` (the oldest policy version in the batch), ``policy_versions`` [N],
  ``worker_index`` [N] and ``worker_restarted`` [N].
* ``update_policy_weights(state_dict)`` writes into a shared block laid out once from the
  policy's state dict and bumps the version; workers copy it in between chunks.
* A worker that raises, dies (kill -9, segfault) or delivers no chunk within
  ``frames_per_batch / N * step_timeout`` seconds (while it has a free slot) is restarted
  from its factories with fresh seeds, up to ``max_restarts`` times
  (:class:`~rlstash.envs.WorkerFailedError` after that). Chunks it delivered stay valid;
  its running episodes end as truncated in the data (see :mod:`rlstash.collect.async_fleet`):
  nothing is ever stitched. Because of that rule each worker's newest chunk is held back
  until its next one is complete: data arrive one chunk later than they were collected.
* ``close()``, ``with``, garbage collection, Ctrl-C and interpreter exit stop every worker
  and the fork server; the shared memory is an anonymous ``memfd`` (nothing in /dev/shm), and
  no ``multiprocessing`` object (semaphore, queue, resource tracker) is used.
"""

from __future__ import annotations

import numbers
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from rlstash.collect.async_fleet import Fleet, Sizes, make_launcher
from rlstash.collect.async_layout import STEP_FIELDS
from rlstash.collect.sync import EpisodeStats
from rlstash.envs import config
from rlstash.envs.cpus import usable_cpus
from rlstash.envs.errors import RestartEvent
from rlstash.envs.launch import child_environ, default_start_method
from rlstash.ratelimit import RateLimiter


class AsyncBatch(dict):
    """A batch ``{field: tensor [T, N, ...]}`` plus attributes the storage must not see.

    Attributes:
        policy_version: the oldest policy version any of its lanes was collected with.
        policy_versions: int64 [N], the policy version of each lane's chunk.
        worker_index: int64 [N], the worker holding each lane.
        worker_restarted: bool [N], lanes whose worker failed after this chunk; their
            episodes were ended (truncated) at the last row.
    """

    policy_version: int
    policy_versions: torch.Tensor
    worker_index: torch.Tensor
    worker_restarted: torch.Tensor


class AsyncCollector:
    """Worker processes with policy copies fill chunks ahead; see the module docstring."""

    def __init__(
        self,
        env_fns: str | Callable | Sequence[Callable],
        policy_factory: Callable[[], Any],
        num_workers: int | None,
        frames_per_batch: int,
        envs_per_worker: int | None = None,
        seed: int | None = None,
        start_method: str | None = None,
        max_restarts: int = 3,
        step_timeout: float | None = None,
        rate_limiter: Any = None,
        autoreset_mode: str | Any = "NextStep",
        slots_per_worker: int = 3,
        start_timeout: float | None = config.START_TIMEOUT,
    ) -> None:
        """Start the workers (returns once every worker built its envs and policy).

        Args:
            env_fns: a gymnasium env id, one env factory, or one factory per env (lambdas
                are fine: cloudpickle); a list sets N and, by default, ``envs_per_worker``.
            policy_factory: zero-argument callable run in each worker, returning an
                ``nn.Module`` (``actions = policy(obs)``) or an object with ``act(obs)``
                (agents); ``obs`` is a CPU tensor [n, *obs_shape], actions [n, *act_shape].
            num_workers: W worker processes; None: the usable CPU cores.
            frames_per_batch: T * N env steps per batch (a multiple of N).
            envs_per_worker: n envs per worker (N = W * n); default 1, or len(env_fns) / W.
            seed: env i's first reset uses ``seed + i``; restart seeds and the workers'
                torch seeds come from ``numpy.random.default_rng(seed)``.
            start_method: ``"forkserver"`` (default where available: torch is imported once
                in a server and each worker is forked from it) or ``"spawn"``.
            max_restarts: failures tolerated per worker before WorkerFailedError.
            step_timeout: seconds per env step; a worker with a free slot that delivers no
                chunk of T steps within ``T * step_timeout`` is killed and restarted. A
                worker's reset of its envs (at the start and after a restart) has the same
                bound; a restarted worker that misses it is one more failure.
            rate_limiter: a :class:`~rlstash.ratelimit.RateLimiter`; each batch waits for
                ``wait_insert(frames_per_batch)`` (the caller reports ``on_insert``).
            autoreset_mode: ``"NextStep"`` (default) or ``"SameStep"`` (adds ``final_obs``): a
                ``gymnasium.vector.AutoresetMode`` or its value (:mod:`rlstash.autoreset`).
            slots_per_worker: K >= 2 chunk slots per worker (how far a worker may run ahead).
            start_timeout: seconds a worker may take to start and build its envs and policy,
                at the start (then :class:`~rlstash.envs.WorkerFailedError`) and after each
                restart (one more failure); None waits.
        """
        if isinstance(policy_factory, torch.nn.Module) or not callable(policy_factory):
            raise TypeError(
                f"policy_factory: expected a zero-argument callable returning the policy, "
                f"got {type(policy_factory).__name__} (wrap a module: lambda: MyPolicy(...))"
            )
        W = (
            usable_cpus()
            if num_workers is None
            else config.check_positive_int("num_workers", num_workers)
        )
        fns, n = _factories(env_fns, W, envs_per_worker)
        N = len(fns)
        config.num_workers(W, N)  # warns when far more workers than cores
        T = _steps(frames_per_batch, N)
        K = config.check_positive_int("slots_per_worker", slots_per_worker, minimum=2)
        mode = config.autoreset_mode(autoreset_mode)
        if mode == "disabled":
            raise ValueError("autoreset_mode: expected 'NextStep' or 'SameStep', got 'Disabled'")
        method = _start_method(start_method)
        timeouts = config.Timeouts(
            start=config.step_timeout(start_timeout, "start_timeout"),
            step=config.step_timeout(step_timeout),
        )
        restarts = config.check_positive_int("max_restarts", max_restarts, minimum=0)
        self._seed = config.seed(seed)
        _check_limiter(rate_limiter)
        rng = np.random.default_rng(self._seed)
        sizes = Sizes(T, K, mode, timeouts)
        launcher = make_launcher(method, child_environ(), timeouts.start)
        groups = [fns[w * n : (w + 1) * n] for w in range(W)]
        self._fleet = Fleet(groups, policy_factory, sizes, launcher, restarts, rng)
        self._finalizer = weakref.finalize(self, self._fleet.close)
        seeds = [self._seed + i for i in range(N)] if self._seed is not None else None
        described = self._fleet.start(seeds or self._fleet.fresh_seeds(N))
        self.policy_factory, self.rate_limiter = policy_factory, rate_limiter
        self.num_workers, self.envs_per_worker, self.num_envs = W, n, N
        self.frames_per_batch, self.steps_per_batch = T * N, T
        self.slots_per_worker, self.start_method, self.autoreset_mode = K, method, mode
        self.single_observation_space = described["observation_space"]
        self.single_action_space = described["action_space"]
        self.frames = 0
        self.stats = EpisodeStats()
        self._ret, self._len = np.zeros(N, np.float64), np.zeros(N, np.int64)
        self._after_done = np.zeros(N, bool)

    # --- iteration --------------------------------------------------------------------
    def __iter__(self) -> Iterator[AsyncBatch]:
        while True:
            yield self.collect()

    def collect(self) -> AsyncBatch:
        """The next batch [T, N] (blocks until every worker has a chunk ready, and on the
        rate limiter); hands the copied slots back to the workers."""
        fleet = self._check_open()
        if self.rate_limiter is not None:
            while not self.rate_limiter.wait_insert(self.frames_per_batch, timeout=0.05):
                fleet.pump(0)  # notice failures while the learner catches up
        while not all(fleet.releasable(h) for h in fleet.handles):
            fleet.pump(1.0)
        return self._assemble(fleet)

    def _assemble(self, fleet: Fleet) -> AsyncBatch:
        """Copy the oldest chunk of every worker into one [T, N] batch, then free the slots."""
        T, W, n = self.steps_per_batch, self.num_workers, self.envs_per_worker
        N, sh = self.num_envs, fleet.shared
        picked = [fleet.head(h) for h in fleet.handles]  # (slot, cut) per worker
        names = list(STEP_FIELDS) + (["final_obs"] if self.autoreset_mode == "same_step" else [])
        out = AsyncBatch()
        for name in names:
            src = sh[name]  # [W, K, T, n, ...] shared
            dst = np.empty((T, W, n, *src.shape[4:]), src.dtype)  # [T, W, n, ...] -> [T, N, ...]
            for w, (slot, _) in enumerate(picked):
                dst[:, w] = src[w, slot]
            out[name] = torch.from_numpy(dst.reshape(T, N, *src.shape[4:]))
        versions = np.array([sh["meta"][w, slot, 0] for w, (slot, _) in enumerate(picked)])
        for h in fleet.handles:
            fleet.release(h)  # after the copies: an interrupt above loses no slot
        out.policy_versions = torch.from_numpy(np.repeat(versions, n))
        out.policy_version = int(versions.min())
        out.worker_index = torch.from_numpy(np.repeat(np.arange(W, dtype=np.int64), n))
        out.worker_restarted = torch.from_numpy(np.repeat([cut for _, cut in picked], n))
        self.frames += T * N
        self._track(out)
        return out

    def _track(self, batch: AsyncBatch) -> None:
        """Episode returns and lengths; a next-step reset row belongs to no episode."""
        reward = batch["reward"].numpy()
        done = (batch["terminated"] | batch["truncated"]).numpy()
        for t in range(self.steps_per_batch):
            live = ~self._after_done
            self._ret += np.where(live, reward[t], 0.0)
            self._len += live
            ended = done[t] & live
            for i in np.flatnonzero(ended):
                self.stats.returns.append(float(self._ret[i]))
                self.stats.lengths.append(int(self._len[i]))
                self.stats.count += 1
            self._ret[ended], self._len[ended] = 0, 0
            self._after_done = ended if self.autoreset_mode == "next_step" else np.zeros_like(ended)

    # --- weights ----------------------------------------------------------------------
    def update_policy_weights(self, state_dict: Any) -> int:
        """Write ``state_dict`` (the shape of the workers' ``policy_state_dict()`` /
        ``state_dict()``) to shared memory; returns the new version, which the chunks
        collected with it carry. Validated in full first: a bad dict writes nothing.

        Raises:
            TypeError: the policy has no state dict, or ``state_dict`` is not a dict.
            ValueError: keys, shapes or dtypes differ from the workers' policy.
        """
        fleet = self._check_open()
        assert fleet.weights is not None
        if not fleet.weights.spec["tensors"] and not fleet.weights.spec["others"]:
            raise TypeError(
                "update_policy_weights: the workers' policy has no state_dict() or "
                "policy_state_dict(); build it as an nn.Module or an agent"
            )
        return fleet.weights.write(state_dict)

    @property
    def policy_version(self) -> int:
        """The version of the weights in shared memory (0: the factory's own weights)."""
        weights = self._check_open().weights
        assert weights is not None
        return weights.version

    # --- introspection ----------------------------------------------------------------
    @property
    def restarts(self) -> list[RestartEvent]:
        """Every worker failure so far, oldest first."""
        return list(self._fleet.events)

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the current workers."""
        return self._fleet.pids()

    def envs_of(self, worker: int) -> range:
        """The env indices (batch lanes) of ``worker``."""
        return range(worker * self.envs_per_worker, (worker + 1) * self.envs_per_worker)

    def worker_info(self) -> list[dict[str, Any]]:
        """Per worker: ``pid``, ``boot`` (``CUDA_VISIBLE_DEVICES`` and whether torch was
        imported, as found before the worker imported torch), ``cuda_available``,
        ``cuda_initialized``, ``num_threads``, ``policy_version``, ``chunks``."""
        return self._check_open().info()

    # --- shutdown ---------------------------------------------------------------------
    def close(self) -> None:
        """Stop every worker and release the shared memory (idempotent)."""
        self._finalizer()

    @property
    def closed(self) -> bool:
        return self._fleet.closed

    def _check_open(self) -> Fleet:
        if self._fleet.closed:
            raise RuntimeError("AsyncCollector is closed")
        return self._fleet

    def __enter__(self) -> AsyncCollector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"AsyncCollector(num_workers={self.num_workers}, envs_per_worker="
            f"{self.envs_per_worker}, frames_per_batch={self.frames_per_batch})"
        )


def _factories(env_fns: Any, workers: int, per: int | None) -> tuple[list[Callable], int]:
    """One factory per env and the envs per worker (every worker holds the same number)."""
    if per is not None:
        per = config.check_positive_int("envs_per_worker", per)
    if isinstance(env_fns, (list, tuple)):
        fns = config.factories(env_fns, None, None)
        if per is None:
            per = len(fns) // workers
        if per * workers != len(fns) or per == 0:
            raise ValueError(
                f"env_fns: {len(fns)} factories cannot be split into num_workers={workers} "
                f"groups of envs_per_worker={per}; give num_workers * envs_per_worker factories"
            )
        return fns, per
    per = per or 1
    return config.factories(env_fns, workers * per, None), per


def _steps(frames_per_batch: Any, n: int) -> int:
    if isinstance(frames_per_batch, bool) or not isinstance(frames_per_batch, numbers.Integral):
        raise TypeError(f"frames_per_batch: expected an int, got {frames_per_batch!r}")
    if frames_per_batch < n or frames_per_batch % n:
        lo = max(n, frames_per_batch // n * n)
        raise ValueError(
            f"frames_per_batch: expected a positive multiple of num_envs ({n} = num_workers x "
            f"envs_per_worker), got {frames_per_batch}; use {lo} or {lo + n}"
        )
    return int(frames_per_batch) // n


def _check_limiter(limiter: Any) -> None:
    if limiter is not None and not isinstance(limiter, RateLimiter):
        raise TypeError(
            f"rate_limiter: expected a rlstash.RateLimiter, got {type(limiter).__name__}"
        )


def _start_method(value: str | None) -> str:
    if value is None:
        return default_start_method()
    if value not in ("forkserver", "spawn"):
        raise ValueError(
            f"start_method: expected 'forkserver', 'spawn' or None, got {value!r} (a forked "
            "copy of this process would carry its imported torch into the workers)"
        )
    return value
