"""PettingZoo Parallel envs stepped by rlstash's process pool, as a ``MultiAgentVectorEnv``.

::

    with PettingZooVectorEnv("mpe2.simple_spread_v3", num_envs=32, num_workers=2, seed=0) as env:
        out = env.reset()                                   # out.obs["agents"]: [32, 3, 18]
        for _ in range(100):
            acts = {g: torch.randint(0, 5, (32, len(a))) for g, a in env.groups.items()}
            out = env.step(acts)                            # out.reward["agents"]: [32, 3]

Each worker of a :class:`~rlstash.envs.process_pool.ProcessPoolVectorEnv` steps its envs
with all their agents (:class:`~rlstash.envs.pz_worker.ParallelAdapter`, torch-free); the
pool runs in ``SameStep`` autoreset mode, so an env whose agents are all done resets in the
same step and its last values sit in the pool's final-observation arrays. The tensors
returned here are built zero-copy (``torch.from_numpy``) over the shared-memory arrays: they
are valid until the next ``step``/``reset`` (clone what you keep), except the action masks,
unpacked from bits into fresh tensors.

Per step and group, ``[E, A_g]``: ``reward``/``terminated``/``truncated`` of the step,
``mask`` True for the agents that acted in it (an agent done earlier or absent: False, its
observation zero-filled); ``obs``/``state``/``action_mask`` are those of the next step
(for ``env_done`` rows: the new episode's first ones, the last ones in ``final_obs`` and
``final_state``). The global state is a field of the worker's byte row, read by ``state()``
right after the step (:class:`~rlstash.envs.pz_worker.ParallelAdapter`); the worker copies
an ended env's row into the pool's final-observation arrays before it resets the env, so
``final_state`` is the ended episode's last ``state()``, beside ``final_obs`` in the same rows.

A worker restart (a crashed or hung env) ends the episodes of its envs for all their agents:
``truncated`` True, ``env_done`` True, ``mask`` False (the step has no outcome: no reward,
no final observation or state; ``final_obs`` and ``final_state`` rows are zero), and ``obs``
is the restarted env's first.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from rlstash.envs.actions import bad_rows
from rlstash.envs.multiagent import MultiAgentStep
from rlstash.envs.process_pool import ProcessPoolVectorEnv
from rlstash.envs.pz_worker import (
    INSTALL_HINT,
    ParallelAdapter,
    byte_layout,
    field_views,
    make_parallel,
    plan_groups,
    value_space,
)

PREFIX = "pettingzoo:"
_FLAGS = ("terminated", "truncated", "mask")


def is_pettingzoo(env_id: Any) -> bool:
    """Whether ``env_id`` names a PettingZoo Parallel env (``pettingzoo:<module>``)."""
    return isinstance(env_id, str) and env_id.startswith(PREFIX)


class PettingZooVectorEnv:
    """``num_envs`` copies of a PettingZoo Parallel env in the process pool, as a
    ``MultiAgentVectorEnv`` (:mod:`rlstash.envs.multiagent`; see the module docstring)."""

    def __init__(
        self,
        env: str | Callable[[], Any],
        num_envs: int,
        num_workers: int | None = None,
        seed: int | None = None,
        *,
        env_kwargs: Mapping[str, Any] | None = None,
        groups: Mapping[str, Sequence[str]] | None = None,
        state: bool = True,
        **pool_options: Any,
    ) -> None:
        """Start the envs.

        Args:
            env: a module path (``"mpe2.simple_spread_v3"``, optionally ``"pettingzoo:"``
                first) whose ``parallel_env(**env_kwargs)`` makes the env, or a zero-argument
                factory of a ParallelEnv (lambdas are fine: cloudpickle).
            num_envs: number of envs E.
            num_workers: worker processes (as the pool's; 0: in this process).
            seed: env i's first reset uses ``seed + i``.
            env_kwargs: keyword arguments of ``parallel_env`` (module paths only).
            groups: group name -> agent names (default: agents with identical spaces share
                a group, :func:`~rlstash.envs.pz_worker.plan_groups`).
            state: carry the env's global state where it has one (default); False saves
                the env's ``state()`` per step (``state_space`` None, ``state`` None).
            pool_options: more :class:`ProcessPoolVectorEnv` arguments (``step_timeout``,
                ``max_restarts``, ``context``, ``worker_env``, ``start_timeout``).
        """
        for name in ("autoreset_mode", "copy", "shared_memory", "observation_mode", "worker"):
            if name in pool_options:
                raise ValueError(
                    f"{name}: set by PettingZooVectorEnv (same-step autoreset over shared "
                    f"memory); drop {name}="
                )
        make = _maker(env, env_kwargs)
        probe = make()  # early, named errors (bad group maps, unsupported spaces) here
        try:
            plan = plan_groups(probe, groups, state)
        finally:
            probe.close()
        self.pool = ProcessPoolVectorEnv(
            functools.partial(ParallelAdapter, make, plan.groups, state),
            num_envs=num_envs,
            num_workers=num_workers,
            seed=seed,
            autoreset_mode="SameStep",
            copy=False,
            **pool_options,
        )
        try:
            self._attach(plan)
        except BaseException:
            self.pool.close()
            raise

    def _attach(self, plan: Any) -> None:
        self.num_envs: int = self.pool.num_envs
        self.device = torch.device("cpu")
        self.groups: dict[str, tuple[str, ...]] = dict(plan.groups)
        self.observation_spaces: dict[str, spaces.Space] = dict(plan.obs_spaces)
        self.action_spaces: dict[str, spaces.Space] = dict(plan.act_spaces)
        self.state_space: spaces.Space | None = plan.state_space
        arrays = self.pool.shared_arrays()
        if "obs" not in arrays or "final_obs" not in arrays:
            raise ValueError(
                f"observation spaces {self.observation_spaces}: not laid out in shared memory "
                "(Text, Graph, Sequence or OneOf parts); flatten them with a wrapper"
            )
        self._fields, _ = byte_layout(value_space(plan))
        self._n = {
            g: int(s.n) for g, s in plan.act_spaces.items() if isinstance(s, spaces.Discrete)
        }
        self._now = self._views(field_views(arrays["obs"], self._fields))
        self._final = self._views(field_views(arrays["final_obs"], self._fields))
        self._alive = {g: self._now["fields"][f"alive/{g}"].view(np.bool_) for g in self.groups}
        self._env_term, self._env_trunc = arrays["terminated"], arrays["truncated"]
        self._env_final = arrays["final"]

    def shared_fields(self, final: bool = False) -> dict[str, np.ndarray]:
        """The numpy views of the shared rows by field name (``obs/<group>``,
        ``reward/<group>``, ``mask/<group>``, ``action_mask/<group>`` (bits), ``state``...;
        ``final``: of the final-observation rows): what the returned tensors are built on."""
        return dict((self._final if final else self._now)["fields"])

    def _views(self, fields: dict[str, np.ndarray]) -> dict[str, Any]:
        """numpy views and torch tensors over one set of rows (now / final)."""
        out: dict[str, Any] = {"fields": fields, "np": {}, "obs": {}}
        for g in self.groups:
            out["np"][g] = {f: fields[f"{f}/{g}"] for f in ("reward", *_FLAGS)}
            out["obs"][g] = _tree(fields, f"obs/{g}")
        out["reward"] = {g: torch.from_numpy(out["np"][g]["reward"]) for g in self.groups}
        for f in _FLAGS:
            out[f] = {g: torch.from_numpy(out["np"][g][f].view(np.bool_)) for g in self.groups}
        out["bits"] = {g: fields[f"action_mask/{g}"] for g in self._n}
        state = fields.get("state")
        out["state"] = None if state is None else torch.from_numpy(state)
        return out

    # --- MultiAgentVectorEnv ----------------------------------------------------------
    def reset(self, *, seed: int | None = None) -> MultiAgentStep:
        """Reset every env (env i: ``seed + i``); reward 0, flags False, mask True for the
        agents present."""
        self.pool.reset(seed=seed)
        return self._result(np.zeros(self.num_envs, dtype=bool), None)

    def step(self, actions: Mapping[str, Any]) -> MultiAgentStep:
        """Step every env with ``actions[group]`` of shape ``[E, A_g, *act_shape]`` (torch
        or numpy; rows of agents that are not acting are ignored).

        Raises:
            ValueError/TypeError: naming the group (and the agent for values outside its
                action space), what was expected and what came; nothing is sent.
        """
        checked = self._check_actions(actions)
        self.pool.step(checked if len(checked) > 1 else next(iter(checked.values())))
        done = self._env_term | self._env_trunc  # [E]
        if not done.any():
            return self._result(done, None)
        self._patch_ended(done)
        return self._result(done, self._final["obs"], self._final["state"])

    def close(self) -> None:
        """Stop the workers and release the shared memory."""
        self.pool.close()

    # --- internals --------------------------------------------------------------------
    def _result(
        self, done: np.ndarray, final_obs: Any, final_state: torch.Tensor | None = None
    ) -> MultiAgentStep:
        now = self._now
        masks: dict[str, torch.Tensor | None] = {g: None for g in self.groups}
        for g, n in self._n.items():
            bits = now["bits"][g]  # [E, A_g, ceil(n / 8)] uint8
            masks[g] = torch.from_numpy(np.unpackbits(bits, axis=-1, count=n).view(np.bool_))
        return MultiAgentStep(
            obs=now["obs"],
            reward=now["reward"],
            terminated=now["terminated"],
            truncated=now["truncated"],
            mask=now["mask"],
            action_mask=masks,
            state=now["state"],
            env_done=torch.from_numpy(done),
            final_obs=final_obs,
            final_state=final_state,
        )

    def _patch_ended(self, done: np.ndarray) -> None:
        """Rows of ended envs: the step's reward/flags/mask from the final arrays (the
        obs arrays hold the new episode's reset values); restarted envs: truncated for every
        agent, mask False, reward 0, final observations and final state zero."""
        ended = np.flatnonzero(self._env_final)
        restarted = np.flatnonzero(done & ~self._env_final)
        now, fin = self._now["np"], self._final["np"]
        for g in self.groups:
            for f in ("reward", *_FLAGS):
                now[g][f][ended] = fin[g][f][ended]
            if restarted.size:
                now[g]["reward"][restarted] = 0
                now[g]["terminated"][restarted] = 0
                now[g]["truncated"][restarted] = 1
                now[g]["mask"][restarted] = 0
                for leaf in _leaves(self._final["obs"][g]):
                    leaf[restarted] = 0
        if restarted.size and self._final["state"] is not None:
            self._final["state"][restarted] = 0

    def _check_actions(self, actions: Mapping[str, Any]) -> dict[str, np.ndarray]:
        if not isinstance(actions, Mapping):
            raise TypeError(
                f"actions: expected a dict group -> [E, A_g, *action_shape], got "
                f"{type(actions).__name__}; groups: {list(self.groups)}"
            )
        unknown = [g for g in actions if g not in self.groups]
        missing = [g for g in self.groups if g not in actions]
        if unknown or missing:
            raise ValueError(
                f"actions: groups {list(self.groups)} expected, got unknown {unknown} and "
                f"missing {missing}; give one array per group"
            )
        return {g: self._group_actions(g, actions[g]) for g in self.groups}

    def _group_actions(self, g: str, value: Any) -> np.ndarray:
        space, agents = self.action_spaces[g], self.groups[g]
        arr = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
        want = (self.num_envs, len(agents), *space.shape)
        if arr.shape != want:
            raise ValueError(
                f"actions[{g!r}]: expected shape {want} ([envs, agents {list(agents)}, "
                f"*action shape of {space}]), got {arr.shape}; one row per env and agent"
            )
        if g in self._n and arr.dtype.kind not in "iub":
            raise TypeError(
                f"actions[{g!r}]: expected integer actions for {space}, got dtype {arr.dtype}"
            )
        alive = self._alive[g]  # [E, A_g] agents acting in this step
        fill: list[tuple[np.ndarray, int]] = []
        for i, agent in enumerate(agents):
            bad = bad_rows(space, arr[:, i])
            if not bad.size:
                continue
            acting = bad[alive[bad, i]]
            if acting.size:
                shown = ", ".join(f"env {e}: {arr[e, i]!r}" for e in acting[:5].tolist())
                raise ValueError(
                    f"actions[{g!r}][:, {i}] (agent {agent!r}): {acting.size} action(s) outside "
                    f"its action space {space} ({shown}); nothing was sent. Fix the policy's "
                    "output (e.g. clip or map it into the space)"
                )
            fill.append((bad, i))
        if fill:  # values of agents that do not act: replaced, never sent to an env
            arr = arr.copy()
            for bad, i in fill:
                arr[bad, i] = _valid(space)
        return arr

    # --- extras -----------------------------------------------------------------------
    @property
    def restarts(self) -> list:
        """Every worker failure so far (the pool's :class:`RestartEvent` list)."""
        return self.pool.restarts

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the current workers."""
        return self.pool.worker_pids

    def worker_info(self) -> list[dict[str, Any]]:
        """Per worker: pid, its ``sys.modules`` names, environ (see the pool's)."""
        return self.pool.worker_info()

    def __enter__(self) -> PettingZooVectorEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        groups = {g: len(a) for g, a in self.groups.items()}
        return f"PettingZooVectorEnv(num_envs={self.num_envs}, groups={groups}, {self.pool!r})"


def _maker(env: str | Callable[[], Any], env_kwargs: Mapping[str, Any] | None) -> Callable:
    if isinstance(env, str):
        module = env[len(PREFIX) :] if is_pettingzoo(env) else env
        return functools.partial(make_parallel, module, dict(env_kwargs or {}))
    if not callable(env):
        raise TypeError(
            f"env: expected a module path such as 'mpe2.simple_spread_v3' or a factory of a "
            f"PettingZoo ParallelEnv, got {type(env).__name__}"
        )
    if env_kwargs:
        return functools.partial(env, **env_kwargs)
    return env


def _tree(arrays: dict[str, np.ndarray], name: str) -> Any:
    """The tensor at ``name``, or the nested dict of tensors under ``name/`` (dict obs)."""
    if name in arrays:
        return torch.from_numpy(arrays[name])
    out: dict[str, Any] = {}
    for key in arrays:
        if key.startswith(name + "/"):
            head = key[len(name) + 1 :].split("/", 1)[0]
            if head not in out:
                out[head] = _tree(arrays, f"{name}/{head}")
    return out


def _leaves(value: Any) -> list[np.ndarray]:
    """The numpy arrays under a tensor or a nested dict of tensors."""
    if isinstance(value, dict):
        return [x for v in value.values() for x in _leaves(v)]
    return [value.numpy()]


def _valid(space: spaces.Space) -> Any:
    """A value inside ``space`` for ignored rows (the lowest action)."""
    if isinstance(space, spaces.Discrete):
        return int(space.start)
    if isinstance(space, spaces.MultiDiscrete):
        return space.start
    if isinstance(space, spaces.Box):
        return np.where(np.isfinite(space.low), space.low, 0)
    return 0


__all__ = ["INSTALL_HINT", "PettingZooVectorEnv", "is_pettingzoo"]
