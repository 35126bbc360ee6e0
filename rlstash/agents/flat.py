"""One flat parameter vector (and one flat gradient) behind a module's parameters.

Small networks are overhead-bound: a gradient step of PPO on CartPole's (64, 64) nets spends
more time dispatching per-tensor operations than computing. With every parameter a view into
one contiguous vector ``flat`` and every gradient a view into one vector ``grad``, the global
gradient norm is one reduction, clipping one multiply, and Adam one fused kernel on one tensor
(the per-parameter bookkeeping of ``torch.optim`` disappears)::

    flat = FlatParams(module)                  # module's parameters now view flat.param
    opt = torch.optim.Adam([flat.param], ...)  # one tensor
    flat.zero_grad()                           # grad.zero_(), views re-attached as .grad
    loss.backward()                            # autograd accumulates in place into the views
    norm = flat.clip_grad_norm_(max_norm)      # one norm, one multiply; a 0-dim tensor
    opt.step()                                 # updates flat.param, i.e. every parameter

The module keeps working as usual (forward, ``state_dict``, ``load_state_dict`` copy in place).
Moving the module to another device breaks the sharing: build a new ``FlatParams`` after.
(PyTorch's FSDP ``FlatParameter`` and apex's flat master weights rest on the same idea.)
"""

from __future__ import annotations

import torch
from torch import nn


class FlatParams:
    """The trainable parameters of ``module`` re-seated as views of one vector (module doc)."""

    def __init__(self, module: nn.Module):
        slots = [
            (mod, name, p)
            for mod in module.modules()
            for name, p in mod._parameters.items()
            if p is not None and p.requires_grad
        ]
        if not slots:
            raise ValueError("module: has no trainable parameters to flatten")
        first = slots[0][2]
        if any(p.dtype != first.dtype or p.device != first.device for _, _, p in slots):
            raise ValueError(
                "module: parameters of different dtypes or devices cannot share a vector"
            )
        total = sum(p.numel() for _, _, p in slots)
        data = torch.empty(total, dtype=first.dtype, device=first.device)
        self.grad = torch.zeros_like(data)
        self.params: list[nn.Parameter] = []
        self.grads: list[torch.Tensor] = []
        offset = 0
        for mod, name, p in slots:
            n = p.numel()
            view = data[offset : offset + n].view_as(p)
            view.copy_(p.detach())
            new = nn.Parameter(view)
            mod._parameters[name] = new
            self.params.append(new)
            self.grads.append(self.grad[offset : offset + n].view_as(p))
            offset += n
        self.param = nn.Parameter(data)
        self.param.grad = self.grad

    def zero_grad(self) -> None:
        """Zero the flat gradient and (re)attach its views as the parameters' ``.grad`` (so a
        ``module.zero_grad()`` elsewhere cannot detach them)."""
        self.grad.zero_()
        for p, g in zip(self.params, self.grads):
            p.grad = g
        self.param.grad = self.grad

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Scale the gradient so its L2 norm is at most ``max_norm`` (as
        ``torch.nn.utils.clip_grad_norm_``); returns the norm before clipping (0-dim tensor)."""
        norm = torch.linalg.vector_norm(self.grad)
        self.grad.mul_((max_norm / (norm + 1e-6)).clamp(max=1.0))
        return norm
