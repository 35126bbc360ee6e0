"""EnvPool's C++ envs behind rlstash's vector-env contract (``pip install 'rlstash[envpool]'``;
envpool is imported only here, when a pool is made).

    env = EnvPoolVectorEnv("ALE/Pong-v5", num_envs=8, seed=0)     # Atari as rlstash trains it
    obs, infos = env.reset()                                       # obs: uint8 [8, 4, 84, 84]
    obs, rewards, terminated, truncated, infos = env.step(actions)

Ids are gymnasium's: ``ALE/<Game>-v5`` becomes EnvPool's ``<Game>-v5``, every other id is
EnvPool's own (``CartPole-v1``, ``HalfCheetah-v5``, ...; :func:`supported`). What rlstash
promises, kept where EnvPool differs:

* **Autoreset**: next-step (gymnasium's default, EnvPool's own): the step after an episode end
  resets that env, ignores its action and returns its reset observation with reward 0 and no
  flags. ``metadata["autoreset_mode"]`` says so. Same-step autoreset (final observations in
  ``infos``) is refused: EnvPool cannot reset one env within a synchronous step.
* **Termination vs truncation**: EnvPool's ``trunc`` (its step limit) is ``truncated``; every
  other end is ``terminated``.
* **Rewards** float64 as gymnasium's vector envs return them (EnvPool: float32).
* **Atari** (:mod:`rlstash.envs.atari` defines it): no-ops (up to 30) on reset, 4 frames per
  step with the max over the last two, 84x84 grey, sticky actions 0.25 and 27,000 steps
  (108,000 frames) as ALE v5, FIRE on reset for games with FIRE; ``train=True``: a life loss
  is a terminal without a game restart and rewards are clipped to their sign; ``train=False``
  plays full games with the game score. EnvPool makes single frames (``stack_num=1``) and this
  class stacks 4 of them, oldest first, a reset frame filling the stack
  (``FrameStackObservation(4, padding_type="reset")``), so the observations are those of
  :func:`rlstash.envs.atari.make_atari` and the stream rebuilds the same stacks from single
  frames. Where EnvPool's Atari differs (not configurable): after a reset it presses FIRE
  once (rlstash: FIRE then action 2), after a life loss it plays random no-ops then FIRE
  (rlstash: one no-op, FIRE, action 2), and its emulator build and random streams are its
  own, so the same seed gives other games than gymnasium's ALE
  (``tests/envs/test_envpool.py`` compares field by field where the emulator permits).
* ``reset(seed=s)``: EnvPool seeds its envs when made (env i: ``s + i``), so a new seed
  rebuilds the pool; ``reset()`` without a seed resets every env.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from rlstash import autoreset

_INFO_LEFT_OUT = ("players", "ram")  # nested ids; Atari's 128-byte RAM per step
INSTALL_HINT = "pip install 'rlstash[envpool]'"
FRAME_STACK = 4
ATARI_OPTIONS = {  # rlstash's Atari path (rlstash.envs.atari), in EnvPool's option names
    "stack_num": 1,
    "frame_skip": 4,
    "noop_max": 30,
    "img_height": 84,
    "img_width": 84,
    "gray_scale": True,
    "use_inter_area_resize": True,
    "use_fire_reset": True,
    "repeat_action_probability": 0.25,  # ALE v5
    "max_episode_steps": 27_000,  # 108,000 frames
}


def import_envpool() -> Any:
    """The ``envpool`` module, or a ModuleNotFoundError with the install hint."""
    try:
        import envpool
    except ImportError as exc:
        raise ModuleNotFoundError(
            f"the EnvPool env backend needs the envpool package, which is not installed "
            f"({exc}); install it with: {INSTALL_HINT}"
        ) from exc
    return envpool


def installed() -> bool:
    """Whether envpool can be imported."""
    try:
        import_envpool()
    except ModuleNotFoundError:
        return False
    return True


def task_id(env_id: str) -> str:
    """EnvPool's name of a gymnasium id: ``ALE/Pong-v5`` -> ``Pong-v5``; others unchanged."""
    return env_id[len("ALE/") :] if env_id.startswith("ALE/") else env_id


def supported(env_id: Any) -> bool:
    """Whether envpool is installed and has ``env_id`` (gymnasium's spelling)."""
    if not isinstance(env_id, str) or ":" in env_id or not installed():
        return False
    return task_id(env_id) in set(import_envpool().list_all_envs())


def _check_supported(env_id: Any) -> str:
    envpool = import_envpool()
    if not isinstance(env_id, str):
        raise TypeError(f"env_id: expected a gymnasium env id (str), got {env_id!r}")
    task = task_id(env_id)
    if ":" in env_id or task not in set(envpool.list_all_envs()):
        raise ValueError(
            f"env: EnvPool has no env {env_id!r} (EnvPool {envpool.__version__} names it "
            f"{task!r}); see envpool.list_all_envs(), or use --env-backend gymnasium"
        )
    return task


class EnvPoolVectorEnv(VectorEnv):
    """A gymnasium ``VectorEnv`` over one synchronous EnvPool (see the module docstring)."""

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        seed: int | None = None,
        *,
        train: bool = True,
        num_threads: int | None = None,
        batch_size: int | None = None,
        autoreset_mode: str | AutoresetMode = "NextStep",
        env_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        """Make ``num_envs`` envs of ``env_id`` (gymnasium's id) in EnvPool.

        Args:
            env_id: ``ALE/<Game>-v5`` (preprocessed as :mod:`rlstash.envs.atari`) or an id
                EnvPool has (``CartPole-v1``, ``HalfCheetah-v5``...).
            num_envs: N.
            seed: env i's seed is ``seed + i`` (EnvPool's own seeding); None: 0.
            train: Atari only: life loss as terminal and clipped rewards (True) or full
                games with the game score (False).
            num_threads: EnvPool's threads (None: EnvPool's default, the cores).
            batch_size: B < N: asynchronous batches (:meth:`async_reset`, :meth:`recv`,
                :meth:`send`; :class:`rlstash.collect.async_batches.AsyncBatchCollector`),
                ``recv`` returns the first B envs that are ready. None: N (synchronous).
            autoreset_mode: ``"NextStep"`` only (EnvPool's; same-step is refused).
            env_kwargs: more EnvPool options (``envpool.make_gymnasium`` keywords).
        """
        self._task = _check_supported(env_id)
        mode = autoreset.TOKEN[autoreset.resolve(autoreset_mode)]
        if mode != "next_step":
            raise ValueError(
                f"autoreset_mode: EnvPool resets an ended env at its next step, got "
                f"{autoreset_mode!r}; use autoreset_mode='NextStep' (or the gymnasium backend "
                "for same-step autoreset)"
            )
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs: expected an int >= 1, got {num_envs!r}")
        self.env_id, self.num_envs, self.train = env_id, num_envs, bool(train)
        self.atari = env_id.startswith("ALE/")
        self._options: dict[str, Any] = dict(env_kwargs or {})
        if num_threads is not None:
            self._options["num_threads"] = int(num_threads)
        if batch_size is not None:
            if isinstance(batch_size, bool) or not isinstance(batch_size, int):
                raise TypeError(f"batch_size: expected an int or None, got {batch_size!r}")
            if not 1 <= batch_size <= num_envs:
                raise ValueError(f"batch_size: expected 1..num_envs ({num_envs}), got {batch_size}")
            self._options["batch_size"] = batch_size
        self.batch_size = batch_size or num_envs
        if self.atari:
            self._options = {
                **ATARI_OPTIONS,
                "episodic_life": self.train,
                "reward_clip": self.train,
                **self._options,
            }
        self._seed = 0 if seed is None else int(seed)
        self._pool = self._make(self._seed)
        with warnings.catch_warnings():  # its float64 bounds cast to float32 spaces
            warnings.filterwarnings("ignore", message=".*precision lowered by casting")
            single_obs, single_act = self._pool.observation_space, self._pool.action_space
        if self.atari:
            h, w = single_obs.shape[-2:]
            single_obs = spaces.Box(0, 255, (FRAME_STACK, h, w), np.uint8)
        self.single_observation_space = single_obs
        self.single_action_space = single_act
        self.observation_space = batch_space(single_obs, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}
        self.render_mode = None
        self._stacks: np.ndarray | None = None
        self._ended = np.zeros(num_envs, dtype=bool)
        self.closed = False

    def _make(self, seed: int) -> Any:
        envpool = import_envpool()
        with warnings.catch_warnings():  # its float64 bounds cast to float32 spaces
            warnings.filterwarnings("ignore", message=".*precision lowered by casting")
            pool = envpool.make_gymnasium(
                self._task, num_envs=self.num_envs, seed=seed, **self._options
            )
            pool.observation_space, pool.action_space  # noqa: B018 - built here, quietly
        return pool

    @property
    def options(self) -> dict[str, Any]:
        """The EnvPool options this pool was made with (beyond ``num_envs`` and ``seed``)."""
        return dict(self._options)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset every env; ``seed``: rebuild with env i seeded ``seed + i``."""
        if options:
            raise ValueError(
                f"options: EnvPoolVectorEnv.reset takes no options, got {sorted(options)}"
            )
        if seed is not None and int(seed) != self._seed:
            self._pool.close()
            self._seed = int(seed)
            self._pool = self._make(self._seed)
        if self.batch_size != self.num_envs:
            raise RuntimeError(
                f"reset: this pool has batch_size={self.batch_size} < num_envs={self.num_envs} "
                "(asynchronous); use async_reset/recv (AsyncBatchCollector)"
            )
        obs, info = self._pool.reset()
        self._ended[:] = False
        every = np.arange(self.num_envs)
        obs = self._observe(obs, np.ones(self.num_envs, dtype=bool), every)
        return obs, self._infos(info, self.num_envs)

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        """One step of every env (next-step autoreset: an ended env resets at its next step)."""
        if self.batch_size != self.num_envs:
            raise RuntimeError(
                f"step: this pool has batch_size={self.batch_size} < num_envs={self.num_envs} "
                "(asynchronous); use send/recv (AsyncBatchCollector)"
            )
        result = self._pool.step(self._actions(actions))
        return self._result(result, np.arange(self.num_envs))

    def async_reset(self) -> None:
        """Reset every env; their reset observations arrive through :meth:`recv`."""
        self._pool.async_reset()
        self._ended[:] = True  # each env's next result is a reset observation

    def send(self, actions: Any, env_ids: Any) -> None:
        """Actions ``[B, ...]`` for the envs ``env_ids`` ([B] ints, from :meth:`recv`)."""
        self._pool.send(self._actions(actions), np.asarray(env_ids, dtype=np.int32))

    def _actions(self, actions: Any) -> np.ndarray:
        """Actions in EnvPool's dtype (it refuses others)."""
        return np.asarray(actions, dtype=self.single_action_space.dtype)

    def recv(self) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        """The results of the next B envs that are ready: ``(obs, reward, terminated,
        truncated, infos)`` with ``infos["env_id"]`` ([B]) naming them."""
        result = self._pool.recv()
        ids = np.asarray(result[4]["env_id"], dtype=np.int64)
        return self._result(result, ids)

    def _result(self, result: tuple, ids: np.ndarray) -> tuple:
        obs, rew, term, trunc, info = result
        fresh = self._ended[ids]  # these envs' observations are reset observations
        term, trunc = np.asarray(term, dtype=bool), np.asarray(trunc, dtype=bool)
        self._ended[ids] = term | trunc
        obs = self._observe(obs, fresh, ids)
        infos = self._infos(info, len(ids))
        return obs, np.asarray(rew, dtype=np.float64), term, trunc, infos

    def _observe(self, obs: np.ndarray, fresh: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """Atari: EnvPool's single frames [B, 1, H, W] into the envs' stacks [B, 4, H, W],
        oldest first; a reset frame fills its env's stack. Other envs: as EnvPool returns
        them (copied: EnvPool may reuse its buffers)."""
        if not self.atari:
            return np.array(obs)
        frames = obs[:, -1]
        if self._stacks is None:
            self._stacks = np.zeros((self.num_envs, FRAME_STACK, *frames.shape[1:]), np.uint8)
        rows = self._stacks[ids]
        rows[:, :-1] = rows[:, 1:].copy()
        rows[:, -1] = frames
        if fresh.any():
            rows[fresh] = frames[fresh][:, None]
        self._stacks[ids] = rows
        return rows

    def _infos(self, info: Mapping[str, Any], rows: int) -> dict[str, Any]:
        """gymnasium-style infos: EnvPool's per-env arrays (``env_id``, ``lives``,
        ``elapsed_step``...) with their ``_key`` masks (every env has them)."""
        out: dict[str, Any] = {}
        for key, value in info.items():
            value = np.asarray(value)
            if value.ndim and value.shape[0] == rows and key not in _INFO_LEFT_OUT:
                out[key] = value
                out[f"_{key}"] = np.ones(rows, dtype=bool)
        return out

    def close_extras(self, **kwargs: Any) -> None:
        """Close EnvPool's threads."""
        if not self.closed:
            self._pool.close()

    def __repr__(self) -> str:
        return f"EnvPoolVectorEnv({self.env_id}, num_envs={self.num_envs})"
