"""Peers of the env-collection benchmark (bench/collect.py) and its worker-process bodies.

Every peer steps ``n`` copies of one gymnasium env with batched random actions drawn by the
same numpy sampler in the loop, and resets ended episodes (gymnasium's next-step autoreset,
or a reset right after the end in the raw loop and SB3). One *operation* is one vector step,
i.e. ``n`` env steps.

Workers (each runs in a fresh process started by bench/collect.py):

* :func:`cell_worker`: builds every peer of one (env, n) cell, then times them interleaved
  (``common.interleaved``, medians) while a ``common.cpu_meter`` records the machine's load;
* :func:`footprint_worker`: one peer in a fresh process: start-up (construction to the first
  step done, library imports excluded), then the RSS/PSS of the process tree and per worker
  after ~0.5 s of stepping, and the time ``close()`` takes;
* :func:`torchrl_worker`: one TorchRL collector (policy None: TorchRL's own random policy)
  timed interleaved against the raw loop in the same process; start-up to the first batch,
  RSS, shutdown time and processes left behind.
"""

from __future__ import annotations

import contextlib
import functools
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import psutil

ENVS: dict[str, str] = {  # benchmark name -> gymnasium id (Burn: importable in a fresh process)
    "CartPole-v1": "CartPole-v1",
    "Pendulum-v1": "Pendulum-v1",
    "HalfCheetah-v5": "HalfCheetah-v5",
    "Burn-200us": "rlstash.envs.testing:rlstash/Burn-v0",
}

PEERS: dict[str, str] = {  # key -> label in the tables
    "raw": "raw loop (1 process)",
    "gym-sync": "gymnasium SyncVectorEnv",
    "gym-async": "gymnasium AsyncVectorEnv(shared_memory=True)",
    "sb3-subproc": "SB3 SubprocVecEnv",
    "rlstash-w0": "rlstash ProcessPoolVectorEnv num_workers=0",
    "rlstash-w2": "rlstash ProcessPoolVectorEnv num_workers=2",
    "rlstash-w1c": "rlstash ProcessPoolVectorEnv num_workers=1, caller_envs=n//2",
    "rlstash-auto": 'rlstash ProcessPoolVectorEnv num_workers="auto"',
    "rlstash-w8": "rlstash ProcessPoolVectorEnv num_workers=8",
}
PROCESS_PER_ENV = ("gym-async", "sb3-subproc")  # one process per env: not run at 256 envs

TORCHRL: dict[str, str] = {
    "trl-multisync": "TorchRL MultiSyncCollector (2 x SerialEnv(n/2))",
    "trl-multiasync": "TorchRL MultiAsyncCollector (2 x SerialEnv(n/2))",
    "trl-parallel": "TorchRL Collector(ParallelEnv(2 x SerialEnv(n/2)))",
}
TORCHRL_STEPS = 32  # time steps per env in one collector batch


def make_env(env: str) -> gym.Env:
    """``gymnasium.make`` of a benchmark env (picklable through functools.partial)."""
    return gym.make(ENVS[env])


def action_sampler(space: gym.Space, n: int, seed: int) -> Callable[[], np.ndarray]:
    """Batched random actions [n, *shape] from a numpy Generator (Discrete or Box)."""
    rng = np.random.default_rng(seed)
    if isinstance(space, gym.spaces.Discrete):
        lo, hi = int(space.start), int(space.start + space.n)
        return lambda: rng.integers(lo, hi, n, dtype=np.int64)
    if isinstance(space, gym.spaces.Box):
        low = np.broadcast_to(space.low, space.shape)
        span = np.broadcast_to(space.high, space.shape) - low
        shape, dtype = (n, *space.shape), space.dtype
        return lambda: (low + span * rng.random(shape)).astype(dtype, copy=False)
    raise TypeError(f"space: expected Discrete or Box, got {type(space).__name__}")


# ----------------------------------------------------------------------------- peers


class Peer:
    """A vector of ``n`` envs; ``step(actions)`` advances all of them once. The defaults drive
    a gymnasium-style vector env in ``self.vec``."""

    note = ""
    vec: Any = None

    def __init__(self, env: str, n: int, seed: int) -> None:
        self.env, self.n, self.seed = env, n, seed

    def reset(self) -> None:
        self.vec.reset(seed=self.seed)

    def step(self, actions: np.ndarray) -> None:
        self.vec.step(actions)

    def worker_pids(self) -> list[int]:
        return []

    def close(self) -> None:
        self.vec.close()


class RawLoop(Peer):
    """One process, a Python loop over ``n`` envs; observations gathered into one array."""

    def __init__(self, env: str, n: int, seed: int) -> None:
        super().__init__(env, n, seed)
        self.envs = [make_env(env) for _ in range(n)]
        self.single_action_space = self.envs[0].action_space
        space = self.envs[0].observation_space
        self.obs = np.zeros((n, *space.shape), space.dtype)  # what a policy reads

    def reset(self) -> None:
        for i, e in enumerate(self.envs):
            self.obs[i] = e.reset(seed=self.seed + i)[0]

    def step(self, actions: np.ndarray) -> None:
        obs = self.obs
        for i, e in enumerate(self.envs):
            o, _, term, trunc, _ = e.step(actions[i])
            obs[i] = e.reset()[0] if term or trunc else o

    def close(self) -> None:
        for e in self.envs:
            e.close()


class GymVector(Peer):
    """gymnasium SyncVectorEnv or AsyncVectorEnv(shared_memory=True), default context."""

    def __init__(self, env: str, n: int, seed: int, asynchronous: bool) -> None:
        super().__init__(env, n, seed)
        fns = [functools.partial(make_env, env)] * n
        self.vec = (
            gym.vector.AsyncVectorEnv(fns, shared_memory=True)
            if asynchronous
            else gym.vector.SyncVectorEnv(fns)
        )
        self.single_action_space = self.vec.single_action_space

    def worker_pids(self) -> list[int]:
        return [p.pid for p in getattr(self.vec, "processes", [])]


class SB3Subproc(Peer):
    """Stable-Baselines3 SubprocVecEnv; ``start_method`` None is its default (forkserver,
    where every worker imports torch: seconds each)."""

    def __init__(self, env: str, n: int, seed: int, start_method: str | None = None) -> None:
        super().__init__(env, n, seed)
        from stable_baselines3.common.vec_env import SubprocVecEnv

        fns = [functools.partial(make_env, env)] * n
        self.vec = SubprocVecEnv(fns, start_method=start_method)
        self.single_action_space = self.vec.action_space

    def reset(self) -> None:
        self.vec.seed(self.seed)
        self.vec.reset()

    def worker_pids(self) -> list[int]:
        return [p.pid for p in self.vec.processes]


class RlstashPool(Peer):
    """rlstash ProcessPoolVectorEnv with ``num_workers`` 0, W or "auto" (its choice is kept in ``note``)."""

    def __init__(
        self, env: str, n: int, seed: int, num_workers: int | str, caller_envs: int = 0
    ) -> None:
        super().__init__(env, n, seed)
        from rlstash.envs import ProcessPoolVectorEnv

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.vec = ProcessPoolVectorEnv(
                ENVS[env], n, num_workers=num_workers, seed=seed, caller_envs=caller_envs
            )
        self.note = " ".join(str(w.message) for w in caught)
        self.single_action_space = self.vec.single_action_space

    def worker_pids(self) -> list[int]:
        return list(self.vec.worker_pids)


def build_peer(key: str, env: str, n: int, seed: int = 0, sb3_start: str | None = None) -> Peer:
    """The peer ``key`` (see ``PEERS``) over ``n`` copies of ``env``."""
    if key == "raw":
        return RawLoop(env, n, seed)
    if key in ("gym-sync", "gym-async"):
        return GymVector(env, n, seed, asynchronous=key == "gym-async")
    if key == "sb3-subproc":
        return SB3Subproc(env, n, seed, sb3_start)
    if key.startswith("rlstash-"):
        w = key.removeprefix("rlstash-")
        if w == "w1c":  # one worker + the caller's half of the envs
            return RlstashPool(env, n, seed, 1, caller_envs=n // 2)
        return RlstashPool(env, n, seed, "auto" if w == "auto" else int(w.removeprefix("w")))
    raise ValueError(f"key: expected one of {', '.join(PEERS)}, got {key!r}")


def stepper(peer: Peer, sample: Callable[[], np.ndarray]) -> Callable[[int], None]:
    """``run(k)``: k vector steps of ``peer``, actions sampled in the loop."""

    def run(k: int) -> None:
        for _ in range(k):
            peer.step(sample())

    return run


def _error(exc: BaseException) -> str:
    traceback.print_exc()
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"


def _cpu(meter: Any) -> dict[str, float]:
    """Busy cores: machine, this process, its descendants ("workers"), everyone else."""
    out = {k: round(getattr(meter, k), 3) for k in ("wall_s", "machine", "own", "others")}
    out["workers"] = round(meter.excluded, 3)
    return out


def _exclude_descendants(meter: Any) -> None:
    """Count this process's descendants (the peers' workers) as ours, not as others' load."""
    for child in psutil.Process().children(recursive=True):
        meter.exclude(child.pid)


# ----------------------------------------------------------------------------- plan


def plan(args: Any) -> dict[str, list[dict]]:
    """Worker tasks of every phase (``args``: bench/collect.py's parsed CLI)."""
    base = {"reps": args.reps, "target_s": args.target_s}
    all_peers = list(PEERS)
    small = [p for p in all_peers if p not in PROCESS_PER_ENV]
    sizes = (32,) if args.quick else (8, 32)
    cells = [dict(base, mode="cell", env=e, n=n, peers=all_peers) for e in args.envs for n in sizes]
    big = [e for e in ("CartPole-v1", "Burn-200us") if e in args.envs]
    if not args.quick:
        cells += [dict(base, mode="cell", env=e, n=256, peers=small) for e in big]
    fp_envs = args.envs[:1] if args.quick else args.envs
    fp_peers = ["raw", "gym-async", "rlstash-w2"] if args.quick else all_peers
    feet = [  # SB3's default start-up (every worker imports torch) is measured once
        dict(mode="footprint", env=e, n=32, peer=p)
        for e in fp_envs
        for p in fp_peers
        if p != "sb3-subproc" or e == fp_envs[0]
    ]
    if not args.quick and "CartPole-v1" in args.envs:
        feet += [
            dict(mode="footprint", env="CartPole-v1", n=256, peer=p)
            for p in ("raw", "rlstash-w0", "rlstash-w2", "rlstash-w8")
        ]
    trl = []
    if args.torchrl:
        for e in args.envs[:1] if args.quick else args.envs:
            keys = ["trl-multisync"] if args.quick else ["trl-multisync", "trl-multiasync"]
            if e == "CartPole-v1" and not args.quick:
                keys.append("trl-parallel")
            trl += [dict(base, mode="torchrl", env=e, n=32, peer=k) for k in keys]
    return {"cells": cells, "footprints": feet, "torchrl": trl}


# ----------------------------------------------------------------------------- workers


def cell_worker(task: dict) -> dict:
    """Build every peer of one (env, n) cell and time them interleaved (medians).

    SB3 starts its workers with ``fork`` here (its default, forkserver, makes every worker
    import torch: minutes for 32 HalfCheetah workers on 2 busy cores); stepping is the same
    pipe protocol either way, and :func:`footprint_worker` measures the default. The forking
    peers are built first, so their children inherit no other peer's pipes.
    """
    from common import cpu_meter, interleaved

    env, n = task["env"], task["n"]
    peers: dict[str, Peer] = {}
    out: dict[str, Any] = {"env": env, "n": n, "errors": {}, "notes": {}, "rates": {}}
    order = sorted(task["peers"], key=lambda k: k not in PROCESS_PER_ENV)
    try:
        for key in order:
            try:
                peer = build_peer(key, env, n, sb3_start="fork")
                peer.reset()
                peers[key] = peer
                if peer.note:
                    out["notes"][key] = peer.note
            except Exception as exc:  # reported in the table, never silently dropped
                out["errors"][key] = _error(exc)
        if not peers:
            return out
        space = next(iter(peers.values())).single_action_space
        runs = {
            k: stepper(p, action_sampler(space, n, seed=i))
            for i, (k, p) in enumerate(peers.items())
        }
        with cpu_meter() as meter:
            _exclude_descendants(meter)
            timings = interleaved(runs, task["reps"], task["target_s"])
        out["cpu"] = _cpu(meter)
        for key, t in timings.items():
            out["rates"][key] = {
                "median": t.median * n,
                "spread": t.spread,
                "n": t.n,
                "reps": [r * n for r in t.rates],
            }
    finally:
        for peer in peers.values():
            with contextlib.suppress(Exception):
                peer.close()
    return out


def memory(pids: list[int]) -> dict[str, Any]:
    """Tree RSS/PSS of this process and its descendants; median RSS/PSS of ``pids``."""
    me = psutil.Process()
    procs = [me, *me.children(recursive=True)]
    rss: dict[int, int] = {}
    pss: dict[int, int] = {}
    for p in procs:
        with contextlib.suppress(psutil.Error):
            info = p.memory_full_info()
            rss[p.pid], pss[p.pid] = info.rss, getattr(info, "pss", info.uss)
    workers = [pid for pid in pids if pid in rss]
    return {
        "processes": len(rss),
        "tree_rss": sum(rss.values()),
        "tree_pss": sum(pss.values()),
        "main_rss": rss.get(me.pid, 0),
        "workers": len(workers),
        "worker_rss": float(np.median([rss[p] for p in workers])) if workers else None,
        "worker_pss": float(np.median([pss[p] for p in workers])) if workers else None,
    }


def _imports(key: str) -> None:
    """Import the peer's library before the start-up clock (the env's own modules: after)."""
    if key == "sb3-subproc":
        import stable_baselines3.common.vec_env  # noqa: F401
    elif key.startswith("rlstash-"):
        import rlstash.envs  # noqa: F401


def footprint_worker(task: dict) -> dict:
    """Start-up, memory and close time of one peer in this fresh process."""
    env, n, key = task["env"], task["n"], task["peer"]
    _imports(key)
    t0 = time.perf_counter()
    peer = build_peer(key, env, n)
    try:
        peer.reset()
        sample = action_sampler(peer.single_action_space, n, seed=0)
        peer.step(sample())
        startup = time.perf_counter() - t0
        run = stepper(peer, sample)
        steps, t1 = 0, time.perf_counter()
        while time.perf_counter() - t1 < task.get("settle_s", 0.5):
            run(1)
            steps += 1
        out = {"startup_s": startup, "steps": steps, "note": peer.note}
        out.update(memory(peer.worker_pids()))
    except BaseException:
        peer.close()
        raise
    t2 = time.perf_counter()
    peer.close()
    out["close_s"] = time.perf_counter() - t2
    _left(out)
    return out


def _left(out: dict) -> None:
    """Child processes still alive 0.2 s after close (count and command lines)."""
    time.sleep(0.2)
    cmds = []
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            cmd = " ".join(p.cmdline())
            if "resource_tracker" not in cmd and "forkserver" not in cmd:
                # multiprocessing's helpers live until the interpreter exits
                cmds.append(cmd[-120:])
    out["left_after_close"] = len(cmds)
    out["left_cmds"] = cmds


# ----------------------------------------------------------------------------- TorchRL


def _torchrl_collector(key: str, env: str, n: int) -> tuple[Any, int]:
    """The TorchRL collector ``key`` over ``n`` envs (two halves: one per core)."""
    from torchrl.collectors import Collector, MultiAsyncCollector, MultiSyncCollector
    from torchrl.envs import GymEnv, ParallelEnv, SerialEnv

    half = functools.partial(SerialEnv, n // 2, functools.partial(GymEnv, ENVS[env]))
    frames = n * TORCHRL_STEPS
    if key == "trl-multisync":
        return MultiSyncCollector([half, half], None, frames_per_batch=frames, total_frames=-1), 2
    if key == "trl-multiasync":  # each batch comes from one of the two collectors
        return MultiAsyncCollector(
            [half, half], None, frames_per_batch=frames // 2, total_frames=-1
        ), 2
    if key == "trl-parallel":
        return Collector(ParallelEnv(2, half), None, frames_per_batch=frames, total_frames=-1), 2
    raise ValueError(f"key: expected one of {', '.join(TORCHRL)}, got {key!r}")


def torchrl_worker(task: dict) -> dict:
    """One TorchRL collector against the raw loop in this process.

    Not interleaved: a collector's processes keep collecting while the main process does
    something else (MultiAsyncCollector runs a batch ahead), which would both slow the raw
    loop and hand the collector ready batches. So the raw loop is timed alone before the
    collector starts and after it shut down (its rate: the median of both), and the
    collector in ``reps`` contiguous windows of >= max(1 s, 5 x target_s) and >= 2 batches,
    after two warm-up batches; frames/s is the median window.
    """
    import torchrl.collectors  # noqa: F401  (imports before the start-up clock)
    from common import cpu_meter, interleaved

    env, n, key = task["env"], task["n"], task["peer"]
    raw = RawLoop(env, n, 0)
    raw.reset()
    run_raw = stepper(raw, action_sampler(raw.single_action_space, n, seed=0))
    raw_rates = interleaved({"raw": run_raw}, task["reps"], task["target_s"])["raw"].rates
    window = max(1.0, 5 * task["target_s"])
    t0 = time.perf_counter()
    collector, _ = _torchrl_collector(key, env, n)
    out: dict[str, Any] = {}
    try:
        batches = iter(collector)
        next(batches)
        out["startup_s"] = time.perf_counter() - t0
        for _ in range(2):
            next(batches)
        rates = []
        with cpu_meter() as meter:
            _exclude_descendants(meter)
            for _ in range(task["reps"]):
                frames, count, t1 = 0, 0, time.perf_counter()
                while count < 2 or time.perf_counter() - t1 < window:
                    frames += next(batches).numel()
                    count += 1
                rates.append(frames / (time.perf_counter() - t1))
        out["cpu"] = _cpu(meter)
        out["rate"], out["rates"] = float(np.median(rates)), rates
        out.update(memory(_collector_pids(collector)))
    finally:
        t2 = time.perf_counter()
        collector.shutdown()
        out["close_s"] = time.perf_counter() - t2
    _left(out)
    raw_rates += interleaved({"raw": run_raw}, task["reps"], task["target_s"])["raw"].rates
    raw.close()
    out["raw_rate"] = float(np.median(raw_rates)) * n
    out["ratio"] = out["rate"] / out["raw_rate"]
    return out


def _collector_pids(collector: Any) -> list[int]:
    """Worker processes of a TorchRL collector (its collector or env processes)."""
    procs = getattr(collector, "procs", None)
    if procs:
        return [p.pid for p in procs]
    env = getattr(collector, "env", None)
    return [p.pid for p in getattr(env, "_workers", [])]


def run_task(task: dict) -> dict:
    """Dispatch a worker task by its ``mode``."""
    fn = {"cell": cell_worker, "footprint": footprint_worker, "torchrl": torchrl_worker}
    return fn[task["mode"]](task)
