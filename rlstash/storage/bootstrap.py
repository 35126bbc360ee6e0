"""BootstrapMask: per-transition membership of k ensemble heads, stored as bits (invariant I5).

Bootstrapped DQN (Osband et al. 2016) trains head ``h`` only on the transitions whose mask
bit ``h`` is set, each drawn once, when the transition is stored, as ``Bernoulli(p)``. The
bits live in the buffer as one more field of ``ceil(k / 8)`` uint8 bytes per row (bit ``h``
of the mask is bit ``h % 8`` of byte ``h // 8``), so they are stored, saved, reloaded and
moved with the data by whatever storage holds it (RAM, GPU, disk, tiered, stream extras),
never as k copies of the data::

    masks = BootstrapMask(k=10, p=0.5, seed=0)
    spec = Spec({**fields, "mask": masks.field})                     # 2 bytes per row
    rb = ReplayBuffer(TensorStorage(spec, 100_000), transforms=[masks.transform("mask")])
    rb.extend({**batch, "mask": masks.draw(len(batch["obs"]))})      # [n, 2] uint8
    out = rb.sample(256)                                             # out["mask"]: [256, 10] bool
    loss = ((td ** 2) * out["mask"]).sum(0) / out["mask"].sum(0).clamp(min=1)   # [k] per head
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from rlstash.spec import Batch, Field


class BootstrapMask:
    """Draws, packs and unpacks k-bit head masks.

    Args:
        k: number of heads (>= 1).
        p: probability that a transition is given to each head, in (0, 1].
        seed: seed of the mask's own ``numpy.random.Generator`` (or pass ``rng``).
        rng: a generator to draw from instead of ``seed``.
    """

    def __init__(
        self,
        k: int,
        p: float = 0.5,
        seed: int | None = None,
        rng: np.random.Generator | None = None,
    ) -> None:
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"k: expected an int >= 1 (number of heads), got {k!r}")
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < float(p) <= 1.0:
            raise ValueError(f"p: expected a probability in (0, 1], got {p!r}")
        if rng is not None and not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng: expected a numpy.random.Generator, got {type(rng).__name__}")
        self.k, self.p = k, float(p)
        self.nbytes_per_row = (k + 7) // 8
        self.rng = rng if rng is not None else np.random.default_rng(seed)

    @property
    def field(self) -> Field:
        """The stored field: ``ceil(k / 8)`` uint8 per row."""
        return Field((self.nbytes_per_row,), torch.uint8)

    def draw(self, n: int) -> torch.Tensor:
        """Packed masks of ``n`` new transitions, each bit ``Bernoulli(p)``: ``[n, ceil(k/8)]``."""
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 0:
            raise ValueError(f"n: expected an int >= 0, got {n!r}")
        bits = self.rng.random((int(n), self.k)) < self.p  # [n, k] bool
        return self.pack(bits)

    def pack(self, mask: np.ndarray | torch.Tensor) -> torch.Tensor:
        """``[n, k]`` bool -> ``[n, ceil(k/8)]`` uint8 (bit ``h % 8`` of byte ``h // 8``)."""
        arr = (
            mask.detach().to("cpu").numpy() if isinstance(mask, torch.Tensor) else np.asarray(mask)
        )
        if arr.ndim != 2 or arr.shape[1] != self.k or arr.dtype != np.bool_:
            raise ValueError(
                f"mask: expected a bool array [n, k={self.k}], got {arr.dtype} {list(arr.shape)}"
            )
        return torch.from_numpy(np.packbits(arr, axis=1, bitorder="little"))

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:
        """``[..., ceil(k/8)]`` uint8 -> ``[..., k]`` bool, on ``packed``'s device."""
        if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8:
            got = packed.dtype if isinstance(packed, torch.Tensor) else type(packed).__name__
            raise TypeError(f"packed: expected a uint8 tensor, got {got}")
        if packed.dim() < 1 or packed.shape[-1] != self.nbytes_per_row:
            raise ValueError(
                f"packed: expected [..., {self.nbytes_per_row}] bytes per row, got {list(packed.shape)}"
            )
        shifts = torch.arange(8, dtype=torch.uint8, device=packed.device)  # [8]
        bits = (packed.unsqueeze(-1) >> shifts) & 1  # [..., bytes, 8]
        return bits.flatten(-2)[..., : self.k].bool()  # [..., k]

    def transform(self, key: str = "mask") -> Callable[[Batch], Batch]:
        """A ReplayBuffer transform replacing ``batch[key]`` (packed) by its ``[B, k]`` bools."""

        def unpack_mask(batch: Batch) -> Batch:
            if key not in batch:
                raise KeyError(f"BootstrapMask transform: the batch has no field {key!r}")
            return {**batch, key: self.unpack(batch[key])}

        return unpack_mask

    def __repr__(self) -> str:
        return f"BootstrapMask(k={self.k}, p={self.p}, {self.nbytes_per_row} bytes per row)"


__all__ = ["BootstrapMask"]
