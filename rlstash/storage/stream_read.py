"""The read path of :class:`~rlstash.storage.stream.StreamStorage`: transitions rebuilt
from the lanes' slots (n-step returns, next observations, frame stacks; the formulas are in
:mod:`rlstash.storage.stream`), gathered from the backing storage into fresh tensors or into
a caller's output buffers.

The functions take the stream as their first argument; its ``read``/``gather`` call them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import torch

from rlstash.spec import Batch
from rlstash.storage.lanes import DONE, TERM, TRUNC
from rlstash.storage.ram import numpy_view

if TYPE_CHECKING:
    from rlstash.storage.stream import StreamStorage


_FLAG_TABLE = np.array([[(b & bit) != 0 for b in range(256)] for bit in (TERM, TRUNC, DONE)])


def rebuild(store: StreamStorage, idx: np.ndarray, out: Batch | None) -> Batch:
    flat = idx.reshape(-1)
    lanes = store.lanes
    n, gamma = store.reads.n_step, float(store.reads.gamma)
    # 1-step reads of frame stacks: next_obs's frames are obs's shifted by one slot, so one
    # gather of k + 1 frames per row serves both (obs and next_obs are views of it)
    window = lanes.one_step_window(flat) if out is None and n == 1 and lanes.k > 1 else None
    req: dict[str, np.ndarray] = {}
    if window is not None:
        m, last = None, lanes.flags[flat]
        for k in store.slot_spec:
            req[k] = window if k in store.obs_keys else flat
    else:
        steps, m, last, nxt = lanes.nstep(flat)
        for k in store.slot_spec:
            if k in store.obs_keys:
                req[k], req["next_" + k] = lanes.frame_rows(flat), lanes.frame_rows(nxt)
            else:
                req[k] = steps if k == "reward" and n > 1 else flat
    got = gather_rows(store, req, out)
    if window is not None:
        for k in store.obs_keys:
            win = got[k]  # [P, k + 1, *frame]
            got[k], got["next_" + k] = win[:, :-1], win[:, 1:]
    if n > 1:
        w = np.where(np.arange(n) < m[:, None], gamma ** np.arange(n), 0.0)  # [P, n]
        r = got["reward"].reshape(w.shape)  # [P, n]
        acc = torch.float64 if r.dtype == torch.float64 else torch.float32
        r = torch.where(to_device(store, w > 0), r.to(acc), 0.0)  # steps past m may be stale
        got["reward"] = (r * to_device(store, w).to(acc)).sum(1)
    dtype = store.spec["reward"].dtype
    if got["reward"].dtype != dtype:
        got["reward"] = got["reward"].to(dtype)
    ends = _FLAG_TABLE[:, last]  # [3, P] bool: terminated, truncated, done
    got["terminated"], got["truncated"], got["done"] = (to_device(store, e) for e in ends)
    discount = np.full(len(flat), gamma, np.float32) if m is None else gamma**m
    got["discount"] = to_device(store, discount.astype(np.float32, copy=False))
    if idx.ndim == 1:
        res = got
    else:
        res = {k: v.reshape(*idx.shape, *v.shape[1:]) for k, v in got.items()}
    if out is None:
        return res
    for k, v in res.items():
        if out[k].data_ptr() != v.data_ptr():
            out[k].copy_(v)
    return out


def gather_rows(store: StreamStorage, req: Mapping[str, np.ndarray], out: Batch | None) -> Batch:
    """Gather the rows ``req[name]`` of each stored field (``next_x`` reads field ``x``);
    obs frames go straight into ``out`` when it fits."""
    tensors = getattr(store.backing, "tensors", None)
    res: Batch = {}
    arenas = store.backing.arenas if store.compression else {}
    if not tensors:  # e.g. a TieredStorage: one read of every row needed
        flat = np.concatenate([r.reshape(-1) for r in req.values()])
        uniq, inv = np.unique(flat, return_inverse=True)
        rows, at = store.backing.read(uniq), 0
        for name, r in req.items():
            src = rows[name.removeprefix("next_")]
            sel = torch.from_numpy(inv[at : at + r.size]).to(src.device)
            res[name] = src.index_select(0, sel).reshape(*r.shape, *src.shape[1:])
            at += r.size
        return res
    order = getattr(store.backing, "order", None)  # a GPU backing: after its writes (I4)
    if order is not None:
        order.before_read()
    checked: set[int] = set()  # the row arrays checked (fields share them)
    for name, r in req.items():
        field = name.removeprefix("next_")
        if field in arenas:  # compressed frames: decoded here
            dst = None if out is None else out.get(name)
            res[name] = store.backing.gather_frames(field, r, dst)
            continue
        t = tensors[field]
        dst = out_for(out, name, r.size, t) if field in store.obs_keys else None
        if t.device.type == "cpu":
            a = numpy_view(t)
            o = None if dst is None else numpy_view(dst).reshape(r.size, *a.shape[1:])
            idx = r.reshape(-1)
            if id(r) not in checked and idx.size and (idx.min() < 0 or idx.max() >= len(a)):
                raise IndexError(f"{name}: slots outside [0, {len(a)}): {idx.min()}..{idx.max()}")
            checked.add(id(r))  # every field has the same rows (the capacity)
            # mode="clip" after that check: numpy buffers ``out`` for mode="raise" (~3x slower)
            v = torch.from_numpy(np.take(a, idx, axis=0, out=o, mode="clip"))
            v = v.view(t.dtype) if v.dtype != t.dtype else v
        else:
            sel = torch.from_numpy(r.reshape(-1)).to(t.device)
            o = None if dst is None else dst.view(r.size, *t.shape[1:])
            v = t.index_select(0, sel) if o is None else torch.index_select(t, 0, sel, out=o)
        res[name] = v.reshape(*r.shape, *t.shape[1:])
    if order is not None:
        order.after_read()
    return res


def to_device(store: StreamStorage, a: np.ndarray) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t if store.device.type == "cpu" else t.to(store.device)


def out_for(out: Batch | None, name: str, rows: int, t: torch.Tensor) -> torch.Tensor | None:
    """``out[name]`` when a gather can fill it in place (contiguous, same dtype and device)."""
    dst = None if out is None else out.get(name)
    if dst is None or dst.dtype != t.dtype or dst.device != t.device or not dst.is_contiguous():
        return None
    return dst if dst.numel() == rows * t[0].numel() else None
