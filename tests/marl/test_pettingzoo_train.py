"""``rlstash train --algo mappo|ippo --env pettingzoo:<module>``: a PettingZoo Parallel env in
the process pool trains MAPPO/IPPO end to end (an agent done early and one joining late
included), with evaluation and a checkpoint."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip(
    "pettingzoo", reason="PettingZoo is an optional extra: pip install 'rlstash[pettingzoo]'"
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.multiproc
@pytest.mark.parametrize("algo", ["mappo", "ippo"])
def test_a_pettingzoo_env_trains_evaluates_and_checkpoints(tmp_path: Path, algo: str) -> None:
    cmd = [sys.executable, "-m", "rlstash", "train", "--run-dir", str(tmp_path), "--name", "r",
           "--algo", algo, "--env", "pettingzoo:tests.marl.pz_fakes", "--envs", "4",
           "--workers", "1", "--steps", "80", "--env-kwargs", '{"length": 6}',
           "--set", "rollout_steps=10", "--set", "n_epochs=2", "--set", "minibatch_size=20",
           "--set", "net_arch=[16]", "--eval-every", "40", "--eval-episodes", "2",
           "--checkpoint-every", "40", "--quiet"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "4 envs x 3 agents" in out.stdout + out.stderr
    run = tmp_path / "r"
    evals = list(csv.DictReader((run / "eval.csv").open()))
    assert [int(r["step"]) for r in evals] == [40, 80]
    # a_0 earns 0 + t + action per step, a_1 10 + ..., a_2 20 + ...: a return well above 0
    assert float(evals[-1]["return_mean"]) > 20
    assert (run / "checkpoint").is_dir()
    header = (run / "progress.csv").read_text().splitlines()[0].split(",")
    assert {"return_a_0", "return_a_1", "return_a_2"} <= set(header)  # per agent name
