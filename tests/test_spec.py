"""Spec and Field validation: bad input gets an error naming the field, nothing is written (I8)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlstash.replay import ReplayBuffer
from rlstash.spec import Field, Spec
from rlstash.storage import TensorStorage

SPEC = Spec(
    {
        "obs": Field((2,), torch.float32),
        "action": Field((), torch.int8),
        "count": Field((), torch.int64),
    }
)


def good(n=3):
    return {
        "obs": torch.ones(n, 2),
        "action": torch.zeros(n, dtype=torch.int8),
        "count": torch.arange(n),
    }


def test_good_batch_passes_and_safe_casts_happen():
    out = SPEC.validate({**good(), "action": np.array([1, -2, 127], dtype=np.int64)})
    assert out["action"].dtype == torch.int8 and out["action"].tolist() == [1, -2, 127]
    out = SPEC.validate({**good(), "count": np.array([1, 2, 2**63 - 1], dtype=np.uint64)})
    assert out["count"].dtype == torch.int64 and out["count"].tolist() == [1, 2, 2**63 - 1]
    out = SPEC.validate({**good(), "obs": np.ones((3, 2), dtype=np.uint32)})
    assert out["obs"].dtype == torch.float32


BAD = [
    # (field, value, error, text)
    (
        "count",
        np.array([1, 2**64 - 1, 2**63], dtype=np.uint64),
        TypeError,
        r"field 'count': 2 of 3 values do not fit int64 .*\[18446744073709551615, 9223372036854775808\]",
    ),
    (
        "action",
        np.array([300, -129, 7]),
        TypeError,
        r"field 'action': 2 of 3 values do not fit int8 \[-128, 127\]: \[300, -129\].*int16",
    ),
    (
        "action",
        torch.tensor([1, 200, 3], dtype=torch.int32),
        TypeError,
        r"field 'action': 1 of 3 values do not fit int8.*\[200\]",
    ),
    (
        "action",
        np.array([1, 2, 70000], dtype=np.uint32),
        TypeError,
        r"field 'action': 1 of 3 values do not fit int8.*\[70000\]",
    ),
    ("obs", torch.ones(3, 2, device="meta"), ValueError, r"field 'obs': .*meta tensor.*no data"),
    ("obs", torch.ones(3, 2).to_sparse(), TypeError, r"field 'obs': .*sparse_coo.*to_dense\(\)"),
    (
        "obs",
        torch.ones(3, 2).to_sparse_csr(),
        TypeError,
        r"field 'obs': .*sparse_csr.*to_dense\(\)",
    ),
    ("obs", np.ones((3, 2), dtype=">f4"), TypeError, r"field 'obs': .*byte order"),
    ("count", np.array(["2020-01-01"] * 3, dtype="M8[D]"), TypeError, r"field 'count'"),
    ("obs", np.ones((3, 2), dtype=np.complex64), TypeError, r"field 'obs'.*complex64"),
]


@pytest.mark.parametrize(
    "name, value, err, text", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)]
)
def test_bad_value_names_the_field_and_writes_nothing(name, value, err, text):
    with pytest.raises(err, match=text):
        SPEC.validate({**good(), name: value})
    rb = ReplayBuffer(TensorStorage(SPEC, 8))
    rb.extend(good(2))
    before = {k: v.clone() for k, v in rb.storage.tensors.items()}
    with pytest.raises(err, match=text):
        rb.extend({**good(), name: value})
    assert len(rb) == 2
    for k, v in rb.storage.tensors.items():
        assert torch.equal(v, before[k])


@pytest.mark.parametrize(
    "shape, text",
    [
        ((2.5,), r"shape: expected a tuple of ints.*got \(2\.5,\).*Field\(\(2,\)"),
        ((4, 2.0), r"got \(4, 2\.0\)"),
        ((True,), r"got \(True,\)"),
        (("4",), r"got \('4',\)"),
        (5, r"got 5.*Field\(\(5,\), "),
        (None, r"got None"),
    ],
)
def test_field_shape_must_be_ints(shape, text):
    with pytest.raises(TypeError, match=text):
        Field(shape, torch.float32)


def test_field_shape_accepts_int_like_dimensions():
    assert Field(torch.Size([4, 84]), "uint8").shape == (4, 84)
    assert Field((np.int64(3),), "float32").shape == (3,)
    assert Field([], "float32").shape == ()
    with pytest.raises(ValueError, match=r"shape: dimensions must be >= 0, got \(-1,\)"):
        Field((-1,), torch.float32)
