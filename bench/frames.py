#!/usr/bin/env python3
"""Compressed frames benchmark (issue 14): rlstash StreamStorage with FrameCompression (lz4,
zstd; per frame or delta-coded) against the plain stream, SB3's uncompressed buffer and
TorchRL's CatFrames storage, on the W2 and Pong workloads of bench/stream.py.

    python3 bench/frames.py [--quick] [--workloads W2,pong] [--reps N]
                            [--out bench/results/frames_compressed.md]

Runs in ``.venv-bench`` (re-executes itself there; bench/setup_env.py installs ``lz4`` and
``zstandard`` in it). Data, fill and sample checks are bench/stream.py's: W2 = 100,000
transitions of 8 envs (uniform random 84x84 frames, the first 4 bytes of each its row id),
Pong = 50,000 agent steps of ALE/Pong-v5 (AtariPreprocessing + 4-frame stacks, random policy,
cached in ``bench/.work/stream-cache``). Batch 32, frame stacks of 4 rebuilt on read.

Per workload, one process builds every buffer, checks 3 samples of each against the data,
then times them interleaved (``bench.common.interleaved``, medians): batches/s of each and
its ratio to SB3's uncompressed buffer (``ReplayBuffer(optimize_memory_usage=False)``) in the
same process. Extend rate: the rlstash buffers are filled chunk by chunk in turn ([256, 8]
collector chunks), each chunk's ``extend`` timed; rate = transitions / summed seconds.
Bytes: what each buffer allocates (``nbytes``: the arena as planned by the budget, the
index, the other fields, the lane bookkeeping) per transition held, against TorchRL
CatFrames' stored bytes per transition (its LazyTensorStorage of single frames and next
frames; preallocated per transition, so measured on a 4,000-transition copy of the data).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import stream as sb  # noqa: E402  (bench/stream.py: data, peers, checks)

# label, FrameCompression kwargs per workload (budget: the arena's planned fraction of a raw
# frame; W2's random frames are incompressible, so they plan a whole frame)
VARIANTS = {
    "plain": None,
    "lz4": dict(codec="lz4", delta=False),
    "lz4-delta": dict(codec="lz4", delta=True, key_every=8),
    "zstd": dict(codec="zstd", delta=False),
    "zstd-delta": dict(codec="zstd", delta=True, key_every=8),
}
BUDGET = {  # Pong: ~1.3x the stored fraction measured on its frames (see the table)
    "W2": dict.fromkeys(VARIANTS, 1.0),
    "pong": {"lz4": 0.05, "lz4-delta": 0.03, "zstd": 0.035, "zstd-delta": 0.025},
}
GOAL_BYTES, GOAL_SPEED = 0.30, 1.00
METHOD = [
    """Data, fill and sample checks are bench/stream.py's: W2 = 100,000 transitions of 8 envs
    (uniform random 84x84 frames, the first 4 bytes of each its row id), Pong = 50,000 agent
    steps of ALE/Pong-v5 (AtariPreprocessing + 4-frame stacks, random policy). Batch 32,
    frame stacks of 4 (and the next obs) rebuilt on read; 3 samples of every buffer checked
    against the data before timing (Pong: rlstash buffers through the slot index).""",
    """Throughput: every buffer of a workload built in one process, timed interleaved
    (bench.common.interleaved), medians; ratios to SB3's uncompressed ReplayBuffer
    (optimize_memory_usage=False) measured in that process; Python's cyclic GC off while
    timing.""",
    """Extend rate: the rlstash buffers are filled chunk by chunk in turn ([256, 8] collector
    chunks, next-step autoreset), each extend timed; rate = transitions / summed seconds.""",
    """Bytes: what each buffer allocates (nbytes: the arena as planned by its budget, the
    index, the other fields, the lane bookkeeping) per transition held, against TorchRL
    CatFrames' stored bytes per transition (a LazyTensorStorage of single frames and next
    frames, preallocated per transition, so measured on a small copy of the data). 'payload
    B/frame': the compressed bytes the frames actually take (their fraction of a raw frame):
    the budget can be set that low.""",
]
SB3_W2_CAP = 25_000  # W2's SB3 buffer: 25k transitions (1.4 GB) on this shared machine


class Compressed(sb.Rlstash):
    """A StreamStorage of the workload's transitions, filled by :meth:`fill` (timed)."""

    def __init__(self, data: sb.Episodes, sel: np.ndarray, stacked: bool, comp: object) -> None:
        sb.Peer.__init__(self, data, sel)
        import torch

        from rlstash.replay import ReplayBuffer
        from rlstash.spec import Field
        from rlstash.storage.stream import ReadSpec, StreamStorage

        T, N = data.shape
        shape = (sb.K, *sb.FRAME) if stacked else sb.FRAME
        spec = {"obs": Field(shape, torch.uint8), "action": Field((), torch.int64)}
        self.store = StreamStorage(
            spec,
            N,
            T * N,
            backing="ram" if comp is None else comp,
            reads=ReadSpec(1, 0.99, sb.K),
            stacked_input=stacked,
        )
        self.rb = ReplayBuffer(self.store, seed=0)
        self.stacked, self.extend_s = stacked, 0.0
        self.label = "rlstash StreamStorage" + ("" if comp is None else f" + {_describe(comp)}")

    def batches(self):
        """The [C, N] collector chunks of the whole data, as ``extend`` takes them."""
        import torch

        d, (T, N), t = self.data, self.data.shape, torch.from_numpy
        for t0 in range(0, T, self.chunk):
            rows = np.arange(t0, min(T, t0 + self.chunk))
            if self.stacked:
                obs = d.stack(*np.meshgrid(rows, np.arange(N), indexing="ij"))
            else:
                obs = d.frames[rows]
            yield {
                "obs": t(obs),
                "action": t(d.action[rows]),
                "reward": t(d.reward[rows]),
                "terminated": t(d.terminated[rows]),
                "truncated": t(d.truncated[rows]),
            }

    def extend(self, batch: dict) -> None:
        start = time.perf_counter()
        self.rb.extend(batch)
        self.extend_s += time.perf_counter() - start

    def finish(self) -> None:
        self.stored = self.store.nbytes
        backing = self.store.backing
        self.stats = backing.stats() if hasattr(backing, "stats") else None


def _describe(comp: object) -> str:
    mode = f"delta, key every {comp.key_every}" if comp.delta else "per frame"
    return f"{comp.codec} ({mode}, budget {comp.budget:g})"


def catframes_bytes(data: sb.Episodes) -> tuple[float, str]:
    """TorchRL CatFrames' stored bytes per transition (LazyTensorStorage, preallocated)."""
    small = data.head(min(len(data.action), 600))
    peer = sb.TorchRLCatFrames(small, small.select())
    return peer.stored / peer.capacity, peer.label


def _worker(task: dict) -> dict:
    from common import cpu_meter, gc_paused, interleaved
    from replay import _cpu

    from rlstash.storage.frames import FrameCompression

    sb._setup_worker(task)
    name = task["workload"]
    data = sb.load_data(task)
    sel = data.select(task.get("per_lane"))
    out: dict = {"peers": {}, "errors": {}}
    out["catframes_per_transition"], out["catframes_label"] = catframes_bytes(data)
    mine: dict[str, Compressed] = {}
    for key in task["variants"]:
        kw = VARIANTS[key]
        comp = None if kw is None else FrameCompression(**kw, budget=BUDGET[name][key])
        mine[key] = Compressed(data, sel, name == "pong", comp)
    for batch in mine["plain"].batches():  # interleaved fill: chunk by chunk, buffer by buffer
        for peer in mine.values():
            peer.extend(batch)
    runs, cpu_log, peers = {}, {}, dict(mine)
    sb3_sel = sel[: SB3_W2_CAP // sel.shape[1]] if name == "W2" else sel
    try:
        peers["sb3"] = sb.SB3(data, sb3_sel, optimize=False)
    except Exception as exc:  # reported in the table
        traceback.print_exc()
        out["errors"]["sb3"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
    for key, peer in peers.items():
        if isinstance(peer, Compressed):
            peer.finish()
        checked = sb.check_sample(peer, data)
        runs[key] = sb._timed_run(peer.sample, cpu_log.setdefault(key, []))
        held = peer.transitions()
        out["peers"][key] = {
            "label": peer.label,
            "checked": checked,
            "transitions": held,
            "stored": peer.stored,
            "returned": sb.nbytes(peer.sample()),
        }
        if isinstance(peer, Compressed):
            steps = int(np.prod(data.shape))
            out["peers"][key].update(extend_rate=steps / peer.extend_s, stats=peer.stats)
        print(f"[frames] {name}: built {key}", file=sys.stderr, flush=True)
    with gc_paused(), cpu_meter() as meter:
        timings = interleaved(runs, task["reps"], task["target_s"])
    out["cpu"] = _cpu(meter)
    for key, t in timings.items():
        cpu = [n / max(c, 1e-9) for n, c in cpu_log[key][-task["reps"] :]]
        out["peers"][key].update(
            median=t.median, spread=t.spread, cpu_median=statistics.median(cpu)
        )
    return out


# ----------------------------------------------------------------------------- report


def render(results: dict, info: dict, args: argparse.Namespace) -> str:
    from common import fmt_rate, header_lines, markdown_table

    lines = ["# Compressed frames benchmark (issue 14)", "", "## Machine", "", *header_lines(info)]
    cmd = "python3 bench/frames.py" + (" --quick" if args.quick else "")
    lines += ["", "## Method", "", f"- Command: `{cmd}`; {args.reps} interleaved repetitions "
              f"of ~{args.target_s} s per buffer, medians; ratios from one process.",
              *[f"- {' '.join(x.split())}" for x in METHOD]]  # fmt: skip
    goals, body = [], []
    for name, res in results.items():
        if "error" in res:
            body += [f"## {name}", "", f"failed: {res['error']}", ""]
            continue
        cat = res["catframes_per_transition"]
        sb3 = res["peers"].get("sb3", {})
        table, best_bytes = [], None
        for key, p in res["peers"].items():
            per = p["stored"] / max(1, p["transitions"])
            vs_sb3 = p["median"] / sb3["median"] if sb3.get("median") else math.nan
            cpu_vs = p["cpu_median"] / sb3["cpu_median"] if sb3.get("cpu_median") else math.nan
            st = p.get("stats") or {}
            table.append([
                p["label"], f"{p['transitions']:,}", f"{per:,.0f}", f"{per / cat:.3f}x",
                f"{st['stored_bytes_per_frame']:,.0f} ({st['ratio']:.3f})" if st else "—",
                fmt_rate(p["median"]), f"{vs_sb3:.2f}x", f"{cpu_vs:.2f}x",
                fmt_rate(p.get("extend_rate")) if p.get("extend_rate") else "—",
                f"{100 * p['spread']:.0f}%", "checked" if p["checked"] else "not checked",
            ])  # fmt: skip
            if key not in ("plain", "sb3"):
                best_bytes = per / cat if best_bytes is None else min(best_bytes, per / cat)
                ok = vs_sb3 >= GOAL_SPEED
                goals.append([name, f"{key}: sample throughput vs SB3 uncompressed",
                              f">= {GOAL_SPEED:.2f}x", f"{vs_sb3:.2f}x (CPU time {cpu_vs:.2f}x)",
                              "PASS" if ok else "FAIL"])  # fmt: skip
        if best_bytes is not None:
            goals.append([name, "bytes per transition vs TorchRL CatFrames (best codec)",
                          f"<= {GOAL_BYTES:.2f}x", f"{best_bytes:.3f}x",
                          "PASS" if best_bytes <= GOAL_BYTES else "FAIL"])  # fmt: skip
        headers = ["buffer", "transitions held", "allocated B/transition",
                   "÷ TorchRL CatFrames B/transition", "payload B/frame (÷ raw)", "batches/s",
                   "÷ SB3 uncompressed (same process)", "÷ SB3 (CPU time)", "extend transitions/s",
                   "spread", "samples"]  # fmt: skip
        body += [f"## {name}", "", markdown_table(headers, table), ""]
        body.append(
            f"- TorchRL CatFrames stores {cat:,.0f} B per transition ({res['catframes_label']})."
        )
        if name == "W2":
            body.append(
                f"- SB3 holds the first {SB3_W2_CAP:,} of the transitions (memory of this shared machine)."
            )
        c = res.get("cpu") or {}
        body += [f"- CPU while timing: {json.dumps(c)}", ""]
    lines += [
        "",
        "## Goals",
        "",
        markdown_table(["workload", "goal", "target", "measured", "result"], goals),
        "",
    ]
    return "\n".join(lines + body)


# ----------------------------------------------------------------------------- main


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    p.add_argument("--workloads", default="W2,pong", help="comma list of W2,pong")
    p.add_argument(
        "--variants", default=",".join(VARIANTS), help="comma list of " + ",".join(VARIANTS)
    )
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--target-s", type=float, default=None)
    p.add_argument("--out", default=str(HERE / "results" / "frames_compressed.md"))
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.reps = args.reps or (5 if args.quick else 11)
    args.target_s = args.target_s or (0.1 if args.quick else 0.3)
    return args


def main(argv: list[str] | None = None) -> int:
    from common import machine_info, publish, timed_run

    args = parse(argv)
    if args.worker:
        task = json.loads(args.worker)
        Path(task["result"]).write_text(json.dumps(_worker(task)))
        return 0
    sb.NUM_ENVS = 8
    info = machine_info()
    variants = [v for v in args.variants.split(",") if v]
    if "plain" not in variants:
        variants.insert(0, "plain")

    def run() -> dict:
        results = {}
        for name in args.workloads.split(","):
            task = {"workload": name, "reps": args.reps, "target_s": args.target_s,
                    "torch_threads": 1, "variants": variants}  # fmt: skip
            if name == "W2":
                cap = 8_000 if args.quick else 100_000
                task.update(capacity=cap, mean_len=500, per_lane=cap // sb.NUM_ENVS)
            else:
                path = sb.CACHE / "pong-50000-8envs-seed0.npz"
                if not path.exists():
                    raise SystemExit(
                        f"{path}: collect it first: python3 bench/stream.py --workloads pong"
                    )
                task["data"] = str(path)
            print(f"[frames] {name}: building and timing {', '.join(variants)} + sb3", flush=True)
            results[name] = _spawn(task)
        return results

    results = timed_run(run, info)
    failed = [n for n, r in results.items() if "error" in r]
    return publish(render(results, info, args), args.out, "frames", failed)


def _spawn(task: dict) -> dict:
    import subprocess
    import tempfile

    sb.WORK.mkdir(parents=True, exist_ok=True)
    fd, result = tempfile.mkstemp(prefix="frames-", suffix=".json", dir=sb.WORK)
    os.close(fd)
    task = dict(task, result=result)
    try:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(task)]
        proc = subprocess.run(cmd, timeout=3600, check=False)
        text = Path(result).read_text() if proc.returncode == 0 else ""
        return json.loads(text) if text else {"error": f"worker exited with {proc.returncode}"}
    except subprocess.TimeoutExpired:
        return {"error": "worker timed out after 3600 s"}
    finally:
        Path(result).unlink(missing_ok=True)


if __name__ == "__main__":
    from bench_venv import ensure_bench_venv

    ensure_bench_venv(__file__)
    sys.exit(main())
