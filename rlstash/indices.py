"""Row indices: the one normaliser every sampler, storage and the replay buffer uses.

An index names rows of a storage of ``capacity`` rows, either as a ``slice(start, stop)``
(a contiguous run, what writers hand out) or as integers: a numpy array, a torch tensor (on
any device; copied to the host) or a list. :func:`as_rows` turns the integers into a host
``numpy.int64`` array of the same shape, every value in ``[0, capacity)``;
:func:`normalize_index` keeps a slice as a slice and wants 1-D arrays.

What is refused, naming the argument and showing the values given (first five):

* floats (``[0.7, 2.9]`` would silently become rows 0 and 2), NaN, bools (a mask is not a
  list of rows: ``np.flatnonzero(mask)`` is), strings and other objects: TypeError;
* values outside ``[0, capacity)``, negative or huge (``2**63``, ``10**30``) shown as
  given, never after a wrapping cast: :class:`IndexRangeError`, both an ``IndexError``
  and a ``ValueError``;
* slices with a step, or that wrap around or run past the capacity: IndexRangeError.

The common case (a 1-D ``int64`` numpy array) costs one ``max`` over the values seen as
unsigned integers, which checks both ends at once (a negative value becomes huge).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["IndexRangeError", "as_rows", "check_rows", "normalize_index"]

_SHOW = 5  # values shown in an error
_TORCH_INTS = frozenset(
    {
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.uint16,
        torch.uint32,
        torch.uint64,
    }
)


class IndexRangeError(IndexError, ValueError):
    """Row indices outside ``[0, capacity)``, or a slice that is not a plain run of rows."""


def as_rows(index: Any, capacity: int, name: str = "index", lazy: bool = False) -> np.ndarray:
    """Integer row indices of any shape as a host ``int64`` array in ``[0, capacity)``.

    A slice gives ``arange(start, stop)`` (see :func:`normalize_index` for the rules).
    TypeError for non-integer values, :class:`IndexRangeError` for values out of range.
    ``lazy=True`` skips the range check of an array that already is ``int64`` (any other
    dtype is checked before its cast): for a caller that bounds the rows more cheaply itself
    (e.g. by the ends of a sorted copy) and calls :func:`check_rows` when that bound fails.
    """
    if type(index) is np.ndarray and index.dtype == np.int64:
        if not lazy:
            check_rows(name, index, capacity)
        return index
    if isinstance(index, slice):
        sl, _ = _slice(index, capacity, name)
        return np.arange(sl.start, sl.stop, dtype=np.int64)
    arr = _integers(index, capacity, name)
    if arr.dtype == np.int64:
        if not lazy:
            check_rows(name, arr, capacity)
        return arr
    if arr.size and arr.max() >= capacity or (arr.dtype.kind == "i" and arr.size and arr.min() < 0):
        _raise_range(name, arr, capacity)  # checked before the cast, so values show as given
    return arr.astype(np.int64)


def normalize_index(
    index: Any, capacity: int, name: str = "index"
) -> tuple[slice | np.ndarray, int]:
    """``(index, n_rows)``: a slice ``slice(start, stop)`` with ``0 <= start <= stop <=
    capacity`` (step 1) kept as such, or a 1-D integer array as checked by :func:`as_rows`."""
    if isinstance(index, slice):
        return _slice(index, capacity, name)
    idx = as_rows(index, capacity, name)
    if idx.ndim != 1:
        raise TypeError(
            f"{name}: expected a slice or a 1-D integer array of rows, got shape "
            f"{list(idx.shape)}; flatten it (.reshape(-1)) if every entry is a row"
        )
    return idx, idx.shape[0]


def check_rows(name: str, idx: np.ndarray, capacity: int) -> None:
    """:class:`IndexRangeError` unless every value of the int64 array ``idx`` is in
    ``[0, capacity)`` (one reduction: negative values wrap to huge unsigned ones)."""
    if idx.size and int(np.maximum.reduce(idx.view(np.uint64), axis=None)) >= capacity:
        _raise_range(name, idx, capacity)


def _slice(index: slice, capacity: int, name: str) -> tuple[slice, int]:
    start, stop, step = index.start, index.stop, index.step
    if type(start) is int and type(stop) is int and step is None and 0 <= start <= stop <= capacity:
        return index, stop - start  # what writers hand out
    start = 0 if start is None else start
    stop = capacity if stop is None else stop
    ints = all(isinstance(v, int | np.integer) and not isinstance(v, bool) for v in (start, stop))
    if not ints or step not in (None, 1) or not 0 <= start <= stop <= capacity:
        raise IndexRangeError(
            f"{name}: a slice must be slice(start, stop) with integers 0 <= start <= stop <= "
            f"{capacity} and step 1, got {index!r}; use an index array to wrap around"
        )
    return slice(int(start), int(stop)), int(stop) - int(start)


def _integers(index: Any, capacity: int, name: str) -> np.ndarray:
    """A host numpy array of an integer dtype, or TypeError showing what came."""
    if isinstance(index, torch.Tensor):
        if index.dtype not in _TORCH_INTS:
            _raise_type(name, index.detach().cpu().reshape(-1), index.dtype)
        if index.requires_grad:
            index = index.detach()
        index = (index if index.is_cpu else index.cpu()).numpy()  # explicit device-to-host copy
    try:
        arr = np.asarray(index)
    except (TypeError, ValueError, OverflowError) as exc:
        raise TypeError(
            f"{name}: expected integer row indices, got {type(index).__name__} ({exc})"
        ) from None
    kind = arr.dtype.kind
    if kind in "iu":
        return arr
    if not arr.size and kind in "fb":  # [] is float64 to numpy: no rows
        return arr.astype(np.int64)
    if kind == "O" and all(type(v) is int for v in arr.flat):  # e.g. Python ints beyond 64 bits
        if any(not 0 <= v < capacity for v in arr.flat):
            _raise_range(name, arr, capacity)
        return arr.astype(np.int64)
    _raise_type(name, arr.ravel(), arr.dtype)
    raise AssertionError  # unreachable


def _raise_type(name: str, values: Any, dtype: Any) -> None:
    dtype = str(dtype).removeprefix("torch.")
    fix = (
        "a bool mask is not a list of rows: pass np.flatnonzero(mask)"
        if dtype == "bool"
        else "rows are integers: pass the int64 'index' that sample() returned"
    )
    raise TypeError(
        f"{name}: expected a slice or a 1-D integer array of row indices, got {dtype} values "
        f"{_shown(values)}; {fix}"
    )


def _raise_range(name: str, idx: np.ndarray, capacity: int) -> None:
    flat = idx.ravel()
    out = flat >= capacity
    if flat.dtype.kind in "iO":
        out |= flat < 0
    bad = flat[out.astype(bool, copy=False)]  # (on an object array, comparisons give objects)
    raise IndexRangeError(
        f"{name}: expected rows in [0, {capacity}) (the capacity), got {bad.size} of "
        f"{flat.size} outside: {_shown(bad)}"
    )


def _shown(values: Any) -> str:
    """The first few values as given (numpy or torch, 1-D), as a Python list."""
    return f"{values[:_SHOW].tolist()}{' ...' if len(values) > _SHOW else ''}"
