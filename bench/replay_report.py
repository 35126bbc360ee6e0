"""Markdown report of bench/replay.py: goals, per-workload tables, memory, failures.

Ratios between two buffers timed in different worker processes (W2 at full size) go through
each one's ratio to the numpy limit timed beside it: ``a / b = (a / limit_a) / (b / limit_b)``.
Within one process the two forms are the same number.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

import replay_peers as rp
from common import fmt_bytes, fmt_rate, fmt_ratio, gb_per_s, header_lines, markdown_table

CONDS = ("quiet", "load")
RL, RLM, TRL, TRLM, CPP = (
    "rlstash-tensor",
    "rlstash-memmap",
    "torchrl-tensor",
    "torchrl-memmap",
    "cpprb",
)


def aggregate(groups: list[dict]) -> dict[str, dict[str, Any]]:
    """Per peer: label, delivered bytes, error, and per op/condition: rate and x limit."""
    agg: dict[str, dict[str, Any]] = {}
    limit_rates: dict[tuple[str, str], list[float]] = {}
    for g in groups:
        for key, info in g.get("info", {}).items():
            agg.setdefault(key, {"ops": {}}).update(info)
        for key, msg in g.get("errors", {}).items():
            agg.setdefault(key, {"ops": {}})["error"] = msg
        for cond in CONDS:
            for run_key, t in g.get(cond, {}).items():
                key, op = run_key.split("|")
                lim = g[cond].get(f"limit|{op}", {}).get("median")
                if key == "limit":
                    limit_rates.setdefault((op, cond), []).append(t["median"])
                    continue
                cell = {"rate": t["median"], "x_limit": t["median"] / lim if lim else None}
                cell["spread"] = (max(t["rates"]) - min(t["rates"])) / t["median"]
                agg.setdefault(key, {"ops": {}})["ops"].setdefault(op, {})[cond] = cell
    for (op, cond), rates in limit_rates.items():
        cell = {"rate": statistics.median(rates), "x_limit": 1.0, "spread": None}
        agg.setdefault("limit", {"ops": {}})["ops"].setdefault(op, {})[cond] = cell
    return agg


def cell(agg: dict, key: str, op: str, cond: str = "quiet") -> dict | None:
    return agg.get(key, {}).get("ops", {}).get(op, {}).get(cond)


def ratio(agg: dict, a: str, b: str, op: str, cond: str = "quiet") -> float | None:
    """Throughput of ``a`` over ``b`` (through the limit when both have a ratio to it)."""
    ca, cb = cell(agg, a, op, cond), cell(agg, b, op, cond)
    if not ca or not cb:
        return None
    if ca["x_limit"] and cb["x_limit"]:
        return ca["x_limit"] / cb["x_limit"]
    return ca["rate"] / cb["rate"]


def kept(agg: dict, key: str, op: str) -> float | None:
    """Loaded throughput over quiet throughput."""
    q, lo = cell(agg, key, op, "quiet"), cell(agg, key, op, "load")
    return lo["rate"] / q["rate"] if q and lo else None


def _cpu_lines(groups: list[dict]) -> list[str]:
    """How busy the machine was while each worker timed (cores, psutil)."""
    out = []
    for g in groups:
        q, lo = g.get("cpu_quiet"), g.get("cpu_load")
        if not q or not lo:
            continue
        names = sorted({k.split("|")[0] for k in g.get("quiet", {})})
        out.append(
            f"- CPU cores busy while timing {', '.join(names)}: quiet phase {q['machine']:.2f} "
            f"(this benchmark {q['own']:.2f}, other users {q['others']:.2f}); loaded phase "
            f"{lo['machine']:.2f} (benchmark {lo['own']:.2f}, competing process "
            f"{lo['excluded']:.2f}, other users {lo['others']:.2f})"
        )
    return out


def _order(agg: dict) -> list[str]:
    return [k for k in rp.PEERS if k in agg]


def sample_table(wl: rp.Workload, agg: dict) -> str:
    op_name = "steps/s (sample+update)" if wl.prioritized else "batches/s"
    headers = ["buffer", op_name, "GB/s", "x limit", "x TorchRL", "x cpprb"]
    headers += [
        f"{op_name} loaded",
        "x limit loaded",
        "loaded/quiet",
        "bytes returned",
        "spread",
    ]
    rows = []
    for key in _order(agg):
        entry, c = agg[key], cell(agg, key, "sample")
        label = entry.get("label", key)
        if "error" in entry or not c:
            rows.append([label, f"FAILED: {entry.get('error', 'no timing')}"] + ["—"] * 9)
            continue
        lo = cell(agg, key, "sample", "load") or {}
        rows.append(
            [
                label,
                fmt_rate(c["rate"]),
                f"{gb_per_s(c['rate'], wl.batch_bytes):.2f}",
                fmt_ratio(c["x_limit"]),
                fmt_ratio(ratio(agg, key, TRL, "sample")),
                fmt_ratio(ratio(agg, key, CPP, "sample")),
                fmt_rate(lo.get("rate")),
                fmt_ratio(lo.get("x_limit")),
                fmt_ratio(kept(agg, key, "sample")),
                f"{entry.get('delivered', 0):,}",
                "—" if c["spread"] is None else f"{c['spread'] * 100:.0f}%",
            ]
        )
    return markdown_table(headers, rows)


def extend_table(wl: rp.Workload, agg: dict) -> str:
    headers = ["buffer"]
    for c in wl.extend_chunks:
        headers += [f"chunk {c}: transitions/s", "x limit", "loaded", "loaded/quiet"]
    rows = []
    for key in _order(agg):
        entry = agg[key]
        row = [entry.get("label", key)]
        for c in wl.extend_chunks:
            q, lo = cell(agg, key, f"extend{c}"), cell(agg, key, f"extend{c}", "load")
            if "error" in entry or not q:
                row += ["FAILED" if "error" in entry else "—", "—", "—", "—"]
                continue
            row += [fmt_rate(q["rate"] * c), fmt_ratio(q["x_limit"])]
            row += [
                fmt_rate(lo["rate"] * c) if lo else "—",
                fmt_ratio(kept(agg, key, f"extend{c}")),
            ]
        rows.append(row)
    return markdown_table(headers, rows)


def memory_table(rss: dict[str, dict[str, dict]]) -> str:
    headers = ["workload", "buffer", "raw bytes", "RSS increase", "x raw", "anon", "file-backed"]
    rows = []
    for wl_name, per_peer in rss.items():
        for key in [k for k in rp.PEERS if k in per_peer]:
            r = per_peer[key]
            if "error" in r:
                rows.append([wl_name, key, "—", f"FAILED: {r['error']}", "—", "—", "—"])
                continue
            d = {p: r["after"][p] - r["before"][p] for p in ("total", "anon", "file")}
            rows.append(
                [
                    wl_name,
                    r["label"],
                    fmt_bytes(r["stored"]),
                    fmt_bytes(d["total"]),
                    fmt_ratio(d["total"] / r["stored"], 3),
                    fmt_bytes(d["anon"]),
                    fmt_bytes(d["file"]),
                ]
            )
    return markdown_table(headers, rows)


def rss_ratio(rss: dict, wl_name: str, key: str) -> float | None:
    r = rss.get(wl_name, {}).get(key)
    if not r or "error" in r:
        return None
    return (r["after"]["total"] - r["before"]["total"]) / r["stored"]


def goals(aggs: dict[str, dict], rss: dict) -> tuple[str, list[str]]:
    """The issue's goals, checked for rlstash TensorStorage and MemmapStorage."""

    def check(value: float | None, target: float, upper: bool = False) -> str:
        if value is None:
            return "—"
        ok = value <= target if upper else value >= target
        return f"{value:.2f}x {'pass' if ok else 'FAIL'}"

    def worst_kept(key: str) -> float | None:
        vals = [kept(a, key, op) for a in aggs.values() for op in a.get(key, {}).get("ops", {})]
        vals = [v for v in vals if v is not None]
        return min(vals) if vals else None

    w1, w2, w3 = (aggs.get(n, {}) for n in ("W1", "W2", "W3"))
    specs = [
        ("W1 sample vs TorchRL (same storage kind)", lambda k, t: ratio(w1, k, t, "sample"), 3.0),
        ("W1 sample vs the numpy limit", lambda k, t: ratio(w1, k, "limit", "sample"), 0.85),
        (
            "W1 extend chunk 8 vs numpy slice assignment",
            lambda k, t: ratio(w1, k, "limit", "extend8"),
            0.5,
        ),
        ("W2 sample vs TorchRL (same storage kind)", lambda k, t: ratio(w2, k, t, "sample"), 3.0),
        ("W2 sample vs the numpy limit", lambda k, t: ratio(w2, k, "limit", "sample"), 0.95),
        ("W3 sample+update vs TorchRL prioritized", lambda k, t: ratio(w3, k, TRL, "sample"), 3.0),
        ("W3 sample+update vs cpprb prioritized", lambda k, t: ratio(w3, k, CPP, "sample"), 2.0),
        ("worst loaded/quiet throughput (all ops)", lambda k, t: worst_kept(k), 0.5),
    ]
    rows = []
    for name, fn, target in specs:
        rows.append(
            [name, f">= {target}x", check(fn(RL, TRL), target), check(fn(RLM, TRLM), target)]
        )
    mem = [rss_ratio(rss, w, RL) for w in ("W1", "W2")]
    mem = [m for m in mem if m is not None]
    rows.append(
        [
            "TensorStorage RSS / raw bytes (W1, W2)",
            "<= 1.02x",
            check(max(mem) if mem else None, 1.02, True),
            "n/a",
        ]
    )
    failed = [r[0] for r in rows if "FAIL" in r[2] or "FAIL" in r[3]]
    return markdown_table(
        ["goal", "target", "rlstash TensorStorage", "rlstash MemmapStorage"], rows
    ), failed


def _method(args: argparse.Namespace) -> list[str]:
    return [
        f"- Command: `{' '.join(['python3 bench/replay.py', *sys.argv[1:]])}`",
        f"- {args.reps} interleaved repetitions per configuration, ~{args.target_s} s each; medians. "
        "'spread' = (max - min) / median of the quiet repetitions.",
        f"- Loaded: one pure-Python busy process pinned to core {args.core} "
        "(`os.sched_setaffinity`) while every configuration is timed again.",
        f"- Before each timing worker the run waited up to {args.wait_quiet:.0f} s for the rest of "
        "the machine to use < 0.5 cores; what it really used is printed under each table.",
        "- torch intra-op threads left at torch's default for every buffer (see torch_threads).",
        "- Limit: numpy `np.take(field, idx, axis=0, out=buf, mode='clip')` per field with idx from "
        "`Generator.integers`, exactly the fields of one batch; extend limit: slice assignment per field.",
        "- x TorchRL: against TorchRL LazyTensorStorage (W3: its TensorDictPrioritizedReplayBuffer); "
        "goals compare each rlstash storage with TorchRL's storage of the same kind.",
        "- W2: Stable-Baselines3 runs with optimize_memory_usage (next obs read from obs[i+1], so it "
        "returns twice the obs bytes); other buffers store and return obs + action.",
        "- cpprb returns numpy arrays (torch.from_numpy on them is zero-copy); the others torch tensors.",
        "- Memory: each buffer built and filled in a fresh process, after a warm-up on a tiny copy "
        "(imports, code pages) and malloc_trim; RSS difference (psutil, /proc/self/status) over "
        "the raw bytes of the fields. Memmap storages show their mapped page cache as file-backed.",
        "- The machine has 2 cores shared with other engineers running tests and builds at the "
        "same time: absolute rates are noise, ratios measured in one process are the result.",
    ]


def render(results: dict, info: dict, args: argparse.Namespace) -> tuple[str, list[str]]:
    """The markdown report and the list of peers (and goals) that failed."""
    wls = rp.workloads(args.quick)
    aggs = {name: aggregate(groups) for name, groups in results["time"].items()}
    lines = ["# Replay-buffer benchmark", ""]
    if args.quick:
        lines += ["**Quick smoke run: small capacities, numbers are not the result.**", ""]
    lines += ["## Machine", "", *header_lines(info), "", "## Method", "", *_method(args), ""]
    goal_text, _ = goals(aggs, results["rss"])
    lines += ["## Goals (rlstash)", "", goal_text, ""]
    for name, agg in aggs.items():
        wl, groups = wls[name], results["time"][name]
        lines += [f"## {name} {wl.title}: capacity {wl.capacity:,}, batch {wl.batch}", ""]
        lines += [
            f"Fields: {', '.join(f'{k} {d}{list(s)}' for k, (s, d) in wl.fields.items())}; "
            f"{wl.batch_bytes:,} bytes per batch.",
            "",
            sample_table(wl, agg),
            "",
        ]
        for a, b in ((RL, TRL), (RLM, TRLM), (RL, CPP)):
            r = ratio(agg, a, b, "sample")
            if r is not None:
                lines.append(
                    f"- {a} / {b}: {r:.2f}x (quiet), {fmt_ratio(ratio(agg, a, b, 'sample', 'load'))} (loaded)"
                )
        lines += [*_cpu_lines(groups), ""]
        if wl.extend_chunks:
            lines += [f"### {name} extend", "", extend_table(wl, agg), ""]
            for c in wl.extend_chunks:
                for a, b in ((RL, TRL), (RLM, TRLM), (RL, CPP), (RL, "sb3")):
                    r = ratio(agg, a, b, f"extend{c}")
                    if r is not None:
                        loaded = fmt_ratio(ratio(agg, a, b, f"extend{c}", "load"))
                        lines.append(f"- chunk {c}: {a} / {b}: {r:.2f}x (quiet), {loaded} (loaded)")
            lines.append("")
    if results["rss"]:
        lines += ["## Memory", "", memory_table(results["rss"]), ""]
    failed = sorted({f"{n}:{k}" for n, a in aggs.items() for k, e in a.items() if "error" in e})
    failed += sorted(
        f"{n}:{k} (memory)" for n, d in results["rss"].items() for k, r in d.items() if "error" in r
    )
    if failed:
        lines += ["## Failures", ""]
        lines += [
            f"- {n} {k}: {e['error']}"
            for n, a in aggs.items()
            for k, e in a.items()
            if "error" in e
        ]
        lines += [
            f"- {n} {k} (memory): {r['error']}"
            for n, d in results["rss"].items()
            for k, r in d.items()
            if "error" in r
        ]
        lines.append("")
    return "\n".join(lines), failed
