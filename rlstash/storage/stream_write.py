"""The write path of :class:`~rlstash.storage.stream.StreamStorage`: a batch of one step
(``[N, ...]``) or a time-major chunk (``[T, N, ...]``) validated in full, planned by the
lanes and written into the backing storage's slots.

A chunk is one write, not T: its ``terminated``/``truncated`` reach the host once (views on
the CPU; one blocking device-to-host copy for both on a GPU, the write path's only host
read), :meth:`~rlstash.storage.lanes.Lanes.plan` places the T steps with row operations over
the N lanes, and the slots are written in one call (one contiguous copy per field while the
lanes move in lockstep, as next-step chunks keep them: rows are slot-major). A disk stream
commits its lanes (:mod:`rlstash.storage.stream_commit`) once an operation is complete
(:func:`committed`), and first, before a chunk overwrites alive slots, vouches for the slots
it will write (:func:`reserve`).

The functions take the stream as their first argument; the stream's methods call them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from rlstash.finite import check_finite, rows_where
from rlstash.spec import Batch, Spec
from rlstash.storage.stream_commit import persist

if TYPE_CHECKING:
    from rlstash.storage.stream import StreamStorage

RESTARTED = "restarted"  # optional extend field: the env's worker restarted during this step


def as_bool(value: Any) -> torch.Tensor:
    return value if isinstance(value, torch.Tensor) else torch.from_numpy(np.asarray(value))


def extend(store: StreamStorage, batch: Mapping[str, Any]) -> np.ndarray:
    """Store one step of N envs (``[N, ...]``) or a time-major chunk (``[T, N, ...]``).

    Validated in full first (a bad batch writes nothing). Returns the slot indices written,
    in order (same-step autoreset also writes a final-obs slot per ended episode).
    """
    store._check_open()
    data, final, T = validate(store, batch)
    if store._cut.any():  # after a resume or a load: new envs, new episodes
        store.end_episodes(store._cut.copy())
    restarted = data.pop(RESTARTED, None)
    if restarted is not None and bool(restarted.any()):
        index = write_restarted(store, data, final, T, host(restarted).reshape(T, -1))
    else:
        index = write_steps(store, data, final, T)
    committed(store)
    return index


def reserve(store: StreamStorage, lanes: np.ndarray | None, grow: Any) -> None:
    """Disk, before ``grow`` slots of each of ``lanes`` (None: all) are written: when they
    overwrite alive slots not vouched for yet, commit ``reserved = count + grow`` first
    (reopening drops them, never reads them torn). A backing that reaches the disk only when
    flushed is flushed and committed instead, vouching for ``margin`` more slots."""
    log, books = store._log, store.lanes
    if log is None:
        return
    sel = slice(None) if lanes is None else lanes
    need = books.count[sel] + grow
    if store._durable:
        # overwritten slots count - L .. need - L - 1 are alive when need - L > floor
        if (need > np.maximum(books.reserved[sel], books.floor[sel] + books.L)).any():
            books.reserved[sel] = np.maximum(books.reserved[sel], need)
            log.commit(books)
    elif (need > books.reserved[sel]).any():
        margin = max(store._margin, int(np.max(grow)))
        persist(store.backing, books, log, False, margin)


def committed(store: StreamStorage) -> None:
    """Disk, after an operation completed (its slots and flags written): commit the lanes."""
    if store._durable:
        books = store.lanes
        np.maximum(books.reserved, books.count, out=books.reserved)
        store._log.commit(books)


def validate(store: StreamStorage, batch: Mapping[str, Any]) -> tuple[Batch, Batch | None, int]:
    """The batch checked and flattened to ``[T * N, ...]`` (time-major): step fields,
    final obs per obs field (same-step) or None, and ``T``."""
    if not isinstance(batch, Mapping):
        raise TypeError(f"batch: expected a dict of field -> tensor, got {type(batch).__name__}")
    finals = {"final_" + k: k for k in store.obs_keys}
    finals_and_restarts = {**finals, RESTARTED: RESTARTED}
    given = [k for k in batch if k in finals]
    if store.autoreset == AutoresetMode.NEXT_STEP and given:
        raise ValueError(
            f"batch: {given} given with autoreset='NextStep', where the final obs arrives as "
            "the next step's obs; drop it or use autoreset='SameStep'"
        )
    if store.autoreset == AutoresetMode.SAME_STEP and len(given) != len(finals):
        raise ValueError(f"batch: autoreset='SameStep' needs {sorted(finals)}, got {list(batch)}")
    key = store.obs_keys[0]
    head = leading(batch.get(key), len(store.spec[key].shape), key)
    if head[-1] != store.num_envs:
        raise ValueError(
            f"field {key!r}: expected leading dims [N={store.num_envs}] or "
            f"[T, N={store.num_envs}], got {list(head)}"
        )
    data = store.spec.validate(
        {k: flat(k, v, head) for k, v in batch.items() if k not in finals_and_restarts}
    )
    if RESTARTED in batch:
        r = flat(RESTARTED, as_bool(batch[RESTARTED]), head)
        if r.dtype != torch.bool or tuple(r.shape) != (len(data[key]),):
            raise ValueError(
                f"field {RESTARTED!r}: expected bool with leading dims {list(head)}, "
                f"got {r.dtype} {list(r.shape)}"
            )
        data[RESTARTED] = r
    final = None
    if given:
        fspec = Spec({f: store.spec[k] for f, k in finals.items()})
        got = fspec.validate({f: flat(f, batch[f], head) for f in finals})
        final = {k: got[f] for f, k in finals.items()}
    if store.check_finite:  # I10: every float field; final obs where an episode ended
        ended = {"final_" + k: v for k, v in (final or {}).items()}
        done = data["terminated"] | data["truncated"] if ended else None
        check_finite(data, rows_where(ended, done) if ended else {}, envs=head[-1])
    return data, final, len(data[key]) // store.num_envs


def newest_frames(
    store: StreamStorage, step: Mapping[str, torch.Tensor], rows: np.ndarray | None = None
) -> Batch:
    """The stored frame of each obs field: the newest one of a stacked obs."""
    out = {}
    for k in store.obs_keys:
        v = step[k] if rows is None else step[k][torch.from_numpy(rows)]
        out[k] = v[:, -1] if store.stacked_input else v
    return out


def write_steps(store: StreamStorage, data: Batch, final: Batch | None, T: int) -> np.ndarray:
    """Store ``T`` steps (fields ``[T * N, ...]``, time-major) in chunks that grow no lane
    by more than its ``L`` slots (so no slot is written twice in one chunk)."""
    N, per = store.num_envs, store.lane_capacity // (1 if final is None else 2)
    if T <= per:
        return write_chunk(store, data, final, T)
    written = []
    for a in range(0, T, per):
        b = min(T, a + per)
        part = {k: v[a * N : b * N] for k, v in data.items()}
        fin = None if final is None else {k: v[a * N : b * N] for k, v in final.items()}
        written.append(write_chunk(store, part, fin, b - a))
    return np.concatenate(written)


def write_chunk(store: StreamStorage, data: Batch, final: Batch | None, T: int) -> np.ndarray:
    """One chunk: its flags reach the host once (one copy off the CPU), the lanes plan
    all ``T`` steps at once, the step slots are one write and the final-obs slots
    (same-step) another; returns the slots in the order the steps wrote them."""
    if T == 0:
        return np.zeros(0, np.int64)
    N, lanes = store.num_envs, store.lanes
    term, trunc = host_flags(data["terminated"], data["truncated"], T, N)
    plan = lanes.plan(term, trunc, final is not None)
    frames = newest_frames(store, data)
    reserve(store, None, plan["grow"])
    step = {n: frames.get(n, data.get(n)) for n in store.slot_spec}
    at = plan["ended"]
    fins = None
    if at.size:  # same_step: the final obs of each ended episode follows its step
        fin = newest_frames(store, final, at)
        zeros = {
            n: data[n].new_zeros((at.size, *data[n].shape[1:]))
            for n in store.slot_spec
            if n not in fin
        }
        fins = {n: fin.get(n, zeros.get(n)) for n in store.slot_spec}
    rows = plan["rows"].reshape(-1)
    if fins is not None and store.compression is not None:  # frames go in lane order
        rows = np.concatenate([rows, plan["fin_rows"]])
        step = {n: torch.cat([step[n], fins[n]]) for n in store.slot_spec}
        fins = None
    if plan["cols"] is not None and store.compression is None:  # lanes in lockstep
        write_block(store, int(plan["cols"][0]), T, step)
    else:
        store.backing.write(rows, step, validate=False)
    if fins is not None:
        store.backing.write(plan["fin_rows"], fins, validate=False)
    lanes.commit(plan)
    return lanes.written_order(plan)


def write_block(store: StreamStorage, col: int, T: int, step: Batch) -> None:
    """Write ``T`` lockstep steps (fields ``[T * N, ...]``, time-major) from lane position
    ``col`` on: slot-major rows make them the rows ``[col * N, (col + T) * N)`` of the ring,
    one contiguous block per field (two where the steps wrap past the lanes' end)."""
    N, L = store.num_envs, store.lane_capacity
    a = min(T, L - col)  # steps before the ring wraps
    if a == T:
        store.backing.write(slice(col * N, (col + T) * N), step, validate=False)
        return
    store.backing.write(
        slice(col * N, L * N), {k: v[: a * N] for k, v in step.items()}, validate=False
    )
    store.backing.write(
        slice(0, (T - a) * N), {k: v[a * N :] for k, v in step.items()}, validate=False
    )


def write_restarted(
    store: StreamStorage, data: Batch, final: Batch | None, T: int, restarted: np.ndarray
) -> np.ndarray:
    """Steps from a pool whose workers restarted (``restarted`` [T, N] on the host): one
    step at a time, each followed by undoing the restarted envs' step."""
    N, written = store.num_envs, []
    for t in range(T):
        step = {k: v[t * N : (t + 1) * N] for k, v in data.items()}
        fin = None if final is None else {k: v[t * N : (t + 1) * N] for k, v in final.items()}
        written.append(write_chunk(store, step, fin, 1))
        sel = np.flatnonzero(restarted[t])
        if sel.size:
            done = host(step["terminated"] | step["truncated"])[sel]
            # same-step mode wrote a final-obs slot after the ended step: look one further back
            back = 2 if final is not None else 1
            store.lanes.drop_restarted(sel[done], back)
            store.lanes.drop_restarted(sel[~done], 1)
    return np.concatenate(written)


def leading(value: Any, ndim: int, name: str) -> tuple[int, ...]:
    """The leading dims (``(N,)`` or ``(T, N)``) of the first obs field."""
    if value is None:
        raise ValueError(f"batch: field {name!r} is missing")
    shape = tuple(value.shape) if hasattr(value, "shape") else np.shape(value)
    if len(shape) not in (ndim + 1, ndim + 2):
        raise ValueError(
            f"field {name!r}: expected [N, ...] or [T, N, ...] with {ndim} dims per row, "
            f"got shape {list(shape)}"
        )
    return shape[: len(shape) - ndim]


def flat(name: str, value: Any, head: tuple[int, ...]) -> Any:
    """``[T, N, ...]`` -> ``[T * N, ...]`` (checked against the obs field's leading dims)."""
    if len(head) == 1:
        return value
    if not isinstance(value, (torch.Tensor, np.ndarray)):
        value = np.asarray(value)
    if tuple(value.shape[:2]) != head:
        raise ValueError(
            f"field {name!r}: expected leading dims {list(head)}, got {list(value.shape)}"
        )
    return value.reshape(head[0] * head[1], *value.shape[2:])


def host(t: torch.Tensor) -> np.ndarray:
    return (t if t.device.type == "cpu" else t.to("cpu")).numpy()


def host_flags(
    term: torch.Tensor, trunc: torch.Tensor, T: int, N: int
) -> tuple[np.ndarray, np.ndarray]:
    """``terminated``/``truncated`` ``[T * N]`` as host bool arrays ``[T, N]``: views on the
    CPU; elsewhere one blocking device-to-host copy of both (complete when it returns)."""
    if term.device.type == "cpu":
        return term.numpy().reshape(T, N), trunc.numpy().reshape(T, N)
    both = torch.stack((term, trunc)).to("cpu").numpy()
    return both[0].reshape(T, N), both[1].reshape(T, N)
