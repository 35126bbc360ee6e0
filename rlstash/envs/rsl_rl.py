"""rsl_rl-style envs (Isaac Lab's ``RslRlVecEnvWrapper``, Genesis's and legged_gym's envs) as
rlstash batched torch envs: :func:`from_rsl_rl`.

rsl_rl's ``VecEnv`` steps all envs at once with torch tensors on ``env.device`` and returns
``(obs, rewards, dones, extras)`` (rsl_rl >= 2; ``obs`` a tensor, or since 3 a TensorDict
of observation groups), or ``(obs, privileged_obs, rewards, dones, extras)`` (rsl_rl 1,
legged_gym, older Genesis examples). ``dones`` is bool or an int/float 0/1 tensor ``[N]``;
``extras["time_outs"]``, where the env sends it, marks the ends that are time limits.

Autoreset. Such an env resets the envs that ended inside ``step`` and returns their new
episode's first observation: gymnasium's *same-step* autoreset. It does not return the
observation the ended episode finished in (Isaac Lab, Genesis and legged_gym put it nowhere),
so the adapter reports ``info["final_obs"]`` with a stand-in: the observation the last step
was taken from. What is lost:

* for a time-out (``truncated``) the value of the true final observation: a learner
  bootstraps from the observation one step earlier, the approximation rsl_rl's own PPO makes
  (it adds ``gamma * V(obs_t)`` to a time-out's reward);
* for a termination nothing a learner uses (no bootstrap past a terminal state).

The flags: ``terminated = dones & ~time_outs``, ``truncated = dones & time_outs`` (an env that
sends no ``time_outs`` reports every end as terminated, as rsl_rl reads it). Rewards,
observations and flags stay on ``env.device``; nothing crosses to the host.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space


def from_rsl_rl(env: Any, critic: bool = False) -> RslRlVectorEnv:
    """Wrap an rsl_rl-style env as a gymnasium ``VectorEnv`` of torch tensors on its device,
    which :class:`~rlstash.collect.sync.Collector`, ``collect_into`` and the agents take::

        env = from_rsl_rl(RslRlVecEnvWrapper(isaac_lab_env))      # or a Genesis Go2Env
        collector = Collector(env, agent.act, frames_per_batch=env.num_envs * 24)

    Both of rsl_rl's step tuples work (see the module docstring for what autoreset loses).

    Args:
        env: an object with rsl_rl's ``VecEnv`` interface: ``num_envs``, ``num_actions``,
            ``device``, ``get_observations()`` and ``step(actions)``; ``reset()`` and
            ``seed(seed)`` are used where it has them.
        critic: observe the privileged (critic) observations too: the observation becomes
            ``{"policy": obs, "critic": privileged_obs}`` (rsl_rl 1: the step's second
            value or ``get_privileged_observations()``; rsl_rl 2: ``extras["observations"]
            ["critic"]``). An env whose observations are already groups (a TensorDict)
            keeps all of them either way.
    """
    return RslRlVectorEnv(env, critic)


class RslRlVectorEnv(VectorEnv):
    """An rsl_rl-style env as gymnasium's same-step ``VectorEnv`` (see :func:`from_rsl_rl`).

    ``env`` is the wrapped env; ``device``, ``num_envs`` are its own.
    """

    def __init__(self, env: Any, critic: bool = False) -> None:
        for name in ("num_envs", "num_actions", "device", "get_observations", "step"):
            if not hasattr(env, name):
                raise TypeError(
                    f"env: expected an rsl_rl-style VecEnv (num_envs, num_actions, device, "
                    f"get_observations(), step()), {type(env).__name__} has no {name!r}"
                )
        self.env, self.critic = env, bool(critic)
        self.num_envs = int(env.num_envs)
        self.device = torch.device(env.device)
        self.metadata = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}
        self.render_mode = None
        obs = self._observe(env.get_observations(), None)
        self.single_observation_space = _space(obs)
        self.single_action_space = spaces.Box(-np.inf, np.inf, (int(env.num_actions),), np.float32)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._last: Any = None  # the last observation returned (a copy): final_obs stand-in

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset every env (``env.reset()`` where the env has one; rsl_rl >= 3 envs have
        none and continue their episodes) and return the current observations."""
        if options:
            raise ValueError(
                f"options: an rsl_rl-style env takes no reset options, got {sorted(options)}; "
                "pass none"
            )
        if seed is not None:
            seeder = getattr(self.env, "seed", None)
            if not callable(seeder):
                raise ValueError(
                    f"seed: {type(self.env).__name__} has no seed() method; seed it where it is "
                    "made and pass seed=None (Collector(seed=None))"
                )
            seeder(seed)
        reset = getattr(self.env, "reset", None)
        if callable(reset):
            reset()
        obs = self._observe(self.env.get_observations(), None)
        self._last = _clone(obs)
        return obs, {}

    def step(self, actions: torch.Tensor) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        """One step of every env: ``(obs, reward, terminated, truncated, info)`` with
        ``info["final_obs"]``/``info["_final_obs"]`` (the stand-in, where an episode ended)
        and the env's extras."""
        if self._last is None:
            raise RuntimeError("step: call reset() before step()")
        out = self.env.step(actions)
        if isinstance(out, tuple) and len(out) == 5:
            obs, privileged, reward, dones, extras = out
        elif isinstance(out, tuple) and len(out) == 4:
            (obs, reward, dones, extras), privileged = out, None
        else:
            n = len(out) if isinstance(out, tuple) else type(out).__name__
            raise TypeError(
                "env.step: expected rsl_rl's (obs, rewards, dones, extras) or (obs, "
                f"privileged_obs, rewards, dones, extras), got {n}; use an rsl_rl VecEnv"
            )
        extras = dict(extras or {})
        obs = self._observe((obs, extras), privileged)
        done = dones if dones.dtype == torch.bool else dones != 0  # [N]
        time_outs = extras.get("time_outs")
        truncated = done & (time_outs != 0) if time_outs is not None else torch.zeros_like(done)
        final = _where(done, self._last, obs)
        self._last = _clone(obs)
        info = {**extras, "final_obs": final, "_final_obs": done}
        return obs, reward, done & ~truncated, truncated, info

    def _observe(self, got: Any, privileged: Any) -> Any:
        """The observation from what ``get_observations``/``step`` gave: a tensor, a dict of
        groups (a TensorDict), or ``(obs, extras)``; with ``critic``, policy and critic."""
        extras: Mapping = {}
        if isinstance(got, tuple):
            got, extras = got[0], got[1] if isinstance(got[1], Mapping) else {}
        if isinstance(got, Mapping):
            return _plain(got)
        if not self.critic:
            return got
        if privileged is None:
            privileged = (extras.get("observations") or {}).get("critic")
        if privileged is None and callable(getattr(self.env, "get_privileged_observations", None)):
            privileged = self.env.get_privileged_observations()
        if privileged is None:
            raise ValueError(
                f"critic: {type(self.env).__name__} reports no privileged observations (no "
                "step value, extras['observations']['critic'] or get_privileged_observations()); "
                "pass critic=False"
            )
        return {"policy": got, "critic": privileged}

    def close_extras(self, **kwargs: Any) -> None:
        """Close the wrapped env where it can be."""
        close = getattr(self.env, "close", None)
        if callable(close):
            close()

    def __repr__(self) -> str:
        return f"from_rsl_rl({type(self.env).__name__}, num_envs={self.num_envs}, {self.device})"


def _plain(obs: Mapping) -> dict[str, Any]:
    """A (nested) mapping of tensors, such as a TensorDict, as plain dicts."""
    return {str(k): _plain(v) if isinstance(v, Mapping) else v for k, v in obs.items()}


def _clone(obs: Any) -> Any:
    if isinstance(obs, Mapping):
        return {k: _clone(v) for k, v in obs.items()}
    return obs.clone()


def _where(mask: torch.Tensor, a: Any, b: Any) -> Any:
    """``a`` where ``mask`` [N], else ``b``: per field of (nested) dicts."""
    if isinstance(a, Mapping):
        return {k: _where(mask, a[k], b[k]) for k in a}
    return torch.where(mask.view(-1, *([1] * (b.dim() - 1))), a, b)


def _space(obs: Any) -> spaces.Space:
    """The single-env space of batched observations (unbounded boxes)."""
    if isinstance(obs, Mapping):
        return spaces.Dict({k: _space(v) for k, v in obs.items()})
    dtype = torch.empty((), dtype=obs.dtype).numpy().dtype
    shape = tuple(obs.shape[1:])
    if dtype.kind in "iu":
        return spaces.Box(np.iinfo(dtype).min, np.iinfo(dtype).max, shape, dtype)
    if dtype.kind == "b":
        return spaces.MultiBinary(shape)
    return spaces.Box(-np.inf, np.inf, shape, dtype)


__all__ = ["RslRlVectorEnv", "from_rsl_rl"]
