"""TensorStorage and MemmapStorage: roundtrips, clear errors, nothing partial, planning, resume."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from rlstash import memory
from rlstash.core import Storage
from rlstash.memory import InsufficientMemoryError
from rlstash.spec import Field, Spec
from rlstash.storage import MemmapStorage, TensorStorage, ram
from rlstash.writer import RingWriter

SPEC = Spec(
    {
        "obs": Field((2, 5, 5), torch.uint8),  # small "images"
        "vec": Field((3,), torch.float32),
        "action": Field((), torch.int64),
        "done": Field((), torch.bool),
        "half": Field((2,), torch.bfloat16),
        "obs/aux": Field((2,), torch.float16),
    }
)
CAP = 16


def make_batch(n: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "obs": torch.randint(0, 256, (n, 2, 5, 5), generator=g, dtype=torch.uint8),
        "vec": torch.randn(n, 3, generator=g),
        "action": torch.randint(-(2**40), 2**40, (n,), generator=g),
        "done": torch.rand(n, generator=g) < 0.5,
        "half": torch.randn(n, 2, generator=g).to(torch.bfloat16),
        "obs/aux": torch.randn(n, 2, generator=g).to(torch.float16),
    }


def rows(batch, i):
    return {k: v[i] for k, v in batch.items()}


def assert_batch_equal(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        assert torch.equal(a[k], b[k]), k


def snapshot(storage):
    return {k: t.clone() for k, t in storage.tensors.items()}


@pytest.fixture(params=["ram", "disk"])
def storage(request, tmp_path):
    if request.param == "ram":
        s = TensorStorage(SPEC, CAP)
    else:
        s = MemmapStorage(SPEC, CAP, tmp_path / "buf")
    yield s
    s.close()


# ----------------------------------------------------------------------------- roundtrips
def test_is_a_storage(storage):
    assert isinstance(storage, Storage)
    assert storage.nbytes == SPEC.nbytes(CAP)
    assert sum(t.nbytes for t in storage.tensors.values()) == storage.nbytes
    assert storage.device == torch.device("cpu")
    for name, f in SPEC.items():
        assert storage.tensors[name].shape == (CAP, *f.shape)
        assert storage.tensors[name].dtype == f.dtype


def test_write_read_roundtrip_all_dtypes(storage):
    b = make_batch(CAP)
    storage.write(slice(0, CAP), b)
    assert_batch_equal(storage.read(slice(0, CAP)), b)
    idx = np.array([3, 0, 15, 3, 7], dtype=np.int64)
    assert_batch_equal(storage.read(idx), rows(b, torch.from_numpy(idx)))


def test_wrap_around_write_from_ring_writer(storage):
    w = RingWriter(CAP)
    first = make_batch(12, seed=1)
    storage.write(w.reserve(12), first)
    w.commit(12)
    second = make_batch(10, seed=2)
    index = w.reserve(10)
    assert isinstance(index, np.ndarray)  # wraps: 12..15, 0..5
    storage.write(index, second)
    assert_batch_equal(storage.read(index), second)
    assert_batch_equal(storage.read(np.arange(6, 12)), rows(first, slice(6, 12)))


def test_read_into_out_reuses_memory(storage):
    b = make_batch(CAP)
    storage.write(slice(0, CAP), b)
    out = {k: torch.empty((4, *f.shape), dtype=f.dtype) for k, f in SPEC.items()}
    out["extra"] = torch.zeros(4)  # other keys are left alone
    ptrs = {k: t.data_ptr() for k, t in out.items()}
    for idx in ([0, 1, 2, 3], [15, 14, 13, 12], [5, 5, 5, 5]):
        got = storage.read(np.array(idx), out=out)
        assert got is out
        assert {k: t.data_ptr() for k, t in got.items()} == ptrs
        assert_batch_equal({k: got[k] for k in SPEC}, rows(b, torch.tensor(idx)))
    got = storage.read(slice(8, 12), out=out)
    assert_batch_equal({k: got[k] for k in SPEC}, rows(b, slice(8, 12)))
    # a replaced tensor in the same dict is noticed (cached views are not reused blindly)
    out["vec"] = torch.empty(4, 3)
    storage.read(np.array([1, 2, 3, 4]), out=out)
    assert torch.equal(out["vec"], b["vec"][1:5])


def test_read_returns_copies_not_views(storage):
    storage.write(slice(0, CAP), make_batch(CAP))
    got = storage.read(np.array([0]))
    got["vec"].fill_(123.0)
    sl = storage.read(slice(0, 1))
    sl["vec"].fill_(321.0)
    assert not torch.any(storage.tensors["vec"] == 123.0)
    assert not torch.any(storage.tensors["vec"] == 321.0)


def test_index_forms_and_empty_reads(storage):
    b = make_batch(CAP)
    storage.write(slice(0, CAP), b)
    for idx in ([1, 2], np.array([1, 2], dtype=np.int32), torch.tensor([1, 2]), range(1, 3)):
        assert_batch_equal(storage.read(idx), rows(b, slice(1, 3)))
    empty = storage.read(np.array([], dtype=np.int64))
    assert all(v.shape[0] == 0 for v in empty.values())
    storage.write(np.array([], dtype=np.int64), make_batch(0))


def test_write_accepts_safe_casts_numpy_and_noncontiguous(storage):
    b = make_batch(4)
    src = dict(b)
    src["vec"] = torch.randn(3, 4).t()  # non-contiguous [4, 3]
    src["action"] = b["action"].numpy()  # numpy array
    src["done"] = b["done"].to(torch.uint8).bool()
    src["obs/aux"] = b["obs/aux"].float().requires_grad_()  # float32 -> float16 cast
    storage.write(slice(2, 6), src)
    got = storage.read(slice(2, 6))
    assert torch.equal(got["vec"], src["vec"])
    assert torch.equal(got["action"], b["action"])
    assert torch.equal(got["obs/aux"], b["obs/aux"])


def test_validate_false_fast_path(storage):
    b = make_batch(5)
    storage.write(np.array([9, 1, 4, 0, 2]), b, validate=False)
    assert_batch_equal(storage.read(np.array([9, 1, 4, 0, 2])), b)
    with pytest.raises(ValueError, match="5 rows"):
        storage.write(slice(0, 4), b, validate=False)
    with pytest.raises(ValueError, match="'vec' is missing"):
        storage.write(slice(0, 5), {k: v for k, v in b.items() if k != "vec"}, validate=False)


# ----------------------------------------------------------------------------- errors
BAD_WRITES = [
    ("wrong shape", lambda b: {**b, "vec": torch.zeros(4, 2)}, ValueError, r"'vec'.*shape"),
    ("lossy dtype", lambda b: {**b, "action": torch.zeros(4)}, TypeError, r"'action'.*int64"),
    ("rows differ", lambda b: {**b, "done": torch.zeros(3, dtype=torch.bool)}, ValueError, "rows"),
    ("missing", lambda b: {k: v for k, v in b.items() if k != "obs"}, ValueError, "missing"),
    ("unexpected", lambda b: {**b, "zzz": torch.zeros(4)}, ValueError, "zzz"),
]


@pytest.mark.parametrize("case, change, err, text", BAD_WRITES, ids=[c[0] for c in BAD_WRITES])
def test_bad_batch_writes_nothing(storage, case, change, err, text):
    storage.write(slice(0, CAP), make_batch(CAP, seed=3))
    before = snapshot(storage)
    with pytest.raises(err, match=text):
        storage.write(slice(0, 4), change(make_batch(4, seed=4)))
    assert_batch_equal(snapshot(storage), before)


@pytest.mark.parametrize(
    "index, err, text",
    [
        (slice(0, 3), ValueError, "selects 3 rows but the batch has 4"),
        (np.array([0, 1, 2, 16]), IndexError, r"\[0, 16\).*\[16\]"),
        (np.array([0, -1, 2, 3]), IndexError, r"\[-1\]"),
        (slice(14, 18), IndexError, "wrap around"),
        (slice(0, 8, 2), IndexError, "step 1"),
        (np.zeros((2, 2), dtype=np.int64), TypeError, "1-D integer"),
        (np.array([0.0, 1.0, 2.0, 3.0]), TypeError, "1-D integer"),
    ],
)
def test_bad_index_writes_nothing(storage, index, err, text):
    storage.write(slice(0, CAP), make_batch(CAP, seed=3))
    before = snapshot(storage)
    with pytest.raises(err, match=text):
        storage.write(index, make_batch(4, seed=4))
    assert_batch_equal(snapshot(storage), before)


def test_bad_out_is_refused(storage):
    good = {k: torch.empty((2, *f.shape), dtype=f.dtype) for k, f in SPEC.items()}
    idx = np.array([0, 1])
    with pytest.raises(ValueError, match=r"out\['vec'\]: expected shape \[2, 3\]"):
        storage.read(idx, out={**good, "vec": torch.empty(3, 3)})
    with pytest.raises(ValueError, match=r"out\['done'\].*dtype bool"):
        storage.read(idx, out={**good, "done": torch.empty(2, dtype=torch.uint8)})
    with pytest.raises(ValueError, match="non-contiguous"):
        storage.read(idx, out={**good, "vec": torch.empty(3, 2).t()})
    with pytest.raises(ValueError, match="missing"):
        storage.read(idx, out={k: v for k, v in good.items() if k != "obs"})
    storage.read(idx, out=good)  # cached now; a different row count is still refused
    with pytest.raises(ValueError, match=r"expected shape \[3"):
        storage.read(np.array([0, 1, 2]), out=good)
    with pytest.raises(IndexError):
        storage.read(np.array([CAP]), out=good)


def test_closed_storage_refuses(storage):
    storage.close()
    storage.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        storage.read(np.array([0]))
    with pytest.raises(RuntimeError, match="closed"):
        storage.write(slice(0, 1), make_batch(1))


# ----------------------------------------------------------------------------- plan (I2)
def test_tensor_storage_plans_before_allocating(monkeypatch):
    monkeypatch.setattr(memory, "ram_available", lambda: 1_000)
    allocated = []
    monkeypatch.setattr(torch, "zeros", lambda *a, **k: allocated.append(a))
    monkeypatch.setattr(ram, "_zeros", lambda *a, **k: allocated.append(a))
    with pytest.raises(InsufficientMemoryError) as info:
        TensorStorage(SPEC, 1_000)
    assert allocated == []
    assert f"{SPEC.nbytes(1_000):,} bytes" in str(info.value) and "1,000 bytes" in str(info.value)
    monkeypatch.undo()
    monkeypatch.setattr(memory, "ram_available", lambda: 1_000)
    s = TensorStorage(SPEC, 1_000, allow_overcommit=True)
    assert s.plan.nbytes == s.nbytes == sum(t.nbytes for t in s.tensors.values())
    assert not s.plan.fits


def test_meta_device_uses_torch_ops():
    s = TensorStorage(SPEC, CAP, device="meta")
    assert s.device.type == "meta" and s.tensors["obs"].device.type == "meta"
    s.write(np.array([15, 0, 1]), make_batch(3))
    got = s.read(np.array([1, 2]))
    assert got["obs"].shape == (2, 2, 5, 5) and got["half"].dtype == torch.bfloat16
    assert got["vec"].device.type == "meta"
    out = {k: torch.empty((2, *f.shape), dtype=f.dtype, device="meta") for k, f in SPEC.items()}
    assert s.read(slice(3, 5), out=out) is out
    with pytest.raises(ValueError, match="on meta"):
        s.read(
            np.array([1, 2]),
            out={k: torch.empty((2, *f.shape), dtype=f.dtype) for k, f in SPEC.items()},
        )


# ----------------------------------------------------------------------------- state
def test_tensor_state_roundtrip_and_mismatch():
    a = TensorStorage(SPEC, CAP)
    a.write(slice(0, CAP), make_batch(CAP, seed=5))
    state = a.state_dict()
    assert state["data"]["vec"] is a.tensors["vec"]  # a reference, no copy
    b = TensorStorage(SPEC, CAP)
    b.load_state_dict(state)
    assert_batch_equal(b.read(slice(0, CAP)), a.read(slice(0, CAP)))
    other = TensorStorage(
        SPEC.merge({"x": Field((), torch.float32)}).select("obs", "vec", "x"), CAP
    )
    with pytest.raises(ValueError, match=r"lacks fields \['x'\]; has unexpected fields \['action'"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="capacity 16"):
        TensorStorage(SPEC, CAP + 1).load_state_dict(state)
    bad = {**state, "data": {**state["data"], "vec": torch.zeros(CAP, 4)}}
    before = snapshot(b)
    with pytest.raises(ValueError, match="'vec' has shape"):
        b.load_state_dict(bad)
    assert_batch_equal(snapshot(b), before)


def test_states_move_between_ram_and_disk(tmp_path):
    ram = TensorStorage(SPEC, CAP)
    ram.write(slice(0, CAP), make_batch(CAP, seed=6))
    with MemmapStorage(SPEC, CAP, tmp_path / "d") as disk:
        disk.load_state_dict({**ram.state_dict(), "cursor": 3, "size": 9})
        assert (disk.cursor, disk.size) == (3, 9)
        assert_batch_equal(disk.read(slice(0, CAP)), ram.read(slice(0, CAP)))
        disk.write(slice(0, 2), make_batch(2, seed=7))
        state = disk.state_dict()
        assert "data" not in state and state["path"] == str(tmp_path / "d")
        back = TensorStorage(SPEC, CAP)
        back.load_state_dict(state)
        assert_batch_equal(back.read(slice(0, CAP)), disk.read(slice(0, CAP)))
        with MemmapStorage(SPEC, CAP, tmp_path / "e") as copy:
            copy.load_state_dict(state)
            assert_batch_equal(copy.read(slice(0, CAP)), disk.read(slice(0, CAP)))
            assert copy.cursor == 3


# ----------------------------------------------------------------------------- RSS
RSS_SCRIPT = textwrap.dedent(
    """
    import psutil, torch
    from rlstash.spec import Field, Spec
    from rlstash.storage import TensorStorage
    spec = Spec({"obs": Field((1000,), torch.float32), "action": Field((), torch.int64)})
    chunk = {"obs": torch.ones(64, 1000), "action": torch.arange(64)}
    warm = TensorStorage(spec, 64)
    warm.write(slice(0, 64), chunk)
    warm.read(slice(0, 64))
    proc = psutil.Process()
    before = proc.memory_info().rss
    cap = 50_000  # 4008 bytes per row: ~200 MB
    s = TensorStorage(spec, cap)
    for start in range(0, cap - 64 + 1, 64):
        s.write(slice(start, start + 64), chunk)
    s.write(slice(cap - 64, cap), chunk)
    print(proc.memory_info().rss - before, s.nbytes)
    """
)


def test_rss_grows_by_the_stored_bytes_only():
    root = Path(__file__).resolve().parents[1]
    res = subprocess.run(
        [sys.executable, "-c", RSS_SCRIPT], capture_output=True, text=True, timeout=120, cwd=root
    )
    assert res.returncode == 0, res.stderr
    grew, stored = map(int, res.stdout.split())
    assert stored == 50_000 * 4008
    assert 0.98 * stored <= grew <= 1.02 * stored, (grew, stored)


# ----------------------------------------------------------------------------- disk
def test_memmap_files_and_resume(tmp_path):
    path = tmp_path / "buf"
    s = MemmapStorage(SPEC, CAP, path)
    files = sorted(p.name for p in path.iterdir())
    assert files == sorted(
        ["obs.bin", "vec.bin", "action.bin", "done.bin", "half.bin", "obs__aux.bin", "meta.json"]
        + ["commit.rec"]
    )
    for name, f in SPEC.items():
        fname = name.replace("/", "__") + ".bin"
        assert (path / fname).stat().st_size == CAP * f.row_bytes
        assert (path / fname).stat().st_blocks * 512 >= CAP * f.row_bytes  # reserved, not sparse
    b = make_batch(CAP, seed=8)
    s.write(slice(0, 10), rows(b, slice(0, 10)))
    s.set_cursor(10, 10, extra={"total": 10})
    s.close()
    meta = json.loads((path / "meta.json").read_text())
    assert (meta["capacity"], meta["version"]) == (CAP, 2)  # the position is in commit.rec
    r = MemmapStorage(SPEC, CAP, path)
    assert (r.cursor, r.size, r.extra) == (10, 10, {"total": 10})
    assert_batch_equal(r.read(slice(0, 10)), rows(b, slice(0, 10)))
    r.close()
    o = MemmapStorage.open(path)
    assert o.spec == SPEC and o.capacity == CAP
    o.close()


def test_memmap_resume_after_garbage_collection(tmp_path):
    s = MemmapStorage(SPEC, CAP, tmp_path / "buf")
    s.write(slice(0, 2), make_batch(2))
    s.set_cursor(2, 2)
    del s
    gc.collect()
    r = MemmapStorage(SPEC, CAP, tmp_path / "buf")  # the lock was released, meta written
    assert (r.cursor, r.size) == (2, 2)
    r.close()


def test_memmap_spec_mismatch_and_capacity(tmp_path):
    MemmapStorage(SPEC, CAP, tmp_path / "buf").close()
    changed = Spec({**dict(SPEC.items()), "vec": Field((4,), torch.float32)})
    with pytest.raises(ValueError, match=r"field 'vec' is 3:float32, expected 4:float32"):
        MemmapStorage(changed, CAP, tmp_path / "buf")
    with pytest.raises(ValueError, match="capacity 16, expected 17"):
        MemmapStorage(SPEC, CAP + 1, tmp_path / "buf")


def test_memmap_refuses_foreign_or_damaged_directories(tmp_path):
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not empty and has no meta.json"):
        MemmapStorage(SPEC, CAP, tmp_path / "foreign")
    assert [p.name for p in (tmp_path / "foreign").iterdir()] == ["notes.txt"]
    MemmapStorage(SPEC, CAP, tmp_path / "buf").close()
    os.truncate(tmp_path / "buf" / "vec.bin", 10)
    with pytest.raises(
        ValueError, match=r"vec.bin is damaged: it has 10 bytes, expected 192 .*Fix: restore"
    ):
        MemmapStorage(SPEC, CAP, tmp_path / "buf")
    with pytest.raises(ValueError, match="share the file"):
        MemmapStorage({"a/b": ((), torch.int8), "a__b": ((), torch.int8)}, 4, tmp_path / "c")
    assert not (tmp_path / "c").exists()


def test_open_close_leaks_no_file_descriptors(tmp_path):
    def fds():
        return len(os.listdir("/proc/self/fd"))

    MemmapStorage(SPEC, CAP, tmp_path / "buf").close()
    before = fds()
    for _ in range(20):
        s = MemmapStorage(SPEC, CAP, tmp_path / "buf")
        s.write(slice(0, 2), make_batch(2))
        s.read(np.array([0, 1]))
        s.close()
    gc.collect()
    assert fds() == before


def test_memmap_is_open_once(tmp_path):
    s = MemmapStorage(SPEC, CAP, tmp_path / "buf")
    with pytest.raises(RuntimeError, match="already open"):
        MemmapStorage(SPEC, CAP, tmp_path / "buf")
    s.close()
    MemmapStorage(SPEC, CAP, tmp_path / "buf").close()


def test_flush_and_close_never_rewrite_meta_and_stale_temps_go(tmp_path, monkeypatch):
    path = tmp_path / "buf"
    s = MemmapStorage(SPEC, CAP, path)
    before = (path / "meta.json").read_bytes()
    # nothing is replaced after creation: a commit is a store into the reserved commit.rec
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError(28, "full")))
    s.set_cursor(7, 7)
    s.flush()
    monkeypatch.undo()
    assert (path / "meta.json").read_bytes() == before
    assert sorted(p.name for p in path.iterdir() if not p.name.endswith(".bin")) == [
        "commit.rec",
        "meta.json",
    ]
    (path / ".meta.json.tmp.999").write_text("{half")  # left by a crash during creation
    s.close()
    with MemmapStorage(SPEC, CAP, path) as r:
        assert (r.cursor, r.size) == (7, 7)
    assert not list(path.glob(".meta*"))


def test_set_cursor_checks(tmp_path):
    with MemmapStorage(SPEC, CAP, tmp_path / "buf") as s:
        with pytest.raises(ValueError, match="cursor"):
            s.set_cursor(CAP, 0)
        with pytest.raises(TypeError):
            s.set_cursor(0, 0, extra={"x": object()})
        assert (s.cursor, s.size, s.extra) == (0, 0, {})


def test_unsupported_fallocate_is_a_clear_error(tmp_path, monkeypatch):
    def nope(fd, offset, length):
        raise OSError(95, "Operation not supported")

    monkeypatch.setattr(os, "posix_fallocate", nope)
    with pytest.raises(OSError, match="posix_fallocate"):
        MemmapStorage(SPEC, CAP, tmp_path / "a" / "b")
    assert list(tmp_path.iterdir()) == []


BIG = Spec({"obs": Field((64, 64), torch.uint8), "action": Field((), torch.int64)})  # 4104 B/row


def test_full_disk_is_refused_before_creating_anything(small_fs):
    with pytest.raises(InsufficientMemoryError) as info:
        MemmapStorage(BIG, 4_000, small_fs / "buf")  # ~16 MB on an 8 MiB disk
    msg = str(info.value)
    assert f"{info.value.needed:,} bytes" in msg
    assert info.value.needed >= BIG.nbytes(4_000)
    assert f"{info.value.free:,} bytes" in msg and info.value.free <= 8 << 20
    assert "disk" in msg and "capacity <=" in msg
    assert list(small_fs.iterdir()) == []


def test_full_disk_midway_leaves_nothing(small_fs):
    # skip the plan's refusal: posix_fallocate itself runs out of space on the second file
    spec = Spec({"a": Field((1024,), torch.uint8), "b": Field((1024,), torch.uint8)})
    with pytest.raises(InsufficientMemoryError) as info:
        MemmapStorage(spec, 6_000, small_fs / "x" / "y", allow_overcommit=True)  # 12 MB
    msg = str(info.value)
    assert f"{info.value.needed:,} bytes" in msg and f"{info.value.free:,} bytes" in msg
    assert "Nothing was left behind" in msg
    assert list(small_fs.iterdir()) == []


def test_storage_that_fits_fills_completely(small_fs):
    cap = 1_500  # 4104 * 1500 = ~5.9 MiB of 8 MiB
    s = MemmapStorage(BIG, cap, small_fs / "buf")
    last = {"obs": torch.full((1, 64, 64), 7, dtype=torch.uint8), "action": torch.tensor([42])}
    chunk = {"obs": torch.full((100, 64, 64), 3, dtype=torch.uint8), "action": torch.arange(100)}
    for start in range(0, cap - 100, 100):
        s.write(slice(start, start + 100), chunk)
    s.write(np.array([cap - 1]), last)  # the very last row: no SIGBUS, the pages are reserved
    s.set_cursor(0, cap)
    s.close()
    r = MemmapStorage(BIG, cap, small_fs / "buf")
    assert_batch_equal(r.read(np.array([cap - 1])), last)
    assert r.size == cap
    r.close()


# ----------------------------------------------------------------------------- hot paths
def test_exact_sources_then_put_writes_what_write_writes(storage):
    b = make_batch(4, seed=5)
    got = storage.exact_sources(b)  # tensors of the exact dtypes (bfloat16 included)
    assert got is not None and got[1] == 4
    storage.put(slice(3, 7), got[0])
    assert_batch_equal(storage.read(slice(3, 7)), b)
    mixed = {k: (v.numpy() if v.dtype != torch.bfloat16 else v) for k, v in b.items()}
    mixed["vec"] = b["vec"].clone().requires_grad_()  # raw rows are copied, grad or not
    srcs, n = storage.exact_sources(mixed)
    storage.put(np.array([15, 0, 1, 2]), srcs)  # a wrapped index array
    assert_batch_equal(storage.read(np.array([15, 0, 1, 2])), b)


@pytest.mark.parametrize(
    "change",
    [
        lambda b: {**b, "vec": b["vec"].double()},  # needs a cast
        lambda b: {**b, "vec": torch.randn(3, 4).t()},  # not contiguous
        lambda b: {**b, "vec": torch._neg_view(b["vec"])},  # negation bit: values differ
        lambda b: {**b, "half": b["half"].view(torch.int16).numpy()},  # bits, not values
        lambda b: {**b, "vec": b["vec"].tolist()},  # a list
        lambda b: {**b, "vec": torch.zeros(4, 3, device="meta")},
        lambda b: {**b, "done": b["done"][:3]},  # rows differ
        lambda b: {**b, "obs": b["obs"][:, :1]},  # shape differs
        lambda b: {k: v for k, v in b.items() if k != "vec"},
        lambda b: {**b, "zzz": b["vec"]},
        lambda b: {k: v[0] for k, v in b.items()},  # no row dimension
        lambda b: list(b.values()),
    ],
)
def test_exact_sources_declines_what_needs_validation(storage, change):
    assert storage.exact_sources(change(make_batch(4))) is None


def test_neg_view_goes_through_validation_with_the_right_values(storage):
    b = make_batch(4)
    src = {**b, "vec": torch._neg_view(b["vec"])}
    storage.write(slice(0, 4), src)
    assert torch.equal(storage.read(slice(0, 4))["vec"], -b["vec"])


def test_put_on_a_closed_storage_raises(storage):
    srcs, _ = storage.exact_sources(make_batch(2))
    storage.close()
    assert storage.exact_sources(make_batch(2)) is None
    with pytest.raises(RuntimeError, match="closed"):
        storage.put(slice(0, 2), srcs)


POOLED = Spec(
    {"frame": Field((256, 256), torch.uint8), "id": Field((), torch.int64)}
)  # 64 KiB rows


@pytest.mark.parametrize("kind", ["ram", "disk"])
def test_pooled_gathers_never_overwrite_batches_still_referenced(tmp_path, kind):
    storage = (
        TensorStorage(POOLED, 8) if kind == "ram" else MemmapStorage(POOLED, 8, tmp_path / "b")
    )
    ids = torch.arange(8)
    storage.write(
        slice(0, 8), {"frame": ids.to(torch.uint8)[:, None, None].expand(8, 256, 256), "id": ids}
    )

    def check(batch, idx):
        assert batch["id"].tolist() == idx
        assert (batch["frame"].flatten(1) == torch.tensor(idx, dtype=torch.uint8)[:, None]).all()

    kept = []  # every way a caller can hold on to a batch's memory
    for i in range(10):
        idx = [i % 8, (i + 3) % 8]
        b = storage.gather(np.array(idx))
        f = b["frame"]
        held = [b, f[1:], f.reshape(2, -1), f.numpy(), f[0].untyped_storage()][i % 5]
        kept.append((idx, held))
        del b, f, held
    for idx, held in kept:  # later gathers wrote elsewhere
        if isinstance(held, dict):
            check(held, idx)
            continue
        if isinstance(held, torch.UntypedStorage):
            held = torch.empty(0, dtype=torch.uint8).set_(held)[: 2 * 256 * 256]
        flat = torch.as_tensor(held).reshape(-1, 256 * 256)
        want = idx[-flat.shape[0] :]  # f[1:] holds the second row only
        assert (flat == torch.tensor(want, dtype=torch.uint8)[:, None]).all()
    # Release every held batch: the pooled blocks (_POOL_BLOCKS of them) are free again, so the
    # next gather takes a pooled block (not a fresh allocation whose address is up to malloc).
    kept.clear()
    first = storage.gather(np.array([1, 2]))
    ptr = first["frame"].data_ptr()
    del first
    again = storage.gather(np.array([5, 6]))  # the block nobody holds any more is reused
    assert again["frame"].data_ptr() == ptr
    check(again, [5, 6])
    storage.close()


def test_gather_clips_instead_of_reading_out_of_bounds(storage):
    b = make_batch(CAP)
    storage.write(slice(0, CAP), b)
    got = storage.gather(np.array([CAP + 5, 3]))  # the caller promised in-range indices
    assert torch.equal(got["action"], b["action"][[CAP - 1, 3]])


def test_put_rows_equals_a_fancy_assignment_bit_for_bit():
    """put_rows (rows moved as one numpy void each) writes what ``arr[index] = src`` writes:
    NaN payloads, -0.0 and denormals bit for bit, rows of 1..24 bytes and bool/uint8/int64
    rows, duplicate indices (the last row wins), and a source of another dtype (a cast, by
    the plain assignment)."""
    from rlstash.storage.ram import put_rows

    rng = np.random.default_rng(0)
    bits = np.array([0x7FC00001, 0x7F800001, 0x80000000, 0x00000001, 0xFF812345, 7], np.uint32)
    cases = [np.resize(bits, 40 * w).view(np.float32).reshape(40, w) for w in (1, 2, 3, 4, 6)]
    cases += [rng.random((40, 5)) < 0.5, rng.integers(0, 255, (40, 3, 7), dtype=np.uint8)]
    cases += [rng.integers(-(2**62), 2**62, (40, 2))]
    for vals in cases:
        index = rng.integers(0, 64, 40)  # duplicates: the last row wins
        with np.errstate(invalid="ignore"):  # float64 copies of signalling NaNs
            wide = vals.astype(np.float64) if vals.dtype == np.float32 else vals
        for src in (vals, wide):
            got = np.zeros((64, *vals.shape[1:]), vals.dtype)
            want = got.copy()
            put_rows(got, index, src)
            with np.errstate(invalid="ignore"):
                want[index] = src
            np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    arr = np.zeros((8, 2), np.float32)  # a slice index: the plain assignment
    put_rows(arr, slice(2, 4), np.ones((2, 2), np.float32))
    put_rows(arr, np.zeros(0, np.int64), np.ones((0, 2), np.float32))  # no rows
    assert arr.sum() == 4
