"""The core roles and how they fit together.

A replay buffer is a storage and a sampler joined in a few lines (see :mod:`rlstash.replay`).
There are two kinds of storage, each an explicit protocol below.

An **indexed** :class:`Storage` keeps rows where it is told; the buffer's ring writer says
where::

    index = writer.reserve(n)             # where the next n rows go (slice or index array)
    storage.write(index, batch)           # storage moves data; validated first
    writer.commit(n)                      # only now do the rows become visible
    sampler.on_write(index, batch)        # e.g. prioritized: new rows get the max priority

A **placed** storage (:class:`PlacedStorage`, e.g. the stream storage's per-env lanes) decides
itself where rows go and which rows are valid sample starts; there is no writer::

    index = storage.extend(batch)                     # validated first; returns the rows written
    sampler.on_write(index, storage.step_flags(index))

The buffer sees one :class:`Placement` either way (:mod:`rlstash.storage.ring` for an indexed
storage, :mod:`rlstash.storage.placement` for a placed one), so its paths have no branches::

    rows = placement.prepare(batch)                # validated, outside the buffer's lock
    index, seen = placement.place(rows)            # the writer places, the storage writes
    sampler.on_write(index, seen)

    ctx = placement.context(ctx)                   # what the sampler may pick from
    idx, extra = sampler.sample(batch_size, ctx)   # indices only (host numpy int64)
    batch = placement.take(idx)                    # the storage gathers (``gather`` when the
                                                   # sampler declares its indices valid)
    for t in transforms: batch = t(batch)          # plain dict -> dict callables
    batch = deliver(batch, device, pin_memory)     # rlstash.device: last, after transforms

Fast paths live inside the storages, behind explicit contracts: :class:`FastRows` (a gather
without bounds checks, a write without casts) and :class:`PersistentStorage` (a storage that
keeps the writer position, such as a disk storage). Samplers declare what they guarantee
with class attributes read by :func:`declares` (a sampler that does not say is checked;
see :class:`Sampler`):

* ``returns_valid_indices``: every index ``sample`` returns is a stored row in
  ``[0, capacity)`` (and in ``ctx.valid`` when given), so rows are gathered unchecked;
* ``accepts_arrays``: ``on_write`` accepts numpy arrays as batch values (or ignores them),
  so a batch is handed over as given instead of as validated tensors.

Indices are host-side ``numpy.int64`` arrays, or a ``slice`` for a contiguous run (the
common case when writing). Storages accept both. Devices are arguments, never hidden state.
Samplers save and load through ``state_dict``/``load_state_dict`` (plain data, no pickled
objects).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, runtime_checkable

import numpy as np
import torch

from rlstash.spec import Batch, Spec

Index = np.ndarray | slice


def check_capacity(capacity: Any) -> int:
    """``capacity`` as an int when it is a positive int (numpy ints too), else ValueError.

    The one capacity check of every storage, writer and sampler."""
    if not isinstance(capacity, int | np.integer) or isinstance(capacity, bool) or capacity <= 0:
        raise ValueError(f"capacity: expected a positive int, got {capacity!r}")
    return int(capacity)


@runtime_checkable
class Storage(Protocol):
    """Indexed rows: preallocated struct-of-arrays, one contiguous tensor (or file) per field."""

    spec: Spec
    capacity: int
    device: torch.device  # where the rows live; "cpu" for RAM and disk

    @property
    def nbytes(self) -> int:
        """Bytes held by the data (exact, known before allocation)."""
        ...

    def write(self, index: Index, batch: Batch, validate: bool = True) -> None:
        """Write ``batch`` rows at ``index``; validates first so a bad batch writes nothing."""
        ...

    def read(self, index: Index, out: Batch | None = None) -> Batch:
        """Gather rows at ``index`` (into ``out`` when given, reusing its memory)."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class FastRows(Protocol):
    """The hot paths an indexed storage may offer (:class:`~rlstash.storage.arrays.ArrayStorage`).

    ``gather(index)`` reads a 1-D int64 array the caller guarantees in range (no bounds
    check; memory stays safe regardless). ``exact_sources(batch)`` returns the batch's
    fields in storage order and its row count when it can be written with no cast (else
    ``None``: validate it instead), and ``put(index, sources)`` writes them. ``tensors``
    maps each field to its stored rows ``[capacity, ...]`` (views, no copy).
    """

    tensors: dict[str, torch.Tensor]

    def gather(self, index: np.ndarray) -> Batch: ...

    def exact_sources(self, batch: Any) -> tuple[list[Any], int] | None: ...

    def put(self, index: Index, sources: list[Any]) -> None: ...


@runtime_checkable
class PersistentStorage(Protocol):
    """An indexed storage that keeps the writer position with its rows (disk, tiered).

    The buffer calls ``set_cursor`` after every write; a reopened storage reports the
    ``cursor``, ``size`` and ``extra`` it kept, and the buffer resumes from them. ``valid`` is
    None, or (after a crash in the middle of overwriting stored rows) bool[capacity] marking
    the rows that may be torn as False: the buffer never samples them.
    """

    cursor: int
    size: int
    extra: dict[str, Any]
    valid: np.ndarray | None

    def set_cursor(self, cursor: int, size: int, extra: dict[str, Any] | None = None) -> None: ...

    def flush(self) -> None: ...


@runtime_checkable
class PlacedStorage(Protocol):
    """A storage that places rows itself (:class:`~rlstash.storage.stream.StreamStorage`).

    ``extend(batch)`` validates and stores a batch and returns the rows written; ``valid``
    (bool[capacity], updated in place) marks the rows a sampler may return; ``window(starts,
    length)`` maps starts [B] to the rows of ``length`` consecutive steps [B, length];
    ``step_flags(index)`` gives the episode-end flags a sampler's ``on_write`` may track;
    ``written`` marks the rows holding data (a resume replays them to the sampler).
    ``read`` checks that every index is a valid start; ``gather`` trusts the caller.
    """

    spec: Spec
    capacity: int
    device: torch.device

    @property
    def nbytes(self) -> int: ...

    @property
    def size(self) -> int: ...

    @property
    def valid(self) -> np.ndarray: ...

    @property
    def written(self) -> np.ndarray: ...

    def extend(self, batch: Any) -> np.ndarray: ...

    def step_flags(self, index: Index) -> dict[str, np.ndarray]: ...

    def window(self, starts: np.ndarray, length: int) -> np.ndarray: ...

    def read(self, index: Index, out: Batch | None = None) -> Batch: ...

    def gather(self, index: np.ndarray) -> Batch: ...

    def flush(self) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class DirectSlots(Protocol):
    """The slots of ``T`` steps that :meth:`DirectSteps.open_steps` hands a collector.

    ``step(t)``/``step_arrays(t)`` are step ``t``'s rows of every env (tensors / numpy views,
    ``{"obs": [N, ...], "action": [N, ...], "reward": [N]}``) to fill in place;
    ``commit(terminated, truncated)`` (bool ``[T, N]``) records the steps as ``extend`` would
    and returns the rows written."""

    T: int

    def step(self, t: int) -> dict[str, torch.Tensor]: ...

    def step_arrays(self, t: int) -> dict[str, np.ndarray]: ...

    def commit(self, terminated: torch.Tensor, truncated: torch.Tensor) -> np.ndarray: ...


@runtime_checkable
class DirectSteps(Protocol):
    """A target a collector may write steps into in place (the stream storage; a replay buffer
    over one): ``open_steps(T)`` gives :class:`DirectSlots`, or None where it cannot take the
    steps so (then the collector extends a batch)."""

    def open_steps(self, T: int) -> DirectSlots | None: ...


@runtime_checkable
class Placement(Protocol):
    """Where a replay buffer's rows go and which of them may be sampled: the one path of
    :class:`~rlstash.replay.ReplayBuffer` for both kinds of storage.

    :class:`~rlstash.storage.ring.RingPlacement` is an indexed storage and a ring writer;
    :class:`~rlstash.storage.placement.SelfPlacement` a storage that places rows itself.
    ``prepare`` runs outside the buffer's lock (validation: a bad batch writes nothing);
    ``place``, ``context`` and ``take`` run under it.
    """

    storage: Any  # the Storage or PlacedStorage the rows live in
    writer: Writer | None  # the ring writer (None: the storage places rows itself)

    @property
    def size(self) -> int:
        """Rows stored."""
        ...

    def prepare(self, batch: Any) -> Any:
        """``batch`` checked and ready to :meth:`place` (raises on bad input)."""
        ...

    def place(self, prepared: Any) -> tuple[Index, Any]:
        """Write a prepared batch; returns the rows written and what ``sampler.on_write`` gets."""
        ...

    def context(self, ctx: SampleContext) -> SampleContext:
        """``ctx`` updated to what may be sampled now; ValueError when nothing is stored."""
        ...

    def take(self, index: np.ndarray) -> Batch:
        """The rows at ``index`` ([B], or windows [B, L] gathered as [B, L, ...])."""
        ...

    def resume(self) -> Iterator[tuple[np.ndarray, Any]]:
        """The rows a reopened storage holds, as (index, what ``on_write`` gets) chunks."""
        ...

    def flush(self) -> None: ...

    def state_dict(self) -> dict[str, Any] | None: ...

    def load_state_dict(self, state: dict[str, Any] | None) -> None: ...


def missing_members(obj: object, protocol: type) -> list[str]:
    """The members of ``protocol`` (methods, properties, attributes) that ``obj`` lacks."""
    names: set[str] = set()
    for base in protocol.__mro__:
        if base in (object, Protocol, Generic) or not getattr(base, "_is_protocol", False):
            continue
        names.update(base.__dict__.get("__annotations__", {}))
        names.update(k for k, v in base.__dict__.items() if callable(v) or isinstance(v, property))
    return sorted(n for n in names if not n.startswith("_") and not hasattr(obj, n))


@dataclass
class SampleContext:
    """What a sampler may look at when it picks indices."""

    size: int  # rows stored (<= capacity)
    cursor: int  # next write position; when full, the oldest row is at ``cursor``
    capacity: int
    rng: np.random.Generator
    valid: np.ndarray | None = None  # bool[capacity]: True where a row may be returned
    # Maps window starts [B] to the indices of ``length`` consecutive steps [B, length]. None
    # means a plain ring: (start + arange(length)) % capacity. Storages whose consecutive
    # steps are not consecutive rows (the stream storage's per-env lanes) provide it.
    window: Callable[[np.ndarray, int], np.ndarray] | None = None


@runtime_checkable
class PlansMemory(Protocol):
    """A part that says, before it allocates, what it will hold in host RAM per ``capacity``
    rows (a sampler's priorities, for :func:`rlstash.memory.plan`)."""

    def plan_bytes(self, capacity: int) -> dict[str, int]: ...


@runtime_checkable
class Sampler(Protocol):
    """Picks indices; never touches data.

    Guarantees a sampler may declare as class attributes, in the class that defines the
    method they are about (read with :func:`declares`; a sampler that does not declare them
    gets the checked paths):

    * ``returns_valid_indices = True`` (about ``sample``): every index is a stored row in
      ``[0, capacity)`` (and in ``ctx.valid`` when given);
    * ``accepts_arrays = True`` (about ``on_write``): it accepts numpy arrays as batch values.

    ``state_dict`` returns plain data with a ``"kind"``; the buffer saves that, never the
    sampler object, and :meth:`load_state_dict` restores it into a sampler built afresh.
    """

    def reset(self, capacity: int) -> None:
        """Bind to a buffer of ``capacity`` rows (allocates per-row state such as priorities)."""
        ...

    def on_write(self, index: Index, batch: Batch) -> None:
        """Called after rows at ``index`` were written."""
        ...

    def sample(
        self, batch_size: int, ctx: SampleContext
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Return ``batch_size`` indices and extra per-row arrays (e.g. ``weight``)."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@runtime_checkable
class PrioritySampler(Sampler, Protocol):
    """A sampler whose rows have priorities the learner updates (e.g. by TD error)."""

    def update_priorities(self, indices: Any, priorities: Any) -> None: ...


@runtime_checkable
class SpecChecker(Protocol):
    """A sampler that must see certain fields (e.g. episode flags): ``check_spec(spec)`` raises
    ValueError/TypeError when the storage's rows lack them; the buffer calls it when it is
    built, before anything is written."""

    def check_spec(self, spec: Spec) -> None: ...


GUARANTEES = {"returns_valid_indices": "sample", "accepts_arrays": "on_write"}


def declares(obj: object, guarantee: str) -> bool:
    """True only when ``obj``'s class declares ``guarantee`` (a key of :data:`GUARANTEES`) True.

    A guarantee is about one method (``returns_valid_indices``: ``sample``;
    ``accepts_arrays``: ``on_write``) and holds only when the class that defines the method
    ``obj`` uses declares it: a subclass of a built-in sampler that overrides ``sample``
    without re-declaring gets its indices checked.
    """
    method = GUARANTEES[guarantee]
    for klass in type(obj).__mro__:
        if method in vars(klass):
            return vars(klass).get(guarantee) is True
    return False


@runtime_checkable
class Writer(Protocol):
    """Decides where rows go; ``reserve`` then ``commit`` so a failed write changes nothing."""

    capacity: int
    cursor: int
    size: int

    def reserve(self, n: int) -> Index: ...

    def commit(self, n: int) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@runtime_checkable
class Agent(Protocol):
    """What the training loop and the collectors rely on (DQN, SAC, TD3, discrete SAC, PPO:
    :class:`~rlstash.agents.base.AgentBase`)."""

    device: torch.device  # the learner's device
    act_device: torch.device  # where ``act`` runs (a copy of the policy when != device)
    updates: int  # gradient steps taken
    compile_seconds: float  # seconds spent compiling updates (0.0: eager)
    env_steps: int  # env steps acted (non-deterministic ``act`` calls): drives schedules
    nets: Mapping[str, torch.nn.Module]  # every network by name (learner, targets, policy)

    def act(
        self, obs: torch.Tensor, deterministic: bool = False, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Actions for a batch of observations [N, *obs_shape], on ``act_device``, no grad."""
        ...

    def update(self, batch: Batch) -> dict[str, Any]:
        """One gradient step; scalar metrics (0-dim tensors on ``device`` or host floats; read
        them with :func:`~rlstash.agents.base.read_metrics`) plus ``"td_error"`` [B]
        (detached, >= 0)."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def policy_state_dict(self) -> dict[str, Any]:
        """The weights needed to act (shares storage with the learner: copy before mutating)."""
        ...

    def load_policy_state_dict(self, state: dict[str, Any]) -> None: ...

    def to(
        self, device: torch.device | str, act_device: torch.device | str | None = None
    ) -> Any: ...


@runtime_checkable
class Collector(Protocol):
    """Where experience comes from: ``collect()`` steps ``num_envs`` environments with the
    current policy and returns a batch of steps (leading dimensions ``[T, N]``) for a buffer's
    ``extend``; ``close()`` releases the processes and memory behind it (invariant I6).
    :class:`~rlstash.collect.sync.Collector` (in-process or a process pool),
    :class:`~rlstash.collect.async_.AsyncCollector` (policy copies in the workers) and
    :class:`~rlstash.collect.ray.RayCollector` (Ray actors) follow it."""

    num_envs: int

    def collect(self) -> Any: ...

    def close(self) -> None: ...


@runtime_checkable
class Acts(Protocol):
    """A policy object with ``act(obs, deterministic=False)``: an :class:`Agent`, or a user's.
    Collectors call ``act``; a policy without it is called itself (an ``nn.Module``, a
    function)."""

    def act(self, obs: Any, deterministic: bool = False) -> Any: ...


@runtime_checkable
class PolicyWeights(Protocol):
    """A policy whose acting weights travel apart from its learner's (an :class:`Agent`):
    collectors with policy copies send ``policy_state_dict()`` and load it with
    ``load_policy_state_dict``; any other policy travels as its ``state_dict()``."""

    def policy_state_dict(self) -> dict[str, Any]: ...

    def load_policy_state_dict(self, state: dict[str, Any]) -> None: ...
