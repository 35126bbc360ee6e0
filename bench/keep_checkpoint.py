#!/usr/bin/env python3
"""Keep the checkpoint of a good evaluation of a running ``rlstash train`` run.

    python3 bench/keep_checkpoint.py RUN_DIR DEST --at 1078.1

A run keeps only its latest checkpoint (and the one before it, ``checkpoint.old/``). This
watches ``RUN_DIR/eval.csv``; once an evaluation at step S has ``return_mean >= --at``, it waits
for the run's checkpoint of step S (its ``COMPLETE`` file holds the step; the run must write a
checkpoint at each evaluation: ``--checkpoint-every`` = ``--eval-every``) and copies it to
``DEST/checkpoint/`` with ``eval.csv`` and ``config.json`` beside it, so ``DEST`` reads as a run
directory (``python3 bench/make_offline_data.py medium --run DEST``). The first such
evaluation is kept (``--keep best`` replaces it by any later higher one). Exits when the run
has ended (``--timeout`` seconds without a new evaluation) or after the first copy with
``--keep first``.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import time
from pathlib import Path


def evals(run_dir: Path) -> list[tuple[int, float]]:
    """(step, return_mean) of every complete row of the run's eval.csv."""
    path = run_dir / "eval.csv"
    if not path.exists():
        return []
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    out = []
    for r in rows:
        try:
            out.append((int(r["step"]), float(r["return_mean"])))
        except (KeyError, TypeError, ValueError):  # a row being written
            continue
    return out


def checkpoint_of(run_dir: Path, step: int) -> Path | None:
    """The run's complete checkpoint directory of ``step`` (latest or previous), or None."""
    for name in ("checkpoint", "checkpoint.old"):
        done = run_dir / name / "COMPLETE"
        try:
            if int(done.read_text().split()[0]) == step:
                return done.parent
        except (OSError, ValueError, IndexError):
            continue
    return None


def oldest_step(run_dir: Path) -> int:
    """The step of the older of the run's two kept checkpoints (-1 while one is missing)."""
    steps = []
    for name in ("checkpoint", "checkpoint.old"):
        try:
            steps.append(int((run_dir / name / "COMPLETE").read_text().split()[0]))
        except (OSError, ValueError, IndexError):
            return -1
    return min(steps)


def copy(ckpt: Path, run_dir: Path, dest: Path, step: int, ret: float) -> None:
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(ckpt, tmp / "checkpoint")
    for name in ("eval.csv", "config.json"):
        if (run_dir / name).exists():
            shutil.copy2(run_dir / name, tmp / name)
    (tmp / "KEPT.json").write_text(
        json.dumps({"from": str(run_dir), "step": step, "return_mean": ret}, indent=1)
    )
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    print(f"kept the checkpoint of step {step} (eval return {ret:.1f}) in {dest}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("dest", type=Path)
    parser.add_argument("--at", type=float, required=True, help="eval return to keep at")
    parser.add_argument("--keep", choices=("first", "best"), default="first")
    parser.add_argument("--timeout", type=float, default=1800, help="s without a new eval")
    parser.add_argument("--poll", type=float, default=2.0)
    args = parser.parse_args()
    kept, seen, last_new, missed = -float("inf"), 0, time.monotonic(), set()
    while time.monotonic() - last_new < args.timeout:
        rows = evals(args.run_dir)
        if len(rows) > seen:
            seen, last_new = len(rows), time.monotonic()
        good = [(s, r) for s, r in rows if r >= args.at and r > kept and s not in missed]
        if good:
            step, ret = good[0] if args.keep == "first" else max(good, key=lambda x: x[1])
            ckpt = checkpoint_of(args.run_dir, step)
            if ckpt is not None:
                copy(ckpt, args.run_dir, args.dest, step, ret)
                kept = ret
                if args.keep == "first":
                    return 0
            elif oldest_step(args.run_dir) > step:  # both kept checkpoints are newer: missed
                print(f"missed the checkpoint of step {step}", flush=True)
                missed.add(step)
        time.sleep(args.poll)
    print(f"no evaluation >= {args.at} kept" if kept == -float("inf") else "done", flush=True)
    return 0 if kept > -float("inf") else 1


if __name__ == "__main__":
    raise SystemExit(main())
