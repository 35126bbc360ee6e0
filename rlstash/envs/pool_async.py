"""Asynchronous batches of :class:`~rlstash.envs.process_pool.ProcessPoolVectorEnv`
(``batch_size < num_envs``), with EnvPool's semantics (torch-free):

    pool = ProcessPoolVectorEnv("CartPole-v1", num_envs=32, batch_size=16, seed=0)
    pool.async_reset()                                  # every env resets
    obs, rew, term, trunc, infos = pool.recv()          # the first 16 envs ready
    pool.send(actions, infos["env_id"])                 # their next actions

* ``recv()`` returns exactly ``batch_size`` envs: those whose worker answered first, in the
  order the workers answered (a worker's envs in env order); ``infos["env_id"]`` ([B] int64)
  names them. Envs left over from a worker's answer wait for the next ``recv``.
* ``send(actions, env_ids)`` takes an action for envs ``recv`` returned (each once). A worker
  steps its block of envs together, once every env of the block has its action: the blocks
  are equal and ``batch_size`` is a multiple of them (:func:`check_layout`), so a ``recv``
  returns whole blocks and a block never waits for an env a later ``recv`` would return.
* Autoreset is next-step, per env, as in the synchronous pool and EnvPool. A worker that dies,
  raises or misses ``step_timeout`` is restarted as in the synchronous pool: its envs come back
  in that ``recv`` with the fresh reset observation, ``truncated`` and
  ``infos["worker_restarted"]``; their next step is a reset step (reward 0).
* ``step_timeout`` bounds each worker's step from the moment it was sent; ``recv(timeout)``
  bounds the caller's wait (:class:`~rlstash.envs.errors.WaitTimeoutError`, workers keep running).
* Every env steps in a worker process (no caller's share, no in-process backend), with
  observations and actions in shared memory.
"""

from __future__ import annotations

import math
import os
import select
import time
from typing import Any

import numpy as np

from rlstash.envs import protocol as P
from rlstash.envs.backend import NO_REPORT, REPORT_NOW
from rlstash.envs.errors import WaitTimeoutError
from rlstash.envs.infos import merge_infos
from rlstash.envs.process_backend import ProcessBackend, _Failure, _Slot
from rlstash.envs.shm import assemble
from rlstash.envs.worker import dumps


def check_batch_size(batch_size: Any, num_envs: int) -> int | None:
    """``batch_size``: None, or an int in 1..num_envs (ValueError/TypeError with the fix)."""
    if batch_size is None:
        return None
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
        raise TypeError(f"batch_size: expected an int or None, got {batch_size!r}")
    if not 1 <= int(batch_size) <= num_envs:
        raise ValueError(
            f"batch_size: expected 1..num_envs ({num_envs}), got {batch_size}; "
            "pass a batch size of at most num_envs, or None for synchronous steps"
        )
    return int(batch_size)


def default_workers(num_envs: int, batch_size: int, cores: int) -> int:
    """Workers for asynchronous batches when no layout is given: the fewest W >= the cores
    and >= ``ceil(N / B)`` (a batch about one worker's envs) that split the N envs into equal
    blocks of which B is a whole number (W = N, blocks of one env, always does)."""
    low = max(min(cores, num_envs), math.ceil(num_envs / batch_size))
    return next(
        w
        for w in range(low, num_envs + 1)
        if num_envs % w == 0 and batch_size % (num_envs // w) == 0
    )


def fits_blocks(num_envs: int, workers: int, batch: int) -> bool:
    """Whether ``workers`` split ``num_envs`` into equal blocks that ``batch`` is a multiple of."""
    return num_envs % workers == 0 and batch % (num_envs // workers) == 0


def check_layout(
    workers: int | str, caller: int, mode: str, has_worker_fn: bool, num_envs: int, batch: int
) -> None:
    """Refuse what asynchronous batches cannot run: each env steps in a worker process and
    resets at its next step; a worker steps its block of envs together, so the blocks are
    equal and a batch is whole blocks (else an env could wait for a sibling that a later
    ``recv`` would have to return)."""
    if has_worker_fn:
        raise ValueError(
            "batch_size: asynchronous batches need rlstash's workers, got a custom worker=; "
            "drop worker= or batch_size"
        )
    if workers == "auto" or workers == 0:
        raise ValueError(
            f"num_workers: asynchronous batches (batch_size) step every env in a worker "
            f"process, got num_workers={workers!r}; pass num_workers >= 1 or leave it None"
        )
    if caller:
        raise ValueError(
            f"caller_envs: asynchronous batches step every env in a worker process, got "
            f"caller_envs={caller}; pass caller_envs=0 or leave it None"
        )
    if not fits_blocks(num_envs, int(workers), batch):
        fits = default_workers(num_envs, batch, int(workers))
        raise ValueError(
            f"batch_size: expected whole worker blocks: {num_envs} envs over {workers} workers "
            f"do not split into equal blocks that {batch} is a multiple of; pass "
            f"num_workers={fits} (blocks of {num_envs // fits}), or leave num_workers None"
        )
    if mode != "next_step":
        raise ValueError(
            f"autoreset_mode: asynchronous batches reset an ended env at its next step, got "
            f"{mode!r}; use autoreset_mode='NextStep'"
        )


class AsyncBatches:
    """The ready-first send/recv of the module docstring over a started multi-process backend
    and the pool's shared arrays (:class:`~rlstash.envs.pool_arrays.PoolArrays`)."""

    def __init__(self, backend: ProcessBackend, arrays: Any, batch_size: int) -> None:
        if arrays.obs_pickled or arrays.act_flat is None:
            raise ValueError(
                "batch_size: asynchronous batches need observations in shared memory and a "
                "flat action space (Box, Discrete, MultiDiscrete, MultiBinary); got "
                f"observation_space {arrays.obs_space}, action_space {arrays.act_space}; "
                "use batch_size=None"
            )
        self.backend, self.arrays, self.batch_size = backend, arrays, batch_size
        n = self.num_envs = arrays.num_envs
        self.slots: list[_Slot] = list(backend.slots)
        self.slot_of = np.zeros(n, dtype=np.int64)
        for slot in self.slots:
            self.slot_of[list(slot.envs)] = slot.index
        self.waiting = np.zeros(n, dtype=bool)  # returned by recv, no action sent yet
        self.acted = np.zeros(n, dtype=bool)  # action written, its worker not stepped yet
        self.restarted = np.zeros(n, dtype=bool)  # restarted: reported at its next recv
        self.flight: dict[int, float | None] = {}  # slot index -> its step deadline
        self.ready: list[np.ndarray] = []  # env ids answered, not yet returned (FIFO)
        self.infos: dict[int, Any] = {}  # slot index -> its last non-empty infos part
        self._command = "step"

    @property
    def active(self) -> bool:
        """Something is in flight or waits to be returned."""
        return bool(self.flight or self.ready)

    # --- send -------------------------------------------------------------------------
    def reset(self, seeds: list[int | None]) -> None:
        """Every worker resets its envs (replies to earlier steps are discarded)."""
        self.ready, self.infos = [], {}
        self.waiting[:] = self.acted[:] = self.restarted[:] = False
        deadline = self.backend.timeouts.deadline("step")
        for slot in self.slots:
            rows = slice(slot.envs[0], slot.envs[-1] + 1)
            self.backend._send(slot, P.RESET, dumps((seeds[rows], None, None, None)))
            self.flight[slot.index] = deadline
        self._command = "reset"

    def send(self, actions: Any, env_ids: Any) -> None:
        """Actions ``[k, ...]`` for the envs ``env_ids`` ([k] ints that recv returned); a
        worker steps once every env it holds has its action. Nothing is written on error."""
        ids = self._check_ids(env_ids)
        view = self.arrays.act_flat
        arr = np.asarray(actions)
        want = (len(ids), *view.shape[1:])
        if arr.shape != want:
            raise ValueError(
                f"actions: expected shape {want} ({view.dtype}, one row per id in env_ids), "
                f"got {arr.shape}"
            )
        from rlstash.envs import batching
        from rlstash.envs.actions import check_leaf

        if arr.dtype != view.dtype and not batching.castable(arr.dtype, view.dtype):
            raise TypeError(f"actions: expected dtype {view.dtype}, got {arr.dtype}")
        check_leaf(self.arrays.act_spaces[0], arr, "actions")
        view[ids] = arr
        self.waiting[ids] = False
        self.acted[ids] = True
        deadline = self.backend.timeouts.deadline("step")
        for index in np.unique(self.slot_of[ids]).tolist():
            slot = self.slots[index]
            mine = slice(slot.envs[0], slot.envs[-1] + 1)
            if not self.acted[mine].all():
                continue
            self.acted[mine] = False
            self._step(slot)
            self.flight[index] = deadline
        self._command = "step"

    def _check_ids(self, env_ids: Any) -> np.ndarray:
        ids = np.asarray(env_ids)
        if ids.ndim != 1 or ids.size == 0 or ids.dtype.kind not in "iu":
            raise ValueError(
                f"env_ids: expected a non-empty 1-D array of env indices (ints), got "
                f"{ids.dtype} of shape {ids.shape}; pass infos['env_id'] from recv()"
            )
        ids = ids.astype(np.int64)
        if ids.min() < 0 or ids.max() >= self.num_envs:
            raise ValueError(
                f"env_ids: expected indices in 0..{self.num_envs - 1}, got "
                f"{ids[(ids < 0) | (ids >= self.num_envs)].tolist()}"
            )
        if np.unique(ids).size != ids.size:
            raise ValueError(f"env_ids: each env once per send, got repeats in {ids.tolist()}")
        stale = ids[~self.waiting[ids]]
        if stale.size:
            raise ValueError(
                f"env_ids: envs {stale.tolist()} are not waiting for an action (an env takes "
                "one action per result recv() returned); send the ids recv() returned, once"
            )
        return ids

    def _step(self, slot: _Slot) -> None:
        """One 5-byte STEP message (the actions are in shared memory)."""
        try:
            os.write(slot.proc.cmd_fd, P.STEP_MESSAGE)  # type: ignore[union-attr]
            slot.pending += 1
        except OSError:
            slot.send_failed = True  # handled as a death when its reply is read

    # --- recv -------------------------------------------------------------------------
    def recv(self, timeout: float | None) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        """The next ``batch_size`` envs that are ready (module docstring)."""
        caller_deadline = None if timeout is None else time.monotonic() + timeout
        while sum(len(r) for r in self.ready) < self.batch_size:
            if not self.flight:
                have = sum(len(r) for r in self.ready)
                raise RuntimeError(
                    f"recv: only {have} env(s) can answer and batch_size={self.batch_size}: "
                    f"{int(self.waiting.sum())} env(s) returned by recv() still wait for "
                    "their actions; send(actions, infos['env_id']) for them first"
                )
            self._wait_any(caller_deadline, timeout)
        ids = self._take(self.batch_size)
        return self._result(ids)

    def _wait_any(self, caller_deadline: float | None, timeout: float | None) -> None:
        """Read every reply that is there (waiting for the first, at most until the earliest
        deadline); restart failed workers and those past their step deadline."""
        slots = [self.slots[i] for i in self.flight]
        ends = [d for d in (*self.flight.values(), caller_deadline) if d is not None]
        deadline = min(ends, default=None)
        late = [s for s in slots if s.send_failed]  # their worker is gone
        if not late:
            poller, by_fd = select.poll(), {}
            for slot in slots:
                fd = slot.proc.reply_fd  # type: ignore[union-attr]
                poller.register(fd, select.POLLIN)
                by_fd[fd] = slot
            left = (
                None if deadline is None else max(0, int((deadline - time.monotonic()) * 1e3) + 1)
            )
            late = [by_fd[fd] for fd, _ in poller.poll(left)]
        for slot in late:
            try:
                payload = self.backend._recv(slot, self.flight[slot.index])
            except _Failure as f:
                self._failed(slot, f)
                continue
            self._answered(slot, self.backend._absorb(slot, payload))
        now = time.monotonic()  # checked every time: fast workers must not hide a hung one
        expired = [
            self.slots[i] for i, d in list(self.flight.items()) if d is not None and d <= now
        ]
        for slot in expired:
            limit = self.backend.timeouts.describe("step")
            self._failed(slot, _Failure("timeout", f"no answer within {limit}"))
        if not late and not expired and caller_deadline is not None and now >= caller_deadline:
            envs = [e for s in slots for e in s.envs]
            raise WaitTimeoutError(
                f"The call to `recv` has timed out after {timeout} second(s) (envs {envs} "
                "did not answer; their workers keep running)."
            )

    def _answered(self, slot: _Slot, part: Any) -> None:
        del self.flight[slot.index]
        if part:
            self.infos[slot.index] = self.backend._column_infos([(slot.start, part)], False)[0][1]
        else:
            self.infos.pop(slot.index, None)
        self.ready.append(np.arange(slot.envs[0], slot.envs[-1] + 1))

    def _failed(self, slot: _Slot, failure: _Failure) -> None:
        """Restart the worker (as the synchronous pool does); its envs answer truncated with
        their reset observation (a failed reset: plain reset observations)."""
        code = NO_REPORT if self._command == "reset" else REPORT_NOW
        envs = self.backend._restart(slot, failure, self._command, [code] * len(slot.envs))
        if code == REPORT_NOW:
            self.restarted[envs] = True
        self._answered(slot, None)

    def _take(self, b: int) -> np.ndarray:
        """The first ``b`` ready envs, oldest answer first."""
        taken, got = [], 0
        while got < b:
            head = self.ready[0]
            need = b - got
            if len(head) <= need:
                taken.append(self.ready.pop(0))
                got += len(head)
            else:
                taken.append(head[:need])
                self.ready[0] = head[need:]
                got = b
        ids = taken[0] if len(taken) == 1 else np.concatenate(taken)
        self.waiting[ids] = True
        return ids

    def _result(self, ids: np.ndarray) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        a = self.arrays
        flat = a.obs_flat
        obs = flat[ids] if flat is not None else assemble(a.obs_space, a.obs_leaves, ids)
        infos = self._batch_infos(ids)
        return obs, a.rewards[ids], a.terminated[ids], a.truncated[ids], infos

    def _batch_infos(self, ids: np.ndarray) -> dict[str, Any]:
        b = len(ids)
        out: dict[str, Any] = {}
        slots = np.unique(self.slot_of[ids]).tolist()
        parts = [(self.slots[i].start, self.infos[i]) for i in slots if i in self.infos]
        if parts:
            out = _rows(merge_infos(parts, self.num_envs), ids)
        out["env_id"], out["_env_id"] = ids.copy(), np.ones(b, dtype=bool)
        flagged = self.restarted[ids]
        if flagged.any():
            out["worker_restarted"], out["_worker_restarted"] = flagged, flagged.copy()
            self.restarted[ids] = False
        return out


def _rows(infos: dict[str, Any], ids: np.ndarray) -> dict[str, Any]:
    """Pool-wide gymnasium infos cut to the rows ``ids`` (nested dicts too)."""
    return {
        k: _rows(v, ids) if isinstance(v, dict) else np.asarray(v)[ids] for k, v in infos.items()
    }
