"""PPO's written-out gradient on a real GPU (marker ``gpu``; skipped without CUDA): on CUDA
the trunks use torch.tanh and Adam's fused CUDA kernel; the update must equal the autograd
update on the same device (tests/agents/test_ppo_grad.py runs the same comparison on CPU)."""

from __future__ import annotations

import pytest
import torch

from rlstash.agents.ppo_grad import PPOGrad
from tests.agents.test_ppo_grad import _assert_same, _pair, _rollout

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("continuous", [0, 2], ids=["categorical", "gaussian"])
def test_written_update_equals_autograd_on_cuda(continuous):
    a, b = _pair(continuous=continuous, ent_coef=0.01, clip_range_vf=0.1)
    a, b = a.to("cuda"), b.to("cuda")
    assert isinstance(b.written_grad(), PPOGrad) and a.written_grad() is None
    for seed in range(3):
        ro = _rollout(continuous=continuous, invalid=seed == 1, seed=seed).to("cuda")
        out_a, out_b = a.update(ro), b.update(ro)
    torch.cuda.synchronize()
    for key in ("policy_loss", "value_loss", "approx_kl", "grad_norm"):
        assert float(out_b[key]) == pytest.approx(float(out_a[key]), rel=1e-3, abs=1e-5), key
    assert b.groups["policy"].flat.param.device.type == "cuda"
    _assert_same(a, b, atol=1e-4)
