#!/usr/bin/env python3
"""Ray collection benchmark: RayCollector against the local process pool, and what Ray costs.

    unshare -n sh -c 'ip link set lo up && exec .venv-bench/bin/python bench/ray_collect.py'
        [--quick] [--reps N] [--out bench/results/ray_collect.md] [--soak-s S]

Needs ``ray`` (``pip install -e '.[ray]'``; ``mujoco`` and ``ale-py`` for the HalfCheetah and
Atari rows). It starts a private single-node Ray and must run in a network namespace that has
nothing but loopback (it refuses otherwise), so nothing leaves the machine.

1. Steps/s of the same CPU policy (MLP 64-64) over K = 1, 2, 4 actors of n envs each
   (``RayCollector``, envs in the actor's process) against ``Collector`` over a local
   ``ProcessPoolVectorEnv`` of the same K * n envs with K worker processes, and against the
   in-process pool (one process: the single-machine reference). All collectors live at once
   and are timed interleaved, rotating order, medians of ``--reps`` repetitions; before each
   repetition the two chunks a Ray actor may hold ready are drained untimed.
2. Object-store cost per batch: an actor returns a prebuilt chunk (CartPole, HalfCheetah,
   Atari 84x84x4 layouts) and the driver ``ray.get``s it, against a plain copy of the same
   bytes (the physical limit) and pickle + unpickle (a pipe transport).
3. Bytes per env step that leave an actor: computed from the chunk layout (obs, action,
   reward, two flags; plus ``next_obs`` per chunk), and measured as the serialized size of
   real replies (``pickle`` protocol 5 with out-of-band buffers, what Ray ships).
4. Object-store usage over a longer run (``--soak-s`` seconds of collection with a weights
   update every batch), sampled from Ray's memory summary: it must stay flat.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import pickle
import re
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from common import fmt_bytes, fmt_rate, fmt_ratio, header_lines, machine_info, markdown_table  # noqa: E402

from rlstash.collect.ray import RayCollector  # noqa: E402
from rlstash.collect.sync import Collector  # noqa: E402
from rlstash.envs import ProcessPoolVectorEnv  # noqa: E402
from rlstash.storage.stream import StreamStorage  # noqa: E402

MiB = 1024**2


class MLP(torch.nn.Module):
    """The CPU policy every collector runs: 64-64 MLP, argmax (discrete) or tanh (continuous)."""

    def __init__(self, obs_dim: int, out: int, discrete: bool) -> None:
        super().__init__()
        self.discrete = discrete
        self.net = torch.nn.Sequential(
            torch.nn.Linear(obs_dim, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
            torch.nn.Tanh(), torch.nn.Linear(64, out),
        )  # fmt: skip

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        y = self.net(obs.float())
        return y.argmax(-1) if self.discrete else torch.tanh(y)


ENVS = {  # env id -> (obs dim, policy outputs, discrete, envs per actor, steps per chunk)
    "CartPole-v1": (4, 2, True, 8, 64),
    "HalfCheetah-v5": (17, 6, False, 4, 64),
}


def atari_env():
    """ALE Pong with the DQN preprocessing: 84x84 grey frames, 4 stacked (uint8 [4, 84, 84])."""
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)
    env = gym.make("ALE/Pong-v5", frameskip=1)
    env = gym.wrappers.AtariPreprocessing(env, frame_skip=4, screen_size=84)
    return gym.wrappers.FrameStackObservation(env, 4)


class RandomDiscrete(torch.nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.randint(self.n, (len(obs),))


def loopback_only() -> bool:
    return sorted(n for _, n in socket.if_nameindex()) == ["lo"]


# --- 1. throughput ------------------------------------------------------------------------
def make_runs(env_id: str, ks: list[int]) -> dict[str, tuple[object, int]]:
    obs_dim, out, discrete, n, T = ENVS[env_id]
    factory = functools.partial(MLP, obs_dim, out, discrete)
    runs: dict[str, tuple[object, int]] = {}
    for K in ks:
        ray_c = RayCollector(env_id, factory, K, n, T * K * n, seed=0)
        runs[f"Ray, {K} actor(s) x {n} envs"] = (ray_c, K * n * T)
        pool = ProcessPoolVectorEnv(env_id, num_envs=K * n, num_workers=K, seed=0)
        runs[f"local pool, {K} worker(s) x {n} envs"] = (Collector(pool, factory(), K * n * T), K * n * T)  # fmt: skip
    pool0 = ProcessPoolVectorEnv(env_id, num_envs=n, num_workers=0, seed=0)
    runs[f"in-process, {n} envs (1 process)"] = (Collector(pool0, factory(), n * T), n * T)
    return runs


DRIVER: dict[str, list[float]] = {}  # config -> seconds per collect() when the chunks were ready


def time_runs(
    runs: dict[str, tuple[object, int]], reps: int, batches: int
) -> dict[str, list[float]]:
    rates: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for c, _ in runs.values():
        c.collect()  # start-up (actors build envs and policy) outside the timing
    for rep in range(reps):
        k = rep % len(names)
        for name in names[k:] + names[:k]:
            c, frames = runs[name]
            if isinstance(c, RayCollector):
                time.sleep(0.2)  # let every actor finish the chunks it may run ahead
                t0 = time.perf_counter()
                c.collect()  # chunks that were ready ahead: not collected in this window
                DRIVER.setdefault(name, []).append(time.perf_counter() - t0)
                c.collect()
            t0 = time.perf_counter()
            for _ in range(batches):
                c.collect()
            rates[name].append(batches * frames / (time.perf_counter() - t0))
    return rates


def close_runs(runs: dict[str, tuple[object, int]]) -> None:
    for c, _ in runs.values():
        if isinstance(c, RayCollector):
            c.close()
        else:
            c.env.close()


def throughput(env_id: str, ks: list[int], reps: int, batches: int) -> str:
    runs = make_runs(env_id, ks)
    try:
        rates = time_runs(runs, reps, batches)
    finally:
        close_runs(runs)
    med = {k: statistics.median(v) for k, v in rates.items()}
    base = next(v for k, v in med.items() if k.startswith("in-process"))
    rows = []
    for K in ks:
        r = next(v for k, v in med.items() if k.startswith(f"Ray, {K} "))
        p = next(v for k, v in med.items() if k.startswith(f"local pool, {K} "))
        name = f"Ray, {K} actor(s) x {ENVS[env_id][3]} envs"
        spread = max(rates[name]) / r - 1
        drv = statistics.median(DRIVER[name]) / (K * ENVS[env_id][3] * ENVS[env_id][4])
        rows.append([env_id, K, K * ENVS[env_id][3], fmt_rate(r), fmt_rate(p), fmt_ratio(r / p), fmt_ratio(r / base), f"{spread:.0%}", f"{drv * 1e6:.2f} µs ({fmt_rate(1 / drv)}/s)"])  # fmt: skip
    rows.append(
        [env_id, "—", ENVS[env_id][3], "—", "—", "—", f"{fmt_rate(base)} (1.00x)", "—", "—"]
    )
    return markdown_table(
        [
            "env",
            "actors K",
            "envs",
            "Ray steps/s",
            "local pool steps/s",
            "Ray / pool",
            "Ray / in-process",
            "Ray spread (max / median - 1)",
            "driver per env step, chunks ready (its limit)",
        ],  # fmt: skip
        rows,
    )


# --- 2. object-store cost per batch -------------------------------------------------------
LAYOUTS = {  # name -> (obs shape, obs dtype, action shape, action dtype, n envs, T)
    "CartPole-v1": ((4,), np.float32, (), np.int64, 8, 64),
    "HalfCheetah-v5": ((17,), np.float64, (6,), np.float32, 4, 64),
    "Atari 84x84x4": ((4, 84, 84), np.uint8, (), np.int64, 8, 32),
}


def chunk_of(layout: tuple) -> dict[str, np.ndarray]:
    obs_shape, obs_dtype, act_shape, act_dtype, n, T = layout
    rng = np.random.default_rng(0)
    return {
        "obs": rng.integers(0, 255, (T, n, *obs_shape)).astype(obs_dtype),
        "action": np.zeros((T, n, *act_shape), act_dtype),
        "reward": np.zeros((T, n), np.float32),
        "terminated": np.zeros((T, n), bool),
        "truncated": np.zeros((T, n), bool),
    }


def step_bytes(layout: tuple) -> tuple[int, int]:
    """(bytes per env step of the chunk fields, bytes of next_obs per chunk)."""
    obs_shape, obs_dtype, act_shape, act_dtype, n, T = layout
    obs = int(np.prod(obs_shape)) * np.dtype(obs_dtype).itemsize
    act = int(np.prod(act_shape, dtype=np.int64)) * np.dtype(act_dtype).itemsize
    return obs + act + 4 + 1 + 1, n * obs


def serialized_size(obj: object) -> int:
    bufs: list[pickle.PickleBuffer] = []
    head = pickle.dumps(obj, protocol=5, buffer_callback=bufs.append)
    return len(head) + sum(b.raw().nbytes for b in bufs)


def store_cost(reps: int) -> str:
    import ray

    @ray.remote(num_cpus=0)
    class Holder:
        def __init__(self, chunk):
            self.chunk = chunk

        def get(self):
            return self.chunk

    rows = []
    for name, layout in LAYOUTS.items():
        chunk = chunk_of(layout)
        nbytes = sum(v.nbytes for v in chunk.values())
        holder = Holder.remote(chunk)
        ray.get(holder.get.remote())

        def via_ray(holder=holder):
            out = ray.get(holder.get.remote())
            return np.concatenate([out["obs"]], axis=1)  # the driver's copy into the batch

        def plain(chunk=chunk):
            return np.concatenate([chunk["obs"]], axis=1), {k: v.copy() for k, v in chunk.items()}

        def piped(chunk=chunk):
            return pickle.loads(pickle.dumps(chunk, protocol=5))

        t = {}
        for label, fn in (("ray", via_ray), ("copy", plain), ("pickle", piped)):
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                for _ in range(20):
                    fn()
                times.append((time.perf_counter() - t0) / 20)
            t[label] = statistics.median(times)
        per_step, _ = step_bytes(layout)
        T, n = layout[5], layout[4]
        rows.append([
            name, f"{T} x {n}", fmt_bytes(nbytes), f"{t['ray'] * 1e3:.2f} ms",
            f"{t['copy'] * 1e3:.3f} ms", f"{t['pickle'] * 1e3:.3f} ms",
            f"{(t['ray'] - t['copy']) / (T * n) * 1e6:.2f} µs", f"{nbytes / t['ray'] / 1e9:.2f} GB/s",
        ])  # fmt: skip
        ray.kill(holder)
    return markdown_table(
        [
            "layout",
            "chunk T x n",
            "chunk bytes",
            "actor -> driver (ray.get)",
            "plain copy",
            "pickle round trip",
            "Ray overhead per env step",
            "Ray GB/s",
        ],  # fmt: skip
        rows,
    )


def network_bytes(have_mujoco: bool, have_ale: bool) -> str:
    rows = []
    measured = measured_reply_bytes(have_mujoco, have_ale)
    for name, layout in LAYOUTS.items():
        per_step, per_chunk = step_bytes(layout)
        T, n = layout[5], layout[4]
        computed = per_step + per_chunk / (T * n)
        got = measured.get(name)
        rows.append([
            name, per_step, f"{per_chunk} per chunk", f"{computed:.1f}",
            f"{got:.1f}" if got else "not measured (package missing)",
            f"{computed * 1e6 / 1e9 * 8:.2f} Gbit/s" ,
        ])  # fmt: skip
    return markdown_table(
        [
            "layout",
            "B per env step (fields)",
            "next_obs",
            "B per env step, computed",
            "B per env step, measured",
            "at 1M env steps/s",
        ],  # fmt: skip
        rows,
    )


def measured_reply_bytes(have_mujoco: bool, have_ale: bool) -> dict[str, float]:
    """Serialized size of real RayCollector replies per env step (one chunk each)."""
    import ray

    from rlstash.collect.ray_actor import ChunkActor

    cases = {"CartPole-v1": ("CartPole-v1", functools.partial(MLP, 4, 2, True))}
    if have_mujoco:
        cases["HalfCheetah-v5"] = ("HalfCheetah-v5", functools.partial(MLP, 17, 6, False))
    if have_ale:
        cases["Atari 84x84x4"] = (atari_env, functools.partial(RandomDiscrete, 6))
    out = {}
    remote = ray.remote(ChunkActor).options(runtime_env={"env_vars": {"CUDA_VISIBLE_DEVICES": ""}})
    for name, (env, policy) in cases.items():
        n, T = LAYOUTS[name][4], LAYOUTS[name][5]
        actor = remote.remote(env, policy, n, 0)
        reply = ray.get(actor.collect.remote([], 0, T, 0))
        out[name] = serialized_size(reply) / (T * n)
        ray.kill(actor)
    return out


# --- 4. object store over a longer run ----------------------------------------------------
def store_used() -> tuple[float, int]:
    """(MiB in the object store, objects) from Ray's memory summary."""
    import ray
    from ray._private.internal_api import memory_summary

    text = memory_summary(address=ray.get_runtime_context().gcs_address, stats_only=True)
    m = re.search(r"Plasma memory usage (\d+) MiB, (\d+) objects", text)
    return (float(m.group(1)), int(m.group(2))) if m else (float("nan"), -1)


def soak(seconds: float) -> str:
    """CartPole with chunks of 1024 steps x 8 envs (240 KiB: larger than Ray's 100 KiB inline
    limit, so every chunk goes through the object store), a weights update every batch."""
    env_id = "CartPole-v1"
    obs_dim, out, discrete, n, _ = ENVS[env_id]
    T = 1024
    policy = MLP(obs_dim, out, discrete)
    c = RayCollector(
        env_id, functools.partial(MLP, obs_dim, out, discrete), 2, n, 2 * n * T, seed=0
    )
    spec = {"obs": ((obs_dim,), torch.float32), "action": ((), torch.int64)}
    store = StreamStorage(spec, 2 * n, 2 * n * 4096)
    extend_s = 0.0
    samples = []
    try:
        c.collect()  # start-up outside the soak
        t0 = time.monotonic()
        batches = 0
        next_sample = 0.0
        while time.monotonic() - t0 < seconds:
            batch = c.collect()
            t1 = time.perf_counter()
            store.extend(batch)
            extend_s += time.perf_counter() - t1
            c.update_policy_weights(policy.state_dict())
            batches += 1
            if time.monotonic() - t0 >= next_sample:
                rss = psutil.Process().memory_info().rss
                samples.append((time.monotonic() - t0, batches, *store_used(), rss))
                next_sample += max(1.0, seconds / 10)
    finally:
        c.close()
        store.close()
    per_step = extend_s / max(1, batches * 2 * n * T)
    rows = [
        [f"{t:.0f}", b, f"{b * 2 * n * T:,}", f"{mib:.0f} MiB", objs, fmt_bytes(rss)]
        for t, b, mib, objs, rss in samples
    ]
    table = markdown_table(
        ["seconds", "batches", "env steps", "object store used", "objects", "driver RSS"], rows
    )
    return table + (
        f"\n\nStreamStorage.extend of these batches in the driver: {per_step * 1e6:.2f} µs per env "
        f"step ({fmt_rate(1 / per_step)} env steps/s of one driver thread)."
    )


NOTES = [
    "## Notes",
    "",
    "- Everything here runs on one 2-core machine: K Ray actors, the local pool's workers, the "
    "driver and Ray's own processes share the same two cores, so these rows measure Ray's "
    "overhead, not a cluster's scaling; on a cluster each actor brings its own cores and "
    "steps/s add up until the driver's limit (last column) or the network.",
    "- 'driver per env step, chunks ready': the time of a `collect()` whose chunks were all "
    "waiting (ray.wait, ray.get out of the object store, concatenation into the [T, N] batch), "
    "divided by its env steps: the most one driver thread can assemble, before the learner's "
    "work and `StreamStorage.extend` (measured in the soak).",
    "- Bytes per env step, measured: the pickle protocol-5 size (out-of-band buffers included) "
    "of real actor replies of one chunk (CartPole and HalfCheetah with the MLP policy; Atari: "
    "ALE Pong with AtariPreprocessing and a 4-frame stack, random actions), divided by its env "
    "steps; this is what Ray ships between nodes. Weights add one policy state per version "
    "and actor.",
    "- RLlib's env runners were not measured: `ray[rllib]` 2.60 pins gymnasium==1.2.2 while "
    "rlstash runs on gymnasium 1.4, so it needs an environment of its own, and its runners "
    "step its own RLModule policy stack; not attempted in this session.",
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions, short soak")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--soak-s", type=float, default=120.0)
    ap.add_argument("--out", default=str(HERE / "results" / "ray_collect.md"))
    args = ap.parse_args()
    if not loopback_only():
        sys.exit("bench/ray_collect.py: run it in a loopback-only network namespace: "
                 "unshare -n sh -c 'ip link set lo up && exec python bench/ray_collect.py'")  # fmt: skip
    reps, batches, soak_s = (3, 3, 20.0) if args.quick else (args.reps, 6, args.soak_s)
    import ray

    torch.set_num_threads(1)  # as in every actor: one thread per policy copy
    have_mujoco = importlib.util.find_spec("mujoco") is not None
    have_ale = importlib.util.find_spec("ale_py") is not None
    info = machine_info()
    info["ray"] = ray.__version__
    tmp = tempfile.mkdtemp(prefix="rb", dir="/tmp")  # Ray's files, removed at the end
    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False,
             object_store_memory=256 * MiB, _temp_dir=tmp)  # fmt: skip
    start = time.time()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = " ".join(["python bench/ray_collect.py", *sys.argv[1:]])
    parts = ["# Ray collection (bench/ray_collect.py)", "", *header_lines(info), ""]
    parts += [f"Command: `unshare -n sh -c 'ip link set lo up && exec {cmd}'` ({reps} interleaved repetitions of {batches} batches per collector, medians; one private single-node Ray, all on this 2-core machine, shared with other work: ratios from one process are the result).", ""]  # fmt: skip

    def add(*lines: str) -> None:  # written as it goes: a failed section keeps the others
        parts.extend(lines)
        out.write_text("\n".join(parts) + "\n")
        print("\n".join(lines), flush=True)

    try:
        add("## Steps/s: RayCollector vs the local process pool (same policy, same envs)", "")
        for env_id in ["CartPole-v1"] + (["HalfCheetah-v5"] if have_mujoco else []):
            add(throughput(env_id, [1, 2, 4], reps, batches), "")
        add("## Object store per batch (same node)", "", store_cost(reps), "")
        add("## Bytes per env step leaving an actor", "", network_bytes(have_mujoco, have_ale), "")
        add(
            "## Object store over a longer run (2 actors, weights every batch)",
            "",
            soak(soak_s),
            "",
        )
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    add(*NOTES, "")
    add(f"Wall time {time.time() - start:.0f} s; load average at the end {os.getloadavg()[0]:.2f}.")
    print(f"[ray_collect] wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
