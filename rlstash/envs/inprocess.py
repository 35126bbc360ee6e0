"""The in-process backend (``num_workers=0``): the envs step in the calling process.

Same arrays, same :class:`~rlstash.envs.runner.EnvRunner` as a worker, no processes and no
messages, so the cost over a plain loop is the writes into the batch arrays. An env that
raises is handled like a failed worker (all envs rebuilt from their factories with fresh
seeds, episodes ended as truncated, counted against ``max_restarts``). A segfault or a hang
cannot be contained in-process: use worker processes for envs that may do that.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

from rlstash.envs.backend import NO_REPORT, REPORT_NEXT, REPORT_NOW, Backend
from rlstash.envs.errors import WorkerFailedError
from rlstash.envs.infos import batch_infos
from rlstash.envs.runner import EnvRunner
from rlstash.envs.shm import Layout, SharedArrays
from rlstash.envs.worker import describe_env


class InProcessBackend(Backend):
    """All envs in this process; "worker 0" in restart events."""

    num_workers = 0

    def __init__(
        self,
        factories: list[Callable],
        mode: str,
        max_restarts: int,
        seed_rng: np.random.Generator,
    ) -> None:
        super().__init__(max_restarts, seed_rng)
        self.factories = list(factories)
        self.mode = mode
        self.envs_idx = tuple(range(len(factories)))
        self.runner: EnvRunner | None = None
        self.shared: SharedArrays | None = None
        self.closed = False

    def _build(self) -> tuple[list, list, list]:
        envs = []
        try:
            for f in self.factories:
                envs.append(f())
        except BaseException:
            for env in envs:
                _close_quietly(env)
            raise
        return envs, [e.observation_space for e in envs], [e.action_space for e in envs]

    def start(self, resolve: Callable[[list, list], tuple]) -> dict[str, Any]:
        """Build the envs and the arrays; returns every env's spaces, metadata, render_mode,
        spec (``resolve``: as for :meth:`ProcessBackend.start`)."""
        try:
            envs, obs_spaces, act_spaces = self._build()
        except (ValueError, TypeError, ImportError):
            raise  # bad input the env refused (a setting, a missing package): as it was raised
        except Exception as exc:
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            raise WorkerFailedError(0, self.envs_idx, 1, 0, text, [], starting=True) from exc
        try:
            obs_space, act_space, pickled = resolve(obs_spaces, act_spaces)
        except BaseException:
            for env in envs:
                _close_quietly(env)
            raise
        layout = Layout.build(obs_space, act_space, len(envs), self.mode == "same_step", pickled)
        self.shared = SharedArrays(layout, None)
        self.spaces = (obs_space, act_space)
        self.env_spaces = (obs_spaces, act_spaces)
        self.runner = EnvRunner(envs, 0, self.shared, obs_space, act_space, self.mode)
        self.actions: list[Any] = []  # layout.act_pickled: set by the pool before step_async
        return {
            "observation_space": obs_space,
            "action_space": act_space,
            "observation_spaces": obs_spaces,
            "action_spaces": act_spaces,
            **describe_env(envs[0]),
        }

    def _restart(self, exc: BaseException, command: str, codes: list[int]) -> list[int]:
        """Rebuild every env until it works or the budget is spent (then raise)."""
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        while True:
            assert self.runner is not None
            for env in self.runner.envs:
                _close_quietly(env)
            self.runner.envs = []
            self.record_failure(0, self.envs_idx, "exception", text, None, command, 0, exc)
            try:
                envs, obs_spaces, act_spaces = self._build()
                if (obs_spaces, act_spaces) != self.env_spaces:
                    raise ValueError(f"rebuilt envs have spaces {obs_spaces}, {act_spaces}")
                self.runner = EnvRunner(envs, 0, self.shared, *self.spaces, self.mode)
                self.runner.reset(self.fresh_seeds(len(envs)), None, None)
                self.runner.mark_restarted(codes)
                break
            except Exception as again:
                text = "".join(traceback.format_exception(type(again), again, again.__traceback__))
                command, exc = "restart", again
        self.deferred.extend(i for i, c in zip(self.envs_idx, codes) if c == REPORT_NEXT)
        return [i for i, c in zip(self.envs_idx, codes) if c != REPORT_NEXT]

    def reset_async(
        self, seeds: list[int | None], options: dict | None, mask: np.ndarray | None
    ) -> None:
        """Keep the arguments: the reset runs in :meth:`reset_wait`."""
        self._resetting = (seeds, options, mask)

    def reset_wait(self, timeout: float | None) -> tuple[list[tuple[int, dict]], list[int]]:
        """Reset (the masked) envs; an env that raises triggers a restart (``timeout``
        cannot apply in-process and is ignored)."""
        assert self.runner is not None
        seeds, options, mask = self._resetting
        sub_mask = None if mask is None else mask.tolist()
        try:
            return _parts(self.runner.reset(seeds, options, sub_mask), len(seeds)), []
        except Exception as exc:
            in_reset = sub_mask if sub_mask is not None else [True] * len(seeds)
            codes = [NO_REPORT if m else REPORT_NEXT for m in in_reset]
            return [], self._restart(exc, "reset", codes)

    def step_async(self) -> None:
        """Nothing to send: the step runs in :meth:`step_wait`."""

    def step_wait(self, timeout: float | None) -> tuple[list[tuple[int, dict]], list[int]]:
        """Step every env (``timeout`` cannot apply in-process and is ignored)."""
        assert self.runner is not None
        deferred = self.take_deferred()
        actions = self.actions if self.shared.layout.act_pickled else None
        try:
            return _parts(self.runner.step(actions), len(self.envs_idx)), deferred
        except Exception as exc:
            return [], deferred + self._restart(exc, "step", [REPORT_NOW] * len(self.envs_idx))

    def call(self, name: str, args: tuple, kwargs: dict) -> list[Any]:
        """``env.<name>(*args, **kwargs)`` (or the attribute) for every env."""
        assert self.runner is not None
        return self.runner.call(name, args, kwargs)

    def set_attr(self, name: str, values: list[Any]) -> None:
        """Set ``name`` on every env to ``values[i]``."""
        assert self.runner is not None
        self.runner.set_attr(name, values)

    @property
    def obs_objects(self) -> list[Any]:
        """Pickled-layout observations (the runner's own list: nothing travels)."""
        assert self.runner is not None
        return self.runner.obs_objects

    @property
    def final_objects(self) -> list[Any]:
        assert self.runner is not None
        return self.runner.final_objects

    def pids(self) -> list[int]:
        return []

    def close(self) -> None:
        """Close the envs (errors are swallowed: closing must finish) and the arrays."""
        if self.closed:
            return
        self.closed = True
        if self.runner is not None:
            for env in self.runner.envs:
                _close_quietly(env)
            self.runner.envs = []
        if self.shared is not None:
            self.shared.close()


def _parts(entries: list[tuple[int, dict]], n: int) -> list[tuple[int, dict]]:
    return [(0, batch_infos(entries, n))] if entries else []


def _close_quietly(env: Any) -> None:
    try:
        env.close()
    except Exception:  # noqa: BLE001 - best effort while closing or restarting
        pass
