"""The logger protocol without W&B: a library user's logger gets the rows the CSVs get, the
config and the close; :class:`Background` never blocks its caller; ``--track`` flags."""

from __future__ import annotations

import csv
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from rlstash.cli.main import main
from rlstash.train import tracking
from rlstash.train.config import TrainConfig
from rlstash.train.loop import train
from tests.track.tiny import TINY


class ListLogger:
    """A :class:`tracking.Logger` that keeps what it gets."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, dict[str, Any], str]] = []
        self.configs: list[dict[str, Any]] = []
        self.closed = 0

    def log(self, step: int, row: Any, kind: str) -> None:
        self.rows.append((step, dict(row), kind))

    def log_config(self, config: Any) -> None:
        self.configs.append(dict(config))

    def log_video(self, step: int, path: Path) -> None:
        raise AssertionError("no video asked for")

    def close(self) -> None:
        self.closed += 1


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def test_a_library_logger_gets_every_csv_row_and_the_config(tmp_path: Path) -> None:
    mine = ListLogger()
    assert isinstance(mine, tracking.Logger)
    train(TrainConfig(run_dir=str(tmp_path), name="r", **TINY), loggers=[mine])
    run = tmp_path / "r"
    for kind, name in (("progress", "progress.csv"), ("eval", "eval.csv")):
        got = [(s, r) for s, r, k in mine.rows if k == kind]
        rows = _rows(run / name)
        assert [s for s, _ in got] == [int(r["step"]) for r in rows]
        for (_, row), csv_row in zip(got, rows):
            assert {k for k, v in csv_row.items() if v != ""} == {"step", *row}  # same names
            assert float(csv_row["return_mean" if kind == "eval" else "updates"]) == pytest.approx(
                row["return_mean" if kind == "eval" else "updates"], rel=1e-5
            )
    assert mine.configs[0]["algo"] == "dqn" and mine.configs[0]["batch_size"] == 16
    assert mine.closed == 1


def test_background_drops_when_full_and_warns_once(recwarn: pytest.WarningsRecorder) -> None:
    release = threading.Event()

    class Slow(ListLogger):
        def log(self, step: int, row: Any, kind: str) -> None:
            release.wait(30)
            super().log(step, row, kind)

    inner = Slow()
    bg = tracking.Background(lambda: inner, "slow", maxsize=2, close_timeout=10)
    t0 = time.monotonic()
    for step in range(50):
        bg.log(step, {"x": 1.0}, "progress")
    assert time.monotonic() - t0 < 1.0  # never waited on the backend
    release.set()
    bg.close()
    assert not bg.alive and inner.closed == 1
    assert len(inner.rows) <= 3  # what fitted: the call under way and the queue
    said = [str(w.message) for w in recwarn if "slow logging stopped" in str(w.message)]
    assert len(said) == 1 and "falls behind" in said[0]


def test_wandb_missing_is_one_line_and_nothing_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    with pytest.raises(ValueError, match=r"pip install 'rlstash\[wandb\]'"):
        train(TrainConfig(track="wandb", run_dir=str(tmp_path), name="r", **TINY))
    assert not (tmp_path / "r").exists()
    code = main(["train", "--track", "wandb", "--run-dir", str(tmp_path), "--steps", "64"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "rlstash[wandb]" in err, err


def test_track_flags(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["train", "--track", "wandb", "--wandb-project", "P", "--wandb-entity", "E",
            "--wandb-tags", "a,b", "--show-config"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert 'track = "wandb"' in out and 'wandb_project = "P"' in out
    assert 'wandb_entity = "E"' in out and "wandb_tags = [a, b]" in out
    assert main(["train", "--track", "mlflow"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlstash train: error: --track:") and "wandb" in err, err
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TrainConfig(track="", wandb_tags=())  # the defaults: no tracker
