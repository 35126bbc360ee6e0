#!/usr/bin/env python3
"""Soak: a long collection run through rlstash must not grow memory, fds, threads or /dev/shm.

    python3 bench/soak.py [--steps 1000000] [--every 100000] [--out bench/results/soak.md]

CartPole-v1, 8 envs, ``ProcessPoolVectorEnv(num_workers=2)`` -> ``Collector`` (random policy, a torch
callable drawing from a seeded ``torch.Generator``) -> ``ReplayBuffer`` over a
``StreamStorage`` (capacity 200,000): every batch (256 frames) is extended into the buffer and
a batch of 256 is sampled. Every ``--every`` env steps it records: RSS of the process tree
(main, forkserver, workers), open fds and threads of the main process and each worker, the
/dev/shm entries held (fd or mapping) by the tree, machine-wide /dev/shm usage, restarts.

Flat (PASS), measured from the sample at 200k steps on (start-up, the buffer filling and
lazily created thread pools settle before that): RSS grows < 5%, open fds and thread counts
do not change at all, the tree holds no more /dev/shm entries, no worker restarted. After
``close()``: no child process left and no /dev/shm entry created by the run remains.
Runs in ``.venv-bench`` like the other benchmarks.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VENV_PY = ROOT / ".venv-bench" / "bin" / "python"
SHM = Path("/dev/shm")
sys.path.insert(0, str(HERE))

NUM_ENVS, WORKERS, FRAMES, SAMPLE, CAPACITY = 8, 2, 256, 256, 200_000
SETTLED_AT = 200_000  # flatness is judged from this sample on
RSS_GROWTH = 0.05


# ----------------------------------------------------------------------------- probes


def shm_entries() -> dict[str, int]:
    """/dev/shm entry name -> size in bytes (machine-wide)."""
    out = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir(SHM):
            with contextlib.suppress(OSError):
                out[entry.name] = entry.stat(follow_symlinks=False).st_size
    return out


def _fds(pid: int) -> list[str]:
    """Targets of the open fds of ``pid``."""
    base = f"/proc/{pid}/fd"
    out = []
    with contextlib.suppress(OSError):
        for fd in os.listdir(base):
            with contextlib.suppress(OSError):
                out.append(os.readlink(f"{base}/{fd}"))
    return out


def _shm_maps(pid: int) -> set[str]:
    """Distinct /dev/shm files and memfds mapped by ``pid``."""
    found = set()
    with contextlib.suppress(OSError), open(f"/proc/{pid}/maps") as fh:
        for line in fh:
            parts = line.split(maxsplit=5)
            path = parts[5].strip() if len(parts) == 6 else ""  # anonymous maps have no path
            if path.startswith("/dev/shm/") or path.startswith("/memfd:"):
                found.add(path.removesuffix(" (deleted)"))
    return found


def probe(pids: dict[str, int]) -> dict:
    """One sample of the tree: RSS, fds, threads and shm held per role (main/workers/helpers)."""
    import psutil

    me = psutil.Process()
    procs = {me.pid: me}
    for child in me.children(recursive=True):
        procs[child.pid] = child
    rss, threads, fds, held = 0, {}, {}, set()
    for pid, p in procs.items():
        with contextlib.suppress(psutil.Error):
            rss += p.memory_info().rss
            role = next((r for r, q in pids.items() if q == pid), f"helper {pid}")
            threads[role] = p.num_threads()
            targets = _fds(pid)
            fds[role] = len(targets)
            held |= {
                t.removesuffix(" (deleted)")
                for t in targets
                if t.startswith("/dev/shm/") or t.startswith("/memfd:")
            }
            held |= _shm_maps(pid)
    shm = shm_entries()
    return {
        "tree_rss": rss,
        "main_rss": me.memory_info().rss,
        "processes": len(procs),
        "threads": threads,
        "fds": fds,
        "shm_held": sorted(held),
        "shm_machine_bytes": sum(shm.values()),
        "shm_machine_entries": len(shm),
    }


def shm_owners(name: str) -> list[str]:
    """Processes (pid and command) that have /dev/shm/``name`` open or mapped."""
    path, owners = f"/dev/shm/{name}", []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if path in _shm_maps(int(pid)) or path in _fds(int(pid)):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
                owners.append(f"{pid} {cmd[-60:]}")
    return owners


class ShmWatch:
    """Notices every new /dev/shm entry (checked after each batch: one ``listdir``) and
    records, at that moment, whether this process tree or another process holds it."""

    def __init__(self) -> None:
        self.known = set(shm_entries())
        self.seen: dict[str, dict] = {}  # name -> {"step", "ours", "owners"}

    def check(self, step: int, tree: list[int]) -> None:
        with contextlib.suppress(OSError):
            fresh = set(os.listdir(SHM)) - self.known
            for name in fresh:
                path = f"/dev/shm/{name}"
                ours = any(path in _shm_maps(pid) or path in _fds(pid) for pid in tree)
                owners = [] if ours else shm_owners(name)
                self.seen[name] = {"step": step, "ours": ours, "owners": owners[:2]}
            self.known |= fresh


# ----------------------------------------------------------------------------- run


def soak(steps: int, every: int) -> dict:
    """Collect ``steps`` env steps, probing every ``every``; the series and the end state."""
    import psutil
    import torch
    from common import cpu_meter

    from rlstash import Collector, Field, ProcessPoolVectorEnv, ReplayBuffer, Spec, StreamStorage

    watch = ShmWatch()
    t0 = time.perf_counter()
    pool = ProcessPoolVectorEnv("CartPole-v1", NUM_ENVS, num_workers=WORKERS, seed=0)
    gen = torch.Generator().manual_seed(0)

    def policy(obs: torch.Tensor) -> torch.Tensor:  # obs [N, 4] -> actions [N] int64
        return torch.randint(0, 2, (obs.shape[0],), generator=gen)

    spec = Spec({"obs": Field((4,), torch.float32), "action": Field((), torch.int64)})
    rb = ReplayBuffer(StreamStorage(spec, num_envs=NUM_ENVS, capacity=CAPACITY), seed=0)
    collector = Collector(pool, policy, frames_per_batch=FRAMES)
    pids = {"main": os.getpid(), **{f"worker {i}": p for i, p in enumerate(pool.worker_pids)}}
    tree = [*pids.values(), *(c.pid for c in psutil.Process().children(recursive=True))]
    series = [dict(step=0, wall_s=0.0, rate=None, **probe(pids))]
    done, mark, t_mark = 0, every, time.perf_counter()
    with cpu_meter() as meter:
        for pid in pids.values():
            if pid != os.getpid():
                meter.exclude(pid)
        for batch in collector:
            rb.extend(batch)
            sampled = rb.sample(SAMPLE)
            done += FRAMES
            watch.check(done, tree)
            if done >= mark:
                now = time.perf_counter()
                rate = every / (now - t_mark)
                series.append(dict(step=done, wall_s=now - t0, rate=rate, **probe(pids)))
                series[-1]["restarts"] = len(pool.restarts)
                series[-1]["sampled_rows"] = int(sampled["obs"].shape[0])
                print(f"[soak] {done:>9,} steps  {rate:,.0f}/s", flush=True)
                mark, t_mark = mark + every, time.perf_counter()
            if done >= steps:
                break
    workers_now = list(pool.worker_pids)
    pool.close()
    time.sleep(0.3)
    left = [c.pid for c in psutil.Process().children(recursive=True)]
    shm_after = shm_entries()
    watch.check(done, [])
    return {
        "series": series,
        "cpu": {k: round(getattr(meter, k), 3) for k in ("wall_s", "machine", "own", "others")},
        "workers_excluded": round(meter.excluded, 3),
        "same_workers": workers_now == [pids[k] for k in pids if k != "main"],
        "left_after_close": left,
        "shm_seen": watch.seen,  # entries that appeared during the run
        "shm_left": sorted(n for n in watch.seen if n in shm_after),
        "steps": done,
        "wall_s": time.perf_counter() - t0,
        "settled_at": min(SETTLED_AT, 2 * every),  # short runs (--every) judge from 2 samples
    }


# ----------------------------------------------------------------------------- report


def verdict(res: dict) -> list[str]:
    """PASS/FAIL lines: flat from ``res["settled_at"]`` on, clean after close."""
    from common import fmt_bytes

    settled_at = res["settled_at"]
    tail = [s for s in res["series"] if s["step"] >= settled_at]
    if len(tail) < 2:
        return [f"FAIL: fewer than two samples from {settled_at:,} steps on: nothing to judge"]
    first = tail[0]
    growth = (max(s["tree_rss"] for s in tail) - first["tree_rss"]) / first["tree_rss"]
    fds_ok = all(s["fds"] == first["fds"] for s in tail)
    thr_ok = all(s["threads"] == first["threads"] for s in tail)
    shm_ok = all(s["shm_held"] == first["shm_held"] for s in tail)
    restarts = tail[-1].get("restarts", 0)

    def line(ok: bool, text: str) -> str:
        return f"{'PASS' if ok else 'FAIL'}: {text}".rstrip()

    delta = fmt_bytes(max(s["tree_rss"] for s in tail) - first["tree_rss"])
    seen, left = res["shm_seen"], res["shm_left"]
    ours = sorted(name for name, v in seen.items() if v["ours"])
    files = sorted({f for s in res["series"] for f in s["shm_held"] if f.startswith("/dev/shm/")})
    return [
        line(growth < RSS_GROWTH, f"tree RSS growth from {settled_at:,} steps: "
             f"{growth:+.2%} (+{delta}; limit {RSS_GROWTH:.0%})"),
        line(fds_ok, f"open fds per process unchanged from {settled_at:,} steps: {first['fds']}"),
        line(thr_ok, f"threads per process unchanged: {first['threads']}"),
        line(shm_ok, f"/dev/shm and memfd entries held by the tree unchanged: "
             f"{len(first['shm_held'])} ({', '.join(first['shm_held']) or 'none'})"),
        line(restarts == 0 and res["same_workers"], f"worker restarts: {restarts}, "
             f"same worker processes throughout: {res['same_workers']}"),
        line(not res["left_after_close"], f"child processes left after close(): "
             f"{len(res['left_after_close'])}"),
        line(not files, f"/dev/shm files held by the tree at any sample: {len(files)} "
             f"{files[:5] or ''}"),
        line(not ours, f"new /dev/shm entries held by the tree when they appeared: {len(ours)}"
             f" {ours[:5] or ''}"),
        line(not set(ours) & set(left), "of those, left in /dev/shm after close(): "
             f"{len(set(ours) & set(left))}"),
        f"INFO: /dev/shm entries that appeared during the run, not held by the tree (other users "
        f"share the machine): {len(seen) - len(ours)}, {len(set(left) - set(ours))} still "
        f"there after close" + _owners_note(seen),
    ]  # fmt: skip


def _owners_note(seen: dict[str, dict]) -> str:
    others = {k: v for k, v in seen.items() if not v["ours"]}
    if not others:
        return ""
    name, v = sorted(others.items(), key=lambda kv: kv[1]["step"])[0]
    who = f"held by pid {v['owners'][0]}" if v["owners"] else "held by no process by then"
    return f" (e.g. {name} at {v['step']:,} steps, {who})"


def series_table(res: dict) -> str:
    """One row per sample."""
    from common import fmt_bytes, fmt_rate, markdown_table

    rows = []
    for s in res["series"]:
        workers = [k for k in s["fds"] if k.startswith("worker")]
        rows.append([
            f"{s['step']:,}", f"{s['wall_s']:.0f}", fmt_rate(s["rate"]), fmt_bytes(s["tree_rss"]),
            fmt_bytes(s["main_rss"]), s["processes"], s["fds"].get("main", "—"),
            "/".join(str(s["fds"][w]) for w in workers), s["threads"].get("main", "—"),
            "/".join(str(s["threads"][w]) for w in workers), len(s["shm_held"]),
            fmt_bytes(s["shm_machine_bytes"]), s["shm_machine_entries"],
        ])  # fmt: skip
    headers = ["env steps", "s", "steps/s", "tree RSS", "main RSS", "processes", "fds main",
               "fds workers", "threads main", "threads workers", "shm held by tree",
               "/dev/shm (machine)", "/dev/shm entries"]  # fmt: skip
    return markdown_table(headers, rows)


def render(res: dict, info: dict, argv: list[str]) -> str:
    """The markdown report."""
    from common import header_lines

    cpu = res["cpu"]
    load = (f"CPU during the run: machine {cpu['machine']:.2f} cores, this process "
            f"{cpu['own']:.2f}, its workers {res['workers_excluded']:.2f}, other users "
            f"{cpu['others']:.2f} (2 cores in all).")  # fmt: skip
    return "\n".join([
        "# Soak: 1,000,000 env steps through ProcessPoolVectorEnv -> Collector -> ReplayBuffer", "",
        f"`python bench/soak.py {' '.join(argv)}`".replace(" `", "`"), "",
        *header_lines(info), "",
        f"CartPole-v1, {NUM_ENVS} envs, ProcessPoolVectorEnv(num_workers={WORKERS}), Collector("
        f"frames_per_batch={FRAMES}, random torch policy), ReplayBuffer(StreamStorage("
        f"capacity={CAPACITY:,})): extend every batch, sample {SAMPLE} every batch. "
        f"{res['steps']:,} env steps in {res['wall_s']:.0f} s. {load}", "",
        f"Flat: from the {res['settled_at']:,} sample on, tree RSS grows < 5% and open fds, threads and held "
        "/dev/shm/memfd entries do not change at all. `shm held by tree`: distinct /dev/shm "
        "files and memfds open or mapped by the tree (ProcessPoolVectorEnv's memfd: nothing in /dev/shm). "
        "Machine-wide /dev/shm is shown for reference (other users share it).", "",
        "## Verdict", "", *verdict(res), "", "## Series", "", series_table(res), "",
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=1_000_000, help="env steps in all")
    p.add_argument("--every", type=int, default=100_000, help="env steps between samples")
    p.add_argument("--out", default=str(HERE / "results" / "soak.md"), help="markdown output")
    args = p.parse_args(argv)
    if args.every < FRAMES or args.steps < 3 * args.every:
        p.error(f"--every: expected >= {FRAMES} and --steps >= 3 x --every, got "
                f"--every {args.every}, --steps {args.steps}")  # fmt: skip
    from common import machine_info

    info = machine_info()
    res = soak(args.steps, args.every)
    text = render(res, info, argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)
    print(f"[soak] wrote {out}", flush=True)
    return 0 if not any(line.startswith("FAIL") for line in verdict(res)) else 1


if __name__ == "__main__":
    from bench_venv import ensure_bench_venv

    ensure_bench_venv(__file__)
    sys.exit(main())
