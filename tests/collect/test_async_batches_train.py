"""``rlstash train --env-batch B``: asynchronous batches of the process pool (or EnvPool) feed
a replay run, the start-up line says so, and where they do not fit the run is refused in one
line (exit 2) before anything is made."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlstash import cli

BASE = [
    "--env", "CartPole-v1", "--steps", "128", "--eval-every", "128", "--eval-episodes", "1",
    "--quiet", "--device", "cpu", "--set", "learning_starts=32", "--set", "batch_size=16",
]  # fmt: skip


def test_a_dqn_run_trains_on_async_batches_of_the_pool(tmp_path: Path, capsys):
    argv = ["train", *BASE, "--algo", "dqn", "--envs", "4", "--env-batch", "2"]
    assert cli.main([*argv, "--run-dir", str(tmp_path), "--name", "a"]) == 0
    out, err = capsys.readouterr()
    assert "2 workers), asynchronous batches of 2 ready envs)" in out + err
    from rlstash.train import checkpoint

    state = checkpoint.load_state(tmp_path / "a" / "checkpoint")
    assert state["step"] >= 128 and state["config"]["env_batch"] == 2


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--algo", "ppo", "--env-batch", "2"], "--algo ppo learns from whole"),
        (["--algo", "dqn", "--env-batch", "5"], r"expected 0 \(off\) or 1..--envs \(4\), got 5"),
        (["--algo", "dqn", "--env-batch", "2", "--workers", "auto"], "--workers auto"),
        (["--algo", "dqn", "--env-batch", "2", "--history", "4"], "--history"),
        (["--algo", "dqn", "--env-batch", "3", "--workers", "2"], "give --workers 4 or 0"),
    ],
)
def test_where_batches_do_not_fit_the_run_is_refused_in_one_line(tmp_path, capsys, extra, match):
    argv = ["train", *BASE, "--envs", "4", *extra, "--run-dir", str(tmp_path), "--name", "r"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--env-batch: " in err
    assert re.search(match, err), err
    assert not (tmp_path / "r").exists()
