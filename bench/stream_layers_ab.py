#!/usr/bin/env python3
"""A/B of StreamStorage's extend and sample paths between two checkouts, interleaved.

    python3 bench/stream_layers_ab.py --a /work/main --b . [--rounds 9] [--out FILE]

Starts one worker process per checkout (``PYTHONPATH=<checkout>``, run from a temporary
directory so neither shadows the other), each building the same streams once; then, round
after round, tells A and then B (B then A on odd rounds) to time every case once and
reports the median rate of each side and the ratio B / A. Rates are operations per CPU
second of the worker (``time.process_time``), so that other users' load counts less; the
worker runs torch and numpy on one thread.

Cases (next-step steps, episodes end at random, the rings wrapped before timing):

- ``ram-extend-px`` / ``disk-extend-px``: one step of 8 envs of 84x84 uint8 frames into a
  stream of 8 x 2,000 slots (frame_stack 4, n_step 3), RAM and disk backings.
- ``ram-extend-vec-chunk``: a [16, 256] chunk of CartPole-sized steps (obs 4 float32).
- ``ram-direct-vec``: the same chunk written in place (``open_steps(16)``, fill, commit).
- ``ram-gather-px`` / ``disk-gather-px``: 32 transitions (4-frame stacks, 3-step returns,
  next obs) rebuilt by ``gather`` from random valid starts.
- ``ram-gather-vec``: 256 transitions from the CartPole stream (n_step 3).
- ``ram-read-px-1step``: 32 transitions of a 1-step frame-stack stream through ``read``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

WORKER = r"""
import json, sys, tempfile, time
import numpy as np, torch
torch.set_num_threads(1)
from rlstash.storage.stream import ReadSpec, StreamStorage

def step(n, obs, rng):
    return {"obs": obs, "action": torch.zeros(n, dtype=torch.int64), "reward": torch.ones(n),
            "terminated": torch.from_numpy(rng.random(n) < 0.01),
            "truncated": torch.zeros(n, dtype=torch.bool)}

def chunk(T, n, rng):
    return {"obs": torch.randn(T, n, 4), "action": torch.zeros(T, n, dtype=torch.int64),
            "reward": torch.ones(T, n), "terminated": torch.from_numpy(rng.random((T, n)) < 0.01),
            "truncated": torch.zeros(T, n, dtype=torch.bool)}

rng = np.random.default_rng(0)
px_spec = {"obs": ((84, 84), torch.uint8), "action": ((), torch.int64)}
frame = torch.randint(0, 255, (8, 84, 84), dtype=torch.uint8)
tmp = tempfile.mkdtemp(prefix="stream-ab-")
px = {
    "ram": StreamStorage(px_spec, 8, 16_000, reads=ReadSpec(n_step=3, frame_stack=4)),
    "disk": StreamStorage(px_spec, 8, 16_000, "disk", path=tmp + "/d",
                          reads=ReadSpec(n_step=3, frame_stack=4)),
}
one = StreamStorage(px_spec, 8, 16_000, reads=ReadSpec(frame_stack=4))
for s in (*px.values(), one):
    for t in range(2_100):
        s.extend(step(8, frame, rng))
vec = StreamStorage({"obs": ((4,), torch.float32), "action": ((), torch.int64)}, 256, 256 * 64,
                    reads=ReadSpec(n_step=3))
for t in range(5):
    vec.extend(chunk(16, 256, rng))
ck = chunk(16, 256, rng)
flags = torch.from_numpy(rng.random((16, 256)) < 0.01), torch.zeros(16, 256, dtype=torch.bool)
src = {k: v for k, v in ck.items() if k in ("obs", "action", "reward")}

def direct():
    slots = vec.open_steps(16)
    for t in range(16):
        row = slots.step(t)
        for k, v in row.items():
            v.copy_(src[k][t])
    slots.commit(*flags)

def starts(s, b):
    v = np.flatnonzero(s.valid)
    return lambda: s.gather(v[rng.integers(0, len(v), b)])

def reads(s, b):
    v = np.flatnonzero(s.valid)
    return lambda: s.read(v[rng.integers(0, len(v), b)])

cases = {
    "ram-extend-px": lambda: px["ram"].extend(step(8, frame, rng)),
    "disk-extend-px": lambda: px["disk"].extend(step(8, frame, rng)),
    "ram-extend-vec-chunk": lambda: vec.extend(ck),
    "ram-direct-vec": direct,
    "ram-gather-px": starts(px["ram"], 32),
    "disk-gather-px": starts(px["disk"], 32),
    "ram-gather-vec": starts(vec, 256),
    "ram-read-px-1step": reads(one, 32),
}
for f in cases.values():  # warm
    f()
import rlstash.storage.stream as m
print("ready", m.__file__, flush=True)
for line in sys.stdin:
    out = {}
    for name, f in cases.items():
        k, t0 = 0, time.process_time()
        while time.process_time() - t0 < 0.25:
            f(); k += 1
        out[name] = k / (time.process_time() - t0)
    print(json.dumps(out), flush=True)
"""


def start(checkout: Path, python: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(checkout), "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen(
        [python, "-c", WORKER], cwd=tempfile.gettempdir(), env=env, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip
    return p


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", type=Path, required=True, help="checkout A (the baseline)")
    ap.add_argument("--b", type=Path, required=True, help="checkout B")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    sides = {"A": start(args.a.absolute(), args.python), "B": start(args.b.absolute(), args.python)}
    rates: dict[str, dict[str, list[float]]] = {"A": {}, "B": {}}
    try:
        for side, p in sides.items():
            ready, where = p.stdout.readline().split()
            assert ready == "ready", ready
            print(f"{side}: {where}", flush=True)
        for r in range(args.rounds):
            for side in ("A", "B") if r % 2 == 0 else ("B", "A"):
                p = sides[side]
                p.stdin.write("go\n")
                p.stdin.flush()
                for k, v in json.loads(p.stdout.readline()).items():
                    rates[side].setdefault(k, []).append(v)
    finally:
        for p in sides.values():
            p.stdin.close()
            p.wait(timeout=60)
    import statistics

    lines = [
        "| case | A ops/CPU-s (median) | B ops/CPU-s (median) | B / A |",
        "|---|---:|---:|---:|",
    ]
    for k in rates["A"]:
        a, b = statistics.median(rates["A"][k]), statistics.median(rates["B"][k])
        lines.append(f"| {k} | {a:,.0f} | {b:,.0f} | {b / a:.3f} |")
    table = "\n".join(lines)
    print(f"A = {args.a}, B = {args.b}, {args.rounds} rounds interleaved\n{table}")
    if args.out:
        args.out.write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
