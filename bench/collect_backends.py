#!/usr/bin/env python3
"""Issue 27's table: the library default layout, EnvPool alone and EnvPool through rlstash's
collectors into a StreamStorage, against the one-process loop, interleaved, medians.

    .venv/bin/python bench/collect_backends.py [--envs CartPole-v1,HalfCheetah-v5,Burn-200us]
        [--n 32] [--reps 5] [--target-s 0.3] [--out bench/results/collect_backends.md]

Runs in the project's ``.venv`` with ``pip install 'rlstash[envpool,mujoco]'`` (EnvPool is an
rlstash extra, not only a peer). Each cell (env, N) runs in a fresh process; its peers are
built first, then timed interleaved (``common.interleaved``: one repetition of each in turn,
rotating, medians), with the other users' load recorded (``common.cpu_meter``). Random
actions from one numpy sampler for every peer. Rates are env steps/s; a ratio is to the raw
loop of the same cell (gymnasium envs stepped one after the other in this process).

Peers:

* ``raw``: the one-process loop; ``rlstash-w2``: ``ProcessPoolVectorEnv(num_workers=2,
  caller_envs=0)``; ``rlstash-w1c``: 1 worker + N // 2 envs in the caller; ``rlstash-default``:
  ``ProcessPoolVectorEnv(id, N)`` with no layout argument (the rule,
  :func:`rlstash.envs.auto.default_layout`);
* ``envpool``: ``envpool.make_gymnasium(id, num_envs=N, num_threads=C)`` stepped alone;
  ``envpool-async``: the same with ``batch_size=N/2`` (recv/send of ready envs);
* ``rlstash-envpool-stream``: :class:`rlstash.EnvPoolVectorEnv` under :class:`rlstash.Collector`
  (frames of 8 steps) into a :class:`~rlstash.storage.stream.StreamStorage` of N lanes;
  ``rlstash-envpool-async-stream``: ``EnvPoolVectorEnv(batch_size=N/2)`` under
  :class:`~rlstash.collect.async_batches.AsyncBatchCollector` into the same storage.

* ``rlstash-pool-async``: ``ProcessPoolVectorEnv(id, N, batch_size=N/2)`` (its default async
  layout: max(C, 2) workers, every env in a worker) stepped alone with ``recv``/``send``, to
  set beside ``rlstash-w2`` (the same workers, synchronous); ``rlstash-pool-stream`` /
  ``rlstash-pool-async-stream``: those two pools under :class:`rlstash.Collector` /
  ``AsyncBatchCollector`` into the StreamStorage.

* ``puffer-w2`` / ``puffer-w2-b16``: ``pufferlib.vector.Multiprocessing`` (pufferlib-core
  3.0.23) with one worker per core, synchronous (batch N) and asynchronous (batch N/2, its
  recommended layout), each env a ``GymnasiumPufferEnv``. PufferLib pins torch 2.9, so it
  gets a venv of its own that sees the project's ``.venv`` through a ``.pth`` line and has
  only pufferlib-core installed with ``--no-deps``::

      python3 -m venv .venv-puffer
      echo "import site; site.addsitedir('$PWD/.venv/lib/python3.11/site-packages')" \
          > .venv-puffer/lib/python3.11/site-packages/zz_rlstash_venv.pth
      .venv-puffer/bin/pip install --no-deps pufferlib-core==3.0.23
      .venv-puffer/bin/python bench/collect_backends.py

EnvPool has no Burn env: its cells are empty there. torch runs one thread (the collectors'
tensor ops are few; idle OpenMP threads would spin against EnvPool's threads).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

ENVS = {
    "CartPole-v1": "CartPole-v1",
    "HalfCheetah-v5": "HalfCheetah-v5",
    "Burn-200us": "rlstash.envs.testing:rlstash/Burn-v0",
    "Pong-atari": "ALE/Pong-v5",  # rlstash's Atari training env (rlstash.envs.atari) on both sides
    "Breakout-atari": "ALE/Breakout-v5",
}


def gym_env(env_id: str):
    """The gymnasium side of ``env_id``: rlstash's preprocessed training env for ALE ids."""
    from rlstash.envs.atari import is_atari, make_atari
    from rlstash.envs.registry import make

    return make_atari(env_id, True) if is_atari(env_id) else make(env_id)


def gym_source(env_id: str):
    """What a ProcessPoolVectorEnv is made from: the id, or the Atari factory."""
    import functools

    from rlstash.envs.atari import is_atari

    return functools.partial(gym_env, env_id) if is_atari(env_id) else env_id


PEERS = (
    "raw",
    "rlstash-w2",
    "rlstash-w1c",
    "rlstash-default",
    "envpool",
    "envpool-async",
    "rlstash-envpool-stream",
    "rlstash-envpool-async-stream",
    "puffer-w2",
    "puffer-w2-b16",
    "rlstash-pool-async",
    "rlstash-pool-stream",
    "rlstash-pool-async-stream",
)
PUFFER = ("puffer-w2", "puffer-w2-b16")  # pufferlib.vector.Multiprocessing layouts
T = 8  # steps per Collector batch


def _sampler(space, n: int, seed: int = 0):
    from collect_peers import action_sampler

    return action_sampler(space, n, seed)


def _raw(env_id: str, n: int):

    envs = [gym_env(env_id) for _ in range(n)]
    for i, e in enumerate(envs):
        e.reset(seed=i)
    sample = _sampler(envs[0].action_space, n)

    def run(k: int) -> None:
        for _ in range(k):
            acts = sample()
            for e, a in zip(envs, acts):
                _, _, term, trunc, _ = e.step(a)
                if term or trunc:
                    e.reset()

    return run, lambda: [e.close() for e in envs]


def _pool(env_id: str, n: int, **layout):
    from rlstash.envs import ProcessPoolVectorEnv

    pool = ProcessPoolVectorEnv(gym_source(env_id), n, seed=0, **layout)
    pool.reset()
    sample = _sampler(pool.single_action_space, n)

    def run(k: int) -> None:
        for _ in range(k):
            pool.step(sample())

    return run, pool.close, f"{pool.num_workers} workers + {pool.caller_envs} in the caller"


def _envpool(env_id: str, n: int, threads: int, batch: int | None = None):
    import numpy as np

    from rlstash.envs.envpool_env import EnvPoolVectorEnv, import_envpool, task_id

    envpool = import_envpool()
    kw = {"batch_size": batch} if batch else {}
    pool = envpool.make_gymnasium(task_id(env_id), num_envs=n, seed=0, num_threads=threads, **kw)
    space = EnvPoolVectorEnv  # noqa: F841 - the adapter module imported alike for every peer
    act = pool.action_space
    sample = _sampler(act, n)
    dtype = act.dtype
    if batch is None:
        pool.reset()

        def run(k: int) -> None:
            for _ in range(k):
                pool.step(np.asarray(sample(), dtype=dtype))

        return run, pool.close
    pool.async_reset()
    per = n // batch

    def run_async(k: int) -> None:
        for _ in range(k * per):
            info = pool.recv()[4]
            ids = info["env_id"]
            pool.send(np.asarray(sample()[: len(ids)], dtype=dtype), ids)

    return run_async, pool.close


def puffer_env(env_id: str, buf=None, seed: int = 0):
    """One gymnasium env as PufferLib emulates it (module level: its workers unpickle it)."""
    import pufferlib.emulation

    env = gym_env(env_id)
    return pufferlib.emulation.GymnasiumPufferEnv(env=env, buf=buf, seed=seed)


def _puffer(env_id: str, n: int, workers: int, batch: int):
    """pufferlib.vector.Multiprocessing: ``workers`` processes, ``recv`` of ``batch`` envs."""
    import numpy as np
    import pufferlib.vector

    vec = pufferlib.vector.make(
        puffer_env, env_kwargs={"env_id": env_id}, backend=pufferlib.vector.Multiprocessing,
        num_envs=n, num_workers=workers, batch_size=batch, overwork=True,
    )  # fmt: skip
    vec.async_reset(0)
    space = vec.single_action_space
    sample = _sampler(space, batch)
    per = n // batch

    def run(k: int) -> None:
        for _ in range(k * per):
            vec.recv()
            vec.send(np.asarray(sample(), dtype=space.dtype))

    return run, vec.close


def _stream(env, n: int, lane: int = 4096):
    from rlstash.storage.stream import StreamStorage
    from rlstash.storage.stream_spec import ReadSpec
    from rlstash.train.run import step_spec

    spec = step_spec(env.single_observation_space, env.single_action_space)
    if getattr(env, "atari", False):  # stacks of 4 frames in, single frames stored
        return StreamStorage(spec, n, n * 512, reads=ReadSpec(frame_stack=4), stacked_input=True)
    return StreamStorage(spec, n, n * lane)


def _envpool_stream(env_id: str, n: int, threads: int, batch: int | None = None):
    from rlstash.envs.envpool_env import EnvPoolVectorEnv

    env = EnvPoolVectorEnv(env_id, n, seed=0, num_threads=threads, batch_size=batch)
    return _stream_runner(env, n, batch)


def _pool_async(env_id: str, n: int, batch: int):
    import numpy as np

    from rlstash.envs import ProcessPoolVectorEnv

    pool = ProcessPoolVectorEnv(gym_source(env_id), n, seed=0, batch_size=batch)
    sample = _sampler(pool.single_action_space, n)
    pool.async_reset()

    def run(k: int) -> None:
        for _ in range(k * (n // batch)):
            ids = pool.recv()[4]["env_id"]
            pool.send(np.asarray(sample()[: len(ids)]), ids)

    return run, pool.close, f"{pool.num_workers} workers, batch {batch}"


def _pool_stream(env_id: str, n: int, batch: int | None, **layout):
    from rlstash.envs import ProcessPoolVectorEnv

    pool = ProcessPoolVectorEnv(gym_source(env_id), n, seed=0, batch_size=batch, **layout)
    return _stream_runner(pool, n, batch)


def _stream_runner(env, n: int, batch: int | None):
    """(run(k), close) of random actions from ``env`` into a stream replay: the synchronous
    Collector (k operations of T steps; the rate is scaled by T) or, with ``batch``, the
    AsyncBatchCollector (k * n env steps)."""
    import torch

    from rlstash.collect.async_batches import AsyncBatchCollector
    from rlstash.collect.sync import Collector

    store = _stream(env, n)
    sample = _sampler(env.single_action_space, n)
    if batch is None:
        collector = Collector(env, lambda obs: torch.as_tensor(sample()), n * T, device="cpu")
        collector.reset(seed=0)

        def run(k: int) -> None:
            for _ in range(k):
                collector.collect_into(store)

        return run, env.close
    async_collector = AsyncBatchCollector(env, lambda obs, ids: sample()[: len(ids)])

    def run_async(k: int) -> None:
        async_collector.collect_into(store, steps=k * n)

    return run_async, env.close


def cell(env_name: str, n: int, reps: int, target_s: float, peers: tuple = PEERS) -> dict:
    """Build every peer of one cell, time them interleaved; rates in env steps/s."""
    import common
    import torch

    from rlstash.envs.cpus import usable_cpus
    from rlstash.envs.envpool_env import supported

    torch.set_num_threads(1)  # the collectors' few tensor ops; no OpenMP threads spinning
    env_id, cores = ENVS[env_name], usable_cpus()
    runs, closers, notes, errors = {}, [], {}, {}
    steps_per_op: dict[str, int] = {}
    for peer in peers:
        try:
            if peer in PUFFER and importlib.util.find_spec("pufferlib") is None:
                errors[peer] = "pufferlib not installed (run under .venv-puffer, see the docstring)"
                continue
            if peer.startswith("envpool") or "envpool" in peer:
                if not supported(env_id):
                    errors[peer] = "EnvPool has no such env"
                    continue
            if peer == "raw":
                run, close = _raw(env_id, n)
            elif peer == "rlstash-w2":
                run, close, notes[peer] = _pool(env_id, n, num_workers=cores, caller_envs=0)
            elif peer == "rlstash-w1c":
                run, close, notes[peer] = _pool(
                    env_id, n, num_workers=max(1, cores - 1), caller_envs=n // cores
                )
            elif peer == "rlstash-default":
                run, close, notes[peer] = _pool(env_id, n)
            elif peer == "envpool":
                run, close = _envpool(env_id, n, cores)
            elif peer == "envpool-async":
                run, close = _envpool(env_id, n, cores, n // 2)
            elif peer in PUFFER:
                batch = n if peer == "puffer-w2" else n // 2
                run, close = _puffer(env_id, n, cores, batch)
            elif peer == "rlstash-pool-async":
                run, close, notes[peer] = _pool_async(env_id, n, n // 2)
            elif peer == "rlstash-pool-stream":
                run, close = _pool_stream(env_id, n, None, num_workers=cores, caller_envs=0)
            elif peer == "rlstash-pool-async-stream":
                run, close = _pool_stream(env_id, n, n // 2)
            elif peer == "rlstash-envpool-stream":
                run, close = _envpool_stream(env_id, n, cores)
            else:
                run, close = _envpool_stream(env_id, n, cores, n // 2)
        except Exception as exc:  # noqa: BLE001 - the table says why
            errors[peer] = f"{type(exc).__name__}: {exc}"[:200]
            continue
        runs[peer], closers = run, [*closers, close]
        if peer in ("rlstash-pool-stream", "rlstash-envpool-stream"):
            steps_per_op[peer] = T  # one operation is one Collector batch of T steps
    try:
        from collect_peers import _exclude_descendants

        with common.cpu_meter() as meter:
            _exclude_descendants(meter)  # the pools' workers are ours, not others' load
            timings = common.interleaved(runs, reps=reps, target_s=target_s)
    finally:
        for close in closers:
            close()
    rates = {k: t.median * n * steps_per_op.get(k, 1) for k, t in timings.items()}
    spread = {k: (max(t.rates) - min(t.rates)) / t.median for k, t in timings.items()}
    return {
        "env": env_name, "n": n, "rates": rates, "spread": spread, "notes": notes,
        "errors": errors, "others_load": getattr(meter, "others", None),
    }  # fmt: skip


def render(cells: list[dict], info: dict, args: argparse.Namespace) -> str:
    import common

    peers = tuple(p for p in PEERS if p in args.peers.split(","))
    lines = [
        f"{'##' if args.section else '#'} "
        + (
            args.section
            or "Collection backends: the default layout, EnvPool, EnvPool into a StreamStorage"
        ),
        "",
        f"`{args.python} bench/collect_backends.py --envs {args.envs} --n {args.n} "
        f"--reps {args.reps} --target-s {args.target_s}"
        + (f" --peers {args.peers}" if args.peers != ",".join(PEERS) else "")
        + "` "
        "(issue 27). `others' load` below is the cores other processes used during each "
        "cell (above 0.5: a loaded machine, whose absolute rates are not a quiet one's); "
        "ratios within a cell are interleaved medians.",
        "",
        *common.header_lines(info),
        "",
        "Env steps/s, median of the interleaved repetitions (ratio to the one-process loop).",
        "",
        "`spread`: (max - min) / median of a peer's repetitions, the median over the cell's "
        "peers: the noise of the cell. `rlstash-w1c` and `rlstash-default` are the same layout "
        "on 2 cores (1 worker + 16 envs in the caller): their difference is noise too.",
        "",
        "| env | N | " + " | ".join(peers) + " | others' load (cores) | spread |",
        "| --- | ---: | " + " | ".join("---:" for _ in peers) + " | ---: | ---: |",
    ]
    for c in cells:
        raw = c["rates"].get("raw")
        row = [common.rate_cell(c["rates"].get(p), raw) for p in peers]
        load = c.get("others_load")
        load_text = "?" if load is None else f"{load:.2f}"
        spread = sorted(c["spread"].values())
        mid = f"{100 * spread[len(spread) // 2]:.0f}%" if spread else "?"
        lines.append(f"| {c['env']} | {c['n']} | " + " | ".join(row) + f" | {load_text} | {mid} |")
    lines += ["", f"{'###' if args.section else '##'} Goals (issue 27)", ""]
    for c in cells:
        r = c["rates"]
        best = max(r.get("rlstash-w2", 0), r.get("rlstash-w1c", 0))
        if best and "rlstash-default" in r:
            ratio = r["rlstash-default"] / best
            verdict = "PASS" if ratio >= 0.95 else "FAIL"
            lines.append(
                f"- {verdict}: {c['env']} {c['n']} envs: library default "
                f"({c['notes'].get('rlstash-default')}) {ratio:.2f}x the best layout (goal >= 0.95x)"
            )
        for mine, peer in (
            ("rlstash-envpool-stream", "envpool"),
            ("rlstash-envpool-async-stream", "envpool-async"),
            ("rlstash-pool-async", "rlstash-w2"),
            ("rlstash-pool-async-stream", "rlstash-pool-stream"),
        ):
            if mine in r and peer in r:
                ratio = r[mine] / r[peer]
                if "envpool" not in mine:  # no goal: async against sync, same workers
                    lines.append(f"- {c['env']} {c['n']} envs: {mine} {ratio:.2f}x {peer}")
                    continue
                verdict = "PASS" if ratio >= 0.9 else "FAIL"
                lines.append(
                    f"- {verdict}: {c['env']} {c['n']} envs: {mine} {ratio:.2f}x {peer} alone "
                    "(goal >= 0.9x)"
                )
    errs = [(c["env"], p, e) for c in cells for p, e in c["errors"].items()]
    if errs:
        lines += ["", "Not run:", ""] + [f"- {env} {p}: {e}" for env, p, e in errs]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--envs", default=",".join(ENVS))
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--target-s", type=float, default=0.3)
    ap.add_argument("--out", default=str(HERE / "results" / "collect_backends.md"))
    ap.add_argument("--cell", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--rerender", default=None, help="a run's log: the table again from it")
    ap.add_argument("--peers", default=",".join(PEERS), help="the peers to run (comma list)")
    ap.add_argument("--section", default="", help="append as a section of --out with this title")
    args = ap.parse_args()
    args.python = f"{Path(sys.executable).parent.parent.name}/bin/python"
    if args.cell:
        peers = tuple(p for p in PEERS if p in args.peers.split(","))
        print(json.dumps(cell(args.cell, args.n, args.reps, args.target_s, peers)))
        return 0
    import common

    cells = []
    if args.rerender:
        info: dict = {}  # the run's own machine lines (its header, before the table)
        for line in Path(args.rerender).read_text().splitlines():
            if line.startswith('{"env"'):
                cells.append(json.loads(line))
            elif line.startswith("| env"):
                break
            elif line.startswith("- ") and ": " in line:
                key, _, value = line[2:].partition(": ")
                info[key] = value
        text = render(cells, info, args)
        out = Path(args.out)
        if args.section and out.exists():
            text = out.read_text().rstrip("\n") + "\n\n" + text
        out.write_text(text)
        return 0
    for env in args.envs.split(","):
        cmd = [sys.executable, __file__, "--cell", env, "--n", str(args.n),
               "--reps", str(args.reps), "--target-s", str(args.target_s),
               "--peers", args.peers]  # fmt: skip
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=os.environ)
        if out.returncode != 0:
            print(out.stderr[-3000:], file=sys.stderr)
            return 1
        cells.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(cells[-1]), flush=True)
    text = render(cells, common.machine_info(), args)
    out = Path(args.out)
    if args.section and out.exists():  # a dated section below the earlier runs
        text = out.read_text().rstrip("\n") + "\n\n" + text
    out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
