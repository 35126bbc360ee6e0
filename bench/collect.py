#!/usr/bin/env python3
"""Env-collection benchmark: rlstash ProcessPoolVectorEnv against gymnasium, SB3, TorchRL and a raw loop.

    python3 bench/collect.py [--quick] [--out bench/results/collect.md] [--envs a,b]
                             [--reps N] [--target-s S] [--no-torchrl] [--timeout S]
    python3 bench/collect.py --rerender   # the report again from bench/.work/collect-last.json

Runs in ``.venv-bench`` (re-executes itself there, creating it with bench/setup_env.py when
missing; installs ``imageio`` and ``packaging``, which gymnasium's MuJoCo envs import, when
they are missing). Random actions drawn by one numpy sampler in the loop, the same for every
peer (TorchRL's collectors draw their own: ``policy=None``).

Phases, each piece in a fresh process (bench/collect_peers.py):

1. throughput cells (env, num_envs): every peer of the cell is built, then all are timed
   interleaved (``common.interleaved``: one repetition of each in turn, medians), with the
   machine's load recorded (``common.cpu_meter``). Envs CartPole-v1, Pendulum-v1,
   HalfCheetah-v5, Burn-200us (rlstash.envs.testing.BurnEnv) at 8 and 32 envs; 256 envs
   only for CartPole-v1 and Burn-200us, and there without the one-process-per-env peers
   (256 processes on 2 cores), to keep the run under ~15 minutes;
2. start-up and memory at 32 envs (and CartPole at 256), one fresh process per peer:
   construction to the first step done (library imports excluded), RSS and PSS of the process
   tree and per worker after 0.5 s of stepping, time to close;
3. TorchRL (slow to start): once per env at 32 envs, MultiSyncCollector and
   MultiAsyncCollector over two collector processes of ``SerialEnv(16)`` each (one per core,
   like ProcessPoolVectorEnv's two workers), plus ``Collector(ParallelEnv(2 x SerialEnv(16)))`` for
   CartPole; each in its own process with a timeout. Its collector processes keep working
   while the main process waits, so it is not interleaved: contiguous windows of batches,
   against the raw loop timed alone in the same process before and after (that ratio is the
   comparable number); leaked-semaphore warnings and processes left behind are counted.

Issue 27's peers (the library's default layout, EnvPool alone and through rlstash's
collectors into a StreamStorage, PufferLib's Multiprocessing, Atari cells) are in
``bench/collect_backends.py`` (results: ``bench/results/collect_backends.md``, summarised in
``collect.md``): they need envpool and pufferlib, which this script's ``.venv-bench`` lacks.

Goals of issue 4 are checked at the end (PASS/FAIL lines). Exit code 1 when a non-TorchRL
peer fails (the table says why).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VENV_PY = ROOT / ".venv-bench" / "bin" / "python"
CONSTRAINTS = ROOT / ".venv-bench" / "bench-constraints.txt"
WORK = HERE / ".work"
MUJOCO_DEPS = ("imageio", "packaging")  # gymnasium.envs.mujoco imports them
sys.path.insert(0, str(HERE))


def _ensure_mujoco_deps() -> None:
    """pip-install what gymnasium's MuJoCo envs import, when missing (torch stays pinned)."""
    import importlib.util

    missing = [m for m in MUJOCO_DEPS if importlib.util.find_spec(m) is None]
    if not missing:
        return
    pin = ["-c", str(CONSTRAINTS)] if CONSTRAINTS.exists() else []
    print(f"[collect] installing {', '.join(missing)} into .venv-bench", flush=True)
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", *pin, *missing])


# ----------------------------------------------------------------------------- processes

_LEAK = re.compile(r"There appear to be (\d+) leaked (\w+) objects")


def _session_pids(sid: int) -> list[int]:
    import psutil

    pids = []
    for pid in psutil.pids():
        with contextlib.suppress(OSError):
            if pid != sid and os.getsid(pid) == sid:
                pids.append(pid)
    return pids


def _cmdline(pid: int) -> str:
    import psutil

    with contextlib.suppress(psutil.Error):
        return " ".join(psutil.Process(pid).cmdline())[-120:]
    return "?"


def spawn(task: dict, timeout_s: float) -> dict:
    """Run one worker task in a fresh process (own session); its result or ``error``.

    Adds ``wall_s``, ``leaks`` (resource-tracker leak reports on its stderr, by kind) and
    ``orphans`` (processes of its session still alive 5 s after it exited; then killed).
    """
    WORK.mkdir(parents=True, exist_ok=True)
    fd, result = tempfile.mkstemp(prefix="collect-", suffix=".json", dir=WORK)
    os.close(fd)
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    )
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        json.dumps(dict(task, result=result)),
    ]
    t0 = time.perf_counter()
    out: dict = {}
    with tempfile.TemporaryFile(mode="w+") as err:
        proc = subprocess.Popen(
            cmd, stderr=err, stdin=subprocess.DEVNULL, env=env, start_new_session=True
        )
        try:
            code = proc.wait(timeout=timeout_s)
            text = Path(result).read_text() if code == 0 else ""
            out = json.loads(text) if text else {"error": f"worker exited with code {code}"}
        except subprocess.TimeoutExpired:
            out = {"error": f"timed out after {timeout_s:.0f} s (killed)"}
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        out["wall_s"] = time.perf_counter() - t0
        orphans = _session_pids(proc.pid)
        deadline = time.monotonic() + 5.0  # helpers notice their parent is gone: give them 5 s
        while orphans and time.monotonic() < deadline:
            time.sleep(0.2)
            orphans = _session_pids(proc.pid)
        out["orphans"] = len(orphans)
        out["orphan_cmds"] = [_cmdline(pid) for pid in orphans]
        for pid in orphans:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        err.seek(0)
        stderr = err.read()
    Path(result).unlink(missing_ok=True)
    leaks: dict[str, int] = {}
    for count, kind in _LEAK.findall(stderr):
        leaks[kind] = leaks.get(kind, 0) + int(count)
    out["leaks"] = leaks
    if "error" in out:
        tail = "\n".join(stderr.strip().splitlines()[-15:])
        print(
            f"[collect] {task['mode']} {task.get('env')} failed: {out['error']}\n{tail}",
            file=sys.stderr,
        )
    return out


def _describe(task: dict) -> str:
    peer = task.get("peer") or f"{len(task['peers'])} peers"
    return f"{task['mode']} {task['env']} n={task['n']} {peer}"


def run_all(args: argparse.Namespace) -> dict:
    """Every phase; results keyed as in ``plan``."""
    import collect_peers as cp

    tasks = cp.plan(args)
    results: dict[str, list] = {}
    start = time.perf_counter()
    for phase, items in tasks.items():
        results[phase] = []
        for task in items:
            timeout = args.torchrl_timeout if phase == "torchrl" else args.timeout
            print(f"[collect] {time.perf_counter() - start:6.0f} s  {_describe(task)}", flush=True)
            results[phase].append({"task": task, "result": spawn(task, timeout)})
    return results


def _worker_main(task: dict) -> int:
    import collect_peers as cp

    result = cp.run_task(task)
    Path(task["result"]).write_text(json.dumps(result))
    return 0


# ----------------------------------------------------------------------------- report


def _cells(results: dict) -> dict[tuple[str, int], dict]:
    return {(r["task"]["env"], r["task"]["n"]): r["result"] for r in results.get("cells", [])}


def _rate(cells: dict, env: str, n: int, peer: str) -> float | None:
    rate = cells.get((env, n), {}).get("rates", {}).get(peer)
    return rate["median"] if rate else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _chosen(note: str) -> str:
    m = re.search(r"chose (.+?) \(", note or "")
    return m.group(1).replace(" (num_workers=0)", "") if m else "?"


def throughput_table(results: dict) -> tuple[str, list[str], list[str]]:
    """Env steps/s (ratio to the raw loop of the same cell) per cell and peer."""
    import collect_peers as cp
    from common import fmt_rate, fmt_ratio, markdown_table

    cells = _cells(results)
    rows, notes, failed = [], [], []
    for (env, n), res in cells.items():
        raw = _rate(cells, env, n, "raw")
        row: list[object] = [env, n]
        for peer in cp.PEERS:
            rate = _rate(cells, env, n, peer)
            if peer in res.get("errors", {}):
                row.append("error")
                failed.append(f"{env}/{n}/{peer}")
                notes.append(f"- {env}, {n} envs, {cp.PEERS[peer]}: {res['errors'][peer]}")
            elif rate is None:
                row.append("—" if "error" not in res else "error")
            else:
                row.append(f"{fmt_rate(rate)} ({fmt_ratio(_ratio(rate, raw))})")
        if "error" in res:
            failed.append(f"{env}/{n}")
            notes.append(f"- {env}, {n} envs: the cell failed: {res['error']}")
        auto = res.get("notes", {}).get("rlstash-auto")
        row.append(_chosen(auto) if auto else "—")
        cpu = res.get("cpu", {})
        row.append(f"{cpu.get('others', float('nan')):.2f}" if cpu else "—")
        spreads = sorted(r["spread"] for r in res.get("rates", {}).values())
        row.append(f"{100 * spreads[len(spreads) // 2]:.0f}%" if spreads else "—")
        rows.append(row)
    headers = ["env", "N", *cp.PEERS, "auto chose", "others' load (cores)", "spread"]
    return markdown_table(headers, rows), notes, failed


def footprint_table(results: dict) -> str:
    """Start-up and memory per (env, N, peer), each measured in a fresh process."""
    from common import fmt_bytes, markdown_table

    rows = []
    for item in results.get("footprints", []):
        t, r = item["task"], item["result"]
        if "error" in r:
            rows.append([t["env"], t["n"], t["peer"], "error", "—", "—", "—", "—", "—", r["error"]])
            continue
        rows.append([
            t["env"], t["n"], t["peer"], f"{r['startup_s']:.2f}", r["processes"],
            fmt_bytes(r["tree_rss"]), fmt_bytes(r["tree_pss"]), fmt_bytes(r["worker_rss"]),
            f"{r['close_s']:.2f}", _leftovers(r),
        ])  # fmt: skip
    headers = ["env", "N", "peer", "start-up s", "processes", "tree RSS", "tree PSS",
               "RSS per worker", "close s", "notes"]  # fmt: skip
    return markdown_table(headers, rows)


def _leftovers(r: dict) -> str:
    parts = []
    if r.get("left_after_close"):
        parts.append(f"{r['left_after_close']} child processes alive after close")
    if r.get("orphans"):
        parts.append(f"{r['orphans']} processes left after exit (killed)")
    parts += [f"{v} leaked {k} reported" for k, v in r.get("leaks", {}).items()]
    cmds = r.get("left_cmds", []) + r.get("orphan_cmds", [])
    if cmds:
        parts.append(f"e.g. `{cmds[0][-60:]}`")
    return "; ".join(parts) or "—"


def torchrl_table(results: dict) -> str:
    """TorchRL collectors: start-up to the first batch, frames/s and ratio to raw."""
    import collect_peers as cp
    from common import fmt_bytes, fmt_rate, fmt_ratio, markdown_table

    if not results.get("torchrl"):
        return "Not run (`--no-torchrl`)."
    rows = []
    for item in results.get("torchrl", []):
        t, r = item["task"], item["result"]
        label = cp.TORCHRL[t["peer"]]
        if "error" in r or "rate" not in r:
            why = r.get("error", "no timing")
            rows.append([t["env"], t["n"], label, "—", "—", "—", "—", "—", "—", "—",
                         f"{why}; {_leftovers(r)}"])  # fmt: skip
            continue
        rows.append([
            t["env"], t["n"], label, f"{r['startup_s']:.1f}", fmt_rate(r["rate"]),
            fmt_ratio(r["ratio"]), r["processes"], fmt_bytes(r["tree_rss"]),
            fmt_bytes(r["worker_rss"]), f"{r['close_s']:.1f}", _leftovers(r),
        ])  # fmt: skip
    headers = ["env", "N", "collector", "start-up s", "frames/s", "ratio to raw", "processes",
               "tree RSS", "RSS per worker", "shutdown s", "notes"]  # fmt: skip
    return markdown_table(headers, rows)


def _foot(results: dict, env: str, n: int, peer: str) -> dict:
    for item in results.get("footprints", []):
        t = item["task"]
        if (t["env"], t["n"], t["peer"]) == (env, n, peer):
            return item["result"]
    return {}


def _line(ok: bool | None, text: str) -> str:
    return f"{'SKIP' if ok is None else 'PASS' if ok else 'FAIL'}: {text}"


def goals(results: dict) -> list[str]:
    """PASS/FAIL lines for the goals of issue 4 (SKIP when not measured)."""
    from common import fmt_ratio

    cells, cp1 = _cells(results), "CartPole-v1"
    raw = _rate(cells, cp1, 32, "raw")
    w2 = _ratio(_rate(cells, cp1, 32, "rlstash-w2"), raw)
    asy = _ratio(_rate(cells, cp1, 32, "rlstash-w2"), _rate(cells, cp1, 32, "gym-async"))
    trl = [i["result"].get("ratio") for i in results.get("torchrl", []) if i["task"]["env"] == cp1]
    trl = [x for x in trl if x]
    vs_trl = w2 / max(trl) if w2 and trl else None
    lines = [
        _line(None if w2 is None else w2 >= 0.5, f"CartPole-v1 32 envs, 2 workers: {fmt_ratio(w2)} raw (goal >= 0.5x)"),
        _line(None if asy is None else asy >= 4, f"... vs gymnasium AsyncVectorEnv: {fmt_ratio(asy)} (goal >= 4x)"),
        _line(None if vs_trl is None else vs_trl >= 10,
              f"... vs best TorchRL collector (ratios to raw): {fmt_ratio(vs_trl)} (goal >= 10x)"),
    ]  # fmt: skip
    w0 = _ratio(_rate(cells, cp1, 32, "rlstash-w0"), raw)
    w0_all = [_ratio(_rate(cells, e, n, "rlstash-w0"), _rate(cells, e, n, "raw")) for e, n in cells]
    w0_all = [x for x in w0_all if x]
    worst = f"; lowest over all cells {fmt_ratio(min(w0_all))}" if w0_all else ""
    lines.append(_line(None if w0 is None else w0 >= 0.9,
                       f"num_workers=0, CartPole-v1 32 envs: {fmt_ratio(w0)} raw (goal >= 0.9x){worst}"))  # fmt: skip
    lines.append(_auto_goal(cells))
    for env, n, goal in (("Burn-200us", 32, 1.8), ("HalfCheetah-v5", 32, 1.5)):
        raw_rate = _rate(cells, env, n, "raw")
        ratios = {k: _ratio(_rate(cells, env, n, k), raw_rate) for k in TWO_CORES}
        got = [r for r in ratios.values() if r is not None]
        best = max(got) if got else None
        load = cells.get((env, n), {}).get("cpu", {}).get("others")
        extra = f" (others used {load:.2f} of the cores meanwhile)" if load is not None else ""
        each = ", ".join(f"{label} {fmt_ratio(ratios[k])}" for k, label in TWO_CORES.items())
        lines.append(_line(None if best is None else best >= goal,
                           f"{env} {n} envs on 2 cores: {each} raw (goal >= {goal}x){extra}"))  # fmt: skip
    f = _foot(results, cp1, 32, "rlstash-w2")
    mb = f["worker_rss"] / 2**20 if f.get("worker_rss") else None
    lines.append(_line(None if mb is None else mb <= 40, f"RSS per worker, CartPole-v1 2 workers: {mb or float('nan'):.1f} MiB (goal <= 40 MiB)"))  # fmt: skip
    s = f.get("startup_s")
    lines.append(_line(None if s is None else s <= 1.0, f"start-up to first step, CartPole-v1 32 envs, 2 workers: {s or float('nan'):.2f} s (goal <= 1 s)"))  # fmt: skip
    return lines


TWO_CORES = {  # the ways to use 2 cores, in the HalfCheetah/Burn goal lines
    "rlstash-w2": "2 workers",
    "rlstash-w1c": "1 worker + the caller's n//2",
    "rlstash-auto": "auto",
}


def _auto_goal(cells: dict) -> str:
    """auto must say what it chose and pick the fastest of in-process, 2 workers and 1 worker
    + the caller's share (a tie within 15% counts as right)."""
    wrong, checked = [], 0
    for (env, n), res in cells.items():
        note = res.get("notes", {}).get("rlstash-auto", "")
        keys = ("rlstash-w0", "rlstash-w2", "rlstash-w1c")
        rates = {k: _rate(cells, env, n, k) for k in keys}
        if None in rates.values() or "rlstash-auto" not in res.get("rates", {}):
            continue
        checked += 1
        chose = _chosen(note)
        if chose == "?":
            wrong.append(f"{env}/{n}: no message")
            continue
        key = (
            "rlstash-w0" if chose == "in-process"
            else "rlstash-w1c" if "envs in this process" in chose
            else "rlstash-w2"
        )  # fmt: skip
        picked, best = rates[key], max(rates.values())  # type: ignore[type-var]
        if picked < 0.85 * best:  # type: ignore[operator]
            wrong.append(f"{env}/{n}: chose {chose} at {picked:,.0f}/s vs {best:,.0f}/s")
    text = f'num_workers="auto" picks the faster and says so, in {checked - len(wrong)}/{checked} cells'
    return _line(
        None if not checked else not wrong, text + (f" ({'; '.join(wrong)})" if wrong else "")
    )


def _load_line(results: dict) -> str:
    """Other users' busy cores while timing (``common.cpu_meter``), over every timed phase."""
    import statistics

    others = [
        item["result"]["cpu"]["others"]
        for phase in ("cells", "torchrl")
        for item in results.get(phase, [])
        if "cpu" in item["result"]
    ]
    if not others:
        return "- concurrent load of other users: not measured"
    return (
        f"- concurrent load of other users while timing (common.cpu_meter): median "
        f"{statistics.median(others):.2f} busy cores, {min(others):.2f}-{max(others):.2f} "
        f"over {len(others)} timed runs, of {os.cpu_count()} cores"
    )


def render(results: dict, info: dict, args: argparse.Namespace) -> tuple[str, list[str]]:
    """The markdown report and the peers that failed."""
    from common import header_lines

    table, notes, failed = throughput_table(results)
    lines = ["# Env collection: rlstash ProcessPoolVectorEnv vs gymnasium, SB3, TorchRL", "",
             "`python bench/collect.py" + (" --quick" if args.quick else "") + "`", "",
             *header_lines(info), _load_line(results), "", "## Goals (issue 4)", "", *goals(results), "",
             "## Throughput: env steps/s (ratio to the raw loop of the same cell), medians", "",
             f"{args.reps} interleaved repetitions of ~{args.target_s} s per peer; random actions "
             "sampled by numpy in the loop. `others' load`: cores busy with other users' work "
             "while the cell ran (2 cores in all); `spread`: (max - min) / median of a peer's "
             "repetitions, the median over the cell's peers. 256 envs: CartPole and Burn only, without the "
             "one-process-per-env peers (gym-async, sb3-subproc).", "", table, "", *notes, "",
             "## Start-up and memory (fresh process per peer)", "",
             "Start-up: construction to the first step done, library imports excluded. Memory after "
             "0.5 s of stepping; PSS shares shared pages among the processes mapping them.", "",
             footprint_table(results), "", "## TorchRL collectors (32 envs, once per env)", "",
             "Each in its own process with a timeout; policy None (TorchRL's random policy). "
             "Not interleaved (collector processes keep working while the main process does "
             "something else): frames/s is the median of contiguous >= 1 s windows; `ratio to "
             "raw`: over the raw loop timed alone in that process before the collector started "
             "and after it shut down. Leaks: resource-tracker reports on stderr.", "",
             torchrl_table(results), ""]  # fmt: skip
    return "\n".join(lines), failed


# ----------------------------------------------------------------------------- CLI


def _parse(argv: list[str]) -> argparse.Namespace:
    import collect_peers as cp

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="32 envs, fewer peers: a smoke run")
    p.add_argument("--envs", default=",".join(cp.ENVS), help="comma list of " + ",".join(cp.ENVS))
    p.add_argument("--reps", type=int, default=None, help="interleaved repetitions (>= 5)")
    p.add_argument("--target-s", type=float, default=None, help="seconds per repetition")
    p.add_argument("--no-torchrl", dest="torchrl", action="store_false", help="skip TorchRL")
    p.add_argument("--timeout", type=float, default=300, help="seconds per worker process")
    p.add_argument("--torchrl-timeout", type=float, default=120, help="seconds per TorchRL run")
    p.add_argument("--out", default=str(HERE / "results" / "collect.md"), help="markdown output")
    p.add_argument("--rerender", action="store_true", help="re-render the last run's report")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return args
    args.envs = [e.strip() for e in args.envs.split(",") if e.strip()]
    for e in args.envs:
        if e not in cp.ENVS:
            p.error(f"--envs: expected names from {','.join(cp.ENVS)}, got {e!r}")
    if args.reps is None:
        args.reps = 5 if args.quick else 7
    if args.reps < 5:
        p.error(f"--reps: expected >= 5 interleaved repetitions, got {args.reps}")
    if args.target_s is None:
        args.target_s = 0.05 if args.quick else 0.2
    if args.target_s <= 0:
        p.error(f"--target-s: expected > 0 seconds, got {args.target_s}")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parse(argv)
    if args.worker:
        return _worker_main(json.loads(args.worker))
    last = WORK / "collect-last.json"
    if args.rerender:  # the report of the last run again, from its saved measurements
        saved = json.loads(last.read_text())
        info, results = saved["info"], saved["results"]
        vars(args).update(saved.get("args", {}))
    else:
        _ensure_mujoco_deps()
        from common import machine_info, timed_run

        info = machine_info()
        results = timed_run(lambda: run_all(args), info)
        kept = {k: getattr(args, k) for k in ("quick", "reps", "target_s")}
        WORK.mkdir(parents=True, exist_ok=True)
        last.write_text(json.dumps({"info": info, "results": results, "args": kept}))
    from common import publish

    text, failed = render(results, info, args)
    return publish(text, args.out, "collect", failed)


if __name__ == "__main__":
    from bench_venv import ensure_bench_venv

    ensure_bench_venv(__file__)
    sys.exit(main())
