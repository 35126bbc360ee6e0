"""Environments that misbehave on purpose, for tests and benchmarks (torch-free).

* :class:`BurnEnv` burns a fixed CPU time per step (shows parallel scaling).
* :class:`CrashEnv` raises, segfaults or exits at a chosen step.
* :class:`HangEnv` stops answering at a chosen step or reset (optionally only once a flag
  file exists: e.g. only in the envs of a restarted worker).
* :class:`SpacesEnv` has Dict/Tuple observation and action spaces of every supported kind.
* :class:`InfoEnv` returns infos of every kind in turn (how infos travel).
* :class:`CountEnv` is deterministic: the observation is (seed, step) and episodes have a
  fixed length, so tests can check exactly what came back.

All are importable by workers (this module imports only numpy and gymnasium) and are
registered as gymnasium ids ``rlstash/Burn-v0``, ``rlstash/Crash-v0``, ``rlstash/Hang-v0``,
``rlstash/Spaces-v0``, ``rlstash/Count-v0`` when this module is imported; in a fresh process
use ``"rlstash.envs.testing:rlstash/Burn-v0"`` so gymnasium imports it first.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class BurnEnv(gym.Env):
    """Each step busy-loops ``step_us`` microseconds of CPU; observation [4] float32,
    two discrete actions, episodes of ``episode_len`` steps (truncated)."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, step_us: float = 200.0, episode_len: int = 1000) -> None:
        self.step_us = float(step_us)
        self.episode_len = int(episode_len)
        self.observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = spaces.Discrete(2)
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._t = 0
        return self.np_random.uniform(-1, 1, 4).astype(np.float32), {}

    def step(self, action: Any):
        end = time.thread_time_ns() + int(self.step_us * 1000)
        x = 0
        while time.thread_time_ns() < end:
            x += 1
        self._t += 1
        obs = np.full(4, (self._t % 100) / 100.0, dtype=np.float32)
        return obs, 1.0, False, self._t >= self.episode_len, {}


class CountEnv(gym.Env):
    """obs = [seed or -1, t] (float64), reward = t, terminated at ``episode_len``; the info
    carries ``{"t": t}`` every ``info_every`` steps (0: never)."""

    def __init__(self, episode_len: int = 5, info_every: int = 0) -> None:
        self.episode_len = episode_len
        self.info_every = info_every
        self.observation_space = spaces.Box(-np.inf, np.inf, (2,), np.float64)
        self.action_space = spaces.Discrete(3)
        self._seed = -1
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self._seed = seed
        self._t = 0
        return np.array([self._seed, 0.0]), ({"reset": True} if self.info_every else {})

    def scaled(self, k: int, offset: int = 0) -> int:
        """``k * episode_len + offset`` (to test ``ProcessPoolVectorEnv.call`` with arguments)."""
        return k * self.episode_len + offset

    def step(self, action: Any):
        self._t += 1
        info = {"t": self._t} if self.info_every and self._t % self.info_every == 0 else {}
        obs = np.array([self._seed, self._t], dtype=np.float64)
        return obs, float(self._t) + int(action), self._t >= self.episode_len, False, info


class CrashEnv(CountEnv):
    """Fails at its ``crash_at``-th step since construction: ``mode="exception"`` raises
    RuntimeError, ``"segfault"`` sends itself SIGSEGV, ``"exit"`` calls ``os._exit(7)``.

    ``once_file``: if set, crash only if that file does not exist yet, and create it when
    crashing (so the restarted worker behaves)."""

    def __init__(
        self, crash_at: int = 3, mode: str = "exception", once_file: str | None = None
    ) -> None:
        super().__init__(episode_len=1000)
        if mode not in ("exception", "segfault", "exit"):
            raise ValueError(f"mode: expected 'exception', 'segfault' or 'exit', got {mode!r}")
        self.crash_at, self.mode, self.once_file = crash_at, mode, once_file
        self._steps = 0

    def step(self, action: Any):
        self._steps += 1
        if self._steps == self.crash_at and self._should_crash():
            if self.mode == "exception":
                raise RuntimeError(f"CrashEnv: planned crash at step {self._steps}")
            if self.mode == "segfault":
                os.kill(os.getpid(), signal.SIGSEGV)
                time.sleep(10)
            os._exit(7)
        return super().step(action)

    def _should_crash(self) -> bool:
        if self.once_file is None:
            return True
        try:
            fd = os.open(self.once_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        os.close(fd)
        return True


class HangEnv(CountEnv):
    """Sleeps ``hang_s`` seconds at its ``hang_at``-th step since construction
    (``during="reset"``: its ``hang_at``-th reset), once per ``once_file`` if given (like
    :class:`CrashEnv`). ``armed_file``: hang only if that file exists when the moment comes
    (a test creates it to make only the envs of a restarted worker hang)."""

    def __init__(
        self,
        hang_at: int = 3,
        hang_s: float = 3600.0,
        once_file: str | None = None,
        during: str = "step",
        armed_file: str | None = None,
    ):
        super().__init__(episode_len=1000)
        if during not in ("step", "reset"):
            raise ValueError(f"during: expected 'step' or 'reset', got {during!r}")
        self.hang_at, self.hang_s, self.once_file = hang_at, hang_s, once_file
        self.during, self.armed_file = during, armed_file
        self._counts = {"step": 0, "reset": 0}

    def _maybe_hang(self, what: str) -> None:
        self._counts[what] += 1
        if what != self.during or self._counts[what] != self.hang_at:
            return
        if self.armed_file is not None and not os.path.exists(self.armed_file):
            return
        if CrashEnv._should_crash(self):  # type: ignore[arg-type]
            time.sleep(self.hang_s)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        self._maybe_hang("reset")
        return super().reset(seed=seed, options=options)

    def step(self, action: Any):
        self._maybe_hang("step")
        return super().step(action)


class SpacesEnv(gym.Env):
    """Dict/Tuple observation and action spaces covering Box, Discrete, MultiDiscrete and
    MultiBinary; deterministic observations derived from the step count and the action."""

    def __init__(self, episode_len: int = 4) -> None:
        self.episode_len = episode_len
        self.observation_space = spaces.Dict(
            {
                "pos": spaces.Box(-10, 10, (3,), np.float32),
                "id": spaces.Discrete(5),
                "parts": spaces.Tuple((spaces.MultiDiscrete([3, 4]), spaces.MultiBinary(5))),
                "img": spaces.Box(0, 255, (2, 3, 3), np.uint8),
            }
        )
        self.action_space = spaces.Tuple((spaces.Discrete(4), spaces.Box(-1, 1, (2,), np.float64)))
        self._t = 0
        self._seed = 0

    def _obs(self, a: int = 0) -> dict:
        t = self._t
        return {
            "pos": np.array([t, self._seed % 10, a], dtype=np.float32),
            "id": np.int64((t + a) % 5),
            "parts": (np.array([t % 3, a % 4]), np.array([t & 1, 1, 0, a & 1, 1], dtype=np.int8)),
            "img": np.full((2, 3, 3), (t * 7 + a) % 256, dtype=np.uint8),
        }

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self._seed = seed
        self._t = 0
        return self._obs(), {}

    def step(self, action: Any):
        discrete, box = action
        self._t += 1
        reward = float(discrete) + float(np.sum(box))
        return self._obs(int(discrete)), reward, self._t >= self.episode_len, False, {}


class InfoEnv(CountEnv):
    """A :class:`CountEnv` whose step infos change shape over time, to test how infos
    travel: phases of ``phase_len`` steps cycle through number infos of one schema (MuJoCo
    style), other number types, a key missing in odd envs, a string, an int beyond 2**53, a
    nested dict, and no info. ``index``: the env's position (odd ones differ sometimes)."""

    def __init__(self, index: int = 0, phase_len: int = 3) -> None:
        super().__init__(episode_len=7)
        self.index, self.phase_len = index, phase_len
        self._steps = 0

    def step(self, action: Any):
        obs, reward, term, trunc, _ = super().step(action)
        self._steps += 1
        t, odd = self._steps, self.index % 2 == 1
        phase = (t // self.phase_len) % 8
        info: dict[str, Any] = {
            0: {"x": float(t), "v": np.float64(-t), "c": np.float32(t / 4)},
            1: {"n": t, "ok": bool(t % 2), "h": np.float16(t), "k": np.int16(-t)},
            2: {"x": float(t)} if odd else {"x": float(t), "y": 1.5},
            3: {"x": float(t), "name": "a" * (t % 3)},
            4: {"big": (1 << 60) + t if odd else t},
            5: {"x": {"inner": float(t)}},
            6: {},
            7: {"x": np.int32(t)} if odd else {"x": float(t)},
        }[phase]
        return obs, reward, term, trunc, info


for _name, _cls in (
    ("Burn", BurnEnv),
    ("Crash", CrashEnv),
    ("Hang", HangEnv),
    ("Spaces", SpacesEnv),
    ("Count", CountEnv),
):
    _id = f"rlstash/{_name}-v0"
    if _id not in gym.registry:
        gym.register(_id, entry_point=f"{__name__}:{_cls.__name__}", disable_env_checker=True)
