"""`rlstash train --algo ppo` end to end with tiny settings: logs, checkpoint, plot, eval,
resume after an interruption, continuous actions with normalisation, and refusals."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from rlstash.agents.ppo import PPO
from rlstash.train import checkpoint
from rlstash.train.cli import main
from rlstash.train.loop import TrainConfig, train

TINY = {"net_arch": [16], "rollout_steps": 16, "minibatch_size": 32, "n_epochs": 2}


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def test_cli_ppo_run_writes_logs_checkpoint_plot_and_evaluates(tmp_path: Path, capsys) -> None:
    argv = ["train", "--algo", "ppo", "--quiet", "--device", "cpu", "--steps", "512",
            "--eval-every", "256", "--eval-episodes", "2", "--run-dir", str(tmp_path),
            "--name", "p"]  # fmt: skip
    for key, value in TINY.items():
        argv += ["--set", f"{key}={value}"]
    assert main(argv) == 0
    run = tmp_path / "p"
    evals = _rows(run / "eval.csv")
    assert [int(r["step"]) for r in evals] == [256, 512]  # 8 envs (preset) x 16 steps per rollout
    assert (run / "learning_curve.png").exists()
    state = checkpoint.load_state(checkpoint.latest(run))
    assert state["agent"]["algo"] == "ppo" and state["step"] == 512
    assert state["agent"]["counters"]["updates"] == 4 * 2 * 4  # rollouts x epochs x minibatches
    assert state["agent"]["config"]["total_steps"] == 512  # annealing horizon = the run
    capsys.readouterr()
    assert main(["eval", str(run), "--episodes", "2"]) == 0
    assert "2 episodes, return mean" in capsys.readouterr().out


def test_interrupted_ppo_run_resumes_from_its_checkpoint(tmp_path: Path, monkeypatch) -> None:
    cfg = TrainConfig(algo="ppo", steps=1024, eval_every=256, eval_episodes=2, quiet=True,
                      device="cpu", run_dir=str(tmp_path), name="r", checkpoint_every=256,
                      agent={**TINY, "norm_obs": True})  # fmt: skip
    original = PPO.update
    calls = {"n": 0}

    def interrupted(self, rollout):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return original(self, rollout)

    monkeypatch.setattr(PPO, "update", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train(cfg)
    run = tmp_path / "r"
    saved = checkpoint.load_state(checkpoint.latest(run))
    assert saved["step"] == 512 and saved["agent"]["counters"]["updates"] == 4 * 2 * 4
    count = saved["agent"]["nets"]["obs_norm"]["rms.count"]
    assert 400 < count.item() < 4 * 128 + 1  # the obs of the 4 rollouts' real (valid) steps
    monkeypatch.setattr(PPO, "update", original)
    result = train(resume=run)
    assert result.steps == 1024
    final = checkpoint.load_state(checkpoint.latest(run))
    assert final["agent"]["counters"]["updates"] == 8 * 2 * 4
    assert [e["step"] for e in final["evals"]] == [256, 512, 768, 1024]


def test_ppo_pendulum_gaussian_with_normalisation(tmp_path: Path) -> None:
    cfg = TrainConfig(algo="ppo", env="Pendulum-v1", steps=256, eval_every=256, eval_episodes=1,
                      quiet=True, device="cpu", run_dir=str(tmp_path), name="g", envs=2,
                      agent={**TINY, "rollout_steps": 64, "norm_obs": True,
                             "norm_reward": True})  # fmt: skip
    result = train(cfg)
    assert result.steps == 256
    state = checkpoint.load_state(checkpoint.latest(tmp_path / "g"))
    nets = state["agent"]["nets"]
    assert nets["reward_scaler"]["ret"].shape == (2,)
    assert torch.all(nets["obs_norm"]["rms.var"] != 1.0)


@pytest.mark.parametrize(
    "extra,match",
    [
        (["--history", "2"], "history: not supported by --algo ppo"),
        (["--storage", "disk"], "storage: --algo ppo keeps one rollout"),
        (["--set", "clip_range=0"], "clip_range: expected > 0"),
        (["--batch-size", "64"], "not used by --algo ppo; give --minibatch-size instead"),
    ],
)
def test_bad_ppo_settings_are_one_line_and_write_nothing(tmp_path, capsys, extra, match) -> None:
    argv = ["train", "--algo", "ppo", "--quiet", "--device", "cpu", "--run-dir", str(tmp_path)]
    argv += extra
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and match in err[0], err
    assert list(tmp_path.iterdir()) == []
