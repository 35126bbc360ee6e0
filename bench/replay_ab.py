"""A/B of the replay buffer's hot paths: two checkouts of rlstash in one process, interleaved.

    .venv/bin/python bench/replay_ab.py /path/to/baseline . --rounds 30 --out bench/results/replay_ab.md

Both checkouts are imported into this one process (each copied under its own package name,
``rlstash_a`` and ``rlstash_b``, imports renamed), so both sides share the interpreter, the allocator and the machine's load at
the same moment. Each round times every case on A and on B, alternating which goes first,
as the median of ``--reps`` calls; the table gives the median over rounds and the median
of the per-round ratios B/A (< 1: B is faster). Cases: ``extend`` of 256 rows given as numpy
arrays of the stored dtypes (the fast path) and as float64 tensors (the checked path);
``sample(256)`` uniform and prioritized over a TensorStorage, sequences of 8 (32 of them);
``extend`` of one step of 8 envs and ``sample(256)`` of a StreamStorage. The machine may be
loaded by other work: the ratios measured together are the result, not the absolute times.
"""

from __future__ import annotations

import argparse
import importlib
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

CAP, B, N = 100_000, 256, 8


def load(tree: str, alias: str) -> ModuleType:
    """``tree``'s ``rlstash`` package imported under the name ``alias``: its files are copied
    to a temporary folder with every ``rlstash`` import renamed, so two checkouts live side by
    side in one process without sharing a module (function-level imports included)."""
    src = Path(tree).resolve() / "rlstash"
    dst_root = Path(tempfile.mkdtemp(prefix="replay_ab_"))
    pattern = re.compile(r"\brlstash(?=[.\s])")
    for path in src.rglob("*.py"):
        out = dst_root / alias / path.relative_to(src)
        out.parent.mkdir(parents=True, exist_ok=True)
        text = path.read_text()
        text = re.sub(r"(from|import) rlstash\b", rf"\1 {alias}", text)
        out.write_text(pattern.sub(alias, text).replace('"rlstash.', f'"{alias}.'))
    sys.path.insert(0, str(dst_root))
    pkg = importlib.import_module(alias)
    assert pkg.__file__.startswith(str(dst_root)), pkg.__file__
    return pkg


def cases(pkg: ModuleType) -> dict[str, Any]:
    """name -> zero-argument call, on buffers built with ``pkg``."""
    rng = np.random.default_rng(0)
    spec = {"obs": ((16,), torch.float32), "action": ((), torch.int64),
            "reward": ((), torch.float32), "terminated": ((), torch.bool)}  # fmt: skip

    def rows(n: int) -> dict[str, np.ndarray]:
        return {"obs": rng.standard_normal((n, 16)).astype(np.float32),
                "action": rng.integers(0, 4, n), "reward": rng.standard_normal(n).astype(np.float32),
                "terminated": rng.random(n) < 0.01}  # fmt: skip

    out: dict[str, Any] = {}
    for name, sampler in (("uniform", pkg.UniformSampler()),
                          ("prioritized", pkg.PrioritizedSampler()),
                          ("sequence8", pkg.SequenceSampler(8, end_keys=("terminated",)))):  # fmt: skip
        rb = pkg.ReplayBuffer(pkg.TensorStorage(spec, CAP), sampler=sampler, seed=0)
        for _ in range(CAP // 4096 + 1):
            rb.extend(rows(4096))
        if name == "uniform":
            fast = rows(B)
            slow = {k: torch.as_tensor(v).double() if v.dtype.kind == "f" else torch.as_tensor(v)
                    for k, v in rows(B).items()}  # fmt: skip
            out["extend fast (numpy)"] = lambda rb=rb, b=fast: rb.extend(b)
            out["extend checked (float64)"] = lambda rb=rb, b=slow: rb.extend(b)
        size = B if name != "sequence8" else B // 8
        out[f"sample {name}"] = lambda rb=rb, n=size: rb.sample(n)
    st = pkg.ReplayBuffer(
        pkg.StreamStorage({"obs": ((16,), torch.float32), "action": ((), torch.int64)}, N, CAP),
        seed=0,
    )
    step = {"obs": torch.randn(N, 16), "action": torch.zeros(N, dtype=torch.int64),
            "reward": torch.ones(N), "terminated": torch.zeros(N, dtype=torch.bool),
            "truncated": torch.zeros(N, dtype=torch.bool)}  # fmt: skip
    for _ in range(2000):
        st.extend(step)
    out["stream extend (8 envs)"] = lambda: st.extend(step)
    out["stream sample"] = lambda: st.sample(B)
    return out


def timed(fn: Any, reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", help="checkout A (the baseline)")
    ap.add_argument("b", help="checkout B (e.g. .)")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--out", default=None, help="write the table (markdown) here too")
    args = ap.parse_args()
    torch.set_num_threads(1)
    sides = {"a": cases(load(args.a, "rlstash_a")), "b": cases(load(args.b, "rlstash_b"))}
    got: dict[str, dict[str, list[float]]] = {"a": {}, "b": {}}
    t0 = time.time()
    for r in range(args.rounds):
        for case in sides["a"]:
            for side in ("a", "b") if r % 2 == 0 else ("b", "a"):
                got[side].setdefault(case, []).append(timed(sides[side][case], args.reps))
    lines = [
        f"# Replay hot paths: A = {args.a}, B = {args.b}",
        "",
        f"One process, both checkouts imported; {args.rounds} rounds, each case timed on A and "
        f"B in turn (alternating order), median of {args.reps} calls; the table: median over "
        f"rounds, and the median of the per-round ratios B/A. {time.time() - t0:.0f} s. Shared "
        "2-core machine, loaded by other sessions' tests: absolute times are noise, the ratio "
        "is the result.",
        "",
        "| case | A us | B us | B/A (median of rounds) |",
        "|---|---:|---:|---:|",
    ]
    for case in got["a"]:
        a, b = got["a"][case], got["b"][case]
        ratio = statistics.median(y / x for x, y in zip(a, b))
        lines.append(
            f"| {case} | {statistics.median(a):.1f} | {statistics.median(b):.1f} | {ratio:.3f} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
