"""Atari preprocessing (issue 14): gymnasium's AtariPreprocessing on real ALE games, in the
torch-free workers; the life-loss terminal and reward clipping for training only; full games
with unclipped scores for evaluation. Skipped with the reason when ale-py or opencv is missing
(``python3 run.py test`` installs both: the ``atari`` extra)."""

from __future__ import annotations

import functools
import importlib.util

import numpy as np
import pytest

from rlstash.envs.atari import is_atari, make_atari

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("ale_py") is None or importlib.util.find_spec("cv2") is None,
    reason="ale-py / opencv are not installed (pip install 'rlstash[atari]')",
)


def _reference(env_id: str, stack: int) -> object:
    """Gymnasium's own wrappers, put together by hand."""
    import ale_py
    import gymnasium as gym
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

    gym.register_envs(ale_py)
    env = AtariPreprocessing(gym.make(env_id, frameskip=1))  # noop 30, skip 4, 84x84 gray
    return FrameStackObservation(env, stack, padding_type="reset") if stack > 1 else env


@pytest.mark.parametrize("stack", [1, 4])
def test_observations_equal_gymnasiums_atari_preprocessing(stack):
    """MsPacman (no FIRE, so no FireReset): the eval env is exactly gymnasium's
    AtariPreprocessing (+ FrameStackObservation) over ``frameskip=1``: same noop reset from the
    seed, same frames, rewards and flags for 300 random steps."""
    ours = make_atari("ALE/MsPacman-v5", train=False, frame_stack=stack)
    ref = _reference("ALE/MsPacman-v5", stack)
    try:
        o1, _ = ours.reset(seed=7)
        o2, _ = ref.reset(seed=7)
        want = (stack, 84, 84) if stack > 1 else (84, 84)
        assert o1.shape == want and o1.dtype == np.uint8
        np.testing.assert_array_equal(o1, o2)
        actions = np.random.default_rng(0).integers(0, ours.action_space.n, 300)
        for a in actions:
            s1, s2 = ours.step(int(a)), ref.step(int(a))
            np.testing.assert_array_equal(s1[0], s2[0])
            assert s1[1:4] == s2[1:4]
            if s1[2] or s1[3]:
                break
        assert ours.unwrapped._frameskip == 1  # the 4-frame skip is AtariPreprocessing's only
    finally:
        ours.close()
        ref.close()


def _play(env, seed: int, steps: int, rng_seed: int = 0):
    """(rewards, terminated, lives after each step, frame number after each reset)."""
    rng = np.random.default_rng(rng_seed)
    env.reset(seed=seed)
    ale = env.unwrapped.ale
    rewards, terms, lives, reset_frames = [], [], [], []
    for _ in range(steps):
        _, r, term, trunc, _ = env.step(int(rng.integers(env.action_space.n)))
        rewards.append(float(r))
        terms.append(bool(term))
        lives.append(ale.lives())
        if term or trunc:
            env.reset()
            reset_frames.append(ale.getEpisodeFrameNumber())
    return np.array(rewards), np.array(terms), np.array(lives), reset_frames


def test_training_env_ends_an_episode_per_life_without_restarting_the_game():
    """Training: terminated on each life loss, but the reset after it continues the game (the
    frame counter keeps running, lives stay lost); only game over restarts it."""
    env = make_atari("ALE/Breakout-v5", train=True)
    try:
        _, terms, lives, reset_frames = _play(env, seed=1, steps=600)
    finally:
        env.close()
    ends = np.flatnonzero(terms)
    assert len(ends) >= 2, "600 random steps of Breakout should lose at least 2 lives"
    assert all(lives[i] < lives[i - 1] or lives[i] == 0 for i in ends if i > 0)
    mid_game = [f for i, f in zip(ends, reset_frames) if lives[i] > 0]
    assert mid_game and all(f > 100 for f in mid_game)  # not a fresh game


def test_evaluation_env_plays_full_games():
    """Evaluation: a life loss does not end the episode; the episode ends at game over."""
    env = make_atari("ALE/Breakout-v5", train=False)
    try:
        _, terms, lives, _ = _play(env, seed=1, steps=1500)
    finally:
        env.close()
    ends = np.flatnonzero(terms)
    assert len(ends) >= 1, "1500 random steps of Breakout should end a game"
    assert all(lives[i] == 0 for i in ends)
    assert (np.diff(lives[: ends[0] + 1]) < 0).sum() >= 2  # lives were lost inside the game


def test_reward_clipped_for_training_only():
    """SpaceInvaders scores 5..30 points per alien: training sees sign(reward), evaluation the
    game score. Until the first life loss both envs play the same game (same seed, actions)."""
    train_env = make_atari("ALE/SpaceInvaders-v5", train=True)
    eval_env = make_atari("ALE/SpaceInvaders-v5", train=False)
    try:
        r_train, t_train, *_ = _play(train_env, seed=3, steps=400)
        r_eval, *_ = _play(eval_env, seed=3, steps=400)
    finally:
        train_env.close()
        eval_env.close()
    first_end = int(np.flatnonzero(t_train)[0]) if t_train.any() else len(r_train)
    assert set(np.unique(r_train)) <= {-1.0, 0.0, 1.0}
    assert r_eval.max() > 1.0  # unclipped points
    np.testing.assert_array_equal(r_train[:first_end], np.sign(r_eval[:first_end]))
    assert r_eval[:first_end].sum() > 1  # the comparison covered scoring steps


def test_fire_reset_only_where_the_game_has_fire():
    def wrappers(env):
        names = []
        while hasattr(env, "env"):
            names.append(type(env).__name__)
            env = env.env
        return names

    breakout, pacman = make_atari("ALE/Breakout-v5"), make_atari("ALE/MsPacman-v5")
    try:
        assert "FireReset" in wrappers(breakout) and "EpisodicLife" in wrappers(breakout)
        assert "FireReset" not in wrappers(pacman)
    finally:
        breakout.close()
        pacman.close()


@pytest.mark.multiproc
def test_preprocessing_runs_in_torch_free_workers():
    """The pool's workers apply the preprocessing: their stacks equal the same env stepped
    in-process, and no worker imported torch."""
    from rlstash.envs import ProcessPoolVectorEnv

    factory = functools.partial(make_atari, "ALE/Pong-v5", True)
    local = make_atari("ALE/Pong-v5", True)
    try:
        with ProcessPoolVectorEnv(factory, 1, num_workers=1, seed=5) as pool:
            obs, _ = pool.reset(seed=5)
            o_local, _ = local.reset(seed=5)
            assert obs.shape == (1, 4, 84, 84) and obs.dtype == np.uint8
            np.testing.assert_array_equal(obs[0], o_local)
            for a in [0, 1, 2, 3, 4, 5] * 5:
                obs, r, *_ = pool.step(np.array([a]))
                o_local, r_local, *_ = local.step(a)
                np.testing.assert_array_equal(obs[0], o_local)
            assert not any("torch" in m for info in pool.worker_info() for m in info["modules"])
    finally:
        local.close()


def test_bad_ids_and_settings_are_refused():
    assert is_atari("ALE/Pong-v5") and not is_atari("CartPole-v1")
    with pytest.raises(ValueError, match="env_id: expected an ALE id"):
        make_atari("CartPole-v1")
    with pytest.raises(ValueError, match="frame_stack: expected an int >= 1"):
        make_atari("ALE/Pong-v5", frame_stack=0)
