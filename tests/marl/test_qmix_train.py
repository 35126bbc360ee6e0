"""``rlstash train --algo qmix|vdn --env vmas/navigation`` with discrete actions: a short run
evaluates, checkpoints (with its replay), logs per-agent returns and resumes; continuous actions
are refused in one line naming the flag and the fix; ``rlstash plan --algo qmix`` prints the
stream's plan."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

pytest.importorskip("vmas", reason="VMAS is an optional extra: pip install 'rlstash[vmas]'")

from rlstash import cli  # noqa: E402
from rlstash.storage.stream_plan import bookkeeping_bytes  # noqa: E402
from rlstash.train import builders  # noqa: E402
from rlstash.train.config import TrainConfig  # noqa: E402

DISCRETE = ["--env", "vmas/navigation", "--env-kwargs", '{"continuous_actions": false, '
            '"max_steps": 20}']  # fmt: skip
SMALL = ["--envs", "4", "--batch-size", "16", "--buffer-size", "400", "--train-freq", "40",
         "--gradient-steps", "2", "--set", "net_arch=[16]", "--set", "compile=false",
         "--eval-every", "40", "--eval-episodes", "2", "--checkpoint-every", "40", "--quiet"]  # fmt: skip


def test_a_short_run_evaluates_checkpoints_and_resumes(tmp_path: Path, capsys) -> None:
    # in-process (cli.main, as `rlstash train` runs it): no interpreter and torch start per run
    argv = ["train", "--run-dir", str(tmp_path), "--algo", "qmix", *DISCRETE, *SMALL,
            "--steps", "80", "--name", "r", "--device", "cpu"]  # fmt: skip
    assert cli.main(argv) == 0
    out = capsys.readouterr()
    run = tmp_path / "r"
    assert "replay: StreamStorage of 400 slots over 4 envs" in out.out + out.err
    header = (run / "progress.csv").read_text().splitlines()[0].split(",")
    assert {"return_agent_0", "return_agent_2", "loss", "q_tot_mean"} <= set(header)
    evals = list(csv.DictReader((run / "eval.csv").open()))
    assert [int(r["step"]) for r in evals] == [40, 80]
    assert cli.main(["train", "--resume", str(run)]) == 0
    assert "resumed at step 80 with" in capsys.readouterr().out


def test_continuous_actions_are_refused_naming_the_fix(tmp_path: Path, capsys) -> None:
    argv = ["train", "--run-dir", str(tmp_path), "--algo", "vdn", "--env", "vmas/navigation"]
    assert cli.main([*argv, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "continuous_actions" in err and "--env-kwargs" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())  # nothing written


def test_plan_prints_the_bytes_the_run_allocates(tmp_path: Path, capsys) -> None:
    argv = ["plan", "--algo", "qmix", *DISCRETE, "--envs", "8", "--buffer-size", "800"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "StreamStorage of --algo qmix on vmas/navigation: 800 slots over 8 envs" in out
    cfg = TrainConfig(algo="qmix", env="vmas/navigation", env_kwargs=DISCRETE[-1], envs=8,
                      buffer_size=800, device="cpu", run_dir=str(tmp_path), quiet=True)  # fmt: skip
    run = builders.build_run(cfg, tmp_path / "r")
    try:
        st = run.rb.storage
        held = sum(t.numel() * t.element_size() for t in st.backing.tensors.values())
        assert f"{st.nbytes:,}" in out and st.nbytes == st.plan.total
        assert held + bookkeeping_bytes(8, 800) == st.nbytes
        assert "obs/mask" in out and "next_obs" not in out  # each observation once
    finally:
        run.close()


def test_a_pettingzoo_env_with_masks_and_ragged_agents_trains(tmp_path: Path) -> None:
    pytest.importorskip("pettingzoo", reason="PettingZoo is an optional extra")
    from rlstash.train.loop import train

    # tests.marl.pz_fakes: Discrete(3) actions, a_0 with an action mask, an agent done early
    # and one joining late, a global state; in-process envs (workers 0)
    cfg = TrainConfig(algo="vdn", env="pettingzoo:tests.marl.pz_fakes", envs=4, workers=0,
                      steps=80, batch_size=16, buffer_size=200, train_freq=40, gradient_steps=2,
                      agent={"net_arch": [16], "compile": False}, eval_every=80,
                      eval_episodes=2, checkpoint_every=80, run_dir=str(tmp_path), name="p", device="cpu",
                      quiet=True, env_kwargs='{"length": 6}')  # fmt: skip
    result = train(cfg)
    assert result.steps == 80 and (tmp_path / "p" / "checkpoint").is_dir()
    header = (tmp_path / "p" / "progress.csv").read_text().splitlines()[0].split(",")
    assert {"return_a_0", "return_a_2", "loss"} <= set(header)
