"""Shared-memory layout laid out from gymnasium spaces (torch-free; imported by workers).

A space is flattened into *leaves*: every Box, Discrete, MultiDiscrete and MultiBinary inside
nested Dict/Tuple spaces becomes one array of shape ``[num_envs, *leaf_shape]``::

    Dict(pos=Box(-1, 1, (3,)), id=Discrete(4))  ->  obs/pos [N, 3] float32, obs/id [N] int64

A :class:`Layout` places the arrays of a pool (observations, final observations, actions,
rewards, flags) one after another in a single segment, each at a 64-byte-aligned offset.
The segment is an anonymous shared-memory file (``memfd_create`` on Linux, else a file in
``/dev/shm`` or the temp directory unlinked right after creation): it has no name in the file
system, so nothing is left in ``/dev/shm`` however the processes end, and no resource
tracker is involved. Workers receive its file descriptor and map it.
"""

from __future__ import annotations

import copy
import mmap
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

ALIGN = 64
INFO_COLUMNS = 16  # numbers per env of a step's info carried in shared memory (info_columns)
SUPPORTED = (
    "Box, Discrete, MultiDiscrete, MultiBinary, custom spaces of fixed shape and dtype, and "
    "Dict/Tuple of these"
)
_VARIABLE = (spaces.Text, spaces.Graph, spaces.Sequence, spaces.OneOf)  # no fixed layout


@dataclass(frozen=True)
class Leaf:
    """One array of a space: where it sits in the nested value, its per-env shape and dtype."""

    path: tuple[str | int, ...]
    shape: tuple[int, ...]
    dtype: np.dtype


def space_leaves(space: spaces.Space, path: tuple[str | int, ...] = ()) -> list[Leaf]:
    """Flatten ``space`` into its array leaves, depth first (Dict keys in the space's order).

    Raises:
        TypeError: for spaces without a fixed shape and dtype (Text, Graph, Sequence, OneOf).
    """
    if isinstance(space, spaces.Dict):
        return [leaf for k, s in space.spaces.items() for leaf in space_leaves(s, (*path, k))]
    if isinstance(space, spaces.Tuple):
        return [leaf for i, s in enumerate(space.spaces) for leaf in space_leaves(s, (*path, i))]
    if isinstance(space, spaces.Discrete):
        return [Leaf(path, (), np.dtype(space.dtype))]
    if isinstance(space, (spaces.Box, spaces.MultiDiscrete, spaces.MultiBinary)):
        return [Leaf(path, tuple(int(d) for d in space.shape), np.dtype(space.dtype))]
    if is_fixed_custom(space):
        return [Leaf(path, tuple(space.shape), np.dtype(space.dtype))]
    where = "/".join(map(str, path)) or "<root>"
    raise TypeError(
        f"space at {where}: {type(space).__name__} cannot live in shared memory; "
        f"supported: {SUPPORTED}"
    )


def is_fixed_custom(space: spaces.Space) -> bool:
    """A custom space (a ``Space`` subclass that is none of gymnasium's own) of fixed size:
    it declares a ``shape`` of ints and a ``dtype``, and a sample (of a copy of it, so its
    random state is untouched) is a numpy array of that shape and dtype. Its values live in
    shared memory like a Box's; other custom spaces are pickled."""
    builtin = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)
    if type(space) is spaces.Space or isinstance(space, (*builtin, *_VARIABLE)):
        return False
    if isinstance(space, (spaces.Dict, spaces.Tuple)) or not isinstance(space, spaces.Space):
        return False
    shape, dtype = space.shape, space.dtype
    if shape is None or dtype is None or not all(isinstance(d, int) for d in shape):
        return False
    known = _FIXED.get(id(space))
    if known is not None and known[0] is space:
        return known[1]
    try:
        sample = copy.deepcopy(space).sample()
    except Exception:  # noqa: BLE001 - a space that cannot sample is not laid out
        sample = None
    fixed = isinstance(sample, np.ndarray) and sample.shape == shape and sample.dtype == dtype
    _FIXED[id(space)] = (space, fixed)  # the space is kept: its id cannot be reused
    return fixed


_FIXED: dict[int, tuple[spaces.Space, bool]] = {}  # custom spaces probed so far


def has_custom(space: spaces.Space) -> bool:
    """Whether a fixed-size custom space is among the leaves of ``space``."""
    if isinstance(space, spaces.Dict):
        return any(has_custom(s) for s in space.spaces.values())
    if isinstance(space, spaces.Tuple):
        return any(has_custom(s) for s in space.spaces)
    return is_fixed_custom(space)


def leaf_name(prefix: str, leaf: Leaf) -> str:
    """Field name of a leaf inside a layout, e.g. ``obs/pos`` or ``act`` for a flat space."""
    return "/".join([prefix, *map(str, leaf.path)])


@dataclass(frozen=True)
class FieldSlot:
    """One array of a layout: ``shape`` includes the leading env dimension."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    offset: int

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class Layout:
    """Every array of a pool in one segment. Picklable: sent to each worker once.

    ``obs_pickled``/``act_pickled``: observations (and final observations) / actions of a
    space without a fixed array layout (Text, Graph, Sequence, OneOf, custom spaces without a
    fixed shape and dtype; actions: any custom space) or, for observations, with
    ``shared_memory=False``, have no field here: they travel pickled with the replies / STEP
    messages.
    """

    num_envs: int
    fields: tuple[FieldSlot, ...]
    nbytes: int
    obs_pickled: bool = False
    act_pickled: bool = False

    @staticmethod
    def build(
        obs_space: spaces.Space,
        act_space: spaces.Space,
        num_envs: int,
        final_obs: bool,
        obs_pickled: bool = False,
    ) -> Layout:
        """Lay out obs, (final_obs), act, info [N, INFO_COLUMNS] f64, reward [N] f64,
        terminated/truncated/final [N] bool.

        ``nbytes = sum over fields of align64(N * prod(shape) * itemsize)``.
        """
        obs_pickled = obs_pickled or not fits_arrays(obs_space)
        # custom action spaces travel pickled: an env may want its own value type back
        act_pickled = not fits_arrays(act_space) or has_custom(act_space)
        wanted: list[tuple[str, tuple[int, ...], np.dtype]] = []
        prefixes = ["obs", "final_obs"] if final_obs else ["obs"]
        for prefix in prefixes if not obs_pickled else []:
            wanted += [
                (leaf_name(prefix, lf), lf.shape, lf.dtype) for lf in space_leaves(obs_space)
            ]
        if not act_pickled:
            wanted += [(leaf_name("act", lf), lf.shape, lf.dtype) for lf in space_leaves(act_space)]
        wanted += [("info", (INFO_COLUMNS,), np.dtype(np.float64))]  # see info_columns
        wanted += [("reward", (), np.dtype(np.float64))]
        wanted += [(name, (), np.dtype(np.bool_)) for name in ("terminated", "truncated", "final")]
        fields, offset = [], 0
        for name, shape, dtype in wanted:
            slot = FieldSlot(name, (num_envs, *shape), dtype.str, offset)
            fields.append(slot)
            offset += -(-max(slot.nbytes, 1) // ALIGN) * ALIGN
        return Layout(num_envs, tuple(fields), max(offset, ALIGN), obs_pickled, act_pickled)


def fits_arrays(space: spaces.Space) -> bool:
    """Whether ``space`` flattens into fixed-shape array leaves (see :func:`space_leaves`)."""
    try:
        space_leaves(space)
    except TypeError:
        return False
    return True


def create_segment(nbytes: int, tag: str) -> int:
    """A file descriptor of ``nbytes`` of zeroed shared memory that has no file-system name.

    Linux: ``memfd_create``; elsewhere a file in ``/dev/shm`` (or the temp dir) created with
    ``O_EXCL`` and unlinked at once. The memory is freed when the last descriptor and mapping
    are gone, whatever way the processes end. ``nbytes`` may be 0 and grown with
    :func:`resize_segment` before anyone maps it.
    """
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create(f"rlstash_{os.getpid()}_{tag}", os.MFD_CLOEXEC)
    else:  # pragma: no cover - macOS and other POSIX systems
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
        fd, path = tempfile.mkstemp(prefix=f"rlstash_{os.getpid()}_{tag}_", dir=folder)
        os.unlink(path)
    if nbytes:
        os.ftruncate(fd, nbytes)
    return fd


def resize_segment(fd: int, nbytes: int) -> None:
    """Grow a segment made by :func:`create_segment` (new bytes read as zero)."""
    os.ftruncate(fd, nbytes)


class SharedArrays:
    """Numpy views of every field of a :class:`Layout` over one mapping.

    ``fd=None`` maps anonymous private memory (the in-process pool uses the same code path).
    The mapping is made with ``mmap(2)`` directly (not Python's ``mmap`` object, which keeps a
    duplicate of ``fd`` open until the object is freed): the only descriptor is the caller's,
    so closing it releases it at once. The mapping itself lives until :meth:`close` *and*
    until the last numpy view of it is gone (a caller's ``copy=False`` observation stays
    valid), then it is unmapped.
    """

    def __init__(self, layout: Layout, fd: int | None) -> None:
        self.layout = layout
        self._buffer: Any = _map(layout.nbytes, fd)
        self.arrays: dict[str, np.ndarray] = {}
        for f in layout.fields:
            count = int(np.prod(f.shape, dtype=np.int64))
            flat = np.frombuffer(
                self._buffer, dtype=np.dtype(f.dtype), count=count, offset=f.offset
            )
            self.arrays[f.name] = flat.reshape(f.shape)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def leaves(self, prefix: str) -> list[np.ndarray]:
        """The arrays of one prefix (``obs``, ``final_obs``, ``act``) in leaf order."""
        return [a for n, a in self.arrays.items() if n == prefix or n.startswith(prefix + "/")]

    def close(self) -> None:
        """Drop this object's views; the memory is unmapped once no view of it is left."""
        self.arrays = {}
        self._buffer = None


_libc: Any = None


def _map(nbytes: int, fd: int | None) -> Any:
    """A ctypes byte array over a fresh ``mmap`` of ``fd`` (shared) or of anonymous memory;
    ``munmap`` runs when the array (and so every numpy view of it) is garbage collected."""
    global _libc
    import ctypes
    import weakref

    if _libc is None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [
            ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
            ctypes.c_long,
        ]  # fmt: skip
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        _libc = libc
    prot = mmap.PROT_READ | mmap.PROT_WRITE
    if fd is None:
        flags, fd = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1
    else:
        flags = mmap.MAP_SHARED
    addr = _libc.mmap(None, nbytes, prot, flags, fd, 0)
    if addr is None or addr == ctypes.c_void_p(-1).value:
        err = ctypes.get_errno()
        raise OSError(err, f"mmap of {nbytes} bytes failed: {os.strerror(err)}")

    class _Mapped(ctypes.c_uint8 * nbytes):  # a subclass: ctypes arrays take no weakrefs
        pass

    buffer = _Mapped.from_address(addr)
    unmap = weakref.finalize(buffer, _libc.munmap, addr, nbytes)
    unmap.atexit = False  # at exit a late reader could still touch a view: let the OS unmap
    return buffer


# --- nested values <-> leaf arrays -------------------------------------------------------


def assemble(space: spaces.Space, arrays: list[np.ndarray], index: Any = slice(None)) -> Any:
    """Nested value (dict/tuple of arrays) from leaf arrays; ``index`` selects rows.

    ``assemble(space, views)`` gives the batched value (views; a custom space's part is a
    tuple of row views, as gymnasium batches custom spaces); ``index=i`` one env's value.
    """
    it = iter(arrays)
    batched = not isinstance(index, (int, np.integer))

    def build(s: spaces.Space) -> Any:
        if isinstance(s, spaces.Dict):
            return {k: build(sub) for k, sub in s.spaces.items()}
        if isinstance(s, spaces.Tuple):
            return tuple(build(sub) for sub in s.spaces)
        rows = next(it)[index]
        # a custom space batches as a tuple of per-env values (gymnasium's batch_space)
        return tuple(rows) if batched and is_fixed_custom(s) else rows

    return build(space)


def copy_tree(value: Any) -> Any:
    """Deep copy of a nested dict/tuple of arrays (arrays copied)."""
    if isinstance(value, dict):
        return {k: copy_tree(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(copy_tree(v) for v in value)
    return np.array(value, copy=True)


def flatten_value(space: spaces.Space, value: Any, what: str) -> list[Any]:
    """Leaves of a nested value in :func:`space_leaves` order; checks the structure.

    Raises:
        TypeError: when a Dict/Tuple level is not a mapping/tuple or misses keys.
    """
    if isinstance(space, spaces.Dict):
        if not isinstance(value, dict) or set(value) != set(space.spaces):
            got = sorted(value) if isinstance(value, dict) else type(value).__name__
            raise TypeError(f"{what}: expected a dict with keys {sorted(space.spaces)}, got {got}")
        return [
            x for k, s in space.spaces.items() for x in flatten_value(s, value[k], f"{what}[{k!r}]")
        ]
    if isinstance(space, spaces.Tuple):
        if not isinstance(value, (tuple, list)) or len(value) != len(space.spaces):
            got = (
                f"length {len(value)}" if isinstance(value, (tuple, list)) else type(value).__name__
            )
            raise TypeError(f"{what}: expected a tuple of {len(space.spaces)} parts, got {got}")
        return [
            x
            for i, s in enumerate(space.spaces)
            for x in flatten_value(s, value[i], f"{what}[{i}]")
        ]
    return [value]


def leaf_paths(space: spaces.Space, what: str) -> list[str]:
    """Human-readable names of the leaves of a value, e.g. ``actions['pos']``."""
    return [what + "".join(f"[{p!r}]" for p in lf.path) for lf in space_leaves(space)]


def bad_value(what: str, value: Any, row: np.ndarray) -> ValueError:
    """The error for a value that does not fit its row (names what, expected and got)."""
    got = f"shape {np.shape(value)}, {getattr(value, 'dtype', type(value).__name__)}"
    return ValueError(f"{what}: expected shape {row.shape} {row.dtype} (from the space), got {got}")


def make_writer(
    space: spaces.Space, arrays: list[np.ndarray], what: str = "observation", offset: int = 0
) -> Callable[[int, Any], None]:
    """``write(i, value)`` stores one env's (nested) value into row ``i`` of the leaf arrays.

    Raises:
        ValueError: naming env ``offset + i`` and the leaf, when the value does not fit the
            space's shape.
    """
    names = leaf_paths(space, what)
    flat = len(arrays) == 1 and not isinstance(space, (spaces.Dict, spaces.Tuple))

    def write(i: int, value: Any) -> None:
        leaves = [value] if flat else flatten_value(space, value, what)
        for arr, leaf_value, name in zip(arrays, leaves, names):
            try:
                arr[i] = leaf_value
            except (ValueError, TypeError) as exc:
                raise bad_value(f"env {offset + i}: {name}", leaf_value, arr[i]) from exc

    return write


def make_reader(space: spaces.Space, arrays: list[np.ndarray]) -> Callable[[], list[Any]]:
    """``read()`` returns one value per row, copied out of the (shared) leaf arrays.

    Flat spaces give numpy scalars (Discrete), Python floats (a Box of shape ()) or 1-row
    arrays, like gymnasium's ``iterate``.
    """
    if len(arrays) == 1 and not isinstance(space, (spaces.Dict, spaces.Tuple)):
        arr = arrays[0]
        if arr.ndim == 1 and arr.dtype.kind == "f":  # scalar Box: Python floats, which
            return arr.tolist  # every API takes (time.sleep refuses a numpy.float32)
        return lambda: list(arr.copy())

    def read_nested() -> list[Any]:
        copies = [a.copy() for a in arrays]
        return [assemble(space, copies, i) for i in range(len(copies[0]))]

    return read_nested
