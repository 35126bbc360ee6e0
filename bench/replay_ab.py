"""A/B of the replay buffer's hot paths: two checkouts of rlstash, interleaved, medians.

    .venv/bin/python bench/replay_ab.py /work/main . --rounds 8 --out bench/results/replay_ab.md

Each round runs one short process per checkout (alternating which goes first), with
``PYTHONPATH`` set to that checkout; each process times ``extend`` (256 rows given as numpy
arrays of the stored dtypes: the fast path; and as float64 tensors: the checked path) and
``sample(256)`` (uniform and prioritized over a TensorStorage, uniform over a StreamStorage,
sequences of 8 over a TensorStorage) as the median of many calls. The table gives each
case's median over rounds and the ratio B/A (< 1: B is faster). Same machine, same
interpreter, one run: the machine may be loaded; the ratios measured together are the result.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, time, statistics
import numpy as np, torch
torch.set_num_threads(1)
from rlstash import ReplayBuffer, TensorStorage, StreamStorage
from rlstash.sampler import PrioritizedSampler, SequenceSampler

CAP, B, REPS = 100_000, 256, REPS_
spec = {"obs": ((16,), torch.float32), "action": ((), torch.int64), "reward": ((), torch.float32),
        "terminated": ((), torch.bool)}
rng = np.random.default_rng(0)

def rows(n, dtype=np.float32):
    return {"obs": rng.standard_normal((n, 16)).astype(dtype), "action": rng.integers(0, 4, n),
            "reward": rng.standard_normal(n).astype(dtype), "terminated": rng.random(n) < 0.01}

def timed(fn, reps):
    out = []
    for _ in range(reps):
        t = time.perf_counter(); fn(); out.append(time.perf_counter() - t)
    return statistics.median(out) * 1e6

res = {}
for name, sampler in (("uniform", None), ("prioritized", PrioritizedSampler()),
                      ("sequence8", SequenceSampler(8, end_keys=("terminated",)))):
    rb = ReplayBuffer(TensorStorage(spec, CAP), sampler=sampler, seed=0)
    for _ in range(CAP // 4096):
        rb.extend(rows(4096))
    if name == "uniform":
        fast, slow = rows(B), {k: torch.as_tensor(v).double() if v.dtype.kind == "f" else
                               torch.as_tensor(v) for k, v in rows(B).items()}
        res["extend fast (numpy)"] = timed(lambda: rb.extend(fast), REPS)
        res["extend checked (float64)"] = timed(lambda: rb.extend(slow), REPS)
    res[f"sample {name}"] = timed(lambda: rb.sample(B if name != "sequence8" else B // 8), REPS)

N = 8
st = ReplayBuffer(StreamStorage({"obs": ((16,), torch.float32), "action": ((), torch.int64)},
                                N, CAP), seed=0)
step = {"obs": torch.randn(N, 16), "action": torch.zeros(N, dtype=torch.int64),
        "reward": torch.ones(N), "terminated": torch.zeros(N, dtype=torch.bool),
        "truncated": torch.zeros(N, dtype=torch.bool)}
for _ in range(2000):
    st.extend(step)
res["stream extend (8 envs)"] = timed(lambda: st.extend(step), REPS)
res["stream sample"] = timed(lambda: st.sample(B), REPS)
import rlstash
res["_file"] = rlstash.__file__
print(json.dumps(res))
"""


def run(tree: str, reps: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve()), "OMP_NUM_THREADS": "1"}
    code = CHILD.replace("REPS_", str(reps))
    out = subprocess.run(  # cwd: not a checkout (``-c`` puts the cwd first on sys.path)
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=tempfile.gettempdir(),
    )
    res = json.loads(out.stdout.strip().splitlines()[-1])
    where = res.pop("_file")
    if not where.startswith(env["PYTHONPATH"]):
        raise SystemExit(f"{tree}: imported rlstash from {where}, not from the checkout")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", help="checkout A (the baseline, e.g. /work/main)")
    ap.add_argument("b", help="checkout B (e.g. .)")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--out", default=None, help="write the table (markdown) here too")
    args = ap.parse_args()
    got: dict[str, dict[str, list[float]]] = {"a": {}, "b": {}}
    t0 = time.time()
    for r in range(args.rounds):
        order = ("a", "b") if r % 2 == 0 else ("b", "a")
        for side in order:
            for case, us in run(getattr(args, side), args.reps).items():
                got[side].setdefault(case, []).append(us)
    lines = [
        f"# Replay hot paths: A = {args.a}, B = {args.b}",
        "",
        f"{args.rounds} rounds, interleaved (alternating order), {args.reps} calls per case and "
        f"round, median of calls then median of rounds; {time.time() - t0:.0f} s. Shared 2-core "
        "machine, loaded by other sessions' tests: absolute times are noise, the ratio is the "
        "result.",
        "",
        "| case | A us | B us | B/A |",
        "|---|---:|---:|---:|",
    ]
    for case in got["a"]:
        a, b = statistics.median(got["a"][case]), statistics.median(got["b"][case])
        lines.append(f"| {case} | {a:.1f} | {b:.1f} | {b / a:.3f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
