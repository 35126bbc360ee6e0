"""EnvPool's envs behind rlstash's contract (EnvPoolVectorEnv), compared field by field with
rlstash's gymnasium envs where the emulator permits, and where they differ, why:

* CartPole: EnvPool draws its initial states with its own generator (std::mt19937), so the
  same seed starts elsewhere; from the same state (gymnasium's set to EnvPool's reset
  observation) observations, rewards and flags agree step by step to float32 precision.
* HalfCheetah: likewise from the same state (qpos = [x=0, obs[:8]], qvel = obs[8:]; the
  dynamics do not depend on x): observations and rewards agree to 1e-6 (MuJoCo builds).
* Atari: EnvPool's no-op count, sticky actions and FIRE reset draw from its own generators
  and its FIRE reset is one frame (rlstash: FIRE then action 2, 4 frames each), so rlstash's
  settings give other games than gymnasium's ALE for the same seed. With those random parts
  fixed on both sides (one no-op frame after the reset, no sticky actions, no FIRE reset)
  frames (84x84 grey, max-pooled, 4 frames per step), stacks, rewards, lives and flags agree
  pixel for pixel over a whole game, except the reset frame (EnvPool's is the frame after its
  no-op, gymnasium's the one before: they differ in Pong, so stacks are compared once it has
  left them) and the frame of the step that ends the game in Pong (EnvPool skips the max-pool
  when the game ends within a step's frames).

Skipped with the reason when envpool (``pip install 'rlstash[envpool]'``), ale-py or mujoco
is missing.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("envpool", reason="EnvPool backend: pip install 'rlstash[envpool]'")

import gymnasium as gym  # noqa: E402

from rlstash.envs.envpool_env import EnvPoolVectorEnv, supported  # noqa: E402

# the random parts of EnvPool's Atari reset fixed (see the module docstring)
FIXED_ATARI = {"noop_max": 1, "use_fire_reset": False, "repeat_action_probability": 0.0}


def test_ids_translate_and_unknown_ids_are_refused_with_the_fix():
    assert supported("ALE/Pong-v5") and supported("CartPole-v1")
    assert not supported("envpool:CartPole-v1") and not supported("NoSuchEnv-v0")
    with pytest.raises(ValueError, match="EnvPool has no env 'NoSuchEnv-v0'.*--env-backend gym"):
        EnvPoolVectorEnv("NoSuchEnv-v0", 2)


def test_same_step_autoreset_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="autoreset_mode: EnvPool resets an ended env at its"):
        EnvPoolVectorEnv("CartPole-v1", 2, autoreset_mode="SameStep")


def test_cartpole_follows_gymnasium_from_the_same_state():
    env = EnvPoolVectorEnv("CartPole-v1", 1, seed=3, env_kwargs={"max_episode_steps": 40})
    obs, _ = env.reset()
    assert env.single_observation_space == gym.make("CartPole-v1").observation_space
    ref = gym.make("CartPole-v1", max_episode_steps=40)
    ref.reset(seed=0)
    ref.unwrapped.state = obs[0].astype(np.float64)
    ended_by = None
    for t in range(40):
        a = int(3 * obs[0, 2] + obs[0, 3] > 0)  # balance: the episode lasts to the limit
        obs, r, term, trunc, _ = env.step(np.array([a]))
        gobs, gr, gterm, gtrunc, _ = ref.step(a)
        np.testing.assert_allclose(obs[0], gobs, atol=1e-5, err_msg=f"step {t}")
        assert (r[0], term[0], trunc[0]) == (gr, gterm, gtrunc), t
        assert r.dtype == np.float64
        if gterm or gtrunc:
            ended_by = "truncated" if gtrunc else "terminated"
            break
    assert ended_by == "truncated"  # truncation kept apart from termination
    obs, r, term, trunc, _ = env.step(np.array([0]))  # next-step autoreset: a reset step
    assert (r[0], term[0], trunc[0]) == (0.0, False, False)
    assert np.abs(obs[0]).max() <= 0.05  # CartPole's reset range
    env.close()


def test_halfcheetah_follows_gymnasium_from_the_same_state():
    pytest.importorskip("mujoco", reason="gymnasium's HalfCheetah: pip install 'rlstash[mujoco]'")
    env = EnvPoolVectorEnv("HalfCheetah-v5", 1, seed=0)
    obs, _ = env.reset()
    ref = gym.make("HalfCheetah-v5")
    ref.reset(seed=0)
    assert env.single_observation_space.shape == ref.observation_space.shape
    ref.unwrapped.set_state(np.concatenate([[0.0], obs[0, :8]]), obs[0, 8:])
    rng = np.random.default_rng(0)
    for t in range(50):
        a = rng.uniform(-1, 1, 6)
        obs, r, term, trunc, _ = env.step(a[None])
        gobs, gr, gterm, gtrunc, _ = ref.step(a)
        np.testing.assert_allclose(obs[0], gobs, atol=1e-6, err_msg=f"step {t}")
        assert r[0] == pytest.approx(gr, abs=1e-6), t
        assert (term[0], trunc[0]) == (gterm, gtrunc)
    env.close()


def _gymnasium_atari(game: str, stack: bool = True):
    """rlstash's gymnasium Atari path (rlstash.envs.atari) with the random parts fixed."""
    ale_py = pytest.importorskip("ale_py", reason="gymnasium's ALE: pip install 'rlstash[atari]'")
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

    gym.register_envs(ale_py)
    env = gym.make(f"ALE/{game}-v5", frameskip=1, repeat_action_probability=0.0)
    env = AtariPreprocessing(env, noop_max=0, frame_skip=4, screen_size=84)
    return FrameStackObservation(env, 4, padding_type="reset") if stack else env


@pytest.mark.parametrize(("game", "steps"), [("Breakout", 400), ("Pong", 1200)])
def test_atari_frames_and_stacks_match_gymnasium_pixel_for_pixel(game, steps):
    env = EnvPoolVectorEnv(f"ALE/{game}-v5", 1, seed=0, train=False, env_kwargs=FIXED_ATARI)
    ref = _gymnasium_atari(game)
    obs, _ = env.reset()
    gobs, _ = ref.reset(seed=0)
    ref.unwrapped.ale.act(0)  # EnvPool's one no-op frame after the reset
    assert obs.shape == (1, 4, 84, 84) and obs.dtype == np.uint8
    assert env.single_observation_space == ref.observation_space
    assert (obs[0] == obs[0, :1]).all()  # the reset frame fills the stack
    rng = np.random.default_rng(0)
    for t in range(steps):
        a = int(rng.integers(0, env.single_action_space.n))
        obs, r, term, trunc, info = env.step(np.array([a]))
        gobs, gr, gterm, gtrunc, ginfo = ref.step(a)
        assert (r[0], term[0], trunc[0]) == (gr, gterm, gtrunc), t
        assert info["lives"][0] == ginfo["lives"], t
        if gterm or gtrunc:
            if game == "Breakout":
                np.testing.assert_array_equal(obs[0], gobs)
            # Pong: the game ended within the step's frames, EnvPool did not max-pool them
            np.testing.assert_array_equal(obs[0, :3], gobs[:3])
            assert t >= 3
            break
        np.testing.assert_array_equal(obs[0, -1], gobs[-1], err_msg=f"{game} step {t}")
        if t >= 3:  # the reset frame has left the stack (EnvPool's: after its no-op frame)
            np.testing.assert_array_equal(obs[0], gobs, err_msg=f"{game} step {t}")
    else:
        pytest.fail(f"{game}: the game did not end within {steps} steps")
    env.close()


def test_atari_training_semantics():
    """train=True: a life loss is a terminal, the game goes on (lives and the step count do
    not restart); rewards are clipped, the game's score stays in infos["reward"]."""
    env = EnvPoolVectorEnv("ALE/Breakout-v5", 2, seed=1)
    obs, info = env.reset()
    assert env.options["episodic_life"] and env.options["reward_clip"]
    assert env.options["stack_num"] == 1 and env.options["repeat_action_probability"] == 0.25
    rng = np.random.default_rng(1)
    life_losses = 0
    ended = np.zeros(2, dtype=bool)
    before = info
    for _ in range(3000):
        obs, r, term, trunc, info = env.step(rng.integers(0, 4, 2))
        assert set(np.unique(r)) <= {-1.0, 0.0, 1.0}
        np.testing.assert_array_equal(np.sign(info["reward"]), r)
        for e in np.flatnonzero(ended):  # the reset step after an episode end
            assert (r[e], term[e], trunc[e]) == (0.0, False, False)
            assert (obs[e] == obs[e, :1]).all()  # the stack starts again from one frame
            if not before["terminated"][e]:  # a life loss, not a game over
                life_losses += 1
                assert info["lives"][e] == before["lives"][e] > 0  # no game restart
                assert info["elapsed_step"][e] >= before["elapsed_step"][e] > 0
        for e in np.flatnonzero(term & ~np.asarray(info["terminated"], bool)):
            assert 0 < info["lives"][e] < before["lives"][e]  # ended by a life loss
        ended, before = term | trunc, info
        if life_losses >= 2:
            break
    assert life_losses >= 2
    env.close()


def test_asynchronous_batches_name_their_envs():
    env = EnvPoolVectorEnv("CartPole-v1", 6, seed=0, batch_size=3, num_threads=2)
    with pytest.raises(RuntimeError, match="asynchronous"):
        env.step(np.zeros(6))
    env.async_reset()
    seen = set()
    for _ in range(20):
        obs, r, term, trunc, info = env.recv()
        ids = info["env_id"]
        assert obs.shape == (3, 4) and len(ids) == 3 and len(set(ids.tolist())) == 3
        seen |= set(ids.tolist())
        env.send(np.zeros(3, dtype=np.int64), ids)
    assert seen == set(range(6))
    env.close()


def test_the_collector_accepts_it_and_its_reset_seed():
    import torch

    from rlstash.collect.sync import Collector

    env = EnvPoolVectorEnv("CartPole-v1", 4, seed=0)
    collector = Collector(env, lambda obs: torch.zeros(len(obs), dtype=torch.int64), 8)
    collector.reset(seed=5)
    batch = collector.collect()
    assert batch["obs"].shape == (2, 4, 4)  # [T, N, 4]: 8 frames of 4 envs
    assert env._seed == 5  # a new seed rebuilt the pool (env i: 5 + i)
    env.close()
