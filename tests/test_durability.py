"""Nothing lost on a crash (invariant I7): disk storage commits, reserved metadata, damaged
metadata refused, and the one atomic-write helper."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from rlstash.atomic import write_atomic
from rlstash.replay import ReplayBuffer
from rlstash.spec import Field, Spec
from rlstash.storage import MemmapStorage
from rlstash.storage.disk_layout import COMMIT, Commit, CommitLog, create_commit_file
from tests.procs import kill_when_ready_at_random_moments

ROOT = Path(__file__).resolve().parents[1]
WIDTH = 256  # floats per row: a 700-row extend copies ~700 KB, so kills land inside writes
SPEC = Spec({"n": Field((), torch.int64), "payload": Field((WIDTH,), torch.float32)})


def _payload(n: np.ndarray) -> np.ndarray:
    """Row content derived from the row's global number: a torn row cannot match it."""
    return (n[:, None] * 7 + np.arange(WIDTH)[None, :]).astype(np.float32) % 1000.0


def _check_intact(store: MemmapStorage) -> np.ndarray:
    """Every counted, valid row holds the row its position says; returns their numbers."""
    size = store.size
    rows = np.arange(size)
    if store.valid is not None:
        rows = rows[store.valid[:size]]
    got = store.read(rows)
    n = got["n"].numpy()
    assert (n % store.capacity == rows).all(), "a counted row holds another position's number"
    np.testing.assert_array_equal(got["payload"].numpy(), _payload(n))
    return n


WRITER = textwrap.dedent(
    """
    import mmap, os, sys
    import numpy as np, torch
    from rlstash.replay import ReplayBuffer
    from rlstash.spec import Field, Spec
    from rlstash.storage import MemmapStorage
    from tests.test_durability import SPEC, _payload
    path, seed, cap = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rb = ReplayBuffer(MemmapStorage(SPEC, cap, path))
    fd = os.open(path + ".done", os.O_RDWR | os.O_CREAT, 0o644)
    os.ftruncate(fd, 8)
    done = mmap.mmap(fd, 8)  # rows of completed extends, in the page cache (survives a kill)
    rng = np.random.default_rng(seed)
    total = 0
    print("ready", flush=True)
    while True:
        k = int(rng.integers(1, 700))
        n = np.arange(total, total + k)
        rb.extend({"n": torch.from_numpy(n), "payload": torch.from_numpy(_payload(n))})
        total += k
        done[:8] = total.to_bytes(8, "little")
    """
)


@pytest.mark.slow
def test_sigkill_at_random_moments_keeps_every_completed_extend(tmp_path):
    cap, trials = 5_000, 5
    paths = [tmp_path / f"buf{t}" for t in range(trials)]
    procs = []
    try:
        for t, path in enumerate(paths):  # started together: one interpreter start-up to wait
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", WRITER, str(path), str(t), str(cap)],
                    cwd=ROOT,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        kill_when_ready_at_random_moments(procs, 0.3, 1.5)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=30)
            proc.stdout.close()
    for path in paths:
        done = int.from_bytes(Path(f"{path}.done").read_bytes()[:8], "little")
        assert done > cap, "the writer should have wrapped around the ring at least once"
        with MemmapStorage.open(path) as store:
            total = store.extra["total"]
            assert done <= total < done + 700  # the last completed extend, or the one after
            assert (store.cursor, store.size) == (total % cap, min(total, cap))
            n = _check_intact(store)
            torn = 0 if store.valid is None else int((~store.valid).sum())
            assert torn < 700 and len(n) == cap - torn
            assert n.min() >= total - cap and n.max() == total - 1


KILL_MID_WRITE = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np, torch
    from rlstash.replay import ReplayBuffer
    from rlstash.storage import MemmapStorage, ram
    from tests.test_durability import SPEC, _payload
    rb = ReplayBuffer(MemmapStorage(SPEC, 100, sys.argv[1]))
    def batch(lo, hi):
        n = np.arange(lo, hi)
        return {"n": torch.from_numpy(n), "payload": torch.from_numpy(_payload(n))}
    rb.extend(batch(0, 130))  # full, cursor 30
    def torn_put(self, index, srcs):  # one field lands, part of the other, then death
        (a0, _, _), (a1, _, _) = self._put_arrays
        a0[index] = srcs[0].numpy()
        a1[index][:3] = 0.5
        os.kill(os.getpid(), signal.SIGKILL)
    ram.ArrayStorage.put = torn_put
    rb.extend(batch(130, 140))  # overwrites counted rows 30..39
    """
)


def test_a_kill_while_overwriting_counted_rows_leaves_them_invalid(tmp_path):
    path = tmp_path / "buf"
    res = subprocess.run(
        [sys.executable, "-c", KILL_MID_WRITE, str(path)],
        cwd=ROOT,
        capture_output=True,
        timeout=120,
    )
    assert res.returncode == -signal.SIGKILL, res.stderr.decode()
    store = MemmapStorage.open(path)
    assert (store.cursor, store.size, store.extra) == (30, 100, {"total": 130})
    assert store.valid is not None and np.flatnonzero(~store.valid).tolist() == list(range(30, 40))
    _check_intact(store)
    rb = ReplayBuffer(store, seed=0)
    for _ in range(20):  # the torn rows are never sampled
        b = rb.sample(64)
        assert not ((b["index"] >= 30) & (b["index"] < 40)).any()
        np.testing.assert_array_equal(b["payload"].numpy(), _payload(b["n"].numpy()))
    n = np.arange(130, 135)
    rb.extend({"n": torch.from_numpy(n), "payload": torch.from_numpy(_payload(n))})
    assert np.flatnonzero(~store.valid).tolist() == list(range(35, 40))  # rows 30..34 rewritten
    n = np.arange(135, 140)
    rb.extend({"n": torch.from_numpy(n), "payload": torch.from_numpy(_payload(n))})
    assert store.valid is None
    rb.close()
    with MemmapStorage.open(path) as again:
        assert again.valid is None and again.size == 100
        _check_intact(again)


def test_a_power_loss_falls_back_to_the_last_flush(tmp_path, monkeypatch):
    import rlstash.storage.disk_layout as layout

    create_commit_file(tmp_path / COMMIT)
    log = CommitLog(tmp_path / COMMIT)
    log.write(Commit(10, 10), b"{}", synced=True)  # flush/close: after the data were msynced
    log.write(Commit(20, 20), b"{}")  # live commits since
    log.write(Commit(30, 30), b"{}")
    assert log.read().size == 30  # same boot: the page cache survived, the newest counts
    monkeypatch.setattr(layout, "BOOT_ID", b"another boot id!")
    assert log.read().size == 10  # after a reboot only the synced record is trusted
    log.close()


def test_a_torn_record_falls_back_to_the_previous_one(tmp_path):
    create_commit_file(tmp_path / COMMIT)
    log = CommitLog(tmp_path / COMMIT)
    log.write(Commit(4, 4), b"{}")  # slot 0
    log.write(Commit(5, 5), b'{"total":5}')  # slot 1
    assert (log.read().size, log.read().extra) == (5, {"total": 5})
    log._map[2 * 1024 - 8 : 2 * 1024] = bytes(8)  # killed before the record's last store
    assert (log.read().size, log.read().extra) == (4, {})
    log.close()


# ----------------------------------------------------------------------------- full disk
def _fill(directory: Path) -> None:
    """Someone else fills the filesystem to the last byte."""
    with open(directory / "hog", "wb", buffering=0) as f:
        for size in (1 << 16, 1):  # big chunks, then the last bytes
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError:
                pass
    assert os.statvfs(directory).f_bavail == 0


def test_a_disk_filled_after_creation_cannot_fail_commit_flush_or_close(small_fs):
    path = small_fs / "buf"
    rb = ReplayBuffer(MemmapStorage(SPEC, 2_000, path))  # ~2 MB of 8 MiB
    n = np.arange(1_500)
    rb.extend({"n": torch.from_numpy(n), "payload": torch.from_numpy(_payload(n))})
    _fill(small_fs)
    n = np.arange(1_500, 1_700)
    rb.extend({"n": torch.from_numpy(n), "payload": torch.from_numpy(_payload(n))})
    rb.storage.flush()
    rb.close()  # today: OSError: [Errno 28] from rewriting meta.json
    with MemmapStorage.open(path) as store:
        assert (store.size, store.extra) == (1_700, {"total": 1_700})
        _check_intact(store)


# ----------------------------------------------------------------------------- damaged metadata
def _v1_meta(path: Path, **change: object) -> None:
    """Rewrite ``meta.json`` in the version-1 layout (position inside), with ``change``."""
    meta = json.loads((path / "meta.json").read_text())
    meta.update(version=1, cursor=3, size=3, extra={"total": 3})
    for k, v in change.items():
        if v is KeyError:
            meta.pop(k)
        else:
            meta[k] = v
    (path / "meta.json").write_text(json.dumps(meta))


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"cursor": -1}, "'cursor' is -1, expected an int in [0, 49]"),
        ({"size": 51}, "'size' is 51, expected an int in [0, 50]"),
        ({"cursor": 3.5}, "'cursor' is 3.5"),
        ({"capacity": "50"}, "'capacity' is '50', expected an int >= 1"),
        ({"capacity": KeyError}, "the key 'capacity' is missing"),
        ({"cursor": KeyError}, "the key 'cursor' is missing"),
        ({"spec": KeyError}, "its 'spec' does not parse"),
        ({"spec": {"n": [[], "float99"]}}, "its 'spec' does not parse"),
        ({"extra": [1]}, "'extra' is [1], expected a dict"),
    ],
)
def test_damaged_meta_is_refused_at_open_naming_the_file(tmp_path, change, says):
    path = tmp_path / "buf"
    MemmapStorage(SPEC, 50, path).close()
    _v1_meta(path, **change)
    with pytest.raises(ValueError) as info:
        MemmapStorage.open(path)
    msg = str(info.value)
    assert str(path / "meta.json") in msg and says in msg and "Fix:" in msg
    if "capacity" not in change and "spec" not in change:
        with pytest.raises(ValueError, match="is damaged"):
            MemmapStorage(SPEC, 50, path)


def test_a_version_1_directory_reopens_with_its_rows(tmp_path):
    path = tmp_path / "buf"
    with MemmapStorage(SPEC, 50, path) as s:
        n = np.arange(3)
        s.write(slice(0, 3), {"n": torch.from_numpy(n), "payload": torch.from_numpy(_payload(n))})
    _v1_meta(path)
    (path / COMMIT).unlink()
    with MemmapStorage.open(path) as s:
        assert (s.cursor, s.size, s.extra) == (3, 3, {"total": 3})
        _check_intact(s)
    assert json.loads((path / "meta.json").read_text())["version"] == 2
    with MemmapStorage.open(path) as s:
        assert s.size == 3


def test_a_damaged_commit_record_is_refused(tmp_path):
    path = tmp_path / "buf"
    MemmapStorage(SPEC, 50, path).close()
    log = CommitLog(path / COMMIT)
    log.read()
    log.write(Commit(-5, 80), b"{}", synced=True)  # a valid checksum over impossible values
    log.close()
    with pytest.raises(ValueError, match=r"commit.rec is damaged: .*cursor=-5 size=80"):
        MemmapStorage.open(path)


# ----------------------------------------------------------------------------- atomic writes
def test_write_atomic_replaces_whole_or_not_at_all(tmp_path, monkeypatch):
    target = tmp_path / "f.bin"
    write_atomic(target, b"old")
    write_atomic(target, lambda f: f.write(b"new"))
    assert target.read_bytes() == b"new"

    def full(f):
        f.write(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        write_atomic(target, full)
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError(5, "EIO")))
    with pytest.raises(OSError, match="EIO"):
        write_atomic(target, b"other")
    assert target.read_bytes() == b"new"
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"]  # no temp file left


def test_one_atomic_write_and_no_storage_import_cycle():
    pkg = ROOT / "rlstash"
    copies = [
        str(p.relative_to(ROOT))
        for p in pkg.rglob("*.py")
        if "os.replace(" in p.read_text() and p.name != "atomic.py"
    ]
    assert copies == []
    ram = (pkg / "storage" / "ram.py").read_text()
    assert "rlstash.storage.disk " not in ram and "storage.disk import" not in ram
    checks = [
        str(p.relative_to(ROOT))
        for p in pkg.rglob("*.py")
        if 'f"capacity: expected a positive int' in p.read_text()
    ]
    assert checks == ["rlstash/core.py"]
