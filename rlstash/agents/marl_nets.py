"""Networks of multi-agent actor-critics: MLPs over an agent axis, shared or per agent.

Inputs are ``[B, A, in]`` (B rows, A agents). With parameter sharing one MLP serves every agent
(optionally told which agent it is by a one-hot agent id appended to its input); without it
each agent has its own weights, all agents computed in one batched matmul::

    shared:       y[b, a] = MLP(x[b, a])                 weights [in, out]
    independent:  y[b, a] = MLP_a(x[b, a])               weights [A, in, out] (einsum over a)

Initialisation is torch's ``nn.Linear`` default (uniform in +-1/sqrt(in)), draw for draw: with
shared weights the same seed builds the same network as the ``nn.Linear`` layers of TorchRL's
and BenchMARL's MLPs made in the same order.
"""

from __future__ import annotations

import math

import torch
from torch import nn

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}


class AgentLinear(nn.Module):
    """A linear layer over [..., A, in]: one weight matrix for all agents (``n_agents`` None)
    or one per agent."""

    def __init__(self, n_in: int, n_out: int, n_agents: int | None = None) -> None:
        super().__init__()
        groups = 1 if n_agents is None else n_agents
        bound = 1.0 / math.sqrt(n_in)
        self.n_agents = n_agents
        # nn.Linear's draws (weight [out, in], then bias), kept as [in, out]: from one seed a
        # shared layer is the nn.Linear built in its place (TorchRL's and BenchMARL's MLPs)
        weight = torch.empty(groups, n_out, n_in).uniform_(-bound, bound)
        self.weight = nn.Parameter(weight.transpose(1, 2).contiguous())
        self.bias = nn.Parameter(torch.empty(groups, n_out).uniform_(-bound, bound))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.n_agents is None:
            return torch.addmm(self.bias[0], x.reshape(-1, x.shape[-1]), self.weight[0]).reshape(
                *x.shape[:-1], -1
            )  # [..., out]
        return torch.einsum("...ai,aio->...ao", x, self.weight) + self.bias  # [..., A, out]


class AgentMLP(nn.Module):
    """Linear + activation layers of widths ``hidden`` then a linear output of ``n_out``, over
    [..., A, n_in] (``n_agents`` None: shared weights; else one set per agent)."""

    def __init__(
        self, n_in: int, hidden: tuple[int, ...], n_out: int, n_agents: int | None = None,
        activation: str = "tanh",
    ) -> None:  # fmt: skip
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(
                f"activation: expected one of {sorted(ACTIVATIONS)}, got {activation!r}"
            )
        layers: list[nn.Module] = []
        width = n_in
        for h in hidden:
            layers += [AgentLinear(width, h, n_agents), ACTIVATIONS[activation]()]
            width = h
        layers.append(AgentLinear(width, n_out, n_agents))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def with_agent_id(x: torch.Tensor) -> torch.Tensor:
    """[..., A, D] with the one-hot agent id appended: [..., A, D + A]."""
    n = x.shape[-2]
    eye = torch.eye(n, dtype=x.dtype, device=x.device).expand(*x.shape[:-1], n)
    return torch.cat([x, eye], -1)


SCALE_MIN = 0.01
"""The smallest scale of the tanh-normal policies: the ``min_val`` of tensordict's
``biased_softplus`` (default 0.01), which BenchMARL's ``biased_softplus_1.0`` mapping uses."""


def softplus_offset(bias: float = 1.0, min_val: float = SCALE_MIN) -> float:
    """The b of :func:`biased_softplus`: softplus(0 + b) + min_val = ``bias``."""
    return math.log(math.expm1(bias - min_val))


def biased_softplus(x: torch.Tensor, bias: float = 1.0, min_val: float = SCALE_MIN) -> torch.Tensor:
    """softplus(x + b) + min_val with b chosen so that x = 0 maps to ``bias``: BenchMARL's
    ``biased_softplus_1.0`` scale mapping of tanh-normal policies (tensordict's
    ``biased_softplus(1.0)``: the scale never falls below ``min_val`` = 0.01)."""
    return torch.nn.functional.softplus(x + softplus_offset(bias, min_val)) + min_val
