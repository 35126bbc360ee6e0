"""Samplers: distributions, validity masks, epochs, windows, errors and state round trips."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlstash.core import SampleContext, Sampler
from rlstash.sampler import PrioritizedSampler, SequenceSampler, UniformSampler


def ctx_for(capacity, size=None, cursor=None, seed=0, valid=None):
    size = capacity if size is None else size
    cursor = (size % capacity) if cursor is None else cursor
    return SampleContext(size, cursor, capacity, np.random.default_rng(seed), valid)


def chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def prioritized(capacity, rows=None, **kwargs):
    s = PrioritizedSampler(**kwargs)
    s.reset(capacity)
    s.on_write(slice(0, capacity if rows is None else rows), {})
    return s


@pytest.mark.parametrize(
    "sampler",
    [UniformSampler(), UniformSampler(False), PrioritizedSampler(), SequenceSampler(3)],
)
def test_samplers_follow_the_protocol(sampler):
    assert isinstance(sampler, Sampler)


# ------------------------------------------------------------------------------- uniform
def test_uniform_with_replacement_is_seeded_and_in_range():
    s = UniformSampler()
    s.reset(100)
    a, extra = s.sample(256, ctx_for(100, size=40, seed=3))
    b, _ = s.sample(256, ctx_for(100, size=40, seed=3))
    assert a.dtype == np.int64 and a.shape == (256,) and extra == {}
    assert a.min() >= 0 and a.max() < 40
    np.testing.assert_array_equal(a, b)


def test_uniform_with_mask_returns_only_valid_rows_uniformly():
    capacity = 50
    valid = np.zeros(capacity, bool)
    valid[[1, 7, 8, 20, 33, 49]] = True
    s = UniformSampler()
    s.reset(capacity)
    ctx = ctx_for(capacity, size=40, valid=valid)  # row 49 is valid but not stored
    idx = np.concatenate([s.sample(256, ctx)[0] for _ in range(200)])
    assert set(idx.tolist()) == {1, 7, 8, 20, 33}
    counts = np.bincount(idx, minlength=capacity)[[1, 7, 8, 20, 33]]
    assert chi_square(counts, np.full(5, 0.2)) < 25  # df = 4


def test_uniform_with_a_sparse_mask_falls_back_exactly():
    capacity = 100_000
    valid = np.zeros(capacity, bool)
    valid[12_345] = True  # rejection almost always fails: the exact fallback must be used
    s = UniformSampler()
    s.reset(capacity)
    idx, _ = s.sample(64, ctx_for(capacity, valid=valid))
    assert (idx == 12_345).all()
    with pytest.raises(ValueError, match="none of the 100000 stored rows is valid"):
        s.sample(8, ctx_for(capacity, valid=np.zeros(capacity, bool)))


def test_uniform_on_a_partly_filled_buffer_never_scans_the_capacity(monkeypatch):
    """A stream buffer of 100,000 slots filled to 25% (a run shorter than the buffer): the
    rejected draws are refilled by draws, never by an O(capacity) scan of the mask (before,
    8 rounds of redraws then a scan in nearly every batch: ~4x SB3's sampling time)."""
    capacity = 100_000
    valid = np.zeros(capacity, bool)
    valid[:25_000] = True
    valid[::200] = False  # episode ends
    scans = []
    flatnonzero = np.flatnonzero

    def counting(a):
        scans.append(np.size(a) >= capacity)
        return flatnonzero(a)

    monkeypatch.setattr(np, "flatnonzero", counting)
    s = UniformSampler()
    s.reset(capacity)
    ctx = ctx_for(capacity, valid=valid)
    idx = np.concatenate([s.sample(64, ctx)[0] for _ in range(300)])
    assert not any(scans)
    assert valid[idx].all()
    # uniform over the valid rows: 5 blocks of 5,000 rows (each with 25 episode ends)
    counts = np.bincount(idx // 5_000, minlength=5)
    assert chi_square(counts, np.full(5, 0.2)) < 25  # df = 4


def test_uniform_with_few_valid_rows_draws_each_exactly_uniformly():
    """Valid rows spread thinly (every 1,000th of 100,000): bulk redraws, then the exact
    scan; both give each valid row the same probability."""
    capacity = 100_000
    valid = np.zeros(capacity, bool)
    valid[::1_000] = True
    s = UniformSampler()
    s.reset(capacity)
    ctx = ctx_for(capacity, valid=valid)
    idx = np.concatenate([s.sample(256, ctx)[0] for _ in range(80)])
    assert valid[idx].all()
    counts = np.bincount(idx // 1_000, minlength=100)
    assert chi_square(counts, np.full(100, 0.01)) < 180  # df = 99: p ~ 1e-6


def test_empty_buffer_is_a_clear_error():
    for s in (UniformSampler(), UniformSampler(False), PrioritizedSampler(), SequenceSampler(2)):
        s.reset(10)
        with pytest.raises(ValueError, match="cannot sample from an empty buffer"):
            s.sample(4, ctx_for(10, size=0))


@pytest.mark.parametrize("n,batch", [(12, 4), (10, 3), (7, 7)])
def test_without_replacement_epochs_cover_every_row_once(n, batch):
    s = UniformSampler(replacement=False)
    s.reset(16)
    ctx = ctx_for(16, size=n, seed=5)
    batches = [s.sample(batch, ctx)[0] for _ in range(3 * n)]  # exactly 3 * batch epochs
    for b in batches:
        assert b.size == batch and np.unique(b).size == batch  # never a repeat in a batch
    drawn = np.concatenate(batches)
    for e in range(batch * 3):
        epoch = drawn[e * n : (e + 1) * n]
        assert sorted(epoch.tolist()) == list(range(n)), f"epoch {e} is not a permutation"
    assert s.epoch == 3 * batch


def test_without_replacement_skips_invalid_and_refuses_large_batches():
    s = UniformSampler(replacement=False)
    s.reset(20)
    valid = np.ones(20, bool)
    valid[::2] = False
    ctx = ctx_for(20, valid=valid)
    first, _ = s.sample(4, ctx)
    assert (first % 2 == 1).all()
    valid[1::4] = False  # rows become invalid mid-epoch: they are skipped
    rest = np.concatenate([s.sample(1, ctx)[0] for _ in range(6)])
    assert valid[rest].all()
    state = s.state_dict()
    with pytest.raises(ValueError, match=r"batch_size: 6 is more than the 5 rows available"):
        s.sample(6, ctx)
    after = s.state_dict()
    np.testing.assert_array_equal(after["perm"], state["perm"])
    assert after["pos"] == state["pos"] and after["epoch"] == state["epoch"]


def test_uniform_state_dict_roundtrip_gives_identical_samples():
    s = UniformSampler(replacement=False)
    s.reset(30)
    ctx = ctx_for(30, seed=9)
    for _ in range(4):
        s.sample(7, ctx)
    other = UniformSampler(replacement=False)
    other.reset(30)
    other.load_state_dict(s.state_dict())
    rng_state = ctx.rng.bit_generator.state
    a = [s.sample(7, ctx)[0] for _ in range(10)]
    ctx.rng.bit_generator.state = rng_state
    b = [other.sample(7, ctx)[0] for _ in range(10)]
    np.testing.assert_array_equal(np.concatenate(a), np.concatenate(b))
    with pytest.raises(ValueError, match="replacement"):
        UniformSampler(True).load_state_dict({**s.state_dict(), "capacity": 0})


@pytest.mark.parametrize(
    "call,error,match",
    [
        (lambda s: s.sample(0, ctx_for(10)), ValueError, "batch_size: expected >= 1"),
        (lambda s: s.sample(2.0, ctx_for(10)), TypeError, "batch_size: expected an int"),
        (lambda s: s.sample(True, ctx_for(10)), TypeError, "batch_size"),
        (lambda s: s.sample(2, ctx_for(11)), ValueError, "ctx.capacity"),
        (lambda s: s.sample(2, SampleContext(11, 0, 10, None)), ValueError, "ctx.size"),
        (lambda s: s.sample(2, ctx_for(10, valid=np.ones(10, np.uint8))), ValueError, "ctx.valid"),
        (lambda s: s.sample(2, ctx_for(10, valid=np.ones(9, bool))), ValueError, r"bool\[10\]"),
    ],
)
def test_bad_sample_arguments(call, error, match):
    s = UniformSampler()
    s.reset(10)
    with pytest.raises(error, match=match):
        call(s)


def test_sampling_before_reset_is_an_error():
    with pytest.raises(RuntimeError, match="reset"):
        UniformSampler().sample(2, ctx_for(10))
    with pytest.raises(RuntimeError, match="reset"):
        PrioritizedSampler().update_priorities([0], [1.0])


# --------------------------------------------------------------------------- prioritized
def test_prioritized_distribution_matches_priorities():
    capacity, alpha = 64, 0.7
    rng = np.random.default_rng(0)
    p = rng.random(capacity) * 5
    s = prioritized(capacity, alpha=alpha, eps=0.01)
    s.update_priorities(np.arange(capacity), p)
    ctx = ctx_for(capacity, seed=1)
    counts = np.zeros(capacity)
    for _ in range(400):
        idx, _ = s.sample(256, ctx)
        counts += np.bincount(idx, minlength=capacity)
    q = (p + 0.01) ** alpha
    stat = chi_square(counts, q / q.sum())
    assert stat < 63 + 6 * np.sqrt(2 * 63), stat  # df = 63; stratification only lowers it


def test_prioritized_batch_is_stratified_and_seeded():
    s = prioritized(1000)
    s.update_priorities(np.arange(1000), np.random.default_rng(0).random(1000))
    a, wa = s.sample(128, ctx_for(1000, seed=4))
    b, wb = s.sample(128, ctx_for(1000, seed=4))
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(wa["weight"], wb["weight"])
    assert (np.diff(a) >= 0).all()  # one draw per segment of the cumulative mass
    assert a.dtype == np.int64 and wa["weight"].dtype == np.float32


def test_importance_weights_match_the_formula():
    capacity, alpha, beta, eps = 40, 0.6, 0.4, 1e-6
    rng = np.random.default_rng(2)
    s = prioritized(capacity, rows=30, alpha=alpha, beta=beta, eps=eps)
    p = rng.random(30) * 3
    s.update_priorities(np.arange(30), p)
    valid = np.ones(capacity, bool)
    valid[[4, 9]] = False
    idx, extra = s.sample(64, ctx_for(capacity, size=30, valid=valid))
    stored = np.flatnonzero(valid[:30])  # the N rows that can be sampled
    q = (p + eps) ** alpha
    P = q[stored] / q[stored].sum()
    N = stored.size
    w_all = (N * P) ** -beta
    expected = ((N * (q[idx] / q[stored].sum())) ** -beta) / w_all.max()
    np.testing.assert_allclose(extra["weight"], expected, rtol=1e-5)
    s.beta = 1.0  # annealing changes the weights
    _, extra = s.sample(64, ctx_for(capacity, size=30, valid=valid))
    assert extra["weight"].min() < expected.min()
    with pytest.raises(ValueError, match="beta"):
        s.beta = -0.1


def test_new_rows_get_the_max_priority():
    s = prioritized(20, rows=5, alpha=0.5, eps=0.0)
    np.testing.assert_allclose(s.priorities(np.arange(5)), 1.0)  # initial max_priority
    s.update_priorities(np.array([0, 1]), np.array([9.0, 0.25]))
    s.on_write(np.array([5, 6]), {})
    np.testing.assert_allclose(s.priorities(np.array([0, 1, 5, 6])), [3.0, 0.5, 3.0, 3.0])
    s.update_priorities(np.array([2]), np.array([0.0]))  # max never decreases
    s.on_write(slice(7, 8), {})
    assert s.priorities(np.array([7]))[0] == pytest.approx(3.0)
    np.testing.assert_array_equal(s.priorities(np.array([10])), [0.0])  # never written


def test_duplicate_indices_last_write_wins_and_torch_input():
    s = prioritized(10, alpha=1.0, eps=0.0)
    s.update_priorities(
        torch.tensor([3, 3, 5, 3]), torch.tensor([1.0, 2.0, 4.0, 7.0], requires_grad=True)
    )
    np.testing.assert_allclose(s.priorities(np.array([3, 5])), [7.0, 4.0])
    assert s.max_priority == 7.0


@pytest.mark.parametrize(
    "indices,priorities,error,match",
    [
        ([0, 1], [1.0, np.nan], ValueError, r"1 bad of 2 \(first: nan\)"),
        ([0, 1, 2], [-1.0, 2.0, -3.0], ValueError, r"2 bad of 3 \(first: -1.0\)"),
        ([0], [np.inf], ValueError, "finite values >= 0"),
        ([0, 1], [1.0], ValueError, r"expected one per index \(2\), got 1"),
        ([0, 10], [1.0, 1.0], ValueError, r"rows in \[0, 10\)"),
        ([-1], [1.0], ValueError, r"rows in \[0, 10\)"),
        ([0.0], [1.0], TypeError, r"indices: expected .*integer array.*float64 values \[0\.0\]"),
        ([0], [True], TypeError, "priorities: expected a float array"),
        ([8], [1.0], ValueError, "never written"),
        ([0], ["a"], TypeError, "priorities"),
    ],
)
def test_bad_priorities_are_refused_and_change_nothing(indices, priorities, error, match):
    s = prioritized(10, rows=8)
    s.update_priorities(np.arange(8), np.arange(8.0))
    before, low = s.state_dict(), s._tree.min_positive()
    with pytest.raises(error, match=match):
        s.update_priorities(np.array(indices), np.array(priorities))
    after = s.state_dict()
    for a, b in zip(before["tree"]["sum"], after["tree"]["sum"], strict=True):
        np.testing.assert_array_equal(a, b)
    assert before["max_priority"] == after["max_priority"]
    assert s._tree.min_positive() == low


def test_invalid_rows_are_never_returned_and_keep_their_priority():
    capacity = 200
    rng = np.random.default_rng(3)
    s = prioritized(capacity, alpha=1.0, eps=0.0)
    p = rng.random(capacity) + 0.1
    s.update_priorities(np.arange(capacity), p)
    ctx = ctx_for(capacity, seed=7)
    valid = np.ones(capacity, bool)
    ctx.valid = valid  # the same array, changed in place (as a stream storage does)
    for step in range(30):
        valid[:] = rng.random(capacity) < 0.5
        idx, extra = s.sample(64, ctx)
        assert valid[idx].all()
        q = p[valid]
        np.testing.assert_allclose(extra["weight"], (p[idx] / q.min()) ** -s.beta, rtol=1e-5)
        if step % 3 == 0:  # updates while some rows are invalid are parked, not lost
            rows = rng.integers(0, capacity, 10)
            p[rows] = rng.random(10) + 0.1
            s.update_priorities(rows, p[rows])
    ctx.valid = None  # no mask: every written row is valid again
    np.testing.assert_allclose(s.priorities(np.arange(capacity)), p)
    counts = np.zeros(capacity)
    for _ in range(100):
        counts += np.bincount(s.sample(256, ctx)[0], minlength=capacity)
    assert chi_square(counts, p / p.sum()) < 199 + 6 * np.sqrt(2 * 199)
    with pytest.raises(ValueError, match="no stored row is valid"):
        s.sample(4, ctx_for(capacity, valid=np.zeros(capacity, bool)))


def test_unwritten_rows_are_never_sampled():
    s = prioritized(100, rows=10)
    idx = np.concatenate([s.sample(32, ctx_for(100, size=10, seed=i))[0] for i in range(20)])
    assert idx.max() < 10


def test_prioritized_state_dict_roundtrip_gives_identical_samples():
    capacity = 500
    s = prioritized(capacity, rows=400)
    rng = np.random.default_rng(0)
    valid = np.ones(capacity, bool)
    valid[::11] = False
    ctx = ctx_for(capacity, size=400, valid=valid, seed=3)
    for _ in range(5):
        idx, _ = s.sample(32, ctx)
        s.update_priorities(idx, rng.random(32))
    other = PrioritizedSampler()
    other.reset(capacity)
    other.load_state_dict(s.state_dict())
    rng_state = ctx.rng.bit_generator.state
    a = [s.sample(32, ctx) for _ in range(5)]
    ctx.rng.bit_generator.state = rng_state
    b = [other.sample(32, ctx) for _ in range(5)]
    for (ia, ea), (ib, eb) in zip(a, b):
        np.testing.assert_array_equal(ia, ib)
        np.testing.assert_array_equal(ea["weight"], eb["weight"])
    with pytest.raises(ValueError, match="capacity"):
        big = PrioritizedSampler()
        big.reset(501)
        big.load_state_dict(s.state_dict())
    with pytest.raises(ValueError, match="'prioritized' sampler state"):
        other.load_state_dict(UniformSampler().state_dict())


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"alpha": -1}, "alpha"),
        ({"eps": float("nan")}, "eps"),
        ({"max_priority": 0.0}, "max_priority: expected a finite number > 0"),
        ({"beta": "x"}, "beta: expected a number"),
        ({"branching": 10}, "branching: expected a power of two"),
    ],
)
def test_prioritized_bad_arguments(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        PrioritizedSampler(**kwargs)


def test_large_prioritized_buffer_smoke():
    capacity = 1_000_000
    s = prioritized(capacity)
    ctx = ctx_for(capacity)
    rng = np.random.default_rng(0)
    for _ in range(20):
        idx, extra = s.sample(256, ctx)
        s.update_priorities(idx, rng.random(256))
    assert idx.max() < capacity and (extra["weight"] <= 1).all()


# ------------------------------------------------------------------------------ sequence
def brute_force_starts(ends, valid, size, cursor, capacity, length):
    """Every start whose window stays in stored rows, one write era and one episode."""
    oldest = cursor if size == capacity else 0
    starts = set()
    for a in range(size - length + 1):
        rows = [(oldest + a + j) % capacity for j in range(length)]
        if any(ends[r] for r in rows[:-1]):
            continue
        if valid is not None and not all(valid[r] for r in rows):
            continue
        starts.add(rows[0])
    return starts


def sequence_sampler(capacity, length, ends):
    s = SequenceSampler(length)
    s.reset(capacity)
    s.on_write(slice(0, capacity), {"terminated": torch.from_numpy(ends)})
    return s


@settings(max_examples=80, deadline=None)
@given(
    capacity=st.integers(4, 40),
    length=st.integers(1, 6),
    data=st.data(),
)
def test_windows_match_brute_force_enumeration(capacity, length, data):
    length = min(length, capacity)
    ends = np.array(data.draw(st.lists(st.booleans(), min_size=capacity, max_size=capacity)))
    size = data.draw(st.integers(length, capacity))
    cursor = data.draw(st.integers(0, capacity - 1)) if size == capacity else size % capacity
    use_mask = data.draw(st.booleans())
    valid = np.array(data.draw(st.lists(st.booleans(), min_size=capacity, max_size=capacity)))
    valid = valid | (np.arange(capacity) % 3 == 0) if use_mask else None
    s = sequence_sampler(capacity, length, ends)
    ctx = SampleContext(size, cursor, capacity, np.random.default_rng(0), valid)
    expected = brute_force_starts(ends, valid, size, cursor, capacity, length)
    if not expected:
        with pytest.raises(ValueError, match="cannot sample windows"):
            s.sample(8, ctx)
        return
    idx, extra = s.sample(400, ctx)
    assert idx.shape == (400, length) and idx.dtype == np.int64 and extra == {}
    np.testing.assert_array_equal(idx, (idx[:, :1] + np.arange(length)) % capacity)
    assert set(idx[:, 0].tolist()) <= expected
    if len(expected) <= 10:  # small sets: uniform draws reach every valid start
        assert set(idx[:, 0].tolist()) == expected


def test_windows_never_cross_the_cursor_when_full():
    capacity, length = 10, 4
    s = sequence_sampler(capacity, length, np.zeros(capacity, bool))
    ctx = SampleContext(capacity, 6, capacity, np.random.default_rng(0))  # oldest row is 6
    idx, _ = s.sample(500, ctx)
    ages = (idx - 6) % capacity  # position in write order, 0 = oldest
    assert (np.diff(ages, axis=1) == 1).all()  # no window jumps from row 5 (newest) to 6
    assert {int(r[0]) for r in idx} == {6, 7, 8, 9, 0, 1, 2}  # wraps the ring, not the cursor


def test_many_rejections_use_the_exact_fallback():
    capacity, length = 10_000, 5
    ends = np.ones(capacity, bool)  # every step ends an episode ...
    ends[5000:5004] = False  # ... except one window's worth
    s = sequence_sampler(capacity, length, ends)
    idx, _ = s.sample(64, ctx_for(capacity))
    assert (idx[:, 0] == 5000).all()


def test_sequence_on_write_tracks_overwrites_and_checks_flags():
    s = SequenceSampler(3, end_keys=("terminated", "truncated"))
    s.reset(8)
    s.on_write(
        slice(0, 8), {"terminated": np.zeros(8, bool), "truncated": np.eye(1, 8, 2, dtype=bool)[0]}
    )
    assert s.state_dict()["ends"].tolist() == [False, False, True] + [False] * 5
    s.on_write(np.array([1, 2]), {"terminated": torch.tensor([True, False])})  # overwrite
    assert s.state_dict()["ends"][:3].tolist() == [False, True, False]
    before = s.state_dict()["ends"].copy()
    with pytest.raises(ValueError, match="needs at least one of the end flags"):
        s.on_write(slice(0, 2), {"reward": np.zeros(2)})
    with pytest.raises(ValueError, match=r"field 'terminated': expected shape \[2\]"):
        s.on_write(slice(0, 2), {"terminated": np.zeros(3, bool)})
    with pytest.raises(TypeError, match="bool or integer flags"):
        s.on_write(slice(0, 2), {"terminated": np.zeros(2)})
    with pytest.raises(ValueError, match="index"):
        s.on_write(np.array([7, 8]), {"terminated": np.zeros(2, bool)})
    np.testing.assert_array_equal(s.state_dict()["ends"], before)


def test_sequence_errors_and_state_roundtrip():
    with pytest.raises(ValueError, match="length"):
        SequenceSampler(0)
    with pytest.raises(ValueError, match="longer than the buffer"):
        SequenceSampler(5).reset(4)
    s = sequence_sampler(20, 3, np.arange(20) % 5 == 4)
    with pytest.raises(ValueError, match="only 2 rows are stored"):
        s.sample(4, ctx_for(20, size=2))
    other = SequenceSampler(3)
    other.reset(20)
    other.load_state_dict(s.state_dict())
    a, _ = s.sample(50, ctx_for(20, seed=1))
    b, _ = other.sample(50, ctx_for(20, seed=1))
    np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="length"):
        wrong = SequenceSampler(4)
        wrong.reset(20)
        wrong.load_state_dict(s.state_dict())


def test_priorities_that_overflow_after_alpha_are_refused():
    s = prioritized(4, alpha=2.0)
    with pytest.raises(ValueError, match="overflows float64"):
        s.update_priorities(np.array([0]), np.array([1e200]))
    s.update_priorities(np.array([1]), np.array([-0.0]))  # negative zero is zero
    s.update_priorities(np.array([1, 2]), np.array([3, 4], dtype=np.int32))  # integers are fine
    np.testing.assert_allclose(s.priorities(np.array([1, 2])), [9.0, 16.0], rtol=1e-5)


@pytest.mark.parametrize("strided", [False, True])
def test_mask_changes_in_the_tail_and_strided_masks(strided):
    capacity = 203  # not a multiple of 8: the last 3 rows are compared one by one
    s = prioritized(capacity, alpha=1.0, eps=0.0)
    backing = np.ones(2 * capacity, bool)
    valid = backing[::2] if strided else backing[:capacity]
    ctx = ctx_for(capacity, valid=valid)
    for rows in ([200, 201, 202], [0, 7, 8, 202], list(range(195, 203))):
        valid[:] = True
        valid[rows] = False
        keep = np.setdiff1d(np.arange(capacity), rows)
        for _ in range(5):
            idx, _ = s.sample(256, ctx)
            assert not np.isin(idx, rows).any()
        assert s._n_invalid == len(rows)
        np.testing.assert_array_equal(s._tree.leaves[rows], 0.0)
        np.testing.assert_array_equal(s._tree.leaves[keep], 1.0)


def lane_window(lane: int):
    """Windows that follow per-env lanes of ``lane`` consecutive rows (a ctx.window; the
    stream storage's lanes are slot-major instead, the sampler does not care)."""

    def window(starts, length):
        s = np.asarray(starts, dtype=np.int64)
        return (s // lane * lane)[:, None] + (s[:, None] % lane + np.arange(length)) % lane

    return window


@settings(max_examples=60, deadline=None)
@given(lanes=st.integers(1, 4), lane=st.integers(2, 10), length=st.integers(1, 4), data=st.data())
def test_windows_follow_ctx_window_and_match_brute_force(lanes, lane, length, data):
    capacity, length = lanes * lane, min(length, lane)
    ends = np.array(data.draw(st.lists(st.booleans(), min_size=capacity, max_size=capacity)))
    valid = np.array(data.draw(st.lists(st.booleans(), min_size=capacity, max_size=capacity)))
    size = data.draw(st.sampled_from([capacity, max(length, capacity - lane // 2)]))
    window = lane_window(lane)
    expected = set()
    for start in range(size):
        rows = window([start], length)[0]
        if rows.max() < size and not ends[rows[:-1]].any() and valid[rows].all():
            expected.add(start)
    s = sequence_sampler(capacity, length, ends)
    ctx = SampleContext(size, 0, capacity, np.random.default_rng(1), valid, window)
    if not expected:
        with pytest.raises(ValueError, match="cannot sample windows"):
            s.sample(8, ctx)
        return
    idx, _ = s.sample(300, ctx)
    np.testing.assert_array_equal(idx, window(idx[:, 0], length))  # windows stay in a lane
    assert set(idx[:, 0].tolist()) <= expected
    if len(expected) <= 8:
        assert set(idx[:, 0].tolist()) == expected


def test_bad_ctx_window_is_refused():
    s = sequence_sampler(8, 2, np.zeros(8, bool))
    bad = SampleContext(8, 0, 8, np.random.default_rng(0), None, lambda a, n: a[:, None] + 100)
    with pytest.raises(ValueError, match=r"ctx.window: expected int rows of shape \[4, 2\]"):
        s.sample(4, bad)
    bad.window = lambda a, n: a[:, None] + np.arange(n) + 100
    with pytest.raises(ValueError, match=r"ctx.window: expected rows in \[0, 8\)"):
        s.sample(4, bad)


@pytest.mark.parametrize("high", [1, 2, 3, 7, 64, 65, 1000, 2**20 + 1, 2**40 + 7])
def test_uniform_ints_are_in_range_and_uniform(high):
    from rlstash.sampler import uniform_ints

    rng = np.random.default_rng(high)
    x = uniform_ints(rng, high, 60_000)
    assert x.dtype == np.int64 and x.shape == (60_000,)
    assert x.min() >= 0 and x.max() < high
    if high == 1:
        assert not x.any()
    elif high <= 1000:  # chi-square with high - 1 degrees of freedom, far tail
        counts = np.bincount(x, minlength=high)
        assert chi_square(counts, np.full(high, 1 / high)) < high + 8 * np.sqrt(2 * high) + 30
    else:  # top and bottom halves, and both ends reached
        assert abs((x < high // 2).mean() - (high // 2) / high) < 0.01
    again = uniform_ints(np.random.default_rng(high), high, 60_000)
    np.testing.assert_array_equal(x, again)  # a function of the generator's state


def test_update_priorities_of_sorted_batches_with_repeats():
    """Sampled indices come sorted, often with repeats: the last priority per row wins."""
    s = prioritized(10, alpha=1.0, eps=0.0)
    s.update_priorities(np.array([1, 1, 4, 4, 4, 9]), np.array([5.0, 1.0, 2.0, 3.0, 7.0, 2.5]))
    np.testing.assert_allclose(s.priorities(np.array([1, 4, 9])), [1.0, 7.0, 2.5])
    assert s.max_priority == 7.0
    s.update_priorities(np.array([0, 2, 3]), np.array([0.5, 0.25, 4.0], dtype=np.float32))
    np.testing.assert_allclose(s.priorities(np.array([0, 2, 3])), [0.5, 0.25, 4.0])
    with pytest.raises(ValueError, match=r"first: -1.0"):
        s.update_priorities(np.array([0, 2]), np.array([-1.0, 1.0], dtype=np.float32))
    with pytest.raises(ValueError, match="nan"):
        s.update_priorities(np.array([0, 2]), np.array([np.nan, 1.0], dtype=np.float32))
    with pytest.raises(ValueError, match=r"rows in \[0, 10\)"):
        s.update_priorities(np.array([3, 3, 10]), np.array([1.0, 1.0, 1.0]))


def test_weights_use_the_exact_minimum_after_it_is_overwritten():
    s = prioritized(8, alpha=1.0, beta=1.0, eps=0.0)
    s.update_priorities(np.arange(8), np.array([4.0, 1.0, 1.0, 2.0, 8.0, 4.0, 2.0, 8.0]))
    ctx = ctx_for(8, seed=1)
    idx, extra = s.sample(64, ctx)
    np.testing.assert_allclose(extra["weight"], 1.0 / s.priorities(idx), rtol=1e-6)
    s.update_priorities(np.array([1, 2]), np.array([3.0, 5.0]))  # both holders of the min go
    idx, extra = s.sample(64, ctx)
    np.testing.assert_allclose(extra["weight"], 2.0 / s.priorities(idx), rtol=1e-6)


# ------------------------------------------------------------------ bad indices (I8, issue 9)
def _buffer_with_priorities():
    from rlstash.replay import ReplayBuffer
    from rlstash.spec import Field, Spec
    from rlstash.storage import TensorStorage

    rb = ReplayBuffer(
        TensorStorage(Spec({"x": Field((), torch.float32)}), 10), PrioritizedSampler()
    )
    rb.extend({"x": torch.arange(5.0)})
    rb.update_priorities(np.arange(5), np.arange(1.0, 6.0))
    return rb


BAD_INDEX_TYPES = [
    ([0.7, 2.9], r"float64 values \[0\.7, 2\.9\]"),
    (np.array([0.0, 1.0]), r"float64 values \[0\.0, 1\.0\]"),
    (torch.tensor([0.5, 1.5]), r"float32 values \[0\.5, 1\.5\]"),
    ([float("nan")], r"values \[nan\]"),
    (np.array([True, False]), r"bool values \[True, False\].*flatnonzero"),
    (torch.tensor([True, False]), r"bool values \[True, False\].*flatnonzero"),
]


@pytest.mark.parametrize("index, text", BAD_INDEX_TYPES)
def test_update_priorities_refuses_float_and_bool_indices(index, text):
    rb = _buffer_with_priorities()
    before = rb.sampler.priorities(np.arange(5)).copy()
    with pytest.raises(TypeError, match=text):
        rb.update_priorities(index, np.full(len(index), 9.0))
    with pytest.raises(TypeError, match=text):
        rb.sampler.update_priorities(index, np.full(len(index), 9.0))
    np.testing.assert_array_equal(rb.sampler.priorities(np.arange(5)), before)


@pytest.mark.parametrize(
    "index, shown",
    [
        ([2**63], "9223372036854775808"),
        ([2**70], str(2**70)),
        (np.array([10**12, 1]), "1000000000000"),
        (np.array([3, -1]), r"\[-1\]"),
        (np.array([2**64 - 1], dtype=np.uint64), "18446744073709551615"),
        (torch.tensor([7, 2**40]), str(2**40)),
    ],
)
def test_update_priorities_out_of_range_shows_the_value_given(index, shown):
    rb = _buffer_with_priorities()
    before = rb.sampler.priorities(np.arange(5)).copy()
    for update in (rb.update_priorities, rb.sampler.update_priorities):
        with pytest.raises(IndexError, match=shown) as info:
            update(index, np.full(len(index), 9.0))
        assert isinstance(info.value, ValueError)  # IndexRangeError is both
        assert "[0, 10)" in str(info.value) and "-9223372036854775808" not in str(info.value)
    np.testing.assert_array_equal(rb.sampler.priorities(np.arange(5)), before)


# ------------------------------------------------- sequence sampler bound to a spec (I8)
def test_sequence_sampler_on_a_spec_without_episode_flags_is_refused_before_any_write(tmp_path):
    from rlstash.replay import ReplayBuffer
    from rlstash.spec import Field, Spec
    from rlstash.storage import MemmapStorage, TensorStorage

    spec = Spec({"obs": Field((2,), torch.float32), "reward": Field((), torch.float32)})
    storage = TensorStorage(spec, 16)
    with pytest.raises(
        ValueError, match=r"SequenceSampler needs .*'terminated', 'truncated'.*\['obs', 'reward'\]"
    ):
        ReplayBuffer(storage, SequenceSampler(3))
    disk = MemmapStorage(spec, 16, tmp_path / "d")
    with pytest.raises(ValueError, match="end_keys"):
        ReplayBuffer(disk, SequenceSampler(3))
    assert disk.size == 0  # nothing written
    disk.close()
    # a flag field that is not one bool/int per row is refused too
    bad = Spec({"obs": Field((2,), torch.float32), "terminated": Field((), torch.float32)})
    with pytest.raises(TypeError, match=r"field 'terminated'.*:float32.*bool"):
        ReplayBuffer(TensorStorage(bad, 16), SequenceSampler(3))
    bad = Spec({"obs": Field((2,), torch.float32), "terminated": Field((2,), torch.bool)})
    with pytest.raises(ValueError, match=r"field 'terminated'.*one flag per row"):
        ReplayBuffer(TensorStorage(bad, 16), SequenceSampler(3))
    # one flag is enough; a custom flag name works through end_keys
    ok = Spec({"obs": Field((2,), torch.float32), "done": Field((), torch.uint8)})
    rb = ReplayBuffer(TensorStorage(ok, 16), SequenceSampler(3, end_keys=("done",)))
    rb.extend({"obs": torch.zeros(8, 2), "done": torch.zeros(8, dtype=torch.uint8)})
    assert rb.sample(2)["obs"].shape == (2, 3, 2)
