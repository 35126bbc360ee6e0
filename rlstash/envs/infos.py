"""gymnasium-style vector infos, built column by column (torch-free).

gymnasium's ``VectorEnv._add_info`` folds one env's info dict at a time into arrays with a
``_key`` mask; that costs a few microseconds per env per key, which dominates a step of
cheap envs that return infos every step (MuJoCo). :func:`batch_infos` gives the same result
for a whole batch at once:

* a key's array type comes from the first env (in env order) that has it: Python
  int/float/bool and numpy scalars -> ``np.zeros(n, type(value))``; arrays ->
  ``np.zeros((n, *shape), dtype)``; dicts -> nested infos; anything else -> object array;
  ``"final_obs"`` -> object array;
* other envs' values are cast into that array as an element assignment would;
* ``infos["_key"]`` is a bool [n] mask of the envs that had the key.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_SCALARS = (int, float, bool)


def _is_scalar(value: Any) -> bool:
    return type(value) in _SCALARS or isinstance(value, np.number)


def batch_infos(entries: list[tuple[int, dict]], n: int) -> dict[str, Any]:
    """Infos of ``n`` envs from ``(env_index, info)`` pairs sorted by env index."""
    columns: dict[str, list[tuple[int, Any]]] = {}
    for i, info in entries:
        for key, value in info.items():
            columns.setdefault(key, []).append((i, value))
    out: dict[str, Any] = {}
    for key, items in columns.items():
        rows = slice(None) if len(items) == n else [i for i, _ in items]  # rows are unique
        out[key] = _column(key, items, rows, n)
        mask = np.zeros(n, dtype=np.bool_)
        mask[rows] = True
        out[f"_{key}"] = mask
    return out


def _column(key: str, items: list[tuple[int, Any]], rows: slice | list[int], n: int) -> Any:
    first = items[0][1]
    if key == "final_obs":
        array = np.full(n, None, dtype=object)
    elif isinstance(first, dict):
        return batch_infos(items, n)
    elif _is_scalar(first):
        array = np.zeros(n, dtype=type(first))
        try:  # all plain numbers: one conversion and one cast, like per-element assignment
            values = np.array([v for _, v in items])
        except ValueError:
            values = None
        if values is not None and values.ndim == 1 and values.dtype.kind in "biuf":
            array[rows] = values
            return array
    elif isinstance(first, np.ndarray):
        array = np.zeros((n, *first.shape), dtype=first.dtype)
    else:
        array = np.full(n, None, dtype=object)
    for i, value in items:  # element by element, exactly like an assignment per env
        array[i] = value
    return array


def merge_infos(parts: list[tuple[int, dict[str, Any]]], n: int) -> dict[str, Any]:
    """Infos of ``n`` envs from blocks ``(first_row, batch_infos(block entries, block_len))``.

    Workers batch their own block; the pool merges W blocks instead of N env dicts. A key's
    type comes from the first block that has it (so from the first env that has it); only
    the rows whose mask is set are copied. When every block has the key with one dtype and
    the blocks tile ``0..n-1``, the arrays are simply concatenated.
    """
    lengths = [_block_len(part) for _, part in parts]
    if len(parts) == 1 and parts[0][0] == 0 and lengths[0] in (n, 0):
        return parts[0][1]
    rows = [row for row, _ in parts]
    tiled = rows == list(np.cumsum([0, *lengths[:-1]])) and sum(lengths) == n
    keys: list[str] = []
    for _, part in parts:
        keys.extend(k for k in part if _is_value_key(k, part) and k not in keys)
    out: dict[str, Any] = {}
    for key in keys:
        pieces = [(row, part[key], part[f"_{key}"]) for row, part in parts if key in part]
        first = pieces[0][1]
        if isinstance(first, dict):
            out[key] = merge_infos([(row, value) for row, value, _ in pieces], n)
        elif (
            tiled
            and len(pieces) == len(parts)
            and all(v.dtype == first.dtype for _, v, _ in pieces)
        ):
            out[key] = np.concatenate([v for _, v, _ in pieces])
            out[f"_{key}"] = np.concatenate([m for _, _, m in pieces])
            continue
        else:
            array = (
                np.full(n, None, dtype=object)
                if first.dtype == object
                else np.zeros((n, *first.shape[1:]), dtype=first.dtype)
            )
            for row, value, m in pieces:
                rows_set = np.flatnonzero(m)
                array[row + rows_set] = value[rows_set]
            out[key] = array
        mask = np.zeros(n, dtype=np.bool_)
        for row, _, m in pieces:
            mask[row : row + len(m)] = m
        out[f"_{key}"] = mask
    return out


def _is_value_key(key: str, part: dict) -> bool:
    """True for a data key (its mask ``_key`` is present); False for the masks themselves."""
    return f"_{key}" in part and not (key.startswith("_") and key[1:] in part)


def _block_len(part: dict) -> int:
    for key in part:
        if _is_value_key(key, part):
            return len(part[f"_{key}"])
    return 0
