"""``rlstash train --algo mappo --env pettingzoo:<module>`` with two agent groups of different
spaces: it trains, logs per-group and per-agent returns, checkpoints every group, resumes and
evaluates (``rlstash eval``) from the checkpoint."""

from __future__ import annotations

import csv
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip(
    "pettingzoo", reason="PettingZoo is an optional extra: pip install 'rlstash[pettingzoo]'"
)

ROOT = Path(__file__).resolve().parents[2]


def _rlstash(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "rlstash", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_two_groups_train_resume_and_evaluate(tmp_path: Path) -> None:
    out = _rlstash("train", "--run-dir", str(tmp_path), "--name", "r", "--algo", "mappo",
                   "--env", "pettingzoo:tests.marl.pz_groups", "--envs", "4", "--workers", "0",
                   "--steps", "80", "--env-kwargs", '{"length": 5, "state": true}',
                   "--set", "rollout_steps=10", "--set", "n_epochs=2", "--set",
                   "minibatch_size=20", "--set", "net_arch=[16]", "--eval-every", "40",
                   "--eval-episodes", "2", "--checkpoint-every", "40", "--quiet")  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    said = out.stdout + out.stderr
    assert "4 envs x 3 agents in groups adversary (1), agent (2)" in said
    run = tmp_path / "r"
    header = (run / "progress.csv").read_text().splitlines()[0].split(",")
    assert {"return_adversary_0", "return_agent_0", "return_agent_1", "group_return_adversary",
            "group_return_agent", "policy_loss_adversary", "value_loss_agent",
            "policy_loss"} <= set(header)  # fmt: skip
    row = list(csv.DictReader((run / "progress.csv").open()))[-1]
    assert 0 <= float(row["return_adversary_0"]) <= 5  # 1 per step with action 2, 5 steps
    assert -7.5 <= float(row["group_return_agent"]) <= 0
    evals = list(csv.DictReader((run / "eval.csv").open()))
    assert [int(r["step"]) for r in evals] == [40, 80]
    out = _rlstash("train", "--resume", str(run))  # every group's networks and optimizers
    assert out.returncode == 0, out.stderr[-3000:]
    assert "resumed at step 80" in out.stdout + out.stderr
    out = _rlstash("eval", str(run), "--episodes", "3")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "3 episodes, return mean" in out.stdout


def test_rlstash_plan_of_two_groups_prints_what_the_run_allocates(tmp_path: Path, capsys) -> None:
    pytest.importorskip("vmas", reason="VMAS is an optional extra: pip install 'rlstash[vmas]'")
    from rlstash import cli
    from rlstash.train import builders
    from rlstash.train.config import TrainConfig

    kw = '{"max_steps": 20}'
    argv = ["plan", "--algo", "mappo", "--env", "vmas/simple_adversary", "--envs", "4"]
    assert cli.main([*argv, "--env-kwargs", kw]) == 0
    out = capsys.readouterr().out
    assert "2 agent groups (adversary: A=1 agents, obs [T + 1, E, A, 8]" in out
    printed = {}  # field -> bytes, from the table (name  shape  dtype  bytes/row  bytes  human)
    for line in out.splitlines():
        m = re.match(r"^([\w/]+)\s+\S+\s+\S+\s+[\d,]+\s+([\d,]+)\s", line)
        m = m or re.match(r"^(total)\s+[\d,]+\s+([\d,]+)\s", line)
        if m:
            printed[m.group(1)] = int(m.group(2).replace(",", ""))
    cfg = TrainConfig(algo="mappo", env="vmas/simple_adversary", envs=4, env_kwargs=kw,
                      device="cpu", run_dir=str(tmp_path), quiet=True)  # fmt: skip
    run = builders.build_run(cfg, tmp_path / "r")
    try:
        r = run.rollout
        assert set(r.rollouts) == {"adversary", "agent"}
        obs = r.rollouts["agent"].obs
        assert printed["agent/obs"] == obs.numel() * obs.element_size()
        assert printed["total"] == r.nbytes
    finally:
        run.close()
