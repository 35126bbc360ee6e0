#!/usr/bin/env python3
"""Learning benchmark: rlstash against Stable-Baselines3, same machine, two comparisons.

    python3 bench/learn.py                                # every part (hours on 2 cores)
    python3 bench/learn.py --parts dqn,dqn_same --seeds 0,1,2
    python3 bench/learn.py --parts td3 --libs rlstash     # one side (another run may do the other)
    python3 bench/learn.py --parts updates                # update rates vs the compute limit
    python3 bench/learn.py --report-only                  # rewrite both tables, run nothing

Writes bench/results/learn.md (each side's preset, the 100,000-action parts) and
bench/results/learn_same.md (identical settings, update rates). Runs in ``.venv-bench``
(re-executes itself there; creates it with bench/setup_env.py when missing).

Each side's preset (what a user gets; learn.md): ``dqn`` CartPole-v1 (50,000 env steps,
threshold 475), ``sac`` Pendulum-v1 (20,000, -200), ``ppo`` CartPole-v1 (100,000, 475; rlstash's
preset is the RL Zoo's settings on SB3's network, so this is also the identical-settings
comparison), ``td3`` Pendulum-v1 (20,000, -200), ``ppo_cheetah`` HalfCheetah-v5 (300,000 env
steps, return at 100k/200k/300k): rlstash's ``rlstash train`` preset (the RL Zoo's tuned
HalfCheetah entry in rlstash's terms) against SB3 with the RL Zoo's settings; ``contextual`` and ``ppo_contextual``: discrete SAC and PPO on
bench/contextual.py's 100,000-action task, chunked vs one-hot (peak memory).

Identical settings on both sides (what the implementation is worth; learn_same.md):
``dqn_same`` CartPole-v1 with the RL Zoo's DQN settings ((256, 256), 1-step returns),
``sac_same`` HalfCheetah-v5 with SB3's SAC defaults ((256, 256), 15,000 env steps, seconds
only), ``td3_same`` Pendulum-v1 with the RL Zoo's TD3 settings ((400, 300); both TD3 parts also
report updates per training second against the FLOP limit), ``ppo_cheetah_same``
HalfCheetah-v5 with CleanRL's ppo_continuous_action settings (rlstash's preset before the
Zoo's entry), pinned on the rlstash side and in SB3's terms (VecNormalize) on the other;
300,000 env steps; ``ppo_compile`` and ``sac_same_compile``: end to end, env steps/s of
``ppo`` and ``sac_same`` with ``compile=True``; ``updates``: each agent's update rate as a
fraction of its network's compute limit (bench/updates.py). Where two parts run a side with
the same settings they share its runs (SB3: dqn and dqn_same, td3 and td3_same, ppo and
ppo_compile, sac_same and sac_same_compile).

Method (learning parts): every run is a fresh subprocess with one torch thread and CUDA hidden;
runs are interleaved (rlstash seed 0, SB3 seed 0, rlstash seed 1, ...). Both sides evaluate on
the same schedule (every 1,000 env steps, 10 deterministic episodes; HalfCheetah: every 5,000,
PPO every 10,000, 5 episodes) on separate eval envs (with normalised observations: each side's
statistics at that point, frozen), and both exclude evaluation time from the training clock
(SB3 through a callback that stops the clock while it evaluates; rlstash's loop does so itself).
Both run the whole budget (no early stop), so the "stays" point means: every later evaluation up
to the end of the budget is >= threshold.

Reported per run: env steps and training seconds at (a) the first evaluation >= threshold,
(b) the first evaluation from which every later one stays >= threshold, and (c) where
``rlstash train`` would stop (5 evaluations in a row >= threshold, its default patience); the
1-minute load average before and after the run, and the commit of the rlstash code it ran.
Medians over seeds (a run that never gets there counts as +inf); ratios rlstash / SB3.

Every run is kept in a file of its own (bench/.work/learn/<run id>/b<budget>-s<seed>.json,
written atomically), so invocations running at the same time never overwrite each other's
results; a rerun of the same (side, budget, seed) replaces the earlier one. The tables are
regenerated from all kept runs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
WORK = HERE / ".work" / "learn"  # one JSON file per run (module docstring)
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from learn_tasks import LIBS, TASKS, run_id, worker  # noqa: E402

EXTRA_PARTS = ("contextual", "ppo_contextual", "updates")
PARTS = (*TASKS, *EXTRA_PARTS)


class RunStore:
    """Runs kept one file each under ``root``: a write replaces one file atomically, so
    concurrent invocations only ever add or replace whole runs."""

    def __init__(self, root: Path):
        self.root = root

    def _write(self, path: Path, data: dict) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=1)
        os.replace(tmp, path)

    def save_run(self, rid: str, budget: int, seed: int, run: dict) -> None:
        self._write(self.root / rid / f"b{budget}-s{seed}.json", run)

    def runs(self, rid: str) -> dict[int, dict[str, dict]]:
        """{budget: {seed (str): run}} of run id ``rid``."""
        out: dict[int, dict[str, dict]] = {}
        for path in sorted((self.root / rid).glob("b*-s*.json")):
            budget, seed = path.stem[1:].split("-s")
            out.setdefault(int(budget), {})[seed] = json.loads(path.read_text())
        return out

    def part_runs(self, part: str) -> tuple[int, dict[str, dict[str, dict]]]:
        """(budget, {lib: {seed: run}}) of ``part``: its default budget when it has runs there,
        else the budget of its newest run."""
        by_lib = {lib: self.runs(run_id(part, lib)) for lib in LIBS}
        budget = TASKS[part]["budget"]
        if not any(budget in by_lib[lib] for lib in LIBS):
            dated = [(r.get("date", ""), b) for lib in LIBS for b, rs in by_lib[lib].items()
                     for r in rs.values()]  # fmt: skip
            budget = max(dated)[1] if dated else budget
        return budget, {lib: by_lib[lib].get(budget, {}) for lib in LIBS}

    def kept(self) -> list[tuple[str, int, str]]:
        """(run id, budget, seed) of every kept run."""
        out = []
        for path in self.root.glob("*/b*-s*.json"):
            budget, seed = path.stem[1:].split("-s")
            out.append((path.parent.name, int(budget), seed))
        return out

    def save_item(self, kind: str, name: str, data: dict) -> None:
        self._write(self.root / kind / f"{name.replace('/', '-')}.json", data)

    def items(self, kind: str) -> dict[str, dict]:
        return {
            p.stem: json.loads(p.read_text()) for p in sorted((self.root / kind).glob("*.json"))
        }


def code_commit() -> str:
    """The commit of the rlstash code the runs use, marked when rlstash/ has local changes."""

    def git(*args: str) -> str:
        proc = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
        return proc.stdout.strip() if proc.returncode == 0 else ""

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + (" +local changes" if git("status", "--porcelain", "--", "rlstash") else "")


def spawn(task: dict, timeout: float) -> dict:
    """Run ``task`` in a fresh process (one torch thread, no CUDA); its JSON result or error."""
    from common import spawn_worker

    return spawn_worker(__file__, task, timeout)


def run_learning(store: RunStore, parts: list[str], seeds: list[int], budget: int | None,
                 libs: list[str], done: set[tuple[str, int, int]], info: dict) -> None:  # fmt: skip
    """Interleave the sides and the parts seed by seed (seed 0 of every part and side, then
    seed 1, ...); each run is saved as soon as it ends. A shared run (same run id) already done
    by this invocation is not run twice."""
    for seed, part, lib in ((s, p, lib) for s in seeds for p in parts for lib in libs):
        budget_ = budget or TASKS[part]["budget"]
        rid = run_id(part, lib)
        if (rid, budget_, seed) in done:
            continue
        task = {"part": part, "lib": lib, "seed": seed, "budget": budget_}
        start = time.time()
        out = spawn(task, timeout=3 * 3600)
        out.setdefault("commit", info["commit"])
        out.update(
            machine=info["machine"],
            date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
        )
        store.save_run(rid, budget_, seed, out)
        done.add((rid, budget_, seed))
        print(f"{part} {lib} seed {seed}: {out.get('error', 'ok')} train "
              f"{out.get('train_seconds', 0):.0f} s ({time.time() - start:.0f} s)",
              flush=True)  # fmt: skip


def run_extra(store: RunStore, part: str) -> None:
    """The contextual parts and the update rates: each item in a fresh process, kept apiece."""
    if part == "updates":
        import updates

        for name in updates.CONFIGS:
            out = spawn({"part": "updates", "name": name}, timeout=1800)
            store.save_item("updates", name, out)
            print(f"updates {name}: {json.dumps(out)[:300]}", flush=True)
        return
    import contextual

    for key, out in contextual.benchmark(lambda t: spawn(t, timeout=7200), part=part).items():
        store.save_item(part, key, out)


def report_paragraphs() -> dict[str, list[str]]:
    """Title, reproduce line and method paragraphs of each report (from this docstring)."""
    doc = [" ".join(p.split()).replace("``", "`") for p in __doc__.split("\n\n")]
    reproduce = ("Reproduce: `python3 bench/learn.py --parts {}` (`--seeds`, `--libs`, "
                 "`--budget` to add runs; `--report-only` rewrites the tables). Raw runs: "
                 "bench/.work/learn/ (one file per run).")  # fmt: skip
    preset = ",".join(p for p, t in TASKS.items() if t["group"] == "preset")
    same = ",".join(p for p, t in TASKS.items() if t["group"] == "same")
    return {
        "learn.md": ["# Learning benchmark, each side's preset: rlstash vs Stable-Baselines3",
                     reproduce.format(preset + ",contextual,ppo_contextual"), doc[3], doc[5],
                     doc[6]],
        "learn_same.md": ["# Learning benchmark, identical settings: rlstash vs "
                          "Stable-Baselines3", reproduce.format(same + ",updates"), doc[4],
                          doc[5], doc[6]],
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default=",".join(PARTS), help=f"some of {', '.join(PARTS)}")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--budget", type=int, default=None, help="env steps (default per part)")
    parser.add_argument("--libs", default=",".join(LIBS), help="run only these sides")
    parser.add_argument("--report-only", action="store_true", help="rewrite the tables only")
    parser.add_argument(
        "--skip-done", action="store_true", help="skip runs already kept (resume an invocation)"
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        task = json.loads(args.worker)
        commit = code_commit()  # the code this process imports (a rebase may come later)
        print(json.dumps({"commit": commit, **worker(task)}))
        return
    from bench_venv import ensure_bench_venv

    ensure_bench_venv(__file__)
    parts = [] if args.report_only else [p for p in args.parts.split(",") if p]
    libs = [lib for lib in args.libs.split(",") if lib]
    if sorted(set(parts) - set(PARTS)) or not set(libs) <= set(LIBS):
        raise SystemExit(f"--parts: expected some of {', '.join(PARTS)}, got {args.parts!r}; "
                         f"--libs: some of {', '.join(LIBS)}, got {args.libs!r}")  # fmt: skip
    seeds = [int(s) for s in args.seeds.split(",") if s]
    store, done = RunStore(WORK), set()
    if args.skip_done:
        done = {(rid, budget, int(seed)) for rid, budget, seed in store.kept()}
    from common import machine_info

    info = {"commit": code_commit(), "machine": machine_info()}
    info["machine"].pop("torch_threads", None)  # the parent's; every worker runs one thread
    run_learning(store, [p for p in parts if p not in EXTRA_PARTS], seeds, args.budget, libs,
                 done, info)  # fmt: skip
    for part in (p for p in parts if p in EXTRA_PARTS):
        run_extra(store, part)
    import learn_report

    for out in learn_report.write_reports(store, RESULTS, report_paragraphs()):
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
