"""ProcessPoolVectorEnv: many gymnasium envs stepped by a few torch-free worker processes.

    with ProcessPoolVectorEnv("CartPole-v1", num_envs=32, num_workers=2, seed=0) as pool:
        obs, infos = pool.reset()                       # obs: [32, 4] float32
        for _ in range(1000):
            actions = pool.action_space.sample()        # [32] int64
            obs, rewards, terminated, truncated, infos = pool.step(actions)

It is a drop-in for ``gymnasium.vector.AsyncVectorEnv``: the same constructor arguments
(``shared_memory``, ``copy``, ``context``, ``daemon``, ``observation_mode``,
``autoreset_mode``, ``max_concurrency``), the same ``reset``/``step``/``call`` and their
``*_async``/``*_wait`` (a caller's ``timeout`` raises ``TimeoutError``), ``call``/``get_attr``/``set_attr``/
``render``, ``np_random_seed`` (env i after ``reset(seed=s)``: ``s + i``), gymnasium's error
classes and messages for out-of-order calls, every space (Text, Graph, Sequence, OneOf and
custom spaces without a fixed shape and dtype are pickled; fixed-size custom observation
spaces go through shared memory), ``metadata["autoreset_mode"]``. gymnasium's own vector-env test
suite passes against it except where rlstash deliberately differs
(``bench/results/gymnasium_suite.md``):

* An env that raises is restarted (up to ``max_restarts``), not re-raised; with
  ``max_restarts=0`` the env's exception is re-raised with its type, as AsyncVectorEnv does.
* Actions outside the action space are refused here, naming the envs, before anything is
  sent (:mod:`rlstash.envs.actions`); AsyncVectorEnv lets the env fail.
* Custom spaces work with ``shared_memory=True`` (pickled); AsyncVectorEnv raises.
* ``worker=`` (AsyncVectorEnv's replaceable worker function, which speaks gymnasium's pipe
  protocol) runs the envs in gymnasium's own AsyncVectorEnv behind the pool
  (:mod:`rlstash.envs.gym_worker`): one process per env, no restarts.

How it works and what else it does:

* W workers each step ``num_envs / W`` envs; observations, rewards, flags, final observations
  and actions live in one shared-memory segment; a step costs one 5-byte message per worker
  each way. Infos travel only when an env returns a non-empty info dict; infos of plain
  numbers with the same keys in every env go through shared memory too
  (:mod:`rlstash.envs.info_columns`), others are pickled.
* Workers never import torch, run with ``CUDA_VISIBLE_DEVICES=""`` and one math-library
  thread (``worker_env`` overrides), ignore Ctrl-C and exit when the pool's process is gone.
* A worker that dies, raises in an env, or does not answer within ``step_timeout`` is
  restarted from its factories with fresh seeds; the new worker must start within
  ``start_timeout`` and reset its envs within ``step_timeout``, else that is one more failure. Its envs' episodes end as truncated with
  ``infos["worker_restarted"]`` (bool [N], mask ``infos["_worker_restarted"]``); the
  observation returned for them is the fresh reset observation, *not* a final observation.
  ``next_step``: that step says truncated, the following step is a reset step (reward 0).
  ``same_step``: no ``final_obs`` for them (``infos["_final_obs"]`` is False there).
  After ``max_restarts`` failures of one worker, :class:`WorkerFailedError` (pool closed).
* ``num_workers=0`` steps the envs in this process. ``caller_envs=k``: the last k envs step
  in this process during ``step_wait`` (as with ``num_workers=0``) while the workers step the
  others, so the caller's core works instead of waiting (:mod:`rlstash.envs.caller_share`;
  on 2 idle cores ``num_workers=1, caller_envs=n // 2`` beat 2 workers and in-process for
  CartPole, Pendulum, HalfCheetah and a 200 us env, ``bench/results/collect_timeline.md``;
  on cores busy with other work it loses). An env of the caller's share that raises is
  handled as a worker that raised (the share is rebuilt, reported as worker
  ``num_workers``); a hang or a segfault there cannot be contained, as in-process.
  **The default** (neither ``num_workers`` nor ``caller_envs`` given) is that layout:
  C - 1 workers and the caller's share of N // C envs on C >= 2 usable cores
  (:func:`rlstash.envs.auto.default_layout`, the rule and its measurements), unless
  ``step_timeout``, ``worker_env`` or ``max_concurrency`` is given (then every env steps in
  a worker, min(C, N) workers). Pass ``caller_envs=0`` to keep every env in a worker process.
  ``"auto"`` times in-process, W workers and W-1 workers + the caller's share of n // W envs
  (W: the usable cores) and keeps the fastest; it may so give up the isolation of the
  envs it puts in this process (its warning says what it chose).
* Observations are returned as copies unless ``pool.copy = False`` (then they are views of
  shared memory, valid until the next ``step``/``reset``).
* The shared segment is an anonymous ``memfd`` (named ``rlstash_<pid>_pool`` in
  ``/proc/<pid>/fd``): nothing appears in ``/dev/shm`` and nothing can leak there, however
  the processes end; no ``multiprocessing`` resource tracker, semaphore or queue is used.
* ``batch_size=B < num_envs``: asynchronous batches with EnvPool's semantics
  (:mod:`rlstash.envs.pool_async`): ``async_reset()``, ``recv()`` (the first B envs ready,
  ``infos["env_id"]`` names them), ``send(actions, env_ids)``; slow envs no longer hold the
  fast ones back (:class:`~rlstash.collect.async_batches.AsyncBatchCollector` runs the loop).
* Infos are batched per worker block (:mod:`rlstash.envs.infos`), exactly as gymnasium's
  ``_add_info`` would, except when one info key mixes value types across envs (e.g. bool in
  one env, int in another): then each block casts to its own first type before merging.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import error as gym_error
from gymnasium import logger
from gymnasium.vector import VectorEnv
from gymnasium.vector.utils import batch_space

from rlstash.envs import batching, config, pool_async, pool_setup
from rlstash.envs.backend import Backend
from rlstash.envs.errors import RestartEvent
from rlstash.envs.infos import merge_infos
from rlstash.envs.pool_arrays import PoolArrays


class ProcessPoolVectorEnv(VectorEnv):
    """A vector env over worker processes (or in-process); see the module docstring."""

    def __init__(
        self,
        env_fns: str | Callable | Sequence[Callable],
        num_envs: int | None = None,
        num_workers: int | str | None = None,
        seed: int | None = None,
        *,
        step_timeout: float | None = None,
        start_timeout: float | None = config.START_TIMEOUT,
        max_restarts: int = 3,
        autoreset_mode: str | Any = "NextStep",
        env_kwargs: Mapping[str, Any] | None = None,
        worker_env: Mapping[str, str] | None = None,
        context: str | None = None,
        copy: bool = True,
        observation_mode: str | tuple = "same",
        shared_memory: bool = True,
        daemon: bool = True,
        max_concurrency: int | None = None,
        worker: Callable | None = None,
        caller_envs: int | None = None,
        batch_size: int | None = None,
    ) -> None:
        """Start the envs.

        Args:
            env_fns: a registered env id (``gymnasium.make(env_fns, **env_kwargs)``), a
                zero-argument env factory (lambdas are fine: cloudpickle), or one factory per
                env (as for AsyncVectorEnv).
            num_envs: number of envs N (default: ``len(env_fns)`` for a list).
            num_workers: worker processes W; None (with ``caller_envs`` None): the default
                layout, C - 1 workers and N // C envs in the caller for C >= 2 usable cores
                (affinity, cgroup quota), else min(C, N) workers
                (:func:`rlstash.envs.auto.default_layout`: the rule and its measurements);
                0: in this process; ``"auto"``: time the layouts, keep the fastest.
            seed: env i's first reset uses ``seed + i`` (unless reset gets a seed); restart
                seeds come from ``numpy.random.default_rng(seed)``.
            step_timeout: seconds a worker may take per step/reset/call before it is killed
                and restarted; None waits (a dead worker is still detected at once). A
                restarted worker's reset has the same bound (missing it is one more failure).
            start_timeout: seconds a worker may take to start and build its envs, at the
                start (then :class:`WorkerFailedError`) and at each restart (one more
                failure); None waits.
            max_restarts: failures tolerated per worker before :class:`WorkerFailedError`;
                with 0, an exception raised in an env is re-raised here as it is.
            autoreset_mode: a ``gymnasium.vector.AutoresetMode`` or its value:
                ``"NextStep"`` (default), ``"SameStep"``, ``"Disabled"`` (the old
                ``"next_step"`` spelling warns: :mod:`rlstash.autoreset`).
            env_kwargs: keyword arguments for every factory / ``gymnasium.make``.
            worker_env: extra environment variables for workers, e.g.
                ``{"OMP_NUM_THREADS": "4"}`` (defaults: CUDA hidden, one thread per library).
            context: how workers start: ``"forkserver"`` (default where available),
                ``"spawn"`` or ``"fork"`` (AsyncVectorEnv's name; ``start_method`` before).
            copy: return copies of observations (True) or views of shared memory valid until
                the next ``step``/``reset`` (False).
            observation_mode: ``"same"`` (every env has env 0's space), ``"different"``
                (same shapes and dtypes, other bounds) or a (batched, single) pair of spaces.
            shared_memory: observations through shared memory (True) or pickled with the
                workers' replies (False), as in AsyncVectorEnv. Spaces without a fixed array
                layout (Text, Graph, Sequence, OneOf, custom spaces without a fixed shape and
                dtype) are pickled either way (AsyncVectorEnv refuses some of them with
                ``shared_memory=True``); custom action spaces always are.
            daemon: accepted for AsyncVectorEnv code; workers always end with this process
                and may always start processes of their own (both values behave the same).
            max_concurrency: at most this many envs step at the same time (AsyncVectorEnv's
                argument): caps ``num_workers``, since each worker steps its envs in turn.
            worker: AsyncVectorEnv's custom worker function (8 arguments, gymnasium's pipe
                protocol). Given one, the envs run in gymnasium's AsyncVectorEnv, one process
                per env (:mod:`rlstash.envs.gym_worker`): no restarts, no torch-free start;
                ``num_workers`` must be None.
            caller_envs: the last ``caller_envs`` envs step in this process during
                ``step_wait`` while the workers step the others (see the module docstring).
                Needs ``num_workers >= 1`` (None: the usable cores minus one). None: 0,
                unless ``num_workers`` is None too (the default layout above); 0: every env
                in a worker process.
            batch_size: B: asynchronous batches (:meth:`async_reset`, :meth:`recv`,
                :meth:`send`; :mod:`rlstash.envs.pool_async`): ``recv`` returns the first B
                envs that are ready; with B < N, ``reset``/``step`` are refused. Every env
                steps in a worker (no caller's share; default: ``max(C, ceil(N / B))``
                workers, at most N). None: synchronous only.
        """
        setup = pool_setup.check(
            env_fns, num_envs, num_workers, seed,
            step_timeout=step_timeout, start_timeout=start_timeout, max_restarts=max_restarts,
            autoreset_mode=autoreset_mode, env_kwargs=env_kwargs, worker_env=worker_env,
            context=context, copy=copy, observation_mode=observation_mode,
            shared_memory=shared_memory, daemon=daemon, max_concurrency=max_concurrency,
            worker=worker, caller_envs=caller_envs, batch_size=batch_size,
        )  # fmt: skip
        self.copy, self.shared_memory, self.daemon = setup.copy, setup.shared_memory, setup.daemon
        self._seed = setup.seed
        backend, described, self.auto_timing = pool_setup.start(
            setup, worker, num_workers, context, max_concurrency
        )
        self._backend = backend
        self._finalizer = weakref.finalize(self, backend.close)
        self.context: str | None = (
            context if worker is not None else setup.method if backend.num_workers else None
        )
        self._adopt(setup, backend, described)

    def _adopt(self, setup: pool_setup.PoolSetup, backend: Backend, described: dict) -> None:
        """The pool's attributes from its checked arguments and its started backend."""
        n = setup.num_envs
        self.num_envs = n
        self.num_workers: int = backend.num_workers
        self.caller_envs: int = backend.caller_envs
        self.step_timeout = setup.timeouts.step
        self.start_timeout = setup.timeouts.start
        self.max_restarts = setup.restarts
        self.observation_mode = setup.obs_mode
        self._mode = setup.mode
        self.autoreset_mode = config.MODE_ENUM[setup.mode]
        self.metadata = {**described["metadata"], "autoreset_mode": self.autoreset_mode}
        self.render_mode = described["render_mode"]
        self.spec = described.get("spec")
        self.single_observation_space = described["observation_space"]
        self.single_action_space = described["action_space"]
        self.observation_space = batching.batched_obs_space(setup.obs_mode, described, n)
        self.action_space = batch_space(self.single_action_space, n)
        self._arrays = PoolArrays(
            backend, self.single_observation_space, self.single_action_space, n
        )
        self._reset_once = False
        self._state = _IDLE  # or the pending call: "reset", "step", "call"
        self._needs_reset = np.zeros(n, dtype=bool)  # disabled mode: ended, not reset yet
        self.batch_size: int = setup.batch_size or n
        self._async: pool_async.AsyncBatches | None = None
        if setup.batch_size is not None:
            try:
                self._async = pool_async.AsyncBatches(backend, self._arrays, setup.batch_size)  # type: ignore[arg-type]
            except BaseException:
                self.close()
                raise

    @property
    def start_method(self) -> str | None:
        """The start method of the workers (``context``); None in-process."""
        return self.context

    # --- gymnasium VectorEnv API ------------------------------------------------------
    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """Reset all envs (or those in ``options["reset_mask"]``); returns (obs, infos).

        ``seed``: None (first reset: the pool's ``seed + i``), an int (env i gets
        ``seed + i``) or one seed per env.
        """
        self.reset_async(seed=seed, options=options)
        return self.reset_wait()

    def reset_async(
        self, seed: int | Sequence[int | None] | None = None, options: dict | None = None
    ) -> None:
        """Send the reset to the workers; :meth:`reset_wait` collects it."""
        self._check_open()
        self._refuse_sync("reset")
        seeds = self._seeds(seed)
        self._expect_idle("reset_async")
        options = dict(options) if options is not None else None
        mask = batching.pop_reset_mask(options, self.num_envs)
        super().reset(seed=seed if isinstance(seed, int) else None)
        self._backend.reset_async(seeds, options, mask)
        self._state, self._reset_mask = "reset", mask

    def reset_wait(self, timeout: float | None = None) -> tuple[Any, dict[str, Any]]:
        """Finish :meth:`reset_async`: (obs, infos). ``timeout``: seconds to wait before
        :class:`~rlstash.envs.errors.WaitTimeoutError` (a ``TimeoutError``)."""
        self._check_open()
        if self._state != "reset":
            raise gym_error.NoAsyncCallError(
                "Calling `reset_wait` without any prior call to `reset_async`.", "reset"
            )
        self._state = _IDLE
        entries, restarted = self._backend.reset_wait(timeout)
        self._reset_once = True
        mask = self._reset_mask
        self._needs_reset[slice(None) if mask is None else mask] = False
        infos = self._infos(entries, restarted, finals=False)
        return self._arrays.read_obs(self.copy), infos

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        """Step every env: ``(obs, rewards [N] f64, terminations [N], truncations [N], infos)``."""
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: Any) -> None:
        """Validate and write ``actions`` (batched, ``action_space``) and start the step."""
        self._check_open()
        self._refuse_sync("step")
        self._expect_idle("step_async", end=".")
        if not self._reset_once:
            raise gym_error.ResetNeeded("ProcessPoolVectorEnv: call reset() before step()")
        if self._mode == "disabled" and self._needs_reset.any():
            ended = np.flatnonzero(self._needs_reset).tolist()
            raise RuntimeError(
                f"envs {ended} ended and autoreset_mode='disabled': reset them first with "
                "reset(options={'reset_mask': mask})"
            )
        self._arrays.write_actions(actions)
        self._backend.step_async()
        self._state = "step"

    def step_wait(
        self, timeout: float | None = None
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        """Finish the step started by :meth:`step_async`. ``timeout``: seconds to wait
        before :class:`~rlstash.envs.errors.WaitTimeoutError` (a ``TimeoutError``; the
        workers keep running); ``step_timeout`` still restarts a hung worker."""
        self._check_open()
        if self._state != "step":
            raise gym_error.NoAsyncCallError(
                "Calling `step_wait` without any prior call to `step_async`.", "step"
            )
        self._state = _IDLE
        entries, restarted = self._backend.step_wait(timeout)
        infos = (
            self._infos(entries, restarted, finals=self._mode == "same_step")
            if entries or restarted or self._mode == "same_step"
            else {}
        )
        arrays = self._arrays
        term, trunc, rewards = arrays.terminated, arrays.truncated, arrays.rewards
        if self._mode == "disabled":
            self._needs_reset |= term | trunc
        obs = arrays.read_obs(self.copy)
        if self.copy:
            return obs, rewards.copy(), term.copy(), trunc.copy(), infos
        return obs, rewards, term, trunc, infos

    # --- asynchronous batches (batch_size; rlstash.envs.pool_async) ----------------------
    def async_reset(self, seed: int | Sequence[int | None] | None = None) -> None:
        """Reset every env; their reset observations arrive through :meth:`recv` (steps in
        flight are discarded). ``seed`` as for :meth:`reset`."""
        batches = self._batches("async_reset")
        seeds = self._seeds(seed)
        if self._state not in (_IDLE, _ASYNC):
            self._expect_idle("async_reset")
        super().reset(seed=seed if isinstance(seed, int) else None)
        batches.reset(seeds)
        self._reset_once, self._state = True, _ASYNC

    def recv(
        self, timeout: float | None = None
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """The results of the next ``batch_size`` envs that are ready: ``(obs [B, ...],
        rewards [B] f64, terminated [B], truncated [B], infos)`` with ``infos["env_id"]``
        ([B] int64) naming them. ``timeout``: seconds to wait before
        :class:`~rlstash.envs.errors.WaitTimeoutError`."""
        batches = self._batches("recv")
        if self._state != _ASYNC:
            raise gym_error.NoAsyncCallError("Calling `recv` before `async_reset`.", "recv")
        return batches.recv(timeout)

    def send(self, actions: Any, env_ids: Any) -> None:
        """Actions ``[k, ...]`` for the envs ``env_ids`` (ids :meth:`recv` returned, each
        once); a worker steps once all its envs have their action."""
        batches = self._batches("send")
        if self._state != _ASYNC:
            raise gym_error.NoAsyncCallError("Calling `send` before `async_reset`.", "send")
        batches.send(actions, env_ids)

    def _batches(self, what: str) -> pool_async.AsyncBatches:
        self._check_open()
        if self._async is None:
            raise RuntimeError(
                f"{what}: this pool steps synchronously; make it with "
                "ProcessPoolVectorEnv(..., batch_size=B) for asynchronous batches"
            )
        return self._async

    def _refuse_sync(self, what: str) -> None:
        if self.batch_size != self.num_envs:
            raise RuntimeError(
                f"{what}: this pool has batch_size={self.batch_size} < num_envs="
                f"{self.num_envs} (asynchronous); use async_reset/recv/send "
                "(AsyncBatchCollector)"
            )

    def call_async(self, name: str, *args: Any, **kwargs: Any) -> None:
        """Like ``AsyncVectorEnv.call_async``: send the call; :meth:`call_wait` collects it."""
        self._check_open()
        self._expect_idle("call_async", end=".")
        self._check_call_name(name)
        self._backend.call_async(name, args, kwargs)
        self._state = "call"

    def call_wait(self, timeout: float | None = None) -> tuple[Any, ...]:
        """Finish :meth:`call_async`. ``timeout``: seconds to wait before
        :class:`~rlstash.envs.errors.WaitTimeoutError` (a ``TimeoutError``; the workers keep
        running, their late answers are discarded; in-process the call runs here in full)."""
        self._check_open()
        if self._state != "call":
            raise gym_error.NoAsyncCallError(
                "Calling `call_wait` without any prior call to `call_async`.", "call"
            )
        self._state = _IDLE
        return tuple(self._backend.call_wait(timeout))

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """``env.get_wrapper_attr(name)(*args, **kwargs)`` (or the attribute) per env."""
        self._check_open()
        self._expect_idle("call", end=".")
        self._check_call_name(name)
        return tuple(self._backend.call(name, args, kwargs))

    @staticmethod
    def _check_call_name(name: str) -> None:
        if name in ("reset", "step", "close"):
            raise ValueError(f"name: call({name!r}) is not allowed, use pool.{name}() instead")

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """The attribute ``name`` of every env."""
        return self.call(name)

    def set_attr(self, name: str, values: Any) -> None:
        """Set ``name`` on every env: one value per env (list/tuple of N) or one for all."""
        self._check_open()
        if not isinstance(values, (list, tuple)):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ValueError(
                f"values: expected a list or tuple of {self.num_envs} values (one per env), "
                f"got {len(values)}"
            )
        self._expect_idle("set_attr", end=".")
        self._backend.set_attr(name, list(values))

    def render(self) -> tuple[Any, ...] | None:
        """Every env's ``render()``."""
        return self.call("render")

    @property
    def np_random_seed(self) -> tuple[int, ...]:
        """Every env's ``np_random_seed`` (env i after ``reset(seed=s)``: ``s + i``)."""
        return self.get_attr("np_random_seed")

    @property
    def np_random(self) -> tuple[np.random.Generator, ...]:
        """Every env's random generator (copies: the envs live in the workers)."""
        return self.get_attr("np_random")

    def close_extras(self, timeout: float | None = None, terminate: bool = False) -> None:
        """Stop the workers and release shared memory (also on GC and at exit): the segment's
        fd at once, the mapping when no ``copy=False`` view of it is left. A pending call is
        abandoned (with gymnasium's warning); ``timeout``/``terminate`` change nothing: workers
        get ``CLOSE`` and are killed if they do not end within a few seconds."""
        if self._state not in (_IDLE, _ASYNC):
            logger.warn(
                f"Calling `close` while waiting for a pending call to `{self._state}` to complete."
            )
            self._state = _IDLE
        self._finalizer()
        self._arrays = None  # type: ignore[assignment]  # its views keep the mapping alive

    def __enter__(self) -> ProcessPoolVectorEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        where = f"{self.num_workers} workers" if self.num_workers else "in-process"
        if self.caller_envs:
            where += f" + {self.caller_envs} envs in the caller"
        name = self.spec.id if self.spec is not None else "envs"
        return f"ProcessPoolVectorEnv({name}, num_envs={self.num_envs}, {where})"

    # --- rlstash extras ---------------------------------------------------------------
    @property
    def restarts(self) -> list[RestartEvent]:
        """Every worker failure so far, oldest first."""
        return list(self._backend.events)

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the current workers (empty in-process)."""
        return self._backend.pids()  # type: ignore[attr-defined]

    def worker_info(self) -> list[dict[str, Any]]:
        """Per worker: ``pid``, ``ppid``, ``modules`` (its ``sys.modules`` names), ``environ``
        (CUDA_VISIBLE_DEVICES and thread variables), ``num_envs``, ``start``."""
        self._check_open()
        self._expect_idle("worker_info", end=".")
        if not self.num_workers:
            return []
        return self._backend.worker_info()  # type: ignore[attr-defined]

    def shared_arrays(self) -> dict[str, np.ndarray]:
        """Views of the pool's shared-memory arrays by field name: ``obs/<leaf path>``,
        ``final_obs/...`` (same-step), ``act/...``, ``reward``, ``terminated``, ``truncated``,
        ``final``, ``info``. Each step/reset overwrites them (multi-agent envs build tensors
        over them: :mod:`rlstash.envs.pettingzoo`); no ``obs/`` fields when observations
        are pickled."""
        self._check_open()
        return dict(self._arrays.shared.arrays)

    def envs_of(self, worker: int) -> range:
        """The env indices held by ``worker`` (``num_workers``: the caller's share)."""
        slots = self._backend.slots
        if not slots:
            return range(self.num_envs)
        envs = slots[worker].envs
        return range(envs[0], envs[-1] + 1)

    # --- internals --------------------------------------------------------------------
    def _check_open(self) -> None:
        if self.closed:
            raise gym_error.ClosedEnvironmentError("ProcessPoolVectorEnv is closed")
        if self._backend.closed:
            self.closed = True
            raise gym_error.ClosedEnvironmentError(
                "ProcessPoolVectorEnv is closed (a worker failed)"
            )

    def _expect_idle(self, what: str, end: str = "") -> None:
        """AlreadyPendingCallError, in gymnasium's words, while a call is pending."""
        if self._state != _IDLE:
            raise gym_error.AlreadyPendingCallError(
                f"Calling `{what}` while waiting for a pending call to `{self._state}` to "
                f"complete{end}",
                self._state,
            )

    def _seeds(self, seed: Any) -> list[int | None]:
        n = self.num_envs
        if seed is None:
            if not self._reset_once and self._seed is not None:
                return [self._seed + i for i in range(n)]
            return [None] * n
        if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
            return [int(seed) + i for i in range(n)]
        if isinstance(seed, (list, tuple)) and len(seed) == n:
            return list(seed)
        raise ValueError(f"seed: expected None, an int or a list of {n} seeds, got {seed!r}")

    def _infos(self, parts: list, restarted: list[int], finals: bool) -> dict[str, Any]:
        """gymnasium-style infos (arrays + ``_key`` masks) from the backend's info parts;
        ``same_step``: ``final_obs`` and the ``final_info`` mask of ended envs; restarted
        envs in ``worker_restarted``."""
        infos = merge_infos(parts, self.num_envs)
        if finals:
            infos = self._arrays.add_final_obs(infos)
        if restarted:
            flag = np.zeros(self.num_envs, dtype=bool)
            flag[restarted] = True
            infos["worker_restarted"] = flag
            infos["_worker_restarted"] = flag.copy()
        return infos


_IDLE = "default"  # gymnasium's AsyncState.DEFAULT value
_ASYNC = "recv"  # asynchronous batches running: synchronous calls wait for a quiet pool
