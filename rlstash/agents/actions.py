"""Huge discrete action spaces: availability masks, chunked reductions, action heads.

Actions are int64 indices everywhere; nothing here builds a one-hot tensor. Scores over all
``n`` actions are produced ``chunk`` columns at a time by a *score function*
``score_fn(start, stop) -> [B, stop - start]``, and every reduction over actions (argmax,
logsumexp, softmax expectations, sampling) streams over those chunks, so the extra memory of
one reduction is O(B * chunk), whatever n is (10^6 actions: a few [B, chunk] tensors).

Action heads score a state embedding against an action table without a [B, n, d] tensor::

    u = head.project(z)                       # [B, k]  state embedding (differentiable)
    scores[:, a] = u . table[a] + bias[a]     # table [n, k], bias [n] or None

``LinearActionHead`` is the usual last linear layer (table = its weight). ``EmbeddingActionHead``
scores against per-action feature vectors: a fixed table (``ActionFeatures``, shared by all
networks and held once per device) entering through a learned linear map of the state
(u . f_a == z . (P f_a), i.e. the features projected by P), or a learned table.

Masks: ``None`` means every action is available (and costs nothing); otherwise a bool [B, n]
tensor or packed bits uint8 [B, ceil(n/8)] in numpy.packbits order (action 8k+j is bit 7-j of
byte k). Masked actions are never chosen, never sampled, and get probability 0 in expectations.
A row without any available action has value 0 (treated as terminal) and entropy 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import nn

ScoreFn = Callable[[int, int], torch.Tensor]  # (start, stop) -> [B, stop - start]


# --- masks ---------------------------------------------------------------------------------


def pack_mask(mask: torch.Tensor) -> torch.Tensor:
    """bool [B, n] -> uint8 [B, ceil(n/8)] (numpy.packbits order, padding bits 0)."""
    if mask.dtype != torch.bool or mask.dim() != 2:
        raise TypeError(f"mask: expected a bool tensor [B, n], got {mask.dtype} {list(mask.shape)}")
    rows, n = mask.shape
    padded = torch.nn.functional.pad(mask.to(torch.uint8), (0, (-n) % 8)).view(rows, -1, 8)
    weights = torch.pow(2, torch.arange(7, -1, -1, device=mask.device)).to(torch.uint8)  # [8]
    return (padded * weights).sum(-1, dtype=torch.uint8)  # [B, ceil(n/8)]


class ActionMask:
    """Available actions per row, read a chunk at a time (bool [B, n] or packed uint8)."""

    def __init__(self, mask: torch.Tensor, n: int, name: str = "mask", rows: int | None = None):
        if not isinstance(mask, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(mask).__name__}")
        nbytes = (n + 7) // 8
        if mask.dtype == torch.bool:
            width, self.packed = n, False
        elif mask.dtype == torch.uint8:
            width, self.packed = nbytes, True
        else:
            raise TypeError(
                f"{name}: expected bool [B, {n}] or packed uint8 [B, {nbytes}], got {mask.dtype}"
            )
        if (
            mask.dim() != 2
            or mask.shape[1] != width
            or (rows is not None and mask.shape[0] != rows)
        ):
            want = f"[{rows if rows is not None else 'B'}, {width}]"
            raise ValueError(
                f"{name}: expected shape {want} ({mask.dtype}), got {list(mask.shape)}"
            )
        self.mask, self.n, self.rows = mask, n, mask.shape[0]

    @classmethod
    def of(
        cls,
        mask: torch.Tensor | ActionMask | None,
        n: int,
        name: str = "mask",
        rows: int | None = None,
    ) -> ActionMask | None:
        """None stays None (all available); a tensor is validated and wrapped."""
        if mask is None or isinstance(mask, ActionMask):
            return mask
        return cls(mask, n, name=name, rows=rows)

    def chunk(self, start: int, stop: int) -> torch.Tensor:
        """bool [B, stop - start]: which of actions start..stop-1 are available."""
        if not self.packed:
            return self.mask[:, start:stop]
        raw = self.mask[:, start // 8 : (stop + 7) // 8]  # [B, nb] uint8
        shifts = torch.arange(7, -1, -1, device=raw.device, dtype=torch.uint8)  # [8]
        bits = (raw.unsqueeze(-1) >> shifts) & 1  # [B, nb, 8]
        offset = start % 8
        return bits.view(self.rows, -1)[:, offset : offset + stop - start].bool()

    def count(self, chunk: int = 65536) -> torch.Tensor:
        """int64 [B]: available actions per row."""
        total = torch.zeros(self.rows, dtype=torch.int64, device=self.mask.device)
        for start, stop in chunk_ranges(self.n, chunk):
            total += self.chunk(start, stop).sum(1)
        return total

    def contains(self, actions: torch.Tensor) -> torch.Tensor:
        """bool [B]: whether ``actions[i]`` is available in row i."""
        rows = torch.arange(self.rows, device=actions.device)
        if not self.packed:
            return self.mask[rows, actions]
        byte = self.mask[rows, actions // 8]  # [B] uint8
        return ((byte >> (7 - actions % 8).to(torch.uint8)) & 1).bool()


def chunk_ranges(n: int, chunk: int) -> list[tuple[int, int]]:
    """[(0, chunk), (chunk, 2 chunk), ..., (., n)]."""
    if chunk <= 0:
        raise ValueError(f"chunk: expected > 0 actions per chunk, got {chunk}")
    return [(start, min(start + chunk, n)) for start in range(0, n, chunk)]


def _masked(scores: torch.Tensor, mask: ActionMask | None, start: int, stop: int) -> torch.Tensor:
    if mask is None:
        return scores
    return scores.masked_fill(~mask.chunk(start, stop), float("-inf"))


# --- reductions ----------------------------------------------------------------------------


def chunked_argmax(
    score_fn: ScoreFn, n: int, chunk: int, mask: ActionMask | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(max [B], argmax [B] int64) over available actions; ties go to the lowest index.

    A row without available actions gets (-inf, 0)."""
    best_v = best_i = None
    for start, stop in chunk_ranges(n, chunk):
        scores = _masked(score_fn(start, stop), mask, start, stop)  # [B, c]
        v, i = scores.max(dim=1)  # [B], [B]
        i = i + start
        if best_v is None:
            best_v, best_i = v, i
        else:
            better = v > best_v
            best_v, best_i = torch.where(better, v, best_v), torch.where(better, i, best_i)
    return best_v, best_i


class SoftmaxStats(NamedTuple):
    """Streaming statistics of p = softmax(logits) over the available actions, per row [B]."""

    lse: torch.Tensor  # log sum_a exp(l_a); -inf where no action is available
    mean_logit: torch.Tensor  # E_p[l]
    mean_value: torch.Tensor  # E_p[v] (0 when no value_fn was given)
    entropy: torch.Tensor  # H(p) = lse - E_p[l] = -E_p[log p]; 0 where no action


def softmax_stats(
    logit_fn: ScoreFn,
    n: int,
    chunk: int,
    mask: ActionMask | None = None,
    value_fn: ScoreFn | None = None,
) -> SoftmaxStats:
    """One streaming pass (online softmax): running max m, and the sums S = sum e^(l-m),
    S_l = sum e^(l-m) l, S_v = sum e^(l-m) v, rescaled by e^(m_old - m_new) when m grows.
    Then lse = m + log S, E_p[l] = S_l / S, E_p[v] = S_v / S. Memory O(B * chunk)."""
    m = s = s_l = s_v = None
    for start, stop in chunk_ranges(n, chunk):
        logits = logit_fn(start, stop)  # [B, c]
        masked = _masked(logits, mask, start, stop)  # [B, c], -inf where unavailable
        c_max = masked.max(dim=1).values  # [B]
        new_m = c_max if m is None else torch.maximum(m, c_max)
        safe_m = torch.where(torch.isfinite(new_m), new_m, torch.zeros_like(new_m))  # [B]
        e = torch.exp(masked - safe_m[:, None])  # [B, c], 0 where unavailable
        c_s, c_l = e.sum(1), (e * logits).sum(1)
        c_v = (e * value_fn(start, stop)).sum(1) if value_fn is not None else torch.zeros_like(c_s)
        if m is None:
            s, s_l, s_v = c_s, c_l, c_v
        else:
            scale = torch.exp(m - safe_m)  # [B]; 0 when the old max was -inf
            s, s_l, s_v = s * scale + c_s, s_l * scale + c_l, s_v * scale + c_v
        m, m_safe = new_m, safe_m
    some = s > 0
    denom = torch.where(some, s, torch.ones_like(s))
    lse = torch.where(some, m_safe + torch.log(denom), torch.full_like(s, float("-inf")))
    mean_logit = torch.where(some, s_l / denom, torch.zeros_like(s))
    mean_value = torch.where(some, s_v / denom, torch.zeros_like(s))
    entropy = torch.where(some, lse - mean_logit, torch.zeros_like(s))
    return SoftmaxStats(lse, mean_logit, mean_value, entropy)


def chunked_logsumexp(
    logit_fn: ScoreFn, n: int, chunk: int, mask: ActionMask | None = None
) -> torch.Tensor:
    """log sum_{a available} exp(l_a), [B]; -inf for a row without available actions."""
    return softmax_stats(logit_fn, n, chunk, mask).lse


def gumbel_noise(
    shape: tuple[int, ...], generator: torch.Generator, device: torch.device
) -> torch.Tensor:
    """G = -log(-log U), U ~ Uniform(0, 1) from ``generator``: standard Gumbel noise."""
    u = torch.rand(shape, generator=generator, device=device).clamp_min_(1e-20)
    return -torch.log(-torch.log(u))


def gumbel_scores(logit_fn: ScoreFn, generator: torch.Generator) -> ScoreFn:
    """l_a + G_a with G_a = -log(-log U_a), U_a ~ Uniform(0, 1) from ``generator``: the argmax of
    these scores is a sample of softmax(l) (the Gumbel-max trick), chunk by chunk."""

    def noisy(start: int, stop: int) -> torch.Tensor:
        logits = logit_fn(start, stop)  # [B, c]
        return logits + gumbel_noise(tuple(logits.shape), generator, logits.device)

    return noisy


def sample_softmax(
    logit_fn: ScoreFn,
    n: int,
    chunk: int,
    generator: torch.Generator,
    mask: ActionMask | None = None,
) -> torch.Tensor:
    """a ~ softmax(l) over available actions, [B] int64: argmax of :func:`gumbel_scores`."""
    return chunked_argmax(gumbel_scores(logit_fn, generator), n, chunk, mask)[1]


def sample_uniform(
    rows: int,
    n: int,
    chunk: int,
    generator: torch.Generator,
    device: torch.device,
    mask: ActionMask | None = None,
) -> torch.Tensor:
    """a ~ Uniform(available actions), [B] int64 (randint without a mask; otherwise the
    argmax of i.i.d. uniform scores over available actions, in chunks)."""
    if mask is None:
        return torch.randint(0, n, (rows,), generator=generator, device=device)

    def noise(start: int, stop: int) -> torch.Tensor:
        return torch.rand((rows, stop - start), generator=generator, device=device)

    return chunked_argmax(noise, n, chunk, mask)[1]


# --- action heads --------------------------------------------------------------------------


class ActionFeatures:
    """A fixed per-action feature table [n, f], shared by every network that scores against it.

    Not a module buffer: deep copies (target networks) share it, and it is held once per
    device (``on(device)`` caches one copy per device). It is not part of state dicts; build
    the agent with the same table to resume."""

    def __init__(self, table: torch.Tensor):
        if not isinstance(table, torch.Tensor) or table.dim() != 2 or not table.is_floating_point():
            got = (
                f"{table.dtype} {list(table.shape)}"
                if isinstance(table, torch.Tensor)
                else type(table).__name__
            )
            raise TypeError(f"action_features: expected a float tensor [n_actions, dim], got {got}")
        self.table = table.detach()
        self.n, self.dim = table.shape
        self._copies: dict[torch.device, torch.Tensor] = {table.device: self.table}

    def on(self, device: torch.device) -> torch.Tensor:
        if device not in self._copies:
            self._copies[device] = self.table.to(device)
        return self._copies[device]

    def __deepcopy__(self, memo: dict) -> ActionFeatures:
        return self


class ActionHead(nn.Module):
    """scores(z)[:, a] = project(z) . table[a] + bias[a], computed a chunk at a time."""

    n: int

    def project(self, z: torch.Tensor) -> torch.Tensor:  # [B, d] -> [B, k]
        raise NotImplementedError

    def table(self) -> torch.Tensor:  # [n, k]
        raise NotImplementedError

    def bias(self) -> torch.Tensor | None:  # [n] or None
        return None

    def scores(self, u: torch.Tensor, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """[B, stop - start] scores of actions start..stop-1 for embeddings ``u`` [B, k]."""
        out = u @ self.table()[start:stop].T  # [B, c]
        bias = self.bias()
        return out if bias is None else out + bias[start:stop]

    def score_actions(self, u: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """[B] score of ``actions[i]`` (int64 [B]) in row i: a gather, no [B, n] tensor."""
        out = (u * self.table().index_select(0, actions)).sum(-1)  # [B]
        bias = self.bias()
        return out if bias is None else out + bias.index_select(0, actions)

    def score_fn(self, u: torch.Tensor) -> ScoreFn:
        return lambda start, stop: self.scores(u, start, stop)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """All scores [B, n] at once: for small n only (huge n: use the chunked reductions)."""
        return self.scores(self.project(z))


class LinearActionHead(ActionHead):
    """The usual last linear layer z -> W z + b with W [n, d] (same init as nn.Linear)."""

    def __init__(self, in_dim: int, n: int):
        super().__init__()
        self.n = n
        self.weight = nn.Parameter(torch.empty(n, in_dim))
        self.bias_ = nn.Parameter(torch.empty(n))
        bound = 1.0 / math.sqrt(in_dim)
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # = nn.Linear's init
        nn.init.uniform_(self.bias_, -bound, bound)

    def project(self, z: torch.Tensor) -> torch.Tensor:
        return z

    def table(self) -> torch.Tensor:
        return self.weight

    def bias(self) -> torch.Tensor | None:
        return self.bias_


class EmbeddingActionHead(ActionHead):
    """Scores against per-action vectors: u = P z + p (learned), score_a = u . e_a.

    ``features`` given and ``learn=False``: e_a are the fixed features (no per-network copy).
    ``features`` given and ``learn=True``: e_a start from the features and are learned.
    No ``features``: e_a are learned vectors of size ``embed_dim`` (N(0, 1/embed_dim) init)."""

    def __init__(
        self,
        in_dim: int,
        n: int,
        embed_dim: int = 64,
        features: ActionFeatures | None = None,
        learn: bool = True,
    ):
        super().__init__()
        if features is not None and features.n != n:
            raise ValueError(
                f"action_features: expected {n} rows (one per action), got {features.n}"
            )
        if features is None and not learn:
            raise ValueError("learn_action_embeddings: False needs action_features (a fixed table)")
        self.n = n
        dim = features.dim if features is not None else embed_dim
        self.proj = nn.Linear(in_dim, dim)
        self.features = None if learn else features
        self.weight: nn.Parameter | None = None
        if learn:
            init = (
                features.table.clone()
                if features is not None
                else torch.randn(n, dim) / math.sqrt(dim)
            )
            self.weight = nn.Parameter(init.float())

    def project(self, z: torch.Tensor) -> torch.Tensor:
        return self.proj(z)

    def table(self) -> torch.Tensor:
        if self.weight is not None:
            return self.weight
        return self.features.on(self.proj.weight.device)


# --- the discrete-SAC policy objective, memory-efficient -----------------------------------


class _SoftPolicyObjective(torch.autograd.Function):
    """J(s) = sum_a p_a (alpha log p_a - q_a), p = softmax(l), l_a = u . T_a + b_a (available a).

    Gradient: dJ/dl_j = p_j (alpha log p_j - q_j - J) (the alpha * sum_a p_a dlog p_a/dl_j terms
    cancel), so backward recomputes l and q chunk by chunk and never holds [B, n]:
    grad_u += g_c T_c, grad_T[c] = g_c^T u, grad_b[c] = sum_B g_c with g_c = dJ/dl_c [B, c].
    """

    @staticmethod
    def forward(ctx, u, table, bias, alpha, q_fn, chunk, mask):  # noqa: ANN001
        n = table.shape[0]

        def logit_fn(start: int, stop: int) -> torch.Tensor:
            out = u @ table[start:stop].T
            return out if bias is None else out + bias[start:stop]

        stats = softmax_stats(logit_fn, n, chunk, mask, value_fn=q_fn)
        objective = -alpha * stats.entropy - stats.mean_value  # [B]
        ctx.save_for_backward(u, table, bias, stats.lse, objective)
        ctx.extra = (alpha, q_fn, chunk, mask)
        ctx.mark_non_differentiable(stats.entropy)
        return objective, stats.entropy

    @staticmethod
    def backward(ctx, grad_j, _grad_h):  # noqa: ANN001
        u, table, bias, lse, objective = ctx.saved_tensors
        alpha, q_fn, chunk, mask = ctx.extra
        need_u, need_t, need_b = ctx.needs_input_grad[:3]
        grad_u = torch.zeros_like(u) if need_u else None
        grad_t = torch.zeros_like(table) if need_t else None
        grad_b = torch.zeros_like(bias) if (need_b and bias is not None) else None
        lse = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))[:, None]  # [B, 1]
        with torch.no_grad():
            for start, stop in chunk_ranges(table.shape[0], chunk):
                t_c = table[start:stop]  # [c, k]
                logits = u @ t_c.T if bias is None else u @ t_c.T + bias[start:stop]  # [B, c]
                p = torch.exp(_masked(logits, mask, start, stop) - lse)  # [B, c], 0 if masked
                f = alpha * (logits - lse) - q_fn(start, stop)  # [B, c]
                g = p * (f - objective[:, None]) * grad_j[:, None]  # [B, c] = dJ/dl * dL/dJ
                if grad_u is not None:
                    grad_u += g @ t_c
                if grad_t is not None:
                    grad_t[start:stop] = g.T @ u
                if grad_b is not None:
                    grad_b[start:stop] = g.sum(0)
        return grad_u, grad_t, grad_b, None, None, None, None


def soft_policy_objective(
    head: ActionHead,
    u: torch.Tensor,
    q_fn: ScoreFn,
    alpha: torch.Tensor | float,
    chunk: int,
    mask: ActionMask | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(J [B], entropy [B]) with J(s) = E_{a~pi(.|s)}[alpha log pi(a|s) - Q(s, a)] exactly over
    all available actions; differentiable in ``u`` and the head's table and bias, constant in
    ``q_fn`` (evaluated without grad) and ``alpha`` (a float, or a 0-dim tensor on ``u``'s
    device: then nothing is read back to the host).

    Peak extra memory: forward and backward keep a few [B, chunk] tensors at a time, plus the
    gradient of the head's table (the size of the table, as any backward allocates) — never
    [B, n]. Backward recomputes the chunk scores (twice the scoring FLOPs of one pass)."""
    alpha = alpha.detach() if isinstance(alpha, torch.Tensor) else float(alpha)
    return _SoftPolicyObjective.apply(u, head.table(), head.bias(), alpha, q_fn, chunk, mask)
