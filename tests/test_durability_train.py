"""Nothing lost on a crash, for the training application: resume after SIGKILL on every
storage, logs without duplicated steps, a full disk during a checkpoint, and ``run.py``
leaving no trainer behind when it is stopped."""

from __future__ import annotations

import csv
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from rlstash.cli import main
from rlstash.train import checkpoint
from tests.procs import die_with_parent

ROOT = Path(__file__).resolve().parents[1]
TINY = {
    "net_arch": [16],
    "batch_size": 16,
    "learning_starts": 64,
    "train_freq": 32,
    "gradient_steps": 2,
    "buffer_size": 8192,
}
SETS = [arg for k, v in TINY.items() for arg in ("--set", f"{k}={v}")]


def _steps(path: Path) -> list[int]:
    with path.open() as f:
        return [int(float(r["step"])) for r in csv.DictReader(f)]


def _train_argv(run_dir: Path, steps: int, *extra: str) -> list[str]:
    return ["train", "--quiet", "--device", "cpu", "--steps", str(steps),
            "--checkpoint-every", "256", "--eval-every", "128", "--eval-episodes", "1",
            "--run-dir", str(run_dir.parent), "--name", run_dir.name, *SETS, *extra]  # fmt: skip


def _wait_for(proc: subprocess.Popen, done: Path, min_step: int, timeout: float = 120) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if done.exists() and done.read_text().strip() and int(done.read_text()) >= min_step:
            return int(done.read_text())
        if proc.poll() is not None:
            pytest.fail(f"training ended before a checkpoint (exit {proc.returncode})")
        time.sleep(0.02)
    pytest.fail(f"no checkpoint at step >= {min_step} within {timeout} s")


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


@pytest.mark.slow
def test_resume_after_sigkill_on_every_storage_without_duplicated_log_steps(tmp_path):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    steps, runs = 1536, {s: tmp_path / "runs" / s for s in ("ram", "disk", "tiered")}
    procs = {
        s: subprocess.Popen(
            [sys.executable, "-m", "rlstash", *_train_argv(d, steps, "--storage", s)],  # noqa: S603
            cwd=tmp_path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=die_with_parent,  # noqa: PLW1509 - no orphan if the test run is killed
        )  # fmt: skip
        for s, d in runs.items()
    }
    try:
        for s, proc in procs.items():
            _wait_for(proc, runs[s] / "checkpoint" / "COMPLETE", 512)
            proc.kill()
    finally:
        _stop(list(procs.values()))
    resumed = {}
    for s, run_dir in runs.items():
        assert procs[s].returncode == -signal.SIGKILL, f"{s}: finished before it was killed"
        at = checkpoint.load_state(checkpoint.latest(run_dir))["step"]
        with (run_dir / "eval.csv").open("a") as f:  # logged after the checkpoint, then killed
            f.write(f"{at + 1},0,1,1,1,1,1\n")
        with (run_dir / "progress.csv").open("a") as f:
            f.write(f"{at + 1}\n")
        resumed[s] = (at, subprocess.Popen([sys.executable, "-m", "rlstash", "train", "--resume", str(run_dir)],  # noqa: S603
                                           cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                           stderr=subprocess.PIPE, text=True,
                                           preexec_fn=die_with_parent))  # fmt: skip
    try:
        outs = {s: p.communicate(timeout=240) for s, (_, p) in resumed.items()}
    finally:
        _stop([p for _, p in resumed.values()])
    for s, run_dir in runs.items():
        at, proc = resumed[s]
        out, err = outs[s]
        assert proc.returncode == 0, f"{s}: {err}"  # tiered today: cannot rebuild its backing
        m = re.search(rf"resumed at step {at} with (\d+) stored slots", out)
        assert m and int(m.group(1)) >= at - 64, (s, out)
        assert checkpoint.load_state(run_dir / "checkpoint")["step"] == steps
        for name in ("eval.csv", "progress.csv"):
            got = _steps(run_dir / name)
            assert got == sorted(set(got)), f"{s} {name}: steps repeat or go back: {got}"
        assert _steps(run_dir / "eval.csv")[-1] == steps


def test_full_disk_during_a_checkpoint_keeps_the_old_one_and_says_so_in_one_line(
    small_fs, monkeypatch, capsys
):
    real_save = checkpoint.save
    saved = []

    def save_then_fill(run_dir, state, buffer=None):
        if saved:  # someone fills the disk after the first checkpoint, leaving 64 KiB
            free = os.statvfs(small_fs).f_bavail * os.statvfs(small_fs).f_frsize
            with open(small_fs / "hog", "wb") as f:
                f.write(b"\0" * max(0, free - (64 << 10)))
        saved.append(state["step"])
        return real_save(run_dir, state, buffer)

    monkeypatch.setattr(checkpoint, "save", save_then_fill)
    run_dir = small_fs / "runs" / "full"
    code = main(_train_argv(run_dir, 1024))
    err = capsys.readouterr().err.strip()
    assert code == 1, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "checkpoint at step 512 not written" in err and "No space left" in err
    assert f"the previous checkpoint {run_dir / 'checkpoint'} is intact" in err
    assert f"--resume {run_dir}" in err
    assert checkpoint.load_state(checkpoint.latest(run_dir))["step"] == 256
    assert not (run_dir / "checkpoint.tmp").exists()


# ----------------------------------------------------------------------------- run.py
@pytest.mark.slow
@pytest.mark.multiproc
def test_stopping_run_py_stops_its_trainer_and_relative_paths_are_the_callers(tmp_path):
    sigs = {"int": signal.SIGINT, "term": signal.SIGTERM, "kill": signal.SIGKILL}
    procs, family = {}, {}
    try:
        for name in sigs:
            cwd = tmp_path / name
            cwd.mkdir()
            procs[name] = subprocess.Popen(  # noqa: S603
                [sys.executable, str(ROOT / "run.py"), *_train_argv(Path("runs") / "r", 10**7),
                 "--workers", "1"],
                cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                preexec_fn=die_with_parent,
            )  # fmt: skip
        for name, proc in procs.items():  # "runs" is relative: it lands in the caller's cwd
            _wait_for(proc, tmp_path / name / "runs" / "r" / "checkpoint" / "COMPLETE", 256)
            family[name] = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(True)]
        for name, proc in procs.items():
            proc.send_signal(sigs[name])
        for name, proc in procs.items():
            proc.wait(timeout=60)
            gone, alive = psutil.wait_procs(family[name], timeout=30)
            assert not alive, f"SIGINT/TERM/KILL ({name}) left {[p.pid for p in alive]} running"
    finally:
        for members in family.values():
            for p in members:
                try:
                    p.kill()
                except psutil.Error:
                    pass
        _stop(list(procs.values()))
