"""compile='auto' (the default, issue 15): an agent compiles its update once its eager updates
have taken ``compile_after_s`` seconds (60 s; env RLSTASH_COMPILE_AFTER), so a run too short
to repay a compilation never compiles; true compiles from the first update, false never."""

from __future__ import annotations

import pytest

from rlstash.agents.base import COMPILE_AFTER_S, SettingError, compile_after_s
from rlstash.agents.sac import SACConfig
from tests.agents.test_compiled import AGENTS, assert_same_agents

SAC_MAKE, SAC_BATCH = AGENTS["sac"]


def _sac(mode, after: float):
    agent = SAC_MAKE(False)
    agent.config.compile = mode
    agent.compile_after_s = after
    return agent


def test_auto_is_the_default_and_waits_for_the_eager_updates_to_take_the_threshold(aot_eager):
    assert SACConfig().compile == "auto"
    eager, auto = _sac(False, 0.0), _sac("auto", 1e-9)
    auto.load_state_dict(eager.state_dict())
    auto.update(SAC_BATCH(0))  # eager: no eager time counted yet
    eager.update(SAC_BATCH(0))
    assert auto._steps == {} and auto.eager_update_s > 0
    for i in range(1, 4):  # past the threshold: compiled, the same arithmetic
        auto.update(SAC_BATCH(i))
        eager.update(SAC_BATCH(i))
    assert "update" in auto._steps and auto.compile_seconds > 0
    assert eager._steps == {} and eager.compile_seconds == 0  # false never compiles
    assert_same_agents(eager, auto)


def test_a_run_shorter_than_the_threshold_never_compiles():
    agent = _sac("auto", 3600.0)
    for i in range(3):
        agent.update(SAC_BATCH(i))
    assert agent._steps == {} and 0 < agent.eager_update_s < 3600


def test_true_compiles_from_the_first_update(aot_eager):
    agent = _sac(True, float("inf"))
    agent.update(SAC_BATCH(0))
    assert "update" in agent._steps and agent.eager_update_s == 0


def test_the_eager_time_is_checkpointed(aot_eager):
    agent = _sac("auto", 1e-9)
    agent.update(SAC_BATCH(0))
    resumed = _sac("auto", 1e-9)
    resumed.load_state_dict(agent.state_dict())
    assert resumed.eager_update_s == agent.eager_update_s > 0
    resumed.update(SAC_BATCH(1))  # a resumed long run compiles at once
    assert "update" in resumed._steps


def test_the_threshold_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("RLSTASH_COMPILE_AFTER", raising=False)
    assert compile_after_s() == COMPILE_AFTER_S == 60.0
    monkeypatch.setenv("RLSTASH_COMPILE_AFTER", "2.5")
    assert compile_after_s() == 2.5 and SAC_MAKE(False).compile_after_s == 2.5
    monkeypatch.setenv("RLSTASH_COMPILE_AFTER", "inf")
    assert compile_after_s() == float("inf")
    for bad in ("soon", "-1", "nan"):
        monkeypatch.setenv("RLSTASH_COMPILE_AFTER", bad)
        with pytest.raises(SettingError, match="RLSTASH_COMPILE_AFTER: expected seconds >= 0"):
            compile_after_s()


@pytest.mark.parametrize("bad", ["maybe", 1, None])
def test_compile_takes_true_false_or_auto(bad):
    with pytest.raises((ValueError, TypeError), match="compile"):
        SACConfig(compile=bad)


@pytest.mark.parametrize(
    ("flags", "after", "says"),
    [(["--compile", "auto"], "0", True), ([], "inf", False), (["--no-compile"], "0", False)],
)
def test_train_says_how_long_compiling_took_only_when_it_compiled(
    flags, after, says, tmp_path, capsys, monkeypatch, aot_eager
):
    from rlstash.cli import main

    monkeypatch.setenv("RLSTASH_COMPILE_AFTER", after)
    argv = ["train", "--quiet", "--device", "cpu", "--run-dir", str(tmp_path), "--algo", "dqn"]
    argv += ["--env", "CartPole-v1", "--steps", "256", *flags, "--set", "net_arch=[8]"]
    argv += ["--set", "eval_every=512", "--set", "eval_episodes=1", "--set", "batch_size=16"]
    argv += ["--set", "learning_starts=64", "--set", "train_freq=16"]
    assert main(argv) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("compiled the update")]
    assert len(lines) == (1 if says else 0)


def test_a_wrong_compile_flag_is_one_line_exit_2(tmp_path, capsys):
    from rlstash.cli import main

    argv = ["train", "--run-dir", str(tmp_path), "--algo", "dqn", "--env", "CartPole-v1"]
    assert main([*argv, "--compile", "soon"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--compile" in err[0] and "auto" in err[0], err


def test_auto_does_not_compile_when_the_eager_time_left_cannot_repay_it(aot_eager):
    """A known horizon: past the threshold, "auto" compiles only while the eager time still
    ahead (updates left x mean eager update) is >= COMPILE_REPAY x the threshold."""
    from rlstash.agents.base import COMPILE_REPAY

    short = _sac("auto", 1e-9)
    short.planned_updates = 2  # past the threshold no update is left to repay a compile
    for i in range(3):
        short.update(SAC_BATCH(i))
    assert short._steps == {} and short.eager_update_s > 0
    long = _sac("auto", 1e-9)
    long.planned_updates = 10**9
    for i in range(3):
        long.update(SAC_BATCH(i))
    assert "update" in long._steps
    # the rule itself, at the numbers of a SAC Pendulum preset run (20k updates, 10 ms each):
    rule = _sac("auto", 60.0)
    rule.updates, rule.eager_update_s, rule.planned_updates = 6000, 60.0, 20_000
    assert 14_000 * 0.01 < COMPILE_REPAY * 60 and not rule._worth_compiling()
    rule.planned_updates = 100_000  # a 100k-step run: 940 s of eager updates ahead
    assert rule._worth_compiling()
    rule.planned_updates = None  # unknown horizon: the threshold alone decides
    assert rule._worth_compiling()


def test_once_auto_compiles_it_stays_compiled_to_the_end(aot_eager):
    agent = _sac("auto", 1e-9)
    agent.update(SAC_BATCH(0))
    agent.update(SAC_BATCH(1))
    assert "update" in agent._steps
    agent.planned_updates = agent.updates  # nothing left: a fresh decision would say no
    eager_s, compile_s = agent.eager_update_s, agent.compile_seconds
    agent.update(SAC_BATCH(2))
    assert agent._compile_now()
    assert agent.eager_update_s == eager_s  # the update ran compiled, not eager
    assert agent.compile_seconds == compile_s  # and was not compiled again


@pytest.mark.parametrize("algo", ["dqn", "ppo"])
def test_train_tells_the_agent_how_many_updates_the_run_takes(algo, tmp_path):
    from rlstash.train import builders, onpolicy
    from rlstash.train.config import TrainConfig
    from rlstash.train.loop import build_run

    loop = {"dqn": {"learning_starts": 64, "train_freq": 16, "gradient_steps": 2}, "ppo": {}}
    agent = {"dqn": {}, "ppo": {"rollout_steps": 32, "minibatch_size": 48, "n_epochs": 3}}
    cfg = TrainConfig(algo=algo, env="CartPole-v1", steps=1000, run_dir=str(tmp_path),
                      quiet=True, device="cpu", envs=2, agent=agent[algo], **loop[algo])  # fmt: skip
    run = build_run(cfg, tmp_path / "run")
    try:
        if algo == "dqn":
            assert run.limiter.min_size == 64
            assert run.agent.planned_updates == (1000 - 64) * 2 // 16
            assert builders.planned_updates(run.cfg, run.limiter) == run.agent.planned_updates
        else:
            assert run.learning is onpolicy.ROLLOUT
            # 1000 steps in rollouts of 32 x 2 = 64 frames: 16 rollouts of 3 epochs x 2 minibatches
            assert run.agent.planned_updates == 16 * 3 * 2
    finally:
        run.close()


def test_auto_leaves_ppos_written_gradient_eager_on_cpu(aot_eager):
    """PPO's written-out gradient runs at the compiled step's rate on CPU: 'auto' keeps it
    eager; the autograd update still compiles once past the threshold."""
    from rlstash.agents.ppo import PPO, PPOConfig
    from tests.agents.test_ppo_grad import _rollout

    agents = {}
    for backward in ("auto", "autograd"):
        agent = PPO((3,), 4, config=PPOConfig(net_arch=(8,), minibatch_size=16, backward=backward))
        agent.compile_after_s = 1e-9
        for seed in range(2):
            agent.update(_rollout(seed=seed))
        agents[backward] = agent
    assert agents["auto"]._steps == {} and agents["auto"].compile_seconds == 0
    assert agents["autograd"]._steps and agents["autograd"].compile_seconds > 0
