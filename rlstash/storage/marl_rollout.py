"""MultiAgentRollout: one on-policy rollout of T steps of E envs of A agents, [T, E, A, ...].

The per-agent experience of MAPPO and IPPO (:mod:`rlstash.agents.mappo`), for one group of
agents with identical spaces (:mod:`rlstash.envs.multiagent`), filled one step at a time on the
env's device, planned to the byte before anything is allocated (invariant I2)::

    rollout = MultiAgentRollout(steps=T, num_envs=E, n_agents=A, obs_dim=18,
                                action_shape=(2,), device=env.device)
    rollout.start(first_step)                       # row 0's observations (a MultiAgentStep)
    for t in range(T):
        rollout.put(t, action, logp, step, final_value)   # what action t led to
    # advantages: rlstash.agents.mappo.rollout_advantages

=============== ================== ==========================================================
field           shape              meaning
=============== ================== ==========================================================
obs             [T + 1, E, A, D]   row t: what action t was taken from (flattened per agent;
                                   a dict observation's keys concatenated in sorted order);
                                   row T: the observation after the last step
state           [T + 1, E, S]      the env's global state, where it has one (else absent)
action          [T, E, A, ...]     what the policy stored (the pre-tanh sample of a tanh-normal
                                   policy; int64 indices for discrete actions)
logp            [T, E, A] float32  the behaviour policy's log-probability of ``action``
reward          [T, E, A] float32  per agent (a team reward repeats the same value)
terminated      [T, E, A] bool     the agent's episode ended for good at t (no bootstrap)
cont            [T, E, A] bool     row t + 1 continues row t's episode for that agent
mask            [T, E, A] bool     the agent acted at t: rows with False weigh 0 in the loss
final_value     [T, E, A] float32  V(final observation) where the env's episode ended at t
                                   (written by the collector: the critic at collection time is
                                   the one the update starts from, so each final observation
                                   is evaluated once and never stored)
action_mask     [T, E, A, n] bool  available discrete actions (when the env has masks)
=============== ================== ==========================================================

Each observation is stored once: row t + 1 is step t's next observation; the final
observation of an ended episode enters only through its value. A naive copy (obs and next obs
per agent) holds ``2 * D`` floats per agent-step; here it is ``D (T + 1) / T + 1``.

Several agent groups (agents with different spaces, :func:`rlstash.envs.multiagent.group_agents`)
fill a :class:`GroupedRollout`: one :class:`MultiAgentRollout` per group ([T, E, A_g, ...], its
own observation and action sizes) and the env's global state once ([T + 1, E, S], shared by
every group's critic), planned together to the byte before any is allocated::

    rollout = GroupedRollout(steps=T, num_envs=E, groups={
        "adversary": dict(n_agents=1, obs_dim=8, action_shape=(), action_dtype=torch.int64),
        "agent": dict(n_agents=2, obs_dim=10, action_shape=(), action_dtype=torch.int64)})
    rollout.rollouts["agent"].obs                  # [T + 1, E, 2, 10]
    rollout.view("agent", joint=True).state        # [T + 1, E, 1 * 8 + 2 * 10]: every group's
                                                   # observations (MAPPO's critic input where
                                                   # the env has no state; built on demand)
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from rlstash.memory import check_needs
from rlstash.spec import Field, Spec

if TYPE_CHECKING:
    from rlstash.memory import MemoryPlan

_FLOATS, _FLAGS = ("logp", "reward", "final_value"), ("terminated", "cont", "mask")


class MultiAgentRollout:
    """[T, E, A] rollout storage of one agent group (module docstring)."""

    obs: torch.Tensor
    state: torch.Tensor | None
    action: torch.Tensor
    logp: torch.Tensor
    reward: torch.Tensor
    terminated: torch.Tensor
    cont: torch.Tensor
    mask: torch.Tensor
    final_value: torch.Tensor
    action_mask: torch.Tensor | None

    def __init__(
        self,
        steps: int,
        num_envs: int,
        n_agents: int,
        obs_dim: int,
        action_shape: tuple[int, ...] = (),
        action_dtype: torch.dtype = torch.float32,
        state_dim: int | None = None,
        n_action_mask: int | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        for name, value in (("steps", steps), ("num_envs", num_envs), ("n_agents", n_agents),
                            ("obs_dim", obs_dim)):  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
        self.steps, self.num_envs, self.n_agents, self.obs_dim = steps, num_envs, n_agents, obs_dim
        self.action_shape, self.action_dtype = tuple(action_shape), action_dtype
        self.state_dim, self.n_action_mask = state_dim, n_action_mask
        self.device = torch.device(device)
        plan = self.plan_bytes(
            steps, num_envs, n_agents, obs_dim, self.action_shape, action_dtype, state_dim,
            n_action_mask,
        )  # fmt: skip
        self.check_fits(plan, steps, num_envs, n_agents, self.device)  # before allocating (I2)
        self.state = self.action_mask = None  # where the env has none
        spec = self.spec(
            steps, n_agents, obs_dim, self.action_shape, action_dtype, state_dim, n_action_mask
        )
        for name, f in spec.items():  # each field [T(+1), A, ...] per env: E envs on axis 1
            shape = (f.shape[0], num_envs, *f.shape[1:])
            setattr(self, name, torch.zeros(shape, dtype=f.dtype, device=self.device))

    @staticmethod
    def spec(
        steps: int, n_agents: int, obs_dim: int, action_shape: tuple[int, ...] = (),
        action_dtype: torch.dtype = torch.float32, state_dim: int | None = None,
        n_action_mask: int | None = None,
    ) -> Spec:  # fmt: skip
        """The rollout's tensors as the fields of one env's rows (the module's table without
        the E axis): what it allocates is ``num_envs`` of these, on axis 1."""
        T, A = steps, n_agents
        fields = {"obs": Field((T + 1, A, obs_dim), torch.float32)}
        if state_dim is not None:
            fields["state"] = Field((T + 1, state_dim), torch.float32)
        fields["action"] = Field((T, A, *action_shape), action_dtype)
        fields.update({n: Field((T, A), torch.float32) for n in _FLOATS})
        fields.update({n: Field((T, A), torch.bool) for n in _FLAGS})
        if n_action_mask is not None:
            fields["action_mask"] = Field((T, A, n_action_mask), torch.bool)
        return Spec(fields)

    @classmethod
    def plan_bytes(
        cls, steps: int, num_envs: int, n_agents: int, obs_dim: int,
        action_shape: tuple[int, ...] = (), action_dtype: torch.dtype = torch.float32,
        state_dim: int | None = None, n_action_mask: int | None = None,
    ) -> dict[str, int]:  # fmt: skip
        """Exact bytes of the tensors a rollout of these sizes allocates, by field."""
        spec = cls.spec(
            steps, n_agents, obs_dim, tuple(action_shape), action_dtype, state_dim, n_action_mask
        )
        return spec.field_nbytes(num_envs)

    @classmethod
    def plan(
        cls, steps: int, num_envs: int, n_agents: int, obs_dim: int,
        action_shape: tuple[int, ...] = (), action_dtype: torch.dtype = torch.float32,
        state_dim: int | None = None, n_action_mask: int | None = None,
        device: torch.device | str = "cpu",
    ) -> MemoryPlan:  # fmt: skip
        """The :class:`~rlstash.memory.MemoryPlan` of a rollout on ``device`` (rows: envs; the
        bytes per field are :meth:`plan_bytes`'), what is free there and whether it fits;
        nothing is allocated (``rlstash plan --algo mappo``)."""
        from rlstash.memory import plan

        spec = cls.spec(
            steps, n_agents, obs_dim, tuple(action_shape), action_dtype, state_dim, n_action_mask
        )
        return plan(spec, num_envs, device=device)

    @staticmethod
    def check_fits(
        needs: dict[str, int], steps: int, num_envs: int, n_agents: int, device: torch.device
    ) -> None:
        """Refuse a rollout whose ``needs`` (:meth:`plan_bytes`) do not fit on ``device``:
        one :class:`~rlstash.memory.InsufficientMemoryError` line naming the sizes and the
        fix (invariant I2: before anything is allocated)."""
        check_needs(
            f"a MultiAgentRollout of {steps:,} steps x {num_envs:,} envs x {n_agents} agents",
            {str(device): needs},
            "fewer steps per rollout or fewer envs (rlstash train --envs)",
        )

    def per_agent(self) -> dict[str, torch.Tensor]:
        """The [T, E, A] fields besides observations and actions, by name."""
        return {
            "logp": self.logp,
            "reward": self.reward,
            "terminated": self.terminated,
            "cont": self.cont,
            "mask": self.mask,
            "final_value": self.final_value,
        }

    @property
    def nbytes(self) -> int:
        """Bytes held by the rollout's tensors."""
        ts = [self.obs, self.state, self.action, self.action_mask, *self.per_agent().values()]
        return sum(t.numel() * t.element_size() for t in ts if t is not None)

    @property
    def frames(self) -> int:
        """Env steps per rollout: T * E."""
        return self.steps * self.num_envs

    def start(self, obs: torch.Tensor, state: torch.Tensor | None = None) -> None:
        """Row 0: the observations [E, A, D] (and state [E, S]) the rollout starts from."""
        self.obs[0].copy_(obs)
        if self.state is not None:
            self.state[0].copy_(state)

    def put(
        self,
        t: int,
        action: torch.Tensor,
        logp: torch.Tensor,
        mask: torch.Tensor,
        reward: torch.Tensor,
        terminated: torch.Tensor,
        done: torch.Tensor,
        next_obs: torch.Tensor,
        next_state: torch.Tensor | None = None,
        final_value: torch.Tensor | None = None,
        action_mask: torch.Tensor | None = None,
    ) -> None:
        """Row t: the ``action`` [E, A, ...] taken from row t's observations with ``logp``,
        which agents acted (``mask``), what came back (``reward``, ``terminated``, ``done`` =
        terminated or truncated, each [E, A]), and row t + 1's observations ``next_obs``
        [E, A, D] (the new episode's first after a same-step reset). ``final_value`` [E, A]:
        V(final observation) where the episode ended at t (0 elsewhere, or None: no episode
        ended). Whole-tensor copies only: no host read."""
        self.action[t].copy_(action)
        self.logp[t].copy_(logp)
        self.mask[t].copy_(mask)
        self.reward[t].copy_(reward)
        self.terminated[t].copy_(terminated)
        self.cont[t].copy_(~done)
        self.obs[t + 1].copy_(next_obs)
        if self.state is not None:
            self.state[t + 1].copy_(next_state)
        if final_value is None:
            self.final_value[t].zero_()
        else:
            self.final_value[t].copy_(final_value)
        if self.action_mask is not None:
            self.action_mask[t].copy_(action_mask)

    def carry_over(self) -> None:
        """Start the next rollout from this one's last row (row T becomes row 0)."""
        self.obs[0].copy_(self.obs[self.steps])
        if self.state is not None:
            self.state[0].copy_(self.state[self.steps])


class GroupedRollout:
    """The rollouts of several agent groups of one env (module docstring): ``rollouts``, one
    :class:`MultiAgentRollout` per group (without a state field), and ``state`` [T + 1, E, S]
    once where the env has a global state (``state_dim``). ``groups``: group name -> the
    :class:`MultiAgentRollout` sizes of that group (``n_agents``, ``obs_dim``, optionally
    ``action_shape``, ``action_dtype``, ``n_action_mask``). Every byte is checked to fit on
    ``device`` before the first is allocated (invariant I2)."""

    state: torch.Tensor | None

    def __init__(
        self,
        steps: int,
        num_envs: int,
        groups: Mapping[str, Mapping[str, Any]],
        state_dim: int | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        self.device = torch.device(device)
        needs = self.plan_bytes(steps, num_envs, groups, state_dim)  # checks the sizes too
        n_agents = sum(int(g["n_agents"]) for g in groups.values())
        self.check_fits(needs, steps, num_envs, n_agents, self.device)
        self.steps, self.num_envs, self.n_agents = steps, num_envs, n_agents
        self.state_dim = state_dim
        self.rollouts = {
            g: MultiAgentRollout(steps, num_envs, **sizes, state_dim=None, device=self.device)
            for g, sizes in groups.items()
        }
        self.state = None
        if state_dim is not None:
            self.state = torch.zeros(steps + 1, num_envs, state_dim, device=self.device)

    @staticmethod
    def spec(
        steps: int, groups: Mapping[str, Mapping[str, Any]], state_dim: int | None = None
    ) -> Spec:
        """One env's rows of every group's fields, named ``<group>/<field>``, and ``state``."""
        if not isinstance(groups, Mapping) or not groups:
            raise ValueError(
                f"groups: expected a dict of group name -> rollout sizes, got {groups!r}"
            )
        fields: dict[str, Field] = {}
        for g, sizes in groups.items():
            extra = set(sizes) - {"n_agents", "obs_dim", "action_shape", "action_dtype",
                                  "n_action_mask"}  # fmt: skip
            if extra or "n_agents" not in sizes or "obs_dim" not in sizes:
                raise ValueError(
                    f"groups[{g!r}]: expected n_agents, obs_dim and optionally action_shape, "
                    f"action_dtype, n_action_mask; got {sorted(sizes)}"
                )
            part = MultiAgentRollout.spec(steps, **{**sizes, "state_dim": None})
            fields.update({f"{g}/{name}": part[name] for name in part})
        if state_dim is not None:
            fields["state"] = Field((steps + 1, state_dim), torch.float32)
        return Spec(fields)

    @classmethod
    def plan_bytes(
        cls, steps: int, num_envs: int, groups: Mapping[str, Mapping[str, Any]],
        state_dim: int | None = None,
    ) -> dict[str, int]:  # fmt: skip
        """Exact bytes of every tensor the grouped rollout allocates, by ``<group>/<field>``
        (and ``state``)."""
        for name, value in (("steps", steps), ("num_envs", num_envs)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
        return cls.spec(steps, groups, state_dim).field_nbytes(num_envs)

    @classmethod
    def plan(
        cls, steps: int, num_envs: int, groups: Mapping[str, Mapping[str, Any]],
        state_dim: int | None = None, device: torch.device | str = "cpu",
    ) -> MemoryPlan:  # fmt: skip
        """The :class:`~rlstash.memory.MemoryPlan` of the grouped rollout on ``device`` (rows:
        envs), nothing allocated."""
        from rlstash.memory import plan

        return plan(cls.spec(steps, groups, state_dim), num_envs, device=device)

    check_fits = staticmethod(MultiAgentRollout.check_fits)

    @property
    def nbytes(self) -> int:
        """Bytes held by every group's tensors and the state."""
        own = 0 if self.state is None else self.state.numel() * self.state.element_size()
        return own + sum(r.nbytes for r in self.rollouts.values())

    @property
    def frames(self) -> int:
        """Env steps per rollout: T * E."""
        return self.steps * self.num_envs

    def joint_obs(self) -> torch.Tensor:
        """Every group's observations, flattened per env and concatenated in group order:
        [T + 1, E, sum_g A_g * D_g] (a new tensor: MAPPO's centralised critic input where the
        env has no global state)."""
        return torch.cat([r.obs.flatten(-2) for r in self.rollouts.values()], -1)

    def view(self, group: str, joint: bool = False) -> MultiAgentRollout:
        """``group``'s rollout as its agent reads it: the same tensors, with ``state`` the
        env's global state, or with ``joint`` (no global state) :meth:`joint_obs`."""
        out = copy.copy(self.rollouts[group])  # shares every tensor
        out.state = self.state if self.state is not None or not joint else self.joint_obs()
        return out

    def start(self, obs: Mapping[str, torch.Tensor], state: torch.Tensor | None = None) -> None:
        """Row 0: every group's observations [E, A_g, D_g] (and the state [E, S])."""
        for g, r in self.rollouts.items():
            r.start(obs[g])
        if self.state is not None:
            self.state[0].copy_(state)

    def put_state(self, t: int, state: torch.Tensor) -> None:
        """Row ``t`` of the state (the state after step t - 1)."""
        if self.state is not None:
            self.state[t].copy_(state)

    def carry_over(self) -> None:
        """Start the next rollout from this one's last row, in every group."""
        for r in self.rollouts.values():
            r.carry_over()
        if self.state is not None:
            self.state[0].copy_(self.state[self.steps])


def naive_bytes_per_step(n_agents: int, obs_dim: int, act_dim: int) -> int:
    """Bytes per env step of the naive layout (TorchRL's collector output): obs and next obs
    per agent, float32 action, log-prob, reward, done, terminated (and the env-level copies
    TorchRL also keeps are not counted)."""
    return n_agents * (2 * obs_dim * 4 + act_dim * 4 + 4 + 4 + 2)
