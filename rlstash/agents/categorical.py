"""log pi(a|s) and the entropy of a categorical policy over huge action sets, differentiable,
in O(B * chunk) extra memory (no [B, n] tensor, no one-hot).

With logits l_a = u . T_a + b_a (an :class:`~rlstash.agents.actions.ActionHead`) over the
available actions A(s)::

    lse        = log sum_{a in A} exp(l_a)            log pi(a|s) = l_a - lse
    H          = lse - sum_a p_a l_a                  p = softmax(l) over A
    dlse/dl_j  = p_j
    dH/dl_j    = -p_j (log p_j + H)

so the backward pass recomputes each chunk's logits and needs only ``lse`` and ``H`` per row:
grad_l = p (g_lse - g_H (log p + H)), then grad_u += grad_l T_c, grad_T[c] = grad_l^T u,
grad_b[c] = sum_B grad_l. ``log pi(a|s)`` of the taken actions is a gather (``score_actions``)
minus ``lse``. For ``n <= chunk`` the ordinary dense log-softmax is used (same values; faster
for small heads).
"""

from __future__ import annotations

import torch

from rlstash.agents.actions import ActionHead, ActionMask, _masked, chunk_ranges, softmax_stats


class _LogSumExpEntropy(torch.autograd.Function):
    """(lse [B], H [B]) of softmax(u T^T + b) over available actions; chunked backward."""

    @staticmethod
    def forward(ctx, u, table, bias, chunk, mask):  # noqa: ANN001
        def logit_fn(start: int, stop: int) -> torch.Tensor:
            out = u @ table[start:stop].T  # [B, c]
            return out if bias is None else out + bias[start:stop]

        stats = softmax_stats(logit_fn, table.shape[0], chunk, mask)
        ctx.save_for_backward(u, table, bias, stats.lse, stats.entropy)
        ctx.extra = (chunk, mask)
        return stats.lse, stats.entropy

    @staticmethod
    def backward(ctx, grad_lse, grad_h):  # noqa: ANN001
        u, table, bias, lse, entropy = ctx.saved_tensors
        chunk, mask = ctx.extra
        need_u, need_t, need_b = ctx.needs_input_grad[:3]
        grad_u = torch.zeros_like(u) if need_u else None
        grad_t = torch.zeros_like(table) if need_t else None
        grad_b = torch.zeros_like(bias) if (need_b and bias is not None) else None
        finite = torch.isfinite(lse)
        lse = torch.where(finite, lse, torch.zeros_like(lse))[:, None]  # [B, 1]
        g_lse = torch.where(finite, grad_lse, torch.zeros_like(grad_lse))[:, None]  # [B, 1]
        g_h, h = grad_h[:, None], entropy[:, None]  # [B, 1]
        with torch.no_grad():
            for start, stop in chunk_ranges(table.shape[0], chunk):
                t_c = table[start:stop]  # [c, k]
                logits = u @ t_c.T if bias is None else u @ t_c.T + bias[start:stop]  # [B, c]
                logp = _masked(logits, mask, start, stop) - lse  # [B, c], -inf if masked
                p = torch.exp(logp)  # [B, c]
                logp = torch.where(p > 0, logp, torch.zeros_like(logp))
                g = p * (g_lse - g_h * (logp + h))  # [B, c]
                if grad_u is not None:
                    grad_u += g @ t_c
                if grad_t is not None:
                    grad_t[start:stop] = g.T @ u
                if grad_b is not None:
                    grad_b[start:stop] = g.sum(0)
        return grad_u, grad_t, grad_b, None, None


def logsumexp_entropy(
    head: ActionHead, u: torch.Tensor, chunk: int, mask: ActionMask | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(lse [B], entropy [B]) of pi = softmax over the available actions, differentiable in ``u``
    and the head's table and bias; extra memory O(B * chunk) in forward and backward."""
    return _LogSumExpEntropy.apply(u, head.table(), head.bias(), int(chunk), mask)


def log_prob_entropy(
    head: ActionHead,
    u: torch.Tensor,
    actions: torch.Tensor,
    chunk: int,
    mask: ActionMask | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log pi(actions|s) [B], H(pi(.|s)) [B]) for embeddings ``u`` [B, k] and int64 ``actions``
    [B]; chunked when the head has more than ``chunk`` actions (module docstring)."""
    if head.n > chunk:
        lse, entropy = logsumexp_entropy(head, u, chunk, mask)
        return head.score_actions(u, actions) - lse, entropy
    logits = torch.nn.functional.linear(u, head.table(), head.bias())  # [B, n]
    if mask is not None:
        logits = logits.masked_fill(~mask.chunk(0, head.n), float("-inf"))
    logp_all = torch.log_softmax(logits, dim=1)  # [B, n]
    finite = logp_all if mask is None else logp_all.masked_fill(~mask.chunk(0, head.n), 0.0)
    entropy = -(logp_all.exp() * finite).sum(1)  # [B]; 0 log 0 = 0 for masked actions
    return logp_all.gather(1, actions[:, None]).squeeze(1), entropy
