"""ReplayBuffer picks its paths from declared contracts (rlstash.core), never by exact type:
a user's own storage or sampler that declares a contract gets the same paths as the built-ins,
one that declares nothing gets the checked paths, and samplers save through ``state_dict``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlstash.core import (
    FastRows,
    PersistentStorage,
    PlacedStorage,
    Sampler,
    Storage,
    declares,
    missing_members,
)
from rlstash.replay import ReplayBuffer
from rlstash.sampler import PrioritizedSampler, SequenceSampler, UniformSampler
from rlstash.storage import MemmapStorage, StreamStorage, TensorStorage, TieredStorage
from tests.test_replay import SPEC, make, rows


class CountingRows:
    """A user's own indexed storage with the fast-path contract, delegating to a TensorStorage."""

    def __init__(self, spec, capacity):
        self.inner = TensorStorage(spec, capacity)
        self.spec, self.capacity, self.device = self.inner.spec, capacity, self.inner.device
        self.tensors = self.inner.tensors
        self.calls: dict[str, int] = {}

    def _count(self, name):
        self.calls[name] = self.calls.get(name, 0) + 1

    @property
    def nbytes(self):
        return self.inner.nbytes

    def write(self, index, batch, validate=True):
        self._count("write")
        self.inner.write(index, batch, validate)

    def read(self, index, out=None):
        self._count("read")
        return self.inner.read(index, out)

    def gather(self, index):
        self._count("gather")
        return self.inner.gather(index)

    def exact_sources(self, batch):
        self._count("exact_sources")
        return self.inner.exact_sources(batch)

    def put(self, index, sources):
        self._count("put")
        self.inner.put(index, sources)

    def state_dict(self):
        return self.inner.state_dict()

    def load_state_dict(self, state):
        self.inner.load_state_dict(state)

    def close(self):
        self.inner.close()


def test_the_built_in_storages_declare_their_contracts(tmp_path):
    spec = {"obs": ((3,), torch.float32), "action": ((), torch.int64)}
    ram = TensorStorage(spec, 16)
    disk = MemmapStorage(spec, 16, tmp_path / "d")
    tiered = TieredStorage(TensorStorage(spec, 4), TensorStorage(spec, 16))
    stream = StreamStorage(spec, 2, 16)
    kinds = (Storage, FastRows, PersistentStorage, PlacedStorage)
    assert [isinstance(ram, k) for k in kinds] == [True, True, False, False]
    assert [isinstance(disk, k) for k in kinds] == [True, True, True, False]
    assert [isinstance(tiered, k) for k in kinds] == [True, False, True, False]
    assert [isinstance(stream, k) for k in kinds] == [False, False, False, True]
    disk.close()


def test_a_user_storage_with_the_fast_contract_gets_the_fast_paths():
    """It used to take the slow paths silently (fast paths were chosen by exact type)."""
    store = CountingRows(SPEC, 16)
    rb = ReplayBuffer(store, seed=0)
    rb.extend(rows(0, 8))
    assert store.calls.get("put") == 1 and "write" not in store.calls
    rb.sample(4)
    assert store.calls.get("gather") == 1 and "read" not in store.calls


def test_a_user_sampler_without_declarations_gets_checked_paths():
    class Plain:  # a sampler from scratch: declares nothing
        def __init__(self):
            self.kinds = []

        def reset(self, capacity):
            self.capacity = capacity

        def on_write(self, index, batch):
            self.kinds.append({type(v) for v in batch.values()})

        def sample(self, batch_size, ctx):
            return np.full(batch_size, 3, dtype=np.int64), {}

        def state_dict(self):
            return {"kind": "plain"}

        def load_state_dict(self, state):
            pass

    store = CountingRows(SPEC, 16)
    sampler = Plain()
    assert isinstance(sampler, Sampler) and not declares(sampler, "returns_valid_indices")
    rb = ReplayBuffer(store, sampler=sampler, seed=0)
    rb.extend({k: v.numpy() for k, v in rows(0, 8).items()})
    assert sampler.kinds == [{torch.Tensor}]  # numpy given: it gets validated tensors
    rb.sample(4)
    assert store.calls.get("read") == 1 and "gather" not in store.calls


def test_guarantees_belong_to_the_class_that_defines_the_method():
    class Biased(UniformSampler):
        def sample(self, batch_size, ctx):
            return np.zeros(batch_size, dtype=np.int64), {}

    class Trusted(Biased):
        returns_valid_indices = True

        def sample(self, batch_size, ctx):
            return np.zeros(batch_size, dtype=np.int64), {}

    for s in (UniformSampler(), PrioritizedSampler(), SequenceSampler(2)):
        assert declares(s, "returns_valid_indices") and declares(s, "accepts_arrays")
    assert not declares(Biased(), "returns_valid_indices")  # overrides sample: checked
    assert declares(Biased(), "accepts_arrays")  # on_write is still the built-in one
    assert declares(Trusted(), "returns_valid_indices")


def test_a_stream_storage_has_no_ring_writer():
    spec = {"obs": ((2,), torch.float32), "action": ((), torch.int64)}
    rb = ReplayBuffer(StreamStorage(spec, 2, 32), seed=0)
    assert rb.writer is None
    for t in range(6):
        rb.extend(
            {
                "obs": torch.full((2, 2), float(t)),
                "action": torch.full((2,), t),
                "reward": torch.ones(2),
                "terminated": torch.zeros(2, dtype=torch.bool),
                "truncated": torch.zeros(2, dtype=torch.bool),
            }
        )
    assert len(rb) == 12 and rb.sample(4)["obs"].shape == (4, 2)


def test_an_incomplete_storage_is_refused_naming_what_it_lacks():
    class HalfPlaced:  # duck-typed as "placed" before: extend + valid
        capacity = 8
        valid = np.zeros(8, bool)

        def extend(self, batch):
            return np.zeros(0, np.int64)

    with pytest.raises(TypeError, match=r"storage: expected a Storage .* lacks \[.*'read'"):
        ReplayBuffer(HalfPlaced())
    assert "window" in missing_members(HalfPlaced(), PlacedStorage)


def test_a_non_sampler_is_refused_naming_what_it_lacks():
    class NotASampler:
        def sample(self, batch_size, ctx):
            return np.zeros(batch_size, np.int64), {}

    with pytest.raises(TypeError, match=r"sampler: expected a Sampler.*lacks \['load_state_dict'"):
        make(sampler=NotASampler())


@pytest.mark.parametrize(
    "sampler",
    [
        lambda: UniformSampler(replacement=False),
        lambda: PrioritizedSampler(alpha=0.7, beta=0.5, branching=16),
        lambda: SequenceSampler(3, end_keys=("terminated",)),
    ],
)
def test_samplers_are_saved_as_their_state_dict_not_pickled(tmp_path, sampler):
    rb = make(capacity=32, sampler=sampler())
    rb.extend(rows(0, 40))
    if isinstance(rb.sampler, PrioritizedSampler):
        rb.update_priorities(np.arange(8), np.linspace(0.1, 5, 8))
    rb.sample(4)
    rb.save(tmp_path / "rb.pt")
    state = torch.load(tmp_path / "rb.pt", weights_only=False)
    assert state["format"] >= 2 and type(state["sampler"]) is dict  # 2: its state_dict
    assert state["sampler"]["kind"] in ("uniform", "prioritized", "sequence")
    expected = [rb.sample(4) for _ in range(3)]
    loaded = ReplayBuffer.load(tmp_path / "rb.pt")
    assert type(loaded.sampler) is type(rb.sampler)
    for e in expected:
        got = loaded.sample(4)
        for k in e:
            torch.testing.assert_close(got[k], e[k])


class MySampler(UniformSampler):
    def state_dict(self):
        return {**super().state_dict(), "kind": "mine"}

    def load_state_dict(self, state):
        super().load_state_dict({**state, "kind": "uniform"})


def test_a_user_sampler_is_loaded_into_a_new_one_given_to_load(tmp_path):
    rb = make(capacity=16, sampler=MySampler())
    rb.extend(rows(0, 10))
    rb.save(tmp_path / "rb.pt")
    with pytest.raises(ValueError, match=r"kind 'mine'.*pass sampler="):
        ReplayBuffer.load(tmp_path / "rb.pt")
    loaded = ReplayBuffer.load(tmp_path / "rb.pt", sampler=MySampler())
    torch.testing.assert_close(loaded.sample(4)["index"], rb.sample(4)["index"])


def test_a_buffer_saved_by_format_1_still_loads(tmp_path):
    """Format 1 pickled the sampler object; such files load (their sampler's state is used)."""
    rb = make(capacity=16, sampler=PrioritizedSampler())
    rb.extend(rows(0, 10))
    state = rb.state_dict()
    state.update(format=1, sampler=rb.sampler)
    torch.save(state, tmp_path / "old.pt")
    expected = rb.sample(4)
    loaded = ReplayBuffer.load(tmp_path / "old.pt")
    torch.testing.assert_close(loaded.sample(4)["index"], expected["index"])


def test_a_registered_sampler_kind_is_rebuilt_by_load(tmp_path):
    """Sampler kinds register as storage kinds do (rlstash.sampler.kinds): once ``mine`` is
    registered, load rebuilds it by itself."""
    from rlstash.sampler import kinds

    rb = make(capacity=16, sampler=MySampler())
    rb.extend(rows(0, 10))
    rb.save(tmp_path / "rb.pt")
    kinds.register_kind("mine", lambda state: MySampler(bool(state["replacement"])))
    try:
        loaded = ReplayBuffer.load(tmp_path / "rb.pt")
    finally:
        del kinds._KINDS["mine"]
    assert type(loaded.sampler) is MySampler
    torch.testing.assert_close(loaded.sample(4)["index"], rb.sample(4)["index"])


def test_both_placements_follow_the_placement_contract(tmp_path):
    """One buffer path: an indexed storage's ring and a stream's own placement are both a
    core.Placement; the writer is the ring's, None for the stream; only a buffer over a
    stream hands out direct slots (core.DirectSteps)."""
    from rlstash.core import DirectSteps, Placement
    from rlstash.storage.placement import SelfPlacement
    from rlstash.storage.ring import RingPlacement

    spec = {"obs": ((2,), torch.float32), "action": ((), torch.int64)}
    ram = ReplayBuffer(TensorStorage(spec, 16), seed=0)
    stream = ReplayBuffer(StreamStorage(spec, 2, 32), seed=0)
    assert type(ram.placement) is RingPlacement and ram.writer is ram.placement.writer
    assert type(stream.placement) is SelfPlacement and stream.writer is None
    for rb in (ram, stream):
        assert isinstance(rb.placement, Placement), missing_members(rb.placement, Placement)
        assert isinstance(rb, DirectSteps)  # the buffer's open_steps: None where not possible
    assert ram.open_steps(4) is None
    assert isinstance(stream.storage, DirectSteps) and not isinstance(ram.storage, DirectSteps)
    assert stream.open_steps(4) is not None
