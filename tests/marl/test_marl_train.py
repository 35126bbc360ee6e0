"""``rlstash train --algo mappo|ippo --env vmas/<scenario>``: a short run with evaluation,
checkpoint, per-agent returns in the log, resume; settings refused with the flag named."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vmas", reason="VMAS is an optional extra: pip install 'rlstash[vmas]'")

SMALL = ["--set", "rollout_steps=10", "--set", "n_epochs=2", "--set", "minibatch_size=20",
         "--set", "net_arch=[16]", "--eval-every", "40", "--eval-episodes", "2",
         "--checkpoint-every", "40", "--quiet"]  # fmt: skip


def _train(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "rlstash", "train", "--run-dir", str(tmp_path), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("algo", ["mappo", "ippo"])
def test_a_short_run_evaluates_checkpoints_and_resumes(tmp_path: Path, algo: str) -> None:
    args = ["--algo", algo, "--env", "vmas/navigation", "--envs", "4", "--steps", "80",
            "--env-kwargs", '{"max_steps": 20}', "--name", "r", *SMALL]  # fmt: skip
    out = _train(tmp_path, *args)
    assert out.returncode == 0, out.stderr[-3000:]
    run = tmp_path / "r"
    assert "rollout: 10 steps x 4 envs x 3 agents" in out.stdout + out.stderr
    header = (run / "progress.csv").read_text().splitlines()[0].split(",")
    assert {"return_agent_0", "return_agent_2", "policy_loss", "value_loss"} <= set(header)
    evals = list(csv.DictReader((run / "eval.csv").open()))
    assert [int(r["step"]) for r in evals] == [40, 80]
    if algo == "ippo":
        return  # resume is the same code for both: once is enough (keeps the file fast)
    out = _train(tmp_path, "--resume", str(run), "--steps", "120")
    assert out.returncode != 0 and "--resume" in out.stderr  # settings come from the run
    out = subprocess.run([sys.executable, "-m", "rlstash", "train", "--resume", str(run)],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "resumed at step 80" in out.stdout + out.stderr


def test_bad_env_kwargs_are_one_line(tmp_path: Path) -> None:
    out = _train(tmp_path, "--algo", "mappo", "--env", "vmas/navigation", "--env-kwargs",
                 "{n_agents: 3}", *SMALL)  # fmt: skip
    assert out.returncode == 2
    assert "--env-kwargs: expected a JSON object" in out.stderr
    assert "Traceback" not in out.stderr
