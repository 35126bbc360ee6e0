#!/usr/bin/env python3
"""Write rate of a disk StreamStorage: one-step ``extend`` of N envs, this tree against
another git revision (default ``main``), interleaved in fresh processes, medians.

    python3 bench/disk_stream_extend.py [--against main] [--rounds 5] [--steps 2000]

The other revision's ``rlstash`` is exported with ``git archive`` to a temp directory and
imported from there (the processes run outside the repository, so neither shadows the
other). Each process times ``--steps`` extends 7 times after 64 warm-up steps and prints
its median microseconds per extend; the table shows the medians over the rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = [(4, 400), (4, 100_000), (64, 10_000)]  # (envs, slots per lane): wraps, no wrap, wraps

CHILD = """
import sys, tempfile, time
import numpy as np, torch
torch.set_num_threads(1)
from rlstash.storage import StreamStorage
from rlstash.storage.stream import ReadSpec
N, L, steps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(0)
batches = [{"obs": torch.randn(N, 8), "action": torch.zeros(N, dtype=torch.int64),
            "reward": torch.ones(N), "terminated": torch.from_numpy(rng.random(N) < 0.02),
            "truncated": torch.zeros(N, dtype=torch.bool)} for _ in range(256)]
spec = {"obs": ((8,), torch.float32), "action": ((), torch.int64)}
out = []
with tempfile.TemporaryDirectory() as d:
    s = StreamStorage(spec, N, N * L, "disk", path=d + "/s", reads=ReadSpec(n_step=3))
    for b in batches[:64]:
        s.extend(b)
    for _ in range(7):
        t0 = time.perf_counter()
        for i in range(steps):
            s.extend(batches[i % 256])
        out.append((time.perf_counter() - t0) / steps * 1e6)
    s.close()
print(f"{np.median(out):.1f}")
"""


def _run(tree: Path, n: int, lanes: int, steps: int, cwd: str) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, "-c", CHILD, str(n), str(lanes), str(steps)]
    return float(subprocess.check_output(cmd, env=env, cwd=cwd, text=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", default="main")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=2000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        other = Path(tmp) / "other"
        other.mkdir()
        archive = subprocess.check_output(["git", "archive", args.against, "rlstash"], cwd=ROOT)
        subprocess.run(["tar", "-x", "-C", str(other)], input=archive, check=True)
        print(f"us per one-step extend, median of {args.rounds} interleaved rounds")
        print(f"{'envs':>5} {'slots/lane':>10} {args.against:>10} {'this tree':>10} {'ratio':>6}")
        for n, lanes in CASES:
            a, b = [], []
            for _ in range(args.rounds):
                a.append(_run(other, n, lanes, args.steps, tmp))
                b.append(_run(ROOT, n, lanes, args.steps, tmp))
            ma, mb = statistics.median(a), statistics.median(b)
            print(f"{n:>5} {lanes:>10,} {ma:>10.1f} {mb:>10.1f} {mb / ma:>6.2f}")


if __name__ == "__main__":
    main()
