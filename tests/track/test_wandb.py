"""``rlstash train --track wandb`` against a real W&B in offline mode (WANDB_MODE=offline): the
history has the CSVs' names, a resumed run continues the same W&B run, and a backend that
hangs or raises costs a warning, never the run or a CSV row."""

from __future__ import annotations

import csv
import importlib.util
import json
import threading
import time
import warnings
from pathlib import Path

import pytest

wandb = pytest.importorskip("wandb", reason="W&B tracking needs pip install 'rlstash[wandb]'")

from rlstash.train import tracking  # noqa: E402
from rlstash.train.config import TrainConfig  # noqa: E402
from rlstash.train.loop import train  # noqa: E402
from tests.hub.toy_env import ENV_ID  # noqa: E402
from tests.track.offline_wandb import offline_runs  # noqa: E402
from tests.track.tiny import TINY  # noqa: E402


@pytest.fixture(autouse=True)
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))


def _header(path: Path) -> list[str]:
    with path.open() as f:
        return next(csv.reader(f))


def _steps(path: Path) -> list[int]:
    with path.open() as f:
        return [int(r["step"]) for r in csv.DictReader(f)]


def test_offline_run_has_the_csv_names_and_a_resume_continues_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # what is checked is the record, not the close timeout: on a loaded machine W&B's finish
    # can outlast the default 30 s, and the run file is then cut short
    monkeypatch.setattr(tracking, "CLOSE_TIMEOUT", 600.0)
    video = importlib.util.find_spec("imageio_ffmpeg") is not None  # rlstash[video]
    cfg = TrainConfig(track="wandb", wandb_project="proj", wandb_tags=("tiny", "cpu"),
                      env=ENV_ID, video=video, run_dir=str(tmp_path), name="r",
                      **TINY)  # fmt: skip
    train(cfg)
    run = tmp_path / "r"
    (first,) = offline_runs(run)
    run_id = json.loads((run / tracking.ID_FILE).read_text())["id"]
    assert first.run_id == run_id and first.project == "proj"
    assert sorted(first.tags) == ["cpu", "tiny"]
    assert set(_header(run / "progress.csv")) <= first.keys  # step, return_recent, loss, ...
    evals = {f"eval/{k}" for k in _header(run / "eval.csv") if k != "step"}
    assert evals <= first.keys and "eval/rss_tree_mb" in evals  # memory telemetry too
    assert [int(float(r["step"])) for r in first.history if "eval/return_mean" in r] == [128, 256]
    assert json.loads(first.config["algo"]) == "dqn" and "buffer_size" in first.config
    if video:  # each evaluation's video, at its step, copied into the W&B run
        shown = [r for r in first.history if "eval/video/_type" in r]
        assert [int(float(r["step"])) for r in shown] == [128, 256]
        files = first.path.parent / "files"
        assert all((files / json.loads(r["eval/video/path"])).is_file() for r in shown)

    train(resume=run)  # the checkpoint's settings: tracked again, into the same W&B run
    second = offline_runs(run)[-1]
    assert second.path != first.path and second.run_id == run_id


class _Hang:
    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def __call__(self, *args: object, **kwargs: object) -> None:
        self.calls += 1
        self.release.wait(60)


@pytest.mark.parametrize("fault", ["init raises", "log raises", "log hangs"])
def test_a_failing_backend_costs_one_warning_not_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    hang = _Hang()
    calls = []

    def boom(*args: object, **kwargs: object) -> None:
        calls.append(1)
        raise RuntimeError("backend down")

    if fault == "init raises":
        monkeypatch.setattr(wandb, "init", boom)
    elif fault == "log raises":
        monkeypatch.setattr(wandb.Run, "log", boom)
    else:
        monkeypatch.setattr(wandb.Run, "log", hang)
        monkeypatch.setattr(wandb.Run, "finish", hang)
    if fault == "log hangs":  # the others end well before the default 30 s (a loaded
        monkeypatch.setattr(tracking, "CLOSE_TIMEOUT", 1.0)  # machine: init alone may take 1 s)
    cfg = TrainConfig(track="wandb", run_dir=str(tmp_path), name="r", **TINY)
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            t0 = time.monotonic()
            result = train(cfg)
            took = time.monotonic() - t0
    finally:
        hang.release.set()
    run = tmp_path / "r"
    assert result.steps == 256 and _steps(run / "eval.csv") == [128, 256]  # CSVs complete
    assert _steps(run / "progress.csv") and (run / "checkpoint" / "COMPLETE").exists()
    said = [str(w.message) for w in seen if "W&B logging stopped" in str(w.message)]
    assert len(said) == 1, said
    assert "progress.csv and eval.csv stay complete" in said[0]
    if fault == "log hangs":
        assert hang.calls >= 1 and "did not finish within 1 s" in said[0]
        assert took < 120  # the loop never waited on the hung call
    else:
        assert "backend down" in said[0] and len(calls) == 1  # switched off after one failure
