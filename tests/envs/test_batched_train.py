"""``rlstash train`` on the batched torch envs: the env, the replay buffer and the learner on
one device (the CPU here), checkpoint and resume included."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlstash.collect.sync import Collector
from rlstash.train import builders, checkpoint
from rlstash.train.config import TrainConfig
from rlstash.train.loop import train

ROOT = Path(__file__).resolve().parents[2]
TINY = dict(batch_size=16, learning_starts=128, train_freq=64, gradient_steps=4, buffer_size=8192)


def _cfg(tmp_path: Path, **kw: object) -> TrainConfig:
    base = dict(algo="sac", env="rlstash/Pendulum-v1", envs=64, steps=64 * 12, eval_every=64 * 6,
                checkpoint_every=64 * 4, eval_episodes=2, run_dir=str(tmp_path), quiet=True,
                device="cpu", agent={"net_arch": [16]}, **TINY)  # fmt: skip
    return TrainConfig(**{**base, **kw})


def test_build_run_puts_env_buffer_and_learner_on_one_device(tmp_path):
    run = builders.build_run(_cfg(tmp_path), tmp_path / "r")
    try:
        assert run.env.device == run.device == run.agent.device == torch.device("cpu")
        assert run.rb.storage.device == run.env.device
        assert run.collector.batched is not None  # the batched path: no process pool
        assert run.cfg.buffer_device == str(run.env.device)
        assert run.threshold == -200.0  # Pendulum-v1's, for its batched twin
    finally:
        run.close()


def test_sac_on_batched_pendulum_checkpoints_and_resumes(tmp_path, monkeypatch):
    """Interrupted mid-run: the checkpoint written on Ctrl-C holds the buffer; the resumed run
    continues from it to the end."""
    cfg = _cfg(tmp_path, name="sac")
    real = Collector.collect
    calls = {"n": 0}

    def interrupted(self):
        calls["n"] += 1
        if calls["n"] == 7 and self.batched is not None:
            raise KeyboardInterrupt
        return real(self)

    monkeypatch.setattr(Collector, "collect", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train(cfg)
    run_dir = tmp_path / "sac"
    state = checkpoint.load_state(checkpoint.latest(run_dir))
    assert state["step"] == 64 * 6
    monkeypatch.setattr(Collector, "collect", real)
    result = train(resume=run_dir)
    assert result.steps == 64 * 12
    final = checkpoint.load_state(run_dir / checkpoint.NAME)
    assert final["step"] == 64 * 12 and len(final["evals"]) == 2


def test_batched_env_refuses_history_and_workers(tmp_path):
    with pytest.raises(ValueError, match="history"):
        builders.build_run(_cfg(tmp_path, algo="dqn", env="rlstash/CartPole-v1", history=4),
                           tmp_path / "h")  # fmt: skip
    with pytest.raises(ValueError, match="workers"):
        builders.build_run(_cfg(tmp_path, workers=2), tmp_path / "w")
    assert not (tmp_path / "h").exists() and not (tmp_path / "w").exists()


def test_cli_trains_sac_on_batched_pendulum(tmp_path):
    cmd = [sys.executable, "-m", "rlstash", "train", "--algo", "sac", "--env", "rlstash/Pendulum-v1",
           "--envs", "64", "--steps", "512", "--eval-every", "512", "--eval-episodes", "1",
           "--device", "cpu", "--quiet", "--run-dir", str(tmp_path), "--name", "cli",
           *[a for k, v in TINY.items() for a in ("--set", f"{k}={v}")],
           "--set", "net_arch=[16]"]  # fmt: skip
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert checkpoint.load_state(tmp_path / "cli" / checkpoint.NAME)["step"] == 512


def test_ppo_on_batched_cartpole_with_1024_envs(tmp_path):
    """``rlstash train --algo ppo --env rlstash/CartPole-v1 --envs 1024``: the env, the rollout
    storage and the learner on one device; a short run ends with a checkpoint."""
    agent = {"rollout_steps": 8, "minibatch_size": 4096, "n_epochs": 1, "net_arch": [16]}
    cfg = TrainConfig(algo="ppo", env="rlstash/CartPole-v1", envs=1024, steps=1024 * 8 * 3,
                      eval_every=1024 * 8 * 3, eval_episodes=2, run_dir=str(tmp_path),
                      name="ppo", quiet=True, device="cpu", agent=agent)  # fmt: skip
    run = builders.build_run(cfg, tmp_path / "probe")
    try:
        assert run.collector.batched is not None and run.collector.same_step
        assert run.rollout.device == run.env.device == run.agent.device
    finally:
        run.close()
    result = train(cfg)
    assert result.steps == 1024 * 8 * 3
    assert checkpoint.load_state(tmp_path / "ppo" / checkpoint.NAME)["step"] == result.steps
