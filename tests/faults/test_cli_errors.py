"""Class 8 of issue 22: every CLI error is one line on stderr, exit 2, nothing written.

Parser errors of every registered subcommand (found from the parser, so a new subcommand is
covered when it is registered), bad values, config files, missing packages, the library's
exceptions at the top level; the settings that ``rlstash plan`` and ``rlstash train`` must
judge alike (compression); PPO's default budget at any env count and the progress line.
"""

from __future__ import annotations

import argparse
import errno
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlstash import cli
from rlstash.settings import SettingError
from rlstash.train import algos
from rlstash.train.config import TrainConfig


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _one_line(capsys: pytest.CaptureFixture[str], argv: list[str], prefix: str) -> str:
    """Run ``rlstash *argv``; assert exit 2, one line on stderr starting ``prefix``, no stdout."""
    rc = cli.main(argv)
    out, err = capsys.readouterr()
    assert rc == 2, (argv, rc, out, err)
    assert err.count("\n") == 1 and err.endswith("\n"), (argv, err)
    assert err.startswith(prefix), (argv, err)
    assert "Traceback" not in err and out == "", (argv, out, err)
    return err


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny DQN run (checkpoint included) to evaluate."""
    from rlstash.train.loop import train

    root = tmp_path_factory.mktemp("runs")
    cfg = TrainConfig(
        steps=64, eval_every=64, eval_episodes=1, quiet=True, device="cpu", run_dir=str(root),
        name="r", batch_size=16, learning_starts=32, train_freq=32, buffer_size=1024,
        agent={"net_arch": [8]},
    )  # fmt: skip
    train(cfg)
    return root / "r"


# --- parser errors of every registered subcommand ------------------------------------------


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _positionals(sp: argparse.ArgumentParser) -> list[str]:
    return ["RUN" for a in sp._actions if not a.option_strings and a.required]


@pytest.mark.parametrize("command", sorted(_commands()))
def test_every_subcommand_refuses_bad_flags_in_one_line(command, tmp_path, monkeypatch, capsys):
    """An unknown flag, every flag without its value and every count flag given 0: one line
    naming the flag and the subcommand, exit 2, nothing written."""
    monkeypatch.chdir(tmp_path)
    sp = _commands()[command]
    pos = _positionals(sp)
    prefix = f"rlstash {command}: error: "
    err = _one_line(capsys, [command, *pos, "--no-such-flag"], prefix)
    assert "unrecognized arguments: --no-such-flag" in err and f"rlstash {command} --help" in err
    takes_value = [
        a for a in sp._actions
        if a.option_strings and a.nargs is None and not isinstance(a, argparse._HelpAction)
        and a.option_strings[0].startswith("--")
    ]  # fmt: skip
    for action in takes_value:
        flag = action.option_strings[0]
        err = _one_line(capsys, [command, *pos, flag], prefix)
        assert f"{flag}: expected one argument" in err, err
        if getattr(action.type, "__name__", "").startswith("int >="):  # a count flag
            low = int(action.type.__name__.split(">=")[1])
            err = _one_line(capsys, [command, *pos, flag, str(low - 1)], prefix)
            assert f"{flag}: expected an int >= {low}, got '{low - 1}'" in err, err
    assert _files(tmp_path) == []


def test_count_flags_of_eval_plan_and_bench_parse_through_one_type():
    """The count-like flags: every one of them is an ``int >= N`` of the flag layer."""
    counts = {
        "eval": {"--episodes", "--seed"},
        "plan": {"--buffer-size", "--num-envs", "--frame-stack"},
        "bench": {"--envs", "--batch-size", "--capacity", "--chunk"},
    }
    for command, flags in counts.items():
        typed = {
            a.option_strings[0]
            for a in _commands()[command]._actions
            if getattr(a.type, "__name__", "").startswith("int >=")
        }
        assert flags <= typed, (command, flags - typed)


# --- a table of bad input: argv -> a fragment of the one-line message ----------------------

BINARY = b"\xff\xfe\x00steps = 1\n"
CASES = [
    ([], "rlstash: error: ", "the following arguments are required: command"),
    (["nosuch"], "rlstash: error: ", "invalid choice: 'nosuch'"),
    (["train", "--steps"], "rlstash train: error: ", "--steps: expected one argument"),
    (["train", "--bogus", "1"], "rlstash train: error: ", "unrecognized arguments: --bogus 1"),
    (["eval"], "rlstash eval: error: ", "the following arguments are required: run"),
    (["eval", "{run}", "--episodes", "0"], "rlstash eval: error: ", "--episodes: expected an int >= 1, got '0'"),
    (["eval", "{run}", "--episodes", "-2"], "rlstash eval: error: ", "--episodes: expected an int >= 1, got '-2'"),
    (["eval", "{run}", "--episodes", "many"], "rlstash eval: error: ", "--episodes: expected an int >= 1, got 'many'"),
    (["plan", "--buffer-size"], "rlstash plan: error: ", "--buffer-size: expected one argument"),
    (["doctor", "--run-dir"], "rlstash doctor: error: ", "--run-dir: expected one argument"),
    (["bench", "--seconds"], "rlstash bench: error: ", "--seconds: expected one argument"),
    (["train", "--device", "meta"], "rlstash train: error: ", "--device: device type 'meta' is not supported by rlstash for computing"),
    (["train", "--buffer-device", "meta"], "rlstash train: error: ", "--buffer-device: device type 'meta'"),
    (["bench", "--device", "meta"], "rlstash bench: error: ", "--device: device type 'meta' is not supported by rlstash for computing"),
    (["train", "--config", "{tmp}/nope.toml"], "rlstash train: error: ", "--config {tmp}/nope.toml: cannot read it as TOML: No such file"),
    (["train", "--config", "{tmp}/binary.toml"], "rlstash train: error: ", "--config {tmp}/binary.toml: cannot read it as TOML: not a UTF-8 text file"),
    (["train", "--config", "{tmp}/small.toml"], "rlstash train: error: ", "--config {tmp}/small.toml: [agent] buffer_size: expected at least 6"),
    (["train", "--config", "{tmp}/gamma.toml"], "rlstash train: error: ", "--config {tmp}/gamma.toml: [agent] gamma: expected a discount"),
    (["train", "--config", "{tmp}/arch.toml"], "rlstash train: error: ", "e.g. net_arch = [64, 64]"),
    (["train", "--algo", "dqn", "--ray-actors", "3"], "rlstash train: error: ", "--ray-actors: expected the default (2) without --ray"),
    (["train", "--algo", "ppo", "--buffer-device", "cuda"], "rlstash train: error: ", "--buffer-device: --algo ppo keeps its rollout on --device"),
    (["train", "--algo", "dqn", "--env-kwargs", '{"a": 1}'], "rlstash train: error: ", "--env-kwargs: reach multi-agent envs (vmas/<scenario>, pettingzoo:<module>) only"),
    (["train", "--algo", "ppo", "--env-kwargs", '{"a": 1}'], "rlstash train: error: ", "--env-kwargs: reach multi-agent envs"),
    (["train", "--track", "wandb", "--wandb-project", "team/proj"], "rlstash train: error: ", "--wandb-project: expected a W&B name of 1 to 128 characters without / \\ # ? % :"),
    (["train", "--track", "wandb", "--wandb-entity", "a:b"], "rlstash train: error: ", "--wandb-entity: expected a W&B name"),
    (["train", "--track", "wandb", "--wandb-tags", "ok," + "x" * 65], "rlstash train: error: ", "--wandb-tags: expected tags of 1 to 64 characters each"),
    (["train", "--wandb-project", "p"], "rlstash train: error: ", "--wandb-project: expected the default without --track wandb"),
    (["train", "--compress-budget", "0.2"], "rlstash train: error: ", "--compress-budget: expected the default (0.5) without --compress"),
    (["plan", "--field", "obs=4x84x84:uint8", "--field", "action=:int64", "--layout", "stream", "--buffer-size", "1000", "--compress-delta"], "rlstash plan: error: ", "--compress-delta: expected the default (False) without --compress"),
    (["plan", "--compress", "none", "--compress-budget", "2"], "rlstash plan: error: ", "--compress-budget: expected a fraction in (0, 1]"),
    (["plan", "--field", "obs=4x84x84:uint8", "--field", "action=:int64", "--layout", "stream", "--buffer-size", "1000", "--compress", "lz4", "--compress-budget", "0.01"], "rlstash plan: error: ", "--compress-budget: expected at least 0.04"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "prefix", "fragment"), CASES, ids=[" ".join(c[0]) or "(none)" for c in CASES]
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(
    argv, prefix, fragment, run, tmp_path, monkeypatch, capsys
):  # fmt: skip
    monkeypatch.chdir(tmp_path)
    (tmp_path / "binary.toml").write_bytes(BINARY)
    (tmp_path / "small.toml").write_text("[agent]\nbuffer_size = 5\n")
    (tmp_path / "gamma.toml").write_text("[agent]\ngamma = 2\n")
    (tmp_path / "arch.toml").write_text("[agent]\nnet_arch = 'wide'\n")
    before, run_before = _files(tmp_path), _files(run)
    argv = [a.replace("{run}", str(run)).replace("{tmp}", str(tmp_path)) for a in argv]
    if argv[:1] == ["train"] and "--device" not in argv:
        argv += ["--device", "cpu"]
    if argv[:1] == ["train"]:
        argv += ["--quiet", "--run-dir", str(tmp_path / "runs")]
    err = _one_line(capsys, argv, prefix)
    assert fragment.replace("{tmp}", str(tmp_path)) in err, err
    assert _files(tmp_path) == before and _files(run) == run_before  # nothing written


# --- the top-level handler: the library's exceptions as one line ----------------------------


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (ValueError("steps: expected an int >= 1, got 0\nFix: give 1 or more"), 2),
        (ImportError("codec 'lz4' needs the lz4 package: pip install 'rlstash[compress]'"), 2),
        (FileNotFoundError(errno.ENOENT, "No such file or directory", "runs/x"), 2),
        (PermissionError(errno.EACCES, "Permission denied", "runs"), 2),
        (MemoryError("Not enough memory on ram for the buffer\nFix: capacity <= 10"), 2),
        (OSError(errno.ENOSPC, "No space left on device"), 1),  # a fault while running
        (MemoryError(), 2),  # no message: named by its type, never an empty line
        (ValueError(), 2),
    ],
)
def test_the_library_errors_become_one_line(exc, code, monkeypatch, capsys):
    import rlstash.diag.doctor as doctor

    def fail(*args, **kwargs):
        raise exc

    monkeypatch.setattr(doctor, "diagnose", fail)
    assert cli.main(["doctor"]) == code
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and err.startswith("rlstash doctor: error: "), err
    assert " ".join(str(exc).split()) in err and out == ""
    if not str(exc):  # named by its type, never an empty message
        assert err == f"rlstash doctor: error: {type(exc).__name__}\n", err


# --- dependencies checked before a run starts -----------------------------------------------


def test_video_without_the_renderers_package_is_refused_before_the_run(
    tmp_path, monkeypatch, capsys
):
    """CartPole renders with pygame: without it ``--video`` is one line naming pygame and the
    install command, before the first step (it failed at the first evaluation, leaving a run
    without a checkpoint)."""
    pytest.importorskip("imageio_ffmpeg")
    monkeypatch.setitem(sys.modules, "pygame", None)  # as if not installed
    argv = ["train", "--video", "--steps", "64", "--eval-every", "32", "--learning-starts", "16"]
    argv += ["--device", "cpu", "--quiet", "--run-dir", str(tmp_path / "runs")]
    err = _one_line(capsys, argv, "rlstash train: error: ")
    assert "--video: env CartPole-v1 cannot render frames: pygame" in err, err
    assert "pip install" in err and "or drop --video" in err
    assert not (tmp_path / "runs").exists()


def test_a_codec_without_its_package_is_refused_naming_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "lz4", None)  # as if not installed
    cfg = TrainConfig(
        env="ALE/Pong-v5", compress="lz4", buffer_size=1000, n_steps=1, envs=8, device="cpu"
    )
    with pytest.raises(ValueError, match=r"^compress: codec 'lz4' needs the lz4 package") as e:
        cfg.compression()
    assert "pip install 'rlstash[compress]'" in str(e.value)


# --- compression: plan and train judge the settings alike ------------------------------------

PLAN_GEOMETRY = ["--field", "obs=4x84x84:uint8", "--field", "action=:int64", "--layout", "stream",
                 "--buffer-size", "1000", "--num-envs", "8", "--frame-stack", "4"]  # fmt: skip
TRAIN_GEOMETRY = ["--env", "ALE/Pong-v5", "--buffer-size", "1000", "--envs", "8", "--n-steps", "1"]


@pytest.mark.parametrize(
    ("flags", "refused_by"),
    [
        (["--compress", "lz4", "--compress-budget", "0.04"], None),
        (["--compress", "zstd", "--compress-delta", "--compress-budget", "0.1"], None),
        (["--compress", "none", "--compress-budget", "2"], "--compress-budget"),
        (["--compress", "lz4", "--compress-budget", "0.01"], "--compress-budget"),
        (["--compress", "zstd", "--compress-delta", "--compress-budget", "0.05"], "--compress-budget"),
        (["--compress", "gzip"], "--compress"),
        (["--compress", "lz4", "--storage", "disk", "--path", "x"], "--compress"),
    ],
)  # fmt: skip
def test_plan_and_train_share_the_compression_rules(flags, refused_by, tmp_path, monkeypatch):
    """One function judges both (config.check_compression): what plan accepts, train accepts,
    and a budget too small to keep one sampled row is refused by both, naming the flag."""
    from rlstash.cli.flags import Given
    from rlstash.cli.train import settings_from_args

    monkeypatch.chdir(tmp_path)
    plan_flags = flags
    train_flags = [f for f in flags if f not in ("--path", "x")]
    try:
        cli.build_plan(cli.build_parser().parse_args(["plan", *PLAN_GEOMETRY, *plan_flags]))
        plan_error = None
    except ValueError as exc:
        plan_error = str(exc)
    argv = ["train", *TRAIN_GEOMETRY, "--device", "cpu", *train_flags]
    given = settings_from_args(cli.build_parser().parse_args(argv), Given())
    try:
        algos.resolve(given.config(), gym.spaces.Discrete(6))
        train_error = None
    except SettingError as exc:
        train_error = given.explain(exc)
    if refused_by is None:
        assert plan_error is None and train_error is None, (plan_error, train_error)
    else:
        assert plan_error is not None and plan_error.startswith(f"{refused_by}: "), plan_error
        assert train_error is not None and train_error.startswith(f"{refused_by}: "), train_error
    assert _files(tmp_path) == []


def test_the_minimum_budget_keeps_a_sampled_row_of_incompressible_frames():
    """The rule behind the minimum: at it, frames that do not compress at all still leave rows
    to sample; far below it sampling finds none (the error the check now prevents)."""
    from rlstash.replay import ReplayBuffer
    from rlstash.storage.frames import FrameCompression
    from rlstash.storage.stream import ReadSpec, StreamStorage
    from rlstash.train.config import check_compression

    N, L, k, n = 2, 64, 4, 1
    with pytest.raises(SettingError, match=r"at least 0.0782"):
        check_compression("lz4", 0.07, False, "ram", "cpu", lane_slots=L, row_frames=k + n)
    minimum = check_compression("lz4", 0.0782, False, "ram", "cpu", lane_slots=L, row_frames=5)
    rng = np.random.default_rng(0)
    for comp, has_rows in ((minimum, True), (FrameCompression("lz4", budget=1 / L), False)):
        spec = {"obs": ((16, 16), torch.uint8), "action": ((), torch.int64)}
        st = StreamStorage(spec, N, N * L, backing=comp, reads=ReadSpec(n_step=n, frame_stack=k))
        rb = ReplayBuffer(st, seed=0)
        for _ in range(3 * L):
            rb.extend({
                "obs": torch.from_numpy(rng.integers(0, 256, (1, N, 16, 16), dtype=np.uint8)),
                "action": torch.zeros(1, N, dtype=torch.int64),
                "reward": torch.zeros(1, N), "terminated": torch.zeros(1, N, dtype=torch.bool),
                "truncated": torch.zeros(1, N, dtype=torch.bool),
            })  # fmt: skip
        if has_rows:
            assert rb.sample(8)["obs"].shape == (8, k, 16, 16)
        else:
            with pytest.raises(ValueError, match="none of the"):
                rb.sample(8)


# --- PPO's default budget at any env count; the progress line -------------------------------


@pytest.mark.parametrize(
    ("env", "settings", "steps", "rollouts"),
    [
        ("rlstash/CartPole-v1", {}, 100_000, 391),  # the preset's 8 envs x 32 steps
        ("CartPole-v1", {"envs": 8}, 100_000, 391),
        ("rlstash/CartPole-v1", {"envs": 1024}, 12_800_000, 391),
        ("rlstash/CartPole-v1", {"envs": 1024, "agent": {"rollout_steps": 64}}, 25_600_000, 391),
        ("rlstash/CartPole-v1", {"envs": 1024, "steps": 50_000}, 50_000, 2),  # given: kept
    ],
)
def test_ppo_default_budget_counts_the_presets_rollouts(env, settings, steps, rollouts):
    """1024 envs made 4 rollouts of the 391 the preset plans (stopping at a return of 69):
    the default budget is the preset's rollouts, at any env count."""
    cfg, agent_cfg = algos.resolve(
        TrainConfig(algo="ppo", env=env, device="cpu", **settings), gym.spaces.Discrete(2)
    )
    assert cfg.steps == steps
    frames = algos.rollout_envs(cfg, agent_cfg) * agent_cfg.rollout_steps
    assert -(-cfg.steps // frames) == rollouts


def test_off_policy_default_budget_is_steps():
    cfg, _ = algos.resolve(TrainConfig(env="CartPole-v1", envs=64), gym.spaces.Discrete(2))
    assert cfg.steps == algos.DEFAULT_STEPS == 100_000


def test_the_progress_line_never_shows_a_step_past_its_total_or_a_negative_eta():
    from rlstash.train.runlog import progress_line, run_length

    total = run_length(100_000, 0, 32_768)  # PPO, 1024 envs x 32 steps per rollout
    assert total == 131_072 and run_length(100_000, 0, 1000) == 100_000
    assert run_length(100_000, 98_304, 32_768) == 131_072 and run_length(10, 64, 32) == 64
    for step in (32_768, 98_304, 131_072):
        line = progress_line(step, total, 18_000.0, 69.0)
        shown, budget = line.split()[1].split("/")
        assert int(shown) <= int(budget) == total
        assert "eta -" not in line
    assert progress_line(131_072, total, 18_000.0, 69.0).endswith("eta 0s")
    assert progress_line(131_072, 100_000, 18_000.0, 69.0).startswith("step 131072/131072 ")
    assert progress_line(0, total, 0.0, float("nan")).endswith("eta ?")
