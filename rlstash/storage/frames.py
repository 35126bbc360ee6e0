"""Compressed frames for the stream storage (opt-in): a byte arena per lane, lz4 or zstd.

``StreamStorage(..., backing=FrameCompression("lz4"))`` keeps each lane's pixel frames (the
``uint8`` obs fields of 2+ dims) compressed in RAM and decompresses them on read, in the gather
path; every other field stays in a plain :class:`~rlstash.storage.ram.TensorStorage`.

Coding. A frame is a *key* (compressed as is) or, with ``delta=True``, the byte-wise
difference to the previous frame of its lane (``uint8`` arithmetic mod 256, as Reverb's
delta encoding), compressed. A payload that would not be smaller than the frame (with its
block header, below) is stored raw, so no frame ever takes more than its ``F`` bytes. Every ``key_every``-th frame of a lane
is a key, so decoding a frame takes at most ``key_every`` decompressions, and a run of
consecutive frames (a frame stack and its next observation) decodes in one walk.

Arena. Lane ``e`` owns ``A`` bytes, written as a ring log: frames are appended at the
lane's head in slot order, and a frame that does not fit before the end starts again at 0.
Per slot the arena keeps its payload's offset, length, chain depth and a raw bit (14 B).
With lz4 each compressed payload follows a 4-byte block header (its length: the LZ4 frame
format's), so the payloads of consecutive slots form one valid piece of an LZ4 frame and a
frame stack with its next frame decodes in one C call (:class:`~rlstash.storage.codecs.
LZ4BlockStream`); the header counts in the stored bytes.
Frames leave a lane, oldest first, in three ways: the ring of slots reuses their slot (as in
the plain stream); the log reuses their bytes; or the key of their delta chain left. The
lanes' ``floor`` follows, so a sampler never sees a frame that cannot be decoded.

Size (invariant I2). All bytes are known before allocation: ``A = (ceil(budget * L) + 1) * F``
per lane (``L`` slots, ``F`` bytes per frame), plus the index (14 B per slot), plus one raw
frame per lane (the delta reference). ``budget`` is the planned stored fraction of a frame:

* frames that average at most ``budget * F`` stored bytes keep all ``L`` slots of a lane but
  at most ``key_every - 1`` (a ring-reused key drops its chain); ``budget=1.0`` never drops
  more, whatever the data (worst case: every frame stored raw, ``L * F`` bytes, and the ``+ F``
  covers the log's end gap);
* frames that compress worse keep fewer slots, never more bytes: at least
  ``floor(budget * L)`` per lane (incompressible frames; less ``key_every - 1`` with delta
  coding), the oldest dropped first.

``stats()`` reports the stored bytes per frame actually reached, to size ``budget``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from itertools import repeat
from typing import Any

import numpy as np
import torch

from rlstash.spec import Spec
from rlstash.storage.codecs import (
    LZ4_BLOCK_HEADER,
    Codec,
    LZ4BlockStream,
    check_codec,
    check_level,
    make_codec,
)

JOIN_BYTES = 16 << 10  # runs of at most this many payload bytes each (mean) are joined
INDEX_BYTES = 14  # per slot and frame field: offset (int64), length (int32), depth, raw bit
LANE_INTS = 3  # per lane: count, floor, head (int64)


@dataclass(frozen=True)
class FrameCompression:
    """How a stream storage compresses its frames (pass it as the stream's ``backing``).

    Args:
        codec: ``"lz4"`` (fastest reads) or ``"zstd"`` (smaller); the extra ``compress``.
        delta: code each frame against the previous frame of its lane (else each on its own).
        key_every: with ``delta``, every ``key_every``-th frame of a lane is a key frame
            (bounds the decode chain: at most ``key_every`` decompressions per frame).
        level: the codec's level (lz4: 0 fast, 1..16 high compression; zstd: 1..22);
            None for the codec's fast default.
        budget: the planned stored bytes per frame, as a fraction of the raw frame, in
            (0, 1]; the arena is sized by it (see the module docstring for what a frame that
            compresses worse costs).
    """

    codec: str = "lz4"
    delta: bool = False
    key_every: int = 8
    level: int | None = None
    budget: float = 0.5

    def __post_init__(self) -> None:
        check_codec(self.codec, "FrameCompression.codec")
        if not isinstance(self.delta, bool):
            raise TypeError(f"FrameCompression.delta: expected a bool, got {self.delta!r}")
        k = self.key_every
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 255:
            raise ValueError(f"FrameCompression.key_every: expected an int in [1, 255], got {k!r}")
        if self.level is not None:
            check_level(self.codec, self.level, "FrameCompression.level")
        b = self.budget
        if not isinstance(b, (int, float)) or isinstance(b, bool) or not 0.0 < b <= 1.0:
            raise ValueError(
                f"FrameCompression.budget: expected a fraction in (0, 1] of a raw frame, got "
                f"{b!r}; e.g. 0.1 for Atari frames (see bench/results/frames_compressed.md)"
            )

    @property
    def chain(self) -> int:
        """Frames per delta chain: ``key_every`` with ``delta``, else 1 (every frame a key)."""
        return self.key_every if self.delta else 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def lane_bytes(self, frame_bytes: int, L: int) -> int:
        """Arena bytes of one lane of ``L`` slots: ``(ceil(budget * L) + 1) * F`` (whole
        frames, so frames stored raw lie at multiples of ``F``)."""
        return (math.ceil(self.budget * L) + 1) * frame_bytes

    def plan_bytes(self, frame_bytes: int, num_envs: int, L: int) -> dict[str, int]:
        """Exact bytes of one frame field's arena: the lanes' bytes, and the index plus one
        reference frame per lane (``"index"``)."""
        arena = num_envs * self.lane_bytes(frame_bytes, L)
        index = INDEX_BYTES * num_envs * L + num_envs * (frame_bytes + 8 * LANE_INTS)
        return {"arena": arena, "index": index}


def _empty(shape: tuple[int, ...]) -> np.ndarray:
    """An uninitialised uint8 array from torch's allocator: on a busy host, numpy's fresh
    megabyte buffers next to many small decompressed ones page-faulted ~5x slower."""
    return torch.empty(shape, dtype=torch.uint8).numpy()


def frame_fields(spec: Spec, obs_keys: list[str]) -> list[str]:
    """The obs fields that are compressed: ``uint8`` with at least 2 dims (pixels)."""
    return [k for k in obs_keys if spec[k].dtype == torch.uint8 and len(spec[k].shape) >= 2]


class FrameArena:
    """One frame field of every lane, compressed in a per-lane ring log (module docstring).

    It takes the stream's rows (slot-major, :class:`~rlstash.storage.lanes.Lanes`) and keeps
    its index lane-major (:meth:`arena_rows`), so a lane's entries and its log stay together
    and its saved arrays do not depend on the stream's row layout."""

    def __init__(
        self, frame_shape: tuple[int, ...], num_envs: int, L: int, comp: FrameCompression
    ) -> None:
        self.shape, self.N, self.L, self.comp = tuple(frame_shape), num_envs, L, comp
        self.F = F = math.prod(frame_shape)
        self.A = comp.lane_bytes(F, L)  # a multiple of F, at least 2 F
        self.codec: Codec = make_codec(comp.codec, comp.level)
        self._decompress = self.codec.decompressor(F)
        self.data = np.zeros((num_envs, self.A), np.uint8)  # [N, A] payloads
        self.off = np.zeros(num_envs * L, np.int64)  # per slot: payload offset in its lane
        self.size = np.zeros(num_envs * L, np.int32)  # payload bytes
        self.depth = np.zeros(num_envs * L, np.uint8)  # 0: key frame, d: d-th delta after it
        self.raw = np.zeros(num_envs * L, bool)  # payload stored uncompressed
        self.count = np.zeros(num_envs, np.int64)  # frames ever written per lane
        self.floor = np.zeros(num_envs, np.int64)  # oldest decodable frame (a key)
        self.head = np.zeros(num_envs, np.int64)  # next free byte of each lane's log
        self.last = np.zeros((num_envs, F), np.uint8)  # newest frame of each lane (raw)
        self._delta = np.zeros(F, np.uint8)  # scratch of writes
        self._cur = np.zeros(F, np.uint8)  # scratch of reads
        self._flat = memoryview(self.data.reshape(-1))  # payloads sliced without a copy
        self._whole = self.data.reshape(-1, F)  # [N * A / F, F]: frames stored raw, aligned
        self._addr = self.data.ctypes.data  # the arena's address (decode_into reads there)
        self._scratch = np.zeros((0, F), np.uint8)  # decoded deltas of a read, reused
        # lz4: each compressed payload follows its block header, so runs of consecutive
        # payloads decode in one call (codecs.LZ4BlockStream); 0: no headers (zstd, or a
        # state saved without them)
        self.hdr = LZ4_BLOCK_HEADER if comp.codec == "lz4" else 0
        make_stream = self.codec.block_stream
        self._stream: LZ4BlockStream | None = make_stream(F) if make_stream else None

    def arena_rows(self, rows: np.ndarray) -> np.ndarray:
        """The stream's slot-major rows (``pos * N + lane``) as this arena's own lane-major
        slot indices (``lane * L + pos``: each lane's index entries side by side, as its log)."""
        return rows % self.N * self.L + rows // self.N

    def stream_row(self, i: int) -> int:
        """The stream's row of the arena's slot index ``i`` (what errors name)."""
        return i % self.L * self.N + i // self.L

    # ------------------------------------------------------------------ writing
    def write(self, rows: np.ndarray, frames: np.ndarray) -> None:
        """Append ``frames`` [R, F] at the stream's ``rows`` [R]: each lane's rows must
        continue its ring (in any order across and within lanes: they are put in slot order)."""
        L = self.L
        rows = self.arena_rows(rows)
        lane = rows // L
        rel = (rows % L - self.count[lane] % L) % L  # [R] slots after the lane's newest
        if np.bincount(lane, minlength=self.N).max() <= L:
            order = np.lexsort((rel, lane))  # slot order, whatever the order given
        else:  # a lane wraps within this write: the order given is the slot order
            order = np.argsort(lane, kind="stable")
        lane_s = lane[order]
        first = np.ones(len(order), bool)
        first[1:] = lane_s[1:] != lane_s[:-1]
        rank = np.arange(len(order)) - np.maximum.accumulate(
            np.where(first, np.arange(len(order)), 0)
        )  # [R] position of each row among its lane's rows
        if (rows[order] % L != (self.count[lane_s] + rank) % L).any():
            raise RuntimeError("FrameArena.write: rows do not continue their lanes' rings")
        for i in order.tolist():
            self._put(int(lane[i]), frames[i])

    def _put(self, e: int, frame: np.ndarray) -> None:
        L, base, c = self.L, e * self.L, int(self.count[e])
        floor = self._keyed(e, max(int(self.floor[e]), c + 1 - L), c)  # the ring reuses c - L
        key = floor == c or int(self.depth[base + (c - 1) % L]) + 1 >= self.comp.chain
        stored, raw = self._encode(frame, None if key else self.last[e])
        if raw and not key:  # the delta did not compress: a key costs no more, decodes faster
            key = True
            stored, raw = self._encode(frame, None)
        floor, head = self._make_room(e, len(stored), floor, c)
        if floor == c and not key:  # the room cost the delta's reference: store a key
            key = True
            stored, raw = self._encode(frame, None)
            floor, head = self._make_room(e, len(stored), floor, c)
        n, row, skip = len(stored), base + c % L, 0 if raw else self.hdr
        self.data[e, head : head + n] = np.frombuffer(stored, np.uint8)
        self.off[row], self.size[row], self.raw[row] = head + skip, n - skip, raw
        self.depth[row] = 0 if key else self.depth[base + (c - 1) % L] + 1
        self.head[e], self.count[e], self.floor[e] = head + n, c + 1, floor
        self.last[e] = frame

    def _encode(self, frame: np.ndarray, ref: np.ndarray | None) -> tuple[Any, bool]:
        """(the bytes stored: a compressed payload after its block header, or the frame
        raw when that is not smaller; whether raw)."""
        src = frame if ref is None else np.subtract(frame, ref, out=self._delta)
        payload = self.codec.compress(src)
        if len(payload) + self.hdr >= self.F:
            return src.tobytes(), True
        if self.hdr:
            return len(payload).to_bytes(self.hdr, "little") + payload, False
        return payload, False

    def _start(self, row: int) -> int:
        """Where the stored bytes of ``row`` begin in its lane (its block header, if any)."""
        return int(self.off[row]) - (0 if self.raw[row] else self.hdr)

    def _keyed(self, e: int, floor: int, c: int) -> int:
        """``floor`` moved up to the first key frame (a delta without its key cannot decode)."""
        base, L = e * self.L, self.L
        while floor < c and self.depth[base + floor % L] != 0:
            floor += 1
        return floor

    def _make_room(self, e: int, n: int, floor: int, c: int) -> tuple[int, int]:
        """(floor, head) after freeing ``n`` bytes at the lane's head: the oldest frames go.

        The alive frames of a lane lie in its log as [older lap: offsets >= head][this lap:
        offsets from 0 to head), in slot order, so the frames in the way are always the oldest.
        """
        base, L, head = e * self.L, self.L, int(self.head[e])
        if head + n > self.A:  # wrap: the older lap's frames past the head go first
            while floor < c and self._start(base + floor % L) >= head:
                floor += 1
            head = 0
        while floor < c and head <= self._start(base + floor % L) < head + n:
            floor += 1
        return self._keyed(e, floor, c), head

    # ------------------------------------------------------------------ reading
    def gather(self, rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Frames of the stream's ``rows`` [P, j] (each row's frames a forward run of one
        lane, as frame stacks) or [P] -> uint8 [*rows.shape, *frame] (into ``out`` when given).

        Without delta coding every frame is a key: each is decoded on its own, straight into
        the output (raw ones with one numpy gather). With delta coding each run decodes in one
        walk from the key frame of its first row to its last row (the walks of all runs
        planned with numpy), each delta added (``uint8``, mod 256) to the frame before it.
        """
        shape = (*rows.shape, *self.shape)
        if out is not None and not (
            out.dtype == np.uint8 and out.flags.c_contiguous and out.size == rows.size * self.F
        ):
            raise ValueError(
                f"out: expected a C-contiguous uint8 array of {rows.size} frames of {self.F} B, "
                f"got {out.dtype} {out.shape} (contiguous: {out.flags.c_contiguous})"
            )
        dst = None if out is None else out.reshape(-1, self.F)
        return self._gather(self.arena_rows(np.asarray(rows)), dst, shape)

    def _gather(self, rows: np.ndarray, dst: np.ndarray | None, shape: tuple) -> np.ndarray:
        """:meth:`gather` of the arena's own slot indices ``rows`` into ``dst`` [Q, F]."""
        if self.comp.chain == 1:
            return self._keys(rows.reshape(-1), dst).reshape(shape)
        runs = rows.reshape(len(rows), -1) if rows.ndim else rows.reshape(1, 1)
        walk = self._walks(runs)
        if walk is None:  # some run is not a forward run of one lane: each row on its own
            return self._gather(rows.reshape(-1, 1), dst, shape)
        walk_rows, pick = walk  # [W], [P, j] index into the walk
        if not self.depth[walk_rows].any():  # keys only
            return self._keys(walk_rows[pick.reshape(-1)], dst).reshape(shape)
        got = self._sum_chains(walk_rows, self._payloads(walk_rows), pick.reshape(-1))
        if dst is None:
            return got.reshape(shape)
        dst[...] = got
        return dst.reshape(shape)

    def _walks(self, runs: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """Rows decoded per run (from its first row's key to its last row), concatenated [W],
        and where each run's rows land in them [P, j]; None when a run is not a forward run
        of one lane no longer than ``j + chain`` slots."""
        L, (P, j) = self.L, runs.shape
        first = runs[:, 0]
        rel = (runs - first[:, None]) % L  # [P, j] slots after the first row
        d0 = self.depth[first].astype(np.int64)  # [P] deltas since the key
        span = d0 + rel[:, -1] + 1  # [P] frames each walk decodes
        if j > 1 and not (
            (runs // L == (first // L)[:, None]).all()
            and (np.diff(rel, axis=1) >= 0).all()
            and (span <= j + self.comp.chain).all()
        ):
            return None
        start = np.cumsum(span) - span  # [P] where each walk begins
        sid = np.repeat(np.arange(P), span)  # [W] run of each walk step
        t = np.arange(int(span.sum())) - start[sid]  # [W] step within its walk
        key_pos = first % L - d0  # [P] lane position of each walk's key
        walk_rows = (first // L * L)[sid] + (key_pos[sid] + t) % L
        return walk_rows, start[:, None] + d0[:, None] + rel

    def _keys(self, rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Key frames of ``rows`` [Q] -> [Q, F] (``out``: C-contiguous [Q, F] uint8, or
        None). Raw frames at offsets that are multiples of F (incompressible data: the log
        then holds whole frames) come in one numpy gather; the others are decoded into the
        output."""
        F, L = self.F, self.L
        raw = self.raw[rows]
        out = _empty((len(rows), F)) if out is None else out
        if not raw.any():  # compressed frames only (Atari): each decoded into the output
            self._decode(rows, out, None, False)
            return out
        off = self.off[rows]
        fast = raw & (off % F == 0)
        if fast.all():
            at = rows // L * (self.A // F) + off // F  # whole-frame index of each frame
            return np.take(self._whole, at, axis=0, out=out, mode="clip")  # clip: unbuffered
        if fast.any():
            at = rows[fast] // L * (self.A // F) + off[fast] // F  # whole-frame index
            out[fast] = np.take(self._whole, at, axis=0)
            slow = np.flatnonzero(~fast)
            self._decode(rows[slow], out, slow)
        else:
            self._decode(rows, out, None)
        return out

    def _decode(
        self, rows: np.ndarray, out: np.ndarray, at: np.ndarray | None, raw: bool | None = None
    ) -> None:
        """Payloads of ``rows`` [Q] decoded into the rows ``at`` [Q] (None: 0..Q-1) of
        ``out`` [*, F] (C-contiguous), every result checked. lz4 with its block stream: one
        C call per run of payloads that lie one after the other in the arena and go to
        consecutive rows (a frame stack and its next frame); with the codec's
        ``decode_into``: one C call per payload (``map`` over the ctypes function: no Python
        frame between them); else one ``decompressor`` call and copy each. ``raw``: whether
        any of them is stored raw (None: look it up)."""
        F, L = self.F, self.L
        if raw is None:
            raw = bool(self.raw[rows].any())
        runs = self._stream is not None and self.hdr > 0
        if raw or not (runs or self.codec.decode_into):  # rare (raw at odd offsets), no ctypes
            dst = memoryview(out).cast("B")
            where = range(len(rows)) if at is None else at.tolist()
            for q, part in zip(where, self._payloads(rows)):
                dst[q * F : (q + 1) * F] = part
            return
        start = self.off[rows] + rows // L * self.A  # [Q] payload offsets in the arena
        size = self.size[rows]
        end = start + size
        if len(rows) and (start.min() < self.hdr or end.max() > self.data.size or size.min() < 0):
            bad = int(np.flatnonzero((start < self.hdr) | (end > self.data.size) | (size < 0))[0])
            raise RuntimeError(
                f"FrameArena: the index entry of slot {self.stream_row(int(rows[bad]))} is corrupt "
                f"(payload bytes {int(start[bad])}..{int(end[bad])} outside the arena's {self.data.size})"
            )
        assert out.flags.c_contiguous and out.dtype == np.uint8 and out.shape[1:] == (F,)
        if runs:
            self._decode_runs(rows, out, at, start, end)
            return
        dst0 = out.ctypes.data
        dsts = range(dst0, dst0 + F * len(rows), F) if at is None else (dst0 + F * at).tolist()
        done = list(map(self.codec.decode_into, (self._addr + start).tolist(), dsts,
                        (end - start).tolist(), repeat(F, len(rows))))  # fmt: skip
        if done.count(F) != len(done):
            bad = next(i for i, n in enumerate(done) if n != F)
            self._corrupt(int(rows[bad]), f"decoded {done[bad]} bytes, expected {F}")

    def _decode_runs(
        self,
        rows: np.ndarray,
        out: np.ndarray,
        at: np.ndarray | None,
        start: np.ndarray,
        end: np.ndarray,
    ) -> None:
        """:meth:`_decode` of compressed payloads at ``start..end`` [Q] in runs: a payload
        whose block header ends where the previous payload ends, going to the next row of
        ``out``, continues that run. Each run may write from its first row to the end of
        ``out`` (the decoder's bound) and must give exactly its frames."""
        F, Q = self.F, len(rows)
        if not Q:
            return
        brk = np.empty(Q, bool)  # [Q] a run starts here
        brk[0] = True
        np.not_equal(start[1:] - self.hdr, end[:-1], out=brk[1:])
        if at is not None:
            brk[1:] |= at[1:] != at[:-1] + 1
        first = np.flatnonzero(brk)  # [R]
        stop = np.append(first[1:], Q)  # [R] one past each run's last payload
        begin = start[first] - self.hdr  # [R] the first block header of each run
        last = end[stop - 1]  # [R] one past each run's last payload byte
        out0 = out.ctypes.data
        if at is None and len(first) > 1 and (last - begin).sum() <= JOIN_BYTES * len(first):
            # the runs fill the output in order: copied into one piece, one call decodes all
            # (a copy of a few KB costs less than a call); on a failure, the runs one by one
            flat = self._flat
            piece = b"".join([flat[b:e] for b, e in zip(begin.tolist(), last.tolist())])
            if self._stream.decode_piece(piece, out0, out.shape[0] * F, Q * F):
                return
        pos = F * (first if at is None else at[first])  # [R] output byte of each run
        bad, got = self._stream.decode(
            (self._addr + begin).tolist(), last - begin, (out0 + pos).tolist(),
            out.shape[0] * F - pos, F * (stop - first),
        )  # fmt: skip
        if bad >= 0:
            self._locate(rows[first[bad] : stop[bad]], start[first[bad] : stop[bad]])

    def _locate(self, rows: np.ndarray, start: np.ndarray) -> None:
        """Raise the error naming the first corrupt slot of a run that failed: a block header
        that disagrees with the index, else the first payload that does not decode alone."""
        heads = self.data.reshape(-1)[(start - self.hdr)[:, None] + np.arange(self.hdr)]
        said = heads.astype(np.int64) @ (256 ** np.arange(self.hdr))  # [Q] little endian
        wrong = np.flatnonzero(said != self.size[rows])
        if wrong.size:
            q = int(wrong[0])
            raise RuntimeError(
                f"FrameArena: the payload of slot {self.stream_row(int(rows[q]))} is corrupt (its lz4 block "
                f"header says {int(said[q])} bytes, its index entry {int(self.size[rows[q]])})"
            )
        for row, at in zip(rows.tolist(), start.tolist()):
            try:
                n = len(self._decompress(self._flat[at : at + int(self.size[row])]))
            except Exception as exc:  # the codec's own error: this payload does not decode
                self._corrupt(row, f"{exc}")
            if n != self.F:
                self._corrupt(row, f"decoded {n} bytes, expected {self.F}")
        raise RuntimeError(
            f"FrameArena: the payloads of slots {rows.tolist()} decode one by one but not as "
            "one run: the arena is corrupt"
        )

    def _corrupt(self, i: int, why: str) -> None:
        """Raise the error naming the stream's row of the arena's slot index ``i``."""
        raise RuntimeError(
            f"FrameArena: the payload of slot {self.stream_row(i)} is corrupt "
            f"({self.comp.codec} {why})"
        )

    def _payloads(self, walk_rows: np.ndarray) -> Iterator[Any]:
        """Decoded payloads (a frame, or a delta) of ``walk_rows``: bytes-likes of F bytes,
        one at a time (a consumer copies each before the next is made: one small buffer,
        reused and cache-hot, instead of a megabyte of them page-faulted in per batch). With
        the codec's ``decode_into`` the compressed ones are first decoded into a scratch
        [W, F] that is kept and reused."""
        if self.codec.decode_into is not None and not self.raw[walk_rows].any():
            if len(self._scratch) < len(walk_rows):
                self._scratch = _empty((2 * len(walk_rows), self.F))
            scratch = self._scratch[: len(walk_rows)]
            self._decode(walk_rows, scratch, None)
            return iter(scratch)
        offs = self.off[walk_rows] + walk_rows // self.L * self.A
        ends = (offs + self.size[walk_rows]).tolist()
        mv, dec = self._flat, self._decompress
        return (
            mv[o:e] if r else dec(mv[o:e])
            for o, e, r in zip(offs.tolist(), ends, self.raw[walk_rows].tolist())
        )

    def _sum_chains(
        self, walk_rows: np.ndarray, parts: Iterator[Any], pick: np.ndarray
    ) -> np.ndarray:
        """Frames at walk positions ``pick`` [Q] -> [Q, F]: a key frame as decoded, a delta
        frame added to the frame before it in its walk (every walk starts with a key).
        Frames that are picked are summed in place in the output, the others in a scratch."""
        out = _empty((len(pick), self.F))  # [Q, F]
        steps, first = np.unique(pick, return_index=True)
        at = np.full(len(walk_rows), -1, np.int64)
        at[steps] = first  # [W] the output row of each walk step, or -1
        key = (self.depth[walk_rows] == 0).tolist()
        prev = cur = self._cur  # [F]
        for payload, is_key, q in zip(parts, key, at.tolist()):
            dst = cur if q < 0 else out[q]
            if is_key:
                dst[:] = np.frombuffer(payload, np.uint8)
            else:
                np.add(prev, np.frombuffer(payload, np.uint8), out=dst)
            prev = dst
        src = at[pick]
        dup = np.flatnonzero(src != np.arange(len(pick)))  # a frame picked twice (padding)
        out[dup] = out[src[dup]]
        return out

    # ------------------------------------------------------------------ sizes and state
    @property
    def nbytes(self) -> int:
        return sum(self.comp.plan_bytes(self.F, self.N, self.L).values())

    def stored_bytes(self) -> int:
        """Payload bytes of the decodable frames (what their data take in the arena)."""
        L = self.L
        seq = np.arange(L)[None, :]
        lo, hi = self.floor[:, None], self.count[:, None]
        slot = hi - 1 - ((hi - 1 - seq) % L)  # [N, L] newest slot number at each row
        alive = ((slot >= lo) & (slot >= 0)).reshape(-1)
        return int(self.size[alive].sum() + self.hdr * (alive & ~self.raw).sum())

    def frames_alive(self) -> int:
        return int((self.count - self.floor).sum())

    def arrays(self) -> dict[str, np.ndarray]:
        return {
            "data": self.data,
            "off": self.off,
            "size": self.size,
            "depth": self.depth,
            "raw": self.raw,
            "count": self.count,
            "floor": self.floor,
            "head": self.head,
            "last": self.last,
        }

    def load(self, arrays: Mapping[str, Any]) -> None:
        for k, v in self.arrays().items():  # every shape checked before anything changes
            if np.shape(arrays[k]) != v.shape:
                raise ValueError(f"state: frame arena array {k!r} has the wrong shape")
        for k, v in self.arrays().items():
            v[...] = np.asarray(arrays[k])


__all__ = ["FrameArena", "FrameCompression", "frame_fields"]
