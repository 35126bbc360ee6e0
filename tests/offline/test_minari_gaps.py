"""Minari loading and export, the gaps issue 26 left: each episode copied once into the
planned storage; per-step infos kept as ``info/<key>`` fields and exported back; a
frame-stacked stream exported as single frames plus its stack length, read back as the same
stacked batches."""

from __future__ import annotations

import tracemalloc
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlstash import ReplayBuffer
from rlstash.storage import ReadSpec, StreamStorage
from tests.offline.conftest import collect

minari = pytest.importorskip("minari", reason="Minari tests need rlstash[minari]")
from rlstash.datasets import minari as mds  # noqa: E402


class WideEnv(gym.Env):
    """Box observations of ``dim`` floats, info {"x": float, "vec": f32[2], "hit": bool}."""

    action_space = spaces.Box(-1, 1, (2,), np.float32)

    def __init__(self, dim: int = 8, big_info: bool = False) -> None:
        self.observation_space = spaces.Box(-10, 10, (dim,), np.float32)
        self.dim, self.big_info, self.t = dim, big_info, 0

    def _info(self):
        info = {"x": float(self.t), "vec": np.full(2, self.t / 10, np.float32),
                "hit": bool(self.t % 3 == 0)}  # fmt: skip
        if self.big_info:
            info["big"] = np.uint64(self.t)  # no torch dtype for it: not kept
        return info

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.uniform(-1, 1, self.dim).astype(np.float32), self._info()

    def step(self, action):
        self.t += 1
        obs = self.np_random.uniform(-1, 1, self.dim).astype(np.float32)
        return obs, float(self.t), bool(self.np_random.random() < 0.05), False, self._info()


@pytest.mark.filterwarnings("ignore:env_spec is None")
def test_loading_copies_each_episode_once_into_the_planned_storage(minari_path):
    """The storage's slots are planned first; the numpy temporaries of a load stay an
    episode's size, never the dataset's (on main each episode was copied into padded rows,
    then into chunks of up to 65,536 slots, before extend copied the chunk in)."""
    from minari.data_collector.episode_buffer import EpisodeBuffer

    rng = np.random.default_rng(0)
    eps = [EpisodeBuffer(observations=rng.random((41, 512), np.float32),
                         actions=rng.random((40, 2), np.float32), rewards=rng.random(40),
                         terminations=np.arange(40) == 39, truncations=np.zeros(40, bool))
           for _ in range(50)]  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        ds = minari.create_dataset_from_buffers(
            "test/wide-v0", eps, observation_space=WideEnv(512).observation_space,
            action_space=WideEnv.action_space,
        )  # fmt: skip
    mds.from_minari(ds).close()  # warm: imports, h5py caches
    tracemalloc.start()
    try:
        st = mds.from_minari(ds)
        held, peak = tracemalloc.get_traced_memory()  # held: what stays (the slots, if traced)
    finally:
        tracemalloc.stop()
    stored = 2040 * 512 * 4  # the observations alone, each once
    assert int(st.valid.sum()) == ds.total_steps
    temporaries = peak - held
    assert temporaries < stored / 4, f"{temporaries} bytes of temporaries, {stored} stored"
    st.close()


@pytest.mark.filterwarnings("ignore:env_spec is None")
def test_infos_are_kept_on_request_and_exported_back_equal(minari_path):
    env = gym.wrappers.TimeLimit(WideEnv(4), 25)
    ds = collect("test/infos-v0", env, steps=200, record_infos=True)
    rb = ReplayBuffer.from_minari(ds, infos=True, seed=0)
    st = rb.storage
    assert {"info/x", "info/vec", "info/hit"} <= set(st.slot_spec)
    assert st.slot_spec["info/vec"].shape == (2,) and st.slot_spec["info/hit"].dtype == torch.bool
    batch = rb.sample(32)
    # a row's info came with its obs: Minari's infos[t] (the reset's for t = 0)
    rows = st.read(np.flatnonzero(st.valid))
    first = next(ds.iterate_episodes())
    T = len(first.rewards)
    np.testing.assert_array_equal(rows["info/x"][:T].numpy(), first.infos["x"][:T])
    assert batch["info/vec"].shape == (32, 2)

    mds.to_minari(st, "test/infos-export-v0", env=None, observation_space=ds.observation_space,
                  action_space=ds.action_space)  # fmt: skip
    back = minari.load_dataset("test/infos-export-v0")
    for a, b in zip(ds.iterate_episodes(), back.iterate_episodes(), strict=True):
        for key in ("x", "vec", "hit"):
            np.testing.assert_array_equal(b.infos[key], a.infos[key], key)
            assert b.infos[key].dtype == a.infos[key].dtype
        np.testing.assert_array_equal(b.observations, a.observations)
    rb.close()

    only = mds.from_minari(ds, infos=["vec"])
    assert [k for k in only.slot_spec if k.startswith("info/")] == ["info/vec"]
    only.close()
    assert not [k for k in mds.from_minari(ds).slot_spec if k.startswith("info")]  # default off


@pytest.mark.filterwarnings("ignore:env_spec is None")
def test_unsupported_infos_are_skipped_with_a_warning_or_refused_by_name(minari_path):
    ds = collect(
        "test/big-v0", gym.wrappers.TimeLimit(WideEnv(4, True), 20), steps=60, record_infos=True
    )
    with pytest.warns(UserWarning, match=r"skipped big \(uint64"):
        st = mds.from_minari(ds, infos=True)
    assert "info/big" not in st.slot_spec and "info/x" in st.slot_spec
    st.close()
    with pytest.raises(ValueError, match=r"infos: key 'big' .* uint64"):
        mds.from_minari(ds, infos=["big"])
    with pytest.raises(ValueError, match=r"infos: nope not in the infos .*found: big, hit, vec, x"):
        mds.from_minari(ds, infos=["nope"])
    plain = collect("test/noinfo-v0", gym.wrappers.TimeLimit(WideEnv(4), 20), steps=40)
    with pytest.raises(ValueError, match=r"record_infos=True"):
        mds.from_minari(plain, infos=True)


class ImageEnv(gym.Env):
    """6x6 uint8 frames (each a distinct count), Discrete(3) actions, random terminations."""

    observation_space = spaces.Box(0, 255, (6, 6), np.uint8)
    action_space = spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.n = int(self.np_random.integers(0, 200))
        return np.full((6, 6), self.n % 256, np.uint8), {}

    def step(self, action):
        self.n += 1 + int(action)
        frame = np.full((6, 6), self.n % 256, np.uint8)
        frame[0, 0] = int(action)
        return frame, float(action), bool(self.np_random.random() < 0.08), False, {}


def test_a_frame_stacked_stream_exports_frames_and_reads_back_the_same_stacks(minari_path):
    k = 3

    def make():
        env = gym.wrappers.TimeLimit(ImageEnv(), 15)
        return gym.wrappers.FrameStackObservation(env, k, padding_type="reset")

    venv = gym.vector.SyncVectorEnv([make])  # next-step autoreset, as rlstash's pools
    venv.action_space.seed(0)
    stacked = venv.single_observation_space
    st = StreamStorage({"obs": ((k, 6, 6), torch.uint8), "action": ((), torch.int64)}, 1, 400,
                       reads=ReadSpec(frame_stack=k), stacked_input=True)  # fmt: skip
    obs, _ = venv.reset(seed=0)
    for _ in range(150):
        act = venv.action_space.sample()
        nxt, rew, term, trunc, _ = venv.step(act)
        st.extend({"obs": torch.from_numpy(obs), "action": torch.from_numpy(act),
                   "reward": torch.from_numpy(rew).float(), "terminated": torch.from_numpy(term),
                   "truncated": torch.from_numpy(trunc)})  # fmt: skip
        obs = nxt
    venv.close()
    ds = mds.to_minari(st, "test/frames-v0", env=None, observation_space=stacked,
                       action_space=spaces.Discrete(3))  # fmt: skip
    back = minari.load_dataset("test/frames-v0")
    assert back.observation_space.shape == (6, 6)  # the env's own single frames
    assert back.storage.metadata["frame_stack"] == k == mds.frame_stack_of(ds)
    st2 = mds.from_minari("test/frames-v0")  # stacked by the metadata's k
    want, got = st.read(np.flatnonzero(st.valid)), st2.read(np.flatnonzero(st2.valid))
    assert len(got["obs"]) == len(want["obs"]) > 100
    assert got["obs"].shape[1:] == (k, 6, 6)
    # the running episode is exported cut at its newest observation: its last step truncated
    assert got["truncated"][-1] and not want["truncated"][-1]
    for key in ("truncated", "done"):
        want[key][-1] = True
    for key, value in want.items():
        torch.testing.assert_close(got[key], value, msg=key)
    st.close(), st2.close()


@pytest.mark.parametrize("where", ["disk", "extend"])
def test_disk_and_the_extend_path_load_the_same_transitions(where, minari_path, tmp_path):
    """A disk stream is written in place too; a stream that cannot be (here bfloat16 slots,
    which numpy cannot view) gets the same grid through extend."""
    ds = collect("test/pend-v0", gym.make("Pendulum-v1", max_episode_steps=30), steps=100)
    want = mds.from_minari(ds)
    spec = None
    if where == "extend":
        spec = {"obs": ((3,), torch.float32), "action": ((1,), torch.bfloat16)}
    kwargs = {"backing": "disk", "path": tmp_path / "d"} if where == "disk" else {}
    got = mds.from_minari(ds, spec=spec, **kwargs)
    a, b = want.read(np.flatnonzero(want.valid)), got.read(np.flatnonzero(got.valid))
    for key, value in a.items():
        torch.testing.assert_close(b[key], value.to(b[key].dtype), msg=key)
    want.close(), got.close()
