"""The command line: plan, doctor, argument errors as one clear line."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
from pathlib import Path

import pytest

import rlstash
from rlstash import cli
from rlstash.train.config import flag


def test_parse_field():
    name, f = cli.parse_field("obs=4x84x84:uint8")
    assert name == "obs" and f.shape == (4, 84, 84) and f.row_bytes == 28224
    name, f = cli.parse_field("action=:int64")
    assert f.shape == () and f.row_bytes == 8


@pytest.mark.parametrize("text", ["obs", "obs=4x84", "obs=4xx:uint8", "obs=4:uint9", "=4:uint8"])
def test_parse_field_errors(text):
    with pytest.raises(ValueError, match="--field"):
        cli.parse_field(text)


def test_plan_default_atari_buffer(capsys):
    rc = cli.main(["plan", "--buffer-size", "1000"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "28,224,000" in out  # 1000 rows of 4x84x84 uint8, exact
    assert "stream (frames once)" in out


def test_plan_from_env(capsys):
    assert cli.main(["plan", "--env", "CartPole-v1", "--buffer-size", "100"]) == 0
    out = capsys.readouterr().out
    assert "next_obs" in out and "1,600" in out  # 100 x 4 float32


def test_plan_that_does_not_fit_names_numbers_and_fix(capsys):
    rc = cli.main(["plan", "--field", "obs=4x84x84:uint8", "--buffer-size", "100000000"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "does not fit" in out and "2,822,400,000,000" in out and "capacity" in out


def test_bad_arguments_are_one_line(capsys):
    rc = cli.main(["plan", "--field", "obs=4:uint9"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "uint9" in err
    rc = cli.main(["plan", "--env", "NoSuchEnv-v0"])
    assert rc == 2 and "NoSuchEnv-v0" in capsys.readouterr().err


@pytest.mark.allow_cuda  # doctor asks the machine what it has, CUDA included
def test_doctor_reports_the_machine(capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    for key in ("CUDA visible", "RAM available", "/dev/shm", "open-file limit", "start methods"):
        assert key in out


# --- rlstash train: a bad setting is one line naming it, what was expected, what came, the fix


@pytest.mark.parametrize(
    ("argv", "toml", "words"),
    [
        (["--set", "learning_rate=abc"], None, ["--set learning_rate", "a float", "'abc'", "e.g."]),
        (["--learning-rate", "abc"], None, ["--learning-rate", "a float", "'abc'", "e.g."]),
        ([], "agent = 5\n", ["agent", "[agent] table", "got 5", "under [agent]"]),
        ([], "[agent]\nlearning_rate = 'x'\n", ["learning_rate", "a float", "'x'", "e.g."]),
        ([], "steps = 1.5\n", ["steps", "an int", "1.5", "e.g. steps = "]),
        ([], "stepz = 1\n", ["stepz", "a known setting", "settings:"]),
        (["--seed", "-1"], None, ["--seed", "an int >= 0", "-1", "give 0 or more"]),
        (["--threshold", "nan"], None, ["--threshold", "not NaN", "nan", "give a number"]),
        (["--steps", "0"], None, ["--steps", ">= 1", "got 0", "give 1"]),
        (["--workers", "lots"], None, ["--workers", "'auto'", "'lots'", "give"]),
        (["--net-arch", "a,b"], None, ["--net-arch", "an int", "'a'", "e.g. --net-arch"]),
        (["--batch-size", "0"], None, ["--batch-size", ">= 1", "got 0", "give 1"]),
        (["--gamma", "2"], None, ["--gamma", "(0, 1]", "2.0", "e.g. 0.99"]),
        (["--autotune-alpha", "--set", "autotune_alpha=maybe"], None, ["autotune_alpha", "bool"]),
        (["--algo", "nope"], None, ["--algo", "dqn, sac", "'nope'", "pick one"]),
        (["--set", "nope=1"], None, ["--set nope", "a known setting", "settings:"]),
        (["--compress", "gzip"], None, ["--compress", "none, lz4, zstd", "'gzip'", "pick one"]),
        (
            ["--compress", "lz4", "--compress-budget", "0"],
            None,
            ["--compress-budget", "(0, 1]", "0.0", "e.g. 0.1"],
        ),
        (
            ["--compress", "lz4", "--storage", "disk"],
            None,
            ["--compress", "host RAM", "storage disk", "--storage ram"],
        ),
        (
            ["--compress", "zstd", "--buffer-device", "cuda:0"],
            None,
            ["--compress", "buffer_device cuda:0", "--buffer-device cpu"],
        ),
    ],
)
def test_train_bad_setting_is_one_line_and_writes_nothing(tmp_path, capsys, argv, toml, words):
    runs = tmp_path / "runs"
    if toml is not None:
        (tmp_path / "c.toml").write_text(toml)
        argv = [*argv, "--config", str(tmp_path / "c.toml")]
    rc = cli.main(["train", "--quiet", "--device", "cpu", "--run-dir", str(runs), *argv])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("rlstash train: error: "), err
    for word in words:
        assert word in err, f"{word!r} not in {err!r}"
    assert not runs.exists(), "a refused run wrote files"


# --- rlstash plan: a bad setting is one line naming it and the fix, exit 2, nothing written
@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--buffer-device", "banana"], ["--buffer-device", "'banana'", "cpu", "cuda:0"]),
        (["--buffer-device", "cuda:x"], ["--buffer-device", "'cuda:x'"]),
        (["--buffer-device", "mps"], ["--buffer-device", "'mps'", "cpu", "cuda"]),
        (["--buffer-device", "auto"], ["--buffer-device", "'auto'", "cpu", "cuda"]),
        (
            ["--field", "obs=4:uint8", "--field", "obs=2:float32"],
            ["--field obs", "twice", "one --field per name"],
        ),
        (["--field", "obs=0x84:uint8"], ["--field obs", "0x84", ">= 1", "e.g. 4x84x84"]),
        (["--field", "obs=4x-1:uint8"], ["--field obs", "4x-1", "e.g. 4x84x84"]),
        (["--buffer-size", "abc"], ["--buffer-size", "'abc'"]),
        (["--buffer-size", "0"], ["--buffer-size", ">= 1", "0"]),
        (["--compress-budget", "half"], ["--compress-budget", "'half'", "float"]),
        (["--num-envs", "0"], ["--num-envs", ">= 1"]),
        (["--sampler", "lifo"], ["--sampler", "'lifo'", "uniform", "prioritized"]),
        (["--storage", "disk"], ["--path", "disk"]),
        (
            ["--storage", "disk", "--buffer-device", "cuda:0", "--path", "x"],
            ["--buffer-device", "disk"],
        ),
        (["--storage", "shm"], ["--storage", "'shm'", "ram, disk, tiered"]),
        (["--storage", "tiered"], ["--storage", "'tiered'", "--storage ram", "--storage disk"]),
        (["--layout", "stream", "--buffer-size", "10"], ["--buffer-size", "16 for 8 envs"]),
        (["--field", "obs=4:uint8", "--env", "CartPole-v1"], ["--field/--env", "not both"]),
    ],
)
def test_plan_bad_setting_is_one_line_and_writes_nothing(
    tmp_path, monkeypatch, capsys, argv, words
):
    monkeypatch.chdir(tmp_path)
    rc = cli.main(["plan", *argv])
    out, err = capsys.readouterr()
    assert rc == 2, (rc, out, err)
    assert out == "" and err.count("\n") == 1 and err.startswith("rlstash plan: error: "), err
    for word in words:
        assert word in err, f"{word!r} not in {err!r}"
    assert list(tmp_path.iterdir()) == []


# --- rlstash bench --------------------------------------------------------------------------


def test_bench_measures_replay_pool_and_updates(capsys):
    import re

    rc = cli.main(["bench", "--envs", "2", "--workers", "0,1", "--batch-size", "8",
                   "--capacity", "64", "--chunk", "16", "--seconds", "0.03"])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0, out
    table = out.split("\n\n")[0].splitlines()[2:]  # below the header and its rule
    cells = [re.split(r"\s{2,}", line.strip()) for line in table]
    assert [c[0] for c in cells] == ["replay extend", "replay sample", "env steps", "env steps",
                                     "agent updates"]  # fmt: skip
    assert [c[3] for c in cells] == ["rows/s", "rows/s", "steps/s", "steps/s", "updates/s"]
    assert all(float(c[2].replace(",", "")) > 0 for c in cells)
    assert "workers=0" in cells[2][1] and "workers=1" in cells[3][1]
    assert "learner keeps up with" in out and "fastest collection" in out


def test_bench_rates_come_from_timed_work():
    from rlstash.diag.bench import timed_rate

    calls = []

    def op():
        calls.append(1)
        return 10

    rate, spread = timed_rate(op, seconds=0.03)
    assert rate > 0 and spread >= 0 and len(calls) > 3


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--batch-size", "0"], ["--batch-size", ">= 1", "'0'"]),
        (["--workers", "0,-1"], ["--workers", "'-1'"]),
        (["--algo", "nope"], ["--algo", "'nope'"]),
        (["--seconds", "nan"], ["--seconds", "'nan'"]),
        (["--batch-size", "128", "--capacity", "64"], ["batch_size", "--capacity"]),
    ],
)
def test_bench_bad_flags_are_one_line(capsys, argv, words):
    assert cli.main(["bench", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and all(w in err for w in words), err


# --- every command's flags come from one dataclass; plan shares train's replay fields ----------


def _subparser(command: str) -> argparse.ArgumentParser:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


@pytest.mark.parametrize(
    ("command", "config"),
    [
        ("plan", "rlstash.cli.plan:PlanConfig"),
        ("eval", "rlstash.cli.eval:EvalConfig"),
        ("doctor", "rlstash.cli.doctor:DoctorConfig"),
        ("bench", "rlstash.cli.bench:BenchConfig"),
    ],
)
def test_each_command_has_a_flag_per_field_of_its_config_and_no_other(command, config):
    module, name = config.split(":")
    cls = getattr(importlib.import_module(module), name)
    flags = {
        a.option_strings[0] if a.option_strings else a.dest
        for a in _subparser(command)._actions
        if not isinstance(a, argparse._HelpAction)
    }
    fields = {
        f.name if f.metadata.get("positional") else flag(f.name) for f in dataclasses.fields(cls)
    }
    assert flags == fields
    for action in _subparser(command)._actions:  # each flag's help is its field's help text
        if action.dest in fields or flag(action.dest) in fields:
            f = {f.name: f for f in dataclasses.fields(cls)}[action.dest]
            assert action.help.startswith(f.metadata["help"]), (action.dest, action.help)


def test_plan_and_train_declare_the_replay_fields_once():
    """Same names, types, help and defaults (plan plans 1,000,000 rows where train takes the
    preset's capacity), and the same rules: a bad value is the same error from all three."""
    from rlstash.cli.plan import PlanConfig
    from rlstash.settings import field_types
    from rlstash.train.config import ReplayConfig, TrainConfig

    shared = {f.name: f for f in dataclasses.fields(ReplayConfig)}
    assert set(shared) == {
        "storage", "buffer_device", "buffer_size", "compress", "compress_budget", "compress_delta"
    }  # fmt: skip
    for cls in (TrainConfig, PlanConfig):
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for name, f in shared.items():
            assert fields[name].metadata == f.metadata, (cls, name)
            if (cls, name) != (PlanConfig, "buffer_size"):
                assert fields[name].default == f.default, (cls, name)
            assert field_types(cls)[name] in (field_types(ReplayConfig)[name], int), (cls, name)
    assert PlanConfig().buffer_size == 1_000_000
    for bad in (
        {"storage": "shm"}, {"buffer_size": 0}, {"compress": "gzip"}, {"compress_budget": 2.0},
        {"compress": "lz4", "storage": "disk"},
    ):  # fmt: skip
        errors = set()
        for cls in (ReplayConfig, TrainConfig, PlanConfig):
            extra = {"path": "x"} if cls is PlanConfig else {}
            with pytest.raises(ValueError) as info:
                cls(**bad, **extra)
            errors.add(str(info.value))
        assert len(errors) == 1, (bad, errors)


def test_plan_keeps_its_old_flag_names_with_a_deprecation_warning(capsys, monkeypatch):
    import rlstash.memory

    # the two runs must print the same plan: the free RAM they print is held still (it moved
    # by 0.1 GiB between them on a GPU machine running other tests beside this one)
    free = rlstash.memory.ram_available()
    monkeypatch.setattr(rlstash.memory, "ram_available", lambda: free)
    new = ["plan", "--buffer-size", "1000", "--buffer-device", "cpu"]
    assert cli.main(new) == 0
    expected = capsys.readouterr()
    assert expected.err == ""
    with pytest.warns(DeprecationWarning) as record:
        assert cli.main(["plan", "--capacity", "1000", "--device", "cpu"]) == 0
    assert [str(w.message).split(" (")[0] for w in record] == [
        "--capacity is renamed --buffer-size", "--device is renamed --buffer-device"
    ]  # fmt: skip
    out, err = capsys.readouterr()
    assert out == expected.out
    assert err.splitlines() == [
        "rlstash plan: warning: --capacity is renamed --buffer-size (as in rlstash train); "
        "use --buffer-size",
        "rlstash plan: warning: --device is renamed --buffer-device (as in rlstash train); "
        "use --buffer-device",
    ]


@pytest.mark.parametrize(
    ("old", "name", "new"),
    [
        ("rlstash.train.cli", "main", "rlstash.cli"),
        ("rlstash.train.cli", "build_plan", "rlstash.cli"),
        ("rlstash.train.cli", "parse_field", "rlstash.cli"),
        ("rlstash.train.cli", "cmd_doctor", "rlstash.cli.doctor"),
        ("rlstash.train.cli_train", "settings_from_args", "rlstash.cli.train"),
        ("rlstash.train.cli_train", "cmd_eval", "rlstash.cli.eval"),
        ("rlstash.train.cli_bench", "cmd_bench", "rlstash.cli.bench"),
        ("rlstash.train.flags", "Given", "rlstash.cli.flags"),
        ("rlstash.train.flags", "int_at_least", "rlstash.cli.flags"),
    ],
)
def test_the_old_cli_modules_still_work_and_warn(old, name, new):
    module = importlib.import_module(old)
    with pytest.warns(DeprecationWarning, match=f"{old}.{name} moved to {new}.{name}"):
        got = getattr(module, name)
    assert got is getattr(importlib.import_module(new), name)
    with pytest.raises(AttributeError):
        module.no_such_name  # noqa: B018


def test_nothing_below_the_cli_imports_it():
    """Imports point down: ``rlstash/cli/`` may import anything; no module below imports it
    (the deprecated re-exports find it by name, at use)."""
    root = Path(rlstash.__file__).parent
    upward = []
    for path in root.rglob("*.py"):
        if path.is_relative_to(root / "cli") or path.name == "__main__.py":
            continue  # the command line, and ``python -m rlstash`` running it
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            upward += [
                f"{path.relative_to(root)}: {n}"
                for n in names
                if n == "rlstash.cli" or n.startswith("rlstash.cli.")
            ]
    assert upward == []
