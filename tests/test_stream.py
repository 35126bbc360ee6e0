"""StreamStorage: lanes of observation slots against a naive (obs, next_obs) reference."""

from __future__ import annotations

import shutil
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.overrides import TorchFunctionMode

from rlstash.core import SampleContext
from rlstash.storage.stream import NPZ, ReadSpec, StreamStorage

SPEC = {"obs": ((2,), torch.int64), "action": ((), torch.int64), "uid": ((), torch.int64)}


def frame(e: int, ep: int, t: int) -> np.ndarray:
    """A frame that names its env, episode and time step."""
    return np.array([e * 10**6 + ep * 10**3 + t, (e + 3 * ep + t) % 7], dtype=np.int64)


def stack(frames: list[np.ndarray], k: int) -> np.ndarray:
    """The last k frames, padded at the start by repeating the first (FrameStack 'reset')."""
    pad = [frames[0]] * max(0, k - len(frames))
    return np.stack(pad + frames[-k:])  # [k, 2]


@dataclass
class Tr:
    uid: int
    obs: np.ndarray
    action: int
    reward: float
    next_obs: np.ndarray
    terminated: bool
    truncated: bool


class VecSim:
    """N scripted envs following gymnasium's autoreset conventions, plus the naive reference.

    ``step(ends)`` (one code per env: 0 runs on, 1 terminates, 2 truncates) returns the batch
    a collector passes to ``extend``; every real transition is recorded in ``naive[e]`` with
    ``obs``/``next_obs`` stacked ``k`` frames (a single frame when ``k == 1``), and every slot
    the stream should write is logged in ``log[e]`` as ``(start, done, episode position)``.
    """

    def __init__(self, n: int, k: int, autoreset: str, stacked_input: bool) -> None:
        self.n, self.k, self.autoreset, self.stacked = n, k, autoreset, stacked_input
        self.ep = [0] * n
        self.frames = [[frame(e, 0, 0)] for e in range(n)]  # frames of the current episode
        self.needs_reset = [False] * n
        self.naive: list[list[Tr]] = [[] for _ in range(n)]
        self.log: list[list[tuple[bool, bool, int]]] = [[] for _ in range(n)]
        self.steps = 0

    def view(self, e: int) -> np.ndarray:
        """What the env returns: a stacked obs, or the newest frame."""
        f = self.frames[e]
        return stack(f, self.k) if self.stacked else f[-1]

    def obs(self, e: int) -> np.ndarray:
        """The naive buffer's observation: k stacked frames (or one frame)."""
        f = self.frames[e]
        return stack(f, self.k) if self.k > 1 else f[-1]

    def step(self, ends: list[int]) -> dict[str, np.ndarray]:
        rows: dict[str, list] = {
            k: [] for k in ("obs", "action", "reward", "terminated", "truncated", "uid")
        }
        finals = []
        for e in range(self.n):
            uid = e * 10**6 + self.steps
            action, reward = uid % 3, float(uid % 5) - 1.5
            term, trunc = ends[e] == 1, ends[e] == 2
            row = {"obs": self.view(e), "action": action, "uid": uid}
            if self.autoreset == "next_step" and self.needs_reset[e]:
                row.update(reward=0.0, terminated=False, truncated=False)  # reset step
                self.log[e].append((False, False, len(self.frames[e]) - 1))
                self._reset(e)
                finals.append(np.zeros_like(row["obs"]))
            else:
                row.update(reward=reward, terminated=term, truncated=trunc)
                obs, pos = self.obs(e), len(self.frames[e]) - 1
                self.frames[e].append(frame(e, self.ep[e], len(self.frames[e])))
                self.naive[e].append(Tr(uid, obs, action, reward, self.obs(e), term, trunc))
                self.log[e].append((True, term or trunc, pos))
                finals.append(self.view(e))
                if term or trunc:
                    if self.autoreset == "next_step":
                        self.needs_reset[e] = True
                    else:
                        self.log[e].append((False, False, pos + 1))
                        self._reset(e)
            for key, v in row.items():
                rows[key].append(v)
        self.steps += 1
        batch = {k: np.array(v) for k, v in rows.items()}
        if self.autoreset == "same_step":
            batch["final_obs"] = np.stack(finals)
        return batch

    def collector_reset(self, with_final: bool) -> np.ndarray | None:
        """Every env is reset by the collector (no done flag); mirror ``end_episodes``.

        With the final obs: the last step is truncated at the obs the env showed (a next-step
        env whose last step was done just gets its final obs). Without it: the last stored
        step is dropped and the one before it is truncated.
        """
        finals = []
        for e in range(self.n):
            log, trs, pos = self.log[e], self.naive[e], len(self.frames[e]) - 1
            finals.append(self.view(e))
            if log and log[-1][0]:  # the last slot is a start whose next obs was not stored
                if with_final:
                    if not self.needs_reset[e]:
                        log[-1] = (True, True, log[-1][2])
                        trs[-1].truncated = True
                    log.append((False, False, pos))
                else:
                    log[-1] = (False, False, log[-1][2])
                    trs.pop()
                    if len(log) > 1 and log[-2][0]:
                        log[-2] = (True, True, log[-2][2])
                        trs[-1].truncated = True
            self._reset(e)
        return np.stack(finals) if with_final else None

    def _reset(self, e: int) -> None:
        self.ep[e] += 1
        self.frames[e] = [frame(e, self.ep[e], 0)]
        self.needs_reset[e] = False

    def nstep(self, uid: int, n: int, gamma: float) -> dict | None:
        """The naive n-step transition of ``uid``, or None when its steps are not all known."""
        e = uid // 10**6
        trs = self.naive[e]
        i = next((j for j, t in enumerate(trs) if t.uid == uid), None)
        if i is None:
            return None
        ret, m = 0.0, 0
        for j in range(n):
            if i + j >= len(trs):
                return None
            t = trs[i + j]
            ret += gamma**j * t.reward
            m = j + 1
            if t.terminated or t.truncated:
                break
        last = trs[i + m - 1]
        return dict(obs=trs[i].obs, action=trs[i].action, reward=ret, next_obs=last.next_obs,
                    terminated=last.terminated, truncated=last.truncated, discount=gamma**m)  # fmt: skip

    def alive(self, lane_capacity: int) -> set[int]:
        """uids of a naive per-env FIFO of ``lane_capacity`` transitions."""
        return {t.uid for trs in self.naive for t in trs[-lane_capacity:]}

    def brute_valid(self, L: int, n: int, k: int) -> np.ndarray:
        """The valid starts recomputed from scratch from the slot log."""
        valid = np.zeros(self.n * L, bool)
        for e, log in enumerate(self.log):
            c = len(log)
            for s in range(max(0, c - L), c):
                start, _, pos = log[s]
                if not start or s - min(pos, k - 1) < max(0, c - L):
                    continue
                m = None
                for j in range(n):
                    if s + j >= c:
                        break
                    m = j + 1
                    if log[s + j][1]:
                        break
                if m is not None and (m == n or log[s + m - 1][1]) and s + m <= c - 1:
                    valid[(s % L) * self.n + e] = True  # slot-major rows
        return valid


def by_lane(store, mask, lane=None):
    """Rows where ``mask`` holds, lane by lane and in lane position order (rows are slot-major,
    ``pos * N + lane``); only ``lane``'s when given."""
    N, L = store.num_envs, store.lane_capacity
    rows = np.arange(N * L).reshape(L, N).T  # [N, L] row of each lane position
    rows = rows if lane is None else rows[lane : lane + 1]
    return rows[mask[rows]]


def make(n, L, autoreset="next_step", n_step=1, gamma=0.9, k=1, stacked=False, **kw):
    spec = dict(SPEC)
    if stacked:
        spec["obs"] = ((k, 2), torch.int64)
    reads = ReadSpec(n_step=n_step, gamma=gamma, frame_stack=k)
    return StreamStorage(
        spec, n, n * L, autoreset=autoreset, reads=reads, stacked_input=stacked, **kw
    )


def check_against_naive(store: StreamStorage, sim: VecSim, n: int, gamma: float) -> None:
    """Every valid start reads what the naive buffer holds for the same (env, step)."""
    idx = np.flatnonzero(store.valid)
    if idx.size == 0:
        return
    got = store.read(idx)
    for i, uid in enumerate(got["uid"].tolist()):
        want = sim.nstep(uid, n, gamma)
        assert want is not None, f"uid {uid}: valid but its n-step transition is not complete"
        for key in ("obs", "next_obs"):
            np.testing.assert_array_equal(
                got[key][i].numpy(), want[key], err_msg=f"{key} uid {uid}"
            )
        assert got["action"][i].item() == want["action"]
        assert got["reward"][i].item() == pytest.approx(want["reward"], rel=1e-5, abs=1e-5)
        assert got["discount"][i].item() == pytest.approx(want["discount"], rel=1e-6)
        assert got["terminated"][i].item() == want["terminated"]
        assert got["truncated"][i].item() == want["truncated"]
        assert got["done"][i].item() == (want["terminated"] or want["truncated"])


# ---------------------------------------------------------------------------- property test
@st.composite
def streams(draw):
    n_envs = draw(st.integers(1, 3))
    n_step = draw(st.integers(1, 3))
    k = draw(st.integers(1, 3))
    L = draw(st.integers(n_step + k, n_step + k + 8))
    T = draw(st.integers(1, 40))
    ends = draw(
        st.lists(st.sampled_from([0] * 6 + [1, 2]), min_size=T * n_envs, max_size=T * n_envs)
    )
    autoreset = draw(st.sampled_from(["next_step", "same_step"]))
    stacked = draw(st.booleans()) if k > 1 else False
    resets = draw(st.lists(st.sampled_from([0] * 10 + [1, 2]), min_size=T, max_size=T))
    # steps per extend: single steps and [T, N] chunks, some longer than a lane (split)
    chunks = draw(st.lists(st.sampled_from([1, 1, 2, 3, 5, 8, 13, 21]), min_size=T, max_size=T))
    return n_envs, n_step, k, L, T, ends, autoreset, stacked, resets, chunks


def chunk_of(batches: list[dict]) -> dict:
    """Steps ``[N, ...]`` stacked time-major into one ``[T, N, ...]`` chunk."""
    return {key: np.stack([b[key] for b in batches]) for key in batches[0]}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(streams())
def test_property_every_valid_start_equals_the_naive_transition(case):
    """Steps go in as single steps and as [T, N] chunks (episodes ending mid-chunk, at its
    last step, truncated; chunks longer than a lane); after every extend ``valid`` equals a
    recompute from the slot log, and the stream equals one fed the same steps one by one
    (slots, data and the indices returned, in order)."""
    n_envs, n_step, k, L, T, ends, autoreset, stacked, resets, chunks = case
    gamma = 0.9
    store = make(n_envs, L, autoreset, n_step, gamma, k, stacked)
    steps = make(n_envs, L, autoreset, n_step, gamma, k, stacked)  # the same, step by step
    sim = VecSim(n_envs, k, autoreset, stacked)
    t = 0
    while t < T:
        if resets[t]:  # the collector resets every env (1: forgets the last obs, 2: passes it)
            fin = sim.collector_reset(with_final=resets[t] == 2)
            store.end_episodes(final_obs=fin)
            steps.end_episodes(final_obs=fin)
            np.testing.assert_array_equal(store.valid, sim.brute_valid(L, n_step, k))
        size = min(chunks[t], T - t)
        if size > 1 and any(resets[t + 1 : t + size]):
            size = 1 + resets[t + 1 : t + size].index(next(r for r in resets[t + 1 :] if r))
        batches = [sim.step(ends[(t + j) * n_envs : (t + j + 1) * n_envs]) for j in range(size)]
        got = store.extend(chunk_of(batches) if size > 1 else batches[0])
        want = np.concatenate([steps.extend(b) for b in batches])
        np.testing.assert_array_equal(got, want)  # the slots written, in step order
        # incremental validity equals a full recompute from the slot log, after every extend
        np.testing.assert_array_equal(store.valid, sim.brute_valid(L, n_step, k))
        t += size
    np.testing.assert_array_equal(store.valid, steps.valid)
    for key, v in store.backing.tensors.items():
        torch.testing.assert_close(v, steps.backing.tensors[key], msg=key)
    check_against_naive(store, sim, n_step, gamma)
    uids = (
        set(store.read(np.flatnonzero(store.valid))["uid"].tolist()) if store.valid.any() else set()
    )
    assert uids <= sim.alive(L)  # never more than a naive per-env FIFO of the same capacity
    assert store.size == sum(min(len(log), L) for log in sim.log)


@pytest.mark.parametrize("n_step,k", [(1, 1), (3, 2)])
def test_same_step_chunks_of_many_lanes_equal_the_step_by_step_stream(n_step, k):
    """Same-step chunks (the GPU simulators' mode: lanes drift apart, every ended step is
    followed by its final-obs slot, so the rows are scattered, not a strided block) over 64
    lanes that wrap their ring and are split (16 steps > L // 2): the slots, data, validity
    and transitions equal a stream fed one step at a time and the naive buffer."""
    n, L, T, gamma = 64, 24, 16, 0.9
    store = make(n, L, "same_step", n_step, gamma, k)
    steps = make(n, L, "same_step", n_step, gamma, k)
    sim = VecSim(n, k, "same_step", False)
    rng = np.random.default_rng(3)
    for _ in range(6):
        codes = rng.choice([0] * 8 + [1, 2], size=(T, n)).tolist()
        batches = [sim.step(c) for c in codes]
        got = store.extend({key: torch.from_numpy(v) for key, v in chunk_of(batches).items()})
        want = np.concatenate([steps.extend(b) for b in batches])
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(store.valid, steps.valid)
    assert len(set((store.lanes.count % L).tolist())) > 1  # the lanes drifted apart
    np.testing.assert_array_equal(store.lanes.flags, steps.lanes.flags)
    for key, v in store.backing.tensors.items():
        torch.testing.assert_close(v, steps.backing.tensors[key], msg=key)
    np.testing.assert_array_equal(store.valid, sim.brute_valid(L, n_step, k))
    check_against_naive(store, sim, n_step, gamma)


# ---------------------------------------------------------------------------- table-driven
def test_nstep_table_one_env():
    """Trajectory in, transitions out (Acme style): episode 1 terminates at t=2, episode 2
    is truncated at t=1; n=3, gamma=0.5, next-step autoreset."""
    store = make(1, 16, n_step=3, gamma=0.5)
    ends = [0, 0, 1, 0, 0, 2, 0, 0, 0, 0, 0]  # step 3 and step 6 are reset steps
    sim = VecSim(1, 1, "next_step", False)
    for code in ends:
        store.extend(sim.step([code]))
    got = store.read(np.flatnonzero(store.valid))
    r = [float(u % 5) - 1.5 for u in range(11)]
    table = [  # uid: (reward, next frame t, terminated, truncated, discount)
        (0, r[0] + 0.5 * r[1] + 0.25 * r[2], (0, 3), True, False, 0.125),
        (1, r[1] + 0.5 * r[2], (0, 3), True, False, 0.25),
        (2, r[2], (0, 3), True, False, 0.5),
        (4, r[4] + 0.5 * r[5], (1, 2), False, True, 0.25),
        (5, r[5], (1, 2), False, True, 0.5),
        (7, r[7] + 0.5 * r[8] + 0.25 * r[9], (2, 3), False, False, 0.125),
    ]
    assert got["uid"].tolist() == [row[0] for row in table]
    for i, (_, ret, (ep, t), term, trunc, disc) in enumerate(table):
        assert got["reward"][i].item() == pytest.approx(ret)
        assert got["next_obs"][i].tolist() == frame(0, ep, t).tolist()
        assert (got["terminated"][i].item(), got["truncated"][i].item()) == (term, trunc)
        assert got["discount"][i].item() == pytest.approx(disc)
    # slot 3 holds the final obs of episode 0 (no start); 8 and 9 lack successors for n=3
    assert store.valid[:11].tolist() == [1, 1, 1, 0, 1, 1, 0, 1, 0, 0, 0]


def test_frame_stack_pads_episode_start_with_its_first_frame():
    store = make(1, 12, k=4)
    sim = VecSim(1, 4, "next_step", False)
    for code in [0, 1, 0, 0, 0]:
        store.extend(sim.step([code]))
    got = store.read(np.array([0, 1, 3]))
    f = lambda ep, t: frame(0, ep, t).tolist()  # noqa: E731
    assert got["obs"][0].tolist() == [f(0, 0)] * 4
    assert got["obs"][1].tolist() == [f(0, 0)] * 3 + [f(0, 1)]
    assert got["next_obs"][1].tolist() == [f(0, 0)] * 2 + [f(0, 1), f(0, 2)]  # final obs
    assert got["obs"][2].tolist() == [f(1, 0)] * 4  # a new episode does not see the old one


def test_one_step_frame_stacks_share_one_gather_and_match_the_separate_one():
    """n_step = 1: next_obs's frames are obs's shifted by one slot, so one gather of k + 1
    frames serves both; it equals reading them separately (into ``out``), padding included."""
    store, _ = _filled(n=3, L=20, n_step=1, k=4, steps=60, seed=5)
    idx = np.flatnonzero(store.valid)
    nxt = store.lanes.nstep(idx)[3]
    assert store.lanes.shifts_by_one(idx, nxt)
    # the shift relation itself, padding at episode starts included
    np.testing.assert_array_equal(
        store.lanes.frame_rows(nxt),
        np.concatenate([store.lanes.frame_rows(idx), nxt[:, None]], 1)[:, 1:],
    )
    np.testing.assert_array_equal(  # the one-step window: the same rows in fewer steps
        store.lanes.one_step_window(idx),
        np.concatenate([store.lanes.frame_rows(idx), nxt[:, None]], 1),
    )
    written = np.flatnonzero(store.written)
    starts = written[~store.lanes.valid[written]]  # final-obs slots: their next slot is new
    assert not store.lanes.shifts_by_one(starts, store.lanes.nstep(starts)[3])
    assert store.lanes.one_step_window(starts) is None
    got = store.read(idx)
    assert got["obs"].untyped_storage().data_ptr() == got["next_obs"].untyped_storage().data_ptr()
    out = {k: torch.empty_like(v.contiguous()) for k, v in got.items()}
    sep = store.read(idx, out=out)  # the separate gathers (out given)
    assert sep["obs"].untyped_storage().data_ptr() != sep["next_obs"].untyped_storage().data_ptr()
    for k in got:
        torch.testing.assert_close(got[k], sep[k], msg=k)
    assert not store.lanes.shifts_by_one(idx[:1], idx[:1])  # not a successor: separate gathers


def test_frame_stack_history_overwritten_by_the_ring_is_not_a_valid_start():
    store = make(1, 5, k=3)  # lane of 5 slots
    sim = VecSim(1, 3, "next_step", False)
    for _ in range(9):
        store.extend(sim.step([0]))
    # slots hold steps 4..8; step 4 and 5 would need frames 2, 3 (overwritten); 8 is newest
    uids = store.read(np.flatnonzero(store.valid))["uid"].tolist()
    assert uids == [6, 7]


@pytest.mark.parametrize("autoreset", ["next_step", "same_step"])
def test_stacked_input_and_buffer_stacking_give_identical_samples(autoreset):
    rng = np.random.default_rng(0)
    ends = rng.choice([0, 0, 0, 0, 1, 2], size=(60, 2)).tolist()
    stores = [make(2, 12, autoreset, 2, 0.9, 4, stacked) for stacked in (False, True)]
    sims = [VecSim(2, 4, autoreset, stacked) for stacked in (False, True)]
    for code in ends:
        for store, sim in zip(stores, sims):
            store.extend(sim.step(code))
    np.testing.assert_array_equal(stores[0].valid, stores[1].valid)
    assert stores[1].backing.spec["obs"].shape == (2,)  # only the newest frame is stored
    ctx = SampleContext(
        stores[0].capacity, 0, stores[0].capacity, np.random.default_rng(1), stores[0].valid
    )
    idx = np.flatnonzero(ctx.valid)[ctx.rng.integers(0, ctx.valid.sum(), 64)]
    a, b = stores[0].read(idx), stores[1].read(idx)
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key])


def test_chunk_of_t_steps_equals_t_single_steps():
    ends = np.random.default_rng(1).choice([0, 0, 0, 1, 2], size=(20, 3)).tolist()
    for autoreset in ("next_step", "same_step"):
        one, chunk = make(3, 8, autoreset, n_step=2), make(3, 8, autoreset, n_step=2)
        sim = VecSim(3, 1, autoreset, False)
        batches = [sim.step(code) for code in ends]
        for b in batches:
            one.extend(b)
        idx = chunk.extend({k: np.stack([b[k] for b in batches]) for k in batches[0]})  # [T, N]
        assert idx.size >= 60
        np.testing.assert_array_equal(one.valid, chunk.valid)
        for key, t in one.backing.tensors.items():
            torch.testing.assert_close(t, chunk.backing.tensors[key])
        check_against_naive(chunk, sim, 2, 0.9)


class HostReads(TorchFunctionMode):
    """Counts the tensor operations that read data on the host (on a GPU each one waits for
    the device): ``.numpy()``, ``.tolist()``, ``.item()``, ``bool()``, ``.cpu()``, ``.to(cpu)``."""

    NAMES = {"numpy", "tolist", "item", "__bool__", "__int__", "__float__", "__index__", "cpu"}

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        to_host = name == "to" and "cpu" in [str(a) for a in (*args[1:], *kwargs.values())]
        self.count += name in self.NAMES or to_host
        return func(*args, **kwargs)


@pytest.mark.parametrize("autoreset", ["next_step", "same_step"])
def test_a_chunk_reads_its_flags_on_the_host_once_not_per_step(autoreset, monkeypatch):
    """A [T, N] chunk is one extend: its flags reach the host in one call (on a GPU one copy,
    the only device-to-host read of the write path), and the host reads of an extend do
    not grow with T."""
    import rlstash.storage.stream_write as stream_mod

    flag_reads = []
    real = stream_mod.host_flags

    def counted(*args):
        flag_reads.append(args[2])  # T
        return real(*args)

    monkeypatch.setattr(stream_mod, "host_flags", counted)
    reads = {}
    for T in (2, 16):
        store = make(3, 64, autoreset, n_step=2)
        sim = VecSim(3, 1, autoreset, False)
        rng = np.random.default_rng(T)
        chunks = [
            {k: torch.from_numpy(v) for k, v in chunk_of([sim.step(c) for c in codes]).items()}
            for codes in rng.choice([0, 0, 1, 2], size=(3, T, 3)).tolist()
        ]
        store.extend(chunks[0])
        flag_reads.clear()
        with HostReads() as mode:
            for chunk in chunks[1:]:
                store.extend(chunk)
        reads[T] = mode.count
        assert flag_reads == [T, T]  # one host copy of the flags per chunk
        check_against_naive(store, sim, 2, 0.9)
    assert reads[2] == reads[16] > 0


# ---------------------------------------------------------------------------- validation
def test_bad_input_raises_and_writes_nothing():
    store = make(2, 6)
    sim = VecSim(2, 1, "next_step", False)
    store.extend(sim.step([0, 0]))
    good = sim.step([0, 0])
    snapshot = (store.valid.copy(), store.written.copy(), store.backing.tensors["obs"].clone())
    cases = [
        ({**good, "obs": good["obs"][:1]}, ValueError, "N=2"),  # wrong number of envs
        ({**good, "obs": good["obs"][:, :1]}, ValueError, "obs"),  # wrong row shape
        ({**good, "action": good["action"] + 0.5}, TypeError, "action"),  # lossy cast
        ({k: v for k, v in good.items() if k != "reward"}, ValueError, "reward"),
        ({**good, "final_obs": good["obs"]}, ValueError, "final_obs"),  # wrong convention
        ({**good, "extra": good["uid"]}, ValueError, "extra"),
        ({**good, "uid": good["uid"][:1]}, ValueError, "uid"),
        ("not a dict", TypeError, "batch"),
    ]
    for batch, exc, word in cases:
        with pytest.raises(exc, match=word):
            store.extend(batch)
    np.testing.assert_array_equal(store.valid, snapshot[0])
    np.testing.assert_array_equal(store.written, snapshot[1])
    torch.testing.assert_close(store.backing.tensors["obs"], snapshot[2])
    same = make(2, 6, "same_step")
    with pytest.raises(ValueError, match="final_obs"):
        same.extend(good)
    assert not same.written.any()


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="n_step"):
        ReadSpec(n_step=0)
    with pytest.raises(ValueError, match="gamma"):
        ReadSpec(gamma=1.5)
    with pytest.raises(ValueError, match="capacity"):
        make(4, 2, n_step=3)
    with pytest.raises(ValueError, match="autoreset"):
        make(1, 8, autoreset="never")
    with pytest.raises(ValueError, match="'obs'"):
        StreamStorage({"action": ((), torch.int64)}, 1, 8)
    with pytest.raises(ValueError, match="stacked_input"):
        StreamStorage(SPEC, 1, 8, reads=ReadSpec(frame_stack=4), stacked_input=True)
    with pytest.raises(ValueError, match="reserved"):
        StreamStorage({**SPEC, "next_obs": ((2,), torch.int64)}, 1, 8)
    with pytest.raises(ValueError, match="path"):
        StreamStorage(SPEC, 1, 8, backing="disk")


def test_read_refuses_invalid_starts():
    store = make(1, 8)
    sim = VecSim(1, 1, "next_step", False)
    for code in [0, 1, 0]:
        store.extend(sim.step([code]))
    with pytest.raises(ValueError, match="not valid"):
        store.read(np.array([2]))  # the final-obs slot
    with pytest.raises(ValueError, match="not valid"):
        store.read(np.array([1, 5]))  # unwritten
    with pytest.raises(IndexError, match="capacity|\\[0, 8\\)"):
        store.read(np.array([8]))
    with pytest.raises(TypeError, match="integer"):
        store.read(np.array([0.5]))


def test_read_into_out_and_index_shapes():
    store = make(2, 10, n_step=2, k=3)
    sim = VecSim(2, 3, "next_step", False)
    for code in np.random.default_rng(2).choice([0, 0, 1], size=(15, 2)).tolist():
        store.extend(sim.step(code))
    idx = np.flatnonzero(store.valid)[:4].reshape(2, 2)
    want = store.read(idx)
    assert want["obs"].shape == (2, 2, 3, 2) and want["reward"].shape == (2, 2)
    out = {k: torch.empty(2, 2, *f.shape, dtype=f.dtype) for k, f in store.sample_spec.items()}
    got = store.read(idx, out=out)
    assert got is out
    for key in want:
        torch.testing.assert_close(out[key], want[key])
    with pytest.raises(ValueError, match="missing"):
        store.read(idx, out={"obs": out["obs"]})


# ---------------------------------------------------------------------------- samplers
def _filled(autoreset="next_step", n=3, L=20, n_step=2, k=2, steps=50, seed=3):
    store = make(n, L, autoreset, n_step, 0.9, k)
    sim = VecSim(n, k, autoreset, False)
    for code in np.random.default_rng(seed).choice([0, 0, 0, 0, 1, 2], size=(steps, n)).tolist():
        store.extend(sim.step(code))
    return store, sim


def _ctx(store, seed=0):
    return SampleContext(
        store.capacity, 0, store.capacity, np.random.default_rng(seed), store.valid, store.window
    )


def test_uniform_and_prioritized_samplers_never_return_invalid_starts():
    from rlstash.sampler import PrioritizedSampler, UniformSampler

    store, sim = _filled()
    for sampler in (UniformSampler(), UniformSampler(replacement=False), PrioritizedSampler()):
        sampler.reset(store.capacity)
        sampler.on_write(np.flatnonzero(store.written), {})
        for _ in range(20):
            idx, _extra = sampler.sample(32, _ctx(store))
            assert store.valid[idx].all()
            got = store.read(idx)
            want = [sim.nstep(u, 2, 0.9)["reward"] for u in got["uid"].tolist()]
            np.testing.assert_allclose(got["reward"].numpy(), want, rtol=1e-5, atol=1e-5)


def test_prioritized_sampler_follows_validity_as_the_stream_moves():
    from rlstash.sampler import PrioritizedSampler

    store = make(2, 10, n_step=3, k=2)
    sim = VecSim(2, 2, "next_step", False)
    sampler = PrioritizedSampler()
    sampler.reset(store.capacity)
    rng = np.random.default_rng(4)
    for t in range(80):
        sampler.on_write(store.extend(sim.step(rng.choice([0, 0, 0, 1, 2], 2).tolist())), {})
        if store.valid.any():
            idx, extra = sampler.sample(16, _ctx(store, t))
            assert store.valid[idx].all()
            sampler.update_priorities(idx, rng.random(16))


def test_windows_follow_lanes_and_stay_in_one_episode():
    store, sim = _filled(n=2, L=12, n_step=1, k=1, steps=40)
    L, N = store.lane_capacity, store.num_envs
    w = store.window(np.array([3 * N, (L - 2) * N + 1]), 4)  # lane 0 pos 3, lane 1 pos L - 2
    # slot-major rows (pos * N + lane): a window steps by N rows and wraps within its lane
    assert w.tolist() == [[6, 8, 10, 12], [(L - 2) * N + 1, (L - 1) * N + 1, 1, N + 1]]
    ok = store.valid_windows(4)
    starts = np.flatnonzero(ok)
    assert starts.size
    rows = store.window(starts, 4)
    assert store.valid[rows].all()
    got = store.read(rows)  # [B, 4]
    assert got["obs"].shape == (starts.size, 4, 2)
    # consecutive steps of one episode: next_obs of step j is obs of step j + 1, no done before the end
    torch.testing.assert_close(got["next_obs"][:, :-1], got["obs"][:, 1:])
    assert not got["done"][:, :-1].any()
    assert not (store.valid[store.window(np.flatnonzero(store.valid & ~ok), 4)].all(1)).any()


def test_sequence_sampler_with_window():
    from rlstash.sampler import SequenceSampler

    store = make(4, 16)
    sim = VecSim(4, 1, "next_step", False)
    for t in range(70):  # long episodes: windows across a lane boundary would look valid
        store.extend(sim.step([int(t == 40)] * 4))
    seq = SequenceSampler(4)
    seq.reset(store.capacity)
    written = np.flatnonzero(store.written)
    seq.on_write(written, store.step_flags(written))
    for s in range(10):
        idx, _ = seq.sample(8, _ctx(store, s))
        rows = idx.reshape(-1, 4)
        assert (rows % 4 == rows[:, :1] % 4).all(), "a window left its env's lane"  # pos * N + e
        np.testing.assert_array_equal((rows[:, 1:] // 4 - rows[:, :-1] // 4) % 16, 1)
        assert store.valid[rows].all()
        got = store.read(rows)
        torch.testing.assert_close(got["next_obs"][:, :-1], got["obs"][:, 1:])
        uid = got["uid"].numpy()  # env * 10**6 + step: one env's consecutive steps
        assert (np.diff(uid, axis=1) == 1).all() and (uid[:, 0] // 10**6 == rows[:, 0] % 4).all()
    assert (store.lanes.count > 16).all()  # the windows were drawn across the ring's wrap


# ---------------------------------------------------------------------------- episodes cut
def test_end_episodes_truncates_at_the_last_stored_obs_and_never_stitches():
    store = make(2, 16, n_step=3, gamma=0.5)
    sim = VecSim(2, 1, "next_step", False)
    for _ in range(5):
        store.extend(sim.step([0, 0]))
    store.end_episodes([0])  # env 0 restarted: its step from obs 4 has no result
    sim.frames[0] = [frame(0, 99, 0)]  # a fresh episode
    for _ in range(4):
        store.extend(sim.step([0, 0]))
    got = store.read(by_lane(store, store.valid, lane=0))
    assert got["uid"].tolist() == [0, 1, 2, 3, 5]  # 4 is a final obs now; 5.. is a new episode
    assert got["truncated"].tolist() == [False, True, True, True, False]
    f = [frame(0, 0, t).tolist() for t in (3, 4, 4, 4)]
    assert got["next_obs"][:4].tolist() == f
    assert got["discount"].tolist() == [0.125, 0.125, 0.25, 0.5, 0.125]
    assert store.read(np.array([store.lanes.row(1, 0)]))["uid"].item() == 10**6  # env 1 untouched


def test_end_episodes_with_the_final_obs_keeps_the_last_step_truncated():
    store = make(2, 16, n_step=2, gamma=0.5)
    sim = VecSim(2, 1, "next_step", False)
    for code in ([0, 0], [0, 1], [0, 0]):  # env 1 terminated at step 1; step 2 is its reset step
        store.extend(sim.step(code))
    with pytest.raises(ValueError, match="one row per env"):
        store.end_episodes(final_obs=np.zeros((1, 2), np.int64))
    shown = np.stack([sim.view(0), sim.view(1)])  # what each env showed, never extended
    store.end_episodes(final_obs=shown)
    got = store.read(by_lane(store, store.valid))
    assert got["uid"].tolist() == [0, 1, 2, 10**6, 10**6 + 1]
    assert got["truncated"].tolist() == [False, True, True, False, False]
    assert got["terminated"].tolist() == [False, False, False, True, True]
    assert got["next_obs"][2].tolist() == frame(0, 0, 3).tolist()  # the obs env 0 showed
    assert store.written.sum() == 4 + 3  # env 0 got a final-obs slot, env 1 had one already


# ---------------------------------------------------------------------------- memory
def test_w2_memory_is_at_most_0_14_of_a_naive_obs_next_obs_buffer():
    spec = {"obs": ((4, 84, 84), torch.uint8), "action": ((), torch.int64)}
    stream = StreamStorage.plan_bytes(spec, 100_000, frame_stack=4, stacked_input=True)
    naive = StreamStorage.naive_bytes(spec, 100_000, frame_stack=4, stacked_input=True)
    assert stream["obs"] == 100_000 * 84 * 84
    assert naive["obs"] == naive["next_obs"] == 100_000 * 4 * 84 * 84
    ratio = sum(stream.values()) / sum(naive.values())
    assert ratio <= 0.14, ratio
    # with a slot per episode end: even 10-step episodes need 10% more slots
    assert (
        sum(StreamStorage.plan_bytes(spec, 110_000, 4, True).values()) / sum(naive.values()) <= 0.14
    )
    small = StreamStorage(spec, 4, 64, reads=ReadSpec(frame_stack=4), stacked_input=True)
    assert small.nbytes == sum(StreamStorage.plan_bytes(spec, 64, 4, True, num_envs=4).values())


def test_compare_layouts_for_rlstash_plan():
    from rlstash.diag.layouts import compare_layouts

    w2 = {"obs": ((4, 84, 84), torch.uint8), "action": ((), torch.int64),
          "reward": ((), torch.float32), "next_obs": ((4, 84, 84), torch.uint8)}  # fmt: skip
    text = compare_layouts(w2, 100_000, num_envs=8, frame_stack=4)
    ratio = float(text.splitlines()[2].split()[-1])
    assert ratio <= 0.14 and "frame stacks of 4" in text and "8 lanes of 12,500" in text
    vec = {
        "obs": ((4,), torch.float32),
        "action": ((), torch.int64),
        "next_obs": ((4,), torch.float32),
    }
    text = compare_layouts(vec, 1000, num_envs=2, frame_stack=4)  # a vector obs is not a stack
    assert "frame stacks" not in text
    stream = 31 * 1000 + 2 * 42  # 31 B per slot, 42 B per lane (bookkeeping)
    assert float(text.splitlines()[2].split()[-1]) == pytest.approx(stream / 46_000, abs=1e-3)


# ---------------------------------------------------------------------------- state and disk
def episode_of(obs: torch.Tensor) -> np.ndarray:
    return (obs[..., 0].numpy() // 1000) % 1000


def test_state_dict_roundtrip_ram_and_no_stitching_after_load():
    store, sim = _filled("same_step", n_step=3)
    state = store.state_dict()
    back = StreamStorage.from_state_dict(state)
    np.testing.assert_array_equal(back.valid, store.valid)  # samples what the original would
    idx = np.flatnonzero(back.valid)
    a, b = store.read(idx), back.read(idx)
    for key in a:
        torch.testing.assert_close(a[key], b[key])
    for e in range(sim.n):  # the collector starts over with fresh envs
        sim._reset(e)
    for _ in range(4):
        back.extend(sim.step([0] * sim.n))
    got = back.read(np.flatnonzero(back.valid))
    for key in ("next_obs",):  # n-step windows never join the old and the new episode
        np.testing.assert_array_equal(episode_of(got["obs"])[:, -1], episode_of(got[key])[:, -1])
    with pytest.raises(ValueError, match="settings"):
        make(3, 20, "next_step", 2, 0.9, 2).load_state_dict(state)


def test_disk_backing_resumes_after_close(tmp_path):
    path = tmp_path / "stream"
    store = make(2, 16, "same_step", 2, 0.9, 2, backing="disk", path=path)
    sim = VecSim(2, 2, "same_step", False)
    rng = np.random.default_rng(5)
    for code in rng.choice([0, 0, 0, 1, 2], size=(45, 2)).tolist():
        store.extend(sim.step(code))
    valid = store.valid.copy()
    before = store.read(np.flatnonzero(valid))
    store.close()
    with make(2, 16, "same_step", 2, 0.9, 2, backing="disk", path=path) as again:
        np.testing.assert_array_equal(again.valid, valid)  # a clean close loses nothing
        got = again.read(np.flatnonzero(valid))
        for key in before:
            torch.testing.assert_close(got[key], before[key])
        for e in range(sim.n):  # fresh envs after the restart
            sim._reset(e)
        for code in rng.choice([0, 0, 0, 1, 2], size=(5, 2)).tolist():
            again.extend(sim.step(code))
        got = again.read(np.flatnonzero(again.valid))
        np.testing.assert_array_equal(
            episode_of(got["obs"])[:, -1], episode_of(got["next_obs"])[:, -1]
        )
    with pytest.raises(ValueError, match="other settings"):
        make(2, 16, "next_step", 2, 0.9, 2, backing="disk", path=path)


@pytest.mark.parametrize("chunk", [1, 7])
def test_disk_crash_snapshot_never_reads_overwritten_slots(tmp_path, chunk):
    """Copy the directory mid-run (what a killed process leaves) and reopen the copy: every
    valid start equals the naive transition (a cut one may be truncated), nothing is torn.
    Chunks of 7 steps grow a lane by more than the 2 slots a save vouches for by default."""
    path = tmp_path / "live"
    store = make(2, 32, "next_step", 1, 0.9, 2, backing="disk", path=path)
    sim = VecSim(2, 2, "next_step", False)
    rng = np.random.default_rng(6)
    codes = rng.choice([0, 0, 0, 0, 1, 2], size=(112, 2)).tolist()
    for t in range(chunk - 1, len(codes), chunk):
        batches = [sim.step(c) for c in codes[t - chunk + 1 : t + 1]]
        store.extend(chunk_of(batches) if chunk > 1 else batches[0])
        if t in (37, 81, 109, 41, 83, 111):
            snap = tmp_path / f"snap{t}"
            shutil.copytree(path, snap)
            with make(2, 32, "next_step", 1, 0.9, 2, backing="disk", path=snap) as back:
                idx = np.flatnonzero(back.valid)
                assert idx.size > 10
                got = back.read(idx)
                for i, uid in enumerate(got["uid"].tolist()):
                    want = sim.nstep(uid, 1, 0.9)
                    np.testing.assert_array_equal(got["obs"][i].numpy(), want["obs"])
                    np.testing.assert_array_equal(got["next_obs"][i].numpy(), want["next_obs"])
                    assert got["reward"][i].item() == pytest.approx(want["reward"])
                    assert got["terminated"][i].item() == want["terminated"]
                    assert got["truncated"][i].item() in (want["truncated"], True)
    store.close()


def test_disk_refuses_a_plain_memmap_directory(tmp_path):
    from rlstash.storage.disk import MemmapStorage

    MemmapStorage({"x": ((), torch.float32)}, 4, tmp_path / "plain").close()
    with pytest.raises(ValueError, match=NPZ):
        make(1, 8, backing="disk", path=tmp_path / "plain")
