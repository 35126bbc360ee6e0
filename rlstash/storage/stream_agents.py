"""Multi-agent steps in a :class:`~rlstash.storage.stream.StreamStorage`: fields with an agent
axis, expressed through the stream's own spec (no storage class of their own).

One lane per env, one slot per env step with every agent of that env (off-policy MARL: QMIX,
VDN, :mod:`rlstash.agents.qmix`). The per-step fields of :func:`agent_step_spec` for ``A``
agents of one group::

    =================== ================== ===============================================
    field               shape (per slot)   meaning
    =================== ================== ===============================================
    obs                 [A, D] float32     each agent's observation, flattened (a dict
                                           observation's keys concatenated in sorted order)
    obs/state           [S] float32        the env's global state (only where it has one)
    obs/action_mask     [A, ceil(n/8)] u8  available actions as bits (numpy.packbits order;
                                           only where the env has masks)
    obs/mask            [A] bool           the agent acts in this step (False: done early or
                                           absent; rows it owns contribute nothing)
    action              [A] int64          each agent's action index (0 where mask False)
    reward              [A] float32        each agent's reward (0 where mask False)
    terminated,         () bool            the env's episode ended here (every agent done),
    truncated                              as bits in the lanes: episode boundaries per env
    =================== ================== ===============================================

State, action masks and agent masks are observation fields of the stream (``obs/<name>``):
stored once per slot, their ``next_`` twins rebuilt on read like ``next_obs`` (the double-Q
target needs the next step's available actions and which agents still act), and an ended
episode's final slot holds them (``final_obs/<name>``, same-step autoreset). A per-agent done
is the next slot's ``obs/mask`` (``next_obs/mask`` False: that agent's next value counts 0).
A sample of B starts is ``[B, A, ...]`` per agent field (``[B, S]`` for the state).
"""

from __future__ import annotations

import torch

from rlstash.spec import Field, Spec

STATE, ACTION_MASK, MASK = "obs/state", "obs/action_mask", "obs/mask"


def agent_step_spec(
    n_agents: int,
    obs_dim: int,
    state_dim: int | None = None,
    n_action_mask: int | None = None,
) -> Spec:
    """The stream step of ``n_agents`` agents of ``obs_dim`` floats each (module docstring):
    ``state_dim`` where the env has a global state, ``n_action_mask`` (the number of actions)
    where it has action masks."""
    for name, value in (("n_agents", n_agents), ("obs_dim", obs_dim)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
    A = n_agents
    fields = {"obs": Field((A, obs_dim), torch.float32)}
    if state_dim is not None:
        fields[STATE] = Field((state_dim,), torch.float32)
    if n_action_mask is not None:
        fields[ACTION_MASK] = Field((A, (n_action_mask + 7) // 8), torch.uint8)
    fields[MASK] = Field((A,), torch.bool)
    fields["action"] = Field((A,), torch.int64)
    fields["reward"] = Field((A,), torch.float32)
    return Spec(fields)


def pack_bits(mask: torch.Tensor) -> torch.Tensor:
    """bool [..., n] -> uint8 [..., ceil(n/8)] (numpy.packbits order, padding bits 0)."""
    n = mask.shape[-1]
    padded = torch.nn.functional.pad(mask.to(torch.uint8), (0, (-n) % 8))
    padded = padded.reshape(*mask.shape[:-1], -1, 8)
    weights = torch.tensor([128, 64, 32, 16, 8, 4, 2, 1], dtype=torch.uint8, device=mask.device)
    return (padded * weights).sum(-1, dtype=torch.uint8)


def unpack_bits(packed: torch.Tensor, n: int) -> torch.Tensor:
    """uint8 [..., ceil(n/8)] -> bool [..., n] (the inverse of :func:`pack_bits`)."""
    shifts = torch.arange(7, -1, -1, dtype=torch.uint8, device=packed.device)
    bits = (packed.unsqueeze(-1) >> shifts) & 1  # [..., nb, 8]
    return bits.reshape(*packed.shape[:-1], -1)[..., :n].bool()


__all__ = ["ACTION_MASK", "MASK", "STATE", "agent_step_spec", "pack_bits", "unpack_bits"]
