"""Tables of bench/learn.py: bench/results/learn.md (each side's preset, the 100,000-action
parts) and bench/results/learn_same.md (identical settings, update rates).

A part with no kept runs keeps its section from the previous report, labelled with that
report's date; text after the notes marker is kept as it is.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from learn_tasks import LIBS, TASKS

PATIENCE = 5  # rlstash train's default: evaluations in a row at or above the threshold
GOAL_TIME = 0.7  # rlstash may take at most this fraction of SB3's training seconds
NOTES_MARKER = "<!-- notes: kept when the tables above are regenerated -->"
POINTS = {"first": "first eval >= threshold", "stays": "stays >= threshold to the end",
          "solved": f"{PATIENCE} evals in a row (where `rlstash train` stops)"}  # fmt: skip


def points(curve: list[list[float]], threshold: float | None, patience: int = PATIENCE) -> dict:
    """(step, seconds) at the first eval >= threshold, from where all later stay >= it, and
    at the end of the first run of ``patience`` evals in a row >= it (None when never)."""
    ok = [threshold is not None and r[2] >= threshold for r in curve]
    first = next((i for i, v in enumerate(ok) if v), None)
    stays = None
    for i in range(len(ok) - 1, -1, -1):
        if not ok[i]:
            break
        stays = i
    solved, run = None, 0
    for i, v in enumerate(ok):
        run = run + 1 if v else 0
        if run >= patience:
            solved = i
            break

    def at(i: int | None) -> list[float] | None:
        return None if i is None else [curve[i][0], curve[i][1]]

    return {"first": at(first), "stays": at(stays), "solved": at(solved)}


def median_or_inf(values: list[float | None]) -> float:
    """Median where a missing value (never reached) counts as +inf."""
    return statistics.median([math.inf if v is None else v for v in values]) if values else math.nan


def _cell(value: float | None, fmt: str) -> str:
    return (
        "never" if value is None or math.isinf(value) or math.isnan(value) else format(value, fmt)
    )


def _ratio(a: float, b: float) -> str:
    if not all(math.isfinite(x) for x in (a, b)) or not b:
        return "—"
    return f"{a / b:.2f}x"


def _title(name: str, budget: int) -> str:
    task = TASKS[name]
    what = "identical settings" if task["group"] == "same" else "each side's preset"
    goal = f"threshold {task['threshold']:g}, " if task["threshold"] is not None else ""
    return f"## {task['algo'].upper()} {task['env']}, {what}: {goal}budget {budget:,} env steps"


def _load(r: dict) -> str:
    return " ".join(map(str, r.get("load_before_after", [])))


def _settings_lines(runs: dict) -> list[str]:
    lines = []
    for lib in LIBS:
        settings = next((r["settings"] for r in runs[lib].values() if "settings" in r), None)
        if settings:
            lines += ["", f"{lib} settings: `{json.dumps(settings)}`"]
    return lines


def _per_run(runs: dict, cells: Any, headers: list[str]) -> list[str]:
    """The per-run table: one row per (seed, library), ``cells(run)`` its middle columns."""
    from common import markdown_table

    rows = []
    for seed in sorted({s for lib in LIBS for s in runs[lib]}, key=int):
        for lib in LIBS:
            r = runs[lib].get(seed)
            if r is None:
                continue
            if "error" in r:
                rows.append([seed, lib, r["error"], *[""] * (len(headers) - 3)])
                continue
            commit = r.get("commit", "?") if lib == "rlstash" else "—"  # SB3 runs no rlstash code
            rows.append([seed, lib, *cells(r), _load(r), commit])
    return [markdown_table(["seed", "library", *headers[2:]], rows)]


def speed_section(name: str, budget: int, runs: dict) -> list[str]:
    """A part without a threshold: training seconds for the budget, env steps/s, returns."""
    from common import markdown_table

    ok = {lib: [r for r in runs[lib].values() if "error" not in r] for lib in LIBS}
    rows, med = [], {}
    for lib in LIBS:
        if not ok[lib]:
            continue
        med[lib] = statistics.median(r["train_seconds"] for r in ok[lib])
        fin = [r["curve"][-1][2] for r in ok[lib] if r["curve"]]
        rows.append([f"{budget:,}", lib, len(ok[lib]), f"{med[lib]:.1f}",
                     f"{budget / med[lib]:.1f}",
                     f"{statistics.median(fin):.0f}" if fin else "not evaluated"])  # fmt: skip
    lines = [_title(name, budget), ""]
    if len(med) == 2:
        lines += [f"- {budget:,} env steps: rlstash takes **{med['rlstash'] / med['sb3']:.2f}x** "
                  "SB3's training seconds (medians over seeds)", ""]  # fmt: skip
    lines += [markdown_table(["env steps", "library", "seeds", "train s", "env steps/s",
                              "final eval return"], rows), "", "Per run:", ""]  # fmt: skip

    def cells(r: dict) -> list[str]:
        return [f"{r['train_seconds']:.1f}", f"{r['steps'] / r['train_seconds']:.1f}",
                " ".join(f"{c[0]}:{c[2]:.0f}" for c in r["curve"])]  # fmt: skip

    headers = ["seed", "library", "train s", "env steps/s", "eval step:return",
               "load 1m before/after", "commit"]  # fmt: skip
    return lines + _per_run(runs, cells, headers) + _settings_lines(runs) + [""]


def return_at(curve: list[list[float]], step: int) -> list[float] | None:
    """[env step, return] of the first evaluation at or after ``step`` (None: none)."""
    return next(([c[0], c[2]] for c in curve if c[0] >= step), None)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def returns_section(name: str, budget: int, runs: dict) -> list[str]:
    """A part with ``returns_at``: median eval return at those env steps and training seconds
    for the budget; goals: rlstash's return >= SB3's at each, seconds <= GOAL_TIME x SB3's."""
    from common import markdown_table

    task = TASKS[name]
    ok = {lib: [r for r in runs[lib].values() if "error" not in r] for lib in LIBS}
    rows, goals = [], []
    for step in task["returns_at"]:
        med = {}
        for lib in LIBS:
            found = [return_at(r["curve"], step) for r in ok[lib]]
            med[lib] = _median([f[1] for f in found]) if None not in found else math.nan
        rl, sb = med["rlstash"], med["sb3"]
        rows.append([f"{step:,}", _cell(rl, ".0f"), _cell(sb, ".0f"), _cell(rl - sb, "+.0f")])
        goals.append(f"- return at {step:,} env steps: {_cell(rl, '.0f')} vs {_cell(sb, '.0f')}: "
                     f"**{'met' if rl >= sb else 'missed'}**")  # fmt: skip
    secs = {lib: _median([r["train_seconds"] for r in ok[lib]]) for lib in LIBS}
    rt, st = secs["rlstash"], secs["sb3"]
    goals.append(f"- training seconds for the budget: {_cell(rt, '.1f')} vs {GOAL_TIME} x "
                 f"{_cell(st, '.1f')}: **{'met' if rt <= GOAL_TIME * st else 'missed'}**")  # fmt: skip
    n = {lib: len(ok[lib]) for lib in LIBS}
    lines = [_title(name, budget), "",
             f"Medians over seeds (rlstash {n['rlstash']}, SB3 {n['sb3']}); the return at N is "
             "each run's first evaluation at or after N env steps (SB3 evaluates at N exactly, "
             "rlstash at the end of the rollout that passes N):", "",
             markdown_table(["env steps", "rlstash return", "SB3 return", "rlstash - SB3"],
                            rows), "",
             markdown_table(["", "rlstash", "SB3", "ratio"],
                            [["training seconds, whole budget", _cell(rt, ".1f"),
                              _cell(st, ".1f"), _ratio(rt, st)]]), "",
             f"Goal (rlstash >= SB3's return at equal steps, <= {GOAL_TIME}x its training "
             "seconds):", "", *goals, "", "Per run (return at N: env step: return):", ""]  # fmt: skip

    def cells(r: dict) -> list[str]:
        at = [return_at(r["curve"], step) for step in task["returns_at"]]
        marks = ["never" if a is None else f"{a[0]:,}: {a[1]:.0f}" for a in at]
        rets = " ".join(f"{c[2]:.0f}" for c in r["curve"])
        return [*marks, f"{r['train_seconds']:.1f}", f"{r['steps'] / r['train_seconds']:.0f}", rets]

    headers = ["seed", "library", *(f"return at {s // 1000}k" for s in task["returns_at"]),
               "train s", "steps/s", "eval returns", "load 1m before/after", "commit"]  # fmt: skip
    return lines + _per_run(runs, cells, headers) + _settings_lines(runs) + [""]


def end_to_end_section(name: str, budget: int, eager: dict, compiled: dict) -> list[str]:
    """Env steps/s of rlstash eager and compiled (part ``name``, ``compile=True``) against SB3
    (the eager part's runs, shared), each over its whole run, compile time included."""
    from common import markdown_table

    task = TASKS[name]
    seeds = set(compiled["rlstash"])  # only seeds run with all three sides (same invocation)
    sides = {side: {s: r for s, r in runs.items() if s in seeds}
             for side, runs in (("rlstash eager", eager["rlstash"]),
                                ("rlstash compile=True", compiled["rlstash"]),
                                ("SB3", eager["sb3"]))}  # fmt: skip
    ok = {k: [r for r in v.values() if "error" not in r] for k, v in sides.items()}
    rate = {k: _median([r["steps"] / r["train_seconds"] for r in rs]) for k, rs in ok.items()}
    rows = []
    for side, rs in ok.items():
        comp = [r["compile_seconds"] for r in rs if r.get("compile_seconds")]
        net = [r["steps"] / (r["train_seconds"] - r["compile_seconds"]) for r in rs
               if r.get("compile_seconds")]  # fmt: skip
        rows.append([side, len(rs), _cell(_median([r["train_seconds"] for r in rs]), ".1f"),
                     _cell(rate[side], ".1f"), _ratio(rate[side], rate["SB3"]),
                     _cell(_median(comp), ".1f") if comp else "",
                     _cell(_median(net), ".1f") if net else ""])  # fmt: skip
    lines = [f"## End to end, compiled updates: {task['algo'].upper()} {task['env']}, identical "
             f"settings, {budget:,} env steps", "",
             f"`rlstash train` with the settings of the `{task['eager']}` part, eager and with "
             "`compile=True`, against the same SB3 runs; medians over seeds of env steps / "
             "training seconds (evaluation excluded). The compile time is what the trainer says "
             "once (\"compiled the update in ... s\"); it is inside the training seconds, and "
             "the last column takes it out.", "",
             markdown_table(["side", "seeds", "train s", "env steps/s", "x SB3", "compile s",
                             "env steps/s without compile"], rows), "",
             "Per run:", ""]  # fmt: skip
    per_run = []
    for seed in sorted({s for v in sides.values() for s in v}, key=int):
        for side, v in sides.items():
            r = v.get(seed)
            if r is None:
                continue
            if "error" in r:
                per_run.append([seed, side, r["error"], "", "", "", ""])
                continue
            commit = r.get("commit", "?") if side != "SB3" else "—"
            comp = r.get("compile_seconds")
            per_run.append([seed, side, f"{r['train_seconds']:.1f}",
                            f"{r['steps'] / r['train_seconds']:.1f}",
                            f"{comp:.1f}" if comp else "", _load(r), commit])  # fmt: skip
    lines.append(markdown_table(["seed", "side", "train s", "env steps/s", "compile s",
                                 "load 1m before/after", "commit"], per_run))  # fmt: skip
    return lines + [""]


def _net(settings: dict) -> tuple[int, ...]:
    """Hidden layers of a run's settings (rlstash: net_arch; SB3: policy_kwargs.net_arch)."""
    net = settings.get("net_arch") or settings.get("policy_kwargs", {}).get("net_arch")
    return tuple(net)


def update_rate_lines(name: str, runs: dict) -> list[str]:
    """Updates per training second against the FLOP limit: the updates' matmul FLOPs
    (bench/updates.py) over the matmul rate measured in the run's process before and after it.
    Training seconds include acting and env steps, so this is a lower bound."""
    import updates
    from common import markdown_table

    task = TASKS[name]
    rows = []
    for lib in LIBS:
        ok = [r for r in runs[lib].values() if "error" not in r and r.get("matmul_flops")]
        if not ok:
            continue
        net = _net(ok[0]["settings"])
        flops = updates.flops_per_update(task["algo"], net, lib, dims=task["update_rate"])
        rate = _median([r["updates_at"][0] / r["updates_at"][1] for r in ok])
        peak = _median([statistics.mean(r["matmul_flops"]) for r in ok])
        frac = _median([r["updates_at"][0] / r["updates_at"][1] * flops
                        / statistics.mean(r["matmul_flops"]) for r in ok])  # fmt: skip
        rows.append([lib, len(ok), str(list(net)), f"{flops / 1e6:.0f}", f"{rate:.1f}",
                     f"{peak / 1e9:.0f}", f"{peak / flops:.0f}", f"{frac:.2f}"])  # fmt: skip
    if not rows:
        return []
    return ["Update rate against the FLOP limit (medians over seeds; updates / training seconds, "
            "which include acting and env steps; the matmul rate is measured in the run's "
            "process just before and after it):", "",
            markdown_table(["library", "seeds", "net", "MFLOP/update", "updates/s",
                            "matmul GFLOP/s", "limit updates/s", "fraction of limit"], rows),
            ""]  # fmt: skip


def learning_section(name: str, budget: int, runs: dict) -> list[str]:
    """First crossing / stays / solved: medians, goals and the per-run table of ``name``."""
    from common import markdown_table

    task = TASKS[name]
    if task.get("returns_at"):
        return returns_section(name, budget, runs)
    if task["threshold"] is None:
        return speed_section(name, budget, runs)
    goal_time = task.get("goal_time", GOAL_TIME)
    rows, goals = [], []
    for key, label in POINTS.items():
        med = {}
        for lib in LIBS:
            pts = [points(r["curve"], task["threshold"])[key] for r in runs[lib].values()
                   if "error" not in r]  # fmt: skip
            med[lib] = (median_or_inf([p and p[0] for p in pts]),
                        median_or_inf([p and p[1] for p in pts]))  # fmt: skip
        (rs, rt), (ss, st) = med["rlstash"], med["sb3"]
        rows.append([label, _cell(rs, ",.0f"), _cell(ss, ",.0f"), _ratio(rs, ss),
                     _cell(rt, ".1f"), _cell(st, ".1f"), _ratio(rt, st)])  # fmt: skip
        if key != "solved":
            ok = math.isfinite(rs) and rs <= ss and rt <= goal_time * st
            goals.append(f"- {label}: steps {_cell(rs, ',.0f')} vs {_cell(ss, ',.0f')}, seconds "
                         f"{_cell(rt, '.1f')} vs {goal_time} x {_cell(st, '.1f')}: "
                         f"**{'met' if ok else 'missed'}**")  # fmt: skip
    n = {lib: sum("error" not in r for r in runs[lib].values()) for lib in LIBS}
    lines = [_title(name, budget), "",
             f"Medians over seeds (rlstash {n['rlstash']}, SB3 {n['sb3']}; never = +inf):", "",
             markdown_table(["point", "rlstash steps", "SB3 steps", "ratio", "rlstash s",
                             "SB3 s", "ratio"], rows), "",
             f"Goal (rlstash <= SB3 env steps and <= {goal_time}x its training seconds):", "",
             *goals, "", *update_rate_lines(name, runs),
             "Per run (env steps / training seconds; the last columns: whole budget):",
             ""]  # fmt: skip

    def cells(r: dict) -> list[str]:
        p = points(r["curve"], task["threshold"])
        marks = [f"{_cell(p[k] and p[k][0], ',.0f')} / {_cell(p[k] and p[k][1], '.1f')}"
                 for k in POINTS]  # fmt: skip
        rets = " ".join(f"{c[2]:.0f}" for c in r["curve"])
        return [*marks, f"{r['train_seconds']:.1f}", f"{r['steps'] / r['train_seconds']:.0f}", rets]

    headers = ["seed", "library", "first", "stays", "solved", "train s", "steps/s",
               "eval returns", "load 1m before/after", "commit"]  # fmt: skip
    return lines + _per_run(runs, cells, headers) + _settings_lines(runs) + [""]


def contextual_section(part: dict, algo: str = "Discrete SAC") -> list[str]:
    import contextual
    from common import markdown_table

    lines = [f"## {algo}, 100,000 actions (bench/contextual.py)", ""]
    lines += [contextual.SUMMARY if algo == "Discrete SAC" else contextual.PPO_SUMMARY, ""]
    rows, curves = [], []
    for key, r in part.items():
        if "error" in r:
            rows.append([key, r["error"], "", "", "", "", ""])
            continue
        last = r["curve"][-1]
        rows.append([f"{r['n_actions']:,}", r["form"], f"{last[2]:.3f}", f"{last[3]:.2f}",
                     f"{r['rss_before_mib']:.0f}", f"{r['peak_extra_mib']:.0f}",
                     f"{r['s_per_update']:.3f}"])  # fmt: skip
        curves.append(f"- {r['form']}: " + " ".join(f"{c[0]}:{c[2]:.2f}/{c[3]:.2f}"
                                                    for c in r["curve"]))  # fmt: skip
    lines.append(markdown_table(["actions", "form", "final return", "hit rate",
                                 "RSS before MiB", "peak extra MiB", "s/update"], rows))  # fmt: skip
    lines += ["", "Return curves (env step: greedy return / hit rate over the 16 contexts):", ""]
    return lines + curves + [""]


# --------------------------------------------------------------------------- whole reports


class Previous:
    """The sections ("## ..." to the next) and notes of a report being regenerated."""

    def __init__(self, path: Path):
        text = path.read_text() if path.exists() else ""
        head, _, self.notes = text.partition(NOTES_MARKER)
        self.date = next((x.removeprefix("- date: ") for x in text.splitlines()
                          if x.startswith("- date: ")), "an earlier date")  # fmt: skip
        block = head.split("\nMachine", 1)[1].split("\n\n")[1] if "\nMachine" in head else ""
        self.machine_lines = [x for x in block.splitlines() if x.startswith("- ")]
        chunks = head.split("\n## ")[1:]
        self.sections = {"## " + c.split("\n", 1)[0]: "## " + c.rstrip() for c in chunks}

    def kept(self, *prefixes: str) -> list[str]:
        """The previous section whose heading starts with one of ``prefixes``, labelled with
        the date of the run that produced it (a section kept before keeps its label)."""
        for heading, text in self.sections.items():
            if not heading.startswith(prefixes):
                continue
            body = text.split("\n", 1)[1] if "\n" in text else ""
            body = body.split("\n# ", 1)[0].rstrip()  # never a following top-level heading
            if " (kept from " in heading:
                return [heading, body, ""]
            note = f"*Not rerun this time: the tables below are from the run of {self.date}.*"
            return [f"{heading} (kept from {self.date})", "", note, body, ""]
        return []


def _old_headings(name: str) -> tuple[str, ...]:
    """Headings a part's section had in earlier reports (before and after the fold)."""
    task = TASKS[name]
    head = f"## {task['algo'].upper()} {task['env']}"
    if task["group"] == "same":
        return (f"{head}, identical settings",)
    return (f"{head}, each side's preset", f"{head}: threshold")


def _header(title: str, paras: list[str], machine: dict, old: Previous) -> list[str]:
    from common import header_lines

    lines = [title, ""]
    for para in paras:
        lines += [para, ""]
    machine_lines = header_lines(machine) if machine else old.machine_lines
    return lines + ["Machine (of the newest run in these tables):", "", *machine_lines, ""]


def write_reports(store: Any, results_dir: Path, paras: dict[str, list[str]]) -> list[Path]:
    """Regenerate learn.md and learn_same.md from the kept runs in ``store`` (bench/learn.py's
    RunStore); ``paras``: the method paragraphs of each report."""
    import updates

    written = []
    for report, group in (("learn.md", "preset"), ("learn_same.md", "same")):
        out = results_dir / report
        old = Previous(out)
        body: list[str] = []
        newest: dict = {}
        for name, task in TASKS.items():
            if task["group"] != group:
                continue
            budget, runs = store.part_runs(name)
            if "eager" in task:  # compiled against the eager part's SB3 runs
                if runs["rlstash"]:
                    _, eager = store.part_runs(task["eager"])
                    body += end_to_end_section(name, budget, eager, runs)
                else:
                    body += old.kept(f"## End to end, compiled updates: {task['algo'].upper()}")
                continue
            kept = old.kept(*_old_headings(name))
            if all(runs[lib] for lib in LIBS) or (any(runs.values()) and not kept):
                body += learning_section(name, budget, runs)
                for r in (r for lib in LIBS for r in runs[lib].values()):
                    if r.get("date", "") >= newest.get("date", ""):
                        newest = r
            else:  # a part with one side only (e.g. shared SB3 runs) keeps its old section
                body += kept
        extra = (
            [("contextual", "Discrete SAC"), ("ppo_contextual", "PPO")] if group == "preset" else []
        )
        for kind, algo in extra:
            items = store.items(kind)
            body += (contextual_section(items, algo) if items
                     else old.kept(f"## {algo}, 100,000 actions"))  # fmt: skip
        if group == "same":
            items = store.items("updates")
            body += updates.section(items) if items else old.kept("## Update rates")
        lines = _header(paras[report][0], paras[report][1:], newest.get("machine", {}), old)
        lines += body
        results_dir.mkdir(parents=True, exist_ok=True)
        out.write_text("\n".join(lines) + "\n" + NOTES_MARKER + old.notes)
        written.append(out)
    return written
