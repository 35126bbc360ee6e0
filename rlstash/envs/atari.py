"""Atari preprocessing for ``ALE/...`` ids, applied inside the (torch-free) env workers.

:func:`make_atari` builds what DQN and PPO on Atari train on, the wrappers of CleanRL's
``dqn_atari.py`` / Stable-Baselines3's ``AtariWrapper`` expressed with gymnasium's own
``AtariPreprocessing``, innermost first::

    gym.make(env_id, frameskip=1)      the id's other settings kept (v5: sticky actions 0.25,
                                       108,000 frames per game at most)
    AtariPreprocessing(noop_max=30, frame_skip=4, screen_size=84, grayscale)
                                       random no-ops on reset, 4 frames per step, max over the
                                       last two, 84x84 grayscale uint8
    EpisodicLife          (training)   terminated on a life loss; the game itself is reset
                                       only when it is over (SB3's EpisodicLifeEnv)
    FireReset             (games with FIRE) presses FIRE (then action 2) on reset, as CleanRL
    ClipReward            (training)   reward -> sign(reward)
    FrameStackObservation(4, padding_type="reset")   [4, 84, 84], oldest frame first

Evaluation envs (``train=False``) play full games (all lives) and report the unclipped game
score; after a life loss they press FIRE as the training env's reset does (otherwise a greedy
policy that never chose FIRE would wait, in Breakout, until the 108,000-frame limit; SB3's
evaluation does the same through its life-loss reset).

Why not ``AtariPreprocessing(terminal_on_life_loss=True)``: gymnasium's wrapper ends the
episode on a life loss and the vector env's autoreset then restarts the *whole game*, so the
agent would only ever see its first life. The stream storage rebuilds frame stacks the way
``FrameStackObservation(padding_type="reset")`` builds them, so a replay buffer stores each
84x84 frame once (``stacked_input=True``) and samples the very stacks the policy acted on.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

FRAME_STACK = 4
SCREEN = 84


def is_atari(env_id: Any) -> bool:
    """Whether ``env_id`` names an ALE game (``ALE/<Game>-v5``)."""
    return isinstance(env_id, str) and env_id.startswith("ALE/")


def make_atari(
    env_id: str, train: bool = True, frame_stack: int = FRAME_STACK, **kwargs: Any
) -> Any:
    """The preprocessed Atari env of the module docstring; ``train`` adds the life-loss
    terminal and reward clipping. ``kwargs`` go to ``gym.make`` (e.g. ``render_mode``)."""
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation, TransformReward

    from rlstash.envs.registry import make

    if not is_atari(env_id):
        raise ValueError(f"env_id: expected an ALE id such as 'ALE/Breakout-v5', got {env_id!r}")
    if isinstance(frame_stack, bool) or not isinstance(frame_stack, int) or frame_stack < 1:
        raise ValueError(f"frame_stack: expected an int >= 1, got {frame_stack!r}")
    env = make(env_id, frameskip=1, **kwargs)
    env = AtariPreprocessing(
        env, noop_max=30, frame_skip=4, screen_size=SCREEN, terminal_on_life_loss=False
    )
    env.metadata = {**env.metadata, "render_fps": 60 // 4}  # videos: a frame per agent step
    if train:
        env = EpisodicLife(env)
    if "FIRE" in env.unwrapped.get_action_meanings():
        env = FireReset(env, after_life_loss=not train)
    if train:
        env = TransformReward(env, np.sign)
    if frame_stack == 1:
        return env
    return FrameStackObservation(env, frame_stack, padding_type="reset")


def _lives(env: Any) -> int:
    return int(env.unwrapped.ale.lives())


class EpisodicLife(gym.Wrapper):
    """Terminated on a life loss, the game reset only once it is over (SB3's EpisodicLifeEnv):
    after a life loss ``reset`` takes one no-op step instead of restarting the game."""

    def __init__(self, env: Any):
        super().__init__(env)
        self.lives, self.game_over = 0, True

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = bool(terminated or truncated)
        lives = _lives(self.env)
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs: Any) -> tuple[Any, dict]:
        if self.game_over:
            obs, info = self.env.reset(**kwargs)
        else:  # a life was lost: continue the same game
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        self.lives, self.game_over = _lives(self.env), False
        return obs, info


class FireReset(gym.Wrapper):
    """Presses FIRE (action 1) then action 2 on reset, for games that wait for FIRE (CleanRL's
    and SB3's FireResetEnv). With ``after_life_loss`` (evaluation of full games) it does the
    same after each life loss, adding those steps' rewards to the step's."""

    def __init__(self, env: Any, after_life_loss: bool = False):
        super().__init__(env)
        self.after_life_loss, self.lives = after_life_loss, 0

    def reset(self, **kwargs: Any) -> tuple[Any, dict]:
        self.env.reset(**kwargs)
        obs, info = self._press(kwargs)
        self.lives = _lives(self.env)
        return obs, info

    def _press(self, reset_kwargs: dict) -> tuple[Any, dict]:
        obs, info = None, {}
        for action in (1, 2):
            obs, _, terminated, truncated, info = self.env.step(action)
            if terminated or truncated:
                obs, info = self.env.reset(**reset_kwargs)
        return obs, info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        lives = _lives(self.env)
        if self.after_life_loss and 0 < lives < self.lives and not (terminated or truncated):
            for fire in (1, 2):
                obs, extra, terminated, truncated, info = self.env.step(fire)
                reward += extra
                if terminated or truncated:
                    break
        self.lives = _lives(self.env)
        return obs, reward, terminated, truncated, info
