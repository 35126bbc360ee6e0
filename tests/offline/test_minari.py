"""Minari datasets in and out of a stream replay (issue 26 point 3): datasets made by Minari's
own DataCollector (Box and Dict observations, terminated and truncated episodes) fill a
StreamStorage whose transitions equal the episodes', and export back equal."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlstash import ReplayBuffer
from rlstash.memory import InsufficientMemoryError
from tests.offline.conftest import collect, dict_env

minari = pytest.importorskip("minari", reason="Minari tests need rlstash[minari]")
from rlstash.datasets import minari as mds  # noqa: E402


def _flat(obs, prefix="obs"):
    if isinstance(obs, dict):
        out = {}
        for k, v in obs.items():
            out.update(_flat(v, f"{prefix}/{k}"))
        return out
    return {prefix: np.asarray(obs)}


def _naive(ds):
    """The transitions of every episode as a naive buffer stores them (obs and next obs)."""
    rows = {}
    for ep in ds.iterate_episodes():
        T = len(ep.rewards)
        obs = _flat(ep.observations)
        cols = {k: v[:T] for k, v in obs.items()}
        cols.update({"next_" + k: v[1 : T + 1] for k, v in obs.items()})
        cols["action"] = np.asarray(ep.actions)
        cols["reward"] = np.asarray(ep.rewards, np.float32)
        cols["terminated"] = np.asarray(ep.terminations, bool)
        trunc = np.asarray(ep.truncations, bool).copy()
        trunc[-1] |= not (cols["terminated"][-1] or trunc[-1])
        cols["truncated"] = trunc
        for k, v in cols.items():
            rows.setdefault(k, []).append(v)
    return {k: np.concatenate(v) for k, v in rows.items()}


ENVS = {
    "pendulum": lambda: gym.make("Pendulum-v1", max_episode_steps=40),  # truncations
    "cartpole": lambda: gym.make("CartPole-v1"),  # terminations, Discrete actions
    "dict": lambda: dict_env(30),  # Dict (nested) observations, both flags
}


@pytest.mark.filterwarnings("ignore:env_spec is None")  # the Dict env is not registered
@pytest.mark.parametrize("kind", sorted(ENVS))
def test_stream_holds_every_transition_and_exports_equal(kind, minari_path):
    ds = collect(f"test/{kind}-v0", ENVS[kind](), steps=300)
    flags = np.concatenate([np.asarray(e.truncations) for e in ds.iterate_episodes()])
    assert ds.total_steps > 0
    st = mds.from_minari(f"test/{kind}-v0")
    assert st.capacity == ds.total_steps + ds.total_episodes  # planned from the counts
    assert int(st.valid.sum()) == ds.total_steps  # each observation once, a slot per final obs
    got = st.read(np.flatnonzero(st.valid))  # one lane, no wrap: slot order is episode order
    want = _naive(ds)
    for key, value in want.items():
        np.testing.assert_array_equal(got[key].numpy(), value.reshape(got[key].shape), key)
    if kind == "pendulum":
        assert flags.any() and got["truncated"].any() and not got["terminated"].any()
    if kind == "cartpole":
        assert got["terminated"].any()

    out = mds.to_minari(st, f"test/{kind}-export-v0", env=ds.env_spec,
                        observation_space=ds.observation_space, action_space=ds.action_space)  # fmt: skip
    back = minari.load_dataset(f"test/{kind}-export-v0")
    assert back.total_episodes == out.total_episodes == ds.total_episodes
    assert back.total_steps == ds.total_steps
    for a, b in zip(ds.iterate_episodes(), back.iterate_episodes()):
        for key, value in _flat(a.observations).items():
            np.testing.assert_array_equal(_flat(b.observations)[key], value, key)
        np.testing.assert_array_equal(b.actions, a.actions)
        np.testing.assert_array_equal(b.rewards, np.asarray(a.rewards, np.float32))
        np.testing.assert_array_equal(b.terminations, a.terminations)
        np.testing.assert_array_equal(b.truncations, a.truncations)
    st.close()


def test_replay_buffer_from_minari_samples_rebuilt_next_obs(minari_path):
    ds = collect("test/pend-v0", gym.make("Pendulum-v1", max_episode_steps=50), steps=200)
    rb = ReplayBuffer.from_minari(ds, seed=0)
    batch = rb.sample(64)
    assert batch["obs"].shape == (64, 3) and batch["next_obs"].shape == (64, 3)
    # next_obs is the observation after obs in the dataset (Pendulum: cos^2 + sin^2 = 1)
    torch.testing.assert_close(batch["next_obs"][:, :2].pow(2).sum(1), torch.ones(64))
    nbytes = rb.storage.nbytes
    naive = sum(rb.storage.naive_bytes(rb.storage.spec, ds.total_steps).values())
    assert nbytes < naive  # obs once, not obs + next_obs
    rb.close()


def test_a_dataset_that_does_not_fit_is_refused_before_allocating(minari_path, monkeypatch):
    ds = collect("test/big-v0", gym.make("Pendulum-v1", max_episode_steps=20), steps=40)
    monkeypatch.setattr(type(ds), "total_steps", property(lambda self: 10**14))
    with pytest.raises(InsufficientMemoryError):
        mds.from_minari(ds)


def test_bad_dataset_ids_and_an_existing_export_are_one_line_errors(minari_path):
    collect("test/have-v0", gym.make("Pendulum-v1", max_episode_steps=20), steps=40)
    with pytest.raises(ValueError, match=r"no local Minari dataset 'test/nope-v0'.*test/have-v0"):
        ReplayBuffer.from_minari("test/nope-v0")
    with pytest.raises(TypeError, match="dataset: expected a minari.MinariDataset"):
        mds.load(3)
    st = mds.from_minari("test/have-v0")
    with pytest.raises(ValueError, match="exists already"):
        mds.to_minari(st, "test/have-v0", env="Pendulum-v1")
    st.close()


@pytest.mark.parametrize("bad", ["bad id", "/abs/path/pend-v0", "test/pend", "a/pend-v0"])
def test_a_malformed_id_is_refused_and_a_failed_export_writes_nothing(minari_path, bad,
                                                                       monkeypatch):  # fmt: skip
    collect("test/have-v0", gym.make("Pendulum-v1", max_episode_steps=20), steps=40)
    before = sorted(minari_path.rglob("*"))
    st = mds.from_minari("test/have-v0")
    with pytest.raises(ValueError, match=rf"dataset_id: expected a Minari dataset id.*{bad!r}"):
        mds.to_minari(st, bad, env="Pendulum-v1")
    with pytest.raises(ValueError, match=rf"dataset: expected a Minari dataset id.*{bad!r}"):
        mds.load(bad)

    def fails(*args, **kwargs):  # the write fails after Minari made the dataset's folders
        (minari_path / "new" / "space" / "pend-v0" / "data").mkdir(parents=True)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(minari, "create_dataset_from_buffers", fails)
    with pytest.raises(OSError, match="No space left"):
        mds.to_minari(st, "new/space/pend-v0", env="Pendulum-v1")
    st.close()
    assert sorted(minari_path.rglob("*")) == before  # nothing written, nothing left behind


def test_a_stray_folder_under_the_root_does_not_hide_the_datasets(minari_path):
    collect("test/have-v0", gym.make("Pendulum-v1", max_episode_steps=20), steps=40)
    (minari_path / "not an id" / "data").mkdir(parents=True)  # Minari's listing raises on it
    assert len(ReplayBuffer.from_minari("test/have-v0")) > 0
    with pytest.raises(ValueError, match=r"no local Minari dataset.*listing fails"):
        ReplayBuffer.from_minari("test/nope-v0")


def test_export_walks_every_lane_oldest_first_and_cuts_the_running_episode():
    """Two lanes of 8 slots, 10 next-step steps (the ring overwrote each lane's 2 oldest):
    lane 0 terminates and runs on, lane 1 truncates and runs on; no minari needed."""
    from rlstash.storage import StreamStorage

    st = StreamStorage({"obs": ((1,), torch.float32), "action": ((), torch.int64)}, 2, 16)
    term = np.zeros((10, 2), bool)
    trunc = np.zeros((10, 2), bool)
    term[2, 0] = True  # lane 0: steps 0..2, final obs at 3, a new episode from 4
    trunc[6, 1] = True  # lane 1: steps 0..6 truncated, final obs at 7, new episode from 8
    obs = torch.arange(20, dtype=torch.float32).reshape(10, 2, 1)
    st.extend({"obs": obs, "action": torch.arange(20).reshape(10, 2),
               "reward": obs[..., 0] / 10, "terminated": torch.from_numpy(term),
               "truncated": torch.from_numpy(trunc)})  # fmt: skip
    eps = list(mds.stream_episodes(st))
    lane0 = [e["observations"][:, 0].tolist() for e in eps[:2]]
    assert lane0 == [[4, 6], [8, 10, 12, 14, 16, 18]]  # from the oldest kept observation
    assert eps[0]["terminations"].tolist() == [True]
    assert eps[1]["truncations"].tolist() == [False] * 4 + [True]  # running: cut at its newest
    np.testing.assert_array_equal(eps[1]["actions"], [8, 10, 12, 14, 16])
    lane1 = [e["observations"][:, 0].tolist() for e in eps[2:]]
    assert lane1 == [[5, 7, 9, 11, 13, 15], [17, 19]]
    assert eps[2]["truncations"].tolist() == [False] * 4 + [True]
    assert eps[3]["truncations"].tolist() == [True] and eps[3]["rewards"].tolist() == [
        np.float32(1.7)
    ]
    st.close()
