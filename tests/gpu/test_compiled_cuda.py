"""Compiled and CUDA-graphed agent updates on a real GPU (marker ``gpu``; skipped without CUDA).

With ``compile=True`` on CUDA every update step is compiled (inductor) and captured once into
a CUDA graph, then replayed (:class:`rlstash.agents.compiled.GraphedStep`); SAC's and TD3's
exploration step too (DQN's, SAC's, discrete SAC's, TD3's, PPO's). The graphed agent must keep the eager agent's parameters after N
updates from the same state, and act alike. (CPU CI runs the same logic with a fake graph:
tests/agents/test_compiled.py.)
"""

from __future__ import annotations

import pytest
import torch

from rlstash.agents.ppo import PPO, PPOConfig
from tests.agents.test_compiled import AGENTS, SMALL, _continuous, assert_same_agents
from tests.gpu.test_offline_cuda import AGENTS as OFFLINE

pytestmark = pytest.mark.gpu

ACTORS = {  # PPO's discrete and Gaussian policies (compile: bool)
    "ppo": lambda c: PPO((3,), 5, config=PPOConfig(net_arch=SMALL, compile=c)),
    "ppo_gaussian": lambda c: PPO(
        (3,), bounds=(-torch.ones(2), torch.ones(2)), config=PPOConfig(net_arch=SMALL, compile=c)
    ),
}


def _to_cuda(batch: dict) -> dict:
    return {k: v.cuda() for k, v in batch.items()}


UPDATES = {**AGENTS, **{name: (make, _continuous) for name, make in OFFLINE.items()}}


@pytest.mark.parametrize("name", sorted(UPDATES))
def test_graphed_update_equals_eager_on_cuda(name):
    make, batch_of = UPDATES[name]
    eager, graphed = make(False).to("cuda"), make(True).to("cuda")
    graphed.load_state_dict(eager.state_dict())
    for i in range(8):  # 2 warm-up calls, a capture, replays
        batch = _to_cuda(batch_of(i % 3))
        out_e, out_g = eager.update(batch), graphed.update(batch)
    torch.cuda.synchronize()
    assert graphed.updates == eager.updates == 8 and graphed.compile_seconds > 0
    assert_same_agents(eager, graphed, atol=1e-4)
    for key in ("td_error", "critic_loss", "actor_loss"):  # what each agent reports of these
        if key in out_e:
            torch.testing.assert_close(out_g[key], out_e[key], atol=1e-4, rtol=1e-3, msg=key)


@pytest.mark.parametrize("name", ["dqn", "sac", "sac_discrete", "td3", "ppo", "ppo_gaussian"])
def test_graphed_act_equals_eager_on_cuda(name):
    make = ACTORS[name] if name.startswith("ppo") else AGENTS[name][0]
    eager, graphed = make(False).to("cuda"), make(True).to("cuda")
    graphed.load_state_dict(eager.state_dict())
    eager.env_steps = graphed.env_steps = 10_000  # past TD3's uniform warm-up
    if name == "sac_discrete":  # its actions in one chunk: the graphed path
        eager.config.action_chunk = graphed.config.action_chunk = 64
    obs = torch.randn(4, *eager.obs_shape, device="cuda")
    for _ in range(5):
        torch.testing.assert_close(graphed.act(obs), eager.act(obs), atol=1e-5, rtol=1e-4)
    assert "act-4" in graphed._steps
