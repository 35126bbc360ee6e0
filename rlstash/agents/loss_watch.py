"""The watch of an agent's losses (invariant I10): recorded on the device by every update,
read once when the caller logs.

Each update calls ``_watch(*losses)`` (inside its compiled step where it is compiled, so a
CUDA graph's replays update it too): a few in-place ops on two device tensors, no host read::

    ok      &= isfinite(losses).all()     # every loss finite so far (bool)
    streak  += ok                         # updates up to the first non-finite one (int64)

so the first non-finite update is ``streak + 1`` whatever happened after it.
:meth:`LossWatch.check_finite` reads both in one device-to-host copy (with ``params=True``
also every weight and optimizer state: before a checkpoint) and raises
:class:`~rlstash.finite.NonFiniteError` naming the update.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from rlstash.finite import NonFiniteError


class LossWatch:
    """The loss watch of :class:`~rlstash.agents.base.AgentBase` (module docstring); it reads
    the agent's ``device``, ``updates``, ``algo``, ``nets`` and ``groups``."""

    device: torch.device
    updates: int
    algo: str
    nets: dict[str, Any]
    groups: dict[str, Any]

    def _new_loss_watch(self) -> None:
        """Device tensors of the loss watch, from ``updates`` on: every loss finite so far
        (bool) and the number of updates up to the first non-finite one (int64). Replaced only
        where the compiled steps are rebuilt too (they capture the tensors)."""
        self._loss_ok = torch.ones((), dtype=torch.bool, device=self.device)
        self._finite_updates = torch.full((), self.updates, dtype=torch.int64, device=self.device)

    def _watch(self, *losses: torch.Tensor, counted: bool = False) -> None:
        """Record whether this update's ``losses`` (0-dim) are all finite: a few in-place device
        ops, no host read (compiled into the step on the compiled path). ``counted``: more
        losses of an update already watched (TD3's delayed actor step)."""
        parts = [loss.detach() for loss in losses]
        now = torch.isfinite(parts[0] if len(parts) == 1 else torch.stack(parts)).all()
        if counted:  # this update was counted as finite: uncount it if it was not
            self._finite_updates.sub_((self._loss_ok & ~now).long())
            self._loss_ok.logical_and_(now)
            return
        self._loss_ok.logical_and_(now)
        self._finite_updates.add_(self._loss_ok)

    def _watch_updates(self, each: torch.Tensor) -> None:
        """:meth:`_watch` of ``k`` updates at once: ``each`` [k] bool, whether each update's
        losses were finite, in order."""
        leading = each.cumprod(0).sum()  # updates before the first non-finite one
        self._finite_updates.add_(leading * self._loss_ok)
        self._loss_ok.logical_and_(each.all())

    def check_finite(self, metrics: Mapping[str, Any] | None = None, params: bool = False) -> None:
        """Raise :class:`~rlstash.finite.NonFiniteError` when a loss of an update so far was NaN
        or +-inf, naming the first such update (one device-to-host read). ``metrics``: the latest
        update's, named in the message. ``params``: also every tensor of :meth:`state_dict`
        (weights, targets, optimizer moments, normalisation statistics): before a checkpoint."""
        flags = [self._loss_ok.to(torch.int64), self._finite_updates]
        tensors = self._state_tensors() if params else []
        if tensors:
            flags.append(torch.stack([torch.isfinite(t).all() for t in tensors]).all().long())
        ok, streak, *weights = torch.stack(flags).tolist()
        if ok and all(weights):
            return
        bad = {k: v for k, v in _host_scalars(metrics or {}).items() if not math.isfinite(v)}
        latest = ", ".join(f"{k}={v}" for k, v in bad.items())
        if ok:
            what = "a weight or optimizer state turned non-finite (NaN or inf)"
        else:
            what = f"the loss turned non-finite (NaN or inf) at update {int(streak) + 1}"
        raise NonFiniteError(
            f"{self.algo}: {what} (updates so far: {self.updates}"
            f"{f'; latest: {latest}' if latest else ''}); its parameters are not to be trusted "
            "or saved. Fix: a lower learning_rate, max_grad_norm to clip gradients, or look "
            "for non-finite data (stored with check_finite=False)"
        )

    def _state_tensors(self) -> list[torch.Tensor]:
        """Every float tensor a checkpoint of this agent holds (networks, optimizer state)."""
        out = [t for net in self.nets.values() for t in net.state_dict().values()]
        for group in self.groups.values():
            out += group.state_tensors()
        return [t for t in out if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _host_scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The scalar metrics as host floats (the error path only: a read per tensor)."""
    out = {}
    for key, value in metrics.items():
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            out[key] = float(value.detach().reshape(()))
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = float(value)
    return out


__all__ = ["LossWatch"]
