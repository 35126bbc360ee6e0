"""Compiled updates (``config.compile``) give the eager update's parameters (issue 15).

Each agent runs N updates from the same state on the same batches, eagerly and compiled; every
network's parameters, the Adam state and the metrics must agree to float tolerance. The
compiled step is traced with ``fullgraph=True`` (a graph break, i.e. Python-side branching on
a tensor or a host read inside the step, is an error). These tests compile with the
``aot_eager`` backend (the same Dynamo and AOTAutograd tracing as inductor, without generating
C++: seconds instead of a minute on a busy CPU); one test per module runs inductor itself.
The CUDA-graph replay logic runs here against a fake graph (no GPU in CI); the real capture is
tests/gpu/test_compiled_cuda.py."""

from __future__ import annotations

import copy

import pytest
import torch

import rlstash.agents.compiled as compiled
from rlstash.agents.actions import pack_mask
from rlstash.agents.base import read_metrics
from rlstash.agents.compiled import FlatAdam, GraphedStep, adam_update, skip_capture_check
from rlstash.agents.dqn import DQN, DQNConfig
from rlstash.agents.ppo import PPO, PPOConfig
from rlstash.agents.sac import SAC, SACConfig
from rlstash.agents.sac_discrete import DiscreteSAC, DiscreteSACConfig
from rlstash.agents.td3 import TD3, TD3Config
from tests.agents.test_ppo import _rollout

B, SMALL = 16, (8, 8)


def _discrete(seed: int, n: int, masks: bool) -> dict:
    g = torch.Generator().manual_seed(seed)
    batch = {
        "obs": torch.randn(B, 4, generator=g),
        "action": torch.randint(0, n, (B,), generator=g),
        "reward": torch.randn(B, generator=g),
        "next_obs": torch.randn(B, 4, generator=g),
        "terminated": torch.rand(B, generator=g) < 0.2,
        "discount": torch.full((B,), 0.99**3),
        "weight": torch.rand(B, generator=g) + 0.5,
    }
    if masks:
        mask = torch.rand(B, n, generator=g) < 0.7
        mask[torch.arange(B), batch["action"]] = True
        batch["action_mask"], batch["next_action_mask"] = pack_mask(mask), mask
    return batch


def _continuous(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "obs": torch.randn(B, 3, generator=g),
        "action": 4 * torch.rand(B, 2, generator=g) - 2,  # the Box is [-2, 2]
        "reward": torch.randn(B, generator=g),
        "next_obs": torch.randn(B, 3, generator=g),
        "terminated": torch.rand(B, generator=g) < 0.2,
        "weight": torch.rand(B, generator=g) + 0.5,
    }


AGENTS = {  # name -> (make(compile), batch(seed))
    "dqn": (
        lambda c: DQN((4,), 5, DQNConfig(net_arch=SMALL, lr_schedule="linear", total_steps=100,
                                         target_update_interval=2, tau=0.5, compile=c)),
        lambda s: _discrete(s, 5, masks=True),
    ),
    "sac": (
        lambda c: SAC((3,), 2, -2.0, 2.0, SACConfig(net_arch=SMALL, max_grad_norm=1.0, tau=0.5,
                                                    target_update_interval=2, compile=c)),
        _continuous,
    ),
    "td3": (
        lambda c: TD3((3,), 2, -2.0, 2.0, TD3Config(net_arch=SMALL, policy_delay=2, tau=0.5,
                                                    compile=c)),
        _continuous,
    ),
    "sac_discrete": (
        lambda c: DiscreteSAC((4,), 7, DiscreteSACConfig(net_arch=SMALL, action_chunk=3, tau=0.5,
                                                         max_grad_norm=1.0, compile=c)),
        lambda s: _discrete(s, 7, masks=True),
    ),
}  # fmt: skip


def assert_same_agents(eager, comp, atol: float = 1e-5) -> None:
    """Every network's parameters and every optimizer's state agree."""
    for name, net in eager.nets.items():
        for (key, a), b in zip(net.state_dict().items(), comp.nets[name].state_dict().values()):
            torch.testing.assert_close(b, a, atol=atol, rtol=1e-4, msg=f"{name}.{key}")
    for name, group in eager.groups.items():
        for a, b in zip(group.state_tensors(), comp.groups[name].state_tensors()):
            torch.testing.assert_close(b, a, atol=atol, rtol=1e-4, msg=f"optimizer {name}")


def _run(make, batch_of, n: int) -> tuple:
    eager, comp = make(False), make(True)
    comp.load_state_dict(eager.state_dict())  # the same state (they are built alike anyway)
    for i in range(n):
        batch = batch_of(i % 3)
        out_e, out_c = eager.update(batch), comp.update(copy.copy(batch))
    return eager, comp, out_e, out_c


@pytest.mark.parametrize("name", sorted(AGENTS))
def test_compiled_update_equals_eager(name, aot_eager):
    torch._dynamo.utils.counters.clear()
    eager, comp, out_e, out_c = _run(*AGENTS[name], n=5)
    assert comp.updates == eager.updates == 5 and comp.compile_seconds > 0
    # one graph per step, whatever changed between updates (lr, Polyak weight, batch)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == len(comp._steps)
    assert eager.compile_seconds == 0
    assert_same_agents(eager, comp)
    logged_e, logged_c = read_metrics(out_e), read_metrics(out_c)
    assert logged_e.keys() == logged_c.keys()
    for key, value in logged_e.items():
        assert logged_c[key] == pytest.approx(value, rel=1e-4, abs=1e-5), key
    torch.testing.assert_close(out_c["td_error"], out_e["td_error"], atol=1e-5, rtol=1e-4)


@pytest.mark.slow
def test_compiled_sac_with_inductor_equals_eager(no_cuda):
    """The real backend (C++ from inductor): the arithmetic agrees after a few updates."""
    eager, comp, _, _ = _run(*AGENTS["sac"], n=3)
    assert_same_agents(eager, comp, atol=1e-4)


@pytest.mark.parametrize("continuous", [0, 2])
def test_compiled_ppo_equals_eager(continuous, aot_eager):
    cfg = dict(net_arch=SMALL, minibatch_size=10, n_epochs=2, anneal_lr=True,
               anneal_clip_range=True, total_steps=200, clip_range_vf=0.2)  # fmt: skip
    if continuous:
        make = lambda c: PPO((3,), bounds=(-torch.ones(2), torch.ones(2)),  # noqa: E731
                             config=PPOConfig(**cfg, compile=c))  # fmt: skip
    else:
        make = lambda c: PPO((3,), 5, config=PPOConfig(**cfg, compile=c))  # noqa: E731
    eager, comp = make(False), make(True)
    for seed in range(2):  # 24 rows in minibatches of 10, 10, 4: two sizes, two compilations
        rollout = _rollout(seed=seed, continuous=continuous)
        eager.env_steps = comp.env_steps = 50 * (seed + 1)  # annealing moves lr and clip
        out_e, out_c = eager.update(rollout), comp.update(rollout)
    assert_same_agents(eager, comp)
    assert sorted(comp._steps) == ["minibatch-10", "minibatch-4"]
    for key, value in read_metrics(out_e).items():
        assert read_metrics(out_c)[key] == pytest.approx(value, rel=1e-4, abs=1e-5), key


def test_compiled_update_reads_nothing_back(aot_eager):
    from tests.agents.test_host_reads import count_host_reads

    make, batch_of = AGENTS["sac"]
    agent = make(True)
    agent.update(batch_of(0))  # compiles
    with count_host_reads() as reads:
        for i in range(3):
            agent.update(batch_of(i))
    assert reads == []


def test_adam_update_is_torch_adam():
    g = torch.Generator().manual_seed(0)
    p0 = torch.randn(50, generator=g)
    ref = torch.nn.Parameter(p0.clone())
    opt = torch.optim.Adam([ref], lr=1e-2, eps=1e-5)
    skip_capture_check(opt)  # a CPU optimizer: no CUDA question (a CUDA build asks each step)
    p, m, v, step = p0.clone(), torch.zeros(50), torch.zeros(50), torch.zeros(())
    for _ in range(20):
        grad = torch.randn(50, generator=g)
        ref.grad = grad.clone()
        opt.step()
        adam_update(p, grad, m, v, step, torch.tensor(1e-2), 1e-5)
    torch.testing.assert_close(p, ref.detach(), atol=1e-6, rtol=1e-5)
    assert float(step) == 20.0


def test_flat_adam_eager_and_functional_steps_agree():
    torch.manual_seed(0)
    nets = [torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)]
    twins = copy.deepcopy(nets)
    a, b = FlatAdam(nets, lr=1e-2), FlatAdam(twins, lr=1e-2)
    x = torch.randn(8, 3)
    for _ in range(3):
        a.step(nets[1](nets[0](x)).square().sum(), max_grad_norm=0.5)
        loss = twins[1](twins[0](x)).square().sum()
        b.flat.zero_grad()
        loss.backward()  # into the flat gradient; apply() clips and steps from a copy of it
        b.apply(b.flat.grad.clone(), max_grad_norm=0.5)
    for x_a, x_b in zip(a.state_tensors(), b.state_tensors()):
        torch.testing.assert_close(x_b, x_a)


class FakeGraphs:
    """CPU stand-in of torch.cuda.graph: capture runs the step once to learn its outputs (a
    real capture only records; the following replay is then skipped, so every call is still
    one step), replay re-runs it on the static inputs and writes into the static outputs."""

    def __init__(self):
        self.warmed = self.captured = self.replayed = 0

    def warm(self, fn, args):
        self.warmed += 1
        return fn(*args)

    def capture(self, fn):
        self.captured += 1
        out = fn()
        fake = self

        class Graph:
            skip = True

            def replay(self):
                if self.skip:
                    self.skip = False
                    return
                fake.replayed += 1
                fresh = fn()
                torch.utils._pytree.tree_map(
                    lambda s, f: s.copy_(f) if isinstance(s, torch.Tensor) else None, out, fresh
                )

        return Graph(), out


@pytest.mark.parametrize("name", ["dqn", "sac", "sac_discrete", "td3"])
def test_graphed_update_and_act_logic_equals_eager(name, monkeypatch, aot_eager):
    """The CUDA path's logic on CPU: compiled steps wrapped in GraphedStep (warm-up calls, one
    capture, inputs copied into the static buffers, outputs cloned), the graph faked; update
    and exploration actions equal the eager agent's."""
    fakes = FakeGraphs()
    monkeypatch.setattr(compiled, "GRAPH_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(compiled, "_CudaGraphs", lambda: fakes)
    eager, graphed, out_e, out_g = _run(*AGENTS[name], n=6)
    assert_same_agents(eager, graphed)
    torch.testing.assert_close(out_g["td_error"], out_e["td_error"], atol=1e-5, rtol=1e-4)
    eager.env_steps = graphed.env_steps = 10_000  # past TD3's uniform warm-up
    if name == "sac_discrete":  # its actions in one chunk: the graphed path
        eager.config.action_chunk = graphed.config.action_chunk = 64
    obs = torch.randn(3, *eager.obs_shape)
    for _ in range(4):
        torch.testing.assert_close(graphed.act(obs), eager.act(obs), atol=1e-5, rtol=1e-4)
    assert "act-3" in graphed._steps and "act-3" not in eager._steps
    assert fakes.captured == len(graphed._steps) and fakes.warmed == 2 * len(graphed._steps)
    assert fakes.replayed > 0


@pytest.mark.parametrize("continuous", [0, 2])
def test_graphed_ppo_act_logic_equals_eager(continuous, monkeypatch, aot_eager):
    """PPO's exploration step on the CUDA path (fake graph): the Gaussian sample from noise
    drawn outside, or the discrete policy's logits (the multinomial draw stays outside)."""
    fakes = FakeGraphs()
    monkeypatch.setattr(compiled, "GRAPH_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(compiled, "_CudaGraphs", lambda: fakes)
    kw = {"bounds": (-torch.ones(2), torch.ones(2))} if continuous else {"n_actions": 5}
    eager, graphed = (
        PPO((3,), **kw, config=PPOConfig(net_arch=SMALL, compile=c)) for c in (False, True)
    )
    graphed.load_state_dict(eager.state_dict())
    obs = torch.randn(4, 3)
    for _ in range(5):
        torch.testing.assert_close(graphed.act(obs), eager.act(obs))
    assert sorted(graphed._steps) == ["act-4"] and fakes.captured == 1 and fakes.replayed == 2
    assert graphed.env_steps == eager.env_steps == 20


def test_graphed_step_refuses_a_new_shape():
    step = GraphedStep(lambda x: x * 2, warmup=0, graphs=FakeGraphs())
    torch.testing.assert_close(step(torch.ones(3)), torch.full((3,), 2.0))
    out = step(torch.full((3,), 2.0))
    assert out.tolist() == [4.0, 4.0, 4.0]
    with pytest.raises(ValueError, match=r"step input 0: a CUDA graph replays static shapes"):
        step(torch.ones(4))


@pytest.mark.parametrize("algo", ["dqn", "ppo"])
def test_train_with_compile_flag_says_once_how_long_compiling_took(
    algo, tmp_path, capsys, aot_eager
):
    from rlstash.cli import main

    settings = ["--set", "net_arch=[8]", "--set", "eval_every=512", "--set", "eval_episodes=1"]
    if algo == "dqn":
        settings += ["--set", "learning_starts=64", "--set", "train_freq=16"]
        settings += ["--set", "batch_size=16"]
    else:
        settings += ["--set", "rollout_steps=32", "--set", "num_envs=2"]
        settings += ["--set", "minibatch_size=16", "--set", "n_epochs=1"]
    argv = ["train", "--quiet", "--device", "cpu", "--run-dir", str(tmp_path), "--algo", algo]
    argv += ["--env", "CartPole-v1", "--steps", "256", "--compile", *settings]
    assert main(argv) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("compiled the update in")]
    assert len(lines) == 1, out
    assert float(lines[0].split()[4]) > 0


def test_skipping_guards_never_replays_a_stale_graph(aot_eager):
    """Calls with inputs seen before skip Dynamo's guards; a changed setting (read by the step
    as a constant) or a new batch layout still goes through them and gets its own graph."""
    make, batch_of = AGENTS["sac"]
    eager, comp = make(False), make(True)
    comp.load_state_dict(eager.state_dict())
    for i in range(3):
        eager.update(batch_of(i))
        comp.update(batch_of(i))
    eager.config.gamma = comp.config.gamma = 0.5  # a constant inside the compiled step
    unweighted = {k: v for k, v in batch_of(3).items() if k != "weight"}  # another layout
    for batch in (batch_of(4), unweighted, batch_of(5), unweighted):
        out_e, out_c = eager.update(dict(batch)), comp.update(dict(batch))
        torch.testing.assert_close(out_c["td_error"], out_e["td_error"], atol=1e-5, rtol=1e-4)
    assert_same_agents(eager, comp)
    assert len(comp._steps["update"].seen) == 3


def test_each_agent_compiles_its_own_steps(aot_eager):
    """Dynamo keeps graphs per code object up to a recompile limit (over it, fullgraph fails):
    the agents of one process (a sweep, this suite) must not pile theirs onto DQN._step."""
    make, batch_of = AGENTS["dqn"]
    with torch._dynamo.config.patch(recompile_limit=2):
        for gamma in (0.9, 0.8, 0.7):  # a constant of the step: three different graphs
            agent = make(True)
            agent.config.gamma = gamma
            agent.update(batch_of(0))
            assert agent.compile_seconds > 0
