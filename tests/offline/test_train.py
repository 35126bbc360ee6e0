"""``rlstash train --dataset`` (issue 26 point 4) and ``rlstash export --minari`` (point 3):
an offline algorithm learns from a Minari dataset alone, checkpoints and evaluates in the env
the dataset names; an online one starts with the dataset in its replay; a run's replay
exports as a dataset Minari reads back; bad ids are one-line errors, exit 2."""

from __future__ import annotations

import csv

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlstash.cli.main import main
from tests.offline.conftest import collect

pytest.importorskip("minari", reason="Minari tests need rlstash[minari]")


def _train(tmp_path, *argv: str) -> int:
    return main(["train", "--quiet", "--device", "cpu", "--run-dir", str(tmp_path / "runs"),
                 "--set", "net_arch=16,16", "--set", "compile=false", *argv])  # fmt: skip


def test_offline_run_updates_checkpoints_and_evaluates_in_the_dataset_env(tmp_path, minari_path):
    algo = "iql"  # td3_bc runs the same OfflineLearning (its losses: test_agents.py)
    collect("test/pend-v0", gym.make("Pendulum-v1", max_episode_steps=50), steps=300)
    code = _train(tmp_path, "--algo", algo, "--dataset", "test/pend-v0", "--steps", "120",
                  "--gradient-steps", "30", "--eval-every", "60", "--checkpoint-every", "60",
                  "--eval-episodes", "1", "--name", algo)  # fmt: skip
    assert code == 0
    run = tmp_path / "runs" / algo
    with open(run / "eval.csv") as f:
        evals = list(csv.DictReader(f))
    assert [int(r["step"]) for r in evals] == [60, 120]  # steps count updates
    assert all(float(r["return_mean"]) < 0 for r in evals)  # Pendulum's returns are negative
    assert (run / "checkpoint" / "state.pt").exists()
    assert not (run / "checkpoint" / "buffer.pt").exists()  # the dataset is read again
    assert main(["eval", str(run), "--episodes", "1"]) == 0


def test_the_run_directory_names_the_env_of_the_dataset(tmp_path, minari_path):
    collect("test/pend-v0", gym.make("Pendulum-v1", max_episode_steps=50), steps=100)
    code = _train(tmp_path, "--algo", "iql", "--dataset", "test/pend-v0", "--steps", "20",
                  "--gradient-steps", "20", "--eval-every", "20", "--eval-episodes", "1")  # fmt: skip
    assert code == 0
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["iql-Pendulum-v1-s0"]


def test_bad_dataset_ids_are_one_line_errors(tmp_path, minari_path, capsys):
    collect("test/cart-v0", gym.make("CartPole-v1"), steps=60)
    cases = [
        (["--algo", "iql", "--dataset", "test/nope-v0"], "no local Minari dataset 'test/nope-v0'"),
        (["--algo", "iql"], "dataset: --algo iql learns offline from a dataset"),
        (["--algo", "iql", "--dataset", "test/cart-v0"], "algo iql: needs a 1-D Box action"),
        (["--algo", "ppo", "--dataset", "test/cart-v0"], "learns on-policy"),
        (["--algo", "sac", "--dataset", "test/cart-v0", "--env", "Pendulum-v1"],
         "collected in CartPole-v1, got --env Pendulum-v1"),
    ]  # fmt: skip
    for argv, message in cases:
        assert _train(tmp_path, *argv, "--steps", "10") == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "runs").exists()  # refused before the run directory was made


@pytest.mark.parametrize("flag, value", [("--envs", "4"), ("--workers", "2"),
    ("--storage", "disk"), ("--buffer-size", "100"), ("--compress", "lz4"),
    ("--learning-starts", "10"), ("--train-freq", "4"), ("--env-batch", "1"),
    ("--env-backend", "envpool"), ("--ray", "local"), ("--history", "2")])  # fmt: skip
def test_a_setting_an_offline_run_cannot_use_is_refused(tmp_path, minari_path, capsys, flag,
                                                        value):  # fmt: skip
    collect("test/pend-v0", gym.make("Pendulum-v1", max_episode_steps=50), steps=60)
    code = _train(tmp_path, "--algo", "iql", "--dataset", "test/pend-v0", "--steps", "10",
                  "--gradient-steps", "10", "--eval-every", "10", "--eval-episodes", "1",
                  flag, value)  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert f"{flag}: not used by offline --algo iql" in err and f"drop {flag}" in err, err
    assert not (tmp_path / "runs").exists()


@pytest.mark.allow_cuda  # asks torch.cuda.is_available(): on a GPU machine the CUDA branch runs
def test_the_buffer_device_is_where_the_dataset_is_held(tmp_path, minari_path, capsys):
    collect("test/pend-v0", gym.make("Pendulum-v1", max_episode_steps=50), steps=60)
    if not torch.cuda.is_available():  # honoured, so refused here: never silently the CPU
        assert _train(tmp_path, "--algo", "iql", "--dataset", "test/pend-v0", "--steps", "10",
                      "--gradient-steps", "10", "--eval-every", "10", "--eval-episodes", "1",
                      "--buffer-device", "cuda") == 2  # fmt: skip
        assert "--buffer-device: 'cuda' was asked for" in capsys.readouterr().err
        return
    from rlstash.train.builders import build_run
    from rlstash.train.config import TrainConfig

    cfg = TrainConfig(algo="iql", dataset="test/pend-v0", buffer_device="cuda", device="cuda",
                      run_dir=str(tmp_path / "runs"))  # fmt: skip
    run = build_run(cfg, tmp_path / "runs" / "r")
    try:
        assert run.rb.storage.device.type == "cuda"
    finally:
        run.close()


def test_online_run_starts_from_the_dataset_and_exports_it(tmp_path, minari_path, capsys):
    ds = collect("test/pend-v0", gym.make("Pendulum-v1", max_episode_steps=50), steps=100)
    code = _train(tmp_path, "--algo", "sac", "--dataset", "test/pend-v0", "--steps", "60",
                  "--learning-starts", "20", "--eval-every", "60", "--eval-episodes", "1",
                  "--name", "o2o")  # fmt: skip
    assert code == 0
    run = str(tmp_path / "runs" / "o2o")
    assert main(["export", run, "--minari", "test/o2o-v0"]) == 0
    assert "wrote Minari dataset test/o2o-v0" in capsys.readouterr().out
    import minari

    back = minari.load_dataset("test/o2o-v0")
    assert back.env_spec.id == "Pendulum-v1"
    assert back.total_steps == ds.total_steps + 60 - 1  # the running episode's newest step
    episodes = list(back.iterate_episodes())
    for a, b in zip(ds.iterate_episodes(), episodes):  # the dataset's episodes come first
        np.testing.assert_array_equal(b.observations, a.observations)
        np.testing.assert_array_equal(b.actions, a.actions)
        np.testing.assert_array_equal(b.truncations, a.truncations)
    assert main(["export", run, "--minari", "test/o2o-v0"]) == 2  # exists already
    assert main(["export", run]) == 2  # no --minari
