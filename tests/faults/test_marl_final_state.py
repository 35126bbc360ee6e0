"""The final global state of an episode that ended (same-step autoreset) in a multi-agent env:
``MultiAgentStep.final_state`` holds the ended episode's last ``state()`` (never the new
episode's first), the PettingZoo pool fills it from its torch-free workers (zero after a worker
restart, like ``final_obs``), and every consumer bootstraps from it: MAPPO's centralised critic
in the collector and the QMIX/VDN stream's ``final_obs/state`` (the mixer's next state)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

pytest.importorskip("pettingzoo", reason="PettingZoo envs need pip install 'rlstash[pettingzoo]'")

from rlstash.envs.multiagent import MultiAgentStep, final_state  # noqa: E402
from rlstash.envs.pettingzoo import PettingZooVectorEnv  # noqa: E402
from tests.marl import pz_fakes  # noqa: E402

T_OUT = 60.0  # generous: the machine is shared
E, A, D, LENGTH = 2, 2, 3, 3


def make(workers: int = 0, **kwargs) -> PettingZooVectorEnv:
    source = functools.partial(pz_fakes.EpisodeStateEnv, **kwargs)
    return PettingZooVectorEnv(
        source, E, workers, 0, start_timeout=T_OUT, step_timeout=T_OUT
    )  # fmt: skip


def by_hand(steps: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Each env (reset with seed + i, same-step resets) stepped by hand: per step the obs and
    state an action is taken from, and where the episode ended its last obs and state."""
    envs = [pz_fakes.EpisodeStateEnv(length=LENGTH) for _ in range(E)]
    obs = [e.reset(seed=seed + i)[0] for i, e in enumerate(envs)]
    out = []
    for _ in range(steps):
        row = {
            "obs": np.stack([[o[a] for a in e.possible_agents] for e, o in zip(envs, obs)]),
            "state": np.stack([e.state() for e in envs]),
            "done": np.zeros(E, bool),
            "final_obs": np.zeros((E, A, D), np.float32),
            "final_state": np.zeros((E, 3), np.float32),
        }
        for i, e in enumerate(envs):
            obs[i] = e.step({a: 0 for a in e.agents})[0]
            if not e.agents:
                row["done"][i] = True
                row["final_obs"][i] = [obs[i][a] for a in e.possible_agents]
                row["final_state"][i] = e.state()
                obs[i] = e.reset()[0]
        out.append(row)
    return out


def test_the_pool_gives_the_ended_episodes_last_state_not_the_new_ones_first():
    hand = by_hand(LENGTH)
    with make(workers=1, length=LENGTH) as env:  # a real torch-free worker process
        env.reset()
        for t in range(LENGTH):
            out = env.step({"agents": torch.zeros(E, A, dtype=torch.int64)})
            if t < LENGTH - 1:
                assert out.final_state is None and not out.env_done.any()
        assert out.env_done.all()
        want = torch.from_numpy(hand[-1]["final_state"])
        assert torch.equal(out.final_state, want)  # [100 * 1 + 3, u, 1] per env
        assert torch.equal(final_state(out), want)
        assert (out.state[:, 0] == 200).all()  # the new episode's first: [100 * 2 + 0, u', 1]
        assert not torch.equal(out.state, out.final_state)
        assert torch.equal(out.final_obs["agents"], torch.from_numpy(hand[-1]["final_obs"]))
        info = env.worker_info()
        assert all("torch" not in (w["modules"] or []) for w in info)


def test_a_worker_restart_leaves_zero_final_state_rows():
    with make(workers=1, length=2, crash_at=1) as env:  # crashes at step 1 of episode 2
        env.reset()
        for _ in range(2):
            out = env.step({"agents": torch.zeros(E, A, dtype=torch.int64)})
        assert out.env_done.all() and (out.final_state[:, 0] == 102).all()  # a real one first
        with pytest.warns(Warning):
            out = env.step({"agents": torch.zeros(E, A, dtype=torch.int64)})
        assert len(env.restarts) == 1 and out.env_done.all()
        assert out.truncated["agents"].all() and not out.mask["agents"].any()
        assert out.final_state.abs().sum() == 0  # the step has no outcome: no final state
        assert out.final_obs["agents"].abs().sum() == 0


def test_an_env_with_a_state_that_gives_no_final_state_is_refused():
    z = {"agents": torch.zeros(E, A, dtype=torch.bool)}
    step = MultiAgentStep(
        {"agents": torch.zeros(E, A, D)}, {"agents": torch.zeros(E, A)}, z, z, z,
        {"agents": None}, torch.zeros(E, 3), torch.ones(E, dtype=torch.bool),
        final_obs={"agents": torch.zeros(E, A, D)},
    )  # fmt: skip
    with pytest.raises(ValueError, match="final_state None"):
        final_state(step)
    step.state = None  # no global state: nothing to give
    assert final_state(step) is None


def test_mappo_bootstraps_a_truncated_episode_from_its_final_state():
    from rlstash.agents.mappo import MAPPO, MAPPOConfig
    from rlstash.collect.multiagent import MultiAgentCollector
    from rlstash.storage.marl_rollout import MultiAgentRollout

    steps = LENGTH + 1
    hand = by_hand(steps)
    cfg = MAPPOConfig(net_arch=(16,), compile=False, seed=0)
    agent = MAPPO(A, D, n_actions=2, state_dim=3, config=cfg)
    rollout = MultiAgentRollout(steps, E, A, D, (), torch.int64, state_dim=3, n_action_mask=2)
    collector = MultiAgentCollector(make(length=LENGTH), seed=0)
    try:
        collector.collect(agent, rollout)
    finally:
        collector.close()
    end = LENGTH - 1  # the step the episodes were truncated at
    final_obs = torch.from_numpy(hand[end]["final_obs"])
    with torch.no_grad():
        want = agent.values(final_obs, torch.from_numpy(hand[end]["final_state"]))
        stand_in = agent.values(final_obs, rollout.state[end + 1])  # the new episode's first
    assert torch.allclose(rollout.final_value[end], want)
    assert not torch.allclose(want, stand_in, atol=1e-4)  # the test tells the two apart
    others = [t for t in range(steps) if t != end]
    assert rollout.final_value[others].abs().sum() == 0


def test_the_qmix_stream_stores_each_steps_values_and_the_real_final_state():
    from rlstash.agents.qmix import QMIX, QMIXConfig
    from rlstash.collect.marl_stream import MultiAgentStreamCollector
    from rlstash.storage.stream import StreamStorage
    from rlstash.storage.stream_agents import STATE, agent_step_spec

    steps = 2 * LENGTH + 1  # two episodes end: the first one's final rows must survive
    hand = by_hand(steps)
    agent = QMIX(A, D, 2, 3, QMIXConfig(net_arch=(8,), compile=False))
    collector = MultiAgentStreamCollector(make(length=LENGTH), steps=steps, seed=0)
    try:
        batch = collector.collect(agent)
    finally:
        collector.close()
    for t, row in enumerate(hand):  # each row its own step's values (env tensors are views)
        assert torch.equal(batch["obs"][t], torch.from_numpy(row["obs"]))
        assert torch.equal(batch[STATE][t], torch.from_numpy(row["state"]))
        assert batch["truncated"][t].tolist() == row["done"].tolist()
        if row["done"].any():
            assert torch.equal(batch["final_" + STATE][t], torch.from_numpy(row["final_state"]))
            assert torch.equal(batch["final_obs"][t], torch.from_numpy(row["final_obs"]))
    st = StreamStorage(agent_step_spec(A, D, 3, 2), E, 40, autoreset="SameStep")
    st.extend(batch)
    end = LENGTH - 1
    out = st.read(np.array([end * E, end * E + 1]))  # both envs' last step of episode 1
    assert out["truncated"].all()
    want = torch.from_numpy(hand[end]["final_state"])
    assert torch.equal(out["next_" + STATE], want)  # the mixer's next state: the real last one
    assert (out["next_" + STATE][:, 0] == 100 + LENGTH).all()
