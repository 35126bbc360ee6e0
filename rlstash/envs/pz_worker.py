"""A PettingZoo Parallel env as one gymnasium env of the process pool (torch-free).

:class:`ParallelAdapter` is what runs in the pool's workers: it holds one PettingZoo
``ParallelEnv`` and turns a step of all its agents into one fixed-layout gymnasium value, so
that the pool's shared memory, restarts and same-step autoreset carry multi-agent envs
unchanged. Agents are a fixed axis per group (the env's ``possible_agents`` order). The
value is ONE byte row per env (a ``Box(0, 255, (nbytes,), uint8)`` observation: the pool
copies it with one memcpy) holding these fields at 8-byte-aligned offsets
(:func:`byte_layout`; typed views of them by name: :func:`field_views`)::

    obs/<group>[/<key>]   [A_g, *obs_shape]        # zeros for absent / done agents
    reward/<group>        [A_g] float32
    terminated/<group>    [A_g] int8 (0/1)
    truncated/<group>     [A_g] int8
    mask/<group>          [A_g] int8               # the agent acted in this step (reset: present)
    alive/<group>         [A_g] int8               # the agent acts in the next step
    action_mask/<group>   [A_g, ceil(n / 8)] uint8 # discrete groups: the mask as packed bits
    state                 [*state_shape]           # where the env has a global state:
                                                   # its state() right after the step

    action: {group: [A_g, *act_shape]}             # rows of agents not acting are ignored
                                                   # (one group: the array itself)

The gymnasium-level step reports ``terminated`` when every agent of the env is done (its
``agents`` list is empty, or every agent that acted ended), so the pool's ``SameStep``
autoreset resets the env in that step and keeps the value above, with the last step's
rewards and flags and the ended episode's last ``state()`` (read before the reset), in its
final observation rows. The gymnasium reward is the sum of the agents' rewards (for logs
only; per-agent rewards are in the value).

Action masks come from the PettingZoo conventions: an observation dict
``{"observation": ..., "action_mask": ...}`` (the group's observation space is then the
``"observation"`` part) or ``infos[agent]["action_mask"]``; otherwise every action is allowed.
Errors raised here name the agent: an observation or agent the layout does not know, a value
that does not fit its agent's space.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import batch_space

from rlstash.envs.shm import make_writer, space_leaves

INSTALL_HINT = "pip install 'rlstash[pettingzoo]'"
_FLAT_ACTIONS = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


def make_parallel(module: str, kwargs: Mapping[str, Any] | None = None) -> Any:
    """``importlib.import_module(module).parallel_env(**kwargs)``, e.g.
    ``make_parallel("mpe2.simple_spread_v3", {"N": 3})``.

    Raises:
        ModuleNotFoundError: with the install hint when the module cannot be imported.
        ValueError: when the module has no ``parallel_env``.
    """
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise ModuleNotFoundError(
            f"env 'pettingzoo:{module}': cannot import {module!r} ({exc}); install PettingZoo "
            f"with: {INSTALL_HINT} (MPE tasks, mpe2.*: pip install 'rlstash[mpe]')"
        ) from exc
    factory = getattr(mod, "parallel_env", None)
    if not callable(factory):
        raise ValueError(
            f"env 'pettingzoo:{module}': module {module!r} has no parallel_env(); expected a "
            "PettingZoo env module such as pettingzoo.sisl.pursuit_v5 or mpe2.simple_spread_v3"
        )
    return factory(**dict(kwargs or {}))


@dataclass(frozen=True)
class GroupPlan:
    """How an env's agents are laid out: groups of agents with identical spaces."""

    groups: dict[str, tuple[str, ...]]  # group -> agent names (possible_agents order)
    obs_spaces: dict[str, spaces.Space]  # per group: one agent's observation space
    act_spaces: dict[str, spaces.Space]  # per group: one agent's action space
    mask_in_obs: dict[str, bool]  # the agent's observation is {"observation", "action_mask"}
    state_space: spaces.Space | None


def _split_mask(space: spaces.Space) -> tuple[spaces.Space, bool]:
    """An observation space without its ``action_mask`` part (PettingZoo's classic layout)."""
    if isinstance(space, spaces.Dict) and set(space.spaces) == {"observation", "action_mask"}:
        return space.spaces["observation"], True
    return space, False


def _default_name(agents: Sequence[str], index: int) -> str:
    prefixes = {a.rsplit("_", 1)[0] for a in agents}
    return prefixes.pop() if len(prefixes) == 1 else f"group_{index}"


def plan_groups(
    env: Any, groups: Mapping[str, Sequence[str]] | None = None, state: bool = True
) -> GroupPlan:
    """Group ``env``'s ``possible_agents`` (a PettingZoo ParallelEnv).

    Default: agents with identical observation and action spaces share a group, named
    ``"agents"`` when there is one group, else by the agents' common name prefix
    (``adversary_0`` -> ``adversary``). ``groups`` (group -> agent names) sets them by hand.
    ``state=False``: no global state even where the env has one (saves its ``state()`` call
    per step).

    Raises:
        ValueError: naming the agent for an unknown, missing or repeated agent name, or an
            agent whose spaces differ from its group's first agent; naming the agent for an
            action space that is not Box/Discrete/MultiDiscrete/MultiBinary.
    """
    possible = [str(a) for a in env.possible_agents]
    if not possible:
        raise ValueError("env: possible_agents is empty; a PettingZoo env needs agents")
    obs_of = {a: env.observation_space(a) for a in possible}
    act_of = {a: env.action_space(a) for a in possible}
    for a in possible:
        if not isinstance(act_of[a], _FLAT_ACTIONS):
            raise ValueError(
                f"agent {a!r}: action space {act_of[a]} is not supported; expected Box, "
                "Discrete, MultiDiscrete or MultiBinary (wrap the env to flatten its actions)"
            )
    if groups is None:
        keyed: dict[int, list[str]] = {}
        reps: list[str] = []
        for a in possible:
            for k, r in enumerate(reps):
                if obs_of[a] == obs_of[r] and act_of[a] == act_of[r]:
                    keyed[k].append(a)
                    break
            else:
                keyed[len(reps)] = [a]
                reps.append(a)
        if len(keyed) == 1:
            plan = {"agents": tuple(keyed[0])}
        else:
            names = [_default_name(v, k) for k, v in keyed.items()]
            if len(set(names)) < len(names):
                names = [f"group_{k}" for k in keyed]
            plan = {n: tuple(keyed[k]) for n, k in zip(names, keyed)}
    else:
        plan = _check_groups(groups, possible, obs_of, act_of)
    obs_spaces, masked = {}, {}
    for g, agents in plan.items():
        obs_spaces[g], masked[g] = _split_mask(obs_of[agents[0]])
    state_space = _state_space(env) if state else None
    return GroupPlan(
        plan, obs_spaces, {g: act_of[a[0]] for g, a in plan.items()}, masked, state_space
    )


def _state_space(env: Any) -> spaces.Box | None:
    """The env's global state space: its ``state_space``, else (a ``state()`` of its own and
    no space declared) a Box of the shape and dtype ``state()`` returns after
    ``reset(seed=0)``; None where there is no state (``state()`` raises NotImplementedError).
    """
    space = getattr(env, "state_space", None)
    if space is not None:
        if not isinstance(space, spaces.Box):
            raise ValueError(f"env: state_space {space} is not a Box; expected a Box or None")
        return space
    state = getattr(type(env), "state", None)
    if state is None or state is getattr(_base_parallel(), "state", None):
        return None
    try:
        env.reset(seed=0)
        value = np.asarray(env.state())
    except (NotImplementedError, AttributeError):
        return None
    return spaces.Box(-np.inf, np.inf, value.shape, value.dtype)


def _base_parallel() -> Any:
    try:
        from pettingzoo.utils.env import ParallelEnv
    except ImportError:  # an env of another library with PettingZoo's API
        return None
    return ParallelEnv


def _check_groups(
    groups: Mapping[str, Sequence[str]],
    possible: list[str],
    obs_of: dict[str, spaces.Space],
    act_of: dict[str, spaces.Space],
) -> dict[str, tuple[str, ...]]:
    """A hand-made group map, checked: every agent exactly once, one space per group."""
    seen: dict[str, str] = {}
    out: dict[str, tuple[str, ...]] = {}
    for g, agents in groups.items():
        if isinstance(agents, str) or not agents:
            raise ValueError(
                f"groups[{g!r}]: expected a non-empty list of agent names, got {agents!r}"
            )
        for a in agents:
            if a not in obs_of:
                raise ValueError(
                    f"groups[{g!r}]: unknown agent {a!r}; the env's agents are {possible}. "
                    "Fix the name in the group map"
                )
            if a in seen:
                raise ValueError(
                    f"groups[{g!r}]: agent {a!r} is already in group {seen[a]!r}; list each "
                    "agent in one group"
                )
            seen[a] = g
            first = agents[0]
            for what, of in (("observation", obs_of), ("action", act_of)):
                if of[a] != of[first]:
                    raise ValueError(
                        f"groups[{g!r}]: agent {a!r} has {what} space {of[a]}, agent "
                        f"{first!r} of the same group has {of[first]}; agents of a group "
                        "must have identical spaces: put them in separate groups"
                    )
        out[str(g)] = tuple(agents)
    missing = [a for a in possible if a not in seen]
    if missing:
        raise ValueError(
            f"groups: agents {missing} are in no group; every agent of possible_agents must "
            "be in one group"
        )
    return out


def _bits(n: int) -> int:
    return -(-n // 8)


class ParallelAdapter(gymnasium.Env):
    """One PettingZoo ParallelEnv as a gymnasium env of fixed layout (see the module
    docstring). ``make``: a zero-argument factory of the ParallelEnv; ``groups``: the group
    map (default: :func:`plan_groups`); ``state``: carry the env's global state."""

    metadata: dict[str, Any] = {}

    def __init__(
        self,
        make: Callable[[], Any],
        groups: Mapping[str, Sequence[str]] | None = None,
        state: bool = True,
    ) -> None:
        self.env = make()
        self.plan = plan_groups(self.env, groups, state)
        self.metadata = dict(getattr(self.env, "metadata", {}) or {})
        self.render_mode = getattr(self.env, "render_mode", None)
        plan = self.plan
        self.groups = plan.groups
        where = {}
        for g, agents in plan.groups.items():
            for i, a in enumerate(agents):
                where[a] = (g, i)
        self.where = where  # agent -> (group, index)
        self.n_actions = {
            g: int(s.n) for g, s in plan.act_spaces.items() if isinstance(s, spaces.Discrete)
        }
        self.fields, nbytes = byte_layout(value_space(plan))
        # one flat byte row per env: the pool copies it with one memcpy (no nested value)
        self.observation_space = spaces.Box(0, 255, (nbytes,), np.uint8)
        per_group = {g: batch_space(plan.act_spaces[g], len(a)) for g, a in plan.groups.items()}
        # one group: its [A, *act_shape] array itself (the pool reads one leaf, no dict)
        self.one_group = len(per_group) == 1
        self.action_space = (
            next(iter(per_group.values())) if self.one_group else spaces.Dict(per_group)
        )
        self.buf = np.zeros(nbytes, np.uint8)
        self.value = field_views(self.buf, self.fields)  # name -> typed view into buf
        self.writers = {
            g: make_writer(
                plan.obs_spaces[g],
                [
                    self.value[n]
                    for n in self.fields
                    if n == f"obs/{g}" or n.startswith(f"obs/{g}/")
                ],
                f"observation of group {g!r}",
            )
            for g in plan.groups
        }
        self.all_bits = {g: np.packbits(np.ones(n, dtype=bool)) for g, n in self.n_actions.items()}
        self.acting: list[str] = []  # agents that act in the next step

    # --- gymnasium API ----------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict | None = None
    ) -> tuple[np.ndarray, dict]:
        obs, infos = self.env.reset(seed=seed, options=options)
        self._clear()
        self.acting = [str(a) for a in self.env.agents]
        self._write(obs, infos)
        self._flags(self.acting, {}, {}, {})
        return self.buf, {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        acted = self.acting
        actions = {}
        for a in acted:
            g, i = self.where[a]
            row = action[i] if self.one_group else action[g][i]
            actions[a] = int(row) if g in self.n_actions else row
        obs, rewards, terms, truncs, infos = self.env.step(actions)
        self._clear()
        self.acting = [str(a) for a in self.env.agents]
        self._write(obs, infos)
        self._flags(acted, rewards, terms, truncs)
        ended = all(bool(terms.get(a)) or bool(truncs.get(a)) for a in acted)
        done = not self.acting or ended
        total = float(sum(float(r) for r in rewards.values()))
        return self.buf, total, done, False, {}

    def render(self) -> Any:
        return self.env.render()

    def close(self) -> None:
        self.env.close()

    def state(self) -> np.ndarray:
        """The env's global state (where it has one)."""
        return self.env.state()

    # --- the value ----------------------------------------------------------------------
    def _clear(self) -> None:
        self.buf[:] = 0

    def _write(self, obs: Mapping[str, Any], infos: Mapping[str, Any]) -> None:
        plan, value = self.plan, self.value
        for a, o in obs.items():
            if a not in self.where:
                raise ValueError(
                    f"env returned an observation for agent {a!r}, which is not in "
                    f"possible_agents {list(self.where)}; fix the env's agent names"
                )
            g, i = self.where[a]
            mask = None
            if plan.mask_in_obs[g]:
                mask, o = o["action_mask"], o["observation"]
            self.writers[g](i, o)
            if g in self.n_actions:
                info = infos.get(a) or {}
                if mask is None and isinstance(info, Mapping):
                    mask = info.get("action_mask")
                bits = self.all_bits[g] if mask is None else _pack(mask, self.n_actions[g], a)
                value[f"action_mask/{g}"][i] = bits
        for a in self.acting:  # present agents with no observation still act
            g, i = self.where.get(a, (None, 0))
            if g is None:
                raise ValueError(
                    f"env lists agent {a!r} in agents, which is not in possible_agents "
                    f"{list(self.where)}; fix the env's agent names"
                )
            value[f"alive/{g}"][i] = 1
            if g in self.n_actions and a not in obs:
                value[f"action_mask/{g}"][i] = self.all_bits[g]
        if plan.state_space is not None:
            value["state"][...] = self.env.state()

    def _flags(self, acted: list[str], rewards: Mapping, terms: Mapping, truncs: Mapping) -> None:
        value = self.value
        for a in acted:
            g, i = self.where[a]
            value[f"mask/{g}"][i] = 1
            value[f"reward/{g}"][i] = float(rewards.get(a, 0.0))
            value[f"terminated/{g}"][i] = bool(terms.get(a, False))
            value[f"truncated/{g}"][i] = bool(truncs.get(a, False))


def _pack(mask: Any, n: int, agent: str) -> np.ndarray:
    """An agent's action mask ([n] of 0/1, or None: all allowed) as packed bits."""
    if mask is None:
        return np.packbits(np.ones(n, dtype=bool))
    arr = np.asarray(mask)
    if arr.shape != (n,):
        raise ValueError(
            f"agent {agent!r}: action_mask has shape {arr.shape}, expected ({n},) (one flag "
            "per action of its Discrete space)"
        )
    return np.packbits(arr.astype(bool))


def value_space(plan: GroupPlan) -> spaces.Dict:
    """The fields of one env's step (see the module docstring) as a Dict space."""
    groups = plan.groups
    parts: dict[str, spaces.Space] = {
        "obs": spaces.Dict({g: batch_space(plan.obs_spaces[g], len(a)) for g, a in groups.items()}),
        "reward": spaces.Dict(
            {g: spaces.Box(-np.inf, np.inf, (len(a),), np.float32) for g, a in groups.items()}
        ),
    }
    for flag in ("terminated", "truncated", "mask", "alive"):
        parts[flag] = spaces.Dict({g: spaces.MultiBinary(len(a)) for g, a in groups.items()})
    n_actions = {g: int(s.n) for g, s in plan.act_spaces.items() if isinstance(s, spaces.Discrete)}
    if n_actions:
        parts["action_mask"] = spaces.Dict(
            {
                g: spaces.Box(0, 255, (len(groups[g]), _bits(n)), np.uint8)
                for g, n in n_actions.items()
            }
        )
    if plan.state_space is not None:
        parts["state"] = plan.state_space
    return spaces.Dict(parts)


Fields = dict[str, tuple[int, tuple[int, ...], str]]  # name -> (byte offset, shape, dtype)


def byte_layout(space: spaces.Dict) -> tuple[Fields, int]:
    """Every leaf of ``space`` at an 8-byte-aligned offset of one byte row, by name
    (``obs/<group>``, ``obs/<group>/<key>`` for dict observations, ``reward/<group>``,
    ``state``...); the row's length is a multiple of 8, so that typed views of the rows of a
    [E, nbytes] array keep whole-element strides."""
    fields: Fields = {}
    offset = 0
    for leaf in space_leaves(space):
        name = "/".join(map(str, leaf.path))
        fields[name] = (offset, leaf.shape, leaf.dtype.str)
        size = int(np.prod(leaf.shape, dtype=np.int64)) * leaf.dtype.itemsize
        offset += -(-max(size, 1) // 8) * 8
    return fields, max(offset, 8)


def field_views(rows: np.ndarray, fields: Fields) -> dict[str, np.ndarray]:
    """Typed views of ``rows`` (one byte row ``[nbytes]`` or ``[E, nbytes]``) by field name;
    never copies (raises if numpy would have to)."""
    lead = rows.shape[:-1]
    out = {}
    for name, (offset, shape, dtype) in fields.items():
        dt = np.dtype(dtype)
        size = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        view = rows[..., offset : offset + size].view(dt).reshape((*lead, *shape))
        if view.size and not np.may_share_memory(view, rows):
            raise RuntimeError(f"field {name}: a typed view of the shared rows would copy")
        out[name] = view
    return out


def adapter_factory(
    module: str, kwargs: Mapping[str, Any] | None, groups: Mapping[str, Sequence[str]] | None
) -> ParallelAdapter:
    """A :class:`ParallelAdapter` over ``make_parallel(module, kwargs)`` (picklable as a
    ``functools.partial`` of this function: the workers import it by name)."""
    import functools

    return ParallelAdapter(functools.partial(make_parallel, module, kwargs), groups)
