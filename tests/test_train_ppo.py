"""`rlstash train --algo ppo` end to end with tiny settings: logs, checkpoint, plot, eval,
resume after an interruption, continuous actions with normalisation, and refusals."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from rlstash.agents.ppo import PPO
from rlstash.cli import main
from rlstash.train import checkpoint
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


# rl-baselines3-zoo hyperparams/ppo.yml, HalfCheetah-v3 (its tuned entry; SB3's defaults for the
# rest: advantages normalised, no value clipping, Adam eps 1e-5), in rlstash's setting names.
ZOO_HALF_CHEETAH = {
    "num_envs": 1, "rollout_steps": 512, "minibatch_size": 64, "gamma": 0.98,
    "learning_rate": 2.0633e-05, "anneal_lr": False, "ent_coef": 0.000401762,
    "clip_range": 0.1, "anneal_clip_range": False, "n_epochs": 20, "gae_lambda": 0.92,
    "max_grad_norm": 0.8, "vf_coef": 0.58096, "norm_obs": True, "norm_reward": True,
    "clip_obs": 10.0, "clip_reward": 10.0, "clip_range_vf": None, "normalize_advantage": True,
    "target_kl": None, "log_std_init": -2.0, "ortho_init": False, "activation": "relu",
    "net_arch": (256, 256), "adam_eps": 1e-5,
}  # fmt: skip


def test_cli_ppo_half_cheetah_is_the_rl_zoos_tuned_entry(monkeypatch, capsys) -> None:
    """`rlstash train --algo ppo --env HalfCheetah-v5` resolves to the Zoo's HalfCheetah entry
    (no training run; the env's probe is faked, so MuJoCo need not be installed), and the agent
    built from it has separate (256, 256) ReLU nets, PyTorch's init, log std -2 and rewards
    scaled by the return discounted with the algorithm's gamma, as VecNormalize in the Zoo."""
    from types import SimpleNamespace

    import numpy as np
    from gymnasium import spaces

    from rlstash.cli.train import tomllib  # tomli before Python 3.11
    from rlstash.train import algos, builders

    box = spaces.Box(-1.0, 1.0, (6,), np.float32)
    monkeypatch.setattr(
        builders, "probe_env", lambda env, history=0: SimpleNamespace(act_space=box)
    )
    argv = ["train", "--algo", "ppo", "--env", "HalfCheetah-v5", "--show-config"]
    assert main(argv) == 0
    shown = tomllib.loads(capsys.readouterr().out)
    _, agent_cfg = algos.resolve(TrainConfig(algo="ppo", env="HalfCheetah-v5"), box)
    for key, want in ZOO_HALF_CHEETAH.items():
        assert getattr(agent_cfg, key) == want, key
        if want is not None:  # what --show-config prints (None: a commented line)
            got = shown["agent"].get(key, getattr(agent_cfg, key))
            assert (tuple(got) if isinstance(want, tuple) else got) == want, key
    agent = PPO((17,), bounds=(box.low, box.high), config=agent_cfg)
    net = agent.nets["policy"]
    assert not net.shared_trunk and net.actor_trunk is not net.critic[0]
    for trunk in (net.actor_trunk, net.critic[0]):
        layers = [type(m).__name__ for m in trunk]
        assert layers == ["Flatten", "Linear", "ReLU", "Linear", "ReLU"]
        assert [m.out_features for m in trunk if isinstance(m, torch.nn.Linear)] == [256, 256]
    assert torch.equal(net.log_std.detach(), torch.full((6,), -2.0))
    assert agent.nets["reward_scaler"].gamma == 0.98 and agent.nets["reward_scaler"].clip == 10.0
    assert agent.nets["obs_norm"].clip == 10.0
    # PyTorch's default init (kaiming uniform, |w| <= 1/sqrt(fan_in)), not orthogonal gain 0.01
    bound = 1 / np.sqrt(256)
    assert net.mu.weight.abs().max() <= bound and net.mu.weight.abs().max() > 0.5 * bound
