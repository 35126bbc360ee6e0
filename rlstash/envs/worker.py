"""The worker process: a plain loop over a closed set of commands (torch-free).

Imports here stay light (numpy, gymnasium, the standard library) so that a worker never has
torch in ``sys.modules`` unless an environment imports it itself. The process is started
either from a fresh interpreter (``spawn``: :func:`main`) or forked from the pool's fork
server or the parent (``forkserver``/``fork``: :func:`serve`), with CUDA hidden and math
libraries limited to one thread by the environment the launcher sets.

Protocol (see :mod:`rlstash.envs.protocol`): the pool sends INIT (factories), the worker
answers with its envs' spaces; ATTACH (shared-memory layout and the pool's single spaces); then RESET / STEP / CALL / SETATTR /
INFO / CLOSE, each answered by exactly one OK or ERROR reply. Errors carry the traceback.
The worker ignores SIGINT (its parent stops it) and exits when its parent is gone: end of
file on the command pipe, or a watchdog thread that sees its parent process change.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import time
import traceback
from typing import Any

from rlstash.envs import protocol as P
from rlstash.envs.info_columns import InfoColumnWriter
from rlstash.envs.infos import batch_infos
from rlstash.envs.runner import EnvRunner
from rlstash.envs.shm import Layout, SharedArrays

WATCHDOG_PERIOD = 0.25  # seconds between checks that the parent process still exists


def dumps(obj: Any) -> bytes:
    """Pickle, falling back to cloudpickle for lambdas and locally defined objects."""
    try:
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError):
        import cloudpickle

        return cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def error_payload(exc: BaseException) -> bytes:
    """The ERROR reply: exception type, message and formatted traceback (all strings), and
    the exception itself when it pickles (so the pool can re-raise it with its type)."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    reply = {"type": type(exc).__name__, "message": str(exc), "traceback": text}
    try:
        reply["exception"] = pickle.dumps(exc.with_traceback(None))
        pickle.loads(reply["exception"])  # classes the pool cannot import are left out
    except Exception:  # noqa: BLE001 - the strings above are enough then
        reply.pop("exception", None)
    return pickle.dumps(reply)


def describe_env(env: Any) -> dict[str, Any]:
    """What a vector env repeats of its first env: ``metadata``, ``render_mode`` and ``spec``
    (a gymnasium.Env declares all three; an env object that is no gymnasium.Env may lack
    them: empty metadata, None)."""
    return {
        "metadata": dict(getattr(env, "metadata", None) or {}),
        "render_mode": getattr(env, "render_mode", None),
        "spec": getattr(env, "spec", None),
    }


class Worker:
    """State of one worker between commands."""

    def __init__(self, mem_fd: int) -> None:
        self.mem_fd = mem_fd
        self.envs: list = []
        self.runner: EnvRunner | None = None
        self.shared: SharedArrays | None = None
        self.start = 0
        self.mode = "next_step"
        self.spaces: tuple = ()
        self.pickled_obs = False
        self.info_columns: InfoColumnWriter | None = None
        self.spin = 0.0  # seconds to poll for the next command before sleeping

    def init(self, payload: bytes) -> bytes:
        sys_path, self.start, self.mode, blob, authkey, self.spin = pickle.loads(payload)
        sys.path[:] = list(sys_path) + [p for p in sys.path if p not in sys_path]
        # as a multiprocessing child: the pool's authkey, so that factories may hold
        # multiprocessing.Manager proxies (locks, values) of the pool's process
        import multiprocessing

        multiprocessing.current_process().authkey = authkey
        factories = pickle.loads(blob)  # cloudpickle output loads with plain pickle
        for factory in factories:
            env = factory()
            self.envs.append(env)
            if not (hasattr(env, "observation_space") and hasattr(env, "action_space")):
                raise TypeError(
                    f"env factory for env {self.start + len(self.envs) - 1} returned "
                    f"{type(env).__name__}, expected a gymnasium.Env"
                )
        info = {
            "observation_spaces": [env.observation_space for env in self.envs],
            "action_spaces": [env.action_space for env in self.envs],
            **describe_env(self.envs[0]),
        }
        try:
            info["spec"] = pickle.loads(dumps(info["spec"]))
        except Exception:  # noqa: BLE001 - a spec is optional
            info["spec"] = None
        return dumps(info)

    def attach(self, payload: bytes) -> bytes:
        layout: Layout
        layout, *spaces = pickle.loads(payload)  # the pool's single obs/action spaces
        self.spaces = tuple(spaces)
        self.shared = SharedArrays(layout, self.mem_fd)
        self.pickled_obs = layout.obs_pickled
        rows = slice(self.start, self.start + len(self.envs))
        self.info_columns = InfoColumnWriter(self.shared["info"][rows])
        self.runner = EnvRunner(self.envs, self.start, self.shared, *self.spaces, self.mode)
        return b""

    def reset(self, payload: bytes) -> bytes:
        seeds, options, mask, codes = pickle.loads(payload)
        assert self.runner is not None, "RESET before ATTACH"
        infos = self.runner.reset(seeds, options, mask)
        if codes:
            self.runner.mark_restarted(codes)
        return self.reply(infos)

    def reply(self, infos: list) -> bytes:
        """A RESET/STEP reply: batched infos (b"" if none); with pickled observations the
        tuple (infos or None, observations, final observations or None)."""
        batched = batch_infos(infos, len(self.envs)) if infos else None
        runner = self.runner
        assert runner is not None and self.shared is not None
        if not self.shared.layout.obs_pickled:
            return dumps(batched) if infos else b""
        finals = runner.final_objects if runner.mode == "same_step" else None
        return dumps((batched, runner.obs_objects, finals))

    def step(self, payload: bytes) -> bytes:
        """Step every env; the STEP reply's payload (b"" for a plain OK). ``payload``: the
        pickled actions of an action space without an array layout, else b"". Infos are
        batched here, in parallel, not by the pool."""
        actions = pickle.loads(payload) if payload else None  # act_pickled only
        infos = self.runner.step(actions)  # type: ignore[union-attr]
        if self.pickled_obs:
            return self.reply(infos)
        return self.step_infos(infos) if infos else b""

    def handle(self, tag: bytes, payload: bytes) -> bytes:
        """Run one command other than CLOSE; its OK payload (an exception is the error)."""
        if tag == P.STEP:
            return self.step(payload)
        handlers = {
            P.INIT: self.init,
            P.ATTACH: self.attach,
            P.RESET: self.reset,
            P.CALL: self.call,
            P.SETATTR: self.set_attr,
            P.INFO: self.info,
        }
        return handlers[tag](payload)

    def step_infos(self, infos: list) -> bytes:
        """A STEP reply's payload for non-empty ``infos``: in shared memory when they are
        plain numbers with one schema (:mod:`~rlstash.envs.info_columns`), else pickled."""
        assert self.info_columns is not None
        encoded = self.info_columns.encode(infos)
        return encoded if encoded is not None else dumps(batch_infos(infos, len(self.envs)))

    def call(self, payload: bytes) -> bytes:
        name, args, kwargs = pickle.loads(payload)
        assert self.runner is not None, "CALL before ATTACH"
        return dumps(self.runner.call(name, args, kwargs))

    def set_attr(self, payload: bytes) -> bytes:
        name, values = pickle.loads(payload)
        assert self.runner is not None, "SETATTR before ATTACH"
        self.runner.set_attr(name, values)
        return b""

    def info(self, payload: bytes) -> bytes:
        keys = (
            "CUDA_VISIBLE_DEVICES",
            "OMP_NUM_THREADS",
            "OPENBLAS_NUM_THREADS",
            "MKL_NUM_THREADS",
        )
        return dumps(
            {
                "pid": os.getpid(),
                "ppid": os.getppid(),
                "modules": sorted(sys.modules),
                "environ": {k: os.environ.get(k) for k in keys},
                "num_envs": len(self.envs),
                "start": self.start,
            }
        )

    def close(self) -> None:
        runner, self.runner = self.runner, None
        try:
            if runner is not None:
                runner.close()
            else:
                for env in self.envs:
                    env.close()
        finally:
            self.envs = []
            if self.shared is not None:
                self.shared.close()


def _watch_parent(ppid: int) -> None:
    """Exit the process as soon as the parent is gone (even if an env hangs the loop)."""

    def watch() -> None:
        while True:
            time.sleep(WATCHDOG_PERIOD)
            if os.getppid() != ppid:
                os._exit(3)

    threading.Thread(target=watch, name="rlstash-parent-watch", daemon=True).start()


def serve(cmd_fd: int, reply_fd: int, mem_fd: int) -> int:
    """Run the command loop until CLOSE or end of file; returns the exit code."""
    for fd in (cmd_fd, reply_fd, mem_fd):
        os.set_inheritable(fd, False)  # env subprocesses must not hold our pipes open
    _watch_parent(os.getppid())
    worker = Worker(mem_fd)
    ok_message, step_tag = P.OK_MESSAGE, P.STEP
    spinner = P.Spinner(cmd_fd, 0.0)  # the pool's choice comes with INIT
    while True:
        try:
            spinner.wait()
            tag, payload = P.recv(cmd_fd)
            spinner.done()
        except P.PeerGone:
            tag, payload = P.CLOSE, b"parent gone"
        try:
            if tag == step_tag:  # the hot path: one read, one 5-byte write
                reply = worker.step(payload)
                if reply:
                    P.send(reply_fd, P.OK, reply)
                else:
                    os.write(reply_fd, ok_message)
                continue
            if tag == P.CLOSE:
                worker.close()
                if not payload:
                    P.send(reply_fd, P.OK)
                return 0
            P.send(reply_fd, P.OK, worker.handle(tag, payload))
            spinner.seconds = worker.spin
        except P.PeerGone:
            return 0
        except BaseException as exc:  # noqa: BLE001 - every error goes back to the pool
            try:
                P.send(reply_fd, P.ERROR, error_payload(exc))
            except P.PeerGone:
                return 0
            if tag == P.CLOSE:
                return 1


def main(cmd_fd: int, reply_fd: int, mem_fd: int) -> None:
    """Entry point of a spawned worker (``python -c ...``): ignore SIGINT, serve, exit."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    code = serve(cmd_fd, reply_fd, mem_fd)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
