"""The read path of :class:`~rlstash.storage.stream.StreamStorage`: transitions rebuilt
from the lanes' slots (n-step returns, next observations, frame stacks; the formulas are in
:mod:`rlstash.storage.stream`).

The reader knows the lane/slot index (:class:`~rlstash.storage.lanes.Lanes`: which slots hold
the steps, frames and successors of a start) and the backing's rows
(:class:`~rlstash.storage.stream_backing.SlotRows`: where those slots' bytes are), nothing
else: it asks the lanes for the rows, the backing for their fields, and does the arithmetic.
"""

from __future__ import annotations

import numpy as np
import torch

from rlstash.device import upload
from rlstash.spec import Batch, Spec
from rlstash.storage.lanes import DONE, TERM, TRUNC, Lanes
from rlstash.storage.stream_backing import SlotRows
from rlstash.storage.stream_spec import ReadSpec

_FLAG_TABLE = np.array([[(b & bit) != 0 for b in range(256)] for bit in (TERM, TRUNC, DONE)])


class StreamReader:
    """Rebuilds transitions from ``lanes`` (the index) and ``rows`` (the backing's slots).

    Args:
        lanes: the lanes of the stream (read only here).
        rows: the slots' backing.
        slot_spec: the stored fields of a slot.
        obs_keys: the observation fields (stacked, with a ``next_`` twin, on read).
        reads: n-step, gamma and frame stacking.
        reward_dtype: the dtype of the step spec's ``reward`` (returns are summed wider).
    """

    def __init__(
        self,
        lanes: Lanes,
        rows: SlotRows,
        slot_spec: Spec,
        obs_keys: list[str],
        reads: ReadSpec,
        reward_dtype: torch.dtype,
    ) -> None:
        self.lanes, self.rows, self.slot_spec = lanes, rows, slot_spec
        self.obs_keys, self.reads, self.reward_dtype = obs_keys, reads, reward_dtype
        self._direct = frozenset(obs_keys)  # gathered straight into ``out`` when it fits
        self._cpu = rows.device.type == "cpu"

    def rebuild(self, idx: np.ndarray, out: Batch | None) -> Batch:
        """The transitions starting at the valid starts ``idx`` (any shape ``[*S]``), fresh or
        written into ``out``."""
        flat = idx.reshape(-1)
        lanes = self.lanes
        n, gamma = self.reads.n_step, float(self.reads.gamma)
        # 1-step reads of frame stacks: next_obs's frames are obs's shifted by one slot, so one
        # gather of k + 1 frames per row serves both (obs and next_obs are views of it)
        window = lanes.one_step_window(flat) if out is None and n == 1 and lanes.k > 1 else None
        req: dict[str, np.ndarray] = {}
        if window is not None:
            m, last = None, lanes.flags[flat]
            for k in self.slot_spec:
                req[k] = window if k in self.obs_keys else flat
        else:
            steps, m, last, nxt = lanes.nstep(flat)
            for k in self.slot_spec:
                if k in self.obs_keys:
                    req[k], req["next_" + k] = lanes.frame_rows(flat), lanes.frame_rows(nxt)
                else:
                    req[k] = steps if k == "reward" and n > 1 else flat
        got = self.rows.gather_rows(req, out, self._direct)
        if window is not None:
            for k in self.obs_keys:
                win = got[k]  # [P, k + 1, *frame]
                got[k], got["next_" + k] = win[:, :-1], win[:, 1:]
        if n > 1:
            w = np.where(np.arange(n) < m[:, None], gamma ** np.arange(n), 0.0)  # [P, n]
            r = got["reward"].reshape(*w.shape, -1)  # [P, n, A] (A = 1: a scalar reward)
            acc = torch.float64 if r.dtype == torch.float64 else torch.float32
            wt = self.to_device(w)[..., None]  # [P, n, 1]
            r = torch.where(wt > 0, r.to(acc), 0.0)  # steps past m may be stale
            r = (r * wt.to(acc)).sum(1)  # [P, A]
            got["reward"] = r.reshape(len(flat), *self.slot_spec["reward"].shape)
        dtype = self.reward_dtype
        if got["reward"].dtype != dtype:
            got["reward"] = got["reward"].to(dtype)
        ends = _FLAG_TABLE[:, last]  # [3, P] bool: terminated, truncated, done
        discount = np.full(len(flat), gamma, np.float32) if m is None else gamma**m
        host = [*ends, discount.astype(np.float32, copy=False)]  # one copy off the CPU
        got["terminated"], got["truncated"], got["done"], got["discount"] = upload(
            host, self.rows.device
        )
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

    def to_device(self, a: np.ndarray) -> torch.Tensor:
        """A host array as a tensor on the backing's device."""
        return upload([a], self.rows.device)[0]


__all__ = ["StreamReader"]
