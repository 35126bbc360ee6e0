#!/usr/bin/env python3
"""Issue 27, Atari frames/s: rlstash over gymnasium/ALE workers, rlstash over EnvPool, EnvPool
alone, and rlstash's collector into a StreamStorage over each; interleaved, medians, ratios.

    .venv-atari/bin/python bench/collect_atari_backends.py [--games Pong,Breakout]
        [--n 8,32] [--reps 5] [--target-s 1.0] [--out bench/results/collect_atari.md]

``.venv-atari`` is made by ``python3 bench/setup_atari.py`` (rlstash with its ``atari`` and
``envpool`` extras). Each cell (game, N) runs in a fresh process: its peers are built first,
then timed interleaved (``common.interleaved``: one repetition of each in turn, rotating,
medians), with the other users' load recorded (``common.cpu_meter``). Random actions from one
numpy sampler for every peer; one torch thread. Rates are agent steps/s (one env step = 4 ALE
frames, frame skip 4) and frames/s; ratios are to EnvPool alone.

Peers (every one makes rlstash's Atari training env: no-ops up to 30, frame skip 4 with the
max over the last two frames, 84x84 grey, sticky actions 0.25, life loss as a terminal,
clipped rewards, FIRE on reset):

* ``gym-pool``: ``ProcessPoolVectorEnv(make_atari, N)`` with no layout argument (the library
  default layout), gymnasium/ALE envs in worker processes (+ the caller);
* ``gym-pool-stream``: the same pool under :class:`rlstash.Collector` (frames of 8 steps per
  env) into a :class:`~rlstash.storage.stream.StreamStorage` of N lanes that stores single
  frames and rebuilds stacks of 4 (what ``rlstash train`` does for Atari);
* ``envpool``: ``envpool.make_gymnasium(<Game>-v5, num_envs=N, num_threads=cores)`` with
  rlstash's Atari options (:data:`rlstash.envs.envpool_env.ATARI_OPTIONS`: stack_num 1,
  frame skip 4, 84x84 grey, noop 30, sticky 0.25) plus ``episodic_life`` and ``reward_clip``,
  stepped alone;
* ``rlstash-envpool``: :class:`rlstash.EnvPoolVectorEnv` (the same EnvPool, plus its stacks of
  4 and rlstash's autoreset bookkeeping) stepped alone;
* ``rlstash-envpool-stream``: ``EnvPoolVectorEnv`` under the Collector into the same storage.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

PEERS = ("gym-pool", "gym-pool-stream", "envpool", "rlstash-envpool", "rlstash-envpool-stream")
FRAME_SKIP = 4
T = 8  # steps per env per Collector batch
LANE = 512  # steps kept per env lane (single frames)


def _sampler(space, n: int, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    return lambda: rng.integers(0, space.n, n)


def _stream(env, n: int):
    """The store ``rlstash train`` makes for Atari: stacks in, single frames stored."""
    from rlstash.storage.stream import StreamStorage
    from rlstash.storage.stream_spec import ReadSpec
    from rlstash.train.run import step_spec

    spec = step_spec(env.single_observation_space, env.single_action_space)
    return StreamStorage(spec, n, n * LANE, reads=ReadSpec(frame_stack=4), stacked_input=True)


def _stepper(env, n: int):
    sample = _sampler(env.single_action_space, n)
    env.reset(seed=0)

    def run(k: int) -> None:
        for _ in range(k):
            env.step(sample())

    return run


def _collecting(env, n: int):
    import torch

    from rlstash.collect.sync import Collector

    store = _stream(env, n)
    sample = _sampler(env.single_action_space, n)
    collector = Collector(env, lambda obs: torch.as_tensor(sample()), n * T, device="cpu")
    collector.reset(seed=0)

    def run(k: int) -> None:  # k Collector batches of T steps of the N envs (rates x T)
        for _ in range(k):
            collector.collect_into(store)

    return run


def _gym_pool(env_id: str, n: int):
    import functools

    from rlstash.envs import ProcessPoolVectorEnv
    from rlstash.envs.atari import make_atari

    pool = ProcessPoolVectorEnv(functools.partial(make_atari, env_id, True), n, seed=0)
    return pool, f"{pool.num_workers} workers + {pool.caller_envs} envs in the caller"


def _envpool_alone(env_id: str, n: int, threads: int):
    import numpy as np

    from rlstash.envs.envpool_env import ATARI_OPTIONS, import_envpool, task_id

    options = {**ATARI_OPTIONS, "episodic_life": True, "reward_clip": True}
    pool = import_envpool().make_gymnasium(
        task_id(env_id), num_envs=n, seed=0, num_threads=threads, **options
    )
    sample = _sampler(pool.action_space, n)
    pool.reset()

    def run(k: int) -> None:
        for _ in range(k):
            pool.step(np.asarray(sample(), dtype=np.int32))

    return run, pool.close


def cell(game: str, n: int, reps: int, target_s: float) -> dict:
    """Build every peer of one cell, time them interleaved; rates in agent steps/s."""
    import common
    import torch

    from rlstash.envs.cpus import usable_cpus
    from rlstash.envs.envpool_env import EnvPoolVectorEnv

    torch.set_num_threads(1)
    env_id, cores = f"ALE/{game}-v5", usable_cpus()
    runs, closers, notes, errors, steps = {}, [], {}, {}, {}
    for peer in PEERS:
        try:
            if peer.startswith("gym-pool"):
                env, notes[peer] = _gym_pool(env_id, n)
                close = env.close
                run = _stepper(env, n) if peer == "gym-pool" else _collecting(env, n)
            elif peer == "envpool":
                run, close = _envpool_alone(env_id, n, cores)
                notes[peer] = f"{cores} threads"
            else:
                env = EnvPoolVectorEnv(env_id, n, seed=0, num_threads=cores)
                close = env.close
                run = _stepper(env, n) if peer == "rlstash-envpool" else _collecting(env, n)
        except Exception as exc:  # noqa: BLE001 - the table says why
            errors[peer] = f"{type(exc).__name__}: {exc}"[:200]
            continue
        runs[peer], closers = run, [*closers, close]
        steps[peer] = n * (T if peer.endswith("-stream") else 1)  # env steps per run(1)
    try:
        from collect_peers import _exclude_descendants

        with common.cpu_meter() as meter:
            _exclude_descendants(meter)  # the pools' workers are ours, not others' load
            timings = common.interleaved(runs, reps=reps, target_s=target_s)
    finally:
        for close in closers:
            close()
    return {
        "game": game, "n": n,
        "rates": {k: t.median * steps[k] for k, t in timings.items()},
        "all": {k: [r * steps[k] for r in t.rates] for k, t in timings.items()},
        "notes": notes, "errors": errors, "others_load": getattr(meter, "others", None),
    }  # fmt: skip


def render(cells: list[dict], info: dict, cmd: str, load: tuple[str, str]) -> str:
    import common

    lines = [
        f"## Atari frames/s by backend ({info.get('date', '?')}, issue 27)",
        "",
        f"`{cmd}`. {common.load_sentence(load[0], load[1])} `others' load` is the cores "
        "other processes used during the cell; ratios within a cell are interleaved medians. "
        f"Load (`uptime`) before: {load[0]}; after: {load[1]}.",
        "",
        *common.header_lines(info),
        "",
        "(`torch_threads` is the parent's; each cell's process runs 1.)",
        "",
        "Agent steps/s (one step = 4 ALE frames), median of the interleaved repetitions; "
        "frames/s is 4x; in brackets the ratio to EnvPool alone with the same preprocessing. "
        "All peers make rlstash's Atari training env (noop 30, frame skip 4 with max-pool, "
        "84x84 grey, sticky 0.25, episodic life, clipped rewards, FIRE on reset; EnvPool "
        "stack_num 1, rlstash stacks 4).",
        "",
        "`spread`: (max - min) / median of each peer's 5 repetitions, the largest in the "
        "cell: how far one repetition strayed under the load (ratios below that are noise).",
        "",
        "| game | N | " + " | ".join(PEERS) + " | others' load (cores) | spread |",
        "| --- | ---: | " + " | ".join("---:" for _ in PEERS) + " | ---: | ---: |",
    ]
    for c in cells:
        base = c["rates"].get("envpool")
        row = [common.rate_cell(c["rates"].get(p), base) for p in PEERS]
        load_c = c.get("others_load")
        spread = max((max(v) - min(v)) / sorted(v)[len(v) // 2] for v in c["all"].values())
        lines.append(
            f"| {c['game']} | {c['n']} | " + " | ".join(row)
            + f" | {'?' if load_c is None else f'{load_c:.2f}'} | {100 * spread:.0f}% |"
        )  # fmt: skip
    lines += ["", "Frames/s (4 x the above):", ""]
    lines += ["| game | N | " + " | ".join(PEERS) + " |"]
    lines += ["| --- | ---: | " + " | ".join("---:" for _ in PEERS) + " |"]
    for c in cells:
        row = [common.fmt_rate(FRAME_SKIP * c["rates"][p]) if p in c["rates"] else "–"
               for p in PEERS]  # fmt: skip
        lines.append(f"| {c['game']} | {c['n']} | " + " | ".join(row) + " |")
    lines += ["", "Ratios within a cell:", ""]
    for c in cells:
        r = c["rates"]
        pairs = (
            ("rlstash-envpool", "envpool", "the adapter's cost"),
            ("rlstash-envpool-stream", "envpool", "collector + stream over EnvPool"),
            ("rlstash-envpool-stream", "gym-pool-stream", "EnvPool vs gymnasium workers, "
             "end to end into the stream"),
            ("gym-pool-stream", "gym-pool", "collector + stream over the gymnasium pool"),
        )  # fmt: skip
        parts = [f"{a} / {b} {r[a] / r[b]:.2f}x ({why})" for a, b, why in pairs
                 if a in r and b in r]  # fmt: skip
        lines.append(f"- {c['game']} {c['n']}: " + "; ".join(parts))
    layouts = sorted({f"{c['n']} envs: {c['notes'].get('gym-pool')}" for c in cells})
    lines += ["", "gym-pool layouts (the library default): " + "; ".join(layouts) + "."]
    errs = [(c["game"], c["n"], p, e) for c in cells for p, e in c["errors"].items()]
    if errs:
        lines += ["", "Not run:", ""] + [f"- {g} {n} {p}: {e}" for g, n, p, e in errs]
    return "\n".join(lines) + "\n"


def _uptime() -> str:
    out = subprocess.run(["uptime"], capture_output=True, text=True).stdout
    return out.strip().split("load average:")[-1].strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--games", default="Pong,Breakout")
    ap.add_argument("--n", default="8,32")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--target-s", type=float, default=1.0)
    ap.add_argument("--out", default=str(HERE / "results" / "collect_atari.md"))
    ap.add_argument("--cell", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--rerender", default=None, help="a run's log: its section written again")
    args = ap.parse_args()
    if args.cell:
        game, n = args.cell.split(":")
        print(json.dumps(cell(game, int(n), args.reps, args.target_s)))
        return 0
    import common

    cmd = (f".venv-atari/bin/python bench/collect_atari_backends.py --games {args.games} "
           f"--n {args.n} --reps {args.reps} --target-s {args.target_s}")  # fmt: skip
    before, cells = _uptime(), []
    if args.rerender:  # the run's stdout: its cells, then its section (the header lines kept)
        text = Path(args.rerender).read_text()
        cells = [json.JSONDecoder().raw_decode(line)[0] for line in text.splitlines()
                 if line.startswith('{"game"')]  # fmt: skip
        head = text[: text.index("Agent steps/s")].splitlines()
        info = dict(line[2:].split(": ", 1) for line in head if line.startswith("- "))
        load = re.search(r"before: (.*?); after: (.*?)\.$", text, re.M)
        section = render(cells, info, cmd, (load.group(1), load.group(2)))
        old = Path(args.out).read_text()
        title = "## Atari frames/s by backend (" + str(info["date"])
        old = old[: old.index(title)] if title in old else old.rstrip("\n") + "\n\n"
        Path(args.out).write_text(old + section)
        return 0
    for game in args.games.split(","):
        for n in args.n.split(","):
            start = time.time()
            run = [sys.executable, __file__, "--cell", f"{game}:{n}", "--reps", str(args.reps),
                   "--target-s", str(args.target_s)]  # fmt: skip
            out = subprocess.run(run, capture_output=True, text=True, timeout=1800, env=os.environ)
            if out.returncode != 0:
                print(out.stderr[-3000:], file=sys.stderr)
                return 1
            cells.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(json.dumps(cells[-1]), f"({time.time() - start:.0f} s)", flush=True)
    text = render(cells, common.machine_info(), cmd, (before, _uptime()))
    path = Path(args.out)
    old = path.read_text() if path.exists() else ""
    path.write_text(old.rstrip("\n") + "\n\n" + text if old else text)  # a new dated section
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
