"""The multi-process backend of :class:`~rlstash.envs.process_pool.ProcessPoolVectorEnv` (torch-free).

W workers each hold a contiguous block of envs. A step is: the pool writes the actions into
shared memory, writes one 5-byte STEP message per worker, then reads one reply per worker
(blocking reads: the main process sleeps while the workers step). A worker whose reply pipe
hits end of file died; one that does not answer before the deadline is killed; one that
answers ERROR raised in an env. Each of them is restarted from its factories with fresh
seeds (see :mod:`rlstash.envs.backend` for how the restart is reported).

Every wait takes its bound from the pool's :class:`~rlstash.envs.config.Timeouts`: a
worker's start (and a restarted worker's) from ``start_timeout``, every step, reset and call
(a restarted worker's reset too) from ``step_timeout``, stopping from the close bound. A
restarted worker that misses its bound is one more failure against ``max_restarts``.
"""

from __future__ import annotations

import os
import pickle
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

import cloudpickle
import numpy as np

from rlstash.envs import protocol as P
from rlstash.envs.backend import NO_REPORT, REPORT_NEXT, REPORT_NOW, Backend
from rlstash.envs.caller_share import CallerShare
from rlstash.envs.config import Timeouts
from rlstash.envs.cpus import usable_cpus
from rlstash.envs.errors import WaitTimeoutError, WorkerFailedError
from rlstash.envs.info_columns import NEW, Schema, block_infos, read_schema
from rlstash.envs.launch import Launcher, WorkerProcess
from rlstash.envs.shm import Layout, SharedArrays, create_segment, resize_segment
from rlstash.envs.shutdown import death_text, release_workers
from rlstash.envs.worker import dumps

WORKER_SPIN = 200e-6  # seconds a worker polls for the next STEP before sleeping (see spin)
CALLER_SPIN = 100e-6  # seconds the caller polls for a worker's reply before sleeping


class _Failure(Exception):
    """Internal: one worker failed; carries the reason, the error text and (for an env's
    exception that could be unpickled here) the exception itself."""

    def __init__(self, reason: str, error: str, exc: BaseException | None = None) -> None:
        super().__init__(reason)
        self.reason, self.error, self.exc = reason, error, exc


def _unpickle_error(payload: bytes) -> _Failure:
    reply = pickle.loads(payload)
    exc = None
    if "exception" in reply:
        try:
            exc = pickle.loads(reply["exception"])
        except Exception:  # noqa: BLE001 - a class this process cannot import
            exc = None
    return _Failure("exception", reply["traceback"], exc)


class _Slot:
    """A worker position: its envs and factories survive the processes that fill it.
    ``local``: the caller's share (:class:`CallerShare` in place of a process)."""

    def __init__(self, index: int, start: int, factories: list[Callable], local: bool) -> None:
        self.index = index
        self.start = start
        self.envs = tuple(range(start, start + len(factories)))
        self.blob = cloudpickle.dumps(list(factories))
        self.local = local
        self.proc: WorkerProcess | CallerShare | None = None
        self.spinner: P.Spinner | None = None  # polls the reply pipe (ProcessBackend.spin)
        self.pending = 0  # replies still to read (after an interrupted wait)
        self.send_failed = False
        self.info_schema: Schema | None = None  # of its last infos in shared memory


def _earliest(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


class ProcessBackend(Backend):
    """Envs stepped by ``num_workers`` worker processes over one shared segment; the last
    ``caller_envs`` of them in this process (:mod:`rlstash.envs.caller_share`)."""

    def __init__(
        self,
        factories: list[Callable],
        num_workers: int,
        mode: str,
        start_method: str,
        environ: Mapping[str, str],
        timeouts: Timeouts,
        max_restarts: int,
        seed_rng: np.random.Generator,
        caller_envs: int = 0,
    ) -> None:
        super().__init__(max_restarts, seed_rng)
        n = len(factories)
        m = n - caller_envs  # envs of the worker processes
        sizes = [m // num_workers + (1 if w < m % num_workers else 0) for w in range(num_workers)]
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(int).tolist()
        self.slots = [
            _Slot(w, starts[w], factories[starts[w] : starts[w] + sizes[w]], False)
            for w in range(num_workers)
        ]
        if caller_envs:
            self.slots.append(_Slot(num_workers, m, factories[m:], True))
        # the caller's share runs first while waiting: the workers step theirs meanwhile
        self._wait_order = sorted(self.slots, key=lambda s: not s.local)
        self.num_workers = num_workers
        self.caller_envs = caller_envs
        # W workers + the caller's share fit the cores: nobody waits for a core, so polling
        # briefly for the next message beats sleeping (a wake-up costs tens of us, and on a
        # busy core the woken worker takes the caller's core); W workers alone would poll on
        # the cores the others step on
        self.spin = bool(caller_envs) and num_workers + 1 <= usable_cpus()
        self.num_envs = n
        self.mode = mode
        self.timeouts = timeouts
        self.launcher = Launcher(start_method, environ, start_timeout=timeouts.start)
        self.mem_fd = -1
        self.layout: Layout | None = None
        self.spaces: dict[str, Any] = {}
        self.owner = os.getpid()
        self.closed = False
        self._resetting: tuple[list[_Slot], dict] = ([], {})
        self._calling = ""  # the name of the call sent by call_async

    # --- start ------------------------------------------------------------------------
    def start(self, resolve: Callable[[list, list], tuple]) -> dict[str, Any]:
        """Start every worker, build envs, lay out and attach shared memory.

        ``resolve(observation_spaces, action_spaces)`` (one per env) checks them and returns
        the single (observation, action) spaces the layout is built from. Returns worker 0's
        description (metadata, render_mode, spec) with every env's spaces.
        """
        self.mem_fd = create_segment(0, "pool")
        for slot in self.slots:
            self._starting(slot, lambda slot=slot: self._new_process(slot))
        for slot in self.slots:
            self._send(slot, P.INIT, self._init_payload(slot))
        deadline = self.timeouts.deadline("start")
        by_slot = {}
        for slot in self._wait_order:
            reply = self._starting(slot, lambda slot=slot: self._recv(slot, deadline, "start"))
            by_slot[slot.index] = pickle.loads(reply)
        described = [by_slot[slot.index] for slot in self.slots]
        first = dict(described[0])
        for key in ("observation_spaces", "action_spaces"):
            first[key] = [space for d in described for space in d[key]]
        try:
            obs, act, pickled = resolve(first["observation_spaces"], first["action_spaces"])
        except BaseException:
            self.close()
            raise
        self.single = (obs, act)
        first["observation_space"], first["action_space"] = self.single
        self.spaces = first
        self.layout = Layout.build(obs, act, self.num_envs, self.mode == "same_step", pickled)
        self.obs_objects: list[Any] = [None] * self.num_envs  # layout.obs_pickled
        self.final_objects: list[Any] = [None] * self.num_envs
        self.actions: list[Any] = []  # layout.act_pickled: set by the pool before step_async
        resize_segment(self.mem_fd, self.layout.nbytes)
        self.shared = SharedArrays(self.layout, self.mem_fd)
        for slot in self.slots:
            self._send(slot, P.ATTACH, pickle.dumps((self.layout, *self.single)))
        for slot in self._wait_order:
            self._starting(slot, lambda slot=slot: self._recv(slot, deadline, "start"))
        return first

    def _starting(self, slot: _Slot, action: Callable[[], Any]) -> Any:
        """``action()``; a failure while the pool starts closes it and raises
        :class:`WorkerFailedError` (nothing is restarted before the pool ever ran)."""
        try:
            return action()
        except _Failure as f:
            self.close()
            raise WorkerFailedError(
                slot.index, slot.envs, 1, 0, f.error, [], starting=True
            ) from None

    def _init_payload(self, slot: _Slot) -> bytes:
        import multiprocessing
        import sys

        authkey = bytes(multiprocessing.current_process().authkey)  # for Manager proxies
        spin = WORKER_SPIN if self.spin else 0.0
        return pickle.dumps((list(sys.path), slot.start, self.mode, slot.blob, authkey, spin))

    def _procs(self) -> list[Any]:
        return [s.proc for s in self.slots if s.proc is not None]

    def _new_process(self, slot: _Slot) -> None:
        if slot.local:
            slot.proc = CallerShare(self.mem_fd)
            return
        try:
            slot.proc = self.launcher.start(self.mem_fd, self._procs())
        except TimeoutError:
            raise _Failure(
                "timeout", f"the fork server did not fork within {self.timeouts.describe('start')}"
            ) from None
        slot.spinner = P.Spinner(slot.proc.reply_fd, CALLER_SPIN if self.spin else 0.0)

    # --- messaging --------------------------------------------------------------------
    def _send(self, slot: _Slot, tag: bytes, payload: bytes = b"") -> None:
        assert slot.proc is not None
        if slot.local:
            slot.proc.send(tag, payload)  # type: ignore[union-attr]
            return
        self._drain(slot)
        try:
            P.send(slot.proc.cmd_fd, tag, payload)
            slot.pending += 1
        except P.PeerGone:
            slot.send_failed = True

    def _recv(self, slot: _Slot, deadline: float | None, bound: str = "step") -> bytes:
        """The payload of the next OK reply; raises _Failure otherwise (``bound``: the
        timeout behind ``deadline``, ``"start"`` or ``"step"``, named when it passes)."""
        assert slot.proc is not None
        if slot.local:
            return self._run_local(slot.proc)  # type: ignore[arg-type]
        if slot.send_failed:
            slot.send_failed = False
            raise _Failure("died", self._death_text(slot))
        try:
            slot.spinner.wait()  # type: ignore[union-attr]
            tag, payload = P.recv(slot.proc.reply_fd, deadline)
            slot.spinner.done()  # type: ignore[union-attr]
        except P.PeerGone:
            slot.pending = 0
            raise _Failure("died", self._death_text(slot)) from None
        except P.ReplyTimeout:
            limit = self.timeouts.describe(bound)
            raise _Failure("timeout", f"no answer within {limit}") from None
        slot.pending -= 1
        if tag == P.ERROR:
            raise _unpickle_error(payload)
        return payload

    @staticmethod
    def _run_local(share: CallerShare) -> bytes:
        """Run the caller's share's queued command; an env's exception is its failure."""
        try:
            return share.run()
        except Exception as exc:
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            raise _Failure("exception", text, exc) from None

    def _drain(self, slot: _Slot) -> None:
        """Read replies left over from an interrupted wait so the next reply is ours (each
        within ``step_timeout``, or the close bound without one)."""
        t = self.timeouts
        while slot.pending > 0 and not slot.send_failed:
            try:
                deadline = time.monotonic() + (t.close if t.step is None else t.step)
                tag, payload = P.recv(slot.proc.reply_fd, deadline)  # type: ignore[union-attr]
                slot.pending -= 1
                if tag == P.OK and payload[:1] == NEW:  # the next SAME reply refers to it
                    slot.info_schema = read_schema(payload, None)
            except (P.PeerGone, P.ReplyTimeout):
                slot.send_failed = True  # handled as a death by the next _recv

    def _death_text(self, slot: _Slot) -> str:
        assert slot.proc is not None
        return death_text(slot.proc, self.timeouts.close)

    # --- reset / step -----------------------------------------------------------------
    def reset_async(
        self, seeds: list[int | None], options: dict | None, mask: np.ndarray | None
    ) -> None:
        """Send RESET to the workers holding (masked) envs; :meth:`reset_wait` reads the
        replies. A worker restarted then resets all its envs; those outside ``mask`` are
        reported truncated at the next step (code ``REPORT_NEXT``)."""
        sent, codes = [], {}
        for slot in self.slots:
            rows = slice(slot.envs[0], slot.envs[-1] + 1)
            sub_mask = None if mask is None else mask[rows].tolist()
            if sub_mask is not None and not any(sub_mask):
                continue
            self._send(slot, P.RESET, dumps((seeds[rows], options, sub_mask, None)))
            sent.append(slot)
            in_reset = sub_mask if sub_mask is not None else [True] * len(slot.envs)
            codes[slot.index] = [NO_REPORT if m else REPORT_NEXT for m in in_reset]
        self._resetting = (sent, codes)

    def reset_wait(self, timeout: float | None) -> tuple[list[tuple[int, dict]], list[int]]:
        """Info parts and restarted envs of the reset sent by :meth:`reset_async`."""
        sent, codes = self._resetting
        self._resetting = ([], {})
        return self._gather(sent, timeout, "reset", codes)

    def step_async(self) -> None:
        """One 5-byte STEP message per worker (actions are already in shared memory)."""
        message = P.STEP_MESSAGE
        pickled = self.layout.act_pickled  # type: ignore[union-attr]
        for slot in self.slots:
            if slot.pending:
                self._drain(slot)
            if slot.local:  # runs in step_wait
                own = self.actions[slot.envs[0] : slot.envs[-1] + 1] if pickled else None
                self._send(slot, P.STEP, b"" if own is None else dumps(own))
                continue
            if pickled:  # actions without an array layout travel with the message
                self._send(slot, P.STEP, dumps(self.actions[slot.envs[0] : slot.envs[-1] + 1]))
                continue
            try:
                os.write(slot.proc.cmd_fd, message)  # type: ignore[union-attr]
                slot.pending += 1
            except OSError:
                slot.send_failed = True

    def step_wait(self, timeout: float | None) -> tuple[list[tuple[int, dict]], list[int]]:
        """Read one reply per worker; restart failed workers (their envs: truncated)."""
        deferred = self.take_deferred()
        codes = {s.index: [REPORT_NOW] * len(s.envs) for s in self.slots}
        parts, restarted = self._gather(self.slots, timeout, "step", codes)
        return parts, deferred + restarted

    def _gather(
        self, slots: list[_Slot], timeout: float | None, command: str, codes: dict
    ) -> tuple[list[tuple[int, dict]], list[int]]:
        """One reply per slot. A worker silent past ``step_timeout`` is restarted; one
        silent past the caller's ``timeout`` (sooner) is left running and, after the other
        replies were read, :class:`WaitTimeoutError` is raised."""
        pool_deadline = self.timeouts.deadline("step")
        caller_deadline = None if timeout is None else time.monotonic() + timeout
        deadline = _earliest(pool_deadline, caller_deadline)
        parts: list[tuple[int, Any]] = []  # (first env, batched infos or a column Schema)
        failed: list[tuple[_Slot, _Failure]] = []
        late: list[_Slot] = []
        for slot in slots if len(slots) < 2 else [s for s in self._wait_order if s in slots]:
            try:
                payload = self._recv(slot, deadline)
            except _Failure as f:
                if f.reason == "timeout" and deadline == caller_deadline:
                    late.append(slot)
                else:
                    failed.append((slot, f))
                continue
            infos = self._absorb(slot, payload)
            if infos:
                parts.append((slot.start, infos))
        if self.caller_envs:  # the caller's share answered first: env order for merging
            parts.sort(key=lambda part: part[0])
        parts = self._column_infos(parts, len(slots) == len(self.slots))
        restarted: list[int] = []
        for slot, f in failed:
            restarted.extend(self._restart(slot, f, command, codes[slot.index]))
        if late:
            envs = [e for slot in late for e in slot.envs]
            raise WaitTimeoutError(
                f"The call to `{command}_wait` has timed out after {timeout} second(s) "
                f"(envs {envs} did not answer; their workers keep running)."
            )
        return parts, restarted

    def _column_infos(self, parts: list[tuple[int, Any]], every: bool) -> list:
        """Replace column schemas by batched infos read from the ``info`` array; when every
        worker answered with one schema, one block of all envs (nothing left to merge)."""
        info = self.shared["info"]
        schemas = [p for _, p in parts if type(p) is tuple]
        if not schemas:
            return parts
        if every and len(schemas) == len(self.slots) and schemas.count(schemas[0]) == len(schemas):
            return [(0, block_infos(info, slice(0, self.num_envs), schemas[0]))]
        rows = {slot.start: slice(slot.envs[0], slot.envs[-1] + 1) for slot in self.slots}
        return [
            (row, block_infos(info, rows[row], p) if type(p) is tuple else p) for row, p in parts
        ]

    def _absorb(self, slot: _Slot, payload: bytes) -> Any:
        """The batched infos of a RESET/STEP reply, or the :class:`Schema` of infos left in
        shared memory; pickled observations go to the stores."""
        if not self.layout.obs_pickled:  # type: ignore[union-attr]
            if not payload:
                return None
            schema = read_schema(payload, slot.info_schema)
            if schema is None:
                return pickle.loads(payload)
            slot.info_schema = schema
            return schema
        infos, observations, finals = pickle.loads(payload)
        rows = slice(slot.envs[0], slot.envs[-1] + 1)
        self.obs_objects[rows] = observations
        if finals is not None:
            self.final_objects[rows] = finals
        return infos

    # --- restart ----------------------------------------------------------------------
    def _restart(self, slot: _Slot, failure: _Failure, command: str, codes: list[int]) -> list[int]:
        """Replace the worker until it starts and resets, or the budget is spent: a fresh
        worker that fails, or misses ``start_timeout`` (start) or ``step_timeout`` (its
        envs' reset), is one more failure (command ``"restart"``).

        Returns the envs to report as restarted now; envs with code ``REPORT_NEXT`` are
        queued in ``self.deferred`` for the next step.
        """
        while True:
            old = slot.proc
            assert old is not None
            old.kill()
            code = old.reap(self.timeouts.close)
            old.close_pipes()
            slot.pending, slot.send_failed = 0, False
            self.record_failure(
                slot.index, slot.envs, failure.reason, failure.error, code, command, old.pid,
                failure.exc,
            )  # fmt: skip
            try:
                self._fresh_worker(slot, codes)
                break
            except _Failure as f:
                failure, command = f, "restart"
        self.deferred.extend(e for e, c in zip(slot.envs, codes) if c == REPORT_NEXT)
        return [e for e, c in zip(slot.envs, codes) if c != REPORT_NEXT]

    def _fresh_worker(self, slot: _Slot, codes: list[int]) -> None:
        """Start a worker in ``slot``: build and attach within ``start_timeout``, reset its
        envs within ``step_timeout`` (``start_timeout`` when none is set); a :class:`_Failure` otherwise."""
        self._new_process(slot)
        deadline = self.timeouts.deadline("start")
        self._send(slot, P.INIT, self._init_payload(slot))
        got = pickle.loads(self._recv(slot, deadline, "start"))
        rows = slice(slot.envs[0], slot.envs[-1] + 1)
        for key in ("observation_spaces", "action_spaces"):
            if got[key] != self.spaces[key][rows]:
                raise _Failure("exception", f"restarted envs {slot.envs} have {key} {got[key]}")
        self._send(slot, P.ATTACH, pickle.dumps((self.layout, *self.single)))
        self._recv(slot, deadline, "start")
        seeds = self.fresh_seeds(len(slot.envs))
        self._send(slot, P.RESET, pickle.dumps((seeds, None, None, codes)))
        self._absorb(slot, self._recv(slot, self.timeouts.deadline("restart"), "restart"))

    # --- calls ------------------------------------------------------------------------
    def _command_all(self, tag: bytes, payloads: list[bytes], what: str) -> list[Any]:
        for slot, payload in zip(self.slots, payloads):
            self._send(slot, tag, payload)
        return self._collect(what, None)

    def _collect(self, what: str, timeout: float | None) -> list[Any]:
        """One reply per worker (a command was sent to each). An env's exception is raised
        (with its type when it unpickles); a dead or hung worker is restarted and reported;
        workers silent past the caller's ``timeout`` raise :class:`WaitTimeoutError` after
        the others were read (they keep running; their late replies are discarded)."""
        results: dict[int, Any] = {}
        errors, raised, late = [], [], []
        pool_deadline = self.timeouts.deadline("step")
        caller_deadline = None if timeout is None else time.monotonic() + timeout
        deadline = _earliest(pool_deadline, caller_deadline)
        for slot in self._wait_order:
            results[slot.index] = None
            try:
                reply = self._recv(slot, deadline)
                results[slot.index] = pickle.loads(reply) if reply else None
            except _Failure as f:
                if f.reason == "timeout" and deadline == caller_deadline:
                    late.extend(slot.envs)
                elif f.reason == "exception":
                    errors.append(f"env worker {slot.index}: {f.error}")
                    raised += [f.exc] if f.exc is not None else []
                else:
                    self._restart(slot, f, what, [REPORT_NEXT] * len(slot.envs))
                    errors.append(f"env worker {slot.index} {f.reason} during {what}: {f.error}")
        if late:
            raise WaitTimeoutError(
                f"The call to `call_wait` has timed out after {timeout} second(s) (envs "
                f"{late} did not answer `{what}`; their workers keep running)."
            )
        if errors:
            summary = RuntimeError(f"{what} failed:\n" + "\n".join(errors))
            if raised:  # as AsyncVectorEnv: the env's own exception, with its type
                raise raised[0] from summary
            raise summary
        return [results[slot.index] for slot in self.slots]

    def call(self, name: str, args: tuple, kwargs: dict) -> list[Any]:
        """``env.<name>(*args, **kwargs)`` (or the attribute) for every env, in env order."""
        self.call_async(name, args, kwargs)
        return self.call_wait(None)

    def call_async(self, name: str, args: tuple, kwargs: dict) -> None:
        """Send the call to every worker; :meth:`call_wait` reads the results."""
        payload = cloudpickle.dumps((name, args, kwargs))
        for slot in self.slots:
            self._send(slot, P.CALL, payload)
        self._calling = name

    def call_wait(self, timeout: float | None) -> list[Any]:
        """The results of :meth:`call_async`, in env order (``timeout``: see :meth:`_collect`)."""
        per_worker = self._collect(self._calling, timeout)
        return [x for chunk in per_worker for x in chunk]

    def set_attr(self, name: str, values: list[Any]) -> None:
        """Set ``name`` on every env to ``values[i]``."""
        payloads = [
            cloudpickle.dumps((name, values[s.envs[0] : s.envs[-1] + 1])) for s in self.slots
        ]
        self._command_all(P.SETATTR, payloads, f"set_attr({name!r})")

    def worker_info(self) -> list[dict[str, Any]]:
        """Per worker process: pid, ppid, ``modules`` (its sys.modules), environ of interest."""
        infos = self._command_all(P.INFO, [b""] * len(self.slots), "info")
        return [info for slot, info in zip(self.slots, infos) if not slot.local]

    def pids(self) -> list[int]:
        return [s.proc.pid for s in self.slots if s.proc is not None and not s.local]

    # --- close ------------------------------------------------------------------------
    def close(self) -> None:
        """Stop every worker (CLOSE, then SIGKILL after CLOSE_TIMEOUT), the fork server, and
        release the shared segment. Safe to call twice, from a finalizer, or at exit."""
        if self.closed:
            return
        self.closed = True
        mem_fd, self.mem_fd = self.mem_fd, -1
        release_workers(
            self.owner, self._procs(), self.launcher, self.shared, mem_fd,
            self.timeouts.close,
        )  # fmt: skip
