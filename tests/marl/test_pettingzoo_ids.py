"""``pettingzoo:<module>`` ids resolved in rlstash.envs (make_multiagent_env), --env-kwargs,
and action masks carried from PettingZoo's classic observation dicts."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("pettingzoo", reason="PettingZoo envs need pip install 'rlstash[pettingzoo]'")

from rlstash.envs.make import make_multiagent_env, parse_env_kwargs, probe_env  # noqa: E402
from rlstash.envs.pettingzoo import PettingZooVectorEnv  # noqa: E402
from tests.marl import pz_fakes  # noqa: E402

T = 60.0


def test_a_pettingzoo_id_with_env_kwargs_makes_a_multiagent_env():
    kwargs = parse_env_kwargs('{"length": 2, "join_at": 9}')
    env = make_multiagent_env("pettingzoo:tests.marl.pz_fakes", 2, 0, 0, kwargs)
    try:
        assert isinstance(env, PettingZooVectorEnv) and env.pool.num_workers == 0
        env.reset()
        zeros = {"agents": torch.zeros(2, 3, dtype=torch.long)}
        assert not env.step(zeros).env_done.any()
        assert env.step(zeros).env_done.all()  # length 2 from --env-kwargs
    finally:
        env.close()


def test_mpe_task_by_id():
    pytest.importorskip("mpe2", reason="the MPE tasks need pip install mpe2")
    env = make_multiagent_env(
        "pettingzoo:mpe2.simple_spread_v3", 2, 1, 0, {"N": 2}, start_timeout=T, step_timeout=T
    )
    try:
        assert env.groups == {"agents": ("agent_0", "agent_1")}
        out = env.reset()
        assert out.obs["agents"].shape[:2] == (2, 2) and out.state is not None
    finally:
        env.close()


def test_bad_ids_and_kwargs_are_refused_with_the_fix():
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'rlstash\[pettingzoo\]'"):
        make_multiagent_env("pettingzoo:no_such_module_xyz", 2, 0, 0)
    with pytest.raises(ValueError, match="has no parallel_env"):
        make_multiagent_env("pettingzoo:tests.marl", 2, 0, 0)
    with pytest.raises(ValueError, match="not a multi-agent env id"):
        make_multiagent_env("CartPole-v1", 2, 0, 0)
    with pytest.raises(ValueError, match="multi-agent PettingZoo env"):
        probe_env("pettingzoo:tests.marl.pz_fakes")
    with pytest.raises(ValueError, match="--env-kwargs: expected a JSON object"):
        parse_env_kwargs("N=3")
    with pytest.raises(ValueError, match="--env-kwargs: expected a JSON object"):
        parse_env_kwargs("[3]")
    assert parse_env_kwargs(None) == {}


def test_action_masks_from_observation_dicts_travel_as_bits():
    with PettingZooVectorEnv(pz_fakes.MaskObsEnv, 2, 0, 0) as env:
        assert env.observation_spaces["agents"].shape == (3,)  # the mask is not an observation
        out = env.reset()
        assert out.obs["agents"].shape == (2, 3, 3)
        assert out.action_mask["agents"][0].tolist() == [
            [False, True, True], [True, False, True], [False, False, False]  # a_2 absent
        ]  # fmt: skip
        bits = env.shared_fields()["action_mask/agents"]
        assert bits.dtype.name == "uint8" and bits.shape == (2, 3, 1)  # 3 actions in one byte
