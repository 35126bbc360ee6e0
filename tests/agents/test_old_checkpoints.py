"""Checkpoints written before the flat optimizer (issue 15) still load: their Adam states are
per parameter (``torch.optim.Adam`` over each module's parameters), the agents' now one flat
vector per group; loading converts them (moments concatenated in parameter order, the step)."""

from __future__ import annotations

import pytest
import torch

from tests.agents.test_compiled import AGENTS, assert_same_agents

# the torch factories unwrapped (tripwire still on) for every test here, not only the compiled
# ones: after an eager test ran with the wrapped ones, Dynamo refused torch.zeros_like in the
# compiled test as a "skipped" function
pytestmark = pytest.mark.usefixtures("no_cuda")


def _old_format(agent) -> tuple[dict, dict]:
    """(the agent's state dict with every optimizer in the old per-parameter format, group ->
    (the old parameters, the old optimizer)). The first group took 3 Adam steps, the second 2,
    any further one none (its old state is empty, as before a first update)."""
    state = agent.state_dict()
    old = {}
    g = torch.Generator().manual_seed(7)
    for i, (key, group) in enumerate(agent.groups.items()):
        params = [torch.nn.Parameter(p.detach().clone()) for p in group.flat.params]
        opt = torch.optim.Adam(params, lr=3e-4, fused=True)
        for _ in range(max(3 - i, 0)):
            for p in params:
                p.grad = torch.randn(p.shape, generator=g)
            opt.step()
        assert len(opt.state_dict()["param_groups"][0]["params"]) == len(params)
        state["optims"][key] = opt.state_dict()
        old[key] = (params, opt)
    return state, old


@pytest.mark.parametrize("name", sorted(AGENTS))
def test_a_per_parameter_adam_state_loads_and_steps_as_before(name):
    make, _ = AGENTS[name]
    agent = make(False)
    state, old = _old_format(agent)
    agent.load_state_dict(state)
    g = torch.Generator().manual_seed(8)
    for key, group in agent.groups.items():
        params, opt = old[key]
        with torch.no_grad():
            for p, now in zip(params, group.flat.params):
                p.copy_(now)  # the same weights; the moments and step count are the converted
        grads = [torch.randn(p.shape, generator=g) for p in params]
        for p, grad in zip(params, grads):
            p.grad = grad.clone()
        opt.step()  # the old optimizer's next step ...
        group.flat.zero_grad()
        group.flat.grad.copy_(torch.cat([grad.reshape(-1) for grad in grads]))
        group.opt.step()  # ... is the flat one's, from the converted state
        for p, now in zip(params, group.flat.params):
            torch.testing.assert_close(now.detach(), p.detach(), msg=key)


@pytest.mark.parametrize("name", ["sac", "dqn"])
def test_an_old_checkpoint_trains_on_eagerly_and_compiled_alike(name, aot_eager):
    make, batch_of = AGENTS[name]
    state, _ = _old_format(make(False))
    eager, comp = make(False), make(True)
    eager.load_state_dict(state)
    comp.load_state_dict(state)
    for i in range(3):
        eager.update(batch_of(i))
        comp.update(batch_of(i))
    assert_same_agents(eager, comp)


def test_an_optimizer_state_of_another_layout_is_refused():
    make, _ = AGENTS["sac"]
    agent = make(False)
    state = agent.state_dict()
    extra = [torch.nn.Parameter(torch.zeros(3)) for _ in range(2)]
    state["optims"]["actor"] = torch.optim.Adam(extra).state_dict()
    with pytest.raises(ValueError, match=r"state\['optims'\]\['actor'\]: the optimizer state"):
        agent.load_state_dict(state)
