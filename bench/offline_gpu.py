"""IQL and TD3+BC gradient steps per second on a GPU, eager and graphed (issue 26 point 4).

    python bench/offline_gpu.py --device cuda --out OUT.md

A gradient step is the offline loop's (``rlstash/train/offline.py``): a sample of 256 rows of a
replay held on the device, then the agent's update. Hopper-v5's shapes (11 observations, 3
actions in [-1, 1]), the (256, 256) networks and the defaults of ``IQLConfig`` and
``TD3BCConfig`` (those of bench/offline_learn.py), a replay of 1M random rows. "graphed" is
``compile=True``: on CUDA the update is compiled with inductor and captured into one CUDA graph.
Rates are medians of interleaved repetitions, each synchronized at both edges. "host waits" are
the synchronizing calls ``torch.cuda.set_sync_debug_mode("warn")`` reports over 50 steps after
the warm-up (the promise: none).
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from rlstash.agents.iql import IQL, IQLConfig
from rlstash.agents.td3_bc import TD3BC, TD3BCConfig
from rlstash.replay import ReplayBuffer
from rlstash.spec import Field, Spec
from rlstash.storage import StreamStorage

OBS, ACT, BATCH = 11, 3, 256
MAKE = {
    "iql": lambda c, d: IQL((OBS,), ACT, -1.0, 1.0, IQLConfig(compile=c), device=d),
    "td3_bc": lambda c, d: TD3BC((OBS,), ACT, -1.0, 1.0, TD3BCConfig(compile=c), device=d),
}


def replay(rows: int, device: str) -> ReplayBuffer:
    """``rows`` random transitions in a stream storage on ``device``, episodes of 1,000."""
    spec = Spec({"obs": Field((OBS,), torch.float32), "action": Field((ACT,), torch.float32)})
    rb = ReplayBuffer(StreamStorage(spec, 1, rows, device=device), seed=0)
    g, chunk = np.random.default_rng(0), 10_000
    for t in range(0, rows - 1, chunk):
        n = min(chunk, rows - 1 - t)
        rb.extend({
            "obs": g.standard_normal((n, 1, OBS), np.float32),
            "action": g.uniform(-1, 1, (n, 1, ACT)).astype(np.float32),
            "reward": g.standard_normal((n, 1)).astype(np.float32),
            "terminated": np.zeros((n, 1), bool),
            "truncated": (np.arange(t, t + n) % 1000 == 999).reshape(n, 1),
        })  # fmt: skip
    return rb


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def rate(step, device: str, seconds: float) -> float:
    """Steps per second of ``step`` over about ``seconds``."""
    sync(device)
    start, n = time.perf_counter(), 0
    while True:
        for _ in range(50):
            step()
        n += 50
        sync(device)
        if time.perf_counter() - start >= seconds:
            return n / (time.perf_counter() - start)


def host_waits(step, device: str, n: int = 50) -> list[str]:
    """The synchronizing calls of ``n`` steps, one entry per (file, line)."""
    if not device.startswith("cuda"):
        return []
    sync(device)
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(n):
                step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sorted({f"{Path(w.filename).name}:{w.lineno}" for w in caught
                   if "synchroniz" in str(w.message)})  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.0, help="per repetition")
    parser.add_argument("--out", default=None, help="markdown report path")
    args = parser.parse_args()
    torch.manual_seed(0)
    rb = replay(args.rows, args.device)
    rows, lines = [], []
    for algo, make in MAKE.items():
        steps, compile_s, waits = {}, {}, {}
        for mode, c in (("eager", False), ("graphed", True)):
            agent = make(c, args.device)
            steps[mode] = lambda agent=agent: agent.update(rb.sample(BATCH))
            start = time.perf_counter()
            for _ in range(5):  # the compile and the capture
                steps[mode]()
            sync(args.device)
            compile_s[mode] = time.perf_counter() - start
            waits[mode] = host_waits(steps[mode], args.device)
        rates: dict[str, list[float]] = {m: [] for m in steps}
        for _ in range(args.reps):  # interleaved
            for mode, step in steps.items():
                rates[mode].append(rate(step, args.device, args.seconds))
        eager = statistics.median(rates["eager"])
        for mode in steps:
            med = statistics.median(rates[mode])
            spread = (max(rates[mode]) - min(rates[mode])) / med
            rows.append(f"| {algo} | {mode} | {med:,.0f} | {med / eager:.2f}x | {spread:.2f} | "
                        f"{compile_s[mode]:.1f} | {len(waits[mode])} |")  # fmt: skip
            lines += [f"- {algo} {mode}: host wait at {w}" for w in waits[mode]]
            print(algo, mode, f"{med:.0f} steps/s", waits[mode], flush=True)
    name = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu"
    text = "\n".join([
        f"IQL and TD3+BC gradient steps/s on {name} (torch {torch.__version__}), batch {BATCH}, "
        f"Hopper shapes, (256, 256) networks, a {args.rows:,}-row replay on {args.device}:", "",
        "| algo | mode | gradient steps/s | x eager | spread | first 5 steps s | host waits |",
        "|---|---|---:|---:|---:|---:|---:|", *rows, "", *lines, "",
    ])  # fmt: skip
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
