#!/usr/bin/env python3
"""Sampling from a StreamStorage: batches per CPU second, for comparing two checkouts (the
row layout changed from lane-major to slot-major; gathers may be more scattered now).

    .venv/bin/python bench/stream_sampling.py [--reps 7] [--label new]

Prints one JSON line: ``{label, rlstash file, case: batches per CPU second (median)}``. Run it
alternately under each checkout (``PYTHONPATH=<checkout>``, from outside the worktree) on the
same machine; CPU time (``time.process_time``) so that other users' load counts less. Cases:

- ``cartpole-4096-uniform``: 4096 lanes of 64 slots of CartPole steps (obs 4 float32), the
  ring wrapped, uniform batches of 256 through a ReplayBuffer (a collector's stream).
- ``cartpole-4096-seq8``: the same stream, SequenceSampler windows of 8 steps, 32 per batch.
- ``pixels-8-stack4``: 8 lanes of 84x84 uint8 frames (12,500 slots each), 4-frame stacks
  rebuilt on read, uniform batches of 32 (Atari DQN's shape).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

import rlstash.storage.stream as stream_mod
from rlstash.replay import ReplayBuffer
from rlstash.sampler import SequenceSampler
from rlstash.storage.stream import ReadSpec, StreamStorage


def filled(spec: dict, n: int, cap: int, steps: int, obs, reads: ReadSpec) -> StreamStorage:
    """A stream of ``n`` lanes filled with ``steps`` next-step steps (episodes end at random)."""
    store = StreamStorage(spec, n, cap, reads=reads)
    rng = np.random.default_rng(0)
    for t in range(steps):
        store.extend(
            {"obs": obs(t), "action": torch.zeros(n, dtype=torch.int64),
             "reward": torch.ones(n), "terminated": torch.from_numpy(rng.random(n) < 0.02),
             "truncated": torch.zeros(n, dtype=torch.bool)}
        )  # fmt: skip
    return store


def cases() -> dict:
    n = 4096
    vec = filled({"obs": ((4,), torch.float32), "action": ((), torch.int64)}, n, n * 64, 100,
                 lambda t: torch.randn(n, 4), ReadSpec())  # fmt: skip
    uni = ReplayBuffer(vec, seed=0)
    seq = ReplayBuffer(vec, sampler=SequenceSampler(8), seed=0)
    px = filled({"obs": ((84, 84), torch.uint8), "action": ((), torch.int64)}, 8, 100_000, 13_000,
                lambda t: torch.full((8, 84, 84), t % 251, dtype=torch.uint8),
                ReadSpec(frame_stack=4))  # fmt: skip
    pix = ReplayBuffer(px, seed=0)
    return {
        "cartpole-4096-uniform": lambda: uni.sample(256),
        "cartpole-4096-seq8": lambda: seq.sample(32),
        "pixels-8-stack4": lambda: pix.sample(32),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    torch.set_num_threads(1)
    runs = cases()
    rates: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(args.reps):  # interleaved
        for name, f in runs.items():
            k, t0 = 0, time.process_time()
            while time.process_time() - t0 < 0.3:
                f()
                k += 1
            rates[name].append(k / (time.process_time() - t0))
    out = {"label": args.label, "rlstash": stream_mod.__file__}
    out.update({k: round(float(np.median(v)), 1) for k, v in rates.items()})
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
