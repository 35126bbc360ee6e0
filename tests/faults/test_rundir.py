"""Run directories are self-contained and exclusive (issue 22, class 1).

* A copied or moved run directory resumes from its own files: every stored row is read back
  after the resume, equal and all there, and the original is neither written nor recreated.
* A run directory is held by one trainer: a second one with the same ``--name`` and a
  ``--resume`` of a live run are refused in one line naming the PID; a SIGKILLed trainer's
  run resumes at once (real subprocesses, stopped even when the test fails).
"""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from rlstash.cli import main
from rlstash.manifest import DamagedFile
from rlstash.replay import ReplayBuffer
from rlstash.spec import Spec
from rlstash.storage import MemmapStorage
from rlstash.train import drive
from rlstash.train.loop import TrainConfig, train
from tests.procs import die_with_parent

TINY = {
    "batch_size": 16,
    "learning_starts": 64,
    "train_freq": 32,
    "gradient_steps": 2,
    "buffer_size": 8192,  # more than any run here: nothing is overwritten
    "agent": {"net_arch": [16]},
}
SETS = [
    a for k, v in {**TINY, "net_arch": 16}.items() if k != "agent" for a in ("--set", f"{k}={v}")
]


def _stored(run_dir: Path) -> tuple[Path, np.ndarray, dict[str, torch.Tensor]]:
    """(the buffer's directory, the written slots, their rows) as the run's checkpoint
    reopens them: every stored row, read back."""
    rb = ReplayBuffer.load(run_dir / "checkpoint" / "buffer.pt")
    try:
        backing = rb.storage.backing
        path = getattr(backing, "path", None) or backing.cold.path
        slots = np.flatnonzero(rb.storage.written)
        rows = {k: v.clone() for k, v in backing.read(slots).items()}
        return Path(path), slots, rows
    finally:
        rb.close()


def _same_rows(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)


@pytest.mark.parametrize("storage", ["disk", "tiered"])
def test_a_copied_and_a_moved_run_resume_from_their_own_buffer(tmp_path, monkeypatch, storage):
    cfg = TrainConfig(steps=512, checkpoint_every=256, eval_every=256, eval_episodes=1,
                      quiet=True, device="cpu", storage=storage, run_dir=str(tmp_path / "runs"),
                      name="a", **TINY)  # fmt: skip
    stop = monkeypatch.setattr(drive, "_evaluate", _interrupt)  # noqa: F841
    with pytest.raises(KeyboardInterrupt):  # a checkpoint is written on Ctrl-C, then it stops
        train(cfg)
    monkeypatch.undo()
    a, b, c = (tmp_path / "runs" / n for n in "abc")
    where, slots, rows = _stored(a)
    assert where == a / "buffer" and slots.size >= 256

    shutil.copytree(a, b)  # cp -r runs/a runs/b; rlstash train --resume runs/b
    train(resume=b)
    where_a, slots_a, rows_a = _stored(a)  # the original is untouched: rows and count
    assert where_a == a / "buffer" and np.array_equal(slots_a, slots)
    _same_rows(rows_a, rows)
    where_b, slots_b, rows_b = _stored(b)  # the copy resumed into its own buffer
    assert where_b == b / "buffer" and slots_b.size > slots.size
    _same_rows({k: v[np.isin(slots_b, slots)] for k, v in rows_b.items()}, rows)

    a.rename(c)  # mv runs/a runs/c; rlstash train --resume runs/c
    train(resume=c)
    assert not a.exists(), "the resume recreated the old path"
    where_c, slots_c, rows_c = _stored(c)
    assert where_c == c / "buffer" and slots_c.size > slots.size  # every row kept, then more
    _same_rows({k: v[np.isin(slots_c, slots)] for k, v in rows_c.items()}, rows)


def _interrupt(run, log):
    raise KeyboardInterrupt


def test_a_saved_buffer_and_its_disk_directory_move_together(tmp_path):
    spec = Spec({"obs": ((3,), torch.float32), "action": ((), torch.int64)})
    here = tmp_path / "here"
    rb = ReplayBuffer(MemmapStorage(spec, 64, here / "data"), seed=0)
    rb.extend({"obs": torch.arange(60.0).reshape(20, 3), "action": torch.arange(20)})
    rb.save(here / "rb.pt")
    rb.close()
    state = torch.load(here / "rb.pt", weights_only=False)
    assert state["storage"]["path"] == "data"  # relative to the file's directory
    there = tmp_path / "there"
    here.rename(there)
    with ReplayBuffer.load(there / "rb.pt") as back:
        assert back.storage.path == there / "data" and len(back) == 20
        assert torch.equal(
            back.storage.read(np.arange(20))["obs"], torch.arange(60.0).reshape(20, 3)
        )
    shutil.copy(there / "rb.pt", tmp_path / "rb.pt")  # the file alone: its data are not there
    shutil.copy(there / "MANIFEST.json", tmp_path / "MANIFEST.json")
    with pytest.raises(DamagedFile, match=r"/data is damaged: it does not exist \(rb.pt refers to "
                       r"it, the MemmapStorage directory, written at .*here/data\); fix: keep"):  # fmt: skip
        ReplayBuffer.load(tmp_path / "rb.pt")
    assert not (tmp_path / "data").exists()  # refused, not created empty


# ----------------------------------------------------------------------------- one trainer
def _lines(proc: subprocess.Popen) -> queue.Queue:
    out: queue.Queue = queue.Queue()

    def pump() -> None:
        for line in proc.stdout:
            out.put(line)
        out.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return out


def _wait_line(lines: queue.Queue, text: str, timeout: float = 180) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line is None:
            pytest.fail(f"the trainer ended before printing {text!r}")
        if text in line:
            return line
    pytest.fail(f"no {text!r} within {timeout} s")


def _names(run: Path) -> set[str]:
    """What is in a run directory, less what its live trainer makes and removes meanwhile."""
    return {p.name for p in run.iterdir()} - {"checkpoint.tmp", "checkpoint.old"}


@pytest.mark.multiproc
def test_one_trainer_per_run_directory_and_a_killed_one_resumes_at_once(tmp_path, capsys):
    """The holder is a real process; the refused ones run here (each start of an interpreter
    that imports torch takes seconds on a loaded machine)."""
    run = tmp_path / "runs" / "r"
    argv = ["train", "--quiet", "--device", "cpu", "--steps", str(10**7), "--checkpoint-every",
            "128", "--eval-every", "10000000", "--run-dir", str(run.parent), "--name", "r", *SETS]  # fmt: skip
    procs: list[subprocess.Popen] = []

    def start(*args: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-m", "rlstash", *args], cwd=tmp_path,  # noqa: S603
                                env=dict(os.environ, CUDA_VISIBLE_DEVICES=""), text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                preexec_fn=die_with_parent)  # fmt: skip
        procs.append(proc)
        return proc

    try:
        first = start(*argv)
        deadline = time.monotonic() + 180
        while not (run / "checkpoint" / "COMPLETE").exists():
            assert first.poll() is None and time.monotonic() < deadline, "no first checkpoint"
            time.sleep(0.05)
        capsys.readouterr()
        for second in (argv, ["train", "--resume", str(run)]):  # same --name; --resume, live
            before = _names(run)
            assert main(second) == 2
            out, err = capsys.readouterr()
            assert out == "" and len(err.splitlines()) == 1 and "Traceback" not in err, err
            assert f"{run} is in use by PID {first.pid}" in err and f"kill {first.pid}" in err
            assert _names(run) == before  # nothing new written, the holder's PID kept
            assert (run / "trainer.lock").read_text().split()[0] == str(first.pid)
        first.kill()  # SIGKILL: the kernel releases the lock with the process
        first.wait(timeout=30)
        again = start("train", "--resume", str(run))
        line = _wait_line(_lines(again), "resumed at step")
        assert int(line.split()[3]) >= 128 and again.poll() is None  # it holds the run now
        assert main(["verify", str(run)]) == 2
        assert f"in use by PID {again.pid}" in capsys.readouterr().err
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
