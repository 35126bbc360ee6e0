"""StreamStorage's slot-major rows (``pos * N + lane``) and the saves of the older lane-major
layout: RAM state dicts are converted on load, disk directories refused with the fix, and
``convert_lane_major`` copies them (tests/data/lane_major: made by the old code, see
tests/data/make_lane_major_saves.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from rlstash.storage.stream import ReadSpec, StreamStorage
from rlstash.storage.stream_layout import convert_lane_major

DATA = Path(__file__).resolve().parent / "data" / "lane_major"
N, L = 3, 8  # as make_lane_major_saves.py
READS = ReadSpec(n_step=2, gamma=0.5, frame_stack=2)
SPEC = {"obs": ((2,), torch.float32), "action": ((), torch.int64)}


def assert_reads(store: StreamStorage, want: dict) -> None:
    """Every valid start reads as the old code read the same (lane, position), and the
    same (lane, position)s are valid."""
    idx = np.flatnonzero(store.valid)
    got = store.read(idx)
    keys = [(int(r) % N, int(r) // N) for r in idx]
    assert sorted(keys) == sorted(want) and len(keys) >= 10
    for j, key in enumerate(keys):
        for k, v in want[key].items():
            torch.testing.assert_close(got[k][j], v, rtol=0, atol=0, msg=f"{key} {k}")


def files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


@pytest.mark.parametrize("name", ["ram", "frames"])
def test_a_lane_major_state_dict_loads_with_the_transitions_it_held(name):
    """A state_dict saved before slot-major rows (no 'layout' in its config) is converted on
    load: every transition reads as the old code read it (the ring had wrapped, with ends)."""
    if name == "frames":
        pytest.importorskip("lz4")
    state = torch.load(DATA / f"{name}.pt", weights_only=False)
    assert "layout" not in state["config"]
    store = StreamStorage.from_state_dict(state)
    assert_reads(store, torch.load(DATA / f"{name}_reads.pt", weights_only=False))
    assert store.state_dict()["config"]["layout"] == "slot_major"
    bad = {**state, "config": {**state["config"], "layout": "diagonal"}}
    with pytest.raises(ValueError, match="row layout 'diagonal'"):
        store.load_state_dict(bad)


def test_a_lane_major_disk_stream_is_refused_naming_the_fix_and_converts(tmp_path):
    """Opening an old disk stream raises a ValueError naming the layout and the fix, and
    changes nothing; convert_lane_major copies it into a new slot-major directory holding the
    transitions the old code held after a reopen; the source stays as it was."""
    src = tmp_path / "old"
    shutil.copytree(DATA / "disk", src)
    before = files(src)
    with pytest.raises(ValueError, match=r"format 1, lane-major.*format 2.*convert_lane_major"):
        StreamStorage(SPEC, N, N * L, "disk", path=src, reads=READS)
    assert files(src) == before
    dst = convert_lane_major(src, tmp_path / "new")
    assert files(src) == before
    store = StreamStorage(SPEC, N, N * L, "disk", path=dst, reads=READS)
    assert_reads(store, torch.load(DATA / "disk_reads.pt", weights_only=False))
    store.extend(
        {"obs": torch.zeros(N, 2), "action": torch.zeros(N, dtype=torch.int64),
         "reward": torch.zeros(N), "terminated": torch.zeros(N, dtype=torch.bool),
         "truncated": torch.zeros(N, dtype=torch.bool)}
    )  # fmt: skip
    store.close()
    with pytest.raises(ValueError, match="already 'slot_major'"):
        convert_lane_major(dst, tmp_path / "again")
    with pytest.raises(ValueError, match="not empty"):
        convert_lane_major(src, dst)


def test_lockstep_steps_are_one_contiguous_block_of_rows_each():
    """Next-step chunks keep the lanes in lockstep: step t of every env lands in rows
    [pos * N, (pos + 1) * N) in env order, also where a chunk wraps past the lanes' end."""
    n, lanes = 5, 6
    store = StreamStorage(SPEC, n, n * lanes)
    T, pos = 4, 0
    for c in range(5):  # 20 steps through lanes of 6: chunks wrap
        obs = torch.arange(T * n * 2, dtype=torch.float32).reshape(T, n, 2) + 1000 * c
        store.extend(
            {"obs": obs, "action": torch.arange(T * n).reshape(T, n),
             "reward": torch.zeros(T, n), "terminated": torch.zeros(T, n, dtype=torch.bool),
             "truncated": torch.zeros(T, n, dtype=torch.bool)}
        )  # fmt: skip
        for t in range(T):
            p = (pos + t) % lanes
            torch.testing.assert_close(store.backing.tensors["obs"][p * n : (p + 1) * n], obs[t])
        pos = (pos + T) % lanes
    assert store.lanes.count.tolist() == [20] * n
