"""The training application's set-up: one build_run, TrainConfig vs agent configs, presets,
settings given once, and flags derived from the config dataclasses."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch

from rlstash.agents.dqn import DQNConfig
from rlstash.agents.ppo import PPOConfig
from rlstash.agents.sac import SACConfig
from rlstash.agents.sac_discrete import DiscreteSACConfig
from rlstash.cli import build_parser, main
from rlstash.cli.flags import agent_settings, flag
from rlstash.settings import SettingError
from rlstash.train import algos, builders
from rlstash.train.config import LOOP_SETTINGS, TrainConfig

TINY = dict(
    steps=64, eval_every=64, eval_episodes=1, quiet=True, device="cpu", batch_size=8,
    learning_starts=16, train_freq=8, buffer_size=256, agent={"net_arch": [8]},
)  # fmt: skip


# --- build_run: the set-up reads top to bottom -----------------------------------------------


def test_build_run_makes_env_buffer_agent_and_collectors(tmp_path: Path) -> None:
    cfg = TrainConfig(**{**TINY, "agent": {"net_arch": [8], "gamma": 0.9}}, n_steps=3)
    run = builders.build_run(cfg, tmp_path / "r")
    try:
        assert (tmp_path / "r").is_dir() and run.step == 0 and len(run.rb) == 0
        assert run.collector.env is run.env and run.eval_collector.env is not run.env
        assert run.cfg.batch_size == 8 and run.frames_per_collect == 8
        assert run.agent.config.net_arch == (8,) and run.agent.device == torch.device("cpu")
        # n_step and gamma are each given once: the buffer reads the run's n and the agent's gamma
        assert run.rb.storage.reads.n_step == 3 and run.rb.storage.reads.gamma == 0.9
        batch = run.collector.collect()
        run.rb.extend(batch)
        run.agent.update(run.rb.sample(run.cfg.batch_size))
    finally:
        run.close()


def test_build_run_refuses_before_writing_anything(tmp_path: Path) -> None:
    cfg = TrainConfig(**{**TINY, "agent": {"learning_rate": -1.0}})
    with pytest.raises(SettingError, match="learning_rate"):
        builders.build_run(cfg, tmp_path / "runs" / "r")
    assert not (tmp_path / "runs").exists()


def test_train_reads_top_to_bottom_through_build_run() -> None:
    """The loop module builds nothing itself: one build_run call, no builders.make_* calls."""
    import inspect

    from rlstash.train import loop

    src = inspect.getsource(loop)
    assert src.count("build_run(") == 1
    assert not re.search(r"builders\.(make_|probe_env|resolve|step_spec)", src)


# --- TrainConfig holds the loop, agent configs the learner --------------------------------


@pytest.mark.parametrize("config", [DQNConfig, SACConfig, DiscreteSACConfig, PPOConfig])
def test_agent_configs_hold_learner_settings_only(config: type) -> None:
    names = {f.name for f in dataclasses.fields(config)}
    assert not names & set(LOOP_SETTINGS), f"{config.__name__} holds loop settings"
    train_fields = {f.name for f in dataclasses.fields(TrainConfig)}
    assert not (names - {"seed"}) & train_fields, "a setting given in two places"


def test_loop_settings_in_agent_dict_are_refused_with_the_fix(tmp_path: Path) -> None:
    cfg = TrainConfig(**{**TINY, "agent": {"n_steps": 3}})
    with pytest.raises(SettingError, match=r"n_steps is a loop setting.*TrainConfig\(n_steps"):
        builders.build_run(cfg, tmp_path / "r")


def test_run_seed_seeds_the_agent_too(tmp_path: Path) -> None:
    info = builders.probe_env("CartPole-v1")
    _, a = algos.resolve(TrainConfig(seed=3), info.act_space)
    _, b = algos.resolve(TrainConfig(seed=4), info.act_space)
    assert (a.seed, b.seed) == (3, 4)


# The presets as they were in the agent configs before the loop settings moved: a run of a
# preset must resolve to exactly these settings (the same run as before).
OLD_PRESETS = {
    ("dqn", "CartPole-v1"): dict(
        learning_rate=2.3e-3, lr_schedule="linear", batch_size=64, buffer_size=50_000,
        learning_starts=1000, gamma=0.99, n_steps=5, target_update_interval=128,
        train_freq=256, gradient_steps=128, exploration_fraction=0.16,
        exploration_final_eps=0.04, net_arch=(64, 64), total_steps=50_000,
    ),
    ("sac", "Pendulum-v1"): dict(
        learning_rate=1e-3, net_arch=(64, 64), n_steps=2, buffer_size=20_000, batch_size=256,
        learning_starts=100, train_freq=1, gradient_steps=1, gamma=0.99, tau=0.005,
    ),
    ("dqn", "Acrobot-v1"): dict(  # no preset: Stable-Baselines3's defaults
        learning_rate=1e-4, batch_size=32, buffer_size=1_000_000, learning_starts=100,
        train_freq=4, gradient_steps=1, n_steps=1, target_update_interval=2500,
    ),
}  # fmt: skip


@pytest.mark.parametrize(("algo", "env_id"), list(OLD_PRESETS))
def test_presets_resolve_to_the_same_settings(algo: str, env_id: str) -> None:
    info = builders.probe_env(env_id)
    cfg, agent_cfg = algos.resolve(TrainConfig(algo=algo, env=env_id), info.act_space)
    for key, want in OLD_PRESETS[algo, env_id].items():
        got = getattr(cfg, key) if key in LOOP_SETTINGS else getattr(agent_cfg, key)
        assert got == want, f"{algo} {env_id}: {key} = {got!r}, was {want!r}"
    again, _ = algos.resolve(cfg, info.act_space)  # a resumed run resolves to itself
    assert again == cfg


def test_given_settings_beat_the_preset() -> None:
    info = builders.probe_env("CartPole-v1")
    cfg, agent_cfg = algos.resolve(
        TrainConfig(batch_size=7, agent={"learning_rate": 0.5}), info.act_space
    )
    assert cfg.batch_size == 7 and agent_cfg.learning_rate == 0.5
    assert cfg.train_freq == 256  # the rest of the preset stays


def test_registering_an_algorithm_is_one_table_entry() -> None:
    algo = algos.Algo(
        "dqn_copy",
        {"discrete": algos.Learner(DQNConfig, algos.ALGOS["dqn"].learners["discrete"].build)},
        loop=dict(algos.ALGOS["dqn"].loop),
    )
    algos.register(algo)
    try:
        TrainConfig(algo="dqn_copy")
        assert "--algo" in _help() and "dqn_copy" in str(agent_settings()["learning_rate"])
    finally:
        del algos.ALGOS["dqn_copy"]
    with pytest.raises(ValueError, match="loop must give"):
        algos.Algo("broken", {}, loop={})


# --- the CLI's flags come from the dataclasses ----------------------------------------------


def _help() -> str:
    import os
    from unittest import mock

    with mock.patch.dict(os.environ, {"COLUMNS": "10000"}):  # no wrapped words
        parser = build_parser()
        sub = next(a for a in parser._actions if a.dest == "command")
        return " ".join(sub.choices["train"].format_help().split())


def test_train_help_documents_every_setting() -> None:
    text = _help()
    for f in dataclasses.fields(TrainConfig):
        if f.name != "agent":
            assert f"{flag(f.name)} " in text, f"--help lacks {flag(f.name)}"
            assert " ".join(f.metadata["help"].split()) in text
    for config in (DQNConfig, SACConfig, DiscreteSACConfig):
        for name, help_text in config.help().items():
            if name != "seed":
                assert flag(name) in text, f"--help lacks {config.__name__}.{name}"
                assert " ".join(help_text.split()) in text


def _parsed(*argv: str) -> TrainConfig:
    from rlstash.cli.flags import Given
    from rlstash.cli.train import settings_from_args

    args = build_parser().parse_args(["train", *argv])
    return settings_from_args(args, Given()).config()


def test_existing_flag_names_still_set_their_fields() -> None:
    cfg = _parsed(
        "--algo", "sac", "--env", "Pendulum-v1", "--steps", "5", "--seed", "2", "--envs", "2",
        "--workers", "auto", "--storage", "disk", "--device", "cpu", "--buffer-device", "cpu",
        "--run-dir", "x", "--name", "n", "--history", "0", "--eval-every", "3",
        "--eval-episodes", "4", "--checkpoint-every", "6", "--threshold", "-150",
        "--patience", "2", "--quiet", "--set", "learning_rate=1e-3", "--set", "batch_size=9",
    )  # fmt: skip
    assert (cfg.algo, cfg.env, cfg.steps, cfg.seed, cfg.envs) == ("sac", "Pendulum-v1", 5, 2, 2)
    assert (cfg.workers, cfg.storage, cfg.run_dir, cfg.name, cfg.eval_every) == (
        "auto", "disk", "x", "n", 3,
    )  # fmt: skip
    assert (cfg.eval_episodes, cfg.checkpoint_every, cfg.threshold, cfg.patience) == (4, 6, -150, 2)
    assert cfg.quiet is True and cfg.batch_size == 9 and cfg.agent == {"learning_rate": 1e-3}


def test_agent_flags_parse_by_field_type() -> None:
    cfg = _parsed(
        "--net-arch", "32,16", "--learning-rate", "3e-3", "--no-autotune-alpha",
        "--target-entropy", "none", "--max-grad-norm", "0.5", "--batch-size", "12",
    )  # fmt: skip
    assert cfg.agent == {
        "net_arch": (32, 16),
        "learning_rate": 3e-3,
        "autotune_alpha": False,
        "target_entropy": None,
        "max_grad_norm": 0.5,
    }
    assert cfg.batch_size == 12


def test_flags_beat_the_config_file_and_set_beats_flags(tmp_path: Path) -> None:
    toml = tmp_path / "c.toml"
    toml.write_text("steps = 11\nenvs = 3\n[agent]\nlearning_rate = 0.1\ngamma = 0.5\n")
    cfg = _parsed("--config", str(toml), "--steps", "12", "--gamma", "0.7", "--set", "gamma=0.8")
    assert cfg.steps == 12 and cfg.envs == 3
    assert cfg.agent == {"learning_rate": 0.1, "gamma": 0.8}


def test_cli_run_with_flags_trains(tmp_path: Path) -> None:
    rc = main(["train", "--quiet", "--device", "cpu", "--run-dir", str(tmp_path), "--name", "f",
               "--steps", "64", "--eval-every", "64", "--eval-episodes", "1", "--batch-size", "8",
               "--learning-starts", "16", "--train-freq", "8", "--buffer-size", "256",
               "--net-arch", "8", "--n-steps", "2"])  # fmt: skip
    assert rc == 0
    from rlstash.train import checkpoint

    state = checkpoint.load_state(tmp_path / "f" / "checkpoint")
    assert state["config"]["n_steps"] == 2 and state["config"]["agent"]["net_arch"] == (8,)


def test_resume_refuses_new_settings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--resume", str(tmp_path / "r"), "--steps", "5"]) == 2
    err = capsys.readouterr().err
    assert "--resume" in err and "--steps" in err and err.count("\n") == 1


def test_an_agent_config_repeating_a_loop_setting_cannot_register() -> None:
    @dataclasses.dataclass
    class Repeats(DQNConfig):
        steps: int = 5

    with pytest.raises(ValueError, match=r"repeats TrainConfig settings \['steps'\]"):
        algos.Algo("x", {"discrete": algos.Learner(Repeats, None)}, loop=algos.ALGOS["dqn"].loop)


def test_show_config_prints_the_resolved_run_as_a_config_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs"
    argv = ["train", "--show-config", "--run-dir", str(runs), "--batch-size", "99"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "batch_size = 99" in text and "train_freq = 256" in text  # given, then preset
    assert "[agent]" in text and "learning_rate = 0.0023" in text and "net_arch = [64, 64]" in text
    (tmp_path / "c.toml").write_text(text)
    assert main(["train", "--show-config", "--config", str(tmp_path / "c.toml")]) == 0
    assert capsys.readouterr().out == text  # it round-trips through --config
    assert not runs.exists()


# --- run names: one directory under run_dir ---------------------------------------------------


@pytest.mark.parametrize(
    ("env", "want"),
    [("CartPole-v1", "dqn-CartPole-v1-s3"), ("ALE/Pong-v5", "dqn-ALE-Pong-v5-s3"),
     ("rlstash/CartPole-v1", "dqn-rlstash-CartPole-v1-s3"),
     ("my.mod:Env-v0", "dqn-my.mod-Env-v0-s3")],
)  # fmt: skip
def test_default_run_names_are_one_safe_directory(env: str, want: str) -> None:
    cfg = TrainConfig(env=env, seed=3)
    assert cfg.run_name == want
    assert Path(cfg.run_name).name == cfg.run_name  # no '/': not a nested directory


def test_a_run_of_an_id_with_a_slash_makes_one_directory(tmp_path: Path) -> None:
    """rlstash/CartPole-v1 (an id with '/', as ALE ids): its run is runs/<one name>/."""
    cfg = TrainConfig(env="rlstash/CartPole-v1", run_dir=str(tmp_path), envs=4, **TINY)
    from rlstash.train.loop import train

    result = train(cfg)
    assert result.run_dir == tmp_path / "dqn-rlstash-CartPole-v1-s0"
    assert [p.name for p in tmp_path.iterdir()] == ["dqn-rlstash-CartPole-v1-s0"]
    assert (result.run_dir / "checkpoint" / "COMPLETE").exists()


@pytest.mark.parametrize("name", ["a/b", "..", ".", "x\\y"])
def test_a_name_that_is_not_one_directory_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    with pytest.raises(SettingError, match="name: expected one directory name"):
        TrainConfig(name=name)
    rc = main(["train", "--name", name, "--run-dir", str(tmp_path / "runs"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "--name" in err and "e.g. --name" in err
    assert not (tmp_path / "runs").exists()
