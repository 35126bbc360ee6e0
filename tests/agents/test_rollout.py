"""RolloutStorage: [T, N] layout, valid/cont flags (reset steps carried across rollouts,
restarted workers), validation that writes nothing, shuffled minibatches."""

import pytest
import torch

from rlstash.spec import Spec
from rlstash.storage.rollout import RolloutStorage

SPEC = Spec({"obs": ((2,), "float32"), "action": ((), "int64")})


def _batch(T=3, N=2, done_rows=(), trunc_rows=(), restarted=None):
    term = torch.zeros(T, N, dtype=torch.bool)
    trunc = torch.zeros(T, N, dtype=torch.bool)
    for t, n in done_rows:
        term[t, n] = True
    for t, n in trunc_rows:
        trunc[t, n] = True
    batch = {
        "obs": torch.arange(T * N * 2, dtype=torch.float32).reshape(T, N, 2),
        "action": torch.arange(T * N).reshape(T, N),
        "reward": torch.ones(T, N),
        "terminated": term,
        "truncated": trunc,
    }
    if restarted is not None:
        batch["restarted"] = restarted
    return batch


def test_layout_and_next_obs_row():
    ro = RolloutStorage(SPEC, 3, 2)
    b = _batch()
    nxt = torch.full((2, 2), -1.0)
    ro.add(b, nxt)
    torch.testing.assert_close(ro.obs[:3], b["obs"])
    torch.testing.assert_close(ro.obs[3], nxt)
    torch.testing.assert_close(ro.flat("action"), b["action"].reshape(6))
    assert ro.flat("obs").shape == (6, 2)
    assert ro.valid.all() and ro.cont.all()
    assert ro.nbytes == 4 * 2 * 2 * 4 + 3 * 2 * (8 + 4 + 1 + 1 + 1 + 1)


def test_next_step_reset_rows_are_invalid_and_carried_to_the_next_rollout():
    ro = RolloutStorage(SPEC, 3, 2)
    ro.add(_batch(done_rows=[(0, 0), (2, 1)]), torch.zeros(2, 2))
    assert ro.valid.tolist() == [[True, True], [False, True], [True, True]]
    assert ro.cont.tolist() == [[False, True], [True, True], [True, False]]
    ro.add(_batch(), torch.zeros(2, 2))  # env 1 ended on the previous rollout's last row
    assert ro.valid.tolist() == [[True, False], [True, True], [True, True]]
    state = ro.state_dict()
    fresh = RolloutStorage(SPEC, 3, 2)
    fresh.load_state_dict({"after_done": torch.tensor([True, False])})
    fresh.add(_batch(), torch.zeros(2, 2))
    assert fresh.valid[0].tolist() == [False, True]
    assert state["after_done"].tolist() == [False, False]


def test_same_step_rows_are_all_valid_and_keep_final_obs():
    ro = RolloutStorage(SPEC, 3, 2, same_step=True)
    b = _batch(trunc_rows=[(1, 0)])
    b["final_obs"] = torch.full((3, 2, 2), 7.0)
    ro.add(b, torch.zeros(2, 2))
    assert ro.valid.all()
    assert ro.cont.tolist() == [[True, True], [False, True], [True, True]]
    torch.testing.assert_close(ro.final_obs, b["final_obs"])


def test_restarted_step_is_invalid_and_cuts_the_episode_before_it():
    restarted = torch.zeros(3, 2, dtype=torch.bool)
    restarted[1, 1] = True  # that step never happened; the pool reports it truncated
    ro = RolloutStorage(SPEC, 3, 2)
    ro.add(_batch(trunc_rows=[(1, 1)], restarted=restarted), torch.zeros(2, 2))
    assert ro.valid[:, 1].tolist() == [True, False, False]  # row 2 is next-step's reset step
    assert ro.cont[:, 1].tolist() == [False, False, True]  # row 0 ends at obs[1], bootstrapped


def test_bad_batches_write_nothing():
    ro = RolloutStorage(SPEC, 3, 2)
    good = _batch()
    ro.add(good, torch.zeros(2, 2))
    before = ro.obs.clone()
    bad = _batch()
    bad["obs"] = bad["obs"] + 100
    bad["terminated"] = torch.zeros(3, 2)  # float flags
    with pytest.raises(TypeError, match=r"batch\['terminated'\]: expected torch.bool"):
        ro.add(bad, torch.zeros(2, 2))
    with pytest.raises(ValueError, match=r"next_obs: expected shape \[2, 2\]"):
        ro.add(_batch(), torch.zeros(3, 2))
    missing = _batch()
    del missing["reward"]
    with pytest.raises(ValueError, match="missing field 'reward'"):
        ro.add(missing, torch.zeros(2, 2))
    with pytest.raises(ValueError, match=r"batch\['action'\]: expected shape \[3, 2\]"):
        ro.add({**_batch(), "action": torch.zeros(3, 3, dtype=torch.int64)}, torch.zeros(2, 2))
    torch.testing.assert_close(ro.obs, before)


def test_constructor_errors():
    with pytest.raises(ValueError, match="steps: expected an int >= 1"):
        RolloutStorage(SPEC, 0, 2)
    with pytest.raises(ValueError, match="unexpected fields"):
        RolloutStorage(
            Spec({"obs": ((2,), "float32"), "action": ((), "int64"), "x": ((), "int8")}), 2, 2
        )


def test_minibatches_cover_every_row_once():
    ro = RolloutStorage(SPEC, 5, 3)
    ro.add(_batch(T=5, N=3), torch.zeros(3, 2))
    parts = list(ro.minibatches(4, torch.Generator().manual_seed(0)))
    assert [len(p) for p in parts] == [4, 4, 4, 3]
    assert sorted(torch.cat(parts).tolist()) == list(range(15))
    with pytest.raises(ValueError, match="batch_size"):
        next(ro.minibatches(0, torch.Generator()))


def test_to_same_device_is_self():
    ro = RolloutStorage(SPEC, 2, 2)
    assert ro.to("cpu") is ro
