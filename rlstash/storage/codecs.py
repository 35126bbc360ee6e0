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
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

CODECS = ("lz4", "zstd")
INSTALL_HINT = "pip install 'rlstash[compress]'  (or: pip install lz4 zstandard)"


@dataclass(frozen=True)
class Codec:
    """``compress(bytes-like) -> bytes``; ``decompressor(size)`` gives ``f(bytes-like) ->
    bytes`` for payloads of ``size`` bytes (a C-level partial: no Python frame per call).

    ``decode_into(src, dst, n, size) -> int`` (or None): decodes the ``n`` payload bytes at
    address ``src`` into the ``size`` bytes at address ``dst`` and returns the bytes decoded
    (negative: a corrupt payload); the caller keeps both buffers alive during the call.
    """

    name: str
    level: int
    compress: Callable[[Any], bytes]
    decompressor: Callable[[int], Callable[[Any], bytes]]
    decode_into: Callable[[int, int, int, int], int] | None = None

    def decompress(self, data: Any, size: int) -> bytes:
        return self.decompressor(size)(data)


def check_codec(name: Any, option: str = "codec") -> str:
    """``name`` if it is a known codec, else a ValueError naming ``option`` and the choices."""
    if name not in CODECS:
        raise ValueError(f"{option}: expected one of {list(CODECS)}, got {name!r}")
    return name


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

    return Codec("lz4", level, compress, decompressor, _lz4_decode_into(block))


def _lz4_decode_into(block: Any) -> Callable[[int, int, int, int], int] | None:
    """``LZ4_decompress_safe(src, dst, n, size)`` (a ctypes function: no Python frame per
    call), from the lz4 package's extension module (already loaded: the same library) or the
    system's liblz4."""
    module = getattr(getattr(block, "_block", None), "__file__", None)
    for path in (module, ctypes.util.find_library("lz4")):
        try:
            fn = _symbol(ctypes.CDLL, path, "LZ4_decompress_safe")
        except (OSError, AttributeError):
            continue
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        fn.restype = ctypes.c_int
        return fn
    return None


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


def _symbol(kind: Any, path: str | None, name: str) -> Any:
    """Function ``name`` of the shared library ``path`` (OSError/AttributeError if absent)."""
    if not path or (Path(path).is_absolute() and not Path(path).exists()):
        raise OSError(f"no library at {path!r}")
    return getattr(kind(path), name)
