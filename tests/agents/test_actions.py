"""Chunked reductions over actions equal their unchunked references (values and gradients)."""

import copy

import numpy as np
import pytest
import torch

from rlstash.agents.actions import (
    ActionFeatures,
    ActionMask,
    EmbeddingActionHead,
    LinearActionHead,
    chunk_ranges,
    chunked_argmax,
    chunked_logsumexp,
    pack_mask,
    sample_softmax,
    sample_uniform,
    soft_policy_objective,
    softmax_stats,
)

N = 23  # not a multiple of any chunk size below
CHUNKS = [1, 3, 8, 10, 23, 100]


def _mask(rows, n, seed=0, empty_row=None):
    g = torch.Generator().manual_seed(seed)
    m = torch.rand(rows, n, generator=g) < 0.6
    m[:, 0] |= ~m.any(1)  # at least one available action per row...
    if empty_row is not None:
        m[empty_row] = False  # ...except this one
    return m


def _masks(rows, n, empty_row=None):
    m = _mask(rows, n, empty_row=empty_row)
    return [None, m, pack_mask(m)], m


def test_pack_mask_matches_numpy_packbits():
    m = _mask(5, 29)
    packed = pack_mask(m)
    assert packed.dtype == torch.uint8 and packed.shape == (5, 4)
    np.testing.assert_array_equal(packed.numpy(), np.packbits(m.numpy(), axis=1))


@pytest.mark.parametrize("n", [1, 7, 8, 9, 29])
def test_action_mask_chunks_count_contains(n):
    m = _mask(4, n)
    for mask in (ActionMask(m, n), ActionMask(pack_mask(m), n)):
        for start in range(n):
            for stop in range(start + 1, n + 1):
                assert torch.equal(mask.chunk(start, stop), m[:, start:stop])
        assert torch.equal(mask.count(chunk=3), m.sum(1))
        actions = torch.randint(0, n, (4,), generator=torch.Generator().manual_seed(n))
        assert torch.equal(mask.contains(actions), m[torch.arange(4), actions])


def test_action_mask_rejects_bad_input():
    with pytest.raises(TypeError, match="mask: expected bool"):
        ActionMask(torch.zeros(2, 10, dtype=torch.int64), 10)
    with pytest.raises(ValueError, match=r"expected shape \[B, 2\]"):
        ActionMask(torch.zeros(2, 10, dtype=torch.uint8), 10)  # 10 actions pack into 2 bytes
    with pytest.raises(ValueError, match=r"expected shape \[3, 10\]"):
        ActionMask(torch.zeros(2, 10, dtype=torch.bool), 10, rows=3)
    with pytest.raises(TypeError, match="expected a torch.Tensor"):
        ActionMask([[True]], 1)
    with pytest.raises(ValueError, match="chunk"):
        chunk_ranges(10, 0)


def _scores(rows=5, n=N, seed=1):
    return torch.randn(rows, n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("chunk", CHUNKS)
def test_chunked_argmax_matches_reference(chunk):
    scores = _scores()
    scores[1, 5] = scores[1, 17] = scores[1].max() + 1  # a tie: lowest index wins
    masks, m = _masks(5, N, empty_row=3)
    for mask in masks:
        am = ActionMask.of(mask, N)
        v, i = chunked_argmax(lambda s, e: scores[:, s:e], N, chunk, am)
        ref = scores if mask is None else scores.masked_fill(~m, float("-inf"))
        rows = [r for r in range(5) if mask is None or r != 3]
        assert torch.equal(i[rows], ref.argmax(1)[rows])
        assert torch.equal(v, ref.max(1).values)
        assert i[1] == 5
        if mask is not None:
            assert v[3] == float("-inf")


@pytest.mark.parametrize("chunk", CHUNKS)
def test_softmax_stats_match_reference(chunk):
    logits, values = _scores(seed=2) * 3, _scores(seed=3)
    masks, m = _masks(5, N, empty_row=2)
    for mask in masks:
        st = softmax_stats(
            lambda s, e: logits[:, s:e],
            N,
            chunk,
            ActionMask.of(mask, N),
            value_fn=lambda s, e: values[:, s:e],
        )
        avail = torch.ones_like(m) if mask is None else m
        masked = logits.masked_fill(~avail, float("-inf"))
        lse = torch.logsumexp(masked, 1)
        p = torch.softmax(masked, 1).nan_to_num(0.0)
        ok = avail.any(1)
        torch.testing.assert_close(st.lse, lse)
        torch.testing.assert_close(st.mean_value[ok], (p * values).sum(1)[ok])
        ent = -(p * torch.log_softmax(masked, 1)).nan_to_num(0.0).sum(1)
        torch.testing.assert_close(st.entropy[ok], ent[ok])
        torch.testing.assert_close(
            chunked_logsumexp(lambda s, e: logits[:, s:e], N, chunk, ActionMask.of(mask, N)), lse
        )
        if mask is not None:
            assert st.entropy[2] == 0 and st.mean_value[2] == 0 and st.lse[2] == float("-inf")


def _reference_objective(u, table, bias, q, alpha, avail):
    logits = u @ table.T + (0 if bias is None else bias)
    masked = logits.masked_fill(~avail, -1e30)  # finite: keeps autograd free of 0 * inf
    logp = torch.log_softmax(masked, 1)
    p = logp.exp()
    term = torch.where(avail, p * (alpha * logp - q), torch.zeros_like(p))
    ent = -torch.where(avail, p * logp, torch.zeros_like(p)).sum(1)
    return term.sum(1), ent


@pytest.mark.parametrize("chunk", [1, 4, 9, 23])
@pytest.mark.parametrize("masked", [None, "bool", "packed"])
@pytest.mark.parametrize("kind", ["linear", "learned", "fixed"])
def test_soft_policy_objective_values_and_gradients(chunk, masked, kind):
    torch.manual_seed(0)
    rows, d = 6, 5
    features = ActionFeatures(torch.randn(N, 4, dtype=torch.float64))
    if kind == "linear":
        head = LinearActionHead(d, N).double()
    else:
        head = EmbeddingActionHead(d, N, features=features, learn=(kind == "learned")).double()
    z = torch.randn(rows, d, dtype=torch.float64, requires_grad=True)
    q = torch.randn(rows, N, dtype=torch.float64)
    m = _mask(rows, N, seed=4)
    mask = {None: None, "bool": m, "packed": pack_mask(m)}[masked]
    avail = torch.ones_like(m) if masked is None else m
    weights = torch.rand(rows, dtype=torch.float64)  # a non-uniform upstream gradient

    ref_head = copy.deepcopy(head)
    z_ref = z.detach().clone().requires_grad_(True)
    j_ref, h_ref = _reference_objective(
        ref_head.project(z_ref), ref_head.table(), ref_head.bias(), q, 0.3, avail
    )
    (j_ref * weights).sum().backward()

    j, h = soft_policy_objective(
        head, head.project(z), lambda s, e: q[:, s:e], 0.3, chunk, ActionMask.of(mask, N)
    )
    (j * weights).sum().backward()
    torch.testing.assert_close(j, j_ref)
    torch.testing.assert_close(h, h_ref)
    torch.testing.assert_close(z.grad, z_ref.grad)
    for (name, p), p_ref in zip(head.named_parameters(), ref_head.parameters()):
        torch.testing.assert_close(p.grad, p_ref.grad, msg=name)
    if kind == "fixed":
        assert all(p.shape[0] != N for p in head.parameters())  # the table stays a constant


def test_soft_policy_objective_all_masked_row_has_zero_value_and_gradient():
    head = LinearActionHead(3, 10).double()
    z = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    m = torch.ones(2, 10, dtype=torch.bool)
    m[1] = False
    j, h = soft_policy_objective(
        head, z, lambda s, e: torch.ones(2, e - s, dtype=torch.float64), 0.5, 4, ActionMask(m, 10)
    )
    j.sum().backward()
    assert j[1] == 0 and h[1] == 0
    assert torch.equal(z.grad[1], torch.zeros(3, dtype=torch.float64))
    assert torch.isfinite(head.weight.grad).all()


def test_sample_softmax_follows_the_distribution_and_the_mask():
    n, rows = 6, 20_000
    logits = torch.tensor([0.0, 1.0, 2.0, -1.0, 0.5, 3.0])
    m = torch.tensor([True, True, False, True, True, False]).expand(rows, n)
    gen = torch.Generator().manual_seed(0)
    a = sample_softmax(
        lambda s, e: logits[s:e].expand(rows, -1), n, 4, gen, ActionMask(pack_mask(m), n)
    )
    assert a.dtype == torch.int64 and a.shape == (rows,)
    assert not m[0, a].logical_not().any()  # masked actions never sampled
    freq = torch.bincount(a, minlength=n).double() / rows
    want = torch.softmax(logits.masked_fill(~m[0], float("-inf")).double(), 0)
    torch.testing.assert_close(freq, want, atol=0.015, rtol=0)


def test_sample_uniform_respects_the_mask():
    n, rows = 50, 5000
    m = _mask(rows, n, seed=7)
    gen = torch.Generator().manual_seed(1)
    a = sample_uniform(rows, n, 16, gen, torch.device("cpu"), ActionMask(m, n))
    assert m[torch.arange(rows), a].all()
    full = sample_uniform(rows, n, 16, gen, torch.device("cpu"))
    assert full.min() >= 0 and full.max() < n and len(full.unique()) == n


def test_heads_gather_equals_full_scores_and_features_are_shared():
    torch.manual_seed(0)
    features = ActionFeatures(torch.randn(40, 6))
    for head in (
        LinearActionHead(5, 40),
        EmbeddingActionHead(5, 40, features=features, learn=False),
        EmbeddingActionHead(5, 40, embed_dim=7),
    ):
        u = head.project(torch.randn(8, 5))
        full = head.scores(u)  # [8, 40]
        actions = torch.randint(0, 40, (8,))
        torch.testing.assert_close(head.score_actions(u, actions), full[torch.arange(8), actions])
        torch.testing.assert_close(head.scores(u, 10, 17), full[:, 10:17])
    fixed = EmbeddingActionHead(5, 40, features=features, learn=False)
    assert copy.deepcopy(fixed).table() is fixed.table()  # target copies share one table
    assert "features" not in str(list(fixed.state_dict()))
    lin = LinearActionHead(5, 40)
    ref = torch.nn.Linear(5, 40)
    ref.weight.data.copy_(lin.weight.data)
    ref.bias.data.copy_(lin.bias_.data)
    z = torch.randn(3, 5)
    torch.testing.assert_close(lin(z), ref(z))


def test_head_construction_errors():
    with pytest.raises(ValueError, match="action_features: expected 10 rows"):
        EmbeddingActionHead(4, 10, features=ActionFeatures(torch.randn(9, 3)))
    with pytest.raises(ValueError, match="learn_action_embeddings"):
        EmbeddingActionHead(4, 10, learn=False)
    with pytest.raises(TypeError, match="action_features: expected a float tensor"):
        ActionFeatures(torch.zeros(10, dtype=torch.int64))
