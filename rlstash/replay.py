"""ReplayBuffer: a storage and a sampler (plus a ring writer for indexed storages), joined
in a few lines; the contracts they follow are in :mod:`rlstash.core`.

::

    rb = ReplayBuffer(TensorStorage(spec, 100_000), sampler=PrioritizedSampler(), seed=0,
                      transforms=[normalize], device="cuda", pin_memory=True, prefetch=2)
    rb.extend(batch)                      # validated first: a bad batch writes nothing
                                          # (NaN/inf in a float field too: check_finite)
    out = rb.sample(256)                  # fields + "index" (+ "weight" when prioritized)
    rb.update_priorities(out["index"], td_error)

Order of work in ``sample`` (invariant I3): the sampler picks indices, the storage gathers
the rows, the transforms run in order, and only then is the final batch pinned and moved to
``device``. So ``device``/``pin_memory`` describe exactly what the caller gets, whatever
the storage (RAM, GPU or disk) and whatever the transforms return.

Thread safety: ``extend`` and the index-pick + gather of ``sample`` run under one lock and
rows become visible to samplers only after they are written, so a sampler thread never sees
a torn row or an index whose data is not written yet. Transforms and delivery run outside
the lock.

Determinism: with ``seed`` set and ``prefetch=0`` the sequence of samples is a function of
the seed and the data. With ``prefetch=k`` a background thread samples ahead, so a batch
may predate the last ``k`` extends.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlstash import manifest
from rlstash.core import (
    DirectSlots,
    DirectSteps,
    PlacedStorage,
    Placement,
    PrioritySampler,
    SampleContext,
    Sampler,
    SpecChecker,
    Storage,
    Writer,
    missing_members,
)
from rlstash.device import Delivery, upload
from rlstash.indices import as_rows
from rlstash.prefetch import Prefetcher, Stopped
from rlstash.sampler import UniformSampler
from rlstash.sampler.kinds import sampler_from_state
from rlstash.spec import Batch
from rlstash.storage.placement import check_storage, placement_for
from rlstash.storage.state_paths import relative, resolve
from rlstash.storage.stream_direct import LockedSteps

Transform = Callable[[Batch], Batch]
_FORMAT = 3  # 1: the sampler was pickled; 2: its state_dict; 3: relative paths, a manifest


class ReplayBuffer:
    """A FIFO replay buffer over any :class:`~rlstash.core.Storage` or
    :class:`~rlstash.core.PlacedStorage`.

    One path for every storage: its :class:`~rlstash.core.Placement` (``placement``) says
    where rows go and which may be sampled -- a ring writer over an indexed storage
    (:class:`~rlstash.storage.ring.RingPlacement`) or the storage itself when it places rows
    (:class:`~rlstash.storage.placement.SelfPlacement`). The placement picks the fast or the
    checked path from the contracts the parts declare (:mod:`rlstash.core`): a storage's
    :class:`~rlstash.core.FastRows` and :class:`~rlstash.core.PersistentStorage`, a sampler's
    ``returns_valid_indices`` and ``accepts_arrays``. A part that declares nothing gets the
    checked paths, never a silently different one.

    Args:
        storage: where rows live (``TensorStorage`` on any device, ``MemmapStorage`` on disk,
            ``TieredStorage``; or a storage that places rows itself: ``StreamStorage``).
        sampler: picks indices; default :class:`~rlstash.sampler.UniformSampler`.
        transforms: callables ``dict -> dict`` applied in order to each sampled batch.
        device: where the final batch is delivered (``None``: leave it where the storage is).
        pin_memory: pin the final host batch (warns once and does nothing without CUDA).
        prefetch: number of batches a background thread keeps ready (0: none).
        seed: seed of the buffer's own ``numpy.random.Generator``.
        check_finite: refuse a batch with NaN or +-inf in a float field (invariant I10:
            ``extend`` raises a ValueError naming the field and the row; nothing is written).
            False stores such values (it also turns off a StreamStorage's own check). The
            check is one sum per float field and batch; on a GPU one host read per ``extend``.
    """

    def __init__(
        self,
        storage: Storage | PlacedStorage,
        sampler: Sampler | None = None,
        transforms: Iterable[Transform] = (),
        device: str | torch.device | None = None,
        pin_memory: bool = False,
        prefetch: int = 0,
        seed: int | None = None,
        check_finite: bool = True,
    ) -> None:
        check_storage(storage)
        if not isinstance(prefetch, int) or isinstance(prefetch, bool):
            raise TypeError(
                f"prefetch: expected an int count of batches kept ready (0: none), got "
                f"{type(prefetch).__name__} {prefetch!r}; e.g. prefetch=2"
            )
        if prefetch < 0:
            raise ValueError(f"prefetch: expected an int >= 0, got {prefetch!r}")
        transforms = list(transforms)
        for i, t in enumerate(transforms):
            if not callable(t):
                raise TypeError(
                    f"transforms[{i}]: expected a callable dict -> dict, got {type(t).__name__}"
                )
        if sampler is None:
            sampler = UniformSampler()
        elif not isinstance(sampler, Sampler):
            raise TypeError(
                f"sampler: expected a Sampler (UniformSampler, PrioritizedSampler, ...), got "
                f"{type(sampler).__name__}, which lacks {missing_members(sampler, Sampler)}"
            )
        self.storage = storage
        self.sampler = sampler
        # where rows go and which may be sampled: a ring writer over an indexed storage, or
        # the storage itself (the stream's per-env lanes); the paths below are the same
        self.placement: Placement = placement_for(storage, sampler, check_finite)
        self.writer: Writer | None = self.placement.writer
        self.transforms = transforms
        self.delivery = Delivery(device, pin_memory)
        self.prefetch = prefetch
        self.rng = np.random.default_rng(seed)
        self.check_finite = bool(check_finite)
        self.sampler.reset(storage.capacity)
        if isinstance(sampler, SpecChecker):  # e.g. SequenceSampler needs episode flags
            sampler.check_spec(storage.spec)
        self._lock = threading.RLock()  # extend, and the index pick + gather of sample
        self._prefetch_lock = threading.Lock()  # starting/stopping the prefetcher, close
        self._ctx = SampleContext(0, 0, storage.capacity, self.rng)
        self._host = storage.device.type == "cpu"
        self._prioritized = isinstance(sampler, PrioritySampler)
        self._prefetcher: Prefetcher | None = None
        self._closed = False
        for index, rows in self.placement.resume():  # a reopened storage's rows (disk)
            self.sampler.on_write(index, rows)

    # sizes
    @property
    def capacity(self) -> int:
        return self.storage.capacity

    def __len__(self) -> int:
        return self.placement.size

    def __repr__(self) -> str:
        return (
            f"ReplayBuffer({type(self.storage).__name__}, {type(self.sampler).__name__}, "
            f"size={len(self)}/{self.capacity}, device={self.delivery.device})"
        )

    # writing
    def extend(self, batch: Mapping[str, Any]) -> np.ndarray:
        """Validate ``batch`` and append its rows; returns the indices written.

        A batch with more rows than the capacity keeps its last ``capacity`` rows, exactly as
        writing them one by one would.
        """
        if self._closed:
            self._check_open()
        placement = self.placement
        prepared = placement.prepare(batch)  # validated first: a bad batch writes nothing
        with self._lock:
            if self._closed:
                self._check_open()
            index, rows = placement.place(prepared)  # the writer places, the storage writes
            self.sampler.on_write(index, rows)
        if type(index) is slice:
            return np.arange(index.start, index.stop, dtype=np.int64)
        return index

    def open_steps(self, T: int) -> DirectSlots | None:
        """Slots for ``T`` steps that a collector fills in place
        (:meth:`StreamStorage.open_steps <rlstash.storage.stream.StreamStorage.open_steps>`),
        committed under this buffer's lock with the sampler told, as :meth:`extend` does; None
        where the storage cannot take them so (then ``extend`` a batch)."""
        storage = self.storage
        if not isinstance(storage, DirectSteps):
            return None
        with self._lock:
            self._check_open()
            slots = storage.open_steps(T)
        return None if slots is None else LockedSteps(slots, self._lock, self._steps_written)

    def _steps_written(self, index: np.ndarray) -> None:
        """After a commit of :meth:`open_steps`' slots, under the lock: tell the sampler."""
        self._check_open()
        self.sampler.on_write(index, self.storage.step_flags(index))

    def add(self, row: Mapping[str, Any]) -> int:
        """Append one row given without the leading dimension."""
        batch = {
            k: (v.unsqueeze(0) if isinstance(v, torch.Tensor) else np.asarray(v)[None])
            for k, v in row.items()
        }
        return int(self.extend(batch)[0])

    # sampling
    def sample(self, batch_size: int) -> Batch:
        """Sample a batch: fields, ``index`` (int64) and sampler extras such as ``weight``.

        ``batch_size`` is a positive int; above the capacity (rows repeat) the batch must fit
        in half the RAM free now, else ValueError (never an out-of-memory kill). From a closed
        buffer (also when another
        thread closes it while this call waits): ``RuntimeError("ReplayBuffer is closed")``.
        """
        if self._closed:
            self._check_open()
        if type(batch_size) is not int or not 0 < batch_size <= self.capacity:
            _check_batch_size(batch_size, self.capacity, self.storage.spec.row_bytes)
        if self.prefetch:
            return self._sample_prefetched(batch_size)
        return self._sample_now(batch_size)

    def _sample_prefetched(self, batch_size: int) -> Batch:
        while True:
            with self._prefetch_lock:
                self._check_open()
                prefetcher = self._prefetcher
                if prefetcher is None or prefetcher.batch_size != batch_size or prefetcher.spent:
                    if prefetcher is not None:
                        prefetcher.stop()
                    prefetcher = Prefetcher(self, batch_size, self.prefetch)
                    self._prefetcher = prefetcher
            try:
                return prefetcher.get()
            except Stopped:
                self._check_open()  # closed: a clear error; else replaced or spent: again

    def _sample_now(self, batch_size: int) -> Batch:
        with self._lock:
            if self._closed:
                self._check_open()
            ctx = self.placement.context(self._ctx)  # what may be sampled now
            index, extra = self.sampler.sample(batch_size, ctx)  # the sampler picks
            batch = self.placement.take(index)  # the storage gathers
        # the sampler's picks (index, weights) go where the rows are: one device per batch
        # (a GPU storage's batch with a host index was refused by the agents; seen on an H100)
        # (one copy off the host for all of them: no host wait on a GPU)
        picks = {"index": index, **extra}
        home = self.storage.device if not self._host else torch.device("cpu")
        batch.update(zip(picks, upload(list(picks.values()), home)))
        transforms = self.transforms
        if not transforms and self._host and self.delivery.identity:
            return batch  # host tensors, nothing to move or pin: delivery is the identity
        for transform in transforms:
            batch = transform(batch)
            _check_transformed(batch, transform)
        return self.delivery(batch)

    def update_priorities(self, index: Any, priority: Any) -> None:
        """Forward new priorities to the sampler (prioritized sampling only)."""
        sampler = self.sampler
        if not self._prioritized:
            raise TypeError(
                f"update_priorities: {type(sampler).__name__} has no priorities; use PrioritizedSampler"
            )
        index = as_rows(index, self.capacity, "index", lazy=True)  # the sampler checks the range
        priority = _host_numpy(priority, "priority")
        with self._lock:
            sampler.update_priorities(index, priority)

    # lifecycle
    def close(self) -> None:
        """Stop the prefetch thread and close the storage (a disk storage flushes its metadata).

        Safe while other threads sample or extend: they get ``RuntimeError("ReplayBuffer is
        closed")``, and no thread is left behind."""
        with self._prefetch_lock:
            if self._closed:
                return
            self._closed = True  # from now on no prefetcher is started
            self._stop_prefetch()
        with self._lock:  # after any sample or extend in progress
            self.storage.close()

    def __enter__(self) -> ReplayBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("ReplayBuffer is closed: make a new one (or load a saved one)")

    def _stop_prefetch(self) -> None:
        if self._prefetcher is not None:
            self._prefetcher.stop()
            self._prefetcher = None

    # state
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: storage, writer cursor, sampler state and RNG."""
        with self._lock:
            return {
                "format": _FORMAT,
                "storage": self.storage.state_dict(),
                "writer": self.placement.state_dict(),
                "sampler": self.sampler.state_dict(),
                "rng": self.rng.bit_generator.state,
            }

    def save(self, path: str | os.PathLike) -> Path:
        """Write the buffer to ``path`` (a file) atomically: temp file, fsync, rename; then
        record its size and SHA-256 in the ``MANIFEST.json`` beside it (:mod:`rlstash.manifest`),
        which :meth:`load` checks. A disk storage is flushed and referenced, not copied: its
        directory is stored relative to ``path``'s directory, so the two can be copied or moved
        together (a run directory with its checkpoint and buffer)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.placement.flush()
        state = self.state_dict()
        state["storage"] = relative(state["storage"], path.parent)
        entry = manifest.write_hashed(path, lambda f: torch.save(state, f))
        manifest.record(path.parent, {path.name: entry})
        return path

    @classmethod
    def from_minari(
        cls, dataset: Any, reads: Any = None, infos: Any = False, **kwargs: Any
    ) -> ReplayBuffer:
        """A buffer over a one-lane StreamStorage holding every episode of a Minari dataset
        (a ``MinariDataset`` or a local id; ``reads``: a ReadSpec; ``infos``: True or a list
        of info keys kept as fields ``info/<key>``; ``kwargs``: this class's arguments, its
        ``check_finite`` the storage's too). See :mod:`rlstash.datasets.minari`; needs
        ``rlstash[minari]``."""
        from rlstash.datasets.minari import from_minari

        finite = kwargs.get("check_finite", True)
        return cls(from_minari(dataset, reads=reads, infos=infos, check_finite=finite), **kwargs)

    @classmethod
    def load(
        cls,
        path: str | os.PathLike,
        transforms: Iterable[Transform] = (),
        device: str | torch.device | None = None,
        pin_memory: bool = False,
        prefetch: int = 0,
        sampler: Sampler | None = None,
        verify: bool = True,
    ) -> ReplayBuffer:
        """Rebuild a buffer saved by :meth:`save`; it samples exactly what the original would.

        First the file is checked against the ``MANIFEST.json`` beside it (size, SHA-256), and
        a disk storage's directory is resolved against the file's directory and checked to be
        there with its metadata (the storage itself checks its files' headers and sizes when it
        opens). A damaged file is refused with :class:`rlstash.manifest.DamagedFile` (a
        ValueError naming the file, what is wrong and the fix), never loaded. ``verify=False``
        loads a file without its manifest (e.g. copied alone), unchecked.

        The sampler is rebuilt from its saved ``state_dict`` (built-in kinds), or given as
        ``sampler`` (a new one of the saved kind, e.g. a user's own): its state is loaded in.
        """
        path = Path(path)
        man = manifest.read(path.parent) if verify else None
        listed = man is not None and path.name in man["files"]
        if listed:
            manifest.verify(path, man)
        state = _load_file(path)
        if state.get("format") not in (1, 2, _FORMAT):
            raise ValueError(
                f"{path}: unknown buffer format {state.get('format')!r}, expected {_FORMAT}"
            )
        if verify and not listed and state["format"] >= 3:
            raise manifest.DamagedFile(
                path,
                f"no {manifest.NAME} beside it lists it (its size and checksum)",
                f"copy {manifest.NAME} along with it, or load it unchecked with "
                "ReplayBuffer.load(path, verify=False)",
            )
        from rlstash.storage import storage_from_state

        try:
            saved = state["sampler"]
            if state["format"] == 1:  # an older rlstash pickled the sampler object itself
                saved = saved.state_dict()
            writer, rng = state["writer"], state["rng"]
            sampler = sampler_from_state(saved, path) if sampler is None else sampler
            storage = storage_from_state(resolve(state["storage"], path))
        except (KeyError, TypeError, AttributeError, IndexError) as exc:
            raise manifest.DamagedFile(
                path, f"it is not a saved buffer ({manifest.one_line(exc)})"
            ) from None
        rb = cls(
            storage,
            sampler=sampler,
            transforms=transforms,
            device=device,
            pin_memory=pin_memory,
            prefetch=prefetch,
        )
        try:
            rb.placement.load_state_dict(writer)
            rb.sampler.load_state_dict(saved)
            rb.rng.bit_generator.state = rng
        except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as exc:
            rb.close()
            raise manifest.DamagedFile(
                path, f"its state does not load ({manifest.one_line(exc)})"
            ) from None
        return rb


def _load_file(path: Path) -> dict[str, Any]:
    """``torch.load`` of a saved buffer; anything that is not one is a DamagedFile."""
    state = manifest.load_torch(path)
    if not isinstance(state, dict):
        raise manifest.DamagedFile(path, f"it holds a {type(state).__name__}, not a saved buffer")
    return state


_SCRATCH_BYTES = 64  # per sampled row beyond its fields: index, weight, sampler scratch


def _check_batch_size(batch_size: Any, capacity: int, row_bytes: int = 0) -> None:
    """TypeError/ValueError for a ``batch_size`` that is not a positive int, or (above the
    capacity, where rows repeat) one whose batch would not fit in the RAM free now."""
    if not isinstance(batch_size, int) or isinstance(batch_size, bool):
        raise TypeError(
            f"batch_size: expected a positive int, got {type(batch_size).__name__} {batch_size!r}"
        )
    if batch_size <= 0:
        raise ValueError(f"batch_size: expected a positive int, got {batch_size!r}")
    if batch_size <= capacity:
        return
    from rlstash.memory import human_bytes, ram_available

    need = batch_size * (row_bytes + _SCRATCH_BYTES)
    free = ram_available()
    if need > free // 2:
        raise ValueError(
            f"batch_size: {batch_size:,} rows from a buffer of capacity {capacity:,} needs about "
            f"{human_bytes(need)} while {human_bytes(free)} of RAM is free (at most half of it "
            "is used for one batch); fix: sample smaller batches"
        )


def _check_transformed(batch: Any, transform: Transform) -> None:
    """A transform must return a dict of tensors: else TypeError naming it and the key."""
    if type(batch) is not dict and not isinstance(batch, dict):
        raise TypeError(
            f"transform {transform!r}: expected it to return a dict of tensors, got "
            f"{type(batch).__name__}"
        )
    for key, value in batch.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"transform {transform!r}: returned {type(value).__name__} for key {key!r}, "
                f"expected a torch.Tensor; fix: return torch.as_tensor(...) for it"
            )


def _host_numpy(value: Any, name: str) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        if value.requires_grad:
            value = value.detach()
        return (value if value.is_cpu else value.to("cpu")).numpy()
    try:
        return np.asarray(value)
    except Exception as exc:  # noqa: BLE001
        raise TypeError(f"{name}: expected a tensor or array, got {type(value).__name__}") from exc


__all__ = ["ReplayBuffer", "Transform", "sampler_from_state"]
