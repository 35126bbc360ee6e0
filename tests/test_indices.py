"""The one index normaliser (rlstash.indices) and every caller that goes through it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlstash.indices import IndexRangeError, as_rows, normalize_index
from rlstash.replay import ReplayBuffer
from rlstash.sampler import PrioritizedSampler, SequenceSampler
from rlstash.spec import Field, Spec
from rlstash.storage import MemmapStorage, TensorStorage
from rlstash.storage.stream import StreamStorage
from rlstash.storage.tiered import TieredStorage

CAP = 8


@pytest.mark.parametrize(
    "index, want",
    [
        (np.array([0, 7, 3]), [0, 7, 3]),
        ([1, 2], [1, 2]),
        (np.array([1, 2], dtype=np.uint8), [1, 2]),
        (np.array([1, 2], dtype=np.int32), [1, 2]),
        (torch.tensor([5, 6]), [5, 6]),
        (np.array([1, 2], dtype=object), [1, 2]),
        ([], []),
        (slice(2, 5), [2, 3, 4]),
        (slice(None), list(range(CAP))),
    ],
)
def test_integer_rows_become_int64(index, want):
    out = as_rows(index, CAP)
    assert out.dtype == np.int64 and out.tolist() == want


def test_shape_is_kept_and_int64_arrays_are_not_copied():
    idx = np.arange(6, dtype=np.int64).reshape(2, 3)
    assert as_rows(idx, CAP) is idx
    with pytest.raises(TypeError, match=r"1-D integer array of rows, got shape \[2, 3\]"):
        normalize_index(idx, CAP)
    assert normalize_index(slice(1, 4), CAP) == (slice(1, 4), 3)


@pytest.mark.parametrize(
    "index, err, text",
    [
        ([0.7, 2.9], TypeError, r"got float64 values \[0\.7, 2\.9\]; rows are integers"),
        (torch.tensor([1.0], dtype=torch.bfloat16), TypeError, r"bfloat16 values \[1\.0\]"),
        ([float("nan"), 1.0], TypeError, r"values \[nan, 1\.0\]"),
        ([True], TypeError, r"bool values \[True\].*flatnonzero"),
        (["a"], TypeError, r"<U1 values \['a'\]"),
        ([0, "a", None], TypeError, "object values"),
        ([[0, 1], [2]], TypeError, "integer row indices"),
        ([2**63], IndexRangeError, r"\[0, 8\).*\[9223372036854775808\]"),
        ([2**100], IndexRangeError, str(2**100)),
        ([-(2**70), 0], IndexRangeError, str(-(2**70))),
        (np.array([-1, 3, 9]), IndexRangeError, r"2 of 3 outside: \[-1, 9\]"),
        (np.arange(100), IndexRangeError, r"92 of 100 outside: \[8, 9, 10, 11, 12\] \.\.\."),
        (slice(0, 9), IndexRangeError, "0 <= start <= stop <= 8"),
        (slice(-1, 3), IndexRangeError, "got slice\\(-1, 3, None\\)"),
        (slice(0, 4, 2), IndexRangeError, "step 1"),
        (slice(0.5, 3), IndexRangeError, "integers"),
    ],
)
def test_bad_indices_name_what_came(index, err, text):
    with pytest.raises(err, match=text):
        as_rows(index, CAP, "index")


def test_range_error_is_both_index_and_value_error():
    assert issubclass(IndexRangeError, IndexError) and issubclass(IndexRangeError, ValueError)


SPEC = Spec({"obs": Field((2,), torch.float32), "action": Field((), torch.int64)})


def _stream():
    s = StreamStorage(SPEC, num_envs=2, capacity=CAP)
    for _ in range(3):
        s.extend(
            {
                "obs": torch.zeros(2, 2),
                "action": torch.zeros(2, dtype=torch.int64),
                "reward": torch.zeros(2),
                "terminated": torch.zeros(2, dtype=torch.bool),
                "truncated": torch.zeros(2, dtype=torch.bool),
            }
        )
    return s


def _callers(tmp_path):
    """Every place that takes row indices from a user, as a one-argument call."""
    batch = {"obs": torch.zeros(2, 2), "action": torch.zeros(2, dtype=torch.int64)}
    ram = TensorStorage(SPEC, CAP)
    disk = MemmapStorage(SPEC, CAP, tmp_path / "disk")
    tiered = TieredStorage(TensorStorage(SPEC, 4), TensorStorage(SPEC, CAP))
    stream = _stream()
    prio = PrioritizedSampler()
    prio.reset(CAP)
    seq = SequenceSampler(2)
    seq.reset(CAP)
    rb = ReplayBuffer(TensorStorage(SPEC, CAP), PrioritizedSampler())
    rb.extend({"obs": torch.zeros(CAP, 2), "action": torch.zeros(CAP, dtype=torch.int64)})
    flags = {"terminated": np.zeros(2, bool)}
    return {
        "TensorStorage.write": lambda i: ram.write(i, batch),
        "TensorStorage.read": ram.read,
        "MemmapStorage.write": lambda i: disk.write(i, batch),
        "TieredStorage.write": lambda i: tiered.write(i, batch),
        "TieredStorage.read": tiered.read,
        "StreamStorage.step_flags": stream.step_flags,
        "PrioritizedSampler.on_write": lambda i: prio.on_write(i, {}),
        "PrioritizedSampler.priorities": prio.priorities,
        "SequenceSampler.on_write": lambda i: seq.on_write(i, flags),
        "ReplayBuffer.update_priorities": lambda i: rb.update_priorities(i, [1.0, 1.0]),
    }, (ram, disk, tiered, stream, rb)


CALLERS = [
    "TensorStorage.write",
    "TensorStorage.read",
    "MemmapStorage.write",
    "TieredStorage.write",
    "TieredStorage.read",
    "StreamStorage.step_flags",
    "PrioritizedSampler.on_write",
    "PrioritizedSampler.priorities",
    "SequenceSampler.on_write",
    "ReplayBuffer.update_priorities",
]


@pytest.mark.parametrize("caller", CALLERS)
def test_every_caller_refuses_float_bool_and_out_of_range_rows_alike(tmp_path, caller):
    callers, owned = _callers(tmp_path)
    assert sorted(callers) == sorted(CALLERS)
    call = callers[caller]
    try:
        with pytest.raises(TypeError, match=r"float64 values \[0\.7, 2\.9\]"):
            call(np.array([0.7, 2.9]))
        with pytest.raises(TypeError, match=r"bool values \[True, False\]"):
            call(torch.tensor([True, False]))
        with pytest.raises(IndexRangeError, match=r"\[0, 8\) \(the capacity\).*\[8\]"):
            call(np.array([1, 8]))
    finally:
        for o in owned:
            o.close()
