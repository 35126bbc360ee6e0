"""StreamStorage: each env's experience as a lane of observation slots (invariant I5).

Env ``e`` owns a lane of ``L = capacity // num_envs`` slots, a ring. The rows are
slot-major: lane position ``p`` of env ``e`` is row ``p * N + e``, so the N lanes' slots of one
step are one contiguous block of rows (saves made before are converted or refused with the
fix: :mod:`rlstash.storage.stream_layout`). A slot holds one observation (the newest frame only, when frames are
stacked) and, when a step was taken from it, that step's action, reward and extra fields.
The slot after a step holds the next observation; the final observation of an episode takes
a slot of its own that is no valid transition start. ``next_obs``, ``done``, frame stacks and
n-step returns are rebuilt on read, so nothing is stored twice::

    lane e:  o0 a0 r0 | o1 a1 r1 (terminated) | o2 = final obs (no start) | o0' a0' r0' | ...
    rows:    e           N + e                    2N + e                      3N + e

Autoreset conventions of ``extend`` (one vectorized step of N envs, or a ``[T, N]`` chunk):

* ``"NextStep"`` (gymnasium >= 1.0 default): pass ``obs`` (the observation the action was
  taken from), ``action``, ``reward``, ``terminated``, ``truncated`` as returned. After a
  step that ended an episode, the next step's ``obs`` is the final observation and the env
  resets, ignoring the action; the storage recognizes that step per lane and stores its obs as
  the final-obs slot (its action, reward and flags are dropped).
* ``"SameStep"``: the env resets within the step that ended the episode; pass its final
  observation as ``final_obs`` (rows read only where ``terminated | truncated``) and the
  storage writes it into a slot of its own.

Reads. For a valid start ``t`` (``read(index)``, any index shape) with rewards ``r``, flags
``d = terminated | truncated`` and ``n = n_step``::

    m        = min(n, 1 + min{j >= 0 : d[t + j]})      # steps actually summed
    reward   = sum_{j < m} gamma^j * r[t + j]          # n-step discounted return
    next_obs = obs[t + m]                              # n steps later, or the final obs
    terminated, truncated = flags of step t + m - 1    # the episode ended within the m steps
    discount = gamma^m

so the learner's target is ``reward + discount * (1 - terminated) * V(next_obs)``. With
``frame_stack = k`` an observation is ``[k, *frame]``: frames ``t - k + 1 .. t``, oldest
first, where frames before the episode's first are its first frame repeated (gymnasium's
``FrameStackObservation(padding_type="reset")``).

``valid`` (bool[capacity]) marks the starts a sampler may return: a start slot whose
successors up to ``t + m`` are written and whose frame history is still in the lane (not
overwritten by the ring) unless the episode started within it. It is updated on each
``extend`` for the few slots it can change (O(N (g + n + k)) for a chunk that grew each lane
by g slots), never by a full recompute. Samplers get it as ``ctx.valid``; windows of
consecutive steps follow the lanes through :meth:`window`.

A ``[T, N]`` chunk is one write, not T: its ``terminated``/``truncated`` reach the host once
(views on the CPU; one blocking device-to-host copy for both on a GPU, the write path's only
host read), :class:`~rlstash.storage.lanes.Lanes` plans the T steps with row operations over
the N lanes, and the slots are written in one call (one contiguous copy per field while the
lanes move in lockstep, as next-step chunks keep them).

Layers, each importing only the ones below it; :class:`StreamStorage` composes them (each
layer gets the objects it works on, never the stream)::

    stream_layout.py   convert_lane_major: copies an old disk stream into a new one (above)
    stream.py          StreamStorage: checks arguments, composes the parts, saves and loads
    stream_open.py     opens the backing, the lanes and their commit records; saved backings
    stream_direct.py   StepSlots: steps a collector writes in place (open_steps)
    stream_write.py    StreamWriter: extend, end_episodes (lanes + rows + commit records)
    stream_read.py     StreamReader: n-step returns, next obs, frame stacks (lanes + rows)
    stream_backing.py  SlotRows: where the slots' bytes live (RAM, GPU, disk, tiered,
                       compressed frames: frame_backing.py, frames.py, codecs.py)
    stream_commit.py   LaneBooks: the lanes' commit records beside a disk backing
    lanes.py           Lanes: which slot holds which step of which lane, valid starts
    stream_spec.py, stream_format.py, stream_plan.py: specs, row layouts, memory plans

Episodes never get stitched: when envs are reset outside the stream (a collector reset, a
restarted worker) call :meth:`StreamStorage.end_episodes`; after a load or a reopen the
first ``extend`` does it by itself.

Disk (``backing="disk"``): the slots are a :class:`~rlstash.storage.disk.MemmapStorage`, the
settings are in ``stream.npz`` (written once) and the lanes' bookkeeping is memory-mapped
beside them with commit records (:mod:`rlstash.storage.stream_commit`, the design of the
MemmapStorage's): every ``extend``, ``end_episodes`` and ``open_steps`` commit that returned
is there after a SIGKILL, read back equal; a slot being overwritten when the process died is
dropped, never read torn.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import Any

import numpy as np
import torch

from rlstash import autoreset as modes
from rlstash.core import Index, Storage
from rlstash.indices import as_rows
from rlstash.spec import Batch, Spec
from rlstash.storage import register_kind
from rlstash.storage.frames import FrameCompression
from rlstash.storage.lanes import LANE_KEYS, TERM, TRUNC, WRITTEN, Lanes
from rlstash.storage.stream_backing import slot_rows
from rlstash.storage.stream_commit import NPZ
from rlstash.storage.stream_direct import StepSlots, open_steps
from rlstash.storage.stream_format import LANE_MAJOR, LAYOUT, convert_state, saved_layout
from rlstash.storage.stream_open import check_place, open_backing, saved_backing
from rlstash.storage.stream_plan import bookkeeping_bytes, naive_bytes, stream_plan
from rlstash.storage.stream_plan import plan_bytes as stream_plan_bytes
from rlstash.storage.stream_read import StreamReader
from rlstash.storage.stream_spec import (
    ReadSpec,
    obs_names,
    sample_spec,
    slot_spec,
    step_spec,
    transition_step,
)
from rlstash.storage.stream_write import StreamWriter

BOOKKEEPING_BYTES = 3  # per slot: flags, episode position (clipped), valid


class StreamStorage:
    """Lanes of observation slots on a backing storage; see the module docstring.

    Args:
        spec: the fields of one env step: ``obs`` (``[k, ...]`` when ``stacked_input``),
            ``action``, optionally ``reward`` (float), ``terminated``/``truncated`` (bool),
            and extra fields (stored per step).
        num_envs: N, the number of lanes. Each gets ``capacity // num_envs`` slots.
        capacity: slots in total (rounded down to a multiple of ``num_envs``).
        backing: ``"ram"`` (TensorStorage on ``device``), ``"disk"`` (MemmapStorage at
            ``path``), a :class:`~rlstash.storage.frames.FrameCompression` (RAM, pixel
            frames compressed with lz4 or zstd, decoded on read) or a factory ``(spec, capacity) -> storage``. A factory with a ``path``
            must return a storage whose data persist there (a TieredStorage over a disk cold
            tier at ``path``): the stream keeps its bookkeeping beside it and resumes.
        autoreset: gymnasium's ``AutoresetMode.NEXT_STEP``/``SAME_STEP`` or ``"NextStep"``/
            ``"SameStep"`` (module docstring; the old ``"next_step"`` warns: rlstash.autoreset).
        reads: n-step, gamma and frame stacking of reads (:class:`ReadSpec`).
        stacked_input: observations arrive stacked ``[k, ...]``; only the newest frame is stored.
        check_finite: refuse a batch with NaN or +-inf in a float field (invariant I10: a
            ValueError naming the field, step and env; nothing is written); False stores them.
    """

    def __init__(
        self,
        spec: Spec | Mapping,
        num_envs: int,
        capacity: int,
        backing: str | FrameCompression | Callable[[Spec, int], Storage] = "ram",
        device: str | torch.device = "cpu",
        path: str | os.PathLike | None = None,
        autoreset: modes.AutoresetMode | str = modes.DEFAULT,
        reads: ReadSpec | None = None,
        stacked_input: bool = False,
        allow_overcommit: bool = False,
        check_finite: bool = True,
    ) -> None:
        self.spec = step_spec(spec)
        for name, v in (("num_envs", num_envs), ("capacity", capacity)):
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{name}: expected a positive int, got {v!r}")
        autoreset = modes.resolve(autoreset, "autoreset", modes.STEP_MODES)
        reads = ReadSpec() if reads is None else reads
        if not isinstance(reads, ReadSpec):
            raise TypeError(f"reads: expected a ReadSpec, got {type(reads).__name__}")
        self.lane_capacity = L = capacity // num_envs
        if L < max(2, reads.n_step + reads.frame_stack):
            raise ValueError(
                f"capacity: {capacity} slots over {num_envs} envs gives {L} per lane; need at least "
                f"n_step + frame_stack = {reads.n_step + reads.frame_stack} (and 2); raise capacity"
            )
        self.num_envs, self.capacity = num_envs, L * num_envs
        self.autoreset, self.reads, self.stacked_input = autoreset, reads, bool(stacked_input)
        self.obs_keys = obs_names(self.spec)
        self.slot_spec = slot_spec(self.spec, reads.frame_stack, self.stacked_input)
        self.sample_spec = sample_spec(self.slot_spec, self.obs_keys, reads.frame_stack)
        self._windows: tuple[int, int, np.ndarray] = (-1, 0, np.zeros(0, bool))
        self.compression = backing if isinstance(backing, FrameCompression) else None
        place = check_place(backing, device, path, self.slot_spec)  # (path, resume)
        self.plan = stream_plan(  # checked before anything is allocated (None: a factory)
            self.slot_spec, num_envs, self.capacity, backing, device, *place, allow_overcommit
        )
        # the layers, bottom up: index (lanes), backing (rows), commit records, reader, writer
        self.backing, self.lanes, self._books = open_backing(
            backing, self.slot_spec, self._new_lanes, device, place, allow_overcommit,
            self._config(),
        )  # fmt: skip
        rows = slot_rows(self.backing)
        self.device = rows.device
        self._reader = StreamReader(
            self.lanes, rows, self.slot_spec, self.obs_keys, reads, self.spec["reward"].dtype
        )
        self._writer = StreamWriter(
            self.spec, self.slot_spec, self.obs_keys, self.lanes, rows, self._books,
            autoreset, self.stacked_input, self.compression is not None, check_finite,
        )  # fmt: skip
        self._writer.cut[:] = place[1]  # the envs of the open episodes are gone
        self._finalizer = None if self._books is None else weakref.finalize(self, self._books.close)

    @property
    def check_finite(self) -> bool:
        """Refuse a batch with NaN or +-inf in a float field (invariant I10); settable."""
        return self._writer.check_finite

    @check_finite.setter
    def check_finite(self, value: bool) -> None:
        self._writer.check_finite = bool(value)

    @property
    def _cut(self) -> np.ndarray:
        """bool[num_envs]: lanes whose episode ends before the next extend (the writer's)."""
        return self._writer.cut

    # ------------------------------------------------------------------ construction
    def _new_lanes(self, slots: tuple[np.ndarray, np.ndarray] | None = None) -> Lanes:
        return Lanes(
            self.num_envs, self.lane_capacity, self.reads.n_step, self.reads.frame_stack, slots
        )

    def _config(self) -> dict[str, Any]:
        return {
            "spec": self.spec.to_dict(),
            "num_envs": self.num_envs,
            "capacity": self.capacity,
            "autoreset": modes.TOKEN[self.autoreset],  # saved files keep the short name
            "reads": asdict(self.reads),
            "stacked_input": self.stacked_input,
            "layout": LAYOUT,
            **({"frames": self.compression.to_dict()} if self.compression else {}),
        }

    # ------------------------------------------------------------------ sizes and masks
    @property
    def nbytes(self) -> int:
        """Bytes of the backing data plus the per-slot bookkeeping."""
        return self.backing.nbytes + bookkeeping_bytes(
            self.num_envs, self.capacity, on_disk=self._books is not None
        )

    @property
    def size(self) -> int:
        """Slots holding data (transition starts and final observations)."""
        return int((self.lanes.count - self.lanes.alive_floor()).sum())

    @property
    def valid(self) -> np.ndarray:
        """bool[capacity]: valid transition starts (the same array, updated in place)."""
        return self.lanes.valid

    @property
    def written(self) -> np.ndarray:
        """bool[capacity]: slots holding data."""
        return (self.lanes.flags & WRITTEN) != 0

    def step_flags(self, index: Index) -> dict[str, np.ndarray]:
        """``terminated``/``truncated`` of the steps taken from slots ``index`` (False for
        final-obs slots): the episode ends a sampler's ``on_write`` may track."""
        fl = self.lanes.flags[as_rows(index, self.capacity)]
        return {"terminated": (fl & TERM) != 0, "truncated": (fl & TRUNC) != 0}

    def window(self, starts: np.ndarray, length: int) -> np.ndarray:
        """Rows of ``length`` consecutive steps from each start, in its lane: [B] -> [B, length]."""
        return self.lanes.window(starts, length)

    def valid_windows(self, length: int) -> np.ndarray:
        """bool[capacity]: starts whose ``length`` consecutive steps are all valid starts (so
        the window stays within one episode). Cached until ``valid`` changes."""
        if self._windows[:2] != (self.lanes.version, length):
            v = self.lanes.grid(self.valid)  # [L, N]: a lane's next step is the next row
            w = v.copy()
            for j in range(1, length):
                w &= np.roll(v, -j, axis=0)
            self._windows = (self.lanes.version, length, w.reshape(-1))
        return self._windows[2]

    @staticmethod
    def plan_bytes(
        spec: Spec | Mapping,
        capacity: int,
        frame_stack: int = 1,
        stacked_input: bool = False,
        num_envs: int = 1,
        compression: FrameCompression | None = None,
    ) -> dict[str, int]:
        """Exact bytes of a stream storage of ``capacity`` slots over ``num_envs`` lanes: per
        stored field, plus the host-RAM bookkeeping of the lanes (3 B per slot, 42 per lane).
        With ``compression`` the frame fields are its arena and index instead (sized by its
        ``budget``; see :mod:`rlstash.storage.frames`)."""
        return stream_plan_bytes(spec, capacity, frame_stack, stacked_input, num_envs, compression)

    @staticmethod
    def naive_bytes(
        spec: Spec | Mapping, capacity: int, frame_stack: int = 1, stacked_input: bool = False
    ) -> dict[str, int]:
        """Bytes of a naive buffer of ``capacity`` transitions that stores ``obs`` and
        ``next_obs`` (``frame_stack`` frames each), action, reward, flags and extras."""
        return naive_bytes(spec, capacity, frame_stack, stacked_input)

    # ------------------------------------------------------------------ writing
    def extend(self, batch: Mapping[str, Any]) -> np.ndarray:
        """Store one step of N envs (``[N, ...]``) or a time-major chunk (``[T, N, ...]``).

        Validated in full first (a bad batch writes nothing). Returns the slot indices written,
        in order (same-step autoreset also writes a final-obs slot per ended episode).
        """
        return self._writer.extend(batch)

    def open_steps(self, T: int, any_fields: bool = False) -> StepSlots | None:
        """Slots for ``T`` next-step steps of all lanes that a collector fills in place, one
        ``[N, ...]`` block of rows per field and step, then commits (``extend`` without the
        batch); None where this stream cannot take them so. ``any_fields``: the caller fills
        extra fields too (a dataset loader). See :mod:`rlstash.storage.stream_direct`."""
        return open_steps(self._writer, T, any_fields)

    def end_episodes(self, envs: Any = None, final_obs: Any = None) -> None:
        """End the current episode of the lanes ``envs`` (all by default; indices or a bool mask).

        For envs reset outside the stream (a collector reset, a restarted worker, a resumed
        buffer): the next ``extend`` starts a new episode in those lanes, never stitched to
        the old one. ``final_obs`` (``[S, ...]`` for the S envs, or a dict per obs field) is
        what each env showed last, never passed to ``extend``: it is stored as the final obs
        and the last step becomes ``truncated`` there (a next-step lane whose last step was
        done keeps its flags). Without it the last stored obs ends the episode instead: its
        step is dropped and the step before it turns ``truncated``. Called without
        ``final_obs`` before the first extend after a load or a reopen.
        """
        self._writer.end_episodes(envs, final_obs)

    # ------------------------------------------------------------------ reading
    def read(self, index: Index, out: Batch | None = None) -> Batch:
        """Rebuild the transitions starting at ``index`` (int array of any shape [*S]).

        Returns obs fields (``[*S, k, *frame]`` when stacking), ``action``, ``reward``
        (n-step return), ``next_obs`` fields, ``terminated``, ``truncated``, ``done``,
        ``discount`` (gamma^m) and extra fields, on the backing's device. Every index must be
        a valid start (ValueError otherwise). ``out`` (same keys and shapes) is filled instead.
        """
        self._check_open()
        idx = as_rows(index, self.capacity)
        flat = idx.reshape(-1)
        bad = flat[~self.valid[flat]]
        if bad.size:
            raise ValueError(
                f"index: {bad[:5].tolist()} {'...' if bad.size > 5 else ''}are not valid transition "
                "starts (final-obs slot, successor not written yet, overwritten or unwritten)"
            )
        if out is not None and any(k not in out for k in self.sample_spec):
            raise ValueError(f"out: missing fields {[k for k in self.sample_spec if k not in out]}")
        return self._reader.rebuild(idx, out)

    def gather(self, index: np.ndarray) -> Batch:
        """:meth:`read` of starts a built-in sampler just drew from ``valid`` (an int64 array
        [B]), without re-checking them: the replay buffer's hot path, under its lock."""
        self._check_open()
        return self._reader.rebuild(index, None)

    # ------------------------------------------------------------------ state and lifecycle
    def state_dict(self) -> dict[str, Any]:
        """Config, the backing's state and the lane bookkeeping (a disk stream saves first)."""
        self._check_open()
        self.flush()
        return {
            "kind": "StreamStorage",
            "config": self._config(),
            "device": str(self.device),
            "backing": self.backing.state_dict(),
            "lanes": {k: v.copy() for k, v in self.lanes.arrays().items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load a :meth:`state_dict` of a stream with the same settings (checked first).

        Sampling then matches the saved stream; the next ``extend`` starts new episodes. A
        save of the older lane-major layout is converted (:mod:`~rlstash.storage.stream_layout`).
        """
        self._check_open()
        cfg = dict(state.get("config") or {})
        layout = saved_layout(cfg)
        cfg["layout"] = LAYOUT
        if cfg != self._config():
            raise ValueError("state: it belongs to a StreamStorage with other settings")
        if layout not in (LAYOUT, LANE_MAJOR):
            raise ValueError(
                f"state: row layout {layout!r}; this rlstash reads {LAYOUT!r} (and converts "
                f"{LANE_MAJOR!r} saves): load it with the rlstash that saved it"
            )
        if layout == LANE_MAJOR:
            state = convert_state(state, self.num_envs, self.lane_capacity)
        check = Lanes(self.num_envs, self.lane_capacity, 1, 1)
        for k in LANE_KEYS:  # every shape checked before anything changes
            if np.shape(state["lanes"][k]) != check.arrays()[k].shape:
                raise ValueError(f"state: lane array {k!r} has the wrong shape")
        if self._books is not None:  # the slots are replaced: a crash meanwhile leaves none
            self._books.commit_empty()
        try:
            self.backing.load_state_dict(state["backing"])
        except BaseException:
            if self._books is not None:
                self._books.commit()  # nothing changed: the old lanes count again
            raise
        self.lanes.load(state["lanes"])
        self._writer.cut[:] = True
        if self._books is not None:
            self.flush()

    @classmethod
    def from_state_dict(
        cls, state: Mapping[str, Any], device: str | torch.device | None = None
    ) -> StreamStorage:
        """Rebuild a stream: a disk one reopens its directory, a RAM one is reallocated (on
        ``device``, default the saved one) and loaded."""
        cfg = state["config"]
        args = (Spec.from_dict(cfg["spec"]), cfg["num_envs"], cfg["capacity"])
        kw = dict(
            autoreset=modes.BY_TOKEN[cfg["autoreset"]],
            reads=ReadSpec(**cfg["reads"]),
            stacked_input=cfg["stacked_input"],
        )
        backing, where, path, load = saved_backing(state, device)
        store = cls(*args, backing, where, path=path, **kw)
        if load:
            store.load_state_dict(state)
        return store

    def flush(self) -> None:
        """Disk: sync the data and the lanes, then commit them with a synced record (what a
        power loss keeps)."""
        self._check_open()
        if self._books is not None:
            self._books.persist()
        else:
            self._reader.rows.flush()

    def close(self) -> None:
        """Save (disk) and close the backing (idempotent)."""
        if self._writer.closed:
            return
        try:
            if self._finalizer is not None:
                self._finalizer()
        finally:
            self._writer.closed = True
            self.backing.close()

    def _check_open(self) -> None:
        self._writer.check_open()

    def __enter__(self) -> StreamStorage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"StreamStorage({self.spec!r}, num_envs={self.num_envs}, capacity={self.capacity}, "
            f"{self.reads}, autoreset={self.autoreset.value!r}, backing={type(self.backing).__name__})"
        )


register_kind("StreamStorage", lambda state, device: StreamStorage.from_state_dict(state, device))

__all__ = [  # the spec helpers are re-exported: they were defined here before
    "Lanes",
    "NPZ",
    "ReadSpec",
    "StreamStorage",
    "obs_names",
    "slot_spec",
    "step_spec",
    "transition_step",
]
