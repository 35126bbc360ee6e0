"""FlatParams: one vector behind a module's parameters gives the same training step."""

import pytest
import torch
from torch import nn

from rlstash.agents.compiled import skip_capture_check
from rlstash.agents.flat import FlatParams


def _net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))


def _loss(net, x):
    return (net(x) ** 2).sum() * 10


def test_a_flat_step_equals_per_parameter_adam_with_clipping():
    x = torch.randn(16, 3)
    ref, flat_net = _net(), _net()
    opt_ref = torch.optim.Adam(ref.parameters(), lr=1e-2, eps=1e-5)
    flat = FlatParams(flat_net)
    opt = torch.optim.Adam([flat.param], lr=1e-2, eps=1e-5)
    for o in (opt_ref, opt):  # CPU optimizers: no CUDA question (a CUDA build asks each step)
        skip_capture_check(o)
    for _ in range(3):
        opt_ref.zero_grad()
        _loss(ref, x).backward()
        norm_ref = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
        opt_ref.step()
        flat.zero_grad()
        flat_net.zero_grad(set_to_none=True)  # cannot detach the views: zero_grad re-attaches
        flat.zero_grad()
        _loss(flat_net, x).backward()
        norm = flat.clip_grad_norm_(0.5)
        opt.step()
        torch.testing.assert_close(norm, norm_ref)
    for a, b in zip(ref.parameters(), flat_net.parameters()):
        torch.testing.assert_close(a, b)
    assert flat.params[0].data_ptr() == flat.param.data_ptr()  # views of the flat vector


def test_state_dict_loads_in_place_and_errors():
    net = _net()
    flat = FlatParams(net)
    net.load_state_dict(_net(seed=1).state_dict())
    torch.testing.assert_close(flat.param[: 8 * 3], _net(seed=1)[0].weight.reshape(-1))
    with pytest.raises(ValueError, match="no trainable parameters"):
        FlatParams(nn.Tanh())
