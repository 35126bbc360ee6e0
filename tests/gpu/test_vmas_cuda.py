"""VMAS on CUDA through rlstash (marker ``gpu``; skipped without CUDA or VMAS): observations,
rewards, dones and the rollout stay on the GPU, and a MAPPO update runs there."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
vmas = pytest.importorskip("vmas", reason="VMAS is an optional extra: pip install 'rlstash[vmas]'")

from rlstash.agents.mappo import MAPPO, MAPPOConfig  # noqa: E402
from rlstash.collect.multiagent import MultiAgentCollector  # noqa: E402
from rlstash.envs.vmas import VmasVectorEnv  # noqa: E402
from rlstash.storage.marl_rollout import MultiAgentRollout  # noqa: E402


def test_vmas_collection_and_update_stay_on_the_gpu() -> None:
    dev = torch.device("cuda")
    env = VmasVectorEnv("navigation", 64, dev, seed=0, max_steps=8, n_agents=3)
    try:
        step = env.reset(seed=0)
        assert step.obs["agents"].device.type == "cuda"
        space = env.action_spaces["agents"]
        D = env.observation_spaces["agents"].shape[0]
        agent = MAPPO(3, D, bounds=(space.low, space.high),
                      config=MAPPOConfig(net_arch=(32,), n_epochs=1, minibatch_size=64),
                      device=dev)  # fmt: skip
        rollout = MultiAgentRollout(10, 64, 3, D, (2,), device=dev)
        collector = MultiAgentCollector(env, seed=0)
        collector.collect(agent, rollout)  # crosses an episode end (max_steps 8)
        for t in (rollout.obs, rollout.reward, rollout.final_value, rollout.mask):
            assert t.device.type == "cuda"
        assert bool((rollout.final_value[7] != 0).any())
        metrics = agent.update(rollout)
        assert all(v.device.type == "cuda" for v in metrics.values())
        assert collector.stats.count == 64
    finally:
        env.close()
