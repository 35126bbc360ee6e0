"""SumMinTree against a brute-force numpy reference (sums, minima, search by mass, updates)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlstash.sampler.sumtree import SumMinTree, last_write_wins

# (capacity, branching, max_top): depth 0 (top only), 1, 2 and 3 with ragged padding
LAYOUTS = [(5, 8, 8), (37, 8, 8), (100, 8, 4), (1000, 8, 2), (300, 16, 4), (129, 32, 2)]


def reference_find(leaves: np.ndarray, u: np.ndarray) -> np.ndarray:
    """The leaf whose cumulative interval [cum[i] - v[i], cum[i]) holds u * total."""
    cum = np.cumsum(leaves)
    return np.searchsorted(cum, u * cum[-1], side="right")


def check_against(tree: SumMinTree, ref: np.ndarray, rng: np.random.Generator) -> None:
    np.testing.assert_array_equal(tree.leaves, ref)
    assert tree.total() == pytest.approx(ref.sum(), rel=1e-12, abs=1e-300)
    positive = ref[ref > 0]
    assert tree.min_positive() == (positive.min() if positive.size else np.inf)
    assert tree.count_positive() == positive.size
    if not positive.size:
        with pytest.raises(ValueError, match="every leaf is 0"):
            tree.find(np.array([0.5]))
        return
    u = np.concatenate([rng.random(64), [0.0, np.nextafter(1.0, 0.0)]])
    idx, value = tree.find(u)
    assert idx.dtype == np.int64 and idx.shape == u.shape
    assert (ref[idx] > 0).all(), "a leaf of mass 0 was returned"
    np.testing.assert_array_equal(value, ref[idx])
    # same leaf as the exact reference, up to float rounding at interval boundaries
    cum = np.cumsum(ref)
    t = u * cum[-1]
    tol = 1e-9 * cum[-1]
    assert (cum[idx] - ref[idx] <= t + tol).all() and (t < cum[idx] + tol).all()
    agree = idx == reference_find(ref, u)
    assert agree.mean() > 0.9


@pytest.mark.parametrize("capacity,branching,max_top", LAYOUTS)
def test_random_updates_match_reference(capacity, branching, max_top):
    rng = np.random.default_rng(capacity)
    tree = SumMinTree(capacity, branching, max_top)
    ref = np.zeros(capacity)
    for _ in range(40):
        n = int(rng.integers(1, 2 * capacity))
        idx = rng.integers(0, capacity, n)  # with duplicates
        values = rng.random(n) * 10.0 ** rng.integers(-3, 4)
        values[rng.random(n) < 0.3] = 0.0  # some leaves go back to 0
        tree.set(idx, values)
        for i, v in zip(idx, values):  # sequential writes: the last one wins
            ref[i] = v
        check_against(tree, ref, rng)


@settings(max_examples=60, deadline=None)
@given(
    layout=st.sampled_from(LAYOUTS),
    ops=st.lists(
        st.tuples(
            st.lists(st.integers(0, 10**6), min_size=1, max_size=40),
            st.lists(st.sampled_from([0.0, 1e-9, 0.5, 1.0, 3.0, 1e6]), min_size=1, max_size=40),
        ),
        min_size=1,
        max_size=8,
    ),
    seed=st.integers(0, 2**32 - 1),
)
def test_property_ops_match_reference(layout, ops, seed):
    capacity, branching, max_top = layout
    tree = SumMinTree(capacity, branching, max_top)
    ref = np.zeros(capacity)
    rng = np.random.default_rng(seed)
    for raw_idx, raw_values in ops:
        n = min(len(raw_idx), len(raw_values))
        idx = np.array(raw_idx[:n]) % capacity
        values = np.array(raw_values[:n])
        tree.set(idx, values)
        for i, v in zip(idx, values):
            ref[i] = v
        check_against(tree, ref, rng)


def test_last_write_wins_keeps_the_last_value_per_index():
    idx, values = last_write_wins(np.array([5, 1, 5, 3, 1, 5]), np.array([1, 2, 3, 4, 5, 6.0]))
    np.testing.assert_array_equal(idx, [1, 3, 5])
    np.testing.assert_array_equal(values, [5.0, 4.0, 6.0])
    tree = SumMinTree(8)
    tree.set(np.array([2, 2, 2]), np.array([7.0, 0.0, 4.0]))
    assert tree.leaves[2] == 4.0 and tree.total() == 4.0


def test_never_returns_an_empty_leaf_at_the_edges():
    capacity = 1000
    tree = SumMinTree(capacity, 8, 4)  # depth 3
    values = np.zeros(capacity)
    values[[3, 500, 517]] = [1e-12, 2.0, 1e-300]  # tiny masses next to long runs of zeros
    tree.fill(values)
    u = np.concatenate([np.linspace(0, 1, 2001, endpoint=False), [np.nextafter(1.0, 0.0)]])
    idx, _ = tree.find(u)
    assert set(idx.tolist()) <= {3, 500, 517}
    values[517] = 1.0  # the last positive leaf takes the very end of the mass
    tree.fill(values)
    assert tree.find(np.array([np.nextafter(1.0, 0.0)]))[0][0] == 517


def test_rounding_overflow_is_guarded():
    """Inner sums slightly larger than their children (rounding) never lead to an empty leaf."""
    capacity = 512
    tree = SumMinTree(capacity, 8, 8)  # depth 2: top (8) -> 64 -> 512 leaves
    values = np.zeros(capacity)
    values[::7] = 1.0
    tree.fill(values)
    for d in range(tree.depth):  # inflate every inner node, as if sums had rounded up
        tree._sum[d] *= 1 + 1e-6
    u = np.linspace(0, 1, 4096, endpoint=False)
    idx, value = tree.find(u)
    assert (values[idx] > 0).all() and (value > 0).all()
    np.testing.assert_array_equal(value, values[idx])


def test_rounding_into_an_empty_subtree_searches_again(monkeypatch):
    """An unguarded level can pick an empty child; the leaf check then searches again."""
    tree = SumMinTree(512, 8, 8)
    values = np.where(np.arange(512) % 64 < 20, 1.0, 0.0)  # each top node: last children empty
    tree.fill(values)
    tree._sum[0] *= 1.25  # top sums too large (as if rounded up): targets overflow
    guarded = []
    search = tree._search
    monkeypatch.setattr(tree, "_search", lambda u, guard: guarded.append(guard) or search(u, guard))
    idx, value = tree.find(np.linspace(0, 1, 4096, endpoint=False))
    assert guarded == [False, True]
    assert (values[idx] > 0).all()
    np.testing.assert_array_equal(value, values[idx])


def test_fill_and_incremental_updates_agree():
    rng = np.random.default_rng(0)
    values = rng.random(5000)
    a, b = SumMinTree(5000, 8, 16), SumMinTree(5000, 8, 16)
    a.fill(values)
    for chunk in np.array_split(rng.permutation(5000), 37):
        b.set(chunk, values[chunk])
    assert a.total() == pytest.approx(b.total(), rel=1e-12)
    assert a.min_positive() == b.min_positive()
    u = rng.random(512)
    np.testing.assert_array_equal(a.find(u)[0], b.find(u)[0])


def test_state_dict_roundtrip_is_bit_identical():
    rng = np.random.default_rng(1)
    tree = SumMinTree(3000, 8, 16)
    for _ in range(20):
        idx = rng.integers(0, 3000, 256)
        tree.set(idx, rng.random(256))
    other = SumMinTree(3000, 8, 16)
    other.load_state_dict(tree.state_dict())
    u = rng.random(1000)
    np.testing.assert_array_equal(tree.find(u)[0], other.find(u)[0])
    assert tree.total() == other.total() and tree.min_positive() == other.min_positive()
    with pytest.raises(ValueError, match="capacity, branching, top"):
        SumMinTree(3001, 8, 16).load_state_dict(tree.state_dict())


@pytest.mark.filterwarnings("ignore:overflow encountered")
def test_overflowing_total_is_an_error():
    tree = SumMinTree(4)
    tree.set(np.arange(4), np.full(4, 1e308))
    with pytest.raises(ValueError, match="overflowed"):
        tree.find(np.array([0.5]))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"capacity": 0}, "capacity"),
        ({"capacity": True}, "capacity"),
        ({"capacity": 10, "branching": 12}, "branching"),
        ({"capacity": 10, "branching": 4}, "branching"),
        ({"capacity": 10, "max_top": 0}, "max_top"),
    ],
)
def test_bad_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SumMinTree(**kwargs)


def test_fill_checks_shape():
    with pytest.raises(ValueError, match=r"expected shape \[10\]"):
        SumMinTree(10).fill(np.zeros(11))


def test_minimum_is_tracked_through_ties_zeros_and_overwrites():
    tree = SumMinTree(64, 8, 2)
    ref = np.zeros(64)

    def put(idx, values):
        tree.set(np.array(idx), np.array(values, dtype=float))
        ref[idx] = values
        positive = ref[ref > 0]
        assert tree.min_positive() == (positive.min() if positive.size else np.inf)

    put(list(range(64)), [1.0] * 64)  # 64 leaves share the minimum
    put([0, 1, 2], [5.0, 5.0, 5.0])  # three of them raised: 61 left
    put(list(range(3, 63)), [2.0] * 60)  # one left
    put([63], [3.0])  # the last one raised: the minimum is looked up again
    put([5, 6], [0.5, 0.0])  # a new, lower minimum; a zero takes no part
    put([5], [0.0])  # its only holder set to 0
    put(list(range(64)), [0.0] * 64)
    put([7, 7, 9], [1e-300, 4.0, 1e-300])  # last write wins per leaf


def test_state_of_an_older_version_with_minima_still_loads():
    tree = SumMinTree(100, 8, 4)
    tree.set(np.arange(100), np.linspace(1.0, 2.0, 100))
    state = tree.state_dict()
    state["min"] = [np.zeros(4), np.zeros(32)]  # the min levels older versions saved
    other = SumMinTree(100, 8, 4)
    other.load_state_dict(state)
    assert other.min_positive() == 1.0 and other.total() == tree.total()
