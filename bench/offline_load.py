"""Load time of a Minari dataset into a replay buffer: rlstash before and after the
copy-once loader (issue 26), against ``minari.load_dataset`` + a plain loop.

The dataset: ``--steps`` steps with HalfCheetah-v5's shapes (observations float64[17],
actions float32[6], 1,000-step episodes, random values: no MuJoCo needed; loading does not
look at the values), written once with ``minari.create_dataset_from_buffers``. Each load
runs in a fresh process (one torch thread) and times the load alone; the loaders alternate
in a rotating order, ``--reps`` loads each; the table gives medians, the ratio to the plain
loop and the process's peak RSS. ``--before``: a directory holding the rlstash package to
compare (e.g. ``git archive main rlstash | tar -x -C /tmp/before``).

    .venv/bin/python bench/offline_load.py --before /tmp/before --steps 200000 --reps 5
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / "results" / "offline_load.md"
DATASET = "bench/halfcheetah-shaped/random-v0"

LOADERS = {  # (imports, before the clock starts; the load, timed)
    "rlstash": (
        "from rlstash import ReplayBuffer\nimport rlstash.datasets.minari\n",
        "rb = ReplayBuffer.from_minari({ds!r}, seed=0)\nn = int(rb.storage.valid.sum())\n",
    ),
    "plain": ("from offline import load_plain\n", "n = len(load_plain({ds!r})['reward'])\n"),
}
CHILD = """
import resource, sys, time
import torch
torch.set_num_threads(1)
sys.path.insert(0, {bench!r})
import minari
{setup}
start = time.perf_counter()
{body}
seconds = time.perf_counter() - start
print(seconds, n, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def make_dataset(steps: int, seed: int = 0) -> None:
    """``steps`` random steps with HalfCheetah-v5's spaces, 1,000-step truncated episodes."""
    import minari
    import numpy as np
    from gymnasium import spaces
    from minari.data_collector.episode_buffer import EpisodeBuffer

    rng = np.random.default_rng(seed)
    episodes = []
    for start in range(0, steps, 1000):
        T = min(1000, steps - start)
        episodes.append(
            EpisodeBuffer(
                observations=rng.standard_normal((T + 1, 17)),
                actions=rng.uniform(-1, 1, (T, 6)).astype(np.float32),
                rewards=rng.standard_normal(T),
                terminations=np.zeros(T, bool),
                truncations=np.arange(T) == T - 1,
            )
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        minari.create_dataset_from_buffers(
            DATASET, episodes, algorithm_name="random",
            observation_space=spaces.Box(-np.inf, np.inf, (17,), np.float64),
            action_space=spaces.Box(-1, 1, (6,), np.float32),
        )  # fmt: skip


def load_once(name: str, src: Path) -> tuple[float, int, int]:
    """(seconds, steps loaded, peak RSS in KiB) of one load in a fresh process."""
    loader = "rlstash" if name != "plain" else "plain"
    setup, body = LOADERS[loader]
    code = CHILD.format(bench=str(HERE), setup=setup, body=body.format(ds=DATASET))
    env = dict(os.environ, PYTHONPATH=str(src), OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, cwd=tempfile.gettempdir())  # fmt: skip
    seconds, n, rss = out.stdout.split()[-3:]
    return float(seconds), int(n), int(rss)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--before", default="", help="directory with the rlstash to compare")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="minari-load-")
    os.environ["MINARI_DATASETS_PATH"] = home
    sources = {"plain": ROOT, "rlstash (this branch)": ROOT}
    if args.before:
        sources["rlstash (before)"] = Path(args.before)
    up_start = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    try:
        t0 = time.perf_counter()
        make_dataset(args.steps)
        print(f"[load] dataset made in {time.perf_counter() - t0:.0f} s", flush=True)
        names = list(sources)
        runs: dict[str, list[tuple[float, int, int]]] = {n: [] for n in names}
        for rep in range(args.reps):
            order = names[rep % len(names) :] + names[: rep % len(names)]
            for name in order:
                runs[name].append(load_once(name, sources[name]))
                print(f"[load] {rep} {name}: {runs[name][-1]}", flush=True)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    up_end = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    med = {n: statistics.median(r[0] for r in runs[n]) for n in names}
    rss = {n: max(r[2] for r in runs[n]) / 1024 for n in names}
    lines = [
        "# Loading a Minari dataset into a replay buffer (`bench/offline_load.py`)",
        "",
        f"{args.steps:,} steps with HalfCheetah-v5's shapes (obs float64[17], actions "
        f"float32[6], 1,000-step episodes), {args.reps} loads per loader, interleaved, each in a "
        "fresh process with one torch thread; medians. The machine is shared with other "
        "helpers' jobs (2 cores): the load before and after is in `uptime` below.",
        "",
        f"- load before: `{up_start}`",
        f"- load after: `{up_end}`",
        "",
        "| loader | load (median) | all loads (s) | vs plain loop | peak RSS of the process |",
        "|---|---|---|---|---|",
    ]
    for n in names:
        all_s = ", ".join(f"{r[0]:.2f}" for r in runs[n])
        lines.append(
            f"| {n} | {med[n]:.2f} s | {all_s} | {med[n] / med['plain']:.2f}x | {rss[n]:.0f} MiB |"
        )
    lines += [
        "",
        "`plain`: `minari.load_dataset` and a loop into preallocated numpy arrays "
        "(obs, next_obs, action, reward, flags: `bench/offline.py`'s `load_plain`). "
        "rlstash: `ReplayBuffer.from_minari` (each observation once, next observations "
        "rebuilt on read).",
        "",
    ]
    text = "\n".join(lines)
    Path(args.out).write_text(text)
    Path(args.out).with_suffix(".json").write_text(json.dumps(runs, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
