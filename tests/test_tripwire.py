"""The tripwire itself must trip, or every I1 test would pass vacuously."""

import pytest
import torch

from tests.conftest import CudaTripped


@pytest.mark.parametrize(
    "call",
    [
        lambda: torch.cuda.synchronize(),
        lambda: torch.cuda.is_available(),
        lambda: torch.cuda.current_stream(),
        lambda: torch.cuda.Event(),
        lambda: torch.cuda.mem_get_info(),
        lambda: torch.zeros(2).cuda(),
        lambda: torch.zeros(2).pin_memory(),
        lambda: torch.zeros(2).to("cuda"),
        lambda: torch.zeros(2).to(torch.device("cuda", 0)),
        lambda: torch.empty(2, pin_memory=True),
        lambda: torch.zeros(2, device="cuda"),
    ],
)
def test_tripwire_trips(call):
    with pytest.raises(CudaTripped):
        call()


def test_cpu_work_passes_tripwire():
    x = torch.zeros(3).to("cpu").to(torch.float64)
    assert x.sum().item() == 0.0
    torch.manual_seed(0)  # seeding is lazy for CUDA and must stay allowed


def _asked(*args, **kwargs):
    raise CudaTripped("the optimizer asked CUDA whether a graph is being captured")


@pytest.mark.parametrize("algo", ["dqn", "sac", "td3", "sac_discrete", "ppo", "mappo", "qmix"])
def test_a_cpu_update_asks_cuda_nothing_on_a_cuda_build(algo, monkeypatch):
    """A CUDA build of torch on a GPU machine asks, at every optimizer step, whether the
    current CUDA stream is capturing a graph (seen on an H100, issue 28: the CPU agents tripped
    the tripwire there, in their first update). Simulated here: CUDA is "available" and the
    question trips. rlstash's CPU optimizers must not ask it (compiled.skip_capture_check)."""
    from tests.agents.test_compiled import AGENTS
    from tests.agents.test_ppo import N_ACT, _rollout

    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", _asked, raising=False)
    if hasattr(torch, "accelerator"):
        monkeypatch.setattr(
            torch.accelerator, "current_accelerator", lambda *a, **k: torch.device("cuda")
        )
        monkeypatch.setattr(torch.accelerator, "current_stream", _asked)
    if algo in AGENTS:
        make, batch_of = AGENTS[algo]
        agent = make(False)
        for i in range(2):
            agent.update(batch_of(i))
        return
    if algo == "ppo":
        from rlstash.agents.ppo import PPO, PPOConfig

        agent = PPO((3,), N_ACT, config=PPOConfig(net_arch=(8,), minibatch_size=8, n_epochs=1))
        agent.update(_rollout())
    elif algo == "mappo":
        from tests.marl.test_mappo_compiled import CASES, _agent, _data

        agent = _agent(sorted(CASES)[0], compile=False)
        agent.learn(_data(agent, 0))
    else:
        from tests.marl.test_qmix import _agent as qmix_agent
        from tests.marl.test_qmix import _batch

        agent = qmix_agent("qmix")
        agent.update(_batch(0))
