"""Finite by default (invariant I10): one check of a batch's float fields where it enters.

Every entry point of experience calls :func:`check_finite` on the batch it is about to store
(``ReplayBuffer.extend``, ``StreamStorage.extend`` and its direct slots, ``RolloutStorage.add``)
or act on (an agent's ``act`` on the CPU). A batch with NaN or +-inf in any float field is
refused before anything is written, with a :class:`NonFiniteError` (a ValueError) that names
the field, the value and where it is::

    reward has a non-finite value (nan) at env 3 (row 3); nothing was written. Fix: ...
    obs has a non-finite value (inf) at env 1, step 2 of the batch (row 9) [4 of 64 rows]; ...

Rows are time-major when ``envs`` (N) is given: row ``r`` of a ``[T * N, ...]`` field is step
``r // N`` of env ``r % N`` (a field of N rows: env ``r``).

Cost: one reduction per float field and batch (a sum, which can be finite only when every
element is: a NaN or an infinity anywhere makes it NaN or infinite), read back once per device:
on the CPU a few microseconds per field, on a GPU one device-to-host read per batch, whatever
the number of fields. Only when a sum is not finite (a non-finite value, or a sum of huge finite
values that overflowed) are the elements themselves tested, to find the first bad one or to
clear the false alarm. Integer, bool and pixel (uint8) fields are never checked.

The opt-out, for users who want non-finite values stored: ``check_finite=False`` on
:class:`~rlstash.replay.ReplayBuffer`, :class:`~rlstash.storage.stream.StreamStorage` and
:class:`~rlstash.storage.rollout.RolloutStorage`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

OPT_OUT = "pass check_finite=False to store non-finite values"


class NonFiniteError(ValueError):
    """A NaN or an infinity where finite numbers are required (invariant I10)."""


def _as_float_tensor(value: Any) -> torch.Tensor | None:
    """``value`` as a non-empty float tensor (a numpy array without a copy, unless in another
    byte order), or None: ints, bools and anything else are left to other checks."""
    if isinstance(value, torch.Tensor):
        return value if value.is_floating_point() and value.numel() else None
    if isinstance(value, np.ndarray) and value.dtype.kind == "f" and value.size:
        return torch.from_numpy(np.asarray(value, value.dtype.newbyteorder("=")))
    return None


def _total(t: torch.Tensor) -> torch.Tensor:
    """The sum of ``t`` (0-dim), accumulated in float32 at least (half sums overflow early)."""
    t = t.detach()
    if t.dtype in (torch.float16, torch.bfloat16):
        return t.sum(dtype=torch.float32)
    return t.sum()


def _float_fields(batches: tuple[Mapping[str, Any], ...]) -> tuple[list[tuple[str, Any]], bool]:
    """(the float fields of ``batches`` as (name, tensor), whether every one's sum is finite):
    host sums read as they come, one device-to-host read per other device."""
    fields: list[tuple[str, torch.Tensor]] = []
    on_devices: dict[torch.device, list[torch.Tensor]] = {}
    finite = True
    for batch in batches:
        for name, value in batch.items():
            t = _as_float_tensor(value)
            if t is None:
                continue
            fields.append((name, t))
            if t.device.type != "cpu":
                on_devices.setdefault(t.device, []).append(_total(t))
            elif finite and not math.isfinite(_total(t).item()):
                finite = False
    for sums in on_devices.values():  # one device-to-host copy for the fields of a device
        if finite and not all(map(math.isfinite, torch.stack([s.float() for s in sums]).tolist())):
            finite = False
    return fields, finite


def _where(row: int, envs: int | None, rows: int) -> str:
    if not envs:
        return f"row {row}"
    if rows <= envs:
        return f"env {row} (row {row})"
    return f"env {row % envs}, step {row // envs} of the batch (row {row})"


def _first_bad(name: str, t: torch.Tensor, envs: int | None) -> str | None:
    """A description of the first non-finite value of field ``name``, or None (all finite)."""
    flat = t.detach().reshape(t.shape[0] if t.dim() else 1, -1)  # [rows, values per row]
    bad = ~torch.isfinite(flat)
    rows = torch.nonzero(bad.any(1)).flatten()
    if not rows.numel():
        return None
    row = int(rows[0])
    got = float(flat[row][bad[row]][0])
    count = f" [{rows.numel()} of {flat.shape[0]} rows]" if rows.numel() > 1 else ""
    return f"{name} has a non-finite value ({got}) at {_where(row, envs, flat.shape[0])}{count}"


def check_finite(
    *batches: Mapping[str, Any],
    envs: int | None = None,
    refused: str = "nothing was written",
    fix: str = f"find where the non-finite value comes from (the env, a transform), or {OPT_OUT}",
) -> None:
    """Raise :class:`NonFiniteError` when a float field of ``batches`` holds NaN or +-inf.

    Args:
        batches: dicts of field -> tensor or numpy array ``[rows, ...]`` (non-float fields
            are skipped); several dicts are checked as one batch (one read per device).
        envs: N when rows are time-major ``[T * N]`` (the error then names step and env).
        refused: what did not happen, for the message ("nothing was written").
        fix: the fix the message ends with.

    The message names the first field (in order) with a non-finite value, the value, its row
    (and step and env), and how many rows of that field hold one.
    """
    fields, finite = _float_fields(batches)
    if finite:
        return
    for name, t in fields:
        found = _first_bad(name, t, envs)
        if found is not None:
            raise NonFiniteError(f"{found}; {refused}. Fix: {fix}")
    # the sums overflowed but every value is finite: a false alarm, nothing to refuse


def raise_unless_finite(algo: str, updates: int, tensors: list[torch.Tensor]) -> None:
    """Raise :class:`NonFiniteError` naming ``algo`` when one of ``tensors`` (an agent's loss
    metrics and, where asked, its flat parameters) holds NaN or +-inf (one host read)."""
    if not tensors or bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all()):
        return
    raise NonFiniteError(
        f"{algo}: the loss or a weight turned non-finite (NaN or inf) by update "
        f"{updates}; its parameters are not to be trusted or saved. Fix: a lower "
        "learning_rate or max_grad_norm"
    )


def rows_where(fields: Mapping[str, torch.Tensor], keep: torch.Tensor) -> dict[str, torch.Tensor]:
    """``fields`` with the rows where ``keep`` ([rows] bool) is False zeroed, for checking only
    the rows that are read (same-step final observations: where an episode ended)."""
    return {k: torch.where(keep.reshape(-1, *[1] * (v.dim() - 1)), v, 0) for k, v in fields.items()}


__all__ = ["OPT_OUT", "NonFiniteError", "check_finite", "raise_unless_finite", "rows_where"]
