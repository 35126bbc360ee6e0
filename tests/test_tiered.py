"""TieredStorage: hot tier over cold tier equals one flat storage; CUDA path with fakes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlstash.device import CudaOps
from rlstash.storage.disk import MemmapStorage
from rlstash.storage.ram import TensorStorage
from rlstash.storage.tiered import TieredStorage
from rlstash.writer import RingWriter

SPEC = {"obs": ((3, 2), torch.uint8), "action": ((), torch.int64), "reward": ((), torch.float32)}


def rows(rng: np.random.Generator, n: int) -> dict[str, torch.Tensor]:
    return {
        "obs": torch.from_numpy(rng.integers(0, 256, (n, 3, 2), dtype=np.uint8)),
        "action": torch.from_numpy(rng.integers(0, 10**9, n)),
        "reward": torch.from_numpy(rng.standard_normal(n).astype(np.float32)),
    }


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)


class CountingStorage(MemmapStorage):
    """A disk tier that counts its writes (rows moved down)."""

    writes: list[int]

    def write(self, index, batch, validate=True):
        self.writes.append(len(next(iter(batch.values()))))
        super().write(index, batch, validate)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hot_ram_over_cold_disk_equals_a_flat_storage(tmp_path, seed):
    rng = np.random.default_rng(seed)
    cold = CountingStorage(SPEC, 40, tmp_path / "cold")
    cold.writes = []
    tiered, flat = TieredStorage(TensorStorage(SPEC, 8), cold, block=4), TensorStorage(SPEC, 40)
    writer = RingWriter(40)
    for _ in range(120):
        op = rng.integers(0, 4)
        if op == 0:  # ring writes, sometimes more rows than the hot tier holds
            n = int(rng.integers(1, 14))
            index, batch = writer.reserve(n), rows(rng, n)
            writer.commit(n)
        elif op == 1:  # arbitrary rows (with duplicates: the last one wins)
            index = rng.integers(0, 40, int(rng.integers(1, 6)))
            batch = rows(rng, index.size)
        else:
            idx = rng.integers(0, 40, int(rng.integers(1, 30)))
            moved = len(cold.writes)
            assert_same(tiered.read(idx), flat.read(idx))
            assert len(cold.writes) == moved  # reads never move rows
            continue
        tiered.write(index, batch)
        flat.write(index, batch)
        assert tiered.in_hot.sum() <= 8
    assert_same(tiered.read(np.arange(40)), flat.read(np.arange(40)))
    assert_same(tiered.read(slice(5, 25)), flat.read(slice(5, 25)))
    assert cold.writes and max(cold.writes) >= 4  # rows moved down in blocks
    tiered.close()  # flushes: the hot rows are copied down
    with MemmapStorage(SPEC, 40, tmp_path / "cold") as again:
        assert_same(again.read(np.arange(40)), flat.read(np.arange(40)))


def test_moves_are_blocks_not_rows(tmp_path):
    cold = CountingStorage(SPEC, 64, tmp_path / "cold")
    cold.writes = []
    tiered = TieredStorage(TensorStorage(SPEC, 16), cold, block=8)
    rng, writer = np.random.default_rng(3), RingWriter(64)
    for _ in range(64):
        tiered.write(writer.reserve(1), rows(rng, 1))
        writer.commit(1)
    assert cold.writes == [8] * 6  # 64 single-row writes: 48 rows moved down in 6 blocks
    assert tiered.in_hot.sum() == 16
    tiered.close()


def test_bad_input_raises_and_changes_nothing():
    hot, cold = TensorStorage(SPEC, 4), TensorStorage(SPEC, 10)
    tiered = TieredStorage(hot, cold)
    rng = np.random.default_rng(4)
    tiered.write(slice(0, 3), rows(rng, 3))
    before = tiered.read(np.arange(10)), tiered.in_hot.copy()
    bad = rows(rng, 2)
    bad["obs"] = bad["obs"].float()
    with pytest.raises(TypeError, match="obs"):
        tiered.write(slice(3, 5), bad)
    with pytest.raises(ValueError, match="rows"):
        tiered.write(slice(3, 6), rows(rng, 2))
    with pytest.raises(IndexError, match="index"):
        tiered.write(np.array([10, 11]), rows(rng, 2))
    assert_same(tiered.read(np.arange(10)), before[0])
    np.testing.assert_array_equal(tiered.in_hot, before[1])
    with pytest.raises(ValueError, match="spec"):
        TieredStorage(TensorStorage({"x": ((), torch.float32)}, 4), cold)
    with pytest.raises(ValueError, match="smaller"):
        TieredStorage(TensorStorage(SPEC, 10), cold)
    with pytest.raises(ValueError, match="block"):
        TieredStorage(hot, cold, block=5)
    tiered.close()
    with pytest.raises(RuntimeError, match="closed"):
        tiered.read(np.arange(2))


def test_replay_buffer_over_tiered_saves_and_loads(tmp_path):
    from rlstash.replay import ReplayBuffer

    tiered = TieredStorage(TensorStorage(SPEC, 6), TensorStorage(SPEC, 20), block=3)
    flat = TensorStorage(SPEC, 20)
    rb = ReplayBuffer(tiered, seed=0)
    rng = np.random.default_rng(5)
    for _ in range(9):
        batch = rows(rng, int(rng.integers(1, 5)))
        idx = rb.extend(batch)
        flat.write(idx, batch)
    out = rb.sample(16)
    assert_same({k: out[k] for k in SPEC}, flat.read(out["index"].numpy()))
    path = rb.save(tmp_path / "rb.pt")
    back = ReplayBuffer.load(path)
    assert isinstance(back.storage, TieredStorage) and len(back) == len(rb)
    assert_same(back.storage.read(np.arange(20)), flat.read(np.arange(20)))
    rb.close()
    back.close()


# ---------------------------------------------------------------------------- CUDA with fakes
class FakeEvent:
    def __init__(self, log: list) -> None:
        self.log = log

    def record(self, stream) -> None:
        self.log.append(("record", stream))

    def synchronize(self) -> None:
        self.log.append(("sync",))


class FakeCuda(CudaOps):
    """Pretends to be CUDA on the CPU and logs every operation in order."""

    def __init__(self) -> None:
        self.log: list = []
        self.pinned: list[torch.Tensor] = []

    def is_available(self) -> bool:
        return True

    def empty_pinned(self, shape, dtype):
        t = torch.empty(shape, dtype=dtype)
        self.pinned.append(t)
        self.log.append(("pinned", tuple(shape)))
        return t

    def current_stream(self, device):
        return "current"

    def new_event(self):
        return FakeEvent(self.log)

    def to(self, t, device, non_blocking=False):
        assert torch.device(device).type == "cuda"
        if non_blocking:  # only ever from a pinned staging buffer, already filled
            ptrs = {p.untyped_storage().data_ptr() for p in self.pinned}
            assert t.untyped_storage().data_ptr() in ptrs, "async copy from pageable memory"
            self.log.append(("copy", t.clone()))
        else:
            self.log.append(("blocking",))
        return t.clone()


def fake_cuda_tiered(tmp_path, ops):
    hot = TensorStorage(SPEC, 6)  # CPU memory that claims to be on cuda:0
    hot.device = torch.device("cuda", 0)
    return TieredStorage(hot, MemmapStorage(SPEC, 24, tmp_path / "cold"), block=3, ops=ops)


def test_cuda_hot_tier_stages_copies_async_and_synchronizes_before_returning(tmp_path):
    """Runs under the CUDA tripwire: every CUDA operation goes through the fake ops."""
    ops = FakeCuda()
    tiered, flat = fake_cuda_tiered(tmp_path, ops), TensorStorage(SPEC, 24)
    assert tiered.device.type == "cuda"
    rng, writer = np.random.default_rng(6), RingWriter(24)
    for _ in range(8):
        batch = rows(rng, 3)
        index = writer.reserve(3)
        writer.commit(3)
        tiered.write(index, batch)
        flat.write(index, batch)
    cold_rows = np.flatnonzero(~tiered.in_hot)[:5]
    ops.log.clear()
    got = tiered.read(cold_rows)  # all from the cold tier
    assert_same(got, flat.read(cold_rows))
    kinds = [e[0] for e in ops.log]
    assert kinds == ["pinned"] * len(SPEC) + ["copy"] * len(SPEC) + ["record", "sync"]
    want = flat.read(cold_rows)
    for (_, staged), key in zip(ops.log[len(SPEC) : 2 * len(SPEC)], SPEC):
        torch.testing.assert_close(staged, want[key])  # staging was filled before the copy
    assert ops.log[-2] == ("record", "current")  # on the caller's current stream
    # a mixed read reuses the staging buffers, still copies async, synchronizes before returning
    ops.log.clear()
    idx = np.concatenate([cold_rows[:2], np.flatnonzero(tiered.in_hot)[:3], cold_rows[:1]])
    assert_same(tiered.read(idx), flat.read(idx))
    kinds = [e[0] for e in ops.log]
    assert "pinned" not in kinds
    assert kinds[: len(SPEC) + 2] == ["copy"] * len(SPEC) + ["record", "sync"]
    assert set(kinds[len(SPEC) + 2 :]) <= {"blocking"}  # index tensors, after the sync
    tiered.close()


def test_cpu_tiers_make_no_cuda_call(tmp_path):
    class NoCuda(CudaOps):
        def __getattribute__(self, name):
            raise AssertionError(f"CudaOps.{name} used with every device on the CPU")

    tiered = TieredStorage(
        TensorStorage(SPEC, 4), MemmapStorage(SPEC, 12, tmp_path / "c"), ops=NoCuda()
    )
    rng = np.random.default_rng(7)
    for i in range(6):
        tiered.write(slice(2 * i, 2 * i + 2), rows(rng, 2))
    assert tiered.read(np.arange(12))["obs"].shape == (12, 3, 2)
    tiered.close()


def test_stream_storage_on_a_tiered_backing_equals_a_ram_backing():
    """StreamStorage over TieredStorage (no ``tensors``: one read of every row needed)."""
    from rlstash.storage.stream import ReadSpec, StreamStorage

    spec = {"obs": ((2,), torch.int64), "action": ((), torch.int64)}
    reads = ReadSpec(n_step=2, gamma=0.5, frame_stack=3)
    ram = StreamStorage(spec, 2, 24, reads=reads)
    tiered = StreamStorage(
        spec,
        2,
        24,
        lambda s, c: TieredStorage(TensorStorage(s, 5), TensorStorage(s, c)),
        reads=reads,
    )
    rng = np.random.default_rng(8)
    for t in range(40):
        done = rng.random(2) < 0.15
        step = {
            "obs": np.stack([[t, e] for e in range(2)]),
            "action": np.array([t, -t]),
            "reward": rng.standard_normal(2),
            "terminated": done,
            "truncated": np.zeros(2, bool),
        }
        ram.extend(step)
        tiered.extend(step)
    np.testing.assert_array_equal(ram.valid, tiered.valid)
    idx = np.flatnonzero(ram.valid)
    assert_same(ram.read(idx), tiered.read(idx))
