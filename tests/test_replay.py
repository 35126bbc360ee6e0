"""ReplayBuffer: validation (I8), delivery after transforms (I3), threads, prefetch, save/load."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from rlstash.device import Delivery
from rlstash.replay import ReplayBuffer
from rlstash.sampler import PrioritizedSampler, UniformSampler
from rlstash.spec import Field, Spec
from rlstash.storage import MemmapStorage, TensorStorage
from tests.test_device import FakeCudaOps

SPEC = Spec(
    {
        "obs": Field((3,), torch.float32),
        "action": Field((), torch.int64),
        "reward": Field((), torch.float32),
        "terminated": Field((), torch.bool),
    }
)


def rows(start: int, n: int) -> dict[str, torch.Tensor]:
    i = torch.arange(start, start + n)
    return {
        "obs": torch.stack([i, i * 2, i * 3], 1).float(),
        "action": i,
        "reward": i.float() / 10,
        "terminated": i % 5 == 4,
    }


def make(capacity=16, storage=None, **kw) -> ReplayBuffer:
    return ReplayBuffer(storage or TensorStorage(SPEC, capacity), seed=kw.pop("seed", 0), **kw)


def test_extend_and_sample_roundtrip():
    rb = make()
    idx = rb.extend(rows(0, 10))
    np.testing.assert_array_equal(idx, np.arange(10))
    assert len(rb) == 10
    b = rb.sample(32)
    assert set(b) == {"obs", "action", "reward", "terminated", "index"}
    assert b["index"].dtype == torch.int64 and b["index"].max() < 10
    torch.testing.assert_close(b["action"], b["index"])
    torch.testing.assert_close(b["obs"][:, 1], b["action"].float() * 2)


def test_ring_overwrites_oldest_and_oversized_batch_keeps_tail():
    rb = make(capacity=8)
    rb.extend(rows(0, 6))
    rb.extend(rows(6, 5))  # wraps: rows 3..10 alive
    assert len(rb) == 8
    alive = sorted(rb.storage.read(np.arange(8))["action"].tolist())
    assert alive == list(range(3, 11))
    rb.extend(rows(100, 20))  # more rows than the capacity: the last 8 survive
    alive = sorted(rb.storage.read(np.arange(8))["action"].tolist())
    assert alive == list(range(112, 120))
    assert rb.writer.total == 31


@pytest.mark.parametrize(
    "bad, err, match",
    [
        (
            {**rows(0, 4), "obs": torch.zeros(4, 2)},
            ValueError,
            r"field 'obs': expected shape \[N, 3\]",
        ),
        (
            {**rows(0, 4), "action": torch.zeros(4)},
            TypeError,
            "field 'action': expected dtype int64, got float32",
        ),
        ({**rows(0, 4), "reward": torch.zeros(3)}, ValueError, "field 'reward': has 3 rows"),
        (
            {k: v for k, v in rows(0, 4).items() if k != "terminated"},
            ValueError,
            r"missing \['terminated'\]",
        ),
        ({**rows(0, 4), "extra": torch.zeros(4)}, ValueError, r"unexpected \['extra'\]"),
        ([1, 2, 3], TypeError, "batch: expected a dict"),
    ],
)
def test_bad_batch_writes_nothing(bad, err, match):
    rb = make()
    rb.extend(rows(0, 5))
    before = {k: v.clone() for k, v in rb.storage.read(np.arange(16)).items()}
    state = rb.writer.state_dict()
    with pytest.raises(err, match=match):
        rb.extend(bad)
    after = rb.storage.read(np.arange(16))
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert rb.writer.state_dict() == state and len(rb) == 5


def test_empty_buffer_and_bad_batch_size():
    rb = make()
    with pytest.raises(ValueError, match="empty"):
        rb.sample(4)
    rb.extend(rows(0, 2))
    for bad in (0, -1):
        with pytest.raises(ValueError, match="batch_size"):
            rb.sample(bad)
    for bad in (2.5, True, "4"):
        with pytest.raises(TypeError, match="batch_size"):
            rb.sample(bad)


def test_transforms_run_in_order_then_delivery():
    calls = []

    def t1(b):
        calls.append("t1")
        return {**b, "obs": b["obs"] + 1}

    def t2(b):
        calls.append("t2")
        return {"x": b["obs"] * 10, "index": b["index"]}  # a brand-new dict, as in seed 002

    rb = make(transforms=[t1, t2])
    rb.extend(rows(0, 4))
    b = rb.sample(3)
    assert calls == ["t1", "t2"] and set(b) == {"x", "index"}
    torch.testing.assert_close(b["x"][:, 0], (b["index"].float() + 1) * 10)


def test_transform_must_return_dict():
    rb = make(transforms=[lambda b: list(b)])
    rb.extend(rows(0, 4))
    with pytest.raises(TypeError, match="return a dict"):
        rb.sample(2)


def test_pin_memory_applies_after_custom_transform():
    """Seed 002: pinning ran before the transform, so a new batch came back unpinned."""
    ops = FakeCudaOps()
    rb = make(transforms=[lambda b: {"obs2": b["obs"].clone(), "index": b["index"]}])
    rb.delivery = Delivery(None, True, ops=ops)
    rb.extend(rows(0, 4))
    b = rb.sample(2)
    assert all(t.data_ptr() in ops.pinned for t in b.values())


def test_disk_storage_delivers_to_a_cuda_device(tmp_path):
    """Seed 003: a disk storage refused non-CPU devices. Here the final batch goes through
    pinned staging with a non-blocking copy, whatever the storage."""
    ops = FakeCudaOps()
    rb = make(storage=MemmapStorage(SPEC, 16, tmp_path / "buf"))
    rb.delivery = Delivery("cuda", False, ops=ops)
    rb.extend(rows(0, 6))
    b = rb.sample(4)
    assert ops.log.count("copy:pinned:nb=True") == len(b)
    assert "record" in ops.log
    rb.close()


def test_prefetch_matches_synchronous_sequence_and_stops():
    a, b = make(seed=7), make(seed=7, prefetch=3)
    a.extend(rows(0, 16))
    b.extend(rows(0, 16))
    for _ in range(5):
        x, y = a.sample(4), b.sample(4)
        torch.testing.assert_close(x["index"], y["index"])
    thread = b._prefetcher.thread
    b.close()
    assert not thread.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        b.sample(4)


def test_prefetch_surfaces_errors():
    rb = make(prefetch=2, transforms=[lambda b: 1 / 0])
    rb.extend(rows(0, 4))
    with pytest.raises(ZeroDivisionError):
        rb.sample(2)
    rb.close()


def test_concurrent_extend_and_sample_never_tear_rows():
    spec = Spec({"data": Field((64,), torch.int64), "check": Field((), torch.int64)})
    rb = ReplayBuffer(TensorStorage(spec, 256), seed=0)
    stop = threading.Event()
    errors: list[str] = []

    def writer():
        k = 0
        while not stop.is_set():
            v = torch.arange(k, k + 16)[:, None].expand(16, 64).contiguous()
            rb.extend({"data": v, "check": v.sum(1)})
            k += 16

    def sampler():
        for _ in range(300):
            if len(rb) == 0:
                continue
            b = rb.sample(32)
            bad = (b["data"].sum(1) != b["check"]) | (
                b["data"].min(1).values != b["data"].max(1).values
            )
            if bad.any():
                errors.append(f"torn rows at {b['index'][bad].tolist()}")
            if (b["check"] == 0).any() and (b["data"][b["check"] == 0] != 0).any():
                errors.append("unwritten row returned")

    threads = [threading.Thread(target=writer)] + [
        threading.Thread(target=sampler) for _ in range(2)
    ]
    rb.extend(
        {"data": torch.zeros(1, 64, dtype=torch.int64), "check": torch.zeros(1, dtype=torch.int64)}
    )
    for t in threads:
        t.start()
    for t in threads[1:]:
        t.join(60)
    stop.set()
    threads[0].join(60)
    assert not errors, errors[:3]


@pytest.mark.parametrize(
    "sampler", [UniformSampler, lambda: PrioritizedSampler(alpha=0.6, beta=0.4)]
)
def test_save_load_samples_exactly_the_same(tmp_path, sampler):
    rb = make(capacity=32, sampler=sampler())
    rb.extend(rows(0, 40))
    if isinstance(rb.sampler, PrioritizedSampler):
        b = rb.sample(8)
        rb.update_priorities(b["index"], torch.rand(8) + 0.1)
    rb.save(tmp_path / "rb.pt")
    expected = [rb.sample(8) for _ in range(3)]
    loaded = ReplayBuffer.load(tmp_path / "rb.pt")
    assert len(loaded) == len(rb) and loaded.writer.cursor == rb.writer.cursor
    for e in expected:
        got = loaded.sample(8)
        for k in e:
            torch.testing.assert_close(got[k], e[k])
    assert not list(tmp_path.glob(".rb.pt.*"))  # no temp file left


def test_disk_buffer_resumes_after_close(tmp_path):
    rb = make(storage=MemmapStorage(SPEC, 16, tmp_path / "buf"))
    rb.extend(rows(0, 20))
    cursor, size = rb.writer.cursor, len(rb)
    rb.close()
    again = ReplayBuffer(MemmapStorage.open(tmp_path / "buf"), seed=0)
    assert (again.writer.cursor, len(again), again.writer.total) == (cursor, size, 20)
    assert sorted(again.storage.read(np.arange(16))["action"].tolist()) == list(range(4, 20))
    again.close()


def test_prioritized_through_buffer():
    rb = make(capacity=64, sampler=PrioritizedSampler(alpha=1.0, beta=1.0))
    rb.extend(rows(0, 64))
    b = rb.sample(16)
    assert b["weight"].dtype == torch.float32 and b["weight"].shape == (16,)
    prio = torch.full((64,), 1e-3)
    prio[5] = 1000.0
    rb.update_priorities(torch.arange(64), prio)
    b = rb.sample(256)
    assert (b["index"] == 5).float().mean() > 0.9
    with pytest.raises(ValueError):
        rb.update_priorities(torch.tensor([1]), torch.tensor([float("nan")]))


def test_update_priorities_needs_prioritized_sampler():
    rb = make()
    rb.extend(rows(0, 4))
    with pytest.raises(TypeError, match="PrioritizedSampler"):
        rb.update_priorities([0], [1.0])


def test_sequence_sampler_through_buffer():
    from rlstash.sampler import SequenceSampler

    rb = make(capacity=32, sampler=SequenceSampler(4, end_keys=("terminated",)))
    rb.extend(rows(0, 30))
    b = rb.sample(16)
    idx = b["index"]
    assert idx.shape == (16, 4)
    assert b["action"].shape == (16, 4)
    # windows never cross an episode end: an end flag may only be on the last step
    assert not b["terminated"][:, :-1].any()


def test_bad_constructor_arguments():
    with pytest.raises(TypeError, match="storage"):
        ReplayBuffer("ram")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="prefetch"):
        make(prefetch=-1)
    with pytest.raises(TypeError, match=r"transforms\[0\]"):
        make(transforms=[42])


def test_extend_fast_path_matches_validated_path(tmp_path):
    """Batches with the exact dtypes skip validation work; results equal the general path."""
    fast = make(capacity=8, storage=MemmapStorage(SPEC, 8, tmp_path / "fast"))
    slow = make(capacity=8)
    for start, n in ((0, 5), (5, 6), (11, 8)):  # fills, wraps, overwrites everything
        b = rows(start, n)
        as_numpy = {k: v.numpy() for k, v in b.items()}
        casts = {**b, "action": b["action"].int(), "obs": b["obs"].double()}  # validated
        assert fast.storage.exact_sources(as_numpy) is not None
        assert fast.storage.exact_sources(casts) is None
        i1 = fast.extend(as_numpy if start else b)
        i2 = slow.extend(casts)
        np.testing.assert_array_equal(i1, i2)
        assert i1.dtype == np.int64
    a, b = fast.storage.read(np.arange(8)), slow.storage.read(np.arange(8))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert (fast.writer.state_dict(), len(fast)) == (slow.writer.state_dict(), len(slow))
    assert (fast.storage.cursor, fast.storage.size) == (fast.writer.cursor, 8)
    fast.close()


class RecordingSampler(UniformSampler):
    def __init__(self):
        super().__init__()
        self.seen = []

    def on_write(self, index, batch):
        self.seen.append({k: type(v) for k, v in batch.items()})


def test_custom_sampler_gets_tensors_from_the_fast_path():
    rb = make(sampler=RecordingSampler())
    rb.extend({k: v.numpy() for k, v in rows(0, 4).items()})
    rb.extend(rows(4, 4))
    assert all(t is torch.Tensor for seen in rb.sampler.seen for t in seen.values())


class OutOfRangeSampler(UniformSampler):
    def sample(self, batch_size, ctx):
        return np.full(batch_size, ctx.capacity, dtype=np.int64), {}


def test_indices_of_a_custom_sampler_are_still_bounds_checked():
    rb = make(sampler=OutOfRangeSampler())
    rb.extend(rows(0, 4))
    with pytest.raises(IndexError, match="capacity"):
        rb.sample(2)


@pytest.mark.parametrize("prefetch", [0, 3])
def test_sampled_batches_stay_intact_while_held(prefetch):
    """Big batches come from reused memory, but never while anything still refers to it."""
    spec = Spec({"frame": Field((64, 32, 32), torch.uint8), "id": Field((), torch.int64)})
    rb = ReplayBuffer(TensorStorage(spec, 64), seed=1, prefetch=prefetch)
    ids = torch.arange(64)
    rb.extend({"frame": (ids % 251).to(torch.uint8)[:, None, None, None].expand(64, 64, 32, 32),
               "id": ids})  # fmt: skip
    held = []
    for i in range(40):
        b = rb.sample(2)  # 128 KiB per batch: pooled
        index = b["index"].clone()  # not pooled: what the batch must still show
        held.append((index, b) if i % 2 else (index[1:], {"frame": b["frame"][1:]}))
        if len(held) > 7:
            held.pop(0)
        for index, h in held:
            want = (index % 251).to(torch.uint8)
            assert (h["frame"].flatten(1) == want[:, None]).all()
            assert "id" not in h or torch.equal(h["id"], index)
    rb.close()


@pytest.mark.parametrize("prioritized", [False, True])
def test_a_batch_is_on_one_device_the_index_and_weights_go_where_the_rows_are(prioritized):
    """A storage on a device (a GPU; here ``meta``, which a CPU machine has) delivers its
    batches there by default (``device=None``: where the storage is), the sampler's ``index``
    and ``weight`` too: on an H100 (issue 28) a GPU TensorStorage's batch carried a host
    index, and every agent refused it ("batch['index']: expected a tensor on the learner
    device cuda")."""
    spec = Spec({"obs": Field((3,), torch.float32), "action": Field((), torch.int64)})
    sampler = PrioritizedSampler(alpha=0.6, beta=0.4) if prioritized else None
    rb = ReplayBuffer(TensorStorage(spec, 64, device="meta"), sampler=sampler, seed=0)
    rb.extend({"obs": torch.zeros(8, 3), "action": torch.zeros(8, dtype=torch.int64)})
    batch = rb.sample(4)
    assert {k: v.device.type for k, v in batch.items()} == dict.fromkeys(batch, "meta")
    assert set(batch) >= ({"index", "weight"} if prioritized else {"index"})
