"""Byte codecs for compressed frames: ``lz4`` (block format) and ``zstd``.

Both come from the package registry as the optional extra ``compress``
(``pip install 'rlstash[compress]'``: ``lz4`` and ``zstandard``) and are imported only when a
codec is made, with that install hint when missing. A codec turns one frame's bytes into a
payload and back; the caller knows the frame size, so no size is stored in the payload
(lz4 block mode without a size prefix; zstd frames without a checksum).

Reads of many small payloads pay more for the call than for the decoding (an 84x84 Atari frame
decodes in ~0.3 us, a ``block.decompress`` call plus the copy of its result costs ~0.9 us), so
lz4 also decodes *into* a caller's buffer: ``LZ4_decompress_safe``, called through ``ctypes``
from the ``lz4`` package's own extension module (which exports it), else from the system's
``liblz4``; no bytes object is made and nothing is copied twice. Where no library is found, and
for zstd (whose decoding, ~5 us per Atari frame, dwarfs the call), the codec has no
``decode_into`` and readers use ``decompressor``.

Even that call (~0.3 us through ctypes) costs about as much as decoding a frame, so lz4 also
decodes *runs* of payloads in one call (:class:`LZ4BlockStream`): a writer that puts each
payload right after its 4-byte LZ4 frame block header (:data:`LZ4_BLOCK_HEADER`: the payload's
size, little endian) makes consecutive payloads a valid piece of an LZ4 frame, and
``LZ4F_decompress`` (the frame format's decoder, in the same libraries) decodes a whole piece
(a frame stack and its next frame: 5 payloads) in one call; the pieces of a read, copied into
one (a few KB), decode in one call too (:meth:`LZ4BlockStream.decode_piece`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from itertools import repeat
from pathlib import Path
from typing import Any

import numpy as np

CODECS = ("lz4", "zstd")
LZ4_BLOCK_HEADER = 4  # bytes before each lz4 payload in a block stream: its size (LE uint32)
INSTALL_HINT = "pip install 'rlstash[compress]'  (or: pip install lz4 zstandard)"


@dataclass(frozen=True)
class Codec:
    """``compress(bytes-like) -> bytes``; ``decompressor(size)`` gives ``f(bytes-like) ->
    bytes`` for payloads of ``size`` bytes (a C-level partial: no Python frame per call).

    ``decode_into(src, dst, n, size) -> int`` (or None): decodes the ``n`` payload bytes at
    address ``src`` into the ``size`` bytes at address ``dst`` and returns the bytes decoded
    (negative: a corrupt payload); the caller keeps both buffers alive during the call.

    ``block_stream(size) -> LZ4BlockStream | None`` (or None): a decoder of runs of payloads
    of frames of ``size`` bytes, each payload preceded by its :data:`LZ4_BLOCK_HEADER`.
    """

    name: str
    level: int
    compress: Callable[[Any], bytes]
    decompressor: Callable[[int], Callable[[Any], bytes]]
    decode_into: Callable[[int, int, int, int], int] | None = None
    block_stream: Callable[[int], LZ4BlockStream | None] | None = None

    def decompress(self, data: Any, size: int) -> bytes:
        return self.decompressor(size)(data)


def check_codec(name: Any, option: str = "codec") -> str:
    """``name`` if it is a known codec, else a ValueError naming ``option`` and the choices."""
    if name not in CODECS:
        raise ValueError(f"{option}: expected one of {list(CODECS)}, got {name!r}")
    return name


PACKAGES = {"lz4": "lz4", "zstd": "zstandard"}  # codec -> the package it imports


def missing_package(name: str) -> str | None:
    """None when codec ``name``'s package imports, else what to say: the package missing and
    the install command (checked before a run starts; nothing is imported here)."""
    import importlib.util

    package = PACKAGES[check_codec(name)]
    try:
        found = importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a package set to None in sys.modules, a broken one
        found = False
    if found:
        return None
    return f"codec {name!r} needs the {package} package, not installed: {INSTALL_HINT}"


def default_level(name: str) -> int:
    """lz4: 0 (its fast default mode); zstd: 1 (fast, already ~2x smaller than lz4 on frames)."""
    return 0 if name == "lz4" else 1


def check_level(name: str, level: Any, option: str = "level") -> int:
    """A valid compression level of codec ``name`` (lz4: 0 fast, 1..16 high compression;
    zstd: 1..22); a ValueError naming ``option`` otherwise."""
    lo, hi = (0, 16) if name == "lz4" else (1, 22)
    if not isinstance(level, int) or isinstance(level, bool) or not lo <= level <= hi:
        raise ValueError(f"{option}: {name} takes an int in [{lo}, {hi}], got {level!r}")
    return level


def make_codec(name: str, level: int | None = None) -> Codec:
    """The codec ``name`` (``"lz4"`` or ``"zstd"``) at ``level`` (default: :func:`default_level`).

    Raises ValueError for an unknown name or level, ImportError with the install hint when the
    package is missing.
    """
    check_codec(name)
    level = default_level(name) if level is None else check_level(name, level)
    if name == "lz4":
        return _lz4(level)
    return _zstd(level)


def _lz4(level: int) -> Codec:
    try:
        import lz4.block as block
    except ImportError as exc:
        raise ImportError(f"codec 'lz4' needs the lz4 package: {INSTALL_HINT}") from exc
    if level == 0:

        def compress(data: Any) -> bytes:
            return block.compress(data, store_size=False)

    else:

        def compress(data: Any) -> bytes:
            return block.compress(
                data, mode="high_compression", compression=level, store_size=False
            )

    def decompressor(size: int) -> Callable[[Any], bytes]:
        return partial(block.decompress, uncompressed_size=size)

    return Codec("lz4", level, compress, decompressor, _lz4_decode_into(block), LZ4BlockStream.make)


def _lz4_decode_into(block: Any) -> Callable[[int, int, int, int], int] | None:
    """``LZ4_decompress_safe(src, dst, n, size)`` (a ctypes function: no Python frame per
    call), from the lz4 package's extension module (already loaded: the same library) or the
    system's liblz4. Called through ``ctypes.PyDLL``: it keeps the GIL (a frame decodes in
    well under a microsecond; releasing and taking the GIL back cost ~15% of the call)."""
    for lib in _lz4_libraries(getattr(block, "_block", None)):
        fn = getattr(lib, "LZ4_decompress_safe", None)
        if fn is None:
            continue
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        fn.restype = ctypes.c_int
        return fn
    return None


class LZ4BlockStream:
    """Decodes runs of lz4 payloads, one C call per run.

    Each payload must lie right after its :data:`LZ4_BLOCK_HEADER` (its size as a little
    endian uint32: the block header of the LZ4 frame format), and a run is a piece of memory
    holding consecutive (header, payload) pairs. ``LZ4F_decompress`` decodes it on a
    decompression context that was given a frame header (independent blocks, no checksums,
    no content size, the smallest block size that holds a frame) once: the context stays
    between blocks, so any run can follow any other. The decoder checks every bound (it
    reads only the run, writes only the room it is given); the caller checks that each run
    gave exactly its frames' bytes (:meth:`decode`). Called through ``ctypes.PyDLL`` with the
    GIL held: each call starts and ends between blocks, so no other thread can see the
    context mid-run.
    """

    def __init__(self, lib: Any, header: bytes) -> None:
        vp, size_t = ctypes.c_void_p, ctypes.c_size_t
        self._fn = lib.LZ4F_decompress  # (ctx, dst, *dst_size, src, *src_size, options)
        self._fn.argtypes, self._fn.restype = [vp] * 6, size_t
        self._fn_bytes = lib["LZ4F_decompress"]  # the same, src a bytes object (no copy)
        self._fn_bytes.argtypes = [vp, vp, vp, ctypes.c_char_p, vp, vp]
        self._fn_bytes.restype = size_t
        create, free = lib.LZ4F_createDecompressionContext, lib.LZ4F_freeDecompressionContext
        create.argtypes, create.restype = [vp, ctypes.c_uint], size_t
        free.argtypes, free.restype = [vp], size_t
        self._reset = lib.LZ4F_resetDecompressionContext
        self._reset.argtypes, self._reset.restype = [vp], None
        ctx = ctypes.c_void_p()
        if create(ctypes.addressof(ctx), 100) != 0 or not ctx.value:  # 100: LZ4F_VERSION
            raise OSError("LZ4F_createDecompressionContext failed")
        self._ctx = ctx.value
        weakref.finalize(self, free, self._ctx)
        self._header = np.frombuffer(header, np.uint8).copy()
        self._start()

    @classmethod
    def make(cls, size: int) -> LZ4BlockStream | None:
        """A stream for frames of ``size`` bytes from the lz4 package's frame extension or the
        system's liblz4; None where neither has the frame API, or a frame exceeds 4 MiB."""
        try:
            import lz4.frame as frame
        except ImportError:
            return None
        sizes = [(64 << 10, frame.BLOCKSIZE_MAX64KB), (256 << 10, frame.BLOCKSIZE_MAX256KB),
                 (1 << 20, frame.BLOCKSIZE_MAX1MB), (4 << 20, frame.BLOCKSIZE_MAX4MB)]  # fmt: skip
        block_size = next((b for cap, b in sizes if size <= cap), None)
        if block_size is None:
            return None
        empty = frame.compress(
            b"",
            block_size=block_size,
            block_linked=False,
            content_checksum=False,
            block_checksum=False,
            store_size=False,
        )
        header = empty[:7]  # magic, FLG, BD, HC (then the end mark)
        for lib in _lz4_libraries(getattr(frame, "_frame", None)):
            try:
                return cls(lib, header)
            except (OSError, AttributeError):
                continue
        return None

    def _start(self) -> None:
        """The context reset and given the frame header: it then expects a block header."""
        self._reset(self._ctx)
        done = np.array([0, self._header.size], np.int64)  # size_t: dst (none), src sizes
        at = done.ctypes.data
        hint = self._fn(self._ctx, None, at, self._header.ctypes.data, at + 8, None)
        if int(done[1]) != self._header.size or hint > 1 << 31:
            raise OSError(f"LZ4F_decompress refused the frame header (code {hint})")

    def decode_piece(self, src: bytes, dst: int, room: int, want: int) -> bool:
        """Decode all of ``src`` (consecutive blocks with their headers) into address ``dst``
        with ``room`` bytes free there, in one call; whether it consumed all of ``src`` and
        gave exactly ``want`` bytes (else the context is restarted)."""
        io = np.array([room, len(src)], np.int64)  # size_t in/out: produced, consumed
        at = io.ctypes.data
        hint = self._fn_bytes(self._ctx, dst, at, src, at + 8, None)
        if io[0] == want and io[1] == len(src) and hint <= 1 << 31:
            return True
        self._start()
        return False

    def decode(
        self,
        srcs: list[int],
        sizes: np.ndarray,
        dsts: list[int],
        room: np.ndarray,
        want: np.ndarray,
    ) -> tuple[int, np.ndarray]:
        """Decode the runs of ``sizes[i]`` bytes at addresses ``srcs[i]`` into addresses
        ``dsts[i]``, with ``room[i]`` bytes free there (the decoder writes no further); run
        ``i`` must give ``want[i]`` bytes (all int64 [R]).

        Returns ``(bad, produced)``: the first run that did not consume exactly its bytes and
        give exactly ``want`` (a corrupt run; -1: none), and the bytes each run gave [R]. After
        a failure the context is restarted (a failed run may leave it mid-block)."""
        n = len(srcs)
        io = np.empty((2, n), np.int64)  # size_t in/out: [0] room -> produced, [1] consumed
        io[0], io[1] = room, sizes
        p0, p1 = io.ctypes.data, io.ctypes.data + 8 * n
        hints = list(map(self._fn, repeat(self._ctx, n), dsts, range(p0, p0 + 8 * n, 8), srcs,
                         range(p1, p1 + 8 * n, 8), repeat(None, n)))  # fmt: skip
        produced = io[0]
        ok = (io[1] == sizes) & (produced == want)
        if ok.all() and max(hints, default=0) <= 1 << 31:  # else an error code (size_t)-k
            return -1, produced
        self._start()
        errs = np.array(hints, np.uint64) > 1 << 31
        return int(np.flatnonzero(~ok | errs)[0]), produced


def _zstd(level: int) -> Codec:
    try:
        import zstandard
    except ImportError as exc:
        raise ImportError(f"codec 'zstd' needs the zstandard package: {INSTALL_HINT}") from exc
    params = dict(level=level, write_checksum=False, write_content_size=True, write_dict_id=False)
    cctx, dctx = zstandard.ZstdCompressor(**params), zstandard.ZstdDecompressor()

    def decompressor(size: int) -> Callable[[Any], bytes]:
        return partial(dctx.decompress, max_output_size=size)

    return Codec("zstd", level, cctx.compress, decompressor)


def _library(kind: Any, path: str | None) -> Any:
    """The shared library ``path`` loaded as ``kind`` (OSError if absent)."""
    if not path or (Path(path).is_absolute() and not Path(path).exists()):
        raise OSError(f"no library at {path!r}")
    return kind(path)


def _lz4_libraries(extension: Any) -> Iterator[Any]:
    """The libraries that may hold lz4's C functions, loaded with ``ctypes.PyDLL`` (calls keep
    the GIL), in order: the lz4 package's ``extension`` module (already loaded: the same
    code), then the system's liblz4; those that do not load are skipped."""
    for path in (getattr(extension, "__file__", None), ctypes.util.find_library("lz4")):
        try:
            yield _library(ctypes.PyDLL, path)
        except OSError:
            continue
