"""bench/learn.py's run store and tables (the benchmark itself needs .venv-bench and hours)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import learn  # noqa: E402
import learn_report  # noqa: E402

WRITER = """
import sys
sys.path.insert(0, {bench!r})
from learn import RunStore
store = RunStore(__import__("pathlib").Path({root!r}))
lib, parity = sys.argv[1], int(sys.argv[2])
for seed in range(parity, 40, 2):
    # both writers add runs to the same shared run id and one run id of their own
    store.save_run("sb3-shared", 1000, seed, {{"writer": lib, "seed": seed}})
    store.save_run(lib + "-own", 1000, seed, {{"writer": lib, "seed": seed}})
"""


def test_concurrent_invocations_keep_every_run(tmp_path):
    """Two writers saving at the same time (as `--libs rlstash` and `--libs sb3` side by side):
    every run of both is kept (the old single results file lost one writer's runs)."""
    code = WRITER.format(bench=str(BENCH), root=str(tmp_path))
    procs = [
        subprocess.Popen([sys.executable, "-c", code, lib, str(parity)])
        for lib, parity in (("rlstash", 0), ("sb3", 1))
    ]
    try:
        assert [p.wait(timeout=120) for p in procs] == [0, 0]
    finally:
        for p in procs:
            p.kill()
    store = learn.RunStore(tmp_path)
    shared = store.runs("sb3-shared")[1000]
    assert sorted(map(int, shared)) == list(range(40))
    assert {r["writer"] for r in shared.values()} == {"rlstash", "sb3"}
    for lib, parity in (("rlstash", 0), ("sb3", 1)):
        assert sorted(map(int, store.runs(f"{lib}-own")[1000])) == list(range(parity, 40, 2))
    assert not list(tmp_path.rglob("*.tmp"))


def test_a_rerun_replaces_the_earlier_run_and_kept_lists_it(tmp_path):
    store = learn.RunStore(tmp_path)
    store.save_run("rlstash-dqn", 50_000, 0, {"train_seconds": 1.0})
    store.save_run("rlstash-dqn", 50_000, 0, {"train_seconds": 2.0})
    store.save_run("rlstash-dqn", 20_000, 1, {"train_seconds": 3.0})
    assert store.runs("rlstash-dqn") == {
        50_000: {"0": {"train_seconds": 2.0}},
        20_000: {"1": {"train_seconds": 3.0}},
    }
    assert sorted(store.kept()) == [("rlstash-dqn", 20_000, "1"), ("rlstash-dqn", 50_000, "0")]


def _run(curve: list[list[float]], seconds: float, date: str) -> dict:
    return {"curve": curve, "steps": curve[-1][0], "train_seconds": seconds, "settings": {},
            "commit": "abc1234", "date": date, "load_before_after": [1.0, 2.0],
            "machine": {"date": date}}  # fmt: skip


def test_tables_come_from_the_kept_runs_and_parts_without_runs_keep_their_section(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    old_sac = "## SAC Pendulum-v1: threshold -200, budget 20,000 env steps\n\nold SAC table\n"
    (results / "learn.md").write_text(
        "# old\n\nMachine:\n\n- date: 2026-01-01\n\n" + old_sac
        + learn_report.NOTES_MARKER + "\nmy notes\n"
    )  # fmt: skip
    store = learn.RunStore(tmp_path / "runs")
    # PPO: rlstash crosses 475 at 2,000 and stays; SB3 crosses at 1,000, dips, stays from 3,000
    store.save_run("rlstash-ppo", 100_000, 0, _run([[1000, 1, 100], [2000, 2, 480],
                                                    [3000, 3, 500]], 3.0, "2026-02-02"))  # fmt: skip
    store.save_run("sb3-ppo", 100_000, 0, _run([[1000, 2, 476], [2000, 4, 300],
                                                [3000, 6, 500]], 6.0, "2026-02-01"))  # fmt: skip
    learn_report.write_reports(store, results, learn.report_paragraphs())
    text = (results / "learn.md").read_text()
    ppo = text.split("## PPO CartPole-v1")[1].split("\n## ")[0]
    assert "| first eval >= threshold | 2,000 | 1,000 | 2.00x | 2.0 | 2.0 | 1.00x |" in ppo
    assert "| stays >= threshold to the end | 2,000 | 3,000 | 0.67x | 2.0 | 6.0 | 0.33x |" in ppo
    assert "abc1234" in ppo and "1.0 2.0" in ppo  # commit and load of each run
    assert (
        "## SAC Pendulum-v1: threshold -200, budget 20,000 env steps (kept from 2026-01-01)" in text
    )
    assert "old SAC table" in text
    assert text.endswith(learn_report.NOTES_MARKER + "\nmy notes\n")
    assert "- date: 2026-02-02" in text  # the machine of the newest run


def test_learning_parts_share_sb3_runs_with_the_same_settings():
    from learn_tasks import TASKS, run_id

    for a, b in (("dqn", "dqn_same"), ("td3", "td3_same")):
        assert TASKS[a]["sb3"] is TASKS[b]["sb3"]
        assert run_id(a, "sb3") == run_id(b, "sb3")
        assert run_id(a, "rlstash") != run_id(b, "rlstash")
    assert run_id("sac", "sb3") != run_id("sac_same", "sb3")


@pytest.mark.parametrize("argv", [["--parts", "nope"], ["--libs", "torchrl"]])
def test_unknown_parts_or_libs_are_refused_before_anything_runs(argv, monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "argv", ["learn.py", *argv])
    monkeypatch.setattr("bench_venv.ensure_bench_venv", lambda script: None)
    monkeypatch.setattr(learn, "WORK", tmp_path)
    with pytest.raises(SystemExit, match="expected some of"):
        learn.main()
    assert not any(tmp_path.iterdir())
