"""The GPU part of bench/updates.py (``--device cuda``): every agent three ways on one device,
batch 256, updates/s, medians of interleaved repetitions (common.interleaved):

- eager: ``compile=False`` (autograd, fused Adam);
- compiled: ``compile=True`` with ``rlstash.agents.compiled.GRAPH_DEVICES = ()`` while its
  steps are built, so each step is ``torch.compile`` (inductor) only, launched kernel by kernel;
- compiled + CUDA graphs: ``compile=True`` as rlstash runs it on CUDA, each step captured once
  into a CUDA graph and replayed (``GraphedStep``).

Every timed call ends in ``torch.cuda.synchronize()`` (so both edges of a timing are
synchronized); the first 8 updates of each side (compilation, 2 warm-up calls, the capture;
TD3's actor step is captured on its 3rd call, the 6th update) run before timing, their
compilation seconds reported apart (the CUDA-graphed side is built after the compiled one in
the same process and compiles the same graphs: its compile seconds are inductor's cache hits;
the compiled side's are the cold compilation, slowed by the other configs compiling at once). A side's steps are checked to be of the expected kind
(``GraphedStep`` / ``CompiledStep``) on CUDA. The limit column is the float32 (IEEE, no TF32:
the agents' precision) 4096 x 4096 matmul rate measured in the same process, interleaved; the
TF32 rate is measured once after the timings.

One child process per config: all start at once and compile in parallel (inductor's compile
threads split among them), each says READY, then the parent lets them time one after the other
(nothing else runs on the GPU or competes for the CPU meanwhile). Every wait has a timeout;
each child's stderr goes to ``<out>_logs/<config>.log``. Stable-Baselines3 and the CleanRL-style
update are CPU peers here (the CPU table); SB3 rows say whether it is installed.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import IO, Any

import updates as U

SIDES = {  # side -> (compile, CUDA graphs)
    "eager": (False, True),
    "compiled": (True, False),
    "compiled + CUDA graphs": (True, True),
}
GPU_MATMUL_N = 4096
REPS, TARGET_S = 5, 0.2  # interleaved repetitions of each side, seconds each


def prepare(name: str, device: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(runs, result): every side built and warmed up (compiled, captured) on ``device``."""
    import torch

    torch.set_num_threads(1)
    algo, net = U.CONFIGS[name]
    size = GPU_MATMUL_N if torch.device(device).type == "cuda" else U.MATMUL_N
    out: dict[str, Any] = {"algo": algo, "net": list(net), "batch": U.BATCH, "device": device,
                           "matmul_n": size, "sides": {}}  # fmt: skip
    runs: dict[str, Any] = {"matmul": U.synced(U._matmul(device, size), device)}
    for side, (compile, graphs) in SIDES.items():
        print(f"[updates-gpu] {name}: building {side}", file=sys.stderr, flush=True)
        try:
            run = U._rlstash(algo, net, compile, device, graphs=graphs)
        except Exception as exc:  # noqa: BLE001 - reported in the table, the others still run
            traceback.print_exc()
            out["sides"][side] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            continue
        runs[side] = U.synced(run, device)
        out["sides"][side] = {"compile_s": run.compile_s, "first_s": run.first_s,
                              "steps": run.steps}  # fmt: skip
        print(f"[updates-gpu] {name}: {side} ready ({run.first_s:.1f} s, compile "
              f"{run.compile_s:.1f} s, {run.steps})", file=sys.stderr, flush=True)  # fmt: skip
    return runs, out


def time_sides(runs: dict[str, Any], out: dict[str, Any], device: str) -> dict[str, Any]:
    """Interleaved timing of the prepared sides; rates, ratios to eager, matmul limits."""
    import torch
    from common import interleaved

    timings = interleaved(runs, reps=REPS, target_s=TARGET_S)
    size = out["matmul_n"]
    peak = timings["matmul"].median * 2 * size**3
    out["matmul_flops"] = peak
    eager = timings["eager"].median if "eager" in timings else None
    for side in SIDES:
        if side not in timings:
            continue
        flops = U.flops_per_update(out["algo"], tuple(out["net"]), "rlstash")
        rate = timings[side].median
        out["sides"][side].update(flops=flops, updates_per_s=rate, spread=timings[side].spread,
                                  x_eager=rate / eager if eager else None,
                                  limit_per_s=peak / flops, fraction=rate * flops / peak)  # fmt: skip
    if torch.device(device).type == "cuda":
        out["gpu"] = torch.cuda.get_device_name()
        out["torch_cuda"] = torch.version.cuda
        out["tf32_flops"] = tf32_flops(device, size)
    return out


def tf32_flops(device: str, size: int, seconds: float = 0.5) -> float | str:
    """The matmul FLOP/s with TF32 allowed (``set_float32_matmul_precision("high")``), over
    ~``seconds``; the precision is restored after. An error message if it cannot be set."""
    import torch

    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        run = U.synced(U._matmul(device, size), device)
        run(2)
        n, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds:
            run(4)
            n += 4
        return n * 2 * size**3 / elapsed
    except Exception as exc:  # noqa: BLE001 - a column, not the benchmark
        return f"{type(exc).__name__}: {exc}"[:120]
    finally:
        with contextlib.suppress(Exception):
            torch.set_float32_matmul_precision(before)


def child(name: str, device: str, barrier: bool) -> int:
    """One config: prepare, (barrier: print READY, wait for "go" on stdin), time, print JSON."""
    runs, out = prepare(name, device)
    if barrier:
        print("READY " + json.dumps(out), flush=True)
        if sys.stdin.readline().strip() != "go":
            return 3  # the parent is gone or gave up on us
    print(json.dumps(time_sides(runs, out, device)), flush=True)
    return 0


class _Child:
    """A child process with a thread turning its stdout lines into a queue (None: EOF)."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], log: Path):
        self.name, self.log = name, log
        self.err: IO[str] = open(log, "w")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.err, text=True, env=env)  # fmt: skip
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.ready: dict[str, Any] | None = None
        self.result: dict[str, Any] | None = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def next_line(self, timeout: float) -> str | None:
        """The next stdout line; None at EOF; TimeoutError after ``timeout`` seconds."""
        try:
            return self.lines.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            raise TimeoutError(f"no output within {timeout:.0f} s") from None

    def error(self, why: str) -> dict[str, Any]:
        if not self.err.closed:
            self.err.flush()
        tail = [x for x in self.log.read_text(errors="replace").strip().splitlines() if x][-1:]
        return {"error": f"{why}; stderr: {tail} (log: {self.log.name})"[:400]}

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
        self.err.close()


def run_children(
    script: str, names: list[str], device: str, logs: Path, compile_timeout: float,
    measure_timeout: float, budget: float,
) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Every config in its own child: compiled in parallel, timed one after the other; no
    wait goes past ``budget`` seconds from now (a config left then is reported, not timed)."""
    logs.mkdir(parents=True, exist_ok=True)
    cores = len(os.sched_getaffinity(0))
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(max(1, cores // len(names))))
    cmd = [sys.executable, str(Path(script).resolve()), "--device", device, "--three-way"]
    cmd += ["--json", "--barrier", "--only"]
    children = {n: _Child(n, [*cmd, n], env, logs / f"{n}.log") for n in names}
    results: dict[str, dict[str, Any]] = {}
    start = time.monotonic()
    try:
        _await_ready(children, results, start + min(compile_timeout, budget))
        print(f"[updates-gpu] compiled in {time.monotonic() - start:.0f} s; timing", flush=True)
        for name, c in children.items():
            if name in results:
                continue
            assert c.proc.stdin is not None
            try:
                c.proc.stdin.write("go\n")
                c.proc.stdin.flush()
                left = start + budget - time.monotonic()
                if left < 5:
                    raise TimeoutError(f"not timed: the {budget:.0f} s budget was spent")
                results[name] = _result(c, time.monotonic() + min(measure_timeout, left))
            except (TimeoutError, OSError, json.JSONDecodeError) as exc:
                results[name] = c.error(f"timing: {exc}")
            c.close()
            print(f"[updates-gpu] {name}: {json.dumps(results[name])[:300]} "
                  f"(+{time.monotonic() - start:.0f} s)", flush=True)  # fmt: skip
    finally:
        for c in children.values():
            c.close()
    return results


def _result(c: _Child, deadline: float) -> dict[str, Any]:
    """The child's JSON result line (other stdout lines skipped), or its error at EOF."""
    while True:
        line = c.next_line(deadline - time.monotonic())
        if line is None:
            return c.error(f"exited (code {c.proc.wait(timeout=10)}) while timing")
        if line.startswith("{"):
            return json.loads(line)


def _await_ready(children: dict[str, _Child], results: dict, deadline: float) -> None:
    """Wait until every child printed READY or failed, at most until ``deadline``; the late
    ones are killed and reported."""
    waiting = dict(children)
    last_note = time.monotonic()
    while waiting and time.monotonic() < deadline:
        for name, c in list(waiting.items()):
            try:
                line = c.next_line(0.2)
            except TimeoutError:
                continue
            if line is None:
                results[name] = c.error(f"exited (code {c.proc.wait(timeout=10)}) before READY")
            elif line.startswith("READY "):
                c.ready = json.loads(line[6:])
                print(f"[updates-gpu] {name} compiled", flush=True)
            else:
                continue  # stray output: keep waiting
            waiting.pop(name)
        if time.monotonic() - last_note > 15:
            last_note = time.monotonic()
            print(f"[updates-gpu] still compiling: {sorted(waiting)}", flush=True)
    for name, c in waiting.items():
        results[name] = c.error("not compiled before the compile timeout")
        c.close()


def section(results: dict[str, Any]) -> list[str]:
    """The markdown table: one row per config and side, and an SB3 note per config."""
    from common import markdown_table

    sb3 = _sb3_note()
    rows = []
    for name, r in results.items():
        if "sides" not in r:
            rows.append([name, r.get("error", "?"), *[""] * 8])
            continue
        for side in SIDES:
            s = r["sides"].get(side, {})
            if "updates_per_s" not in s:
                rows.append([name, side, "", s.get("error", "not timed"), *[""] * 6])
                continue
            x_eager = f"{s['x_eager']:.2f}" if s.get("x_eager") else "—"
            compile_s = f"{s['compile_s']:.1f}" if s.get("compile_s") else ""
            rows.append([name, side, f"{s['flops'] / 1e6:.1f}", f"{s['updates_per_s']:.0f}",
                         x_eager, f"{s['spread']:.2f}", compile_s, f"{s['first_s']:.1f}",
                         f"{s['fraction']:.4f}", f"{r['matmul_flops'] / 1e12:.1f}"])  # fmt: skip
        rows.append([name, "SB3", "", sb3, *[""] * 6])
    headers = ["config", "side", "MFLOP/update", "updates/s", "x eager", "spread", "compile s",
               "first 8 updates s", "fraction of FP32 matmul", "FP32 matmul TFLOP/s"]  # fmt: skip
    return ["## Agent updates on the GPU", "", markdown_table(headers, rows), ""]


def _sb3_note() -> str:
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        return "not installed on this machine: skipped"
    return "installed; its update is measured on CPU only (bench/updates.py CPU table)"


def main(script: str, args: Any) -> int:
    """``bench/updates.py --device cuda``: the whole GPU table to ``args.out``."""
    from common import header_lines, machine_info, publish

    names = args.configs.split(",") if args.configs else list(U.CONFIGS)
    unknown = sorted(set(names) - set(U.CONFIGS))
    if unknown:
        raise SystemExit(f"--configs: expected names from {sorted(U.CONFIGS)}, got {unknown}")
    start = time.monotonic()
    info = machine_info()
    info["nvidia-smi"] = _nvidia_smi()
    out = Path(args.out)
    logs = out.with_name(out.stem + "_logs")
    results = run_children(script, names, args.device, logs, args.compile_timeout,
                           args.measure_timeout, args.budget)  # fmt: skip
    ok = [r for r in results.values() if "sides" in r]
    if ok:
        info["gpu (torch)"] = ok[0].get("gpu", "—")
        info["torch CUDA"] = ok[0].get("torch_cuda", "—")
        tf32 = [r["tf32_flops"] for r in ok if isinstance(r.get("tf32_flops"), float)]
        info["TF32 matmul TFLOP/s (4096^2, median over configs)"] = (
            f"{sorted(tf32)[len(tf32) // 2] / 1e12:.1f}" if tf32 else "not measured"
        )
    info["load_average_1m_end"] = round(os.getloadavg()[0], 2)
    info["wall_s"] = round(time.monotonic() - start)
    lines = ["# Agent updates on the GPU: rlstash eager, compiled, compiled + CUDA graphs", ""]
    lines += [*header_lines(info), ""]
    lines += [x for para in __doc__.split("\n\n") for x in (para.replace("``", "`"), "")]
    lines += section(results)
    out.with_suffix(".json").parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    failed = [n for n, r in results.items() if "error" in r]
    return publish("\n".join(lines), out, "updates-gpu", failed)


def _nvidia_smi() -> str:
    cmd = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"not available ({type(exc).__name__})"
    return done.stdout.strip() or f"exit code {done.returncode}"
