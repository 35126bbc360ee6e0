"""RayCollector parts that need no Ray: argument checks, and the cut of a failed actor's
episodes checked against StreamStorage alone.

No Ray here: the chunks are written by hand. After a failure the actor's next chunk starts
with a bridge row (the last observation the driver received, ``restarted``) and then the
fresh envs' steps; the storage must end the old episodes as truncated there, keep every
transition already stored, and start the new episodes clean (frame stacks included).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlstash.collect.ray import _steps, _with_bridge
from rlstash.storage.stream import ReadSpec, StreamStorage

SPEC = {"obs": ((2,), torch.int64), "action": ((), torch.int64)}


def chunk(obs: list[list[int]], done: list[int] | None = None) -> dict[str, np.ndarray]:
    """A [T, 1] chunk of one env whose obs rows are ``obs`` (uid-like pairs)."""
    T = len(obs)
    term = np.zeros((T, 1), bool)
    for t in done or []:
        term[t, 0] = True
    return {
        "obs": np.array(obs, np.int64)[:, None],
        "action": np.arange(T, dtype=np.int64)[:, None] + 100,
        "reward": np.ones((T, 1), np.float32),
        "terminated": term,
        "truncated": np.zeros((T, 1), bool),
    }


def extend(store: StreamStorage, data: dict[str, np.ndarray]) -> None:
    store.extend({k: torch.from_numpy(v) for k, v in data.items()})


def transitions(store: StreamStorage) -> list[tuple]:
    got = store.read(np.flatnonzero(store.valid))
    newest = (lambda x: x[-1]) if got["obs"].ndim == 3 else (lambda x: x)  # frame stacks
    return [
        (newest(o).tolist(), newest(n).tolist(), bool(tr), bool(te))
        for o, n, tr, te in zip(got["obs"], got["next_obs"], got["truncated"], got["terminated"])
    ]


@pytest.mark.parametrize("k", [1, 2])
def test_bridge_row_truncates_the_cut_episode_and_starts_a_clean_one(k):
    store = StreamStorage(SPEC, 1, 32, reads=ReadSpec(n_step=1, gamma=0.5, frame_stack=k))
    extend(store, chunk([[1, 0], [1, 1], [1, 2], [1, 3]]))  # episode 1, its next obs is [1, 4]
    # the next chunk was lost with the actor; the restarted actor's envs start episode 2
    fresh = chunk([[2, 0], [2, 1], [2, 2]])
    extend(store, _with_bridge(np.array([[1, 4]]), fresh, 4))
    extend(store, chunk([[2, 3], [2, 4]]))
    got = transitions(store)
    assert got == [
        ([1, 0], [1, 1], False, False),
        ([1, 1], [1, 2], False, False),
        ([1, 2], [1, 3], False, False),
        ([1, 3], [1, 4], True, False),  # truncated at the last obs the driver received
        ([2, 0], [2, 1], False, False),
        ([2, 1], [2, 2], False, False),
        ([2, 2], [2, 3], False, False),
        ([2, 3], [2, 4], False, False),
    ]
    if k == 2:  # the new episode's first frame is padded with itself, never with episode 1's
        first = store.read(np.flatnonzero(store.valid))["obs"][4]
        assert first.tolist() == [[2, 0], [2, 0]]


def test_bridge_after_an_episode_that_ended_on_the_last_row():
    store = StreamStorage(SPEC, 1, 32, reads=ReadSpec(n_step=2, gamma=0.5, frame_stack=2))
    extend(store, chunk([[1, 0], [1, 1]], done=[1]))  # terminated; next obs [1, 2] is final
    extend(store, _with_bridge(np.array([[1, 2]]), chunk([[2, 0], [2, 1], [2, 2]]), 4))
    got = transitions(store)
    assert got[:2] == [([1, 0], [1, 2], False, True), ([1, 1], [1, 2], False, True)]
    assert [g[0] for g in got[2:]] == [[2, 0]]  # n = 2: only [2, 0] has two successors
    assert store.read(np.flatnonzero(store.valid))["obs"][2].tolist() == [[2, 0], [2, 0]]


def test_bridge_keeps_a_pool_worker_restart_of_the_same_chunk():
    fresh = chunk([[2, 0], [2, 1], [2, 2]])
    fresh["restarted"] = np.array([[False], [True], [False]])
    out = _with_bridge(np.array([[1, 4]]), fresh, 4)
    assert out["restarted"][:, 0].tolist() == [True, False, True, False]
    assert out["obs"].shape == (4, 1, 2) and out["action"][0, 0] == 0
    assert out["reward"][0, 0] == 0 and not out["terminated"][0].any()


@pytest.mark.parametrize("frames, n", [(4, 4), (10, 4), (2, 2)])
def test_frames_per_batch_needs_two_steps_per_env_and_a_multiple(frames, n):
    with pytest.raises(ValueError, match="frames_per_batch"):
        _steps(frames, n)
    assert _steps(8, 4) == 2
    with pytest.raises(TypeError, match="frames_per_batch"):
        _steps(8.0, 4)


def _policy():
    return torch.nn.Linear(4, 2)


def test_bad_arguments_are_refused_before_ray_starts():
    from rlstash.collect.ray import RayCollector

    with pytest.raises(TypeError, match="policy_factory"):
        RayCollector("CartPole-v1", torch.nn.Linear(4, 2), 1, 1, 4)
    with pytest.raises(ValueError, match="num_actors"):
        RayCollector("CartPole-v1", _policy, 0, 1, 4)
    with pytest.raises(ValueError, match="frames_per_batch"):
        RayCollector("CartPole-v1", _policy, 2, 2, 6)
    with pytest.raises(ValueError, match="actor_options: max_restarts"):
        RayCollector("CartPole-v1", _policy, 1, 1, 4, actor_options={"max_restarts": 5})


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--ray", "banana"], ["--ray", "host:port", "'banana'"]),
        (["--ray", "local", "--algo", "ppo"], ["--ray", "on-policy", "ppo"]),
        (["--ray", "local", "--ray-actors", "0"], ["--ray-actors", ">= 1"]),
        (["--ray", "local", "--env", "rlstash/CartPole-v1"], ["--ray", "batched"]),
    ],
)
def test_train_ray_bad_settings_are_one_line_exit_2(argv, words, tmp_path, capsys):
    from rlstash import cli

    rc = cli.main(["train", "--quiet", "--run-dir", str(tmp_path / "runs"), *argv])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    for w in words:
        assert w in err, err
    assert not (tmp_path / "runs").exists()  # nothing written


def test_lanes_and_collection_size_of_a_ray_run():
    from rlstash.train.builders import collect_frames
    from rlstash.train.config import TrainConfig

    cfg = TrainConfig(ray="local", ray_actors=3, envs=4, train_freq=256)
    assert cfg.lanes == 12 and collect_frames(cfg) == 21 * 12
    assert collect_frames(TrainConfig(ray="local", ray_actors=3, envs=4, train_freq=4)) == 24
    assert TrainConfig(envs=4).lanes == 4
