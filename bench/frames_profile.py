#!/usr/bin/env python3
"""Profile of Pong sampling (issue 14): CPU time per batch of 32 of the plain stream, the lz4
stream (per frame) and SB3's uncompressed buffer, and of the lz4 read path's parts.

    python3 bench/frames_profile.py [--rounds 9] [--batches 200]

Builds the Pong buffers of bench/frames.py (the cached 50,000-step collection of
bench/stream.py), then times each callable for ``--batches`` calls per round, in turn, for
``--rounds`` rounds; prints medians of the CPU time of this thread (cyclic GC off) and the
ratio of SB3's time to each. The parts: the sampler alone, the one-step frame window, the
frames decoded (fixed rows: warm caches; fresh rows: as sampled) and the numpy work around
the C decoding (its decoder replaced by a stub that decodes nothing).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def build() -> dict:
    import frames as fb
    import stream as sb

    from rlstash.storage.frames import FrameCompression

    sb.NUM_ENVS = 8
    path = sb.CACHE / "pong-50000-8envs-seed0.npz"
    if not path.exists():
        raise SystemExit(f"{path}: collect it first: python3 bench/stream.py --workloads pong")
    data = sb.load_data({"workload": "pong", "data": str(path)})
    sel = data.select(None)
    peers = {
        "plain": fb.Compressed(data, sel, True, None),
        "lz4": fb.Compressed(data, sel, True, FrameCompression(codec="lz4", budget=0.05)),
    }
    for batch in peers["plain"].batches():
        for p in peers.values():
            p.extend(batch)
    for p in peers.values():
        sb.check_sample(p, data)
    peers["sb3"] = sb.SB3(data, sel, optimize=False)
    return peers


def parts(peers: dict) -> dict:
    """The lz4 read path's parts (module docstring)."""
    store, rb = peers["lz4"].store, peers["lz4"].rb
    arena, backing = store.backing.arenas["obs"], store.backing
    windows = [store.lanes.one_step_window(rb.sampler.sample(32, rb._ctx)[0]) for _ in range(512)]
    fresh, fixed = itertools.cycle(windows), windows[0]
    real = arena._stream

    class Stub:  # decodes nothing, reports success
        def decode(self, srcs, sizes, dsts, room, want):
            return -1, want

        def decode_piece(self, src, dst, room, want):
            return True

    def numpy_only() -> None:
        arena._stream = Stub()
        try:
            backing.gather_frames("obs", fixed, None)
        finally:
            arena._stream = real

    return {
        "lz4: sampler": lambda: rb.sampler.sample(32, rb._ctx),
        "lz4: one-step window": lambda: store.lanes.one_step_window(fixed[:, -2]),
        "lz4: frames, fixed rows": lambda: backing.gather_frames("obs", fixed, None),
        "lz4: frames, fresh rows": lambda: backing.gather_frames("obs", next(fresh), None),
        "lz4: frames, numpy only": numpy_only,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--batches", type=int, default=200)
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    peers = build()
    runs = {k: peer.sample for k, peer in peers.items()}
    runs.update(parts(peers))
    times: dict[str, list[float]] = {k: [] for k in runs}
    gc.disable()
    for _ in range(args.rounds):
        for k, f in runs.items():
            start = time.thread_time()
            for _ in range(args.batches):
                f()
            times[k].append((time.thread_time() - start) / args.batches * 1e6)
    gc.enable()
    sb3 = statistics.median(times["sb3"])
    for k, v in times.items():
        m = statistics.median(v)
        print(f"{k:28s} {m:8.1f} us per batch (min {min(v):7.1f})   SB3 / this {sb3 / m:5.2f}x")
    print(f"load average {[round(x, 2) for x in os.getloadavg()]}")
    return 0


if __name__ == "__main__":
    from bench_venv import ensure_bench_venv

    ensure_bench_venv(__file__)
    sys.exit(main())
