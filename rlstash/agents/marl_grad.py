"""MAPPO/IPPO's gradient written out (:mod:`rlstash.agents.mappo`): forward, losses and backward
of one minibatch as plain tensor operations, with no autograd graph.

The update at BenchMARL's sizes ([256, 256] tanh MLPs, 400 env steps x 3 agents per minibatch)
is matmul- and tanh-bound; autograd adds its engine, saved tensors and a torch tanh that costs
several times a sigmoid on CPU. The loss of :meth:`MAPPO.losses` has a short gradient, built
from :mod:`rlstash.agents.ppo_grad`'s pieces (:class:`~rlstash.agents.ppo_grad.Trunk`, the
clipped surrogate, the categorical head)::

    w      = m / sum m                                   (m: the agent rows' mask [B, A])
    G      = dL/dlog pi(a|o) = w * (-A rho [unclipped term is the larger])
    tanh-normal (loc, raw) -> scale = softplus(raw + c) + 0.01,  z = (u - loc) / scale:
        dL/dloc = G z / scale,   dL/draw = (G (z^2 - 1) - c_ent w) / scale * sigmoid(raw + c)
    categorical (masked logits):  dL/dl = p (c_ent w (log pi + H) - G) + G onehot(a), 0 where
        the action is unavailable
    critic: dL/dV = 2 vf_coef w (V - R), summed over agents where V is computed once per env
    layers: shared weights [in, out] over B*A rows (addmm/mm); per-agent weights [A, in, out]
        over [A, B, in] (baddbmm/bmm)

then each network's global norm is clipped and Adam's fused kernel steps its flat vector
(:meth:`FlatAdam.fused_step`), as the autograd update does after ``backward``. The result equals
autograd's update to float rounding (tests/marl/test_mappo_grad.py: parameters, Adam state and
metrics; shared and per-agent weights, MAPPO and IPPO, agent ids, continuous and masked
discrete actions, relu). :func:`unsupported` names what it does not cover (networks other than
:class:`~rlstash.agents.marl_nets.AgentMLP`); MAPPO then keeps autograd and says so.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from rlstash.agents.marl_nets import (
    ACTIVATIONS,
    SCALE_MIN,
    AgentLinear,
    AgentMLP,
    softplus_offset,
)
from rlstash.agents.ppo_grad import (
    Trunk,
    categorical_grad,
    clipped_surrogate,
    transposed_product,
)

LOG_2PI = 1.8378770664093453
# a shared layer with fewer outputs than this (and at least as many inputs: an output head)
# computes x W as (W^T x^T)^T: a wide product, 3x cheaper than the tall one on CPU for
# [1200, 256] x [256, 4] (bench/results/marl_update.md)
NARROW = 16
_ACT_NAMES = {cls: name for name, cls in ACTIVATIONS.items()}


def unsupported(agent: Any) -> str | None:
    """Why the written-out gradient does not apply to ``agent``'s networks (None: it does)."""
    for name, net in (("actor", agent.actor), ("critic", agent.critic)):
        if not isinstance(net, AgentMLP):
            return f"a {name} of type {type(net).__name__}"
        mods = list(net.net)
        if not all(isinstance(m, AgentLinear) for m in mods[::2]) or not all(
            type(m) in _ACT_NAMES for m in mods[1::2]
        ):
            return f"a {name} layer other than AgentLinear + tanh/ReLU"
    return None


class AgentLinearOps:
    """An :class:`AgentLinear`'s forward and written-out backward (gradients into ``grads``,
    the flat gradients' views by parameter id): shared weights on rows [R, in], per-agent
    weights on [A, B, in]."""

    def __init__(self, layer: AgentLinear, grads: dict[int, torch.Tensor]):
        self.shared = layer.n_agents is None
        weight, bias = layer.weight.detach(), layer.bias.detach()  # [G, in, out], [G, out]
        gw, gb = grads[id(layer.weight)], grads[id(layer.bias)]
        if self.shared:  # views of the one group's weights
            weight, bias, gw, gb = weight[0], bias[0], gw[0], gb[0]
        self.weight, self.bias, self.grad_w, self.grad_b = weight, bias, gw, gb

    def affine(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        """scale * (x W + b): [R, in] -> [R, out] shared, [A, B, in] -> [A, B, out] per agent."""
        if self.shared:
            if self.weight.shape[1] < NARROW <= self.weight.shape[0]:  # (W^T x^T)^T: wide
                out = torch.mm(self.weight.t(), x.t()).t().add_(self.bias)
                return out if scale == 1.0 else out.mul_(scale)
            return torch.addmm(self.bias, x, self.weight, beta=scale, alpha=scale)
        return torch.baddbmm(self.bias[:, None], x, self.weight, beta=scale, alpha=scale)

    def backward(self, h: torch.Tensor, g: torch.Tensor, input_grad: bool = True) -> Any:
        """Write dL/dW = h^T g and dL/db = sum_rows g for g = dL/dout; returns dL/dh (None
        without ``input_grad``)."""
        if self.shared:
            transposed_product(h, g, self.grad_w)
            torch.sum(g, 0, out=self.grad_b)
            return torch.mm(g, self.weight.t()) if input_grad else None
        torch.bmm(h.transpose(1, 2), g, out=self.grad_w)
        torch.sum(g, 1, out=self.grad_b)
        return torch.bmm(g, self.weight.transpose(1, 2)) if input_grad else None


class AgentNet:
    """An :class:`AgentMLP` without autograd: its hidden trunk and its output layer."""

    def __init__(self, mlp: AgentMLP, grads: dict[int, torch.Tensor]):
        mods = list(mlp.net)
        self.trunk = Trunk(
            [(AgentLinearOps(lin, grads), _ACT_NAMES[type(act)])
             for lin, act in zip(mods[:-1:2], mods[1::2])]
        )  # fmt: skip
        self.head = AgentLinearOps(mods[-1], grads)
        self.shared = self.head.shared
        self.params = {id(p) for p in mlp.parameters()}

    def forward(self, x: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """(the trunk's outputs, the net's output [B, A, out]) for x [B, A, in]."""
        B, A = x.shape[:2]
        rows = x.reshape(B * A, -1) if self.shared else x.transpose(0, 1)
        hs = self.trunk.forward(rows)
        out = self.head.affine(hs[-1])
        return hs, (out.view(B, A, -1) if self.shared else out.transpose(0, 1))

    def backward(self, hs: list[torch.Tensor], g: torch.Tensor) -> None:
        """Write every weight's gradient for g = dL/dout [B, A, out]."""
        g = g.reshape(-1, g.shape[-1]) if self.shared else g.transpose(0, 1)
        self.trunk.backward(hs, self.head.backward(hs[-1], g))


class MAPPOGrad:
    """MAPPO/IPPO's losses and their gradient for ``agent`` (a :class:`MAPPO`), over its two
    :class:`FlatAdam` groups (module docstring); :meth:`step` is one minibatch update."""

    def __init__(self, agent: Any):
        self.agent = agent
        self.groups = (agent.actor_opt, agent.critic_opt)
        grads = {}
        for group in self.groups:
            grads.update({id(p): g for p, g in zip(group.flat.params, group.flat.grads)})
        self.actor, self.critic = AgentNet(agent.actor, grads), AgentNet(agent.critic, grads)
        if self.actor.params | self.critic.params != set(grads):
            raise ValueError("MAPPOGrad: the groups' parameters are not the agent's networks")
        self.offset = softplus_offset()

    @torch.no_grad()
    def step(self, mb: dict[str, torch.Tensor]) -> torch.Tensor:
        """One gradient step of actor and critic on ``mb`` (fields as :meth:`MAPPO.losses`
        takes them); returns (policy loss, value loss, approx KL, clip fraction, actor grad
        norm, critic grad norm) [6] as the autograd step does."""
        agent, cfg = self.agent, self.agent.config
        m = mb["mask"]  # [B, A]
        n = m.sum().clamp_min(1).float()
        w = m / n  # each row's weight in the means
        ha, out = self.actor.forward(agent._actor_in(mb["obs"]))
        if agent.n_actions is not None:
            logp, ent, aux = self._categorical(out, mb)
        else:
            logp, ent, aux = self._tanh_normal(out, mb["action"], m)
        log_ratio = torch.where(m, logp - mb["logp"], 0.0)
        ratio = log_ratio.exp()
        adv = torch.where(m, mb["advantages"], 0.0)
        pg, g_logp = clipped_surrogate(adv, ratio, cfg.clip_range)
        g_logp = g_logp * w  # dL/dlog pi(a|o) [B, A]
        s_ent = w * cfg.ent_coef if cfg.ent_coef else None  # -dL/dH per row
        if agent.n_actions is not None:
            ent, g_out = categorical_grad(aux[0], mb["action"], g_logp, s_ent)
            if aux[1] is not None:
                g_out.masked_fill_(~aux[1], 0.0)
        else:
            g_out = self._tanh_normal_grad(aux, g_logp, s_ent)
        self.actor.backward(ha, g_out)
        ent = torch.where(m, ent, 0.0)
        hc, v = self.critic.forward(agent._critic_in(mb["obs"], mb.get("state")))
        err = torch.where(m, v.squeeze(-1) - mb["returns"], 0.0)  # [B, A] ([B, 1] broadcast)
        g_v = err * (2.0 * cfg.vf_coef / n)
        if v.shape[1] != m.shape[1]:  # one value per env for all its agents
            g_v = g_v.sum(1, keepdim=True)
        self.critic.backward(hc, g_v[..., None])
        terms = torch.stack([
            (pg * w).sum() - cfg.ent_coef * (ent * w).sum(),
            cfg.vf_coef * err.square().sum() / n,
            ((ratio - 1) - log_ratio).sum() / n,
            ((ratio - 1).abs() > cfg.clip_range).float().sum() / n,
        ])  # fmt: skip
        norms = [group.fused_step(cfg.max_grad_norm) for group in self.groups]
        return torch.cat([terms, torch.stack(norms)])

    def _categorical(
        self, logits: torch.Tensor, mb: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, None, tuple[torch.Tensor, torch.Tensor | None]]:
        """(log pi(a|o) [B, A], None (the entropy comes with the gradient), (log pi [B, A, n],
        the action mask))."""
        mask = mb.get("action_mask")
        if mask is not None:
            logits = logits.masked_fill(~mask, -1e9)
        logp_all = torch.log_softmax(logits, -1)
        return logp_all.gather(-1, mb["action"][..., None]).squeeze(-1), None, (logp_all, mask)

    def _tanh_normal(
        self, out: torch.Tensor, u: torch.Tensor, m: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
        """(log N(u; loc, scale) [B, A], entropy [B, A], (z, 1 / scale, raw + offset)); z is
        0 in rows off the mask ``m`` (whatever their action: 0 * inf would be NaN)."""
        loc, raw = out.chunk(2, -1)
        shifted = raw + self.offset
        scale = nn.functional.softplus(shifted) + SCALE_MIN  # marl_nets.biased_softplus
        z = torch.where(m[..., None], (u - loc) / scale, 0.0)
        log_scale = scale.log()
        logp = (-0.5 * z.square() - log_scale - 0.5 * LOG_2PI).sum(-1)
        ent = (0.5 + 0.5 * LOG_2PI + log_scale).sum(-1)
        return logp, ent, (z, scale.reciprocal(), shifted)

    @staticmethod
    def _tanh_normal_grad(
        aux: tuple[torch.Tensor, ...], g_logp: torch.Tensor, s_ent: torch.Tensor | None
    ) -> torch.Tensor:
        """dL/d(loc, raw) [B, A, 2 act_dim]."""
        z, inv, shifted = aux
        g = g_logp[..., None]
        g_loc = z * inv * g
        g_scale = (z.square() - 1).mul_(g)
        if s_ent is not None:
            g_scale.sub_(s_ent[..., None])
        g_raw = g_scale.mul_(inv).mul_(torch.sigmoid(shifted))
        return torch.cat([g_loc, g_raw], -1)
