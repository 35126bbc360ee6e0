"""PPO's gradient written out for MLP actor-critics: forward, loss and backward as plain tensor
operations, with no autograd graph.

A PPO update on small networks is overhead-bound: on CartPole's (64, 64) tanh nets a minibatch
of 256 rows costs ~20 us of arithmetic per matmul but autograd's nodes, the optimizer's Python
and dispatching every small op cost more than the matmuls together. The loss of
:mod:`rlstash.agents.ppo` has a short closed-form gradient, so for the common networks this
module computes it directly::

    h_0 = x,  h_k = act(W_k h_{k-1} + b_k)           each trunk (actor, critic), activations kept
    categorical:  l = W h + b,  log pi = log_softmax(l),  p = exp(log pi)
        dL/dl  = p (c_ent s (log pi + H) - G) + G onehot(a)
    Gaussian (bound 'clip'):  mu = W h + b,  z = (a - mu) / sigma
        dL/dmu = G z / sigma,  dL/dlog sigma = sum_rows G (z^2 - 1) - c_ent sum_rows s
    G      = dL/dlog pi(a|s) = -s A_n rho [-A_n rho >= -A_n clip(rho)]   (the clipped surrogate)
    dL/dV  = c_v s 2 (V - R)    (with clip_range_vf: through the larger of the two terms)
    dW_k   = g_k^T h_{k-1},  db_k = sum_rows g_k,  g_{k-1} = (g_k W_k) act'(h_{k-1})

with s the row weight (1/B, or valid/sum(valid)). Gradients are written straight into the
parameter group's flat gradient (:mod:`rlstash.agents.flat`), then the global norm is clipped
and Adam's fused kernel steps the flat vector, as :meth:`FlatAdam.step` does after
``backward``. The result equals the autograd update to float rounding
(tests/agents/test_ppo_grad.py compares parameters, metrics and Adam state).

On CPU tanh is computed as 2 sigmoid(2z) - 1 (the same function; torch's CPU tanh kernel costs
8x its sigmoid on a [256, 64] block), with the 2z folded into the layer's matmul.

Used for: flat observations, MLP trunks of Linear + tanh/ReLU, a categorical policy with a
linear head over at most ``action_chunk`` actions and no action masks, or a Gaussian policy
with bound 'clip'. Anything else (images, embedding heads, huge action sets, masks, 'tanh'
bounds) keeps the autograd update; :func:`unsupported` says why.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from rlstash.agents.actions import LinearActionHead
from rlstash.agents.compiled import FlatAdam
from rlstash.agents.policies import (
    LOG_2PI,
    ActorCritic,
    CategoricalActorCritic,
    GaussianActorCritic,
)

SIGMOID_TANH = ("cpu",)  # devices where tanh runs as 2 sigmoid(2z) - 1 (module docstring)


def unsupported(policy: ActorCritic, n_actions: int | None, action_chunk: int) -> str | None:
    """Why the written-out gradient does not apply to ``policy`` (None: it applies)."""
    if policy.shared_trunk:
        return "image observations (a shared CNN trunk)"
    for seq in (policy.actor_trunk, policy.critic[0]):
        for layer in seq:
            if not isinstance(layer, nn.Flatten | nn.Linear | nn.Tanh | nn.ReLU):
                return f"a trunk layer of type {type(layer).__name__}"
    if isinstance(policy, CategoricalActorCritic):
        if not isinstance(policy.head, LinearActionHead):
            return "an embedding action head"
        if n_actions is None or n_actions > action_chunk:
            return f"more actions than action_chunk ({n_actions} > {action_chunk})"
        return None
    if isinstance(policy, GaussianActorCritic):
        return None if policy.bound == "clip" else "bound='tanh'"
    return f"a policy of type {type(policy).__name__}"


class LinearOps:
    """An ``nn.Linear``'s forward and written-out backward (gradients into ``grads``, the
    flat gradient's views by parameter id). :class:`Trunk` runs any layer with these two
    methods (:mod:`rlstash.agents.marl_grad` has one for agent-batched layers)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, grads: dict[int, torch.Tensor]):
        self.weight, self.bias = weight, bias  # [out, in], [out]
        self.grad_w, self.grad_b = grads[id(weight)], grads[id(bias)]

    def affine(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        """scale * (x W^T + b) as one addmm ([B, in] -> [B, out])."""
        return torch.addmm(self.bias, x, self.weight.t(), beta=scale, alpha=scale)

    def backward(self, h: torch.Tensor, g: torch.Tensor, input_grad: bool = True) -> Any:
        """Write dL/dW, dL/db for g = dL/dout [B, n] and the input h [B, d]; returns dL/dh
        [B, d] (None without ``input_grad``)."""
        _weight_grad(h, g, self.grad_w)
        torch.sum(g, 0, out=self.grad_b)
        return torch.mm(g, self.weight) if input_grad else None


def activate(layer: Any, x: torch.Tensor, act: str) -> torch.Tensor:
    """act(layer.affine(x)) for act 'tanh' or 'relu' (tanh as 2 sigmoid(2z) - 1 on
    :data:`SIGMOID_TANH` devices, the 2z folded into the affine map)."""
    if act == "relu":
        return layer.affine(x).relu_()
    if x.device.type in SIGMOID_TANH:  # tanh(z) = 2 sigmoid(2z) - 1 (module doc)
        return layer.affine(x, 2.0).sigmoid_().mul_(2.0).sub_(1.0)
    return layer.affine(x).tanh_()


def activation_backward(g: torch.Tensor, y: torch.Tensor, act: str) -> torch.Tensor:
    """dL/dz from g = dL/dy for y = act(z) ('tanh' or 'relu')."""
    if act == "relu":
        return torch.ops.aten.threshold_backward(g, y, 0)
    return torch.ops.aten.tanh_backward(g, y)


class Trunk:
    """An MLP trunk (Linear + tanh/ReLU layers) run without autograd: the forward keeps each
    layer's output, the backward writes the weight gradients. ``layers``: (layer ops with
    ``affine`` and ``backward`` as :class:`LinearOps`, activation name) pairs."""

    def __init__(self, layers: list[tuple[Any, str]]):
        self.layers = layers

    @classmethod
    def of(cls, seq: nn.Sequential, grads: dict[int, torch.Tensor]) -> Trunk:
        """The trunk of an ``nn.Sequential`` of (Flatten,) Linear, tanh/ReLU, ... layers."""
        modules = [m for m in seq if not isinstance(m, nn.Flatten)]
        return cls([
            (LinearOps(linear.weight, linear.bias, grads), "tanh" if isinstance(act, nn.Tanh) else "relu")
            for linear, act in zip(modules[::2], modules[1::2])
        ])  # fmt: skip

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        """[x, h_1, ..., h_K] for x [B, in] (flattened)."""
        outs = [x]
        for layer, act in self.layers:
            outs.append(activate(layer, outs[-1], act))
        return outs

    def backward(self, outs: list[torch.Tensor], g: torch.Tensor) -> None:
        """Given g = dL/dh_K, write dL/dW_k and dL/db_k of every layer."""
        for k in range(len(self.layers) - 1, -1, -1):
            layer, act = self.layers[k]
            g = layer.backward(outs[k], activation_backward(g, outs[k + 1], act), k > 0)


def _weight_grad(h: torch.Tensor, g: torch.Tensor, out: torch.Tensor) -> None:
    """out [n, d] = g^T h for g [B, n], h [B, d] (:func:`transposed_product`)."""
    transposed_product(g, h, out)


def transposed_product(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    """out [p, q] = a^T b for a [B, p], b [B, q]; as (b^T a)^T when p > q (a wide product is
    ~4x cheaper on CPU than a tall one: 4 vs 14 us for [256, 4] inputs of a 64-unit layer;
    3-5x for a [1200, 256] x [1200, 4] head)."""
    if a.shape[1] > b.shape[1]:
        out.copy_(torch.mm(b.t(), a).t())
    else:
        torch.mm(a.t(), b, out=out)


def clipped_surrogate(
    adv: torch.Tensor, ratio: torch.Tensor, clip: float | torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(pg = max(-A rho, -A clip(rho)) per row, d pg / d log pi(a|s) per row): the unclipped
    term's gradient -A rho where it is the larger one (ties: autograd's max gives it in full,
    half through each branch)."""
    surr, surr_clip = -adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip)
    return torch.maximum(surr, surr_clip), surr.masked_fill(surr < surr_clip, 0.0)


def categorical_grad(
    logp_all: torch.Tensor, action: torch.Tensor, g_logp: torch.Tensor, s_ent: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """(entropy [...], dL/dlogits [..., n]) of log pi = log_softmax(logits) [..., n] for
    L = sum_rows (pg - s_ent H), g_logp = dL/dlog pi(a|s) [...], s_ent the entropy's weight
    per row ([...] tensor, a float, or 0/None: no entropy term)::

        dL/dl = p (s_ent (log pi + H) - g_logp) + g_logp onehot(a)
    """
    p = logp_all.exp()
    entropy = -(p * logp_all).sum(-1)
    if s_ent is None or (isinstance(s_ent, float | int) and not s_ent):
        g = p * -g_logp[..., None]
    else:
        s = s_ent[..., None] if isinstance(s_ent, torch.Tensor) else s_ent
        g = (logp_all + entropy[..., None]).mul_(s).sub_(g_logp[..., None]).mul_(p)
    return entropy, g.scatter_add_(-1, action[..., None], g_logp[..., None])


class PPOGrad:
    """PPO's loss and its gradient for one MLP actor-critic and its :class:`FlatAdam` group
    (module docstring); ``step`` is one minibatch update."""

    def __init__(self, policy: nn.Module, group: FlatAdam, config: Any):
        self.policy, self.group, self.config = policy, group, config
        grads = {id(p): g for p, g in zip(group.flat.params, group.flat.grads)}
        self.actor = Trunk.of(policy.actor_trunk, grads)
        self.critic = Trunk.of(policy.critic[0], grads)
        self.value_head = LinearOps(policy.value_head.weight, policy.value_head.bias, grads)
        self.discrete = isinstance(policy, CategoricalActorCritic)
        if self.discrete:
            self.head = LinearOps(policy.head.weight, policy.head.bias_, grads)
        else:
            self.head = LinearOps(policy.mu.weight, policy.mu.bias, grads)
        self.grads = grads
        covered = set()
        for layer in (self.head, self.value_head, *(op for t in (self.actor, self.critic)
                                                     for op, _ in t.layers)):  # fmt: skip
            covered |= {id(layer.weight), id(layer.bias)}
        if not self.discrete:
            covered.add(id(policy.log_std))
        if covered != set(grads):
            raise ValueError("PPOGrad: the group's parameters are not the policy's layers")

    # --- forward ---------------------------------------------------------------------------

    def _outputs(self, x: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        x = x.reshape(x.shape[0], -1)
        return self.actor.forward(x), self.critic.forward(x)

    def _value(self, hc: torch.Tensor) -> torch.Tensor:
        return self.value_head.affine(hc).squeeze(1)  # [B]

    @torch.no_grad()
    def log_prob(self, x: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """log pi(action|s) [B] as :meth:`step` computes it (the behaviour policy's, so the
        first epoch's ratio is exactly 1)."""
        return self._log_prob(self.actor.forward(x.reshape(x.shape[0], -1))[-1], action)[0]

    @torch.no_grad()
    def value(self, x: torch.Tensor) -> torch.Tensor:
        """V(s) [B] as :meth:`step` computes it."""
        return self._value(self.critic.forward(x.reshape(x.shape[0], -1))[-1])

    def _log_prob(self, h: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """(log pi(a|s) [B], what the backward needs) from the actor's features [B, d]."""
        out = self.head.affine(h)  # logits or mu [B, n|A]
        if self.discrete:
            logp_all = torch.log_softmax(out, 1)  # [B, n]
            return logp_all.gather(1, action[:, None]).squeeze(1), logp_all
        log_std = self.policy.log_std  # [A]
        z = (action - out) / log_std.exp()  # [B, A]
        logp = (-0.5 * z.pow(2)).sum(1) - (log_std.sum() + 0.5 * LOG_2PI * z.shape[1])
        return logp, z

    # --- one minibatch ---------------------------------------------------------------------

    @torch.no_grad()
    def step(self, mb: dict[str, torch.Tensor], clip: float) -> torch.Tensor:
        """One gradient step on the minibatch ``mb`` (fields as PPO's ``_loss`` takes them);
        returns (policy loss, value loss, entropy, approx KL, clip fraction, grad norm) [6]."""
        cfg = self.config
        ha, hc = self._outputs(mb["obs"])
        value = self._value(hc[-1])  # [B]
        logp, aux = self._log_prob(ha[-1], mb["action"])
        rows = logp.shape[0]
        if "valid" in mb:
            w = mb["valid"].float()
            scale = w / w.sum().clamp_min(1.0)  # [B]: the weighted mean's weights
        else:
            w, scale = None, None
        adv = (
            normalized_advantages(mb["advantages"], w)
            if cfg.normalize_advantage
            else mb["advantages"]
        )
        log_ratio = logp - mb["logp"]
        ratio = log_ratio.exp()
        pg, g_logp = clipped_surrogate(adv, ratio, clip)  # [B], dpg/dlog pi(a|s) [B]
        g_logp = g_logp / rows if scale is None else g_logp * scale
        v_loss, g_value = self._value_terms(value, mb, scale, rows)
        if self.discrete:
            s_ent = cfg.ent_coef / rows if scale is None else scale * cfg.ent_coef
            entropy, g_out = categorical_grad(aux, mb["action"], g_logp, s_ent)
        else:
            entropy, g_out = self._gaussian_grad(aux, g_logp, scale, rows)
        self.actor.backward(ha, self.head.backward(ha[-1], g_out))
        self.critic.backward(hc, self.value_head.backward(hc[-1], g_value[:, None]))
        kl = (ratio - 1) - log_ratio
        clipped = ((ratio - 1).abs() > clip).float()
        terms = torch.stack([pg, v_loss, entropy.expand(rows), kl, clipped])  # [5, B]
        means = terms.sum(1).mul_(1.0 / rows) if scale is None else terms @ scale  # [5]
        norm = self.group.fused_step(cfg.max_grad_norm)
        return torch.cat([means, norm[None]])

    def _value_terms(
        self, value: torch.Tensor, mb: dict[str, torch.Tensor], scale: torch.Tensor | None,
        rows: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """((V - R)^2 per row (or the clipped form), dL/dV [B])."""
        cfg, ret = self.config, mb["returns"]
        diff = value - ret
        v_loss = diff.square()
        g = diff
        if cfg.clip_range_vf is not None:
            old = mb["values"]
            change = value - old
            inside = (change >= -cfg.clip_range_vf) & (change <= cfg.clip_range_vf)
            diff_c = old + change.clamp(-cfg.clip_range_vf, cfg.clip_range_vf) - ret
            loss_c = diff_c.square()
            g = torch.where(v_loss >= loss_c, diff, diff_c * inside)
            v_loss = torch.maximum(v_loss, loss_c)
        factor = 2.0 * cfg.vf_coef
        g = g * (factor / rows) if scale is None else g * (scale * factor)
        return v_loss, g

    def _gaussian_grad(
        self, z: torch.Tensor, g_logp: torch.Tensor, scale: torch.Tensor | None, rows: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(entropy (0-dim: the same for every row), dL/dmu [B, A]); writes dL/dlog std."""
        log_std = self.policy.log_std
        entropy = (0.5 + 0.5 * LOG_2PI + log_std).sum()
        g_std = torch.mv((z.square() - 1).t(), g_logp)  # [A]
        weight = 1.0 if scale is None else scale.sum()
        g_std = g_std - self.config.ent_coef * weight
        self.grads[id(log_std)].copy_(g_std)
        return entropy, (z / log_std.exp()).mul_(g_logp[:, None])


def normalized_advantages(adv: torch.Tensor, w: torch.Tensor | None) -> torch.Tensor:
    """(A - mean A) / (std A + 1e-8) per minibatch, weighted by ``w`` [B] when given (the
    rows' weights; std with Bessel's correction, as SB3)."""
    if w is None:
        return (adv - adv.mean()) / (adv.std() + 1e-8)
    n_w = w.sum().clamp_min(1.0)
    mu = (w * adv).sum() / n_w
    std = ((w * (adv - mu) ** 2).sum() / (n_w - 1).clamp_min(1.0)).sqrt()
    return (adv - mu) / (std + 1e-8)
