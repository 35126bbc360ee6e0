"""Minari episodes copied once, straight into a stream's planned slots, dealt over its lanes.

:func:`fill` is the write path of :func:`rlstash.datasets.minari.from_minari` and of
offline-to-online seeding: the stream (fresh, next-step) opens ``P`` lockstep slots per lane
(:meth:`~rlstash.storage.stream.StreamStorage.open_steps`), each episode's arrays as Minari
decodes them are copied once into those slots (numpy views of the storage), the flags go
into a ``[P, N]`` pair, and one commit records every step (the sampler learns them as after
``extend``). A stream that cannot be written in place (a GPU, compressed frames, a tiered
backing) gets the same ``[P, N]`` grid through ``extend`` in chunks (one more copy).

Lanes (:func:`deal`): one lane takes every episode in order. N lanes take ``P`` slots each:
the episodes are laid end to end and the lanes filled one after the other, so an episode may
be cut where a lane is full: its first part ends truncated at the observation where the next
lane's part starts (the transition is kept exactly, its next observation stored in both
lanes; a truncated step bootstraps, so n-step returns stop at the cut). A few more cuts
inside a lane make every lane exactly ``P`` slots long (lanes move in lockstep).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rlstash.spec import Field, Spec

CHUNK = 1 << 16
"""Slots per ``extend`` where the stream cannot be written in place."""


@dataclass(frozen=True)
class Piece:
    """Observations ``a`` .. ``b`` of episode ``episode`` (``b - a`` steps, ``b - a + 1``
    slots); ``cut``: the piece ends inside its episode, its last step turns truncated."""

    episode: int
    a: int
    b: int
    cut: bool = False

    @property
    def slots(self) -> int:
        return self.b - self.a + 1

    def split(self) -> tuple[Piece, Piece]:
        """Two pieces sharing the middle observation (one slot more in all)."""
        m = self.a + (self.b - self.a) // 2
        return Piece(self.episode, self.a, m, True), Piece(self.episode, m, self.b, self.cut)


def deal(lengths: Sequence[int], num_lanes: int) -> tuple[list[list[Piece]], int]:
    """The pieces of each lane and the slots ``P`` every lane takes, for episodes of
    ``lengths`` steps (module docstring; episodes of zero steps are left out). A ValueError
    when the episodes are too few or too short to fill ``num_lanes`` lanes evenly."""
    whole = [Piece(i, 0, int(t)) for i, t in enumerate(lengths) if t > 0]
    total = sum(p.slots for p in whole)
    if num_lanes == 1:
        return [whole], total
    P = max(2, -(-(total + num_lanes - 1) // num_lanes))  # N - 1 cuts at least
    while True:  # the first P whose last lane is not longer than the others
        lanes, rest = _fill_lanes(whole, num_lanes - 1, P)
        size = sum(p.slots for p in rest)
        if size <= P:
            return [*lanes, _lengthen(rest, P - size, num_lanes)], P
        P += 1


def _refusal(num_lanes: int) -> ValueError:
    return ValueError(
        f"envs: the dataset's episodes are too few or too short to fill {num_lanes} env lanes "
        f"evenly (a lane would hold no step, or only one-step episodes); give fewer --envs"
    )


def _lengthen(lane: list[Piece], more: int, num_lanes: int) -> list[Piece]:
    """``lane`` made ``more`` slots longer by splitting its longest pieces."""
    lane = list(lane)
    for _ in range(more):
        j = max(range(len(lane)), key=lambda i: lane[i].b - lane[i].a, default=-1)
        if j < 0 or lane[j].b - lane[j].a < 2:
            raise _refusal(num_lanes)
        lane[j : j + 1] = lane[j].split()
    return lane


def _fill_lanes(whole: list[Piece], n: int, P: int) -> tuple[list[list[Piece]], list[Piece]]:
    """``n`` lanes of exactly ``P`` slots from the pieces in order; the pieces left over."""
    queue = collections.deque(whole)
    lanes: list[list[Piece]] = []
    for _ in range(n):
        lane: list[Piece] = []
        room = P
        while room:
            if not queue:
                raise _refusal(n + 1)
            piece = queue.popleft()
            if piece.slots <= room:
                lane.append(piece)
                room -= piece.slots
                if room == 1:  # one slot holds no step: one more cut inside the lane
                    lane = _lengthen(lane, 1, n + 1)
                    room = 0
            else:  # the lane is full inside this piece: the rest starts the next lane
                m = piece.a + room - 1
                lane.append(Piece(piece.episode, piece.a, m, True))
                queue.appendleft(Piece(piece.episode, m, piece.b, piece.cut))
                room = 0
        lanes.append(lane)
    return lanes, list(queue)


# ------------------------------------------------------------------ writing
def _rows(value: Any, field: Field, rows: int, name: str, episode: Any) -> np.ndarray:
    """``value`` as ``[rows, *field.shape]`` (a view where it can), or a ValueError naming it."""
    arr = np.asarray(value)
    want = (rows, *field.shape)
    if arr.size != int(np.prod(want)):
        raise ValueError(
            f"episode {episode}: {name} has shape {arr.shape}, expected {want} (the spec's "
            f"{tuple(field.shape)} per row); the dataset does not match the stream's fields"
        )
    return arr.reshape(want)


def _put(dst: np.ndarray, src: np.ndarray, name: str, episode: Any) -> None:
    try:
        np.copyto(dst, src, casting="same_kind")
    except TypeError:
        raise ValueError(
            f"episode {episode}: {name} is {src.dtype}, the stream stores {dst.dtype}; give a "
            f"spec whose {name} takes {src.dtype}"
        ) from None


class Grid:
    """The ``[P, N, ...]`` slots of every field and the ``[P, N]`` flags being filled."""

    def __init__(self, arrays: Mapping[str, np.ndarray], spec: Spec, per_slot: list[str]) -> None:
        self.arrays, self.spec, self.per_slot = arrays, spec, per_slot
        P, N = next(iter(arrays.values())).shape[:2]
        self.term, self.trunc = np.zeros((P, N), bool), np.zeros((P, N), bool)

    def write(self, fields: Mapping[str, Any], lane: int, pos: int, piece: Piece) -> None:
        """Piece ``piece`` of an episode (``fields``: per-slot fields ``[T + 1, ...]``,
        ``action``/``reward``/``terminations``/``truncations`` ``[T]``) from slot ``pos``
        of ``lane`` on; the slot after its last step holds its last observation."""
        a, b, ep = piece.a, piece.b, piece.episode
        n = b - a
        for name in self.per_slot:
            _put(self.arrays[name][pos : pos + n + 1, lane], fields[name][a : b + 1], name, ep)
        for name in ("action", "reward"):
            dst = self.arrays[name]
            _put(dst[pos : pos + n, lane], fields[name][a:b], name, ep)
            dst[pos + n, lane] = 0  # the last observation's slot takes no step
        self.term[pos : pos + n, lane] = fields["terminations"][a:b]
        self.trunc[pos : pos + n, lane] = fields["truncations"][a:b]
        last = pos + n - 1
        if piece.cut or not (self.term[last, lane] or self.trunc[last, lane]):
            self.trunc[last, lane] = True  # cut here, or an episode cut without a flag


def _host_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype a grid of this field is staged in (float32 for bfloat16)."""
    if dtype == torch.bfloat16:
        return np.dtype(np.float32)
    return torch.empty(0, dtype=dtype).numpy().dtype


def episode_fields(ep: Any, spec: Spec, per_slot: Callable[[Any], dict[str, Any]]) -> dict:
    """The arrays of a Minari episode by stream field, shapes checked (module docstring)."""
    T = len(ep.rewards)
    slots = per_slot(ep)
    want = [k for k in spec if k not in ("action", "reward", "terminated", "truncated")]
    if set(slots) != set(want):
        raise ValueError(
            f"episode {ep.id}: fields {sorted(slots)} differ from the stream's {sorted(want)}"
        )
    out = {k: _rows(v, spec[k], T + 1, k, ep.id) for k, v in slots.items()}
    out["action"] = _rows(ep.actions, spec["action"], T, "action", ep.id)
    out["reward"] = np.asarray(ep.rewards).reshape(T)
    out["terminations"] = np.asarray(ep.terminations, bool).reshape(T)
    out["truncations"] = np.asarray(ep.truncations, bool).reshape(T)
    return out


def fill(
    target: Any,
    storage: Any,
    episodes: Iterable[Any],
    lanes: list[list[Piece]],
    P: int,
    per_slot: Callable[[Any], dict[str, Any]],
    any_fields: bool,
) -> int:
    """Write the pieces ``lanes`` of ``episodes`` (in dataset order) into ``P`` slots of each
    lane of the fresh next-step ``storage``; ``target``: what opens the slots and extends (the
    storage, or a ReplayBuffer over it). ``per_slot(ep)``: an episode's per-slot fields (obs,
    infos). Returns the steps written."""
    spec = storage.spec
    slots = None
    if not any(f.dtype == torch.bfloat16 for f in storage.slot_spec.values()):
        slots = target.open_steps(P, any_fields) if any_fields else target.open_steps(P)
    if slots is not None:
        arrays = slots.block_arrays()
    else:
        N = storage.num_envs
        arrays = {
            k: np.zeros((P, N, *f.shape), _host_dtype(f.dtype))
            for k, f in storage.slot_spec.items()
        }
    names = [k for k in storage.slot_spec if k not in ("action", "reward")]
    grid = Grid(arrays, spec, names)
    where: dict[int, list[tuple[int, int, Piece]]] = {}
    for lane, pieces in enumerate(lanes):
        pos = 0
        for piece in pieces:
            where.setdefault(piece.episode, []).append((lane, pos, piece))
            pos += piece.slots
    steps = 0
    for i, ep in enumerate(episodes):
        if i not in where:
            continue
        fields = episode_fields(ep, spec, per_slot)
        for lane, pos, piece in where[i]:
            if piece.b > len(fields["reward"]):
                raise ValueError(
                    f"episode {ep.id}: {len(fields['reward'])} steps, the dataset's metadata "
                    f"counted more; the dataset is damaged"
                )
            grid.write(fields, lane, pos, piece)
        steps += len(fields["reward"])
    term, trunc = torch.from_numpy(grid.term), torch.from_numpy(grid.trunc)
    if slots is not None:
        slots.commit(term, trunc)
        return steps
    for a in range(0, P, max(1, CHUNK // storage.num_envs)):
        b = min(P, a + max(1, CHUNK // storage.num_envs))
        chunk = {k: torch.from_numpy(v[a:b]).to(spec[k].dtype) for k, v in arrays.items()}
        target.extend({**chunk, "terminated": term[a:b], "truncated": trunc[a:b]})
    return steps
