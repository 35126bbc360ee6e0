"""The array namespace the physics runs in: numpy on the CPU, torch on any other device.

On the CPU a torch tensor and a numpy array can share one buffer (``Tensor.numpy()``,
``torch.from_numpy``: no copy), and numpy's per-operation cost is a fraction of torch's, so
the reference envs compute with numpy there and hand out torch tensors over the same memory.
On an accelerator every operation is a torch kernel on the device. The physics is written
once against this small interface (``xp`` is ``numpy`` or ``torch``; both spell ``cos``,
``sin``, ``where``, ``stack``, ``clip``, ``remainder`` alike).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlstash.device import torch_dtype


class NumpyOps:
    """CPU: numpy arrays inside, torch tensors over the same memory outside."""

    xp = np

    def __init__(self) -> None:
        self.device = torch.device("cpu")

    def dtype(self, name: str) -> Any:
        return np.dtype(name)

    def cast(self, x: Any, name: str) -> Any:
        return x.astype(name, copy=False)

    def is_float(self, x: Any) -> bool:
        return x.dtype.kind == "f"

    def is_int(self, x: Any) -> bool:
        return x.dtype.kind in "iu"

    def zeros(self, n: int, name: str) -> Any:
        return np.zeros(n, name)

    def ones(self, n: int, name: str) -> Any:
        return np.ones(n, name)

    def arange(self, n: int) -> Any:
        return np.arange(n, dtype=np.int64)

    def contiguous(self, x: Any, name: str) -> Any:
        return np.ascontiguousarray(x, dtype=name)

    def native(self, t: torch.Tensor) -> Any:
        return t.detach().numpy()

    def tensor(self, a: Any) -> torch.Tensor:
        return torch.from_numpy(a)

    def rows(self, mask: Any) -> Any:
        return np.flatnonzero(mask)


class TorchOps:
    """Any other device: torch tensors throughout."""

    xp = torch

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def dtype(self, name: str) -> Any:
        return torch_dtype(name)

    def cast(self, x: Any, name: str) -> Any:
        return x.to(torch_dtype(name))

    def is_float(self, x: Any) -> bool:
        return x.dtype.is_floating_point

    def is_int(self, x: Any) -> bool:
        return not x.dtype.is_floating_point and not x.dtype.is_complex and x.dtype != torch.bool

    def zeros(self, n: int, name: str) -> Any:
        return torch.zeros(n, dtype=torch_dtype(name), device=self.device)

    def ones(self, n: int, name: str) -> Any:
        return torch.ones(n, dtype=torch_dtype(name), device=self.device)

    def arange(self, n: int) -> Any:
        return torch.arange(n, dtype=torch.int64, device=self.device)

    def contiguous(self, x: Any, name: str) -> Any:
        out = torch.empty(x.shape, dtype=torch_dtype(name), device=self.device)
        return out.copy_(x)

    def native(self, t: torch.Tensor) -> Any:
        return t

    def tensor(self, a: Any) -> torch.Tensor:
        return a

    def rows(self, mask: Any) -> Any:  # never used on accelerators (it would synchronise)
        raise AssertionError("data-dependent row selection on an accelerator")


def ops_for(device: torch.device) -> NumpyOps | TorchOps:
    return NumpyOps() if device.type == "cpu" else TorchOps(device)
