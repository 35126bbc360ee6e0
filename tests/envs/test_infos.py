"""batch_infos gives exactly what gymnasium's VectorEnv._add_info gives, env by env."""

from __future__ import annotations

import numpy as np
from gymnasium.vector import VectorEnv
from hypothesis import given, settings
from hypothesis import strategies as st

from rlstash.envs.infos import batch_infos, merge_infos

N = 5
KEYS = ["a", "b", "c", "final_obs"]
VALUES = st.one_of(
    st.integers(-5, 5),
    st.floats(-2, 2, allow_nan=False),
    st.booleans(),
    st.integers(0, 9).map(np.float32),
    st.integers(0, 9).map(np.int16),
    st.just(np.arange(3.0)),
    st.text(max_size=2),
    st.none(),
)
INFO = st.dictionaries(
    st.sampled_from(KEYS),
    st.one_of(VALUES, st.dictionaries(st.sampled_from(["x", "y"]), VALUES, max_size=2)),
    max_size=3,
)


class _Fake:
    num_envs = N
    _add_info = VectorEnv._add_info


def _reference(entries):
    fake, infos = _Fake(), {}
    for i, info in entries:
        infos = fake._add_info(infos, info, i)
    return infos


def same(a, b) -> bool:
    """Structural equality; NaN equals NaN (None cast into a float array gives NaN)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray) and a.dtype == object:
        return b.dtype == object and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, np.ndarray):
        nan = a.dtype.kind in "fc"
        return a.dtype == b.dtype and np.array_equal(a, b, equal_nan=nan)
    return type(a) is type(b) and (a == b or (a != a and b != b))


def _consistent(entries) -> bool:
    """Skip mixes gymnasium itself cannot fold (a key both dict and not, array into scalar)."""
    kinds: dict = {}
    for _, info in entries:
        for k, v in info.items():
            kind = "dict" if isinstance(v, dict) else "array" if isinstance(v, np.ndarray) else "x"
            if kinds.setdefault(k, kind) != kind:
                return False
            if isinstance(v, dict) and not _consistent([(0, v)]):
                return False
    return True


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, N - 1), INFO), max_size=N, unique_by=lambda e: e[0]))
def test_batch_infos_equals_gymnasium_add_info(entries):
    entries = sorted(entries, key=lambda e: e[0])
    if not _consistent(entries):
        return
    try:
        want = _reference(entries)
    except (ValueError, TypeError, AttributeError):
        return  # gymnasium cannot fold this batch either
    got = batch_infos(entries, N)
    assert same(got, want), (entries, got, want)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, N - 1), INFO), max_size=N, unique_by=lambda e: e[0]),
    st.lists(st.integers(1, N - 1), max_size=3, unique=True),
)
def test_merging_worker_blocks_equals_batching_all(entries, cuts):
    """Workers batch their block of envs, the pool merges the blocks: same infos."""
    entries = sorted(entries, key=lambda e: e[0])
    if not _consistent(entries) or not _same_kind_per_key(entries):
        return
    try:
        want = batch_infos(entries, N)
    except (ValueError, TypeError):
        return  # a batch gymnasium cannot fold either (e.g. an array into a scalar column)
    bounds = [0, *sorted(cuts), N]
    parts = []
    for lo, hi in zip(bounds, bounds[1:]):
        block = [(i - lo, info) for i, info in entries if lo <= i < hi]
        if block:
            parts.append((lo, batch_infos(block, hi - lo)))
    assert same(merge_infos(parts, N), want)


def _same_kind_per_key(entries) -> bool:
    """One type per key (path) across envs: a worker block casts to its own first type before
    the pool merges, so int/bool/str mixes within one key may differ (documented)."""
    kinds: dict = {}

    def walk(info: dict, path: tuple) -> bool:
        for k, v in info.items():
            kind = type(v) if not isinstance(v, np.ndarray) else (np.ndarray, v.dtype, v.shape)
            if kinds.setdefault((*path, k), kind) != kind:
                return False
            if isinstance(v, dict) and not walk(v, (*path, k)):
                return False
        return True

    return all(walk(info, ()) for _, info in entries)
