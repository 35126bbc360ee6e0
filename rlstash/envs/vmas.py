"""VMAS (Vectorized Multi-Agent Simulator) as a :class:`~rlstash.envs.multiagent.MultiAgentVectorEnv`.

VMAS steps ``num_envs`` copies of a scenario as batched torch tensors on one device (CPU or
CUDA). This wrapper keeps them there: observations, rewards and dones come back per group as
``[E, A_g, ...]`` tensors on the env's device, on the caller's current CUDA stream::

    env = VmasVectorEnv("navigation", num_envs=600, device="cpu", seed=0, max_steps=100,
                        n_agents=3)                        # scenario kwargs pass through
    step = env.reset(seed=0)                               # step.obs["agents"]: [600, 3, 18]
    step = env.step({"agents": actions})                   # actions [600, 3, 2] in the Box

Autoreset is "same_step" (:class:`~rlstash.envs.multiagent.MultiAgentStep`): VMAS itself never
resets; an env whose episode ended (the scenario's ``done`` or ``max_steps``) is reset here in
the same step, ``final_obs`` keeps its last observations and ``obs`` holds the new episode's
first ones. VMAS resets by env *index* (``reset_at(i)``), so the one host read of a step is
the number of ended envs (a 0-dim sum of the [E] done mask); when every env ended together (a
fixed horizon) one batched ``reset()`` replaces the per-index calls. Observations, rewards and
flags are never copied to the host.

VMAS agents all act at every step, so ``mask`` is all True; an env's agents end together
(VMAS's done is per env). VMAS has no global state (``state_space`` is None): MAPPO's
centralised critic then takes the concatenation of the agents' observations. Dict
observations (a scenario whose ``observation`` returns a dict) come back as dicts of
``[E, A_g, ...]`` tensors by key.

``vmas`` is an optional dependency: ``pip install 'rlstash[vmas]'``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from rlstash.envs.multiagent import (
    MultiAgentStep,
    action_shape,
    check_actions,
    group_agents,
)

INSTALL_HINT = "VMAS is not installed: pip install 'rlstash[vmas]' (or pip install vmas)"


def import_vmas() -> Any:
    """The ``vmas`` module, or an ImportError with the install hint."""
    try:
        import vmas
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    return vmas


def to_gymnasium(space: Any) -> Any:
    """A gym (VMAS's) Box/Discrete/Dict space as the gymnasium space of the same kind."""
    from gymnasium import spaces

    subs = getattr(space, "spaces", None)
    if isinstance(subs, Mapping):
        return spaces.Dict({k: to_gymnasium(v) for k, v in subs.items()})
    if hasattr(space, "n") and not hasattr(space, "nvec"):
        return spaces.Discrete(int(space.n))
    if hasattr(space, "low") and hasattr(space, "high"):
        return spaces.Box(space.low, space.high, tuple(space.shape), space.dtype)
    raise TypeError(f"VMAS space {space!r}: expected a Box, Discrete or Dict")


class VmasVectorEnv:
    """A VMAS scenario (a name in ``vmas.scenarios`` or a ``BaseScenario``) of ``num_envs``
    envs on ``device`` (module docstring). ``continuous_actions`` False gives Discrete actions
    (int64 indices [E, A_g]); ``max_steps`` is the episode horizon (None: the scenario's own
    end only); other keyword arguments go to the scenario."""

    def __init__(
        self,
        scenario: Any,
        num_envs: int,
        device: torch.device | str = "cpu",
        continuous_actions: bool = True,
        max_steps: int | None = None,
        seed: int | None = None,
        **scenario_kwargs: Any,
    ) -> None:
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs: expected an int >= 1, got {num_envs!r}")
        vmas = import_vmas()
        self.device = torch.device(device)
        self.num_envs = num_envs
        self.scenario = scenario if isinstance(scenario, str) else type(scenario).__name__
        self._env = vmas.make_env(
            scenario, num_envs=num_envs, device=self.device,
            continuous_actions=continuous_actions, max_steps=max_steps, seed=seed,
            dict_spaces=False, terminated_truncated=True, **scenario_kwargs,
        )  # fmt: skip
        agents = [a.name for a in self._env.agents]
        obs = {a: to_gymnasium(s) for a, s in zip(agents, self._env.observation_space.spaces)}
        act = {a: to_gymnasium(s) for a, s in zip(agents, self._env.action_space.spaces)}
        self.agents = tuple(agents)
        self.groups = group_agents(agents, obs, act)
        self.observation_spaces = {g: obs[m[0]] for g, m in self.groups.items()}
        self.action_spaces = {g: act[m[0]] for g, m in self.groups.items()}
        self.state_space = None
        self._index = {a: i for i, a in enumerate(agents)}
        self._discrete = {g: action_shape(s)[1] for g, s in self.action_spaces.items()}
        self.max_steps = max_steps
        self._closed = False
        # a video recording of env 0 (rlstash.train.video.BatchedEpisodes): told of its resets
        # and steps; None: nothing is rendered
        self.recording: Any = None

    # --- the protocol ------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None) -> MultiAgentStep:
        """Every env's first observations (``seed``: VMAS's seed, else its RNG continues)."""
        obs = self._group_obs(self._env.reset(seed=seed))
        zeros = self._per_agent(torch.zeros(self.num_envs, device=self.device))
        false = {g: t.bool() for g, t in zeros.items()}
        done = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
        if self.recording is not None:
            self.recording.started()
        return MultiAgentStep(
            obs=obs, reward=zeros, terminated=false, truncated=dict(false),
            mask={g: ~t for g, t in false.items()}, action_mask=dict.fromkeys(self.groups),
            state=None, env_done=done, final_obs=None,
        )  # fmt: skip

    def step(self, actions: Mapping[str, torch.Tensor]) -> MultiAgentStep:
        """One step of every env with ``actions`` per group ([E, A_g, *act_shape], or one
        tensor per agent name; checked: wrong names and shapes are refused naming the agent);
        ended envs reset in the same step (module docstring)."""
        acts = check_actions(actions, self.groups, self.action_spaces, self.num_envs, self.device)
        per_agent: list[torch.Tensor] = [None] * len(self.agents)  # type: ignore[list-item]
        for g, members in self.groups.items():
            a = acts[g]  # [E, A_g, ...]
            for j, name in enumerate(members):
                per_agent[self._index[name]] = a[:, j, None] if self._discrete[g] else a[:, j]
        obs_list, rews, term, trunc, _infos = self._env.step(per_agent)
        obs = self._group_obs(obs_list)
        reward = {
            g: torch.stack([rews[self._index[a]] for a in m], 1).float()
            for g, m in self.groups.items()
        }  # [E, A_g] each
        term, trunc = term.bool(), trunc.bool()  # [E]
        done = term | trunc
        final = None
        ended = int(done.sum())  # the step's one host read: VMAS resets by index
        if self.recording is not None:  # env 0's frame before an ended episode resets
            self.recording.stepped(done)
        if ended:
            final = obs
            obs = self._reset_ended(done, ended, obs)
            if self.recording is not None and bool(done[0]):
                self.recording.started()
        mask = self._per_agent(torch.ones(self.num_envs, dtype=torch.bool, device=self.device))
        return MultiAgentStep(
            obs=obs, reward=reward, terminated=self._per_agent(term),
            truncated=self._per_agent(trunc), mask=mask,
            action_mask=dict.fromkeys(self.groups), state=None, env_done=done, final_obs=final,
        )  # fmt: skip

    def render_frame(self) -> Any:
        """Env 0 as an RGB frame [H, W, 3] uint8 (VMAS's pyglet renderer; headless: see
        :func:`rlstash.train.video.headless_gl`)."""
        return self._env.render(mode="rgb_array", env_index=0, visualize_when_rgb=False)

    @property
    def render_fps(self) -> float:
        """Frames per second of a video: one frame per simulation step of ``dt`` seconds."""
        dt = getattr(getattr(self._env, "world", None), "dt", None)
        return round(1.0 / dt) if dt else 10.0

    def close(self) -> None:
        """Release the simulator (and its renderer, if one was opened)."""
        if self._closed:
            return
        self._closed = True
        viewer = getattr(self._env, "viewer", None)
        if viewer is not None:
            viewer.close()
        self._env = None

    def __enter__(self) -> VmasVectorEnv:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- helpers -----------------------------------------------------------------------------

    def _reset_ended(self, done: torch.Tensor, ended: int, obs: dict[str, Any]) -> dict[str, Any]:
        """The observations after resetting the envs where ``done`` (``ended`` of them)."""
        if ended == self.num_envs:  # a fixed horizon: every env ends together, one batched reset
            return self._group_obs(self._env.reset())
        for i in done.nonzero().flatten().tolist():
            self._env.reset_at(i, return_observations=False)
        fresh = self._group_obs(
            self._env.get_from_scenario(
                get_observations=True, get_rewards=False, get_infos=False, get_dones=False
            )[0]
        )

        def pick(new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
            where = done.view(-1, *([1] * (new.dim() - 1)))
            return torch.where(where, new, old)

        return {g: _map2(pick, fresh[g], obs[g]) for g in self.groups}

    def _group_obs(self, obs_list: list[Any]) -> dict[str, Any]:
        """VMAS's per-agent observations as [E, A_g, ...] per group (dicts stacked by key)."""
        out = {}
        for g, members in self.groups.items():
            parts = [obs_list[self._index[a]] for a in members]
            if isinstance(parts[0], Mapping):
                out[g] = {k: torch.stack([p[k] for p in parts], 1) for k in parts[0]}
            else:
                out[g] = torch.stack(parts, 1)
        return out

    def _per_agent(self, t: torch.Tensor) -> dict[str, torch.Tensor]:
        """An [E] tensor repeated for each agent of each group: [E, A_g] (a copy)."""
        return {g: t[:, None].expand(-1, len(m)).clone() for g, m in self.groups.items()}


def _map2(fn: Any, a: Any, b: Any) -> Any:
    if isinstance(a, Mapping):
        return {k: fn(a[k], b[k]) for k in a}
    return fn(a, b)


def make_vmas(
    env_id: str, num_envs: int, device: torch.device | str = "cpu", seed: int | None = None,
    **kwargs: Any,
) -> VmasVectorEnv:  # fmt: skip
    """A :class:`VmasVectorEnv` for ``vmas/<scenario>`` with scenario kwargs (``max_steps``
    and ``continuous_actions`` are the env's own settings, the rest go to the scenario)."""
    if not env_id.startswith("vmas/") or not env_id[5:]:
        raise ValueError(f"env: expected 'vmas/<scenario>' (e.g. vmas/navigation), got {env_id!r}")
    return VmasVectorEnv(env_id[5:], num_envs, device, seed=seed, **kwargs)


def probe_spaces(env_id: str) -> tuple[Any, Any]:
    """(one agent's observation space, action space) of ``vmas/<scenario>`` with the scenario's
    defaults (a ValueError with the install hint when VMAS is missing)."""
    try:
        env = make_vmas(env_id, 1)
    except ImportError as exc:
        raise ValueError(f"env: {env_id!r} needs VMAS: {exc}") from None
    try:
        group = next(iter(env.groups))
        return env.observation_spaces[group], env.action_spaces[group]
    finally:
        env.close()
