"""PettingZoo Parallel envs in the process pool (rlstash.envs.pettingzoo): fixed agent axes,
per-agent masks, action masks as bits, restarts, the torch-free workers, named errors."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("pettingzoo", reason="PettingZoo envs need pip install 'rlstash[pettingzoo]'")

from rlstash.envs.multiagent import MultiAgentVectorEnv  # noqa: E402
from rlstash.envs.pettingzoo import PettingZooVectorEnv  # noqa: E402
from tests.marl import pz_fakes  # noqa: E402

T = 60.0  # generous: the machine is shared


def ragged(**kwargs):
    return functools.partial(pz_fakes.RaggedEnv, **kwargs)


def make(env=None, num_envs=2, workers=1, seed=0, **kwargs):
    kwargs.setdefault("start_timeout", T)
    kwargs.setdefault("step_timeout", T)
    return PettingZooVectorEnv(env or ragged(), num_envs, workers, seed, **kwargs)


def acts(env, value=1):
    return {
        g: torch.full((env.num_envs, len(a)), value, dtype=torch.int64)
        for g, a in env.groups.items()
    }


def test_workers_are_torch_free_and_the_env_follows_the_protocol():
    with make(workers=2) as env:
        assert isinstance(env, MultiAgentVectorEnv)
        assert env.groups == {"agents": ("a_0", "a_1", "a_2")}
        assert env.device == torch.device("cpu")
        out = env.reset()
        rows = env.pool.shared_arrays()["obs"]  # [E, nbytes]: one byte row per env
        for tensor in (out.obs["agents"], out.reward["agents"], out.mask["agents"], out.state):
            assert np.shares_memory(tensor.numpy(), rows)  # zero-copy over shared memory
        info = env.worker_info()
        assert len(info) == 2
        for worker in info:
            assert not [m for m in worker["modules"] if m.split(".")[0] == "torch"]
            assert "pettingzoo" in worker["modules"]  # the envs really live there


def test_the_worker_module_imports_without_torch_in_a_fresh_interpreter():
    import subprocess
    import sys

    code = (
        "import sys, rlstash.envs.pz_worker, tests.marl.pz_fakes; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    )
    root = str(Path(__file__).resolve().parents[2])
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=T, cwd=root
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_masks_an_agent_done_early_and_an_absent_agent():
    """a_1 terminates at step 2, a_2 joins after step 2, the episode ends at step 5."""
    with make(num_envs=2, workers=1) as env:
        out = env.reset()
        assert out.mask["agents"].tolist() == [[True, True, False]] * 2
        assert out.obs["agents"][:, 2].abs().sum() == 0  # absent: zero-filled
        assert out.reward["agents"].abs().sum() == 0
        assert out.action_mask["agents"][0].tolist() == [
            [True, True, False], [True, True, True], [False, False, False]
        ]  # fmt: skip
        seen = []
        for _ in range(6):
            out = env.step(acts(env, 1))
            seen.append(
                (
                    out.mask["agents"][0].tolist(),
                    out.terminated["agents"][0].tolist(),
                    out.truncated["agents"][0].tolist(),
                    out.reward["agents"][0].tolist(),
                    bool(out.env_done[0]),
                )
            )
            if len(seen) == 3:  # a_1 is done: its row is zero from now on
                assert out.obs["agents"][0, 1].abs().sum() == 0
            if len(seen) == 5:
                final = out.final_obs["agents"][0]
                assert final[0].tolist()[0] == 5 and final[2].tolist()[0] == 5
                assert final[1].abs().sum() == 0
                assert out.obs["agents"][0, 0, 0] == 0  # the next episode's first observation
                assert out.state[0, 0] == 0 and out.state[0, 6:].abs().sum() == 0
    f, t = False, True
    assert seen == [
        ([t, t, f], [f, f, f], [f, f, f], [2.0, 12.0, 0.0], f),
        ([t, t, f], [f, t, f], [f, f, f], [3.0, 13.0, 0.0], f),
        ([t, f, t], [f, f, f], [f, f, f], [4.0, 0.0, 24.0], f),
        ([t, f, t], [f, f, f], [f, f, f], [5.0, 0.0, 25.0], f),
        ([t, f, t], [f, f, f], [t, f, t], [6.0, 0.0, 26.0], t),
        ([t, t, f], [f, f, f], [f, f, f], [2.0, 12.0, 0.0], f),
    ]


def _by_hand(make_env, seeds, actions, agents):
    """Step one PettingZoo env per seed by hand (same-step resets), in the pool's layout."""
    envs = [make_env() for _ in seeds]
    n, a = len(seeds), len(agents)
    first = [e.reset(seed=s)[0] for e, s in zip(envs, seeds)]
    steps = []
    for act in actions:
        obs = np.zeros((n, a, *first[0][agents[0]].shape), np.float32)
        final = np.zeros_like(obs)
        reward = np.zeros((n, a), np.float32)
        term, trunc, mask = (np.zeros((n, a), bool) for _ in range(3))
        state = np.zeros((n, *envs[0].state().shape), np.float32)
        done = np.zeros(n, bool)
        for i, e in enumerate(envs):
            acting = list(e.agents)
            o, r, te, tr, _ = e.step({ag: int(act[i, agents.index(ag)]) for ag in acting})
            for ag in acting:
                j = agents.index(ag)
                mask[i, j], reward[i, j], term[i, j], trunc[i, j] = True, r[ag], te[ag], tr[ag]
            if not e.agents:
                done[i] = True
                for ag, v in o.items():
                    final[i, agents.index(ag)] = v
                o, _ = e.reset()
            for ag, v in o.items():
                obs[i, agents.index(ag)] = v
            state[i] = e.state()
        steps.append((obs, reward, term, trunc, mask, state, done, final))
    for e in envs:
        e.close()
    return first, steps


def _mpe():
    pytest.importorskip("mpe2", reason="the MPE tasks need pip install 'rlstash[mpe]'")
    from mpe2 import simple_spread_v3

    return functools.partial(simple_spread_v3.parallel_env, max_cycles=4), 5


@pytest.mark.parametrize("source", ["ragged", "mpe"])
def test_equals_stepping_the_env_by_hand_with_the_same_seeds_and_actions(source):
    make_env, n_act = _mpe() if source == "mpe" else (ragged(length=4, dict_obs=False), 3)
    rng = np.random.default_rng(0)
    actions = [rng.integers(0, n_act, (4, 3)) for _ in range(10)]
    with make(make_env, num_envs=4, workers=2, seed=7) as env:
        agents = list(env.groups["agents"])
        first, expected = _by_hand(make_env, [7, 8, 9, 10], actions, agents)
        out = env.reset()
        for i in range(4):
            for j, ag in enumerate(agents):
                want = first[i].get(ag, np.zeros_like(out.obs["agents"][i, j].numpy()))
                np.testing.assert_array_equal(out.obs["agents"][i, j].numpy(), want)
        for act, (obs, reward, term, trunc, mask, state, done, final) in zip(actions, expected):
            out = env.step({"agents": torch.as_tensor(act)})
            np.testing.assert_array_equal(out.obs["agents"].numpy(), obs)
            np.testing.assert_array_equal(out.reward["agents"].numpy(), reward)
            np.testing.assert_array_equal(out.terminated["agents"].numpy(), term)
            np.testing.assert_array_equal(out.truncated["agents"].numpy(), trunc)
            np.testing.assert_array_equal(out.mask["agents"].numpy(), mask)
            np.testing.assert_array_equal(out.state.numpy(), state)
            np.testing.assert_array_equal(out.env_done.numpy(), done)
            if done.any():
                np.testing.assert_array_equal(out.final_obs["agents"].numpy()[done], final[done])
            else:
                assert out.final_obs is None
        assert expected[3][6].all()  # episodes of 4 steps: every env ended (and reset) once


def test_a_worker_restart_truncates_every_agent_of_its_envs():
    crash = functools.partial(pz_fakes.CrashEnv, crash_at=3, crash_seed=100, length=50)
    with make(crash, num_envs=4, workers=2, seed=100) as env:  # env 0 (worker 0) crashes
        env.reset()
        for _ in range(2):
            out = env.step(acts(env))
        with pytest.warns(Warning):
            out = env.step(acts(env))
        assert len(env.restarts) == 1
        assert out.env_done.tolist() == [True, True, False, False]
        assert out.truncated["agents"][:2].all()  # every agent, absent ones included
        assert not out.truncated["agents"][2:].any()
        assert not out.mask["agents"][:2].any() and out.reward["agents"][:2].abs().sum() == 0
        assert out.mask["agents"][2:].tolist() == [[True, False, True]] * 2
        assert out.final_obs["agents"][:2].abs().sum() == 0
        assert out.obs["agents"][:2, :, 0].abs().sum() == 0  # the restarted envs' first obs
        assert out.obs["agents"][2:, 0, 0].tolist() == [3.0, 3.0]
        out = env.step(acts(env))
        assert out.mask["agents"][:2].tolist() == [[True, True, False]] * 2
        assert not out.truncated["agents"].any() and not out.env_done.any()


def test_dict_observations_per_agent():
    with make(ragged(dict_obs=True), num_envs=2) as env:
        assert set(env.observation_spaces["agents"].spaces) == {"pos", "id"}
        out = env.reset()
        assert out.obs["agents"]["pos"].shape == (2, 3, 3)
        assert out.obs["agents"]["id"].tolist() == [[0, 1, 0]] * 2  # a_2 absent: zero
        for _ in range(5):
            out = env.step(acts(env, 0))
        assert out.env_done.all()
        assert out.final_obs["agents"]["pos"][:, 0, 0].tolist() == [5.0, 5.0]
        assert out.final_obs["agents"]["id"][0].tolist() == [0, 0, 2]


@pytest.mark.parametrize(("source", "shape"), [("UndeclaredStateEnv", (9,)), ("NoStateEnv", None)])
def test_the_global_state_where_the_env_has_one(source, shape):
    with make(getattr(pz_fakes, source), workers=0, state=False) as env:
        assert env.state_space is None and env.reset().state is None  # asked for none
    with make(getattr(pz_fakes, source), workers=0) as env:
        out = env.reset()
        if shape is None:
            assert env.state_space is None and out.state is None
        else:
            assert env.state_space.shape == shape and out.state.shape == (2, *shape)
            assert out.state[0, :3].tolist() == out.obs["agents"][0, 0].tolist()


def test_continuous_actions_have_no_action_mask_and_nan_is_refused_for_acting_agents():
    with make(pz_fakes.BoxEnv, num_envs=2, workers=0) as env:
        out = env.reset()
        assert out.action_mask == {"agents": None}
        act = torch.full((2, 3, 2), 0.25)
        act[:, 2] = float("nan")  # a_2 is absent: never sent
        out = env.step({"agents": act})
        assert out.reward["agents"][:, :2].tolist() == [[1.5, 11.5]] * 2
        act[0, 0, 1] = float("nan")
        with pytest.raises(ValueError, match=r"agent 'a_0'.*env 0"):
            env.step({"agents": act})


def test_groups_by_space_and_by_hand():
    with make(pz_fakes.MixedEnv, num_envs=2) as env:
        assert env.groups == {"group_0": ("a_0", "a_1"), "group_1": ("a_2",)}
        out = env.reset()
        assert out.obs["group_0"].shape == (2, 2, 3) and out.obs["group_1"].shape == (2, 1, 4)
    with make(
        pz_fakes.MixedEnv, num_envs=2, groups={"pair": ["a_0", "a_1"], "solo": ["a_2"]}
    ) as env:
        out = (
            env.step(
                {
                    "pair": torch.zeros(2, 2, dtype=torch.long),
                    "solo": torch.zeros(2, 1, dtype=torch.long),
                }
            )
            if env.reset()
            else None
        )
        assert out.mask["pair"].all() and not out.mask["solo"].any()


@pytest.mark.parametrize(
    ("groups", "named"),
    [
        ({"all": ["a_0", "a_1", "a_2"]}, "agent 'a_2' has observation space"),
        ({"x": ["a_0", "a_1", "b_9"], "y": ["a_2"]}, "unknown agent 'b_9'"),
        ({"x": ["a_0", "a_1"], "y": ["a_1"]}, "agent 'a_1' is already in group 'x'"),
        ({"x": ["a_0", "a_1"]}, "agents ['a_2'] are in no group"),
    ],
)
def test_bad_group_maps_are_refused_with_the_agent_named(groups, named):
    with pytest.raises(ValueError, match=named.replace("[", r"\[").replace("]", r"\]")):
        make(pz_fakes.MixedEnv, groups=groups)


def test_wrong_actions_are_refused_with_the_group_or_agent_named():
    with make(num_envs=2) as env:
        env.reset()
        with pytest.raises(ValueError, match=r"actions\['agents'\]: expected shape \(2, 3\)"):
            env.step({"agents": torch.zeros(2, 2, dtype=torch.long)})
        with pytest.raises(ValueError, match=r"unknown \['robots'\]"):
            env.step({"robots": torch.zeros(2, 3, dtype=torch.long)})
        with pytest.raises(TypeError, match=r"actions\['agents'\]: expected integer"):
            env.step({"agents": torch.zeros(2, 3)})
        bad = torch.zeros(2, 3, dtype=torch.long)
        bad[1, 1] = 7
        with pytest.raises(ValueError, match=r"agent 'a_1'.*env 1"):
            env.step({"agents": bad})
        bad[1, 1] = 0
        bad[:, 2] = 9  # a_2 is absent: its value is never sent
        out = env.step({"agents": bad})
        assert out.reward["agents"][:, 0].tolist() == [1.0, 1.0]


def test_an_env_that_names_an_unknown_agent_is_refused_with_the_agent_named():
    with make(pz_fakes.StrangerEnv, max_restarts=0) as env:
        env.reset()
        with pytest.raises(ValueError, match="agent 'stranger'"):
            env.step(acts(env))


def test_processes_are_cleaned_up_when_the_script_fails():
    from tests.envs.helpers import finish, kill_tree, start_script, wait_for_line, wait_gone

    proc = start_script(
        """
        import functools, torch
        from rlstash.envs.pettingzoo import PettingZooVectorEnv
        from tests.marl import pz_fakes
        env = PettingZooVectorEnv(pz_fakes.RaggedEnv, 4, 2, 0, start_timeout=60)
        env.reset()
        print("PIDS", *env.worker_pids, flush=True)
        env.step({"agents": torch.zeros(4, 3, dtype=torch.long)})
        raise SystemExit("failing on purpose, without close()")
        """
    )
    try:
        pids = [int(p) for p in wait_for_line(proc, "PIDS", timeout=T).split()[1:]]
        stderr = finish(proc, timeout=T)
        assert proc.returncode != 0 and "failing on purpose" in stderr
        assert wait_gone(pids, timeout=10) == []
    finally:
        kill_tree(proc)
