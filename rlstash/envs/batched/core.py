"""The batched env machinery shared by the reference envs: autoreset, time limit, seeding.

A :class:`BatchedVectorEnv` holds the state of ``N`` envs as one array ``state`` ``[D, N]``
(one row per state variable, like gymnasium's numpy ``CartPoleVectorEnv``) plus
``elapsed`` ``[N]`` (steps in the current episode), and delegates the physics to a
:class:`Dynamics` object. Everything stays on ``device``; nothing is copied to the host.
Inputs and outputs are torch tensors; on the CPU the arithmetic runs in numpy over the
same memory (:mod:`rlstash.envs.batched.ops`).

Autoreset (``autoreset_mode``, gymnasium's ``AutoresetMode``):

* ``NEXT_STEP`` (default): after a step that ended an episode, the next ``step`` resets
  that env instead of stepping it: reset observation, reward 0, not terminated, not
  truncated, action ignored.
* ``SAME_STEP``: the env resets within the step that ended the episode; the observation
  returned is the reset one and ``info["final_obs"]`` ``[N, *obs]`` holds the last
  observation of the ended episode where ``info["_final_obs"]`` ``[N]`` is True (rows
  elsewhere hold the step's own observation). ``final_info`` / ``_final_info`` likewise.
  The keys are present on every step, so no host synchronisation decides whether to add
  them (on CUDA a data-dependent branch would stall the device).
* ``DISABLED``: no autoreset; reset ended envs with ``reset(options={"reset_mask": m})``.

Seeding: ``reset(seed=s)`` gives env ``i`` the seed ``s + i`` (a list gives one seed per
env), as gymnasium's vector envs do. Initial states come from a counter-based hash of
(env seed, resets of that env so far), so env ``i``'s episodes depend on its own seed only,
never on ``N``, the device or the other envs. ``reset()`` without a seed draws fresh seeds
the first time and continues each env's stream afterwards.

Time limit: ``truncated = elapsed >= max_episode_steps`` (gymnasium's ``TimeLimit``; an
episode can be terminated and truncated at once).
"""

from __future__ import annotations

import secrets
from typing import Any, Protocol

import numpy as np
import torch
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from rlstash import autoreset
from rlstash.envs.batched.ops import NumpyOps, TorchOps, ops_for

_M32 = 0xFFFFFFFF


class Dynamics(Protocol):
    """The physics of one env family on ``[D, N]`` state arrays of the namespace ``ops``."""

    state_dim: int
    single_observation_space: Any
    single_action_space: Any

    def initial(self, u: Any, ops: Any) -> Any:
        """Initial states ``[D, M]`` from uniforms ``u`` in [0, 1) ``[D, M]`` (float64)."""
        ...

    def step(self, state: Any, action: Any, ops: Any) -> tuple[Any, Any, Any]:
        """``(next state [D, N], reward [N] float32, terminated [N] bool)``."""
        ...

    def observe(self, state: Any, ops: Any) -> Any:
        """Observations ``[N, *obs]`` (float32, a new array) of states ``[D, N]``."""
        ...

    def check_action(self, action: Any, num_envs: int, ops: Any) -> Any:
        """The action as the physics takes it, or a ValueError naming the expected form."""
        ...


def _fmix32(h: Any) -> Any:
    """MurmurHash3's 32-bit finaliser on int64 arrays holding 32-bit values (numpy or torch).

    Products may wrap past 2**63; the low 32 bits kept by the mask are right either way."""
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & _M32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & _M32
    return h ^ (h >> 16)


def hashed_uniform(seeds: Any, counter: Any, rows: int, ops: Any) -> Any:
    """Uniforms in [0, 1) ``[rows, M]`` (float64) from per-env ``seeds`` and ``counter`` [M].

    Deterministic per (seed, counter, row): the same on every device and for any batch."""
    k = ops.arange(rows)[:, None]  # [rows, 1]
    h = _fmix32((counter[None, :] * 0x9E3779B1 + k * 0x7F4A7C15 + 0x165667B1) & _M32)
    h = _fmix32(h ^ seeds[None, :])  # [rows, M]
    return ops.cast(h, "float64") * (1.0 / 2**32)


# CPU: the reset pool pays up to here (step time with / without it, this 2-core EPYC:
# 0.84 at 4096 envs, 0.98 at 8192, 1.10 at 16384)
POOL_MAX_ENVS = 8192


class ResetPool:
    """The next ``B`` initial states of every env, computed ``B`` resets at a time (the CPU
    path): a reset of M envs is then one gather instead of ~25 numpy operations of the hash
    on M values, a cost that dominates the step at a few hundred envs. Used up to
    :data:`POOL_MAX_ENVS` envs: beyond, each step resets enough envs that the hash's
    operations are long vectors, and the pool's ``[B, D, N]`` gather (megabytes, read at
    scattered positions) costs more than hashing on the spot.

    Entry ``b`` of env ``e`` is its initial state for reset counter ``base[e] + b``, hashed
    from (seed, counter) exactly as :func:`hashed_uniform` would on the spot, so episodes do
    not change. When a reset finds an env's entries used up, every env that has used half
    of its entries is refilled in the same call (few calls, each over many envs).
    """

    B = 16

    def __init__(self, dynamics: Dynamics, ops: Any, num_envs: int) -> None:
        self.dynamics, self.ops, self.num_envs = dynamics, ops, num_envs
        self.states: Any = None  # [B, D, N]
        self.base = np.zeros(num_envs, np.int64)  # reset counter of entry 0, per env

    def take(self, seeds: np.ndarray, resets: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Initial states ``[D, M]`` of envs ``rows`` at their counters ``resets[rows]``."""
        at = resets[rows] - self.base[rows]
        if self.states is None or at.max() >= self.B:
            self._refill(seeds, resets)
            at = resets[rows] - self.base[rows]
        return self.states[at, :, rows].T

    def _refill(self, seeds: np.ndarray, resets: np.ndarray) -> None:
        B, D = self.B, self.dynamics.state_dim
        if self.states is None:
            sel = np.arange(self.num_envs)
        else:
            sel = np.flatnonzero(resets - self.base >= B // 2)
        counters = resets[sel][None, :] + np.arange(B)[:, None]  # [B, S]
        u = hashed_uniform(np.tile(seeds[sel], B), counters.reshape(-1), D, self.ops)
        fresh = self.dynamics.initial(u, self.ops).reshape(D, B, sel.size)
        if self.states is None:
            self.states = np.empty((B, D, self.num_envs), fresh.dtype)
        self.states[:, :, sel] = fresh.transpose(1, 0, 2)
        self.base[sel] = resets[sel]


def _indexed(device: torch.device) -> torch.device:
    """``cuda`` as the device its tensors land on (``cuda:<current>``), so that ``device``
    equals the ``.device`` of every tensor the env returns; other devices as they are."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


class BatchedVectorEnv(VectorEnv):
    """N envs of one :class:`Dynamics` as torch tensors on ``device`` (see the module doc).

    Args:
        dynamics: the physics (e.g. :class:`~rlstash.envs.batched.cartpole.CartPoleDynamics`).
        num_envs: N.
        device: where the state, observations, rewards and flags live.
        max_episode_steps: time limit; steps beyond it report ``truncated``.
        autoreset_mode: a ``gymnasium.vector.AutoresetMode`` or its value: ``"NextStep"``
            (default), ``"SameStep"`` or ``"Disabled"`` (:mod:`rlstash.autoreset`).
    """

    def __init__(
        self,
        dynamics: Dynamics,
        num_envs: int,
        device: str | torch.device = "cpu",
        max_episode_steps: int = 500,
        autoreset_mode: Any = AutoresetMode.NEXT_STEP,
    ) -> None:
        if not isinstance(num_envs, int) or isinstance(num_envs, bool) or num_envs <= 0:
            raise ValueError(f"num_envs: expected a positive int, got {num_envs!r}")
        if not isinstance(max_episode_steps, int) or max_episode_steps <= 0:
            raise ValueError(
                f"max_episode_steps: expected a positive int, got {max_episode_steps!r}"
            )
        self.dynamics, self.num_envs = dynamics, num_envs
        self.device = _indexed(torch.device(device))
        self.ops: NumpyOps | TorchOps = ops_for(self.device)
        self.max_episode_steps = max_episode_steps
        self.autoreset_mode = autoreset.resolve(autoreset_mode)
        # declared, never left to a default: collectors read the mode from here
        self.metadata = {"autoreset_mode": self.autoreset_mode, "render_modes": []}
        self.render_mode = None
        self.single_observation_space = dynamics.single_observation_space
        self.single_action_space = dynamics.single_action_space
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        z = self.ops.zeros
        self._state: Any = None  # [D, N] in the ops namespace, set by reset
        self._elapsed = z(num_envs, "int64")  # steps in the current episode
        self._seeds = z(num_envs, "int64")
        self._resets = z(num_envs, "int64")  # per-env reset counter (the hash's counter)
        self._prev_done = z(num_envs, "bool")  # next-step mode: reset these on the next step
        self._pool = (
            ResetPool(dynamics, self.ops, num_envs)
            if isinstance(self.ops, NumpyOps) and num_envs <= POOL_MAX_ENVS
            else None
        )
        self._seeded = False

    @property
    def state(self) -> torch.Tensor | None:
        """``[D, N]`` state (a view: writing to it sets the envs' states)."""
        return None if self._state is None else self.ops.tensor(self._state)

    @property
    def elapsed(self) -> torch.Tensor:
        """``[N]`` int64 steps taken in each env's current episode (a view)."""
        return self.ops.tensor(self._elapsed)

    # ------------------------------------------------------------------ reset
    def reset(
        self, *, seed: int | list[int] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """Reset all envs (or those of ``options["reset_mask"]``); see the module docstring."""
        mask = self._reset_mask(options)
        if mask is not None and self._state is None:
            raise RuntimeError("reset: reset every env once before a masked reset")
        if seed is not None:
            seeds = self._seed_array(seed)
            xp = self.ops.xp
            self._seeds = seeds if mask is None else xp.where(mask, seeds, self._seeds)
            self._resets = self._resets * 0 if mask is None else xp.where(mask, 0, self._resets)
        elif not self._seeded:  # like gymnasium: later unseeded resets continue the streams
            self._seeds = self._seed_array(secrets.randbits(31))
        self._seeded = True
        if self._pool is not None:  # seeds or counters may have changed
            self._pool = ResetPool(self.dynamics, self.ops, self.num_envs)
        if mask is None:
            self._state = self._fresh()
            self._elapsed[:] = 0
            self._prev_done[:] = False
        else:
            self._reset_rows(mask)
            self._prev_done &= ~mask
        return self.ops.tensor(self.dynamics.observe(self._state, self.ops)), {}

    def _seed_array(self, seed: int | list[int]) -> Any:
        n = self.num_envs
        if isinstance(seed, int) and not isinstance(seed, bool):
            values = [(seed + i) & _M32 for i in range(n)]
        elif isinstance(seed, (list, tuple)) and len(seed) == n:
            values = [int(s) & _M32 for s in seed]
        else:
            raise ValueError(
                f"seed: expected None, an int or a list of {n} ints (one per env), got {seed!r}"
            )
        return self.ops.native(torch.tensor(values, dtype=torch.int64, device=self.device))

    def _reset_mask(self, options: dict[str, Any] | None) -> Any:
        if not options or "reset_mask" not in options:
            return None
        m = options["reset_mask"]
        m = m if isinstance(m, torch.Tensor) else torch.from_numpy(np.asarray(m))
        if m.dtype != torch.bool or tuple(m.shape) != (self.num_envs,):
            raise ValueError(
                f"options['reset_mask']: expected a bool array of shape ({self.num_envs},), "
                f"got {m.dtype} {list(m.shape)}"
            )
        return self.ops.native(m.to(self.device))

    def _fresh(self) -> Any:
        """Initial states of all envs; counts the resets."""
        u = hashed_uniform(self._seeds, self._resets, self.dynamics.state_dim, self.ops)
        self._resets += 1
        return self.dynamics.initial(u, self.ops)

    def _reset_rows(self, mask: Any) -> None:
        """Fresh states where ``mask`` [N]. On the CPU only those rows are computed (from the
        pool, or hashed on the spot for many envs); on an accelerator every row is and
        ``where`` picks (a data-dependent row count would make the host wait for the device)."""
        if isinstance(self.ops, NumpyOps):
            rows = self.ops.rows(mask)
            if rows.size:
                if self._pool is not None:
                    fresh = self._pool.take(self._seeds, self._resets, rows)
                else:
                    u = hashed_uniform(
                        self._seeds[rows], self._resets[rows], self.dynamics.state_dim, self.ops
                    )
                    fresh = self.dynamics.initial(u, self.ops)
                self._state[:, rows] = fresh
                self._resets[rows] += 1
                self._elapsed[rows] = 0
            return
        u = hashed_uniform(self._seeds, self._resets, self.dynamics.state_dim, self.ops)
        self._resets += mask
        fresh = self.dynamics.initial(u, self.ops)
        self._state = torch.where(mask, fresh, self._state)
        self._elapsed = torch.where(mask, 0, self._elapsed)

    # ------------------------------------------------------------------ step
    def step(
        self, actions: Any
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        """Step every env; returns ``(obs, reward, terminated, truncated, info)`` on ``device``
        (reward float32 [N], flags bool [N])."""
        if self._state is None:
            raise RuntimeError("step: call reset() before step()")
        ops, dyn = self.ops, self.dynamics
        action = dyn.check_action(self._native_action(actions), self.num_envs, ops)
        state, reward, terminated = dyn.step(self._state, action, ops)
        self._state = state
        self._elapsed += 1
        truncated = self._elapsed >= self.max_episode_steps
        info: dict[str, Any] = {}
        if self.autoreset_mode == AutoresetMode.NEXT_STEP:
            was_done = self._prev_done
            self._reset_rows(was_done)
            keep = ~was_done
            reward = reward * keep
            terminated &= keep
            truncated &= keep
            self._prev_done = terminated | truncated
        elif self.autoreset_mode == AutoresetMode.SAME_STEP:
            done = terminated | truncated
            info["final_obs"] = ops.tensor(dyn.observe(state, ops))
            info["_final_obs"] = ops.tensor(done)
            info["final_info"] = {}
            info["_final_info"] = info["_final_obs"]
            self._reset_rows(done)  # final_obs above is a separate array
        obs = dyn.observe(self._state, ops)
        return (
            ops.tensor(obs),
            ops.tensor(reward),
            ops.tensor(terminated),
            ops.tensor(truncated),
            info,
        )

    def _native_action(self, actions: Any) -> Any:
        if isinstance(actions, torch.Tensor):
            if actions.device != self.device:
                raise ValueError(
                    f"actions: expected a tensor on {self.device} (the env's device), got one on "
                    f"{actions.device}; move the policy to {self.device}"
                )
            return self.ops.native(actions)
        if isinstance(self.ops, NumpyOps):
            return np.asarray(actions)
        return torch.as_tensor(np.asarray(actions), device=self.device)

    def close_extras(self, **kwargs: Any) -> None:
        """Nothing to release but arrays."""
        self._state = None

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_envs={self.num_envs}, device={str(self.device)!r}, "
            f"autoreset_mode={self.autoreset_mode.value!r})"
        )
