"""The AsyncCollector's worker processes and their chunk rings, seen from the collector.

Reuses the env pool's primitives: anonymous shared memory (:func:`create_segment`), process
start with CUDA hidden and SIGINT ignored (:class:`Launcher`, :class:`ForkServerClient`,
:class:`WorkerProcess`), stopping (CLOSE, wait, SIGKILL, reap), restart accounting and
:class:`WorkerFailedError` (:class:`Backend`).

Delivery rule (no episode is ever stitched, invariant I7): the newest chunk a worker
announced is *held* until the worker announces the next one or fails. When it fails, that
held chunk is still in shared memory (the collector owns the segment) and is patched in
place before anyone sees it: per env lane

* mid-episode at the last row: ``truncated = True`` there; same-step mode also writes
  ``final_obs`` (the chunk's ``next_obs``); next-step mode makes row 0 of the restarted
  worker's first chunk a reset step whose observation is that ``next_obs`` (the bridge);
* episode ended at the last row: next-step mode bridges the final observation the same way;
* last row is a reset step (between episodes): nothing to do.

So consecutive batches of a lane always continue each other, and a plain
``StreamStorage.extend`` sees a truncated episode, never a jump into a fresh one.

Every wait takes its bound from the collector's :class:`~rlstash.envs.config.Timeouts`: a
worker builds its envs and policy (INIT) within ``start_timeout`` and resets its envs
(ATTACH) within ``step_timeout``, at the start and after every restart; a restarted worker
that misses either is one more failure against ``max_restarts``.
"""

from __future__ import annotations

import os
import pickle
import select
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import cloudpickle
import numpy as np

from rlstash.collect import async_layout as L
from rlstash.collect.async_weights import SharedWeights
from rlstash.collect.async_worker import BOOT_CODE
from rlstash.envs import protocol as P
from rlstash.envs.backend import Backend
from rlstash.envs.config import Timeouts
from rlstash.envs.errors import WorkerFailedError
from rlstash.envs.launch import Launcher, WorkerProcess
from rlstash.envs.shm import SharedArrays, create_segment, resize_segment
from rlstash.envs.shutdown import death_text, release_workers


class Failure(Exception):
    """One worker failed: ``reason`` (exception / died / timeout) and the error text."""

    def __init__(self, reason: str, error: str) -> None:
        super().__init__(reason)
        self.reason, self.error = reason, error


def make_launcher(
    method: str, environ: Mapping[str, str], start_timeout: float | None = None
) -> Launcher:
    """The env pool's :class:`Launcher` with the collector's programs: a spawned worker and
    the fork server both import torch (CUDA hidden) first (``BOOT_CODE``), so with
    ``forkserver`` torch is imported once and restarts are cheap."""
    return Launcher(
        method,
        environ,
        start_timeout=start_timeout,
        spawn_code=lambda c, r, m: (
            BOOT_CODE
            + f"from rlstash.collect.async_worker import main; main({c}, {r}, {m}, _found)"
        ),
        server_code=lambda fds: (
            BOOT_CODE
            + f"from rlstash.collect.async_worker import server_main; server_main({fds[0]}, _found)"
        ),
    )


class Handle:
    """The collector's view of worker position ``index`` (it outlives the processes)."""

    def __init__(self, index: int, start: int, factories: list[Callable]) -> None:
        self.index = index
        self.envs = tuple(range(start, start + len(factories)))
        self.blob = cloudpickle.dumps(list(factories))
        self.proc: WorkerProcess | None = None
        self.inbox: L.Inbox | None = None
        self.ready: deque[int] = deque()  # announced slots, oldest first
        self.final: set[int] = set()  # held slots patched after a failure (releasable)
        self.reset_last: dict[int, np.ndarray] = {}  # slot -> lanes whose last row is a reset step
        self.end_done = np.zeros(len(factories), bool)  # last announced row ended an episode
        self.bridge: tuple[np.ndarray, np.ndarray] | None = None  # (lanes [n], obs [n, ...])
        self.fresh = True  # the next chunk is the first of this process
        self.incarnation = 0
        self.progress = 0.0  # when it last showed progress (for step_timeout)
        self.replies: list[bytes] = []


@dataclass(frozen=True)
class Sizes:
    """T steps per chunk, K slots per worker, the autoreset mode, the timeouts."""

    steps: int
    slots: int
    mode: str
    timeouts: Timeouts


class Fleet(Backend):
    """W workers, their rings of K chunk slots of T steps, the weights block; see module doc."""

    def __init__(
        self,
        factories: list[list[Callable]],
        policy_factory: Callable,
        sizes: Sizes,
        launcher: Launcher,
        max_restarts: int,
        rng: np.random.Generator,
    ) -> None:
        super().__init__(max_restarts, rng)
        self.steps, self.slots, self.mode = sizes.steps, sizes.slots, sizes.mode
        self.timeouts = sizes.timeouts
        self.step_timeout = sizes.timeouts.step
        starts = np.cumsum([0] + [len(f) for f in factories])
        self.handles = [Handle(w, int(starts[w]), f) for w, f in enumerate(factories)]
        self.num_workers = len(factories)
        self.policy_blob = cloudpickle.dumps(policy_factory)  # __main__ objects by value
        self.launcher = launcher
        self.mem_fd = create_segment(0, "async")
        self.owner = os.getpid()
        self.closed = False
        self.weights: SharedWeights | None = None
        self.described: dict[str, Any] = {}

    # --- start ------------------------------------------------------------------------
    def start(self, seeds: list[int]) -> dict[str, Any]:
        """Start every worker, lay out and map the segment, start collection; returns the
        spaces and weight spec of worker 0. Raises WorkerFailedError (closed) on failure."""
        for h in self.handles:
            self._started(h, lambda h=h: self._launch(h))
        deadline = self.timeouts.deadline("start")
        described = [self._started(h, lambda h=h: self._await(h, deadline)) for h in self.handles]
        first = described[0]
        for h, d in zip(self.handles, described):
            for key in ("observation_space", "action_space", "weights"):
                if d[key] != first[key]:
                    self.close()
                    raise ValueError(
                        f"worker {h.index} (env {h.envs[0]}): {key} {d[key]} differs from "
                        f"worker 0's {first[key]}; every env needs the same spaces and policy"
                    )
        self.described = first
        n = len(self.handles[0].envs)
        layout = L.build_layout(
            first["observation_space"], first["action_space"], self.num_workers, self.slots,
            self.steps, n, self.mode == "same_step", [t[3] for t in first["weights"]["tensors"]],
        )  # fmt: skip
        resize_segment(self.mem_fd, layout.nbytes)
        self.layout = layout
        self.shared = SharedArrays(layout, self.mem_fd)
        self.weights = SharedWeights(self.shared, first["weights"])
        for h in self.handles:
            self._attach(h, seeds[h.envs[0] : h.envs[-1] + 1], np.zeros(n, bool))
        deadline = self.timeouts.deadline("step")  # ATTACH resets the envs
        for h in self.handles:
            self._started(h, lambda h=h: self._await(h, deadline, "step"))
            h.progress = time.monotonic()
        return first

    def _started(self, h: Handle, wait: Callable[[], bytes | None]) -> Any:
        """``wait()``'s reply unpickled; a failure closes the fleet (WorkerFailedError)."""
        try:
            reply = wait()
        except Failure as f:
            self.close()
            raise WorkerFailedError(h.index, h.envs, 1, 0, f.error, [], starting=True) from None
        return pickle.loads(reply) if reply else None

    def _launch(self, h: Handle) -> None:
        try:
            h.proc = self.launcher.start(self.mem_fd)
        except TimeoutError:
            limit = self.timeouts.describe("start")
            raise Failure("timeout", f"the fork server did not fork within {limit}") from None
        h.inbox = L.Inbox(h.proc.reply_fd)
        h.incarnation += 1
        h.fresh = True
        cfg = {
            "sys_path": list(sys.path), "index": h.index, "start": h.envs[0],
            "steps": self.steps, "mode": self.mode, "envs": h.blob,
            "policy_factory": self.policy_blob, "torch_seed": int(self.seed_rng.integers(2**31 - 1)),
        }  # fmt: skip
        self._send(h, L.INIT, pickle.dumps(cfg))

    def _attach(self, h: Handle, seeds: list[int], bridge: np.ndarray) -> None:
        free = [s for s in range(self.slots) if s not in h.ready]
        cfg = {"layout": self.layout, "seeds": list(seeds), "bridge": bridge, "free": free,
               "incarnation": h.incarnation}  # fmt: skip
        self._send(h, L.ATTACH, pickle.dumps(cfg))

    def _send(self, h: Handle, tag: bytes, payload: bytes = b"") -> None:
        try:
            P.send(h.proc.cmd_fd, tag, payload)  # type: ignore[union-attr]
        except (P.PeerGone, OSError):
            pass  # its death shows as end of file on the reply pipe

    def _await(self, h: Handle, deadline: float | None, bound: str = "start") -> bytes:
        """The next OK reply of ``h`` (start-up: no chunk can come before it); ``bound``:
        the timeout behind ``deadline`` (``"start"``, ``"step"``), named when it passes."""
        try:
            tag, payload = h.inbox.next(deadline)  # type: ignore[union-attr]
        except P.PeerGone:
            raise Failure("died", self._death_text(h)) from None
        except P.ReplyTimeout:
            limit = self.timeouts.describe(bound)
            what = "its envs' reset" if bound in ("step", "restart") else "start"
            raise Failure("timeout", f"no answer to {what} within {limit}") from None
        if tag == L.ERROR:
            raise Failure("exception", pickle.loads(payload)["traceback"])
        return payload

    def _death_text(self, h: Handle) -> str:
        assert h.proc is not None
        return death_text(h.proc, self.timeouts.close)

    # --- running ----------------------------------------------------------------------
    def releasable(self, h: Handle) -> bool:
        """``h``'s oldest chunk may be handed out (a later one exists, or it was patched)."""
        return len(h.ready) >= 2 or (bool(h.ready) and h.ready[0] in h.final)

    def pump(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for messages; take chunks, restart failed workers."""
        live = {h.proc.reply_fd: h for h in self.handles if h.proc is not None}
        # messages read along with a start-up reply may already wait in an inbox
        waiting = {fd for fd, h in live.items() if h.inbox.pending}  # type: ignore[union-attr]
        poller = select.poll()
        for fd in live:
            poller.register(fd, select.POLLIN)
        wait = min([timeout] + [d - time.monotonic() for d in self._deadlines()])
        wait = 0 if waiting else wait
        readable = {fd for fd, _ in poller.poll(max(0, int(wait * 1000)))}
        failed: list[tuple[Handle, Failure]] = []
        for fd in readable | waiting:
            h = live[fd]
            if fd in readable:
                h.inbox.fill()  # type: ignore[union-attr]
            try:
                for tag, payload in h.inbox.take():  # type: ignore[union-attr]
                    self._message(h, tag, payload)
                if h.inbox.eof:  # type: ignore[union-attr]
                    raise Failure("died", self._death_text(h))
            except Failure as f:
                failed.append((h, f))
        now = time.monotonic()
        for h in self.handles:
            d = self._deadline(h)
            if d is not None and now > d and all(h is not g for g, _ in failed):
                limit = f"{self.steps} steps x step_timeout={self.step_timeout} s"
                failed.append((h, Failure("timeout", f"no chunk within {limit}")))
        for h, f in failed:
            self.restart(h, f)

    def _message(self, h: Handle, tag: bytes, payload: bytes) -> None:
        if tag == L.CHUNK:
            self._chunk(h, L.SLOT.unpack(payload)[0])
        elif tag == L.OK:
            h.replies.append(payload)
        elif tag == L.ERROR:
            raise Failure("exception", pickle.loads(payload)["traceback"])

    def _deadline(self, h: Handle) -> float | None:
        busy = h.proc is not None and len(h.ready) < self.slots
        return h.progress + self.steps * self.step_timeout if busy and self.step_timeout else None

    def _deadlines(self) -> list[float]:
        return [d for d in map(self._deadline, self.handles) if d is not None]

    def _chunk(self, h: Handle, slot: int) -> None:
        """A complete chunk: apply the bridge of a restart, note where episodes stand."""
        w, sh = h.index, self.shared
        prev = h.end_done
        if h.fresh:
            prev = np.zeros_like(h.end_done)
            if h.bridge is not None:  # row 0 of the bridged lanes is a reset step
                lanes, obs = h.bridge
                sh["obs"][w, slot, 0, lanes] = obs[lanes]
                prev, h.bridge = lanes.copy(), None
        done = sh["terminated"][w, slot] | sh["truncated"][w, slot]  # [T, n]
        next_step = self.mode == "next_step"
        h.reset_last[slot] = (done[-2] if self.steps > 1 else prev) & next_step
        h.end_done = done[-1].copy()
        h.fresh = False
        h.ready.append(slot)
        h.progress = time.monotonic()

    def head(self, h: Handle) -> tuple[int, bool]:
        """``h``'s oldest chunk: (slot, whether its lanes were cut by a restart)."""
        return h.ready[0], h.ready[0] in h.final

    def release(self, h: Handle) -> None:
        """Give ``h``'s oldest chunk back to its worker (the collector copied it out)."""
        slot = h.ready.popleft()
        h.final.discard(slot)
        h.reset_last.pop(slot, None)
        if len(h.ready) == self.slots - 1:
            h.progress = time.monotonic()  # it was blocked until now
        if h.proc is not None:
            self._send(h, L.FREE, L.SLOT.pack(slot))

    # --- failures ---------------------------------------------------------------------
    def restart(self, h: Handle, failure: Failure, command: str = "collect") -> None:
        """Count the failure (WorkerFailedError past the budget), patch the held chunk,
        start a new process from the factories with fresh seeds."""
        while True:
            old, h.proc = h.proc, None
            code, pid = None, 0
            if old is not None:
                old.kill()
                code, pid = old.reap(self.timeouts.close), old.pid
                old.close_pipes()
            self.record_failure(h.index, h.envs, failure.reason, failure.error, code, command, pid)
            self._cut(h)
            try:
                self._launch(h)
                self._await(h, self.timeouts.deadline("start"))
                lanes = np.zeros(len(h.envs), bool) if h.bridge is None else h.bridge[0]
                self._attach(h, self.fresh_seeds(len(h.envs)), lanes)
                self._await(h, self.timeouts.deadline("restart"), "restart")  # ATTACH resets
                h.progress = time.monotonic()
                return
            except Failure as f:
                failure, command = f, "restart"
            except Exception as exc:  # noqa: BLE001 - e.g. the fork server could not fork
                text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
                failure, command = Failure("exception", text), "restart"

    def _cut(self, h: Handle) -> None:
        """End the episodes of ``h``'s lanes in its held chunk (see the module docstring)."""
        if not h.ready or h.ready[-1] in h.final:
            return  # nothing since the last cut: its bridge (if any) is still pending
        w, slot, sh = h.index, h.ready[-1], self.shared
        done = sh["terminated"][w, slot, -1] | sh["truncated"][w, slot, -1]  # [n]
        between = h.reset_last[slot]
        mid = ~done & ~between
        sh["truncated"][w, slot, -1, mid] = True
        if self.mode == "same_step":
            sh["final_obs"][w, slot, -1, mid] = sh["next_obs"][w, slot, mid]
        elif (~between).any():
            h.bridge = (~between, sh["next_obs"][w, slot].copy())
        h.final.add(slot)

    def info(self, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Every worker's INFO (answered between chunks; asked again after a restart)."""
        asked: dict[int, int] = {}
        deadline = time.monotonic() + timeout
        for h in self.handles:
            h.replies.clear()
        while not all(h.replies for h in self.handles):
            for h in self.handles:
                if h.proc is not None and asked.get(h.index) != h.incarnation:
                    asked[h.index] = h.incarnation
                    h.replies.clear()
                    self._send(h, L.INFO)
            if time.monotonic() > deadline:
                raise TimeoutError(f"workers did not answer INFO within {timeout} s")
            self.pump(0.05)
        return [pickle.loads(h.replies.pop(0)) for h in self.handles]

    def pids(self) -> list[int]:
        return [h.proc.pid for h in self.handles if h.proc is not None]

    # --- close ------------------------------------------------------------------------
    def close(self) -> None:
        """Stop every worker (CLOSE, wait, SIGKILL), the fork server, release the segment.
        Safe to call twice, from a finalizer or at exit."""
        if self.closed:
            return
        self.closed = True
        procs = [h.proc for h in self.handles if h.proc is not None]
        self.weights = None  # its views into the segment must be gone before the segment
        mem_fd, self.mem_fd = self.mem_fd, -1
        release_workers(self.owner, procs, self.launcher, self.shared, mem_fd, self.timeouts.close)
