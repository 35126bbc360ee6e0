"""The AsyncCollector's worker process: its envs, its own CPU copy of the policy, and a ring
of K chunk slots in shared memory that it fills ahead of the learner.

Start-up order (field report 000: CPU workers must never touch CUDA): the launcher gives the
process ``CUDA_VISIBLE_DEVICES=""`` and one-thread math libraries
(:func:`rlstash.envs.launch.child_environ`); :func:`boot` records what it found *before*
importing torch (:data:`BOOT`, reported by ``INFO``), hides CUDA again for certain, then imports
torch and sets ``torch.set_num_threads(1)``. With the fork server, :func:`server_main` boots
once and every worker forked from it inherits the imported torch (cheap restarts).

Loop (sample-factory style, messages carry slot indices only)::

    while True:
        take FREE slots / answer INFO / stop on CLOSE (never blocks while a slot is free)
        no free slot -> block on the command pipe
        load new weights if the version in shared memory moved     (between chunks only)
        fill the slot: T steps of n envs, the policy acting on each step's observations
        send CHUNK(slot)

Any exception goes back as ``ERROR`` (with its traceback) and the worker exits; the worker
ignores SIGINT (its parent stops it) and exits when its parent is gone.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
from collections import deque
from typing import Any

import numpy as np

from rlstash.collect import async_layout as L
from rlstash.envs import protocol as P
from rlstash.envs.runner import EnvRunner, check_spaces
from rlstash.envs.shm import Layout, SharedArrays
from rlstash.envs.worker import _watch_parent, dumps, error_payload

BOOT: dict[str, Any] = {}


def first_look() -> tuple[str | None, bool]:
    """``(CUDA_VISIBLE_DEVICES, "torch" in sys.modules)``: what the launch code sees as its
    first statement, before it imports anything of rlstash (see :data:`BOOT_CODE`)."""
    return os.environ.get("CUDA_VISIBLE_DEVICES"), "torch" in sys.modules


# Prefix of the launch code: records what the process found before any rlstash import
# (``rlstash.collect`` imports torch with its package).
BOOT_CODE = (
    "import os, sys; _found = (os.environ.get('CUDA_VISIBLE_DEVICES'), 'torch' in sys.modules); "
)


def boot(found: tuple[str | None, bool] | None = None) -> None:
    """Record what the process found at launch (``found``, else now), hide CUDA for certain,
    then import torch with one intra-op thread."""
    if BOOT:
        return
    cuda, torch_there = found if found is not None else first_look()
    BOOT["cuda_visible_devices"] = cuda
    BOOT["torch_imported_before_boot"] = torch_there
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import torch

    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # pragma: no cover - already set in this process
        pass


class ChunkWorker:
    """State of one worker between commands."""

    def __init__(self, mem_fd: int, reply_fd: int) -> None:
        self.mem_fd, self.reply_fd = mem_fd, reply_fd
        self.envs: list = []
        self.runner: EnvRunner | None = None
        self.shared: SharedArrays | None = None
        self.private: SharedArrays | None = None
        self.free: deque[int] = deque()
        self.version = 0
        self.chunks = 0

    def init(self, payload: bytes) -> bytes:
        """Build envs and policy; answer spaces and the policy's weight spec."""
        cfg = pickle.loads(payload)
        sys.path[:] = list(cfg["sys_path"]) + [p for p in sys.path if p not in cfg["sys_path"]]
        import torch

        from rlstash.collect.async_weights import policy_state, weight_spec
        from rlstash.core import Acts

        self.index, self.steps, self.mode = cfg["index"], cfg["steps"], cfg["mode"]
        self.start = cfg["start"]
        for factory in pickle.loads(cfg["envs"]):
            env = factory()
            if not (hasattr(env, "observation_space") and hasattr(env, "action_space")):
                raise TypeError(
                    f"env factory for env {self.start + len(self.envs)} returned "
                    f"{type(env).__name__}, expected a gymnasium.Env"
                )
            self.envs.append(env)
        self.spaces = check_spaces(self.envs, self.start)
        for space, what in zip(self.spaces, ("observation_space", "action_space")):
            L.flat_leaf(space, what)
        torch.manual_seed(cfg["torch_seed"])
        self.policy = pickle.loads(cfg["policy_factory"])()
        act = self.policy.act if isinstance(self.policy, Acts) else None
        if not callable(act) and not callable(self.policy):
            raise TypeError(
                "policy_factory: expected it to return an nn.Module or an object with "
                f"act(obs), got {type(self.policy).__name__}"
            )
        self.act_fn = act if callable(act) else self.policy
        self.weight_spec = weight_spec(policy_state(self.policy))
        return dumps(
            {
                "observation_space": self.spaces[0],
                "action_space": self.spaces[1],
                "weights": self.weight_spec,
            }
        )

    def attach(self, payload: bytes) -> bytes:
        """Map the segment, reset the envs (seeds), mark bridge lanes, take the free slots."""
        from rlstash.collect.async_weights import SharedWeights

        cfg = pickle.loads(payload)
        layout: Layout = cfg["layout"]
        self.shared = SharedArrays(layout, self.mem_fd)
        self.weights = SharedWeights(self.shared, self.weight_spec)
        n = len(self.envs)
        own = Layout.build(*self.spaces, n, final_obs=self.mode == "same_step")
        self.private = SharedArrays(own, None)  # this process's step arrays [n, ...]
        self.runner = EnvRunner(self.envs, 0, self.private, *self.spaces, self.mode)
        self.runner.reset(list(cfg["seeds"]), None, None)
        for j in np.flatnonzero(cfg["bridge"]):
            self.runner.autoreset[j] = True  # row 0 is the reset step after a cut episode
        self.free.extend(cfg["free"])
        self.incarnation = cfg["incarnation"]
        return b""

    def info(self) -> bytes:
        import torch

        return dumps(
            {
                "pid": os.getpid(),
                "ppid": os.getppid(),
                "worker": self.index,
                "boot": dict(BOOT),
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "cuda_available": torch.cuda.is_available(),
                "cuda_initialized": torch.cuda.is_initialized(),
                "num_threads": torch.get_num_threads(),
                "policy_version": self.version,
                "chunks": self.chunks,
            }
        )

    def act(self, obs: np.ndarray, out: np.ndarray) -> None:
        """The policy's actions for ``obs`` [n, *obs_shape] into ``out`` [n, *act_shape]."""
        import torch

        with torch.no_grad():
            actions = self.act_fn(torch.from_numpy(obs))
        if isinstance(actions, torch.Tensor):
            actions = actions.detach().cpu().numpy()
        actions = np.asarray(actions)
        if actions.shape != out.shape:
            raise ValueError(
                f"policy: expected actions of shape {list(out.shape)} for {len(obs)} "
                f"observations, got {list(actions.shape)}"
            )
        np.copyto(out, actions, casting="unsafe")

    def fill(self, slot: int) -> None:
        """T steps of every env into chunk ``slot`` (see the layout in async_layout)."""
        assert self.runner is not None and self.shared is not None and self.private is not None
        self.version = self.weights.load_into(self.policy, self.version)
        w, sh, pv = self.index, self.shared, self.private
        obs, act = pv["obs"], pv["act"]  # this process's step arrays [n, ...]
        rows = {k: sh[k][w, slot] for k in L.STEP_FIELDS}  # [T, n, ...] in shared memory
        finals = sh["final_obs"][w, slot] if self.mode == "same_step" else None
        for t in range(self.steps):
            rows["obs"][t] = obs
            self.act(obs, act)
            self.runner.step()
            rows["action"][t] = act
            rows["reward"][t] = pv["reward"]
            rows["terminated"][t] = pv["terminated"]
            rows["truncated"][t] = pv["truncated"]
            if finals is not None:
                finals[t] = 0
                ended = pv["final"]
                finals[t][ended] = pv["final_obs"][ended]
        sh["next_obs"][w, slot] = obs
        sh["meta"][w, slot] = (self.version, self.chunks, self.incarnation)
        self.chunks += 1

    def close(self) -> None:
        try:
            if self.runner is not None:
                self.runner.close()
            else:
                for env in self.envs:
                    env.close()
        finally:
            for shared in (self.shared, self.private):
                if shared is not None:
                    shared.close()


def _handle(worker: ChunkWorker, tag: bytes, payload: bytes) -> bool:
    """One command; False on CLOSE."""
    if tag == L.FREE:
        worker.free.append(L.SLOT.unpack(payload)[0])
    elif tag == L.INFO:
        P.send(worker.reply_fd, L.OK, worker.info())
    elif tag == L.CLOSE:
        return False
    elif tag == L.INIT:
        P.send(worker.reply_fd, L.OK, worker.init(payload))
    elif tag == L.ATTACH:
        P.send(worker.reply_fd, L.OK, worker.attach(payload))
    else:
        raise ValueError(f"unknown command {tag!r}")
    return True


def run(worker: ChunkWorker, inbox: L.Inbox) -> None:
    """The command loop: take commands, fill free slots, announce them; until CLOSE."""
    while True:
        if worker.free and worker.runner is not None:
            for tag, payload in inbox.drain():
                if not _handle(worker, tag, payload):
                    return
            if inbox.eof:
                return
            if worker.free:
                slot = worker.free.popleft()
                worker.fill(slot)
                P.send(worker.reply_fd, L.CHUNK, L.SLOT.pack(slot))
            continue
        tag, payload = inbox.next(None)  # nothing to do: wait for a command
        if not _handle(worker, tag, payload):
            return


def serve(cmd_fd: int, reply_fd: int, mem_fd: int) -> int:
    """Serve until CLOSE or end of file; the exit code."""
    for fd in (cmd_fd, reply_fd, mem_fd):
        os.set_inheritable(fd, False)  # env subprocesses must not hold our pipes open
    _watch_parent(os.getppid())
    boot()  # no-op after main() or server_main()
    worker = ChunkWorker(mem_fd, reply_fd)
    code = 0
    try:
        run(worker, L.Inbox(cmd_fd))
    except P.PeerGone:
        pass
    except BaseException as exc:  # noqa: BLE001 - every error goes back to the collector
        code = 1
        try:
            P.send(reply_fd, L.ERROR, error_payload(exc))
        except (P.PeerGone, OSError):
            pass
    try:
        worker.close()
    except Exception:  # noqa: BLE001 - closing must finish
        code = code or 1
    return code


def main(cmd_fd: int, reply_fd: int, mem_fd: int, found: tuple | None = None) -> None:
    """Entry point of a spawned worker (``BOOT_CODE + python -c ...``): serve, flush, exit."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # ignored since the prologue
    boot(found)
    code = serve(cmd_fd, reply_fd, mem_fd)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def server_main(ctl_fd: int, found: tuple | None = None) -> None:
    """Entry point of the AsyncCollector's fork server: boot (torch imported once, CUDA
    hidden), then run :func:`rlstash.envs.forkserver.main` with this module's :func:`serve`
    as what each forked child runs."""
    boot(found)
    from rlstash.envs import forkserver
    from rlstash.envs import worker as env_worker

    env_worker.serve = serve  # the fork server's children call rlstash.envs.worker.serve
    forkserver.main(ctl_fd)
