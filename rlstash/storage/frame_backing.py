"""The stream's backing with compressed frames: a :class:`~rlstash.storage.frames.FrameArena`
per frame field, a :class:`~rlstash.storage.ram.TensorStorage` for the other fields; and what
``rlstash plan`` says about compressed frames. The format: :mod:`rlstash.storage.frames`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from rlstash.indices import as_rows
from rlstash.spec import Batch, Spec
from rlstash.storage.frames import FrameArena, FrameCompression, frame_fields
from rlstash.storage.lanes import Lanes
from rlstash.storage.ram import TensorStorage, numpy_view


class FrameBacking:
    """A stream's backing with compressed frames: :class:`FrameArena` per frame field, a
    :class:`TensorStorage` for the other fields. Keeps ``lanes.floor`` at or above the
    arenas' floors (frames that left the arena are no longer alive in the lanes)."""

    def __init__(
        self,
        spec: Spec,
        lanes: Lanes,
        comp: FrameCompression,
        frame_keys: list[str],
        allow_overcommit: bool = False,
    ) -> None:
        from rlstash.memory import plan

        self.spec, self.lanes, self.comp = spec, lanes, comp
        self.capacity = lanes.num_envs * lanes.L
        self.device = torch.device("cpu")
        rest = Spec({k: f for k, f in spec.items() if k not in frame_keys})
        arena = {
            f"frames {k}: {part}": b
            for k in frame_keys
            for part, b in comp.plan_bytes(spec[k].row_bytes, lanes.num_envs, lanes.L).items()
        }
        plan(rest, self.capacity, "ram", "cpu", extra={"ram": arena}).check(allow_overcommit)
        self.arenas = {
            k: FrameArena(spec[k].shape, lanes.num_envs, lanes.L, comp) for k in frame_keys
        }
        self.plain = TensorStorage(rest, self.capacity, "cpu", allow_overcommit)
        self.tensors = self.plain.tensors

    @property
    def nbytes(self) -> int:
        return self.plain.nbytes + sum(a.nbytes for a in self.arenas.values())

    def write(self, index: Any, batch: Batch, validate: bool = True) -> None:
        """Write rows that continue the lanes (frames appended to each lane's log)."""
        rows = as_rows(index, self.capacity).reshape(-1)
        if validate:
            batch = self.spec.validate(batch)
        frames = {k: numpy_view(batch[k].contiguous()).reshape(len(rows), -1) for k in self.arenas}
        for k, arena in self.arenas.items():
            arena.write(rows, frames[k])
        self.plain.write(rows, {k: batch[k] for k in self.plain.spec}, validate=False)
        floor = np.max([a.floor for a in self.arenas.values()], axis=0)
        self.lanes.drop_before(floor)

    def gather_frames(self, field: str, rows: np.ndarray, out: torch.Tensor | None) -> torch.Tensor:
        """Decoded frames of ``field`` at ``rows`` [P, j] or [P] (into ``out`` when it fits)."""
        arena = self.arenas[field]
        fits = (
            out is not None
            and out.dtype == torch.uint8
            and out.device.type == "cpu"
            and out.is_contiguous()
            and out.numel() == rows.size * arena.F
        )
        got = arena.gather(rows, numpy_view(out) if fits else None)
        return torch.from_numpy(got)

    def read(self, index: Any, out: Batch | None = None) -> Batch:
        """Rows at ``index``: every field, frames decoded."""
        rows = as_rows(index, self.capacity)
        res = self.plain.read(rows)
        for k in self.arenas:
            res[k] = self.gather_frames(k, rows.reshape(-1), None).reshape(
                *rows.shape, *self.spec[k].shape
            )
        if out is None:
            return res
        for k, v in res.items():
            out[k].copy_(v)
        return out

    def stats(self) -> dict[str, float]:
        """Stored payload bytes per decodable frame, its ratio to a raw frame, frames held."""
        stored = sum(a.stored_bytes() for a in self.arenas.values())
        alive = max(1, min(a.frames_alive() for a in self.arenas.values()))
        raw = sum(a.F for a in self.arenas.values())
        return {
            "stored_bytes_per_frame": stored / alive,
            "ratio": stored / alive / raw,
            "frames_held": alive,
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "kind": "FrameBacking",
            "compression": self.comp.to_dict(),
            "plain": self.plain.state_dict(),
            "arenas": {k: a.arrays() for k, a in self.arenas.items()},  # references, no copy
            "block_headers": {k: a.hdr for k, a in self.arenas.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("kind") != "FrameBacking" or state.get("compression") != self.comp.to_dict():
            raise ValueError("state: it belongs to a stream with other frame compression settings")
        if set(state["arenas"]) != set(self.arenas):
            raise ValueError(
                f"state: frame fields {sorted(state['arenas'])}, expected {sorted(self.arenas)}"
            )
        for k, a in self.arenas.items():
            a.load(state["arenas"][k])
            # the layout it was written with (states saved before block headers have none)
            a.hdr = int(state.get("block_headers", {}).get(k, 0))
        self.plain.load_state_dict(state["plain"])

    def flush(self) -> None:
        """Nothing to sync (RAM)."""

    def close(self) -> None:
        self.plain.close()
        self.arenas = {}


def compression_note(spec: Spec, comp: FrameCompression, num_envs: int, L: int) -> str:
    """What ``rlstash plan`` says under the table: the budget per frame, what it holds when
    frames compress as planned, and the worst case (incompressible frames)."""
    from rlstash.memory import human_bytes

    keys = frame_fields(spec, obs_names_of(spec))
    lines = []
    for k in keys:
        F = spec[k].row_bytes
        parts = comp.plan_bytes(F, num_envs, L)
        per = comp.lane_bytes(F, L) / L
        mode = f"delta-coded, a key frame every {comp.key_every}" if comp.delta else "per frame"
        lines.append(
            f"compressed frames: {k} ({F:,} B raw) with {comp.codec} ({mode}), budget "
            f"{comp.budget:g} -> {per:,.0f} B per slot; {num_envs} lanes of {L:,} slots: arena "
            f"{human_bytes(parts['arena'])} + index {human_bytes(parts['index'])}"
        )
    held = max(1, math.floor(comp.budget * L) - (comp.chain - 1))
    lines.append(
        "frames that average <= the budget keep every slot"
        + (f" (but at most {comp.key_every - 1} per lane, the oldest)" if comp.delta else "")
        + f"; frames that compress worse keep fewer transitions (at least {held:,} per lane "
        "for incompressible frames), never more bytes. Atari 84x84 frames store ~0.04 of a "
        "raw frame with lz4, ~0.025 with zstd (bench/results/frames_compressed.md)"
    )
    return "\n".join(lines)


def obs_names_of(spec: Spec) -> list[str]:
    return [k for k in spec if k == "obs" or k.startswith("obs/")]


def frame_plan_bytes(
    spec: Spec, frame_keys: list[str], comp: FrameCompression, num_envs: int, L: int
) -> dict[str, int]:
    """Exact bytes per part of the compressed frame fields (for :meth:`StreamStorage.plan_bytes`)."""
    out: dict[str, int] = {}
    for k in frame_keys:
        for part, b in comp.plan_bytes(spec[k].row_bytes, num_envs, L).items():
            out[f"{k} ({comp.codec} {part})"] = b
    return out


__all__ = ["FrameBacking", "compression_note", "frame_plan_bytes"]
