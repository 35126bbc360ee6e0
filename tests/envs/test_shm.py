"""Shared-memory layout from spaces, anonymous segments, nested values."""

from __future__ import annotations

import os

import numpy as np
import pytest
from gymnasium import spaces

from rlstash.envs.shm import (
    ALIGN,
    Layout,
    SharedArrays,
    assemble,
    create_segment,
    flatten_value,
    make_reader,
    make_writer,
    resize_segment,
    space_leaves,
)
from tests.envs.helpers import shm_files

NESTED = spaces.Dict(
    {
        "pos": spaces.Box(-1, 1, (3,), np.float32),
        "parts": spaces.Tuple((spaces.Discrete(4), spaces.MultiBinary((2, 2)))),
        "md": spaces.MultiDiscrete([2, 5]),
    }
)


def test_leaves_follow_nesting_with_shapes_and_dtypes():
    leaves = space_leaves(NESTED)
    got = [(lf.path, lf.shape, lf.dtype) for lf in leaves]
    assert got == [
        (("md",), (2,), np.dtype(np.int64)),
        (("parts", 0), (), np.dtype(np.int64)),
        (("parts", 1), (2, 2), np.dtype(np.int8)),
        (("pos",), (3,), np.dtype(np.float32)),
    ]


@pytest.mark.parametrize(
    "space",
    [
        spaces.Text(5),
        spaces.Sequence(spaces.Discrete(2)),
        spaces.Dict({"ok": spaces.Discrete(2), "bad": spaces.Text(3)}),
    ],
)
def test_unsupported_space_names_where_and_what(space):
    with pytest.raises(TypeError, match=r"cannot live in shared memory; supported: Box"):
        space_leaves(space)


def test_layout_offsets_aligned_and_disjoint():
    layout = Layout.build(NESTED, spaces.Discrete(3), num_envs=5, final_obs=True)
    names = [f.name for f in layout.fields]
    assert names[:4] == ["obs/md", "obs/parts/0", "obs/parts/1", "obs/pos"]
    assert "final_obs/pos" in names and "act" in names
    assert names[-4:] == ["reward", "terminated", "truncated", "final"]
    end = 0
    for f in layout.fields:
        assert f.offset % ALIGN == 0 and f.offset >= end
        end = f.offset + f.nbytes
    assert layout.nbytes >= end
    no_final = Layout.build(NESTED, spaces.Discrete(3), num_envs=5, final_obs=False)
    assert not any(f.name.startswith("final_obs") for f in no_final.fields)


def test_segment_has_no_name_in_dev_shm_and_is_shared_between_mappings():
    before = shm_files()
    layout = Layout.build(spaces.Box(0, 1, (2,)), spaces.Discrete(2), num_envs=3, final_obs=False)
    fd = create_segment(0, "test")
    try:
        resize_segment(fd, layout.nbytes)
        assert shm_files() == before
        a, b = SharedArrays(layout, fd), SharedArrays(layout, fd)
        a["obs"][1] = [0.25, 0.5]
        a["reward"][:] = [1, 2, 3]
        np.testing.assert_array_equal(b["obs"][1], [0.25, 0.5])
        np.testing.assert_array_equal(b["reward"], [1, 2, 3])
        assert not b["terminated"].any()  # fresh segments read as zeros
        view = b["obs"]
        a.close()
        b.close()  # a caller still holds `view`: unmapping is deferred, not an error
        assert view.shape == (3, 2)
    finally:
        os.close(fd)


def test_writer_reader_roundtrip_nested():
    layout = Layout.build(NESTED, NESTED, num_envs=2, final_obs=False)
    shared = SharedArrays(layout, None)
    value = {
        "pos": np.array([0.1, 0.2, 0.3], np.float32),
        "parts": (np.int64(3), np.array([[1, 0], [0, 1]], np.int8)),
        "md": np.array([1, 4]),
    }
    make_writer(NESTED, shared.leaves("act"))(1, value)
    back = make_reader(NESTED, shared.leaves("act"))()[1]
    np.testing.assert_array_equal(back["pos"], value["pos"])
    assert back["parts"][0] == 3
    np.testing.assert_array_equal(back["parts"][1], value["parts"][1])
    batched = assemble(NESTED, shared.leaves("act"))
    assert batched["pos"].shape == (2, 3) and isinstance(batched["parts"], tuple)
    shared.close()


def test_flatten_value_checks_structure():
    with pytest.raises(
        TypeError, match=r"actions: expected a dict with keys \['md', 'parts', 'pos'\]"
    ):
        flatten_value(NESTED, {"pos": 1}, "actions")
    with pytest.raises(TypeError, match=r"actions\['parts'\]: expected a tuple of 2 parts"):
        flatten_value(NESTED, {"pos": 1, "md": 2, "parts": (1,)}, "actions")
