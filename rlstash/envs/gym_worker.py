"""``ProcessPoolVectorEnv(..., worker=fn)``: envs run under gymnasium's own protocol.

AsyncVectorEnv's ``worker`` argument replaces its internal ``_async_worker`` function: a
custom worker receives gymnasium's pipe, shared-memory buffer, error queue, autoreset mode
and concurrency semaphore, and speaks gymnasium's commands (``reset``, ``step``, ``_call``,
...). rlstash's workers speak another protocol, so code that brings its own worker gets
gymnasium's machinery: this backend runs a ``gymnasium.vector.AsyncVectorEnv`` built with
the same arguments (one process per env) and copies its results into the pool's arrays, so
that everything above the backend (action checks, observation copies, infos, the
``*_async``/``*_wait`` state machine) is the pool's own.

What changes with ``worker=`` (documented on the pool): no restarts (an env's exception is
raised as AsyncVectorEnv raises it), the processes are gymnasium's (``multiprocessing``:
the torch-free start of rlstash's workers does not apply), ``num_workers`` is the number of
envs.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from rlstash.envs import config
from rlstash.envs.backend import Backend
from rlstash.envs.shm import Layout, SharedArrays, assemble, copy_tree, flatten_value


def check_worker(worker: Any, num_workers: Any) -> None:
    """AsyncVectorEnv's check of a custom worker (8 arguments), with its message."""
    from gymnasium.vector.async_vector_env import _async_worker

    if not callable(worker):
        raise TypeError(
            f"worker: expected a function like gymnasium's _async_worker, got {worker!r}"
        )
    try:
        inspect.signature(worker).bind(*(None,) * 8)
    except TypeError as exc:
        raise ValueError(
            f"A custom `worker` must accept 8 arguments. Got the signature "
            f"{inspect.signature(worker)} which should match {inspect.signature(_async_worker)}."
        ) from exc
    if num_workers is not None:
        raise ValueError(
            f"num_workers: expected None with worker= (a custom gymnasium worker runs one env "
            f"per process), got {num_workers!r}"
        )


class GymWorkerBackend(Backend):
    """A gymnasium AsyncVectorEnv with a custom ``worker`` behind the pool's arrays."""

    def __init__(
        self, factories: list[Callable], worker: Callable, mode: str, options: dict[str, Any]
    ) -> None:
        super().__init__(0, np.random.default_rng(0))
        self.factories, self.worker, self.mode = factories, worker, mode
        self.options = options  # context, shared_memory, daemon, observation_mode, max_concurrency
        self.num_workers = len(factories)
        self.closed = False
        self.vec: Any = None
        self.actions: list[Any] = []  # layout.act_pickled: set by the pool before step_async
        self.obs_objects: list[Any] = [None] * len(factories)
        self.final_objects: list[Any] = [None] * len(factories)

    def start(self, resolve: Callable[[list, list], tuple]) -> dict[str, Any]:
        """Start gymnasium's AsyncVectorEnv; lay out the arrays from its spaces."""
        # from its own module: code that swaps gymnasium.vector.AsyncVectorEnv for the pool
        # (as gymnasium's tests can be pointed at it) must still get gymnasium's class here
        from gymnasium.vector.async_vector_env import AsyncVectorEnv

        opts = dict(self.options)
        self.vec = AsyncVectorEnv(
            self.factories, worker=self.worker, autoreset_mode=config.MODE_ENUM[self.mode], **opts
        )
        obs_spaces = list(self.vec.get_attr("observation_space"))
        act_spaces = list(self.vec.get_attr("action_space"))
        obs, act, pickled = resolve(obs_spaces, act_spaces)
        n = len(self.factories)
        layout = Layout.build(obs, act, n, self.mode == "same_step", pickled)
        self.shared = SharedArrays(layout, None)
        self.single = (obs, act)
        return {
            "observation_space": obs,
            "action_space": act,
            "observation_spaces": obs_spaces,
            "action_spaces": act_spaces,
            "metadata": dict(self.vec.metadata),
            "render_mode": self.vec.render_mode,
            "spec": self.vec.get_attr("spec")[0],
        }

    def reset_async(
        self, seeds: list[int | None], options: dict | None, mask: np.ndarray | None
    ) -> None:
        opts = dict(options or {})
        if mask is not None:
            opts["reset_mask"] = mask
        self.vec.reset_async(seed=list(seeds), options=opts or None)
        self._mask = mask

    def reset_wait(self, timeout: float | None) -> tuple[list[tuple[int, dict]], list[int]]:
        obs, infos = self.vec.reset_wait(timeout=timeout)
        self._write_obs(obs)
        rows = slice(None) if self._mask is None else self._mask
        for name, value in (("reward", 0.0), ("terminated", False), ("truncated", False)):
            self.shared[name][rows] = value
        return ([(0, infos)] if infos else []), []

    def step_async(self) -> None:
        if self.shared.layout.act_pickled:
            actions: Any = tuple(self.actions)
        else:
            actions = copy_tree(assemble(self.single[1], self.shared.leaves("act")))
        self.vec.step_async(actions)

    def step_wait(self, timeout: float | None) -> tuple[list[tuple[int, dict]], list[int]]:
        obs, rewards, terminated, truncated, infos = self.vec.step_wait(timeout=timeout)
        self._write_obs(obs)
        self.shared["reward"][:] = rewards
        self.shared["terminated"][:] = terminated
        self.shared["truncated"][:] = truncated
        return ([(0, infos)] if infos else []), []

    def _write_obs(self, obs: Any) -> None:
        """Observations into the arrays (or, pickled layout, one object per env)."""
        if self.shared.layout.obs_pickled:
            from gymnasium.vector.utils import iterate

            self.obs_objects[:] = list(iterate(self.vec.observation_space, obs))
            return
        leaves = flatten_value(self.vec.observation_space, obs, "observation")
        for view, value in zip(self.shared.leaves("obs"), leaves):
            np.copyto(view, value, casting="unsafe")

    def call(self, name: str, args: tuple, kwargs: dict) -> list[Any]:
        return list(self.vec.call(name, *args, **kwargs))

    def call_async(self, name: str, args: tuple, kwargs: dict) -> None:
        self.vec.call_async(name, *args, **kwargs)

    def call_wait(self, timeout: float | None) -> list[Any]:
        return list(self.vec.call_wait(timeout=timeout))

    def set_attr(self, name: str, values: list[Any]) -> None:
        self.vec.set_attr(name, values)

    def pids(self) -> list[int]:
        return [p.pid for p in self.vec.processes] if self.vec is not None else []

    def worker_info(self) -> list[dict[str, Any]]:
        """Per process: ``pid``, ``ppid`` and its env (gymnasium's workers answer nothing
        else; ``modules``/``environ`` are None)."""
        return [
            {
                "pid": pid,
                "ppid": os.getpid(),
                "modules": None,
                "environ": None,
                "num_envs": 1,
                "start": i,
            }  # fmt: skip
            for i, pid in enumerate(self.pids())
        ]

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.vec is not None:
            self.vec.close()
