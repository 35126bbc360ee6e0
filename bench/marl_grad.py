#!/usr/bin/env python3
"""What MAPPO's written-out gradient changes in a learning run (``bench/results/marl_grad.md``):
BenchMARL, rlstash with the written gradient (``backward='auto'``, this branch's default) and
rlstash as before it (``backward='autograd'``: eager autograd, then compiled by
``compile='auto'``), three processes started together (the same machine load), in
``.venv-marl`` (``bench/setup_marl.py``). Every other setting as ``bench/marl.py learn``
(BenchMARL's defaults on all sides, rlstash without the agent-id input).

    python3 bench/marl_grad.py run --frames 30000 --seed 0
    python3 bench/marl_grad.py report
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from setup_marl import ensure_marl_venv  # noqa: E402

RESULTS = HERE / "results"
SIDES = {"benchmarl": None, "rlstash-written": "auto", "rlstash-autograd": "autograd"}


def _rlstash(task: str, seed: int, frames: int, backward: str, workdir: Path) -> list[dict]:
    import csv

    from rlstash.train.config import TrainConfig
    from rlstash.train.loop import train

    cfg = TrainConfig(algo="mappo", env=f"vmas/{task}", steps=frames, seed=seed, device="cpu",
                      eval_every=12_000, eval_episodes=10, checkpoint_every=10**9,
                      run_dir=str(workdir), name=f"mappo-{task}-s{seed}", quiet=True,
                      agent={"agent_id": False, "backward": backward})  # fmt: skip
    result = train(cfg)
    path = result.run_dir / "eval.csv"
    rows = list(csv.DictReader(path.open())) if path.exists() else []
    return [{"frames": int(r["step"]), "train_seconds": float(r["train_seconds"]),
             "eval_reward": float(r["return_mean"])} for r in rows]  # fmt: skip


def cmd_one(args: argparse.Namespace) -> None:
    import tempfile

    import marl

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        if args.side == "benchmarl":
            curve = marl._benchmarl(args.task, "mappo", args.seed, args.frames, Path(tmp))
        else:
            curve = _rlstash(args.task, args.seed, args.frames, SIDES[args.side], Path(tmp))
        wall = time.perf_counter() - t0
    Path(args.out).write_text(json.dumps({"side": args.side, "task": args.task, "seed": args.seed,
                                          "frames": args.frames, "wall_seconds": wall,
                                          "curve": curve}))  # fmt: skip


def cmd_run(args: argparse.Namespace) -> None:
    RESULTS.mkdir(exist_ok=True)
    procs = []
    for side in SIDES:
        out = RESULTS / f"marl_grad-{args.task}-{side}-s{args.seed}.json"
        cmd = [sys.executable, __file__, "one", "--side", side, "--task", args.task,
               "--seed", str(args.seed), "--frames", str(args.frames), "--out", str(out)]  # fmt: skip
        print(" ".join(cmd), flush=True)
        procs.append(subprocess.Popen(cmd))
    for proc in procs:
        proc.wait()


def cmd_report(args: argparse.Namespace) -> None:
    runs = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("marl_grad-*-s*.json"))]
    runs.sort(key=lambda r: (r["seed"], list(SIDES).index(r["side"])))
    base = {(r["seed"], c["frames"]): c["train_seconds"]
            for r in runs if r["side"] == "benchmarl" for c in r["curve"]}  # fmt: skip
    lines = ["| seed | side | frames | train s | / BenchMARL | eval reward |", "|---" * 6 + "|"]
    for r in runs:
        for c in r["curve"]:
            b = base.get((r["seed"], c["frames"]))
            ratio = f"{c['train_seconds'] / b:.2f}x" if b and r["side"] != "benchmarl" else ""
            lines.append(f"| {r['seed']} | {r['side']} | {c['frames']:,} | "
                         f"{c['train_seconds']:.0f} | {ratio} | {c['eval_reward']:.3f} |")  # fmt: skip
    for r in runs:
        lines.append(f"\n{r['side']} s{r['seed']}: {r['frames']:,} frames, whole run "
                     f"{r['wall_seconds']:.0f} s wall")  # fmt: skip
    print("\n".join(lines))


def main() -> None:
    ensure_marl_venv(__file__)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name, fn in (("run", cmd_run), ("one", cmd_one)):
        s = sub.add_parser(name)
        s.add_argument("--task", default="navigation", choices=("navigation", "balance"))
        s.add_argument("--frames", type=int, default=30_000)
        s.add_argument("--seed", type=int, default=0)
        if name == "one":
            s.add_argument("--side", required=True, choices=sorted(SIDES))
            s.add_argument("--out", required=True)
        s.set_defaults(fn=fn)
    sub.add_parser("report").set_defaults(fn=cmd_report)
    args = p.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
