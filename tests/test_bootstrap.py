"""BootstrapMask: k head bits per transition, packed in ceil(k/8) bytes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlstash.spec import Spec
from rlstash.storage.bootstrap import BootstrapMask
from rlstash.storage.ram import TensorStorage


@pytest.mark.parametrize("k", [1, 7, 8, 9, 20])
def test_pack_unpack_roundtrip_and_bytes_per_row(k):
    masks = BootstrapMask(k, 0.3, seed=0)
    bits = np.random.default_rng(k).random((50, k)) < 0.5
    packed = masks.pack(bits)
    assert packed.shape == (50, (k + 7) // 8) and packed.dtype == torch.uint8
    assert masks.field.row_bytes == (k + 7) // 8
    np.testing.assert_array_equal(masks.unpack(packed).numpy(), bits)
    # bit h is bit h % 8 of byte h // 8
    one = np.zeros((1, k), bool)
    one[0, k - 1] = True
    assert masks.pack(one)[0, (k - 1) // 8].item() == 1 << ((k - 1) % 8)
    assert masks.unpack(packed.reshape(5, 10, -1)).shape == (5, 10, k)  # any leading dims


def test_draw_is_bernoulli_p_and_seeded():
    a, b = BootstrapMask(10, 0.25, seed=1), BootstrapMask(10, 0.25, seed=1)
    da, db = a.draw(20_000), b.draw(20_000)
    assert torch.equal(da, db)
    rate = a.unpack(da).float().mean(0)  # [k]
    assert torch.all((rate - 0.25).abs() < 0.02), rate
    assert BootstrapMask(3, 1.0, seed=0).unpack(BootstrapMask(3, 1.0, seed=0).draw(4)).all()
    assert a.draw(0).shape == (0, 2)


def test_bad_arguments():
    with pytest.raises(ValueError, match="k"):
        BootstrapMask(0)
    with pytest.raises(ValueError, match="p"):
        BootstrapMask(4, 0.0)
    with pytest.raises(ValueError, match="p"):
        BootstrapMask(4, 1.5)
    with pytest.raises(TypeError, match="rng"):
        BootstrapMask(4, rng=np.random.RandomState(0))
    masks = BootstrapMask(10)
    with pytest.raises(ValueError, match="n"):
        masks.draw(-1)
    with pytest.raises(ValueError, match="k=10"):
        masks.pack(np.zeros((3, 9), bool))
    with pytest.raises(TypeError, match="uint8"):
        masks.unpack(torch.zeros(3, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="bytes per row"):
        masks.unpack(torch.zeros(3, 3, dtype=torch.uint8))
    with pytest.raises(KeyError, match="mask"):
        masks.transform("mask")({"obs": torch.zeros(2)})


def test_bootstrapped_dqn_heads_train_on_their_rows_through_a_replay_buffer():
    """Usage: the mask is one more stored field; a transform unpacks it; each head's loss
    averages only over the sampled rows whose bit for that head is set."""
    from rlstash.replay import ReplayBuffer

    k = 5
    masks = BootstrapMask(k, 0.5, seed=2)
    spec = Spec({"obs": ((3,), torch.float32), "td": ((), torch.float32), "mask": masks.field})
    assert spec["mask"].row_bytes == 1  # 5 heads: one byte per transition, not 5 copies
    rb = ReplayBuffer(TensorStorage(spec, 64), transforms=[masks.transform("mask")], seed=0)
    drawn = {}
    for start in range(0, 80, 8):  # wraps around: later rows overwrite earlier masks
        bits = masks.draw(8)
        idx = rb.extend(
            {"obs": torch.randn(8, 3), "td": torch.arange(start, start + 8.0), "mask": bits}
        )
        for i, b in zip(idx.tolist(), masks.unpack(bits)):
            drawn[i] = b
    out = rb.sample(128)
    m = out["mask"]  # [B, k] bool
    assert m.shape == (128, k) and m.dtype == torch.bool
    want = torch.stack([drawn[i] for i in out["index"].tolist()])
    assert torch.equal(m, want)
    td = out["td"]  # [B]
    per_head = (td[:, None] ** 2 * m).sum(0) / m.sum(0).clamp(min=1)  # [k]
    for h in range(k):
        rows = td[want[:, h]]
        assert per_head[h].item() == pytest.approx((rows**2).mean().item() if rows.numel() else 0.0)


def test_mask_as_an_extra_field_of_a_stream_storage():
    from rlstash.storage.stream import StreamStorage

    masks = BootstrapMask(12, 0.5, seed=3)
    spec = {"obs": ((2,), torch.float32), "action": ((), torch.int64), "mask": masks.field}
    store = StreamStorage(spec, 2, 16)
    drawn = []
    for t in range(6):
        bits = masks.draw(2)
        drawn.append(bits)
        store.extend({"obs": torch.full((2, 2), float(t)), "action": torch.tensor([t, t]),
                      "reward": torch.zeros(2), "terminated": torch.zeros(2, dtype=torch.bool),
                      "truncated": torch.zeros(2, dtype=torch.bool), "mask": bits})  # fmt: skip
    got = store.read(store.lanes.row(np.array([0, 0, 1]), np.array([0, 3, 0])))  # env, step
    want = torch.stack([drawn[0][0], drawn[3][0], drawn[0][1]])
    assert torch.equal(masks.unpack(got["mask"]), masks.unpack(want))
    assert store.backing.spec["mask"].row_bytes == 2
