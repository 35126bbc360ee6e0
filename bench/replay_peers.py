"""Workloads and the replay buffers compared in bench/replay.py, each behind one small adapter.

Every adapter stores a workload's fields at its capacity, is filled to capacity through the
peer's own API (Stable-Baselines3: by writing its arrays, its ``add`` takes n_envs rows per
call), and gives ``run(n)`` callables for the timed operations:

- ``sample_run()``: n x sample(batch) (W3: + update priorities of the sampled rows);
- ``extend_run(chunks)``: n x extend(one chunk), cycling through pre-built chunks, each
  already in the peer's native format (numpy, TensorDict, dict of tensors).

The limit is numpy itself: ``np.take(field, idx, axis=0, out=buf, mode="clip")`` per field
with ``idx`` drawn by ``numpy.random.Generator.integers`` (exactly the bytes of one batch);
its extend is a slice assignment per field into preallocated arrays (ring cursor).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

Chunk = dict[str, np.ndarray]  # field -> [rows, *shape]
Run = Callable[[int], object]


@dataclass(frozen=True)
class Workload:
    """Fields (per-row shape, numpy dtype), capacity, batch size, what is timed."""

    name: str
    title: str
    fields: dict[str, tuple[tuple[int, ...], str]]
    capacity: int
    batch: int
    extend_chunks: tuple[int, ...] = ()
    prioritized: bool = False
    alpha: float = 0.6
    beta: float = 0.4
    fill_rows: int = 8192  # rows per fill chunk

    @property
    def row_bytes(self) -> int:
        return sum(
            int(np.prod(s, dtype=np.int64)) * np.dtype(d).itemsize for s, d in self.fields.values()
        )

    @property
    def batch_bytes(self) -> int:
        """Bytes of the fields of one sampled batch: what the limit gathers."""
        return self.batch * self.row_bytes

    @property
    def stored_bytes(self) -> int:
        return self.capacity * self.row_bytes


_VECTOR = {
    "obs": ((17,), "float32"),
    "next_obs": ((17,), "float32"),
    "action": ((6,), "float32"),
    "reward": ((), "float32"),
    "done": ((), "float32"),
}
_PIXELS = {"obs": ((4, 84, 84), "uint8"), "action": ((), "int64")}


def workloads(quick: bool) -> dict[str, Workload]:
    """W1 vector, W2 pixels, W3 prioritized; ``quick`` shrinks capacities for a smoke run."""
    cap1, cap2 = (20_000, 2_000) if quick else (1_000_000, 100_000)
    return {
        "W1": Workload("W1", "vector", _VECTOR, cap1, 256, extend_chunks=(8, 1024)),
        "W2": Workload("W2", "pixels", _PIXELS, cap2, 32, fill_rows=512),
        "W3": Workload("W3", "prioritized", _VECTOR, cap1, 256, prioritized=True),
    }


def make_chunks(wl: Workload, rows: int, count: int, seed: int) -> list[Chunk]:
    """``count`` random chunks of ``rows`` rows (done ~1%, pixels uniform bytes)."""
    rng = np.random.default_rng(seed)
    chunks = []
    for _ in range(count):
        chunk: Chunk = {}
        for name, (shape, dtype) in wl.fields.items():
            size = (rows, *shape)
            if name == "done":
                chunk[name] = (rng.random(size) < 0.01).astype(dtype)
            elif np.dtype(dtype) == np.uint8:
                chunk[name] = rng.integers(0, 256, size, dtype=np.uint8)
            elif np.dtype(dtype).kind == "i":
                chunk[name] = rng.integers(0, 18, size, dtype=dtype)
            else:
                chunk[name] = rng.standard_normal(size, dtype=np.float32).astype(dtype)
        chunks.append(chunk)
    return chunks


def priority_pool(wl: Workload, count: int = 16, seed: int = 1) -> list[np.ndarray]:
    """Pre-drawn new priorities (float32 [batch]) standing in for a learner's |TD errors|."""
    rng = np.random.default_rng(seed)
    return [(rng.random(wl.batch) * 2 + 0.01).astype(np.float32) for _ in range(count)]


def nbytes(obj: object) -> int:
    """Bytes of every array/tensor in a (nested) sample result."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if hasattr(obj, "values") and callable(obj.values):  # dict, TensorDict
        try:
            values = obj.values(include_nested=True, leaves_only=True)
        except TypeError:
            values = obj.values()
        return sum(nbytes(v) for v in values)
    if isinstance(obj, tuple | list):
        return sum(nbytes(v) for v in obj)
    return 0


def _fill_slices(capacity: int, pool: list[Chunk]) -> list[Chunk]:
    """Consecutive chunks from ``pool`` (cycled) covering exactly ``capacity`` rows."""
    out, done, i = [], 0, 0
    while done < capacity:
        chunk = pool[i % len(pool)]
        rows = min(len(next(iter(chunk.values()))), capacity - done)
        out.append({k: v[:rows] for k, v in chunk.items()})
        done, i = done + rows, i + 1
    return out


class Peer:
    """Adapter base: subclasses build storage in ``__init__`` and implement the hooks."""

    label = "peer"

    def __init__(self, wl: Workload, workdir: Path) -> None:
        self.wl = wl
        self.workdir = workdir
        self.prios = priority_pool(wl)

    def fill(self, pool: list[Chunk]) -> None:
        for chunk in _fill_slices(self.wl.capacity, pool):
            self.add(self.native(chunk))

    def native(self, chunk: Chunk) -> object:
        """A chunk in the format this peer's users hold (converted before timing)."""
        return chunk

    def add(self, item: object) -> None:
        raise NotImplementedError

    def sample(self) -> object:
        raise NotImplementedError

    def sample_run(self) -> Run:
        def run(n: int) -> None:
            for _ in range(n):
                self.sample()

        return run

    def extend_run(self, chunks: list[Chunk]) -> Run:
        items = [self.native(c) for c in chunks]
        add, k = self.add, len(items)

        def run(n: int) -> None:
            for i in range(n):
                add(items[i % k])

        return run

    def close(self) -> None:
        """Release what the peer holds (files are removed with the work directory)."""


class NumpyLimit(Peer):
    """The physical limit: numpy gather / slice assignment of exactly the batch's bytes."""

    label = "limit (numpy)"

    def __init__(self, wl: Workload, workdir: Path) -> None:
        super().__init__(wl, workdir)
        cap = wl.capacity
        self.arrays = {k: np.empty((cap, *s), dtype=d) for k, (s, d) in wl.fields.items()}
        self.out = {k: np.empty((wl.batch, *s), dtype=d) for k, (s, d) in wl.fields.items()}
        self.rng = np.random.default_rng(0)
        self.cursor = 0

    def add(self, item: Chunk) -> None:
        rows = len(next(iter(item.values())))
        start, cap = self.cursor, self.wl.capacity
        first = min(rows, cap - start)  # rows before the ring wraps
        for k, arr in self.arrays.items():
            arr[start : start + first] = item[k][:first]
            if first < rows:
                arr[: rows - first] = item[k][first:]
        self.cursor = (start + rows) % cap

    def sample(self) -> object:
        idx = self.rng.integers(0, self.wl.capacity, self.wl.batch)
        for k, arr in self.arrays.items():
            np.take(arr, idx, axis=0, out=self.out[k], mode="clip")
        return self.out


class TorchRLBuffer(Peer):
    """TorchRL ReplayBuffer (LazyTensorStorage / LazyMemmapStorage) or its prioritized buffer."""

    def __init__(self, wl: Workload, workdir: Path, memmap: bool) -> None:
        super().__init__(wl, workdir)
        logging.getLogger("torchrl").setLevel(logging.WARNING)
        from tensordict import TensorDict
        from torchrl.data import (
            LazyMemmapStorage,
            LazyTensorStorage,
            ReplayBuffer,
            TensorDictPrioritizedReplayBuffer,
        )

        self._td = TensorDict
        if memmap:
            storage = LazyMemmapStorage(wl.capacity, scratch_dir=str(workdir / "torchrl"))
        else:
            storage = LazyTensorStorage(wl.capacity)
        if wl.prioritized:
            self.rb = TensorDictPrioritizedReplayBuffer(
                alpha=wl.alpha, beta=wl.beta, storage=storage, batch_size=wl.batch
            )
        else:
            self.rb = ReplayBuffer(storage=storage, batch_size=wl.batch)
        self.tprios = [torch.from_numpy(p) for p in self.prios]
        self.label = "TorchRL " + ("LazyMemmapStorage" if memmap else "LazyTensorStorage")
        if wl.prioritized:
            self.label = "TorchRL TensorDictPrioritizedReplayBuffer"

    def native(self, chunk: Chunk) -> object:
        rows = len(next(iter(chunk.values())))
        return self._td({k: torch.from_numpy(v) for k, v in chunk.items()}, batch_size=[rows])

    def add(self, item: object) -> None:
        self.rb.extend(item)

    def sample(self) -> object:
        return self.rb.sample()

    def sample_run(self) -> Run:
        if not self.wl.prioritized:
            return super().sample_run()
        rb, prios, k = self.rb, self.tprios, len(self.tprios)

        def run(n: int) -> None:
            for i in range(n):
                td = rb.sample()
                rb.update_priority(td["index"], prios[i % k])

        return run


class SB3Buffer(Peer):
    """Stable-Baselines3 ReplayBuffer (W2: optimize_memory_usage, next obs read from obs[i+1])."""

    label = "Stable-Baselines3 ReplayBuffer"

    def __init__(self, wl: Workload, workdir: Path) -> None:
        super().__init__(wl, workdir)
        if wl.prioritized:
            raise ValueError("Stable-Baselines3 has no prioritized replay buffer")
        self.rb = self._make(n_envs=1)

    def _make(self, n_envs: int) -> object:
        import gymnasium as gym
        from stable_baselines3.common.buffers import ReplayBuffer

        pixels = "next_obs" not in self.wl.fields
        if pixels:
            obs_space = gym.spaces.Box(0, 255, self.wl.fields["obs"][0], np.uint8)
            act_space = gym.spaces.Discrete(18)
        else:
            obs_space = gym.spaces.Box(-np.inf, np.inf, self.wl.fields["obs"][0], np.float32)
            act_space = gym.spaces.Box(-1, 1, self.wl.fields["action"][0], np.float32)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # its memory-size warning
            return ReplayBuffer(
                self.wl.capacity,
                obs_space,
                act_space,
                device="cpu",
                n_envs=n_envs,
                optimize_memory_usage=pixels,
                handle_timeout_termination=not pixels,
            )

    def fill(self, pool: list[Chunk]) -> None:
        rb, start = self.rb, 0
        for chunk in _fill_slices(self.wl.capacity, pool):
            rows = len(chunk["obs"])
            sl = slice(start, start + rows)
            rb.observations[sl, 0] = chunk["obs"]
            if getattr(rb, "next_observations", None) is not None:
                rb.next_observations[sl, 0] = chunk["next_obs"]
            rb.actions[sl, 0] = chunk["action"].reshape(rows, -1)
            rb.rewards[sl, 0] = chunk.get("reward", 0.0)
            rb.dones[sl, 0] = chunk.get("done", 0.0)
            start += rows
        rb.pos, rb.full = 0, True

    def sample(self) -> object:
        return self.rb.sample(self.wl.batch)

    def extend_run(self, chunks: list[Chunk]) -> Run:
        rows = len(chunks[0]["obs"])
        rb = self._make(n_envs=rows)  # SB3 adds one row per env per call
        for name in ("observations", "next_observations", "actions", "rewards", "dones"):
            arr = getattr(rb, name, None)
            if arr is not None:
                arr.fill(0)  # touch the pages: steady state, as the other peers are filled
        if hasattr(rb, "timeouts"):
            rb.timeouts.fill(0)
        infos = [{} for _ in range(rows)]
        items = [(c["obs"], c["next_obs"], c["action"], c["reward"], c["done"]) for c in chunks]
        k = len(items)

        def run(n: int) -> None:
            for i in range(n):
                rb.add(*items[i % k], infos)

        self._extend_rb = rb  # kept alive for the whole run
        return run


class CpprbBuffer(Peer):
    """cpprb ReplayBuffer / PrioritizedReplayBuffer (returns numpy arrays)."""

    def __init__(self, wl: Workload, workdir: Path) -> None:
        super().__init__(wl, workdir)
        import cpprb

        env = {k: {"shape": s or 1, "dtype": np.dtype(d)} for k, (s, d) in wl.fields.items()}
        if wl.prioritized:
            self.rb = cpprb.PrioritizedReplayBuffer(wl.capacity, env, alpha=wl.alpha)
            self.label = "cpprb PrioritizedReplayBuffer"
        else:
            self.rb = cpprb.ReplayBuffer(wl.capacity, env)
            self.label = "cpprb ReplayBuffer"

    def add(self, item: object) -> None:
        self.rb.add(**item)

    def sample(self) -> object:
        if self.wl.prioritized:
            return self.rb.sample(self.wl.batch, beta=self.wl.beta)
        return self.rb.sample(self.wl.batch)

    def sample_run(self) -> Run:
        if not self.wl.prioritized:
            return super().sample_run()
        rb, prios, k, b, beta = self.rb, self.prios, len(self.prios), self.wl.batch, self.wl.beta

        def run(n: int) -> None:
            for i in range(n):
                s = rb.sample(b, beta=beta)
                rb.update_priorities(s["indexes"], prios[i % k])

        return run


def _rlstash_api() -> dict[str, object]:
    """The rlstash classes, from the package root or, until it re-exports them, the modules."""
    names = ("ReplayBuffer", "TensorStorage", "MemmapStorage", "PrioritizedSampler")
    names += ("UniformSampler", "Spec", "Field")
    import rlstash

    if all(hasattr(rlstash, n) for n in names):
        return {n: getattr(rlstash, n) for n in names}
    from rlstash.replay import ReplayBuffer
    from rlstash.sampler import PrioritizedSampler, UniformSampler
    from rlstash.spec import Field, Spec
    from rlstash.storage.disk import MemmapStorage
    from rlstash.storage.ram import TensorStorage

    return dict(
        ReplayBuffer=ReplayBuffer,
        TensorStorage=TensorStorage,
        MemmapStorage=MemmapStorage,
        PrioritizedSampler=PrioritizedSampler,
        UniformSampler=UniformSampler,
        Spec=Spec,
        Field=Field,
    )


class RlstashBuffer(Peer):
    """rlstash ReplayBuffer over TensorStorage or MemmapStorage, uniform or prioritized."""

    def __init__(self, wl: Workload, workdir: Path, memmap: bool) -> None:
        super().__init__(wl, workdir)
        api = _rlstash_api()
        field_cls = api["Field"]
        spec = api["Spec"](
            {k: field_cls(tuple(s), getattr(torch, d)) for k, (s, d) in wl.fields.items()}
        )
        if memmap:
            storage = api["MemmapStorage"](spec, wl.capacity, workdir / f"rlstash-{wl.name}")
        else:
            storage = api["TensorStorage"](spec, wl.capacity)
        if wl.prioritized:
            sampler = api["PrioritizedSampler"](alpha=wl.alpha, beta=wl.beta)
        else:
            sampler = api["UniformSampler"]()
        self.storage = storage
        self.rb = api["ReplayBuffer"](storage, sampler=sampler, seed=0)
        self.tprios = [torch.from_numpy(p) for p in self.prios]
        self.label = "rlstash " + ("MemmapStorage" if memmap else "TensorStorage")

    def native(self, chunk: Chunk) -> object:
        return {k: torch.from_numpy(v) for k, v in chunk.items()}

    def add(self, item: object) -> None:
        self.rb.extend(item)

    def sample(self) -> object:
        return self.rb.sample(self.wl.batch)

    def sample_run(self) -> Run:
        if not self.wl.prioritized:
            return super().sample_run()
        rb, prios, k, b = self.rb, self.tprios, len(self.tprios), self.wl.batch

        def run(n: int) -> None:
            for i in range(n):
                out = rb.sample(b)
                rb.update_priorities(out["index"], prios[i % k])

        return run

    def close(self) -> None:
        for obj in (self.rb, self.storage):
            close = getattr(obj, "close", None)
            if close is not None:
                close()


# Peer key -> (factory, workloads it runs in). Keys are what --peers takes.
PEERS: dict[str, tuple[Callable[[Workload, Path], Peer], tuple[str, ...]]] = {
    "limit": (NumpyLimit, ("W1", "W2", "W3")),
    "torchrl-tensor": (lambda wl, wd: TorchRLBuffer(wl, wd, memmap=False), ("W1", "W2", "W3")),
    "torchrl-memmap": (lambda wl, wd: TorchRLBuffer(wl, wd, memmap=True), ("W1", "W2")),
    "sb3": (SB3Buffer, ("W1", "W2")),
    "cpprb": (CpprbBuffer, ("W1", "W2", "W3")),
    "rlstash-tensor": (lambda wl, wd: RlstashBuffer(wl, wd, memmap=False), ("W1", "W2", "W3")),
    "rlstash-memmap": (lambda wl, wd: RlstashBuffer(wl, wd, memmap=True), ("W1", "W2", "W3")),
}
