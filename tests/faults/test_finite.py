"""Non-finite values are caught where they enter (issue 22 class 3, invariant I10).

One NaN reward used to turn every parameter of DQN, SAC, TD3, discrete SAC and PPO into NaN
within two updates, with no error. Now: every storage's ``extend`` (RolloutStorage's ``add``,
the stream's direct slots) refuses a float field holding NaN or +-inf, naming the field and
where it is, and writes nothing (``check_finite=False`` stores them); an agent's loss that turns
non-finite is reported by ``check_finite`` (one read when logging) naming the update; ``act``
refuses a non-finite observation; ``rlstash train`` stops with one line and a finite
checkpoint; non-finite settings are refused when parsed.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from rlstash.agents.dqn import DQN, DQNConfig
from rlstash.agents.ppo import PPO, PPOConfig
from rlstash.agents.sac import SAC, SACConfig
from rlstash.agents.sac_discrete import DiscreteSAC, DiscreteSACConfig
from rlstash.agents.td3 import TD3, TD3Config
from rlstash.cli import main
from rlstash.replay import ReplayBuffer
from rlstash.spec import Spec
from rlstash.storage import MemmapStorage, StreamStorage, TensorStorage, TieredStorage
from rlstash.storage.rollout import RolloutStorage
from rlstash.train import checkpoint
from tests.agents.conftest import aot_eager, no_cuda  # noqa: F401 - fixtures

BAD = [float("nan"), float("inf"), float("-inf")]
SPEC = Spec({"obs": ((3,), "float32"), "action": ((), "int64"), "reward": ((), "float32")})


def _rows(n: int = 6) -> dict[str, torch.Tensor]:
    return {
        "obs": torch.arange(n * 3, dtype=torch.float32).reshape(n, 3),
        "action": torch.arange(n),
        "reward": torch.ones(n),
    }


# --- storages -----------------------------------------------------------------------------


def _buffers(tmp_path: Path, check: bool) -> dict[str, ReplayBuffer]:
    hot, cold = TensorStorage(SPEC, 4), MemmapStorage(SPEC, 16, tmp_path / "cold")
    return {
        "ram": ReplayBuffer(TensorStorage(SPEC, 16), check_finite=check),
        "disk": ReplayBuffer(MemmapStorage(SPEC, 16, tmp_path / "disk"), check_finite=check),
        "tiered": ReplayBuffer(TieredStorage(hot, cold), check_finite=check),
    }


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("numpy", [False, True], ids=["tensors", "arrays"])
def test_replay_extend_refuses_non_finite_rows_of_every_storage(tmp_path, bad, numpy):
    """RAM (fast path: tensors or numpy arrays), disk and tiered storages: the batch is
    refused naming field, value and row, and nothing is written."""
    for kind, rb in _buffers(tmp_path, check=True).items():
        rb.extend(_rows(2))
        batch = _rows()
        batch["reward"][3] = bad
        if numpy:
            batch = {k: v.numpy() for k, v in batch.items()}
        with pytest.raises(ValueError, match=rf"reward has a non-finite value \({bad}\) at row 3"):
            rb.extend(batch)
        assert len(rb) == 2, kind
        batch = _rows()
        batch["obs"][4, 1] = bad
        with pytest.raises(ValueError, match=r"obs has a non-finite value .* at row 4; nothing"):
            rb.extend(batch)
        assert len(rb) == 2, kind
        assert torch.isfinite(rb.storage.read(np.arange(2))["reward"]).all()
        rb.close()


def test_check_finite_false_stores_non_finite_values(tmp_path):
    for kind, rb in _buffers(tmp_path, check=False).items():
        batch = _rows()
        batch["reward"][3] = float("nan")
        rb.extend(batch)
        assert len(rb) == 6 and math.isnan(rb.storage.read(np.array([3]))["reward"][0]), kind
        rb.close()


STEP = Spec({"obs": ((2,), "float32"), "action": ((), "int64")})


def _steps(T: int | None, N: int = 4) -> dict[str, torch.Tensor]:
    lead = (N,) if T is None else (T, N)
    return {
        "obs": torch.zeros((*lead, 2)),
        "action": torch.zeros(lead, dtype=torch.int64),
        "reward": torch.ones(lead),
        "terminated": torch.zeros(lead, dtype=torch.bool),
        "truncated": torch.zeros(lead, dtype=torch.bool),
    }


@pytest.mark.parametrize("backing", ["ram", "disk"])
@pytest.mark.parametrize("bad", BAD)
def test_stream_extend_names_the_env_and_step(tmp_path, backing, bad):
    path = tmp_path / "stream" if backing == "disk" else None
    store = StreamStorage(STEP, 4, 64, backing=backing, path=path)
    rb = ReplayBuffer(store)
    rb.extend(_steps(None))
    before = store.lanes.count.copy()
    one = _steps(None)
    one["reward"][3] = bad
    with pytest.raises(ValueError, match=rf"reward has a non-finite value \({bad}\) at env 3 \("):
        rb.extend(one)
    chunk = _steps(3)
    chunk["obs"][2, 1, 0] = bad
    with pytest.raises(
        ValueError, match=r"obs .* at env 1, step 2 of the batch \(row 9\); nothing was written"
    ):
        store.extend(chunk)
    np.testing.assert_array_equal(store.lanes.count, before)
    size = store.size
    rb.close()
    if backing == "disk":  # reopened: the refused steps are not there
        again = StreamStorage(STEP, 4, 64, backing="disk", path=path)
        assert again.size == size
        again.close()


def test_stream_same_step_final_obs_is_checked_where_an_episode_ended():
    spec = Spec({"obs": ((2,), "float32"), "action": ((), "int64")})
    store = StreamStorage(spec, 2, 32, autoreset="same_step")
    batch = _steps(None, 2)
    batch["final_obs"] = torch.full((2, 2), float("nan"))  # no episode ended: never read
    store.extend(batch)
    batch["terminated"][1] = True
    with pytest.raises(ValueError, match=r"final_obs has a non-finite value \(nan\) at env 1"):
        store.extend(batch)
    with pytest.raises(ValueError, match=r"obs has a non-finite value \(inf\) at row 0"):
        store.end_episodes([1], final_obs=torch.tensor([[0.0, float("inf")]]))
    loose = StreamStorage(spec, 2, 32, autoreset="same_step", check_finite=False)
    loose.extend(batch)
    assert loose.size > 0


def test_stream_direct_slots_refuse_non_finite_rows_at_commit():
    """``open_steps``: the collector copies each step into the slots; commit checks them."""
    store = StreamStorage(Spec({"obs": ((2,), "float32"), "action": ((), "int64")}), 3, 30)
    slots = store.open_steps(2)
    assert slots is not None
    for t in range(2):
        row = slots.step(t)
        row["obs"].fill_(1.0)
        row["reward"].fill_(0.5)
    slots.step(1)["reward"][2] = float("inf")
    flags = torch.zeros(2, 3, dtype=torch.bool)
    with pytest.raises(
        ValueError, match=r"reward .*\(inf\) at env 2, step 1 of the batch \(row 5\)"
    ):
        slots.commit(flags, flags)
    assert store.size == 0 and not store.valid.any()


def test_collect_into_a_stream_refuses_a_nan_reward_of_a_batched_env():
    from rlstash.collect import Collector
    from rlstash.envs.batched.cartpole import CartPoleVectorEnv

    env = CartPoleVectorEnv(num_envs=2, autoreset_mode=AutoresetMode.NEXT_STEP)
    step, count = env.step, [0]

    def nan_step(actions: torch.Tensor) -> tuple:  # env 1's reward is NaN at its 3rd step
        obs, reward, term, trunc, info = step(actions)
        count[0] += 1
        if count[0] == 3:
            reward = reward.clone()
            reward[1] = float("nan")
        return obs, reward, term, trunc, info

    env.step = nan_step
    collector = Collector(env, lambda obs: torch.zeros(2, dtype=torch.int64), frames_per_batch=8)
    store = StreamStorage(Spec({"obs": ((4,), "float32"), "action": ((), "int64")}), 2, 64)
    opened: list[int] = []  # the steps go in place (the direct path), not through extend
    store.open_steps = lambda T: opened.append(T) or StreamStorage.open_steps(store, T)
    with pytest.raises(ValueError, match=r"reward .*\(nan\) at env 1, step 2 of the batch"):
        collector.collect_into(store)
    assert opened == [4] and store.size == 0


def test_rollout_add_refuses_non_finite_values_and_unknown_fields():
    T, N = 3, 4
    ro = RolloutStorage(STEP, T, N)
    batch = _steps(T, N)
    batch["reward"][2, 3] = float("nan")
    with pytest.raises(
        ValueError, match=r"reward .*\(nan\) at env 3, step 2 of the batch \(row 11\)"
    ):
        ro.add(batch, torch.zeros(N, 2))
    assert not ro.filled
    with pytest.raises(ValueError, match=r"next_obs .*\(-inf\) at env 1 \(row 1\)"):
        ro.add(_steps(T, N), torch.tensor([[0.0, 0], [0, float("-inf")], [0, 0], [0, 0]]))
    extra = {**_steps(T, N), "log_prob": torch.zeros(T, N)}
    with pytest.raises(ValueError, match=r"unexpected fields \['log_prob'\].*'obs', 'reward'"):
        ro.add(extra, torch.zeros(N, 2))
    assert not ro.filled
    loose = RolloutStorage(STEP, T, N, check_finite=False)
    loose.add(batch, torch.zeros(N, 2))
    assert math.isnan(loose.reward[2, 3])


# --- agents -------------------------------------------------------------------------------


def _discrete_batch(seed: int, bad: float | None = None) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    batch = {
        "obs": torch.randn(16, 3, generator=g),
        "action": torch.randint(0, 2, (16,), generator=g),
        "reward": torch.randn(16, generator=g),
        "next_obs": torch.randn(16, 3, generator=g),
        "terminated": torch.zeros(16, dtype=torch.bool),
    }
    if bad is not None:
        batch["reward"][5] = bad
    return batch


def _continuous_batch(seed: int, bad: float | None = None) -> dict[str, torch.Tensor]:
    batch = _discrete_batch(seed, bad)
    batch["action"] = torch.rand(16, 2, generator=torch.Generator().manual_seed(seed)) * 2 - 1
    return batch


def _agent(name: str, compile: bool = False) -> tuple[Any, Any]:
    small = {"net_arch": (8,), "compile": compile}
    if name == "dqn":
        return DQN((3,), 2, DQNConfig(**small)), _discrete_batch
    if name == "sac_discrete":
        return DiscreteSAC((3,), 2, DiscreteSACConfig(**small)), _discrete_batch
    if name == "sac":
        return SAC((3,), 2, -1, 1, SACConfig(**small)), _continuous_batch
    return TD3((3,), 2, -1, 1, TD3Config(policy_delay=2, **small)), _continuous_batch


def _weights_finite(agent: Any) -> bool:
    return all(torch.isfinite(t).all() for t in agent._state_tensors())


@pytest.mark.parametrize("name", ["dqn", "sac", "td3", "sac_discrete"])
def test_a_nan_reward_is_refused_before_the_agent_sees_it(name):
    agent, make = _agent(name)
    fields = {k: ((tuple(v.shape[1:])), v.dtype) for k, v in make(0).items()}
    rb = ReplayBuffer(TensorStorage(Spec(fields), 64))
    with pytest.raises(ValueError, match=r"reward has a non-finite value \(nan\) at row 5"):
        rb.extend(make(0, float("nan")))
    assert len(rb) == 0
    rb.extend(make(1))
    agent.check_finite(agent.update(rb.sample(16)), params=True)  # nothing non-finite
    assert _weights_finite(agent)


@pytest.mark.parametrize("name", ["dqn", "sac", "td3", "sac_discrete"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_loss_is_reported_naming_its_update(name, bad):
    """Stored anyway (check_finite=False): the loss turns non-finite at update 3; the flag is
    read when the metrics are (no host read per update: tests/agents/test_host_reads.py)."""
    agent, make = _agent(name)
    for seed in (1, 2):
        metrics = agent.update(make(seed))
    agent.check_finite(metrics, params=True)
    for seed, bad_value in ((3, bad), (4, None), (5, None)):
        metrics = agent.update(make(seed, bad_value))
    latest = r"; latest: .*loss=nan" if math.isnan(bad) else ""  # NaN spreads to the weights
    with pytest.raises(ValueError, match=r"loss turned non-finite \(NaN or inf\) at update 3 "
                                         rf"\(updates so far: 5{latest}"):  # fmt: skip
        agent.check_finite(metrics)


@pytest.mark.parametrize("name", ["dqn", "td3"])
def test_compiled_updates_watch_their_loss_too(name, aot_eager):  # noqa: F811 - fixture
    agent, make = _agent(name, compile=True)
    for seed, bad in ((1, None), (2, None), (3, None), (4, float("nan")), (5, None)):
        metrics = agent.update(make(seed, bad))
    with pytest.raises(ValueError, match=r"at update 4 \(updates so far: 5"):
        agent.check_finite(metrics)


def test_td3_delayed_actor_loss_counts_for_its_update():
    agent, make = _agent("td3")
    agent.update(make(1))
    agent._watch(torch.tensor(float("nan")), counted=True)  # as the actor step of update 1
    with pytest.raises(ValueError, match=r"at update 1 \(updates so far: 1"):
        agent.check_finite()


def _ppo_batch(T: int, N: int, seed: int, bad: float | None = None) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    batch = {
        "obs": torch.randn(T, N, 3, generator=g),
        "action": torch.randint(0, 2, (T, N), generator=g),
        "reward": torch.randn(T, N, generator=g),
        "terminated": torch.zeros(T, N, dtype=torch.bool),
        "truncated": torch.zeros(T, N, dtype=torch.bool),
    }
    if bad is not None:
        batch["reward"][1, 2] = bad
    return batch


def test_ppo_nan_reward_is_refused_or_its_loss_reported():
    T, N = 4, 4
    spec = Spec({"obs": ((3,), "float32"), "action": ((), "int64")})
    agent = PPO((3,), 2, config=PPOConfig(net_arch=(8,), n_epochs=2, minibatch_size=T * N,
                                          rollout_steps=T, num_envs=N))  # fmt: skip
    ro = RolloutStorage(spec, T, N)
    with pytest.raises(ValueError, match=r"reward .*\(nan\) at env 2, step 1 of the batch"):
        ro.add(_ppo_batch(T, N, 0, float("nan")), torch.zeros(N, 3))
    ro.add(_ppo_batch(T, N, 1), torch.zeros(N, 3))
    agent.check_finite(agent.update(ro), params=True)  # 2 epochs of one minibatch: 2 updates
    loose = RolloutStorage(spec, T, N, check_finite=False)
    loose.add(_ppo_batch(T, N, 2, float("nan")), torch.zeros(N, 3))
    metrics = agent.update(loose)
    with pytest.raises(ValueError, match=r"ppo: the loss turned non-finite .* at update 3 "
                                         r"\(updates so far: 4"):  # fmt: skip
        agent.check_finite(metrics)


@pytest.mark.parametrize("name", ["dqn", "sac", "td3", "sac_discrete", "ppo"])
def test_act_refuses_non_finite_observations(name):
    if name == "ppo":
        agent = PPO((3,), 2, config=PPOConfig(net_arch=(8,)))
    else:
        agent, _ = _agent(name)
    obs = torch.zeros(4, 3)
    obs[2, 1] = float("nan")
    for deterministic in (False, True):
        with pytest.raises(ValueError, match=r"obs .*\(nan\) at env 2 \(row 2\); no action"):
            agent.act(obs, deterministic=deterministic)


def test_act_checks_cpu_observations_with_one_free_read_per_call():
    """The check's cost: one read of a sum per ``act`` on the CPU (none on a GPU:
    tests/agents/test_host_reads.py)."""
    from tests.agents.test_host_reads import count_host_reads

    agent, _ = _agent("dqn")
    with count_host_reads() as reads:
        agent.act(torch.randn(5, 3)), agent.act(torch.randn(5, 3), deterministic=True)
    assert reads == ["item", "item"]


# --- settings -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["--learning-rate", "inf"],
        ["--learning-rate", "nan"],
        ["--set", "gamma=-inf"],
        ["--algo", "sac", "--env", "Pendulum-v1", "--max-grad-norm", "inf"],
        ["--compress-budget", "nan"],
    ],
)
def test_non_finite_settings_are_refused_when_parsed(argv, tmp_path, capsys):
    code = main(["train", "--run-dir", str(tmp_path), "--steps", "64", *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "expected a finite number" in err, err
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_settings_are_refused_in_code(value):
    for make in (DQNConfig, SACConfig, TD3Config, DiscreteSACConfig, PPOConfig):
        with pytest.raises(ValueError, match="learning_rate: expected a finite number"):
            make(learning_rate=value)
    from rlstash.train.config import TrainConfig

    with pytest.raises(ValueError, match="threshold: expected a finite number"):
        TrainConfig(threshold=value)


# --- rlstash train ------------------------------------------------------------------------


class NaNRewardEnv(gym.Env):
    """Random observations, two actions, reward 1 until the env's own step ``nan_after``,
    NaN from then on; episodes of 40 steps."""

    def __init__(self, nan_after: int = 300) -> None:
        self.observation_space = spaces.Box(-5, 5, (3,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.nan_after, self.steps, self.t = nan_after, 0, 0

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.normal(size=3).astype(np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.steps, self.t = self.steps + 1, self.t + 1
        reward = float("nan") if self.steps > self.nan_after else 1.0
        obs = self.np_random.normal(size=3).astype(np.float32)
        return obs, reward, False, self.t >= 40, {}


ENV_ID = "rlstash-test/NaNReward-v0"
if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point=NaNRewardEnv)
ENV = f"{__name__}:{ENV_ID}"


def _all_finite(obj: Any) -> bool:
    if isinstance(obj, torch.Tensor):
        return not obj.is_floating_point() or bool(torch.isfinite(obj).all())
    if isinstance(obj, dict):
        return all(_all_finite(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return all(_all_finite(v) for v in obj)
    if isinstance(obj, np.ndarray) and obj.dtype.kind == "f":
        return bool(np.isfinite(obj).all())
    return True


def _train(tmp_path: Path, capsys: Any, *argv: str) -> tuple[int, str, Path]:
    code = main(["train", "--quiet", "--device", "cpu", "--run-dir", str(tmp_path),
                 "--name", "r", "--eval-every", "100000", *argv])  # fmt: skip
    return code, capsys.readouterr().err.strip(), tmp_path / "r"


def _checkpoint_is_finite(run: Path, step: int) -> None:
    ckpt = checkpoint.latest(run)
    assert ckpt is not None
    state = checkpoint.load_state(ckpt)
    assert state["step"] == step and _all_finite(state)
    if (ckpt / "buffer.pt").exists():
        assert _all_finite(torch.load(ckpt / "buffer.pt", weights_only=False))


@pytest.mark.parametrize("algo", ["dqn", "ppo"])
def test_train_on_an_env_returning_nan_rewards_stops_in_one_line(algo, tmp_path, capsys):
    if algo == "dqn":
        flags = ["--steps", "2000", "--checkpoint-every", "64", "--learning-starts", "64",
                 "--train-freq", "32", "--batch-size", "16", "--buffer-size", "4096"]  # fmt: skip
    else:
        flags = ["--steps", "4000", "--checkpoint-every", "64", "--envs", "2",
                 "--rollout-steps", "32", "--n-epochs", "1", "--minibatch-size", "64"]  # fmt: skip
    code, err, run = _train(tmp_path, capsys, "--algo", algo, "--env", ENV,
                            "--net-arch", "16", *flags)  # fmt: skip
    assert code == 2 and "\n" not in err, err
    assert "reward has a non-finite value (nan) at " in err and "env 0" in err, err
    assert "nothing was written" in err and "training stopped at step" in err, err
    # the env turns NaN at its step 301: the last checkpoint is the one before it, all finite
    _checkpoint_is_finite(run, 256 if algo == "dqn" else 576)


def test_train_whose_loss_diverges_keeps_the_last_finite_checkpoint(tmp_path, capsys):
    """A learning rate of 1e30: the weights overflow at the first updates. The loss flag (or
    the weights' check before the checkpoint) stops the run; the checkpoint holds the step-64
    weights, taken before any update."""
    code, err, run = _train(
        tmp_path, capsys, "--env", "CartPole-v1", "--steps", "2000", "--checkpoint-every", "64",
        "--learning-starts", "128", "--train-freq", "32", "--batch-size", "16",
        "--net-arch", "16", "--learning-rate", "1e30",
    )  # fmt: skip
    assert code == 2 and "\n" not in err, err
    assert "dqn: " in err and "non-finite (NaN or inf)" in err and "updates so far" in err, err
    assert "the checkpoint" in err and "predates it" in err, err
    _checkpoint_is_finite(run, 64)


# --- on a GPU (marker gpu; skipped without CUDA) ------------------------------------------


@pytest.mark.gpu
def test_on_cuda_batches_are_checked_and_graphed_updates_watch_their_loss():
    """One device-to-host read per extend/add; the CUDA-graphed update's loss flag lives in
    the graph (replays update it) and is read by check_finite."""
    rb = ReplayBuffer(TensorStorage(SPEC, 16, device="cuda"))
    batch = {k: v.cuda() for k, v in _rows().items()}
    batch["obs"][5, 2] = float("inf")
    with pytest.raises(ValueError, match=r"obs has a non-finite value \(inf\) at row 5"):
        rb.extend(batch)
    assert len(rb) == 0
    ro = RolloutStorage(STEP, 3, 4, device="cuda")
    steps = {k: v.cuda() for k, v in _steps(3, 4).items()}
    steps["reward"][1, 2] = float("nan")
    with pytest.raises(ValueError, match=r"reward .*\(nan\) at env 2, step 1 of the batch"):
        ro.add(steps, torch.zeros(4, 2, device="cuda"))
    for name in ("dqn", "td3"):
        agent, make = _agent(name, compile=True)
        agent.to("cuda")
        for seed in range(8):  # 2 warm-up calls, a capture, replays; NaN at update 6
            batch = {
                k: v.cuda() for k, v in make(seed, float("nan") if seed == 5 else None).items()
            }
            metrics = agent.update(batch)
        with pytest.raises(ValueError, match=r"at update 6 \(updates so far: 8"):
            agent.check_finite(metrics)
