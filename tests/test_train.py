"""End-to-end tests of the training loop and the train/eval CLI, with tiny settings.

Each run is a few hundred to a few thousand env steps with a one-layer network, so the whole
file takes seconds. The resume test trains in a subprocess, SIGKILLs it after a checkpoint
and checks that ``--resume`` continues from that checkpoint with the buffer it saved.
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from rlstash.cli import main
from rlstash.replay import ReplayBuffer
from rlstash.train import checkpoint
from rlstash.train.loop import TrainConfig, train
from tests.procs import die_with_parent

ROOT = Path(__file__).resolve().parent.parent
TINY_DQN = {
    "batch_size": 16,
    "learning_starts": 64,
    "train_freq": 32,
    "gradient_steps": 2,
    "buffer_size": 8192,  # > every run here: nothing is overwritten
    "agent": {"net_arch": [16]},
}
TINY_SAC = {
    "batch_size": 16,
    "learning_starts": 64,
    "train_freq": 8,
    "gradient_steps": 1,
    "buffer_size": 4096,
    "agent": {"net_arch": [16]},
}


def _tiny(settings: dict, **agent: object) -> dict:
    """A copy of TINY_* with extra agent settings."""
    return {**settings, "agent": {**settings["agent"], **agent}}


def _set_flags(settings: dict) -> list[str]:
    """TINY_* as --set flags."""
    flat = {k: v for k, v in settings.items() if k != "agent"} | settings["agent"]
    return [arg for k, v in flat.items() for arg in ("--set", f"{k}={v}")]


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def _cli(*argv: str) -> list[str]:
    return ["--quiet", "--device", "cpu", *argv]


def test_dqn_run_writes_logs_checkpoint_and_plot(tmp_path: Path) -> None:
    cfg = TrainConfig(steps=512, eval_every=256, eval_episodes=2, quiet=True, device="cpu",
                      run_dir=str(tmp_path), name="dqn", **TINY_DQN)  # fmt: skip
    result = train(cfg)
    run = tmp_path / "dqn"
    assert result.run_dir == run and result.steps == 512 and not result.solved
    assert result.train_seconds > 0
    evals = _rows(run / "eval.csv")
    assert [int(r["step"]) for r in evals] == [256, 512]
    assert all(float(r["return_mean"]) >= 1 for r in evals)  # CartPole pays 1 per step
    assert float(evals[0]["train_seconds"]) <= float(evals[1]["train_seconds"])
    assert result.last_eval == pytest.approx(float(evals[-1]["return_mean"]))
    assert (run / "progress.csv").exists()
    assert checkpoint.latest(run) == run / "checkpoint"
    state = checkpoint.load_state(run / "checkpoint")
    assert state["step"] == 512 and state["agent"]["counters"]["updates"] > 0
    assert result.plot is None or result.plot.exists()


def test_sac_pendulum_run(tmp_path: Path) -> None:
    cfg = TrainConfig(algo="sac", env="Pendulum-v1", steps=256, eval_every=128,
                      eval_episodes=1, quiet=True, device="cpu", run_dir=str(tmp_path), name="sac",
                      **TINY_SAC)  # fmt: skip
    result = train(cfg)
    evals = _rows(tmp_path / "sac" / "eval.csv")
    assert result.steps == 256 and [int(r["step"]) for r in evals] == [128, 256]
    assert all(-2000 < float(r["return_mean"]) <= 0 for r in evals)  # Pendulum costs


def test_td3_pendulum_run_with_its_preset(tmp_path: Path) -> None:
    cfg = TrainConfig(algo="td3", env="Pendulum-v1", steps=256, eval_every=128,
                      eval_episodes=1, quiet=True, device="cpu", run_dir=str(tmp_path), name="td3",
                      learning_starts=64, batch_size=32, agent={"random_steps": 64})  # fmt: skip
    result = train(cfg)
    evals = _rows(tmp_path / "td3" / "eval.csv")
    assert result.steps == 256 and [int(r["step"]) for r in evals] == [128, 256]
    state = checkpoint.load_state(tmp_path / "td3" / "checkpoint")
    assert state["agent"]["algo"] == "td3" and state["agent"]["counters"]["updates"] > 100
    assert tuple(state["agent"]["config"]["net_arch"]) == (64, 64)  # the Pendulum-v1 preset


def test_td3_on_discrete_actions_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="algo td3: needs a 1-D Box action space"):
        train(TrainConfig(algo="td3", env="CartPole-v1", steps=64, quiet=True, device="cpu",
                          run_dir=str(tmp_path)))  # fmt: skip
    assert not any(tmp_path.iterdir())


def test_progress_row_reads_the_updates_device_metrics() -> None:
    """The loop reads the agents' 0-dim device metrics only when it logs (read_metrics)."""
    from types import SimpleNamespace

    from rlstash.train.loop import _progress_row

    stats = SimpleNamespace(mean_return=lambda: -3.0, count=2)
    run = SimpleNamespace(train_seconds=1.5, collector=SimpleNamespace(stats=stats),
                          agent=SimpleNamespace(updates=7))  # fmt: skip
    metrics = {"loss": torch.tensor(0.25), "epsilon": 0.5, "td_error": torch.ones(4)}
    row = _progress_row(run, metrics)
    assert row["loss"] == 0.25 and row["epsilon"] == 0.5 and "td_error" not in row
    assert row["updates"] == 7


def test_stops_once_threshold_held_for_patience_evaluations(tmp_path: Path) -> None:
    cfg = TrainConfig(steps=10_000, eval_every=128, eval_episodes=1, threshold=1.0,
                      patience=3, quiet=True, device="cpu", run_dir=str(tmp_path), name="t",
                      **TINY_DQN)  # fmt: skip
    result = train(cfg)  # every CartPole episode returns >= 1: solved at the 3rd evaluation
    assert result.solved and result.steps == 3 * 128
    assert len(_rows(tmp_path / "t" / "eval.csv")) == 3


def test_existing_run_is_not_overwritten(tmp_path: Path) -> None:
    cfg = TrainConfig(steps=64, eval_every=64, eval_episodes=1, quiet=True, device="cpu",
                      run_dir=str(tmp_path), name="r", **TINY_DQN)  # fmt: skip
    train(cfg)
    with pytest.raises(ValueError, match="--resume"):
        train(cfg)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--env", "NoSuchEnv-v0"], ["env", "NoSuchEnv-v0"]),
        (["--algo", "dqn", "--env", "Pendulum-v1"], ["Discrete", "--algo sac"]),
        (["--set", "learning_rate=-1"], ["learning_rate", "-1"]),
        (["--set", "no_such_setting=1"], ["no_such_setting"]),
        (["--history", "1"], ["history", "got 1"]),
        (["--history", "4", "--algo", "sac", "--env", "Pendulum-v1"], ["history", "Discrete"]),
    ],
)
def test_bad_config_is_one_line_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], words: list[str]
) -> None:
    code = main(["train", *_cli("--run-dir", str(tmp_path / "runs"), *argv)])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith("rlstash train: error:")
    for word in words:
        assert word in err
    assert "Traceback" not in err


def test_bad_config_writes_nothing(tmp_path: Path) -> None:
    assert main(["train", *_cli("--run-dir", str(tmp_path / "runs"), "--env", "Nope-v0")]) == 2
    leftovers = list((tmp_path / "runs").rglob("*")) if (tmp_path / "runs").exists() else []
    assert leftovers == [], f"a refused run left files behind: {leftovers}"


def test_eval_command_prints_return_stats(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = TrainConfig(steps=128, eval_every=128, eval_episodes=1, quiet=True, device="cpu",
                      run_dir=str(tmp_path), name="e", **TINY_DQN)  # fmt: skip
    train(cfg)
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "e"), "--episodes", "3"]) == 0
    out = capsys.readouterr().out
    assert "3 episodes" in out and "return mean" in out


def test_eval_without_checkpoint_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["eval", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert "no complete checkpoint" in err and len(err.strip().splitlines()) == 1


# --- resume after SIGKILL ------------------------------------------------------------------


def _start_training(run_dir: Path, steps: int) -> subprocess.Popen:
    sets = _set_flags(TINY_DQN)
    cmd = [sys.executable, "-m", "rlstash", "train", "--quiet", "--steps", str(steps),
           "--checkpoint-every", "256", "--eval-every", str(steps), "--eval-episodes", "1",
           "--run-dir", str(run_dir.parent), "--name", run_dir.name, "--device", "cpu", *sets]  # fmt: skip
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            preexec_fn=die_with_parent)  # fmt: skip


def _wait_for_checkpoint(proc: subprocess.Popen, run_dir: Path, min_step: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:  # one read: the checkpoint directory is swapped whole while we look
            step = int((run_dir / "checkpoint" / "COMPLETE").read_text())
        except (FileNotFoundError, ValueError):
            step = -1
        if step >= min_step:
            return
        if proc.poll() is not None:
            pytest.fail(f"training ended before a checkpoint: {proc.stdout.read()}")
        time.sleep(0.01)
    pytest.fail("no checkpoint within 60 s")


def _buffer_rows(path: Path, index: np.ndarray | None = None) -> tuple[np.ndarray, dict]:
    rb = ReplayBuffer.load(path)
    try:
        if index is None:
            index = np.flatnonzero(rb.storage.valid)
        return index, {k: v.clone() for k, v in rb.storage.read(index).items()}
    finally:
        rb.close()


def test_resume_after_sigkill_continues_from_last_checkpoint(tmp_path: Path) -> None:
    run_dir, steps = tmp_path / "runs" / "killed", 4096
    proc = _start_training(run_dir, steps)
    try:
        _wait_for_checkpoint(proc, run_dir, min_step=768)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL, "training finished before it could be killed"
    ckpt = checkpoint.latest(run_dir)
    assert ckpt is not None
    killed_at = checkpoint.load_state(ckpt)["step"]
    assert 768 <= killed_at < steps
    index, saved = _buffer_rows(ckpt / "buffer.pt")
    assert index.size >= killed_at - 64  # one slot per frame, minus episode-final slots

    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    out = subprocess.run([sys.executable, "-m", "rlstash", "train", "--resume", str(run_dir)],  # noqa: S603
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert f"resumed at step {killed_at} with " in out.stdout
    final = checkpoint.load_state(run_dir / "checkpoint")
    assert final["step"] == steps
    _, after = _buffer_rows(run_dir / "checkpoint" / "buffer.pt", index)
    for key in ("obs", "action"):  # what each slot stores (n-step fields grow with successors)
        assert torch.equal(after[key], saved[key]), f"checkpointed buffer field {key} changed"


# --- presets and the learning-rate schedule the default run relies on ----------------------


def test_presets_build_valid_configs() -> None:
    from rlstash.train import algos
    from rlstash.train.builders import probe_env

    for env_id, algo in (("CartPole-v1", "dqn"), ("Pendulum-v1", "sac"), ("Pendulum-v1", "td3")):
        cfg, agent_cfg = algos.resolve(
            TrainConfig(algo=algo, env=env_id), probe_env(env_id).act_space
        )
        assert cfg.buffer_size == {"dqn": 50_000, "sac": 20_000, "td3": 20_000}[algo]
        if algo == "td3":
            assert cfg.learning_starts == agent_cfg.random_steps == 1000
        if algo == "dqn":
            assert agent_cfg.lr_schedule == "linear" and cfg.buffer_size == agent_cfg.total_steps


def test_linear_learning_rate_decays_to_zero_at_total_steps() -> None:
    from rlstash.agents.dqn import DQN, DQNConfig

    cfg = DQNConfig(learning_rate=1e-3, lr_schedule="linear", total_steps=100, net_arch=(8,))
    agent = DQN((4,), 2, cfg)
    g = torch.Generator().manual_seed(0)
    batch = {
        "obs": torch.randn(8, 4, generator=g),
        "next_obs": torch.randn(8, 4, generator=g),
        "action": torch.randint(0, 2, (8,), generator=g),
        "reward": torch.ones(8),
        "terminated": torch.zeros(8, dtype=torch.bool),
    }
    for env_steps, lr in ((0, 1e-3), (25, 7.5e-4), (100, 0.0), (250, 0.0)):
        agent.env_steps = env_steps
        out = agent.update(batch)
        assert agent.optims["q"].param_groups[0]["lr"] == pytest.approx(lr)
        assert out["learning_rate"] == pytest.approx(lr)
    before = [p.clone() for p in agent.nets["q"].parameters()]
    agent.update(batch)  # lr 0: the network no longer moves
    assert all(torch.equal(a, b) for a, b in zip(before, agent.nets["q"].parameters()))
    constant = DQN((4,), 2, DQNConfig(learning_rate=1e-3, total_steps=100, net_arch=(8,)))
    constant.env_steps = 90
    constant.update(batch)
    assert constant.optims["q"].param_groups[0]["lr"] == 1e-3


def test_unknown_lr_schedule_is_refused() -> None:
    from rlstash.agents.dqn import DQNConfig

    with pytest.raises(ValueError, match="lr_schedule: expected 'constant' or 'linear'"):
        DQNConfig(lr_schedule="cosine")


def test_history_window_run_stores_each_observation_once(tmp_path: Path) -> None:
    """--history 4: the envs return windows of the last 4 observations (FrameStackObservation,
    padding with the episode's first one), the agent reads them through its LSTM, and the
    stream buffer stores only the newest observation of each window and rebuilds the rest."""
    cfg = TrainConfig(steps=256, eval_every=256, eval_episodes=2, quiet=True, device="cpu",
                      run_dir=str(tmp_path), name="h", history=4, n_steps=1,
                      **_tiny(TINY_DQN, history_hidden=8))  # fmt: skip
    result = train(cfg)
    assert result.steps == 256 and len(_rows(tmp_path / "h" / "eval.csv")) == 1
    state = checkpoint.load_state(tmp_path / "h" / "checkpoint")
    assert state["config"]["history"] == 4
    assert any("lstm" in k for k in state["agent"]["nets"]["q"])
    rb = ReplayBuffer.load(tmp_path / "h" / "checkpoint" / "buffer.pt")
    try:
        store = rb.storage
        assert store.stacked_input and store.reads.frame_stack == 4
        assert tuple(store.slot_spec["obs"].shape) == (4,)  # one CartPole obs per slot
        b = rb.sample(32)
        assert b["obs"].shape == b["next_obs"].shape == (32, 4, 4)
        live = ~b["done"]  # a window's next window is it shifted by one step
        torch.testing.assert_close(b["next_obs"][live, :-1], b["obs"][live, 1:])
    finally:
        rb.close()
    assert main(["eval", str(tmp_path / "h"), "--episodes", "2"]) == 0


def test_history_env_workers_stay_torch_free() -> None:
    from rlstash.train import builders

    pool = builders.make_vec_env("CartPole-v1", 2, 1, 0, history=3)
    try:
        obs, _ = pool.reset(seed=0)
        assert obs.shape == (2, 3, 4)
        assert (obs[:, 0] == obs[:, 2]).all()  # the first obs repeated at an episode start
        infos = pool.worker_info()
        assert infos and not [m for i in infos for m in i["modules"] if m.split(".")[0] == "torch"]
    finally:
        pool.close()
