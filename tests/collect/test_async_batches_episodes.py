"""EpisodeTracker (rlstash.collect.episodes): the chunked array form of the episode returns
and lengths against the row-by-row loop it replaced, on random chunks of any size."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rlstash.collect.episodes import EpisodeTracker


def row_by_row(chunks, n: int, same_step: bool):
    """The reference: one row at a time, as Collector._track did."""
    ret, length, after = np.zeros(n), np.zeros(n, np.int64), np.zeros(n, bool)
    returns, lengths = [], []
    for rew, term, trunc in chunks:
        for t in range(len(rew)):
            live = ~after
            ret += np.where(live, rew[t], 0.0)
            length += live
            done = (term[t] | trunc[t]) & live
            for i in np.flatnonzero(done):
                returns.append(float(ret[i]))
                lengths.append(int(length[i]))
            ret[done], length[done] = 0, 0
            after = done if not same_step else np.zeros_like(done)
    return returns, lengths, ret, length


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 5),
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=5),
    end_p=st.sampled_from([0.0, 0.2, 0.6]),
    same_step=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_chunks_give_what_the_row_by_row_loop_gives(n, sizes, end_p, same_step, seed):
    rng = np.random.default_rng(seed)
    chunks = [
        (rng.integers(-3, 4, (t, n)).astype(float), rng.random((t, n)) < end_p,
         rng.random((t, n)) < end_p / 2)
        for t in sizes
    ]  # fmt: skip
    tracker = EpisodeTracker(n, same_step)
    for chunk in chunks:
        tracker.rows(*chunk)
    returns, lengths, ret, length = row_by_row(chunks, n, same_step)
    assert list(tracker.stats.returns) == returns[-100:]
    assert list(tracker.stats.lengths) == lengths[-100:]
    assert tracker.stats.count == len(returns)
    np.testing.assert_array_equal(tracker.ret, ret)
    np.testing.assert_array_equal(tracker.len, length)
