"""Multi-agent steps in a StreamStorage (rlstash.storage.stream_agents): planned to the byte it
allocates, each observation stored once with next observations, masks and state rebuilt from
the next slot, episode boundaries per env (same-step final slots), n-step returns per agent; and
the collector's chunks (rlstash.collect.marl_stream) from a fake multi-agent env."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlstash.collect.marl_stream import MultiAgentStreamCollector
from rlstash.envs.multiagent import MultiAgentStep
from rlstash.memory import plan
from rlstash.replay import ReplayBuffer
from rlstash.storage.stream import ReadSpec, StreamStorage
from rlstash.storage.stream_agents import agent_step_spec, pack_bits, unpack_bits
from rlstash.storage.stream_plan import BOOKKEEPING, bookkeeping_bytes
from rlstash.storage.stream_spec import slot_spec

A, D, S, N_ACT, E = 3, 4, 2, 5, 2


@pytest.mark.parametrize(("state", "masks"), [(S, N_ACT), (None, None)])
def test_plan_equals_the_bytes_allocated(state, masks) -> None:
    spec = agent_step_spec(A, D, state, masks)
    st = StreamStorage(spec, E, 40, autoreset="SameStep")
    planned = plan(slot_spec(spec), 40, "ram", "cpu",
                   overhead={BOOKKEEPING: bookkeeping_bytes(E, 40)})  # fmt: skip
    assert planned.total == st.nbytes == st.plan.total
    held = sum(t.numel() * t.element_size() for t in st.backing.tensors.values())
    lanes = sum(a.nbytes for a in st.lanes.arrays().values()) + st._cut.nbytes
    assert held == planned.total - bookkeeping_bytes(E, 40)  # the tensors it really holds
    assert lanes <= bookkeeping_bytes(E, 40)
    per_slot = A * D * 4 + (S * 4 if state else 0) + (A if masks else 0) + A + A * 8 + A * 4
    assert st.backing.nbytes == 40 * per_slot  # obs once, masks as bits: no next_obs copy


def _step(t: int, done: list[bool]) -> dict[str, torch.Tensor]:
    mask = torch.ones(E, A, dtype=torch.bool)
    mask[1, 2] = t % 2 == 0  # env 1's agent 2 acts every other step
    batch = {
        "obs": torch.full((E, A, D), float(t)),
        "obs/state": torch.full((E, S), 10.0 + t),
        "obs/action_mask": pack_bits(torch.arange(N_ACT).expand(E, A, N_ACT) <= t % N_ACT),
        "obs/mask": mask,
        "action": torch.full((E, A), t),
        "reward": torch.arange(A).float().expand(E, A) + t,
        "terminated": torch.tensor(done),
        "truncated": torch.zeros(E, dtype=torch.bool),
    }
    for k in ("obs", "obs/state", "obs/action_mask", "obs/mask"):
        batch["final_" + k] = batch[k] + 100 if batch[k].is_floating_point() else batch[k]
    return batch


def test_next_fields_and_episode_ends_are_rebuilt_per_env() -> None:
    st = StreamStorage(agent_step_spec(A, D, S, N_ACT), E, 40, autoreset="SameStep",
                       reads=ReadSpec(n_step=2, gamma=0.5))  # fmt: skip
    for t in range(5):
        st.extend(_step(t, [t == 1, False]))
    out = st.read(np.array([0, 1, 2, 3]))  # slots of step 0 and 1 of both envs
    assert out["obs"].shape == (4, A, D) and out["next_obs/mask"].shape == (4, A)
    assert out["reward"].shape == (4, A) and out["next_obs/action_mask"].shape == (4, A, 1)
    # env 0 ended at step 1: its step-0 slot's 2-step return stops there, next obs = final
    torch.testing.assert_close(out["reward"][0], torch.tensor([0.5, 2.0, 3.5]))
    assert out["next_obs"][0, 0, 0] == 101 and out["next_obs/state"][0, 0] == 111
    assert bool(out["terminated"][0]) and out["discount"][0] == pytest.approx(0.25)
    # env 1 continues: 2 steps later; its agent 2 acts again at step 2
    torch.testing.assert_close(out["reward"][1], torch.tensor([0.5, 2.0, 3.5]))
    assert out["next_obs"][1, 0, 0] == 2 and not bool(out["terminated"][1])
    assert out["next_obs/mask"][1].tolist() == [True, True, True]
    assert out["obs/mask"][3].tolist() == [True, True, False]
    avail = unpack_bits(out["next_obs/action_mask"], N_ACT)
    assert avail[1, 0].tolist() == [True, True, True, False, False]  # step 2's mask
    rb = ReplayBuffer(st, seed=0)
    batch = rb.sample(16)
    assert batch["obs"].shape == (16, A, D) and batch["action"].shape == (16, A)


class _FakeEnv:
    """Two envs of three agents: env 0 ends every 3 steps (agent 2 done after its first step),
    env 1 never; an action mask allows actions <= the agent index; a global state (an ended
    episode's last: -3). ``mask``: the agents that acted in the step (reset: present)."""

    def __init__(self) -> None:
        self.num_envs, self.device = E, torch.device("cpu")
        self.groups = {"agents": ("a0", "a1", "a2")}
        self.observation_spaces = {"agents": spaces.Box(-1e9, 1e9, (D,))}
        self.action_spaces = {"agents": spaces.Discrete(N_ACT)}
        self.state_space = spaces.Box(-1e9, 1e9, (S,))
        self.t = torch.zeros(E, dtype=torch.int64)

    def _out(self, reward, term, trunc, done, final, acted=True) -> MultiAgentStep:
        obs = self.t[:, None, None].float().expand(E, A, D) + torch.arange(A)[None, :, None]
        mask = torch.ones(E, A, dtype=torch.bool)
        mask[0, 2] = acted
        final_state = None if final is None else torch.full((E, S), -3.0)
        avail = torch.arange(N_ACT)[None, None] <= torch.arange(A)[None, :, None]
        return MultiAgentStep({"agents": obs.clone()}, {"agents": reward}, {"agents": term},
                              {"agents": trunc}, {"agents": mask},
                              {"agents": avail.expand(E, A, N_ACT).clone()},
                              self.t[:, None].float().expand(E, S).clone(), done, final,
                              final_state)  # fmt: skip

    def reset(self, *, seed=None) -> MultiAgentStep:
        self.t.zero_()
        z = torch.zeros(E, A, dtype=torch.bool)
        return self._out(torch.zeros(E, A), z, z, torch.zeros(E, dtype=torch.bool), None)

    def step(self, actions) -> MultiAgentStep:
        a = actions["agents"]
        assert (a <= torch.arange(A)).all()  # masked actions never taken
        acted = bool(self.t[0] == 0)  # agent 2 of env 0 acts in its episode's first step
        self.t += 1
        done = torch.tensor([bool(self.t[0] == 3), False])
        term = torch.zeros(E, A, dtype=torch.bool)
        term[0] = done[0]
        term[0, 2] |= bool(self.t[0] == 1)
        final = None
        if done.any():
            final = {"agents": torch.full((E, A, D), -7.0)}
            self.t[0] = 0
        reward = torch.ones(E, A)
        return self._out(reward, term, torch.zeros_like(term), done, final, acted)

    def close(self) -> None:
        pass


def test_the_collector_writes_chunks_the_stream_takes() -> None:
    from rlstash.agents.qmix import QMIX, QMIXConfig

    env = _FakeEnv()
    collector = MultiAgentStreamCollector(env, steps=7)
    agent = QMIX(A, D, N_ACT, S, QMIXConfig(net_arch=(8,), compile=False))
    batch = collector.collect(agent)
    assert batch["obs"].shape == (7, E, A, D) and batch["obs/action_mask"].shape == (7, E, A, 1)
    assert batch["terminated"][:, 0].tolist() == [False, False, True] * 2 + [False]
    assert not batch["obs/mask"][1:3, 0, 2].any() and (batch["reward"][1:3, 0, 2] == 0).all()
    assert batch["final_obs/mask"][2, 0].tolist() == [False, False, False]
    st = StreamStorage(agent_step_spec(A, D, S, N_ACT), E, 40, autoreset="SameStep")
    st.extend(batch)
    out = st.read(np.array([2 * E]))  # env 0's third step: its episode's last
    assert out["next_obs"][0, 0, 0] == -7 and bool(out["terminated"][0])
    assert (out["next_obs/state"][0] == -3).all()  # the ended episode's last state
    assert collector.stats.count == 2
    assert collector.stats.returns_per_agent() == [3.0, 3.0, 1.0]
