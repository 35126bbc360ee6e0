"""ProcessPoolVectorEnv: many gymnasium envs stepped by a few torch-free worker processes.

    with ProcessPoolVectorEnv("CartPole-v1", num_envs=32, num_workers=2, seed=0) as pool:
        obs, infos = pool.reset()                       # obs: [32, 4] float32
        for _ in range(1000):
            actions = pool.action_space.sample()        # [32] int64
            obs, rewards, terminated, truncated, infos = pool.step(actions)

It is a :class:`gymnasium.vector.VectorEnv` (same ``reset``/``step``/``step_async``/
``step_wait``/``call``/``get_attr``/``set_attr``/``close``, batched and single spaces,
``metadata["autoreset_mode"]``), so code written for ``gymnasium.vector.AsyncVectorEnv`` can
switch. Differences that matter:

* W workers each step ``num_envs / W`` envs; observations, rewards, flags, final observations
  and actions live in one shared-memory segment; a step costs one 5-byte message per worker
  each way. Infos travel only when an env returns a non-empty info dict.
* Workers never import torch, run with ``CUDA_VISIBLE_DEVICES=""`` and one math-library
  thread (``worker_env`` overrides), ignore Ctrl-C and exit when the pool's process is gone.
* A worker that dies, raises in an env, or does not answer within ``step_timeout`` is
  restarted from its factories with fresh seeds. Its envs' episodes end as truncated with
  ``infos["worker_restarted"]`` (bool [N], mask ``infos["_worker_restarted"]``); the
  observation returned for them is the fresh reset observation, *not* a final observation.
  ``next_step``: that step says truncated, the following step is a reset step (reward 0).
  ``same_step``: no ``final_obs`` for them (``infos["_final_obs"]`` is False there).
  After ``max_restarts`` failures of one worker, :class:`WorkerFailedError` (pool closed).
* ``num_workers=0`` steps the envs in this process; ``"auto"`` times both and picks.
* Observations are returned as copies unless ``pool.copy = False`` (then they are views of
  shared memory, valid until the next ``step``/``reset``).
* The shared segment is an anonymous ``memfd`` (named ``rlstash_<pid>_pool`` in
  ``/proc/<pid>/fd``): nothing appears in ``/dev/shm`` and nothing can leak there, however
  the processes end; no ``multiprocessing`` resource tracker, semaphore or queue is used.
* Infos are batched per worker block (:mod:`rlstash.envs.infos`), exactly as gymnasium's
  ``_add_info`` would, except when one info key mixes value types across envs (e.g. bool in
  one env, int in another): then each block casts to its own first type before merging.
"""

from __future__ import annotations

import time
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import error as gym_error
from gymnasium.vector import VectorEnv
from gymnasium.vector.utils import batch_space

from rlstash.envs import config
from rlstash.envs.actions import check_leaf, leaf_spaces
from rlstash.envs.backend import Backend
from rlstash.envs.cpus import usable_cpus
from rlstash.envs.errors import AutoChoiceWarning, RestartEvent, user_stacklevel
from rlstash.envs.infos import merge_infos
from rlstash.envs.inprocess import InProcessBackend
from rlstash.envs.launch import child_environ
from rlstash.envs.process_backend import ProcessBackend
from rlstash.envs.shm import assemble, copy_tree, flatten_value, leaf_paths


class ProcessPoolVectorEnv(VectorEnv):
    """A vector env over worker processes (or in-process); see the module docstring."""

    def __init__(
        self,
        env_fns: str | Callable | Sequence[Callable],
        num_envs: int | None = None,
        num_workers: int | str | None = None,
        seed: int | None = None,
        start_method: str | None = None,
        step_timeout: float | None = None,
        max_restarts: int = 3,
        autoreset_mode: str | Any = "next_step",
        env_kwargs: Mapping[str, Any] | None = None,
        worker_env: Mapping[str, str] | None = None,
    ) -> None:
        """Start the envs.

        Args:
            env_fns: a registered env id (``gymnasium.make(env_fns, **env_kwargs)``), a
                zero-argument env factory (lambdas are fine: cloudpickle), or one factory per
                env.
            num_envs: number of envs N (default: ``len(env_fns)`` for a list).
            num_workers: worker processes W; None: the usable CPU cores (affinity, cgroup
                quota), at most N; 0: in this process; ``"auto"``: time both, pick the faster.
            seed: env i's first reset uses ``seed + i`` (unless reset gets a seed); restart
                seeds come from ``numpy.random.default_rng(seed)``.
            start_method: ``"forkserver"`` (default where available), ``"spawn"``, ``"fork"``.
            step_timeout: seconds a worker may take per step/reset/call before it is killed
                and restarted; None waits (a dead worker is still detected at once).
            max_restarts: failures tolerated per worker before :class:`WorkerFailedError`.
            autoreset_mode: ``"next_step"`` (default), ``"same_step"``, ``"disabled"`` or a
                ``gymnasium.vector.AutoresetMode``.
            env_kwargs: keyword arguments for every factory / ``gymnasium.make``.
            worker_env: extra environment variables for workers, e.g.
                ``{"OMP_NUM_THREADS": "4"}`` (defaults: CUDA hidden, one thread per library).
        """
        fns = config.factories(env_fns, num_envs, env_kwargs)
        n = len(fns)
        mode = config.autoreset_mode(autoreset_mode)
        workers = config.num_workers(num_workers, n)
        method = config.start_method(start_method)
        timeout = config.step_timeout(step_timeout)
        restarts = config.check_positive_int("max_restarts", max_restarts, minimum=0)
        self._seed = config.seed(seed)
        environ = child_environ(config.worker_env(worker_env))
        rng = np.random.default_rng(self._seed)

        def processes(w: int) -> ProcessBackend:
            return ProcessBackend(fns, w, mode, method, environ, timeout, restarts, rng)

        self.auto_timing: dict[str, float] = {}
        if workers == "auto":
            backend, described = self._choose(fns, mode, restarts, rng, processes)
        else:
            backend = (
                InProcessBackend(fns, mode, restarts, rng) if workers == 0 else processes(workers)
            )
            described = _start(backend)
        self._backend: Backend = backend
        self._finalizer = weakref.finalize(self, backend.close)
        self.num_envs = n
        self.num_workers: int = backend.num_workers
        self.start_method: str | None = method if backend.num_workers else None
        self.step_timeout = timeout
        self.max_restarts = restarts
        self.copy = True
        self._mode = mode
        self.autoreset_mode = config.MODE_ENUM[mode]
        self.metadata = {**described["metadata"], "autoreset_mode": self.autoreset_mode}
        self.render_mode = described["render_mode"]
        self.spec = described.get("spec")
        self.single_observation_space = described["observation_space"]
        self.single_action_space = described["action_space"]
        self.observation_space = batch_space(self.single_observation_space, n)
        self.action_space = batch_space(self.single_action_space, n)
        self._bind_arrays()
        self._reset_once = False
        self._waiting = False
        self._pending_call: tuple[str, tuple, dict] | None = None  # reset_async / call_async
        self._needs_reset = np.zeros(n, dtype=bool)  # disabled mode: ended, not reset yet

    # --- construction helpers ---------------------------------------------------------
    def _bind_arrays(self) -> None:
        shared = self._backend.shared
        self._shared = shared
        obs_leaves = shared.leaves("obs")
        self._obs_leaves = obs_leaves
        self._obs_flat = obs_leaves[0] if _is_flat(self.single_observation_space) else None
        self._final_leaves = shared.leaves("final_obs")
        act_leaves = shared.leaves("act")
        self._act_leaves = act_leaves
        self._act_flat = act_leaves[0] if _is_flat(self.single_action_space) else None
        self._act_names = leaf_paths(self.single_action_space, "actions")
        self._act_spaces = leaf_spaces(self.single_action_space)
        self._rewards = shared["reward"]
        self._terminated = shared["terminated"]
        self._truncated = shared["truncated"]
        self._final = shared["final"]

    def _choose(
        self,
        fns: list[Callable],
        mode: str,
        restarts: int,
        rng: np.random.Generator,
        processes: Callable[[int], ProcessBackend],
    ) -> tuple[Backend, dict]:
        """``num_workers="auto"``: time a few steps in-process and with worker processes."""
        inproc = InProcessBackend(fns, mode, restarts, rng)
        described = _start(inproc)
        w = min(usable_cpus(), len(fns))
        chosen: Backend = inproc
        if w < 2:
            self.auto_timing = {"in_process": _StepTimer(inproc, described, len(fns)).rate()}
        else:
            procs = processes(w)
            try:
                _start(procs)
                # interleaved short rounds, medians: a burst of other load hits both alike
                timers = [_StepTimer(b, described, len(fns)) for b in (inproc, procs)]
                rounds = [[t.rate(budget=0.04) for t in timers] for _ in range(_AUTO_ROUNDS)]
                rate_in, rate_procs = (float(np.median(r)) for r in zip(*rounds))
            except BaseException:
                procs.close()
                inproc.close()
                raise
            self.auto_timing = {"in_process": rate_in, f"processes_{w}": rate_procs}
            chosen = procs if rate_procs > rate_in else inproc
            (inproc if chosen is procs else procs).close()
        where = f"{w} worker processes" if chosen is not inproc else "in-process (num_workers=0)"
        timing = ", ".join(f"{k}: {v:,.0f} env steps/s" for k, v in self.auto_timing.items())
        warnings.warn(
            f'ProcessPoolVectorEnv(num_workers="auto") chose {where} ({timing}); pass num_workers '
            "explicitly to skip the timing",
            AutoChoiceWarning,
            stacklevel=user_stacklevel(),
        )
        return chosen, described

    # --- gymnasium VectorEnv API ------------------------------------------------------
    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """Reset all envs (or those in ``options["reset_mask"]``); returns (obs, infos).

        ``seed``: None (first reset: the pool's ``seed + i``), an int (``seed + i``) or one
        seed per env.
        """
        self._check_open()
        if self._waiting:
            raise gym_error.AlreadyPendingCallError(
                "reset() while step_async() waits: call step_wait() first", "step"
            )
        seeds = self._seeds(seed)
        options = dict(options) if options is not None else None
        mask = _pop_mask(options, self.num_envs)
        super().reset(seed=seed if isinstance(seed, int) else None)
        entries, restarted = self._backend.reset(seeds, options, mask)
        self._reset_once = True
        if mask is None:
            self._needs_reset[:] = False
        else:
            self._needs_reset[mask] = False
        infos = self._infos(entries, restarted, finals=False)
        return self._read_obs(), infos

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        """Step every env: ``(obs, rewards [N] f64, terminations [N], truncations [N], infos)``."""
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: Any) -> None:
        """Validate and write ``actions`` (batched, ``action_space``) and start the step."""
        self._check_open()
        if self._waiting:
            raise gym_error.AlreadyPendingCallError("step_async() called twice", "step")
        if not self._reset_once:
            raise gym_error.ResetNeeded("ProcessPoolVectorEnv: call reset() before step()")
        if self._mode == "disabled" and self._needs_reset.any():
            ended = np.flatnonzero(self._needs_reset).tolist()
            raise RuntimeError(
                f"envs {ended} ended and autoreset_mode='disabled': reset them first with "
                "reset(options={'reset_mask': mask})"
            )
        self._write_actions(actions)
        self._backend.step_async()
        self._waiting = True

    def step_wait(
        self, timeout: float | None = None
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        """Finish the step started by :meth:`step_async` (``timeout`` overrides
        ``step_timeout`` for this wait)."""
        self._check_open()
        if not self._waiting:
            raise gym_error.NoAsyncCallError("step_wait() without step_async()", "step")
        self._waiting = False
        entries, restarted = self._backend.step_wait(timeout)
        infos = (
            self._infos(entries, restarted, finals=self._mode == "same_step")
            if entries or restarted or self._mode == "same_step"
            else {}
        )
        term, trunc = self._terminated, self._truncated
        if self._mode == "disabled":
            self._needs_reset |= term | trunc
        if self.copy:
            return self._read_obs(), self._rewards.copy(), term.copy(), trunc.copy(), infos
        return self._read_obs(), self._rewards, term, trunc, infos

    def reset_async(
        self, seed: int | Sequence[int | None] | None = None, options: dict | None = None
    ) -> None:
        """Like ``AsyncVectorEnv.reset_async``: the reset runs in :meth:`reset_wait`."""
        self._check_idle()
        self._pending_call = ("reset", (), {"seed": seed, "options": options})

    def reset_wait(self, timeout: float | None = None) -> tuple[Any, dict[str, Any]]:
        """Finish :meth:`reset_async` (``timeout`` is ``step_timeout``'s job here)."""
        _, _, kwargs = self._take_pending("reset")
        return self.reset(**kwargs)

    def call_async(self, name: str, *args: Any, **kwargs: Any) -> None:
        """Like ``AsyncVectorEnv.call_async``: the call runs in :meth:`call_wait`."""
        self._check_idle()
        self._pending_call = (name, args, kwargs)

    def call_wait(self, timeout: float | None = None) -> tuple[Any, ...]:
        """Finish :meth:`call_async`."""
        name, args, kwargs = self._take_pending(None)
        return self.call(name, *args, **kwargs)

    def _take_pending(self, want: str | None) -> tuple[str, tuple, dict]:
        pending, self._pending_call = self._pending_call, None
        if pending is None or (want == "reset") != (pending[0] == "reset"):
            self._pending_call = pending
            what = "reset_async()" if want == "reset" else "call_async()"
            raise gym_error.NoAsyncCallError(f"no pending {what}", want or "call")
        return pending

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """``env.get_wrapper_attr(name)(*args, **kwargs)`` (or the attribute) per env."""
        self._check_idle()
        if name in ("reset", "step", "close"):
            raise ValueError(f"name: call({name!r}) is not allowed, use pool.{name}() instead")
        return tuple(self._backend.call(name, args, kwargs))

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """The attribute ``name`` of every env."""
        return self.call(name)

    def set_attr(self, name: str, values: Any) -> None:
        """Set ``name`` on every env: one value per env (list/tuple of N) or one for all."""
        self._check_idle()
        if not isinstance(values, (list, tuple)):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ValueError(
                f"values: expected a list or tuple of {self.num_envs} values (one per env), "
                f"got {len(values)}"
            )
        self._backend.set_attr(name, list(values))

    def render(self) -> tuple[Any, ...] | None:
        """Every env's ``render()``."""
        return self.call("render")

    def close_extras(self, **kwargs: Any) -> None:
        """Stop the workers and release shared memory (also on GC and at exit): the segment's
        fd at once, the mapping when no ``copy=False`` view of it is left."""
        self._finalizer()
        self._shared = self._obs_flat = self._act_flat = None  # type: ignore[assignment]
        self._obs_leaves, self._final_leaves, self._act_leaves = [], [], []
        self._rewards = self._terminated = self._truncated = self._final = None  # type: ignore[assignment]

    def __enter__(self) -> ProcessPoolVectorEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        where = f"{self.num_workers} workers" if self.num_workers else "in-process"
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
        self._check_idle()
        if not self.num_workers:
            return []
        return self._backend.worker_info()  # type: ignore[attr-defined]

    def envs_of(self, worker: int) -> range:
        """The env indices held by ``worker``."""
        slots = getattr(self._backend, "slots", None)
        if not slots:
            return range(self.num_envs)
        envs = slots[worker].envs
        return range(envs[0], envs[-1] + 1)

    # --- internals --------------------------------------------------------------------
    def _check_open(self) -> None:
        if self.closed:
            raise gym_error.ClosedEnvironmentError("ProcessPoolVectorEnv is closed")
        if getattr(self._backend, "closed", False):
            self.closed = True
            raise gym_error.ClosedEnvironmentError(
                "ProcessPoolVectorEnv is closed (a worker failed)"
            )

    def _check_idle(self) -> None:
        self._check_open()
        if self._waiting:
            raise gym_error.AlreadyPendingCallError("a step is pending: call step_wait()", "step")

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

    def _write_actions(self, actions: Any) -> None:
        """Check every leaf (shape, dtype kind) first, then copy; nothing is written on error."""
        if self._act_flat is not None:
            arrays = [np.asarray(actions)]
        else:
            arrays = [np.asarray(a) for a in flatten_value(self.action_space, actions, "actions")]
        for arr, view, name in zip(arrays, self._act_leaves, self._act_names):
            if arr.shape != view.shape:
                raise ValueError(
                    f"{name}: expected shape {view.shape} ({view.dtype}, one row per env), "
                    f"got {arr.shape}"
                )
            if arr.dtype != view.dtype and not _castable(arr.dtype, view.dtype):
                raise TypeError(f"{name}: expected dtype {view.dtype}, got {arr.dtype}")
        for arr, space, name in zip(arrays, self._act_spaces, self._act_names):
            check_leaf(space, arr, name)
        for arr, view in zip(arrays, self._act_leaves):
            np.copyto(view, arr, casting="unsafe")

    def _read_obs(self) -> Any:
        if self._obs_flat is not None:
            return self._obs_flat.copy() if self.copy else self._obs_flat
        value = assemble(self.single_observation_space, self._obs_leaves)
        return copy_tree(value) if self.copy else value

    def _infos(self, parts: list, restarted: list[int], finals: bool) -> dict[str, Any]:
        """gymnasium-style infos (arrays + ``_key`` masks) from the backend's info parts;
        ``same_step``: ``final_obs`` (object array) and the ``final_info`` mask of ended envs."""
        infos = merge_infos(parts, self.num_envs)
        if finals:
            ended = np.flatnonzero(self._final)
            if ended.size:
                final_obs = np.full(self.num_envs, None, dtype=object)
                for i in ended.tolist():
                    final_obs[i] = copy_tree(
                        assemble(self.single_observation_space, self._final_leaves, i)
                    )
                mask = np.zeros(self.num_envs, dtype=bool)
                mask[ended] = True
                infos = {"final_obs": final_obs, "_final_obs": mask, **infos}
                infos.setdefault("final_info", {})
                infos["_final_info"] = infos.get("_final_info", np.zeros_like(mask)) | mask
        if restarted:
            flag = np.zeros(self.num_envs, dtype=bool)
            flag[restarted] = True
            infos["worker_restarted"] = flag
            infos["_worker_restarted"] = flag.copy()
        return infos


def _start(backend: Backend) -> dict:
    try:
        return backend.start()
    except BaseException:
        backend.close()
        raise


def _is_flat(space: Any) -> bool:
    from gymnasium import spaces

    return not isinstance(space, (spaces.Dict, spaces.Tuple))


def _castable(src: np.dtype, dst: np.dtype) -> bool:
    """Numbers may be cast, except floats into integer/bool fields (that would truncate)."""
    if src.kind not in "biuf":
        return False
    return not (src.kind == "f" and dst.kind in "biu")


def _pop_mask(options: dict | None, n: int) -> np.ndarray | None:
    if options is None or "reset_mask" not in options:
        return None
    mask = options.pop("reset_mask")
    if not isinstance(mask, np.ndarray) or mask.dtype != np.bool_ or mask.shape != (n,):
        got = f"{type(mask).__name__} {getattr(mask, 'dtype', '')} {getattr(mask, 'shape', '')}"
        raise ValueError(
            f"options['reset_mask']: expected a bool numpy array of shape ({n},), got {got}"
        )
    if not mask.any():
        raise ValueError("options['reset_mask']: expected at least one True value, got none")
    return mask


_AUTO_ROUNDS = 5  # num_workers="auto": interleaved timing rounds per candidate


class _StepTimer:
    """Times env steps of a started ``backend`` with random actions (reset and one warm-up
    step on construction); ``rate()`` may be called repeatedly, interleaved with others."""

    def __init__(self, backend: Backend, described: dict, n: int):
        self.backend, self.n = backend, n
        space = batch_space(described["action_space"], n)
        space.seed(0)
        actions = flatten_value(space, space.sample(), "actions")
        for view, a in zip(backend.shared.leaves("act"), actions):
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
