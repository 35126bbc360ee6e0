"""Step infos of plain numbers through shared memory instead of pickles (torch-free).

Many envs return the same small info dict of numbers at every step (MuJoCo's HalfCheetah:
``x_position``, ``x_velocity``, ``reward_forward``, ``reward_ctrl``). Pickling those per
worker and merging them in the pool costs more than copying the obs. When every env of a
worker's block returns an info with the same keys, in the same order, with values of the
same exact number types, the worker writes the values into its rows of the ``info`` array
(``[N, MAX_COLUMNS]`` float64, see :class:`~rlstash.envs.shm.Layout`) and replies with one
byte (:data:`SAME`), or, when the keys or types changed, with :data:`NEW` + the schema.
Anything else (missing keys in some env, strings, arrays, nested dicts, more than
``MAX_COLUMNS`` keys, keys starting with ``_``, ``final_obs``, integers beyond 2**53) falls back to the pickled batch of
:func:`rlstash.envs.infos.batch_infos`.

The result is exactly what :func:`~rlstash.envs.infos.batch_infos` gives for that block: a
key's array has the dtype of its values' type (``np.dtype(type(value))``), values are exact
(float64 holds every float32/float16/bool and integer up to 2**53), the ``_key`` masks are
all True, keys in the envs' order.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from rlstash.envs.shm import INFO_COLUMNS as MAX_COLUMNS  # info keys carried per step

SAME, NEW = b"=", b"#"  # reply payloads: values in shared memory, schema known / follows
_EXACT_INT = 1 << 53  # integers float64 holds exactly
_FLOATS = (float, bool, np.float64, np.float32, np.float16, np.bool_)
_SMALL_INTS = (np.int8, np.int16, np.int32, np.uint8, np.uint16, np.uint32)
_BIG_INTS = (int, np.int64, np.uint64)
_ALLOWED = frozenset(_FLOATS + _SMALL_INTS + _BIG_INTS)

Schema = tuple[tuple[str, ...], tuple[str, ...]]  # (keys, dtype strings)


class InfoColumnWriter:
    """Worker side: encodes one block's step infos into its rows of the ``info`` array."""

    def __init__(self, rows: np.ndarray) -> None:
        self.rows = rows  # [K, MAX_COLUMNS] float64 view of this worker's rows
        self.schema: tuple[tuple[str, ...], tuple[type, ...]] | None = None

    def encode(self, infos: list[tuple[int, dict]]) -> bytes | None:
        """The reply payload for ``infos`` (``(j, info)`` per env of the block), or None
        when they do not fit the columns (the caller pickles them then)."""
        if len(infos) != len(self.rows):
            return None
        first = infos[0][1]
        keys = tuple(first)
        if len(keys) > MAX_COLUMNS or not all(type(k) is str and k[:1] != "_" for k in keys):
            return None  # "_x" keys would meet the masks; batch_infos decides those
        if "final_obs" in first:
            return None
        types = tuple(type(v) for v in first.values())
        if not _ALLOWED.issuperset(types):
            return None
        flat: list[Any] = []  # row after row: one list and one conversion for the block
        extend = flat.extend
        for _, info in infos:
            if tuple(info) != keys:
                return None
            extend(info.values())
        if tuple(map(type, flat)) != types * len(infos):
            return None
        k = len(keys)
        big = [c for c, t in enumerate(types) if t in _BIG_INTS]
        if big and any(abs(v) > _EXACT_INT for c in big for v in flat[c::k]):
            return None
        self.rows[:, :k] = np.array(flat, dtype=np.float64).reshape(len(infos), k)
        if self.schema == (keys, types):
            return SAME
        self.schema = (keys, types)
        return NEW + pickle.dumps((keys, tuple(np.dtype(t).str for t in types)))


def read_schema(payload: bytes, known: Schema | None) -> Schema | None:
    """The schema of a step reply: ``known`` for :data:`SAME`, the new one for :data:`NEW`,
    None for any other payload (pickled infos or none)."""
    if payload == SAME:
        return known
    if payload[:1] == NEW:
        return pickle.loads(payload[1:])
    return None


def block_infos(info: np.ndarray, rows: slice, schema: Schema) -> dict[str, Any]:
    """``batch_infos`` of the block ``rows`` from the ``info`` array [N, MAX_COLUMNS]."""
    keys, dtypes = schema
    n, k = rows.stop - rows.start, len(keys)
    masks = np.ones((k, n), dtype=np.bool_)  # one fresh array, a row per key
    if dtypes.count(dtypes[0]) == k:  # one dtype (MuJoCo's floats): one copy for all keys
        columns = info[rows, :k].T.astype(dtypes[0], order="C")
    else:
        columns = [info[rows, c].astype(dtype) for c, dtype in enumerate(dtypes)]
    out: dict[str, Any] = {}
    for c, key in enumerate(keys):
        out[key] = columns[c]
        out[f"_{key}"] = masks[c]
    return out
