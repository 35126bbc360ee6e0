"""Everything written is verified when read (issue 22, class 2).

Each checkpoint file (``state.pt``, ``buffer.pt``, ``MANIFEST.json``) and each file of the
disk buffer (``meta.json``, ``commit.rec``, a data file, the stream's bookkeeping) is cut
short, has 64 bytes flipped, or is deleted: ``--resume``, ``rlstash eval`` and ``rlstash
verify`` name it in one line (no traceback), and the fix they give works. Checkpoints of
another algorithm, network or env are refused by their recorded settings before any tensor is
read; a full disk names the file it could not write.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlstash import manifest
from rlstash.cli import main
from rlstash.replay import ReplayBuffer
from rlstash.spec import Spec
from rlstash.storage import TensorStorage
from rlstash.train import checkpoint
from rlstash.train.loop import TrainConfig, train

TINY = {
    "batch_size": 16,
    "learning_starts": 64,
    "train_freq": 32,
    "gradient_steps": 1,
    "buffer_size": 2048,
    "agent": {"net_arch": [16]},
}
SETS = [
    a for k, v in {**TINY, "net_arch": 16}.items() if k != "agent" for a in ("--set", f"{k}={v}")
]


def _cfg(run_dir: Path, name: str, **change: object) -> TrainConfig:
    settings = {"steps": 256, "checkpoint_every": 128, "eval_every": 256, "eval_episodes": 1,
                "quiet": True, "device": "cpu", "run_dir": str(run_dir), "name": name, **TINY}  # fmt: skip
    return TrainConfig(**{**settings, **change})


@pytest.fixture(scope="module")
def sac_run(tmp_path_factory) -> Path:
    """A finished discrete-SAC run on CartPole with a disk buffer: checkpoint/ and
    checkpoint.old/ (both at step 256), buffer/."""
    runs = tmp_path_factory.mktemp("runs")
    return train(_cfg(runs, "sac", algo="sac", storage="disk")).run_dir


@pytest.fixture
def run(sac_run, tmp_path) -> Path:
    """A fresh copy of the run (a copied run is a run of its own)."""
    return Path(shutil.copytree(sac_run, tmp_path / "run"))


def _damage(file: Path, how: str) -> None:
    if how == "delete":
        file.unlink()
    elif how == "truncate":
        os.truncate(file, file.stat().st_size // 2)
    else:  # 64 bytes flipped in the middle
        data = bytearray(file.read_bytes())
        at = max(0, len(data) // 2 - 32)
        data[at : at + 64] = bytes(b ^ 0xFF for b in data[at : at + 64])
        file.write_bytes(bytes(data))


def _one_line(capsys, code: int, expected: int, *needles: str) -> str:
    out, err = capsys.readouterr()
    assert code == expected, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


CKPT_FILES = ["state.pt", "buffer.pt", "MANIFEST.json"]
CASES = [(f"checkpoint/{f}", how) for f in CKPT_FILES for how in ("truncate", "flip", "delete")]
CASES += [("checkpoint/COMPLETE", "delete")]  # an incomplete newest one: not skipped silently
CASES += [("buffer/meta.json", how) for how in ("truncate", "flip", "delete")]
CASES += [("buffer/commit.rec", "truncate"), ("buffer/commit.rec", "delete")]
CASES += [("buffer/obs.bin", "truncate"), ("buffer/obs.bin", "delete")]
CASES += [("buffer/stream.npz", how) for how in ("truncate", "flip", "delete")]
CASES += [
    (f"buffer/{f}", how) for f in ("lanes.bin", "lanes.rec") for how in ("truncate", "delete")
]
CASES += [("buffer/lanes.bin", "flip")]  # flags with bits no writer sets: refused


@pytest.mark.parametrize(("name", "how"), CASES, ids=[f"{n}-{h}" for n, h in CASES])
def test_a_damaged_file_is_named_in_one_line_by_resume_eval_and_verify(run, capsys, name, how):
    file = run / name
    _damage(file, how)
    in_checkpoint = name.startswith("checkpoint/")
    fix = "checkpoint.old" if in_checkpoint else "restore"
    _one_line(capsys, main(["train", "--resume", str(run)]), 2, file.name, "is damaged", fix)
    if name in ("checkpoint/state.pt", "checkpoint/MANIFEST.json"):  # what eval reads
        _one_line(capsys, main(["eval", str(run), "--episodes", "1"]), 2, file.name, fix)
    assert main(["verify", str(run)]) == 1
    out = capsys.readouterr().out.splitlines()
    failed = [line for line in out if line.startswith("FAIL")]
    assert failed and file.name in failed[0], out
    assert out[-1].startswith(f"{run}: ") and "checks failed" in out[-1]


@pytest.mark.parametrize("how", ["truncate", "flip", "delete"])
def test_verify_refuses_whatever_resume_refuses_in_the_run(sac_run, tmp_path, capsys, how):
    """verify checks what resuming reads: for every file of the run damaged one way, resume
    refusing it (exit 2) and verify failing (exit 1) go together. (64 flipped bytes in a data
    file or in the middle of a commit-record file load: rows are not checksummed, and a torn
    record is skipped by design.)"""
    files = sorted(p.relative_to(sac_run) for p in sac_run.rglob("*") if p.is_file())
    files = [f for f in files if f.parts[0] in ("checkpoint", "buffer")]
    assert len(files) >= 10, files
    disagree = []
    for rel in files:
        run = Path(shutil.copytree(sac_run, tmp_path / f"{rel.as_posix().replace('/', '-')}"))
        _damage(run / rel, how)
        resumed = main(["train", "--resume", str(run)])
        checked = main(["verify", str(run)])
        capsys.readouterr()
        if (resumed == 2) != (checked == 1) or resumed not in (0, 2):
            disagree.append((str(rel), resumed, checked))
        shutil.rmtree(run)
    assert not disagree, disagree


def test_the_fix_of_a_damaged_checkpoint_works_and_verify_passes_a_clean_run(run, capsys):
    assert main(["verify", str(run)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert all(line.startswith("ok") for line in out[:-1]) and "all" in out[-1], out
    assert any("buffer rows" in line and "all finite" in line for line in out)
    _damage(run / "checkpoint" / "state.pt", "flip")
    err = _one_line(capsys, main(["train", "--resume", str(run)]), 2, "SHA-256")
    move = err.split("(mv ")[1].split(")")[0].split()
    os.rename(move[0], move[1])  # the fix, as the message says it
    assert main(["train", "--resume", str(run)]) == 0
    assert "resumed at step 256" in capsys.readouterr().out
    assert checkpoint.load_state(run / "checkpoint")["step"] == 256


# Unpickling damaged bytes raises almost anything: one mechanism (manifest.load_torch) turns
# every such exception into a DamagedFile, whatever its type, whichever reader meets it.
UNPICKLE_ERRORS = [
    MemoryError(),  # a flipped length: no message at all
    OverflowError("BINBYTES exceeds system's maximum size"),
    ValueError("unregistered extension code 142"),
    ImportError("No module named 'rlst\\xd7sh'"),  # a flipped class name
    AttributeError("'dict' object has no attribute 'append'"),
    UnicodeDecodeError("utf-8", b"\x8d", 0, 1, "invalid start byte"),
    TypeError("'collections.OrderedDict' object is not callable"),
    RuntimeError("PytorchStreamReader failed reading file data.pkl"),
    LookupError("unknown encoding"),
]


@pytest.mark.parametrize("error", UNPICKLE_ERRORS, ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("name", ["state.pt", "buffer.pt"])
def test_whatever_unpickling_raises_is_the_file_named_by_resume_and_verify(
    run, capsys, monkeypatch, name, error
):
    real = torch.load

    def load(f, *args, **kwargs):
        if Path(f).name == name:
            raise error
        return real(f, *args, **kwargs)

    monkeypatch.setattr(torch, "load", load)
    err = _one_line(capsys, main(["train", "--resume", str(run)]), 2, name, "is damaged")
    assert f"it does not load ({type(error).__name__}" in err and "checkpoint.old" in err
    assert main(["verify", str(run)]) == 1
    failed = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("FAIL")]
    assert failed and all(name in ln and type(error).__name__ in ln for ln in failed), failed


def test_every_flip_of_a_pickled_checkpoint_file_loads_or_is_a_damaged_file(run):
    """64 bytes flipped at every 5th offset of buffer.pt and state.pt (their SHA-256 checks
    skipped, so the bytes reach the unpickler): each loads or is a DamagedFile naming the file."""
    kinds: set[str] = set()
    for name in ("buffer.pt", "state.pt"):
        file = run / "checkpoint" / name
        data = file.read_bytes()
        for at in range(0, len(data) - 64, 5):
            flipped = bytearray(data)
            flipped[at : at + 64] = bytes(b ^ 0xFF for b in flipped[at : at + 64])
            file.write_bytes(bytes(flipped))
            try:
                manifest.load_torch(file)
            except manifest.DamagedFile as exc:
                assert exc.file == file and "it does not load (" in str(exc)
                kinds.add(exc.what.split("(")[1].split(":")[0].rstrip(")"))
    assert {"UnpicklingError", "MemoryError", "OverflowError", "ValueError"} <= kinds, kinds


def test_a_state_that_does_not_fit_is_one_line_not_a_traceback(run, capsys):
    """A state.pt whose manifest matches (rewritten) but whose contents do not load: another
    network shape (load_state_dict's RuntimeError) and a missing key (KeyError)."""
    ckpt = run / "checkpoint"
    state = torch.load(ckpt / "state.pt", weights_only=False)
    for change, says in ((_widen, "RuntimeError"), (_drop_limiter, "KeyError: 'limiter'")):
        bad = change(dict(state))
        entry = manifest.write_hashed(ckpt / "state.pt", lambda f, s=bad: torch.save(s, f))
        manifest.record(ckpt, {"state.pt": entry})
        err = _one_line(capsys, main(["train", "--resume", str(run)]), 2, "state.pt is damaged")
        assert f"it does not load ({says}" in err and "checkpoint.old" in err


def _widen(state: dict) -> dict:
    agent = dict(state["agent"])
    key, t = next((k, v) for k, v in _tensors(agent) if v.dim() == 2)
    _put(agent, key, torch.zeros(t.shape[0] + 1, t.shape[1]))
    return {**state, "agent": agent}


def _drop_limiter(state: dict) -> dict:
    return {k: v for k, v in state.items() if k != "limiter"}


def _tensors(d: dict, prefix: tuple = ()):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _tensors(v, (*prefix, k))
        elif isinstance(v, torch.Tensor):
            yield (*prefix, k), v


def _put(d: dict, key: tuple, value: torch.Tensor) -> None:
    for k in key[:-1]:
        d[k] = d = dict(d[k])
    d[key[-1]] = value


# ----------------------------------------------------------------------------- settings
@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--algo", "dqn"], "--algo: the run in {run} was trained with algo = 'sac', got 'dqn'"),
        (["--net-arch", "32"], "--net-arch: the run in {run} was trained with net_arch = [16], got [32]"),
        (["--env", "Acrobot-v1"], "--env: the run in {run} was trained with env = 'CartPole-v1', got 'Acrobot-v1'"),
    ],
)  # fmt: skip
def test_resuming_with_other_settings_names_the_setting_and_both_values(run, capsys, flags, says):
    err = _one_line(capsys, main(["train", "--resume", str(run), *flags]), 2, says.format(run=run))
    assert f"drop {flags[0]}" in err


def test_a_config_of_another_algorithm_is_refused_before_any_tensor_is_read(run, monkeypatch):
    def no_tensors(*args, **kwargs):
        raise AssertionError("a tensor was loaded before the settings were compared")

    monkeypatch.setattr(torch, "load", no_tensors)
    with pytest.raises(ValueError, match=r"algo is 'sac' in it, the config asks for 'dqn'"):
        train(_cfg(run.parent, "run", algo="dqn", storage="disk"), resume=run)
    monkeypatch.undo()
    with pytest.raises(
        ValueError, match=r"steps is 256 in it, the config asks for 512; a run resumes"
    ):
        train(_cfg(run.parent, "run", algo="sac", storage="disk", steps=512), resume=run)
    same = train(_cfg(run.parent, "run", algo="sac", storage="disk"), resume=run)  # its own: fine
    assert same.steps == 256


class _Shaped(gym.Env):
    """CartPole-like env whose observation size is a class attribute (changed by the test)."""

    size = 4
    metadata: dict = {"render_modes": []}

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(-1, 1, (self.size,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(self.size, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(self.size, np.float32), 1.0, False, self.t >= 20, {}


def test_an_env_whose_spaces_changed_is_refused_before_any_tensor_is_read(
    tmp_path, monkeypatch, capsys
):
    gym.register("RlstashShaped-v0", entry_point=_Shaped)
    try:
        run_dir = train(_cfg(tmp_path, "shaped", env="RlstashShaped-v0")).run_dir
        monkeypatch.setattr(_Shaped, "size", 6)
        monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("a tensor was loaded"))
        says = "obs_space is 'Box(4,) float32' in it, the env RlstashShaped-v0 now has 'Box(6,) float32'"
        _one_line(capsys, main(["train", "--resume", str(run_dir)]), 2, says, "start a new run")
        _one_line(capsys, main(["eval", str(run_dir), "--episodes", "1"]), 2, says)
    finally:
        gym.registry.pop("RlstashShaped-v0", None)


# ----------------------------------------------------------------------------- the library
def test_replay_buffer_load_checks_the_file_against_its_manifest(tmp_path):
    spec = Spec({"obs": ((8,), torch.float32), "action": ((), torch.int64)})
    rb = ReplayBuffer(TensorStorage(spec, 256), seed=0)
    rb.extend({"obs": torch.randn(200, 8), "action": torch.arange(200)})
    path = rb.save(tmp_path / "rb.pt")
    assert manifest.read(tmp_path)["files"]["rb.pt"] == manifest.digest(path)
    good = path.read_bytes()
    for how, says in (("flip", "SHA-256"), ("truncate", "bytes, MANIFEST.json says")):
        _damage(path, how)
        with pytest.raises(ValueError, match=rf"rb.pt is damaged: .*{says}"):
            ReplayBuffer.load(path)
        path.write_bytes(good)
    (tmp_path / "MANIFEST.json").unlink()
    with pytest.raises(ValueError, match=r"rb.pt is damaged: no MANIFEST.json beside it lists "
                       r"it .*verify=False"):  # fmt: skip
        ReplayBuffer.load(path)
    with ReplayBuffer.load(path, verify=False) as back:  # unchecked, when asked for
        assert torch.equal(
            back.storage.read(np.arange(200))["obs"], rb.storage.read(np.arange(200))["obs"]
        )
    _damage(path, "truncate")
    with pytest.raises(ValueError, match=r"rb.pt is damaged: it does not load"):
        ReplayBuffer.load(path, verify=False)  # still one line, never a traceback


def test_a_full_disk_names_the_file_it_could_not_write(small_fs, monkeypatch, capsys):
    real_save = checkpoint.save

    def save_then_fill(run_dir, state, buffer=None):
        if state["step"] > 128:  # someone fills the disk after the first checkpoint
            st = os.statvfs(small_fs)
            with open(small_fs / "hog", "wb") as f:
                f.write(b"\0" * max(0, st.f_bavail * st.f_frsize - (16 << 10)))
        return real_save(run_dir, state, buffer)

    monkeypatch.setattr(checkpoint, "save", save_then_fill)
    run_dir = small_fs / "runs" / "full"
    code = main(["train", "--quiet", "--device", "cpu", "--steps", "256", "--checkpoint-every", "128",
                 "--eval-every", "256", "--eval-episodes", "1", "--run-dir", str(run_dir.parent),
                 "--name", "full", *SETS])  # fmt: skip
    err = _one_line(capsys, code, 1, "checkpoint at step 256 not written", "the disk is full")

    assert "enforce fail" not in err and "PytorchStreamWriter" not in err
    assert f"writing {run_dir / 'checkpoint.tmp'}/" in err  # names the file: state.pt, buffer.pt...
    assert f"the previous checkpoint {run_dir / 'checkpoint'} is intact" in err


def test_a_checkpoint_written_before_manifests_still_resumes(run, capsys):
    """No MANIFEST.json, ``state.pt`` without ``format``, a format-2 ``buffer.pt`` with an
    absolute path: what an older rlstash wrote loads unchecked, as it did."""
    for ckpt in (run / "checkpoint", run / "checkpoint.old"):
        state = torch.load(ckpt / "state.pt", weights_only=False)
        del state["format"], state["settings"]
        torch.save(state, ckpt / "state.pt")
        buf = torch.load(ckpt / "buffer.pt", weights_only=False)
        buf["format"] = 2
        buf["storage"]["backing"]["path"] = str(run / "buffer")
        del buf["storage"]["backing"]["saved_path"]
        torch.save(buf, ckpt / "buffer.pt")
        (ckpt / "MANIFEST.json").unlink()
    assert main(["train", "--resume", str(run)]) == 0, capsys.readouterr().err
    assert "resumed at step 256" in capsys.readouterr().out
    assert (run / "checkpoint" / "MANIFEST.json").exists()  # the next checkpoint has one


def test_verify_scans_every_written_row_for_non_finite_values_in_chunks(run, monkeypatch, capsys):
    from rlstash.cli import verify as cli_verify

    monkeypatch.setattr(cli_verify, "_CHUNK_BYTES", 100)  # a few rows per chunk: many chunks
    obs = np.memmap(run / "buffer" / "obs.bin", np.float32, "r+").reshape(-1, 4)
    obs[5, 2], obs[77, 0] = np.nan, np.inf  # written slots (the data files are not hashed)
    obs.flush()
    del obs
    assert main(["verify", str(run)]) == 1
    out = capsys.readouterr().out
    assert "field 'obs': 2 of " in out and "hold NaN or inf (slots [5, 77])" in out, out
    assert "field 'reward'" not in out


def test_verify_names_bool_bytes_that_no_writer_stores(tmp_path, monkeypatch):
    """A bool field on disk holds 0 or 1 per byte; a damaged byte (0xFE: a flip) loads as a
    bool all the same, so verify reads the bytes and names the slots."""
    from rlstash.cli import verify as cli_verify
    from rlstash.storage import MemmapStorage

    monkeypatch.setattr(cli_verify, "_CHUNK_BYTES", 64)  # many chunks
    from rlstash.spec import Field

    spec = Spec({"obs": Field((2,), torch.float32), "done": Field((), torch.bool)})
    rb = ReplayBuffer(MemmapStorage(spec, 64, tmp_path / "buf"), seed=0)
    rb.extend({"obs": torch.zeros(40, 2), "done": torch.arange(40) % 7 == 6})
    rb.save(tmp_path / "buffer.pt")
    rb.close()
    clean = list(cli_verify._check_buffer(tmp_path / "buffer.pt", cli_verify._Buffers()))
    assert all(f.ok for f in clean) and "bool fields ['done'] all 0 or 1" in clean[-1].text
    done = np.memmap(tmp_path / "buf" / "done.bin", np.uint8, "r+")
    done[[3, 30]] ^= 0xFF  # a False and a True byte flipped
    done.flush()
    del done
    found = list(cli_verify._check_buffer(tmp_path / "buffer.pt", cli_verify._Buffers()))
    failed = [f for f in found if f.ok is False]
    assert (
        len(failed) == 1
        and "field 'done': 2 of 40 written slots hold bytes other than 0 and 1 (slots [3, 30])"
        in failed[0].text
    ), failed
    assert "restore" in failed[0].text


def test_torchs_internal_write_error_becomes_the_file_and_the_disk_space(tmp_path, monkeypatch):
    """torch can report a failed write as "[enforce fail at inline_container.cc...]" with no
    OSError behind it: the message then says what the free space says, never torch's text."""
    from rlstash import memory

    def failing_save(obj, f):
        f.write(b"PK")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")

    monkeypatch.setattr(torch, "save", failing_save)
    monkeypatch.setattr(memory, "disk_free", lambda path: 4096)
    with pytest.raises(checkpoint.CheckpointError) as info:
        checkpoint.save(tmp_path, {"step": 7, "config": {}, "agent": {}})
    msg = str(info.value)
    assert f"writing {tmp_path / 'checkpoint.tmp' / 'state.pt'} failed (the disk is full" in msg
    assert "enforce fail" not in msg and "no earlier checkpoint" in msg
    assert not (tmp_path / "checkpoint.tmp").exists()
