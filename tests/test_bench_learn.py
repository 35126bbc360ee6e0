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


def _curve(step_returns: list[tuple[int, float]]) -> list[list[float]]:
    return [[step, step / 1000, ret] for step, ret in step_returns]


def test_cheetah_returns_at_equal_steps_and_seconds_against_the_goals(tmp_path):
    """The return at N is each run's first eval at or after N (SB3 at N, rlstash at the end
    of the rollout that passes N); medians over seeds; goals per point and for seconds."""
    store = learn.RunStore(tmp_path / "runs")
    rl = [(100_352, 1500.0), (200_704, 2500.0), (301_056, 3000.0)]
    sb3 = [(100_000, 1000.0), (200_000, 2600.0), (300_000, 2900.0)]
    for seed, bump in enumerate((0.0, 100.0, -50.0)):
        store.save_run(
            "rlstash-ppo_cheetah_same",
            300_000,
            seed,
            _run(_curve([(s, r + bump) for s, r in rl]), 60.0 + seed, "2026-02-02"),
        )
        store.save_run(
            "sb3-ppo_cheetah_same",
            300_000,
            seed,
            _run(_curve([(s, r + bump) for s, r in sb3]), 100.0, "2026-02-01"),
        )
    learn_report.write_reports(store, tmp_path, learn.report_paragraphs())  # fmt: skip
    text = (tmp_path / "learn_same.md").read_text()
    part = text.split("## PPO HalfCheetah-v5, identical settings")[1].split("\n## ")[0]
    assert "| 100,000 | 1500 | 1000 | +500 |" in part
    assert "| 200,000 | 2500 | 2600 | -100 |" in part
    assert "return at 100,000 env steps: 1500 vs 1000: **met**" in part
    assert "return at 200,000 env steps: 2500 vs 2600: **missed**" in part
    assert "| training seconds, whole budget | 61.0 | 100.0 | 0.61x |" in part
    assert "61.0 vs 0.7 x 100.0: **met**" in part
    assert "100,352: 1500" in part  # the step each run was evaluated at
    # the preset part has runs of its own (rlstash's preset is no longer these settings)
    preset = (tmp_path / "learn.md").read_text()
    assert "## PPO HalfCheetah-v5, each side's preset" not in preset


def test_end_to_end_compiled_against_the_eager_parts_sb3_runs(tmp_path):
    store = learn.RunStore(tmp_path / "runs")
    curve = _curve([(5000, -100.0), (10_000, 500.0), (15_000, 900.0)])
    for seed in (0, 1):
        store.save_run("rlstash-sac_same", 15_000, seed, _run(curve, 150.0, "2026-02-02"))
        compiled = _run(curve, 100.0, "2026-02-02") | {"compile_seconds": 25.0}
        store.save_run("rlstash-sac_same_compile", 15_000, seed, compiled)
        store.save_run("sb3-sac_same", 15_000, seed, _run(curve, 300.0, "2026-02-01"))
    # a seed of the eager part from another invocation (no compiled run): left out
    store.save_run("rlstash-sac_same", 15_000, 2, _run(curve, 900.0, "2026-01-01"))
    store.save_run("sb3-sac_same", 15_000, 2, _run(curve, 900.0, "2026-01-01"))
    learn_report.write_reports(store, tmp_path, learn.report_paragraphs())
    text = (tmp_path / "learn_same.md").read_text()
    part = text.split("## End to end, compiled updates: SAC HalfCheetah-v5")[1].split("\n## ")[0]
    assert "| rlstash eager | 2 | 150.0 | 100.0 | 2.00x |  |  |" in part
    assert "| rlstash compile=True | 2 | 100.0 | 150.0 | 3.00x | 25.0 | 200.0 |" in part
    assert "| SB3 | 2 | 300.0 | 50.0 | 1.00x |  |  |" in part


def test_cheetah_and_compile_parts_share_runs_where_a_side_runs_the_same_settings():
    from learn_tasks import TASKS, run_id

    # HalfCheetah: rlstash's preset (the Zoo's entry) is not the identical-settings part's
    assert run_id("ppo_cheetah", "rlstash") != run_id("ppo_cheetah_same", "rlstash")
    assert run_id("ppo_cheetah", "sb3") != run_id("ppo_cheetah_same", "sb3")
    for compiled in ("ppo_compile", "sac_same_compile"):
        eager = TASKS[compiled]["eager"]
        assert run_id(compiled, "sb3") == run_id(eager, "sb3")
        assert run_id(compiled, "rlstash") != run_id(eager, "rlstash")
        assert TASKS[compiled]["rlstash"] == {**(TASKS[eager]["rlstash"] or {}), "compile": True}


def test_parts_and_sides_are_interleaved_seed_by_seed_and_shared_runs_run_once(
    tmp_path, monkeypatch
):
    order = []
    monkeypatch.setattr(learn, "spawn", lambda task, timeout: order.append(task) or {})
    info = {"commit": "abc", "machine": {}}
    learn.run_learning(learn.RunStore(tmp_path), ["sac_same", "sac_same_compile"], [0, 1],
                       None, ["rlstash", "sb3"], set(), info)  # fmt: skip
    assert [(t["seed"], t["part"], t["lib"]) for t in order] == [
        (0, "sac_same", "rlstash"), (0, "sac_same", "sb3"), (0, "sac_same_compile", "rlstash"),
        (1, "sac_same", "rlstash"), (1, "sac_same", "sb3"), (1, "sac_same_compile", "rlstash"),
    ]  # fmt: skip
    assert {t["budget"] for t in order} == {15_000}


def test_the_compile_time_is_read_from_what_the_trainer_says(tmp_path, capsys):
    from learn_tasks import COMPILED

    from rlstash.train.runlog import RunLog

    log = RunLog(tmp_path, 100, quiet=True)
    log.note_compile(12.5, final=True)
    said = COMPILED.search(capsys.readouterr().out)
    assert said is not None and float(said.group(1)) == 12.5


def test_td3_update_rate_is_reported_against_the_flop_limit(tmp_path):
    """updates / training second x matmul FLOPs per update / the process's matmul FLOP/s:
    (400, 300) TD3 on Pendulum (3 -> 1) is 256 x (2 Pa + 16 Pc + (6 Pa + 4 Pc) / 2) with
    Pa = 3*400 + 400*300 + 300*1 and Pc = 4*400 + 400*300 + 300*1: 717 MFLOP."""
    store = learn.RunStore(tmp_path / "runs")
    curve = _curve([(1000, -1000.0), (2000, -150.0)])
    rl = _run(curve, 100.0, "2026-02-02") | {
        "settings": {"net_arch": [400, 300]}, "updates_at": [10_000, 100.0],
        "matmul_flops": [0.9e11, 1.1e11],
    }  # fmt: skip
    sb3 = _run(curve, 200.0, "2026-02-01") | {
        "settings": {"policy_kwargs": {"net_arch": [400, 300]}}, "updates_at": [10_000, 200.0],
        "matmul_flops": [1e11, 1e11],
    }  # fmt: skip
    store.save_run("rlstash-td3_same", 20_000, 0, rl)
    store.save_run("sb3-td3_zoo", 20_000, 0, sb3)
    learn_report.write_reports(store, tmp_path, learn.report_paragraphs())
    part = (tmp_path / "learn_same.md").read_text().split("## TD3 Pendulum-v1")[1]
    assert "| rlstash | 1 | [400, 300] | 717 | 100.0 | 100 | 139 | 0.72 |" in part
    assert "| sb3 | 1 | [400, 300] | 717 | 50.0 | 100 | 139 | 0.36 |" in part


# rlstash's HalfCheetah-v5 preset before it became the Zoo's entry (CleanRL's; the settings the
# kept ppo_cheetah_same runs recorded), over PPOConfig's defaults of that time.
CLEANRL_CHEETAH_RUNS = {
    "rollout_steps": 2048, "minibatch_size": 64, "n_epochs": 10, "learning_rate": 0.0003,
    "anneal_lr": True, "clip_range_vf": 0.2, "norm_obs": True, "norm_reward": True,
}  # fmt: skip


def test_identical_cheetah_part_pins_cleanrls_settings_the_kept_runs_ran():
    """The rlstash side of ppo_cheetah_same is pinned in full (not the preset, which is now
    the Zoo's entry): the same PPOConfig as the old preset (eager), and what SB3 runs."""
    from learn_tasks import SAME_PPO_CHEETAH, TASKS

    from rlstash.agents.ppo import PPOConfig
    from rlstash.train.algos import ALGOS

    pinned = TASKS["ppo_cheetah_same"]["rlstash"]
    assert PPOConfig(**pinned) == PPOConfig(**{**CLEANRL_CHEETAH_RUNS, "compile": False})
    assert ALGOS["ppo"].presets["HalfCheetah-v5"] != CLEANRL_CHEETAH_RUNS
    sb3 = SAME_PPO_CHEETAH
    assert (sb3["n_steps"], sb3["batch_size"], sb3["n_epochs"]) == (2048, 64, 10)
    assert sb3["policy_kwargs"]["net_arch"] == {"pi": pinned["net_arch"], "vf": pinned["net_arch"]}
    assert sb3["normalize"]["gamma"] == pinned["gamma"] == sb3["gamma"]
    for key in ("gamma", "gae_lambda", "ent_coef", "vf_coef", "max_grad_norm", "clip_range",
                "clip_range_vf"):  # fmt: skip
        assert sb3[key] == pinned[key], key
