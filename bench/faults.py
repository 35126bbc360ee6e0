#!/usr/bin/env python3
"""The fault matrix: every fault and bad-input scenario of ``tests/faults/``, one line each.

Like a database's crash-test report: each scenario is one test of ``tests/faults/`` (its
docstring's first line says what is done to rlstash and what must hold afterwards), run for
real -- processes killed with SIGKILL, files damaged, disks filled, NaN fed in -- and reported
as ``held`` or ``FAILED``, grouped by the class of issue 22 it belongs to, with a total::

    .venv/bin/python bench/faults.py                       # print the report
    .venv/bin/python bench/faults.py --out bench/results/faults.md
    .venv/bin/python bench/faults.py -k stream             # a subset (pytest's -k)

A scenario that is skipped (an extra or a capability missing on this machine: Ray outside a
loopback namespace, tmpfs without root) is listed as ``skipped`` with pytest's reason and is
not counted as held. The exit status is 1 when any scenario failed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FAULTS = ROOT / "tests" / "faults"

# file stem -> the class of issue 22 (its "What to build" list) the scenarios belong to
CLASSES = {
    "test_rundir": "1. run directories self-contained and exclusive",
    "test_checksums": "2. everything written is verified when read",
    "test_finite": "3. non-finite values caught where they enter",
    "test_stream_crash": "4. crash-safe disk streams",
    "test_timeouts": "5. every timeout honoured",
    "test_ray_faults": "5. every timeout honoured (Ray)",
    "test_plan": "6. plan before allocate",
    "test_batched_contract": "7. batched-env contract",
    "test_cli_errors": "8. one-line CLI errors",
}


@dataclass
class Scenario:
    group: str
    name: str
    what: str
    function: str = ""
    outcome: str = "not run"
    seconds: float = 0.0
    detail: str = ""


class Recorder:
    """A pytest plugin that keeps one :class:`Scenario` per collected test."""

    def __init__(self) -> None:
        self.scenarios: dict[str, Scenario] = {}

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            stem = Path(str(item.fspath)).stem
            doc = (getattr(item, "function", None) and item.function.__doc__) or ""
            what = _first_sentence(doc) or "(no docstring: the test's name says it)"
            function = getattr(item, "originalname", item.name)
            self.scenarios[item.nodeid] = Scenario(
                CLASSES.get(stem, stem), item.name, what, function
            )

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        sc = self.scenarios.get(report.nodeid)
        if sc is None:
            return
        sc.seconds += report.duration
        if report.skipped:
            sc.outcome = "skipped"
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else ""
            sc.detail = str(reason).removeprefix("Skipped: ")
        elif report.failed:
            sc.outcome = "FAILED"
            text = (report.longreprtext or "").strip().splitlines()
            sc.detail = text[-1][:200] if text else ""
        elif report.when == "call" and sc.outcome != "FAILED":
            sc.outcome = "held"


def _first_sentence(doc: str, limit: int = 160) -> str:
    """The docstring's first sentence, on one line, at most ``limit`` characters."""
    text = " ".join(doc.strip().split("\n\n")[0].split())
    cut = text.find(". ")
    text = text if cut < 0 else text[: cut + 1]
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def report(scenarios: list[Scenario], seconds: float) -> str:
    held = sum(s.outcome == "held" for s in scenarios)
    failed = sum(s.outcome == "FAILED" for s in scenarios)
    skipped = sum(s.outcome == "skipped" for s in scenarios)
    lines = [
        "# Fault matrix (issue 22)",
        "",
        f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
        f"Python {platform.python_version()}; `python3 bench/faults.py` "
        f"(each scenario is a test in `tests/faults/`), {seconds:.0f} s in all.",
        "",
        "| class | scenario | what is done, and what must hold | result | s |",
        "|---|---|---|---|---:|",
    ]
    previous = None
    for s in sorted(scenarios, key=lambda s: s.group):
        result = s.outcome if not s.detail else f"{s.outcome}: {s.detail}"
        what = "〃 (another case of the line above)" if s.function == previous else s.what
        previous = s.function
        what = what.replace("|", "\\|")
        lines.append(
            f"| {s.group} | `{s.name}` | {what} | {result.replace('|', '/')} | {s.seconds:.1f} |"
        )
    lines += [
        "",
        f"**{held} held, {failed} failed, {skipped} skipped, of {len(scenarios)} scenarios.**",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="also write the report (markdown) here")
    ap.add_argument(
        "-k", default=None, help="only the scenarios matching this pytest -k expression"
    )
    args = ap.parse_args(argv)
    rec = Recorder()
    pytest_args = [str(FAULTS), "-q", "-p", "no:cacheprovider", "--no-header", "-rN"]
    if args.k:
        pytest_args += ["-k", args.k]
    t0 = time.perf_counter()
    pytest.main(pytest_args, plugins=[rec])
    text = report(list(rec.scenarios.values()), time.perf_counter() - t0)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 1 if any(s.outcome == "FAILED" for s in rec.scenarios.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
