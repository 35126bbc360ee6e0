"""Plan before allocate for agents (invariant I2): an agent's networks are counted before
they are built, and refused when they do not fit.

Every agent (a subclass of :class:`~rlstash.agents.base.AgentBase`) runs its constructor
twice: first a *dry run* with the networks built on PyTorch's ``meta`` device (shapes, no
memory: a few milliseconds), stopped where they are handed to ``AgentBase._setup``; the bytes
they will take are checked against what is free, and only then is the agent built::

    learner device   parameters and buffers of every network (targets included)
                     + 3 x the trained parameters (Adam's two moments and the gradient)
    host RAM         the parameters while they are built on the CPU (a learner on a GPU)
    acting device    a copy of the policy networks, when ``act_device`` differs

A refusal is an :class:`AgentMemoryError` (an ``InsufficientMemoryError``) naming the bytes,
the largest tensors and the settings that size them; :meth:`AgentMemory.check` with a
``label`` words the same with the command line's flags (``rlstash train``). The dry run reaches only the network
building: an agent constructor that cannot run on ``meta`` tensors (a value check inside
``seeded_init``) is built without the check, as before.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from rlstash.memory import InsufficientMemoryError, check_needs, human_bytes, place_of
from rlstash.settings import field_values

_DRY_RUN = contextvars.ContextVar("rlstash_agent_dry_run", default=False)
_CHECKED = contextvars.ContextVar("rlstash_agent_checked", default=False)


class _NetsBuilt(Exception):  # noqa: N818 - a signal, not an error: the dry run's end
    def __init__(self, agent: Any, nets: dict[str, nn.Module], names: tuple[str, ...]) -> None:
        super().__init__("networks built")
        self.agent, self.nets, self.policy_names = agent, nets, names


def meta_if_dry_run() -> contextlib.AbstractContextManager:
    """``torch.device("meta")`` during a dry run (networks built without memory), else nothing."""
    return torch.device("meta") if _DRY_RUN.get() else contextlib.nullcontext()


def stop_if_dry_run(agent: Any, nets: dict[str, nn.Module], policy_names: tuple[str, ...]) -> None:
    """End a dry run where the agent's networks are complete (``AgentBase._setup``)."""
    if _DRY_RUN.get():
        raise _NetsBuilt(agent, nets, policy_names)


def _shape(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(f"{d:,}" for d in shape) + "]"


@dataclass
class AgentMemory:
    """What an agent's networks take, counted in a dry run (module docstring)."""

    agent: str  # the class name
    device: torch.device
    act_device: torch.device
    nets: dict[str, int]  # network name -> bytes of its parameters and buffers
    trained: int  # bytes of the trainable parameters (Adam state 2x, gradient 1x)
    policy: int  # bytes of the networks ``act`` runs
    largest: list[tuple[str, tuple[int, ...], int]]  # (name, shape, bytes): the biggest tensors
    settings: dict[str, Any] = field(default_factory=dict)  # what sizes the networks
    n_actions: int | None = None

    def needs(self) -> dict[str, dict[str, int]]:
        """Bytes per place, by item."""
        params = sum(self.nets.values())
        dev, act = place_of(self.device), place_of(self.act_device)
        out = {
            dev: {"parameters": params, "Adam state": 2 * self.trained, "gradients": self.trained}
        }
        if dev != "ram":
            out["ram"] = {"parameters built on the CPU": params}
        if act != dev:
            out.setdefault(act, {})["acting copy"] = self.policy
        return out

    def fix(self, label: Callable[[str], str] = lambda name: name) -> str:
        """The settings to change, named by ``label`` (a setting -> how the user gives it)."""
        fixes = []
        s = self.settings
        if self.n_actions is not None and any(
            shape[:1] == (self.n_actions,) for _, shape, _ in self.largest
        ):
            fixes.append(
                f"fewer actions (the action space has {self.n_actions:,}: a row of the action "
                "head each)"
            )
            if s.get("action_head") == "linear" and "action_embed_dim" in s:
                fixes.append(
                    f"{label('action_head')} embedding with a small {label('action_embed_dim')}"
                )
            elif "action_embed_dim" in s:
                fixes.append(f"a smaller {label('action_embed_dim')} (now {s['action_embed_dim']})")
        if "net_arch" in s:
            fixes.append(f"a smaller {label('net_arch')} (now {','.join(map(str, s['net_arch']))})")
        fixes.append(f"a {label('device')} with more free memory")
        return "; or ".join(fixes)

    def check(self, label: Callable[[str], str] = lambda name: name) -> None:
        """Raise :class:`AgentMemoryError` when the networks do not fit where they go."""
        biggest = ", ".join(f"{n} {_shape(s)} ({human_bytes(b)})" for n, s, b in self.largest)
        try:
            check_needs(
                f"the networks of a {self.agent} (largest: {biggest})",
                self.needs(),
                self.fix(label),
            )
        except InsufficientMemoryError as exc:
            raise AgentMemoryError(str(exc), exc.place, exc.needed, exc.free, self) from None


class AgentMemoryError(InsufficientMemoryError):
    """An agent's networks do not fit: ``memory`` is the :class:`AgentMemory` counted."""

    def __init__(self, message: str, place: str, needed: int, free: int, memory: AgentMemory):
        super().__init__(message, place, needed, free, None)
        self.memory = memory


def _tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def measure(build: Callable[[], Any]) -> AgentMemory | None:
    """The memory of the networks of the agent ``build()`` makes (an agent class with its
    arguments, a learner's builder), from a dry run; None when its constructor cannot run on
    ``meta`` tensors. Errors of the arguments propagate."""
    token = _DRY_RUN.set(True)
    try:
        build()
    except _NetsBuilt as built:
        return _count(built.agent, built.nets, built.policy_names)
    except (NotImplementedError, RuntimeError):
        return None  # an operation meta tensors do not support: built without the check
    finally:
        _DRY_RUN.reset(token)
    return None  # a constructor that never reached _setup


def _count(agent: Any, nets: dict[str, nn.Module], policy_names: tuple[str, ...]) -> AgentMemory:
    seen: dict[int, tuple[str, torch.Tensor]] = {}
    per_net: dict[str, int] = {}
    for name, net in nets.items():
        total = 0
        for pname, t in [*net.named_parameters(), *net.named_buffers()]:
            if id(t) not in seen:
                seen[id(t)] = (f"{name}.{pname}", t)
                total += _tensor_bytes(t)
        per_net[name] = total
    trained = sum(_tensor_bytes(t) for _, t in seen.values() if t.requires_grad)
    largest = sorted(seen.values(), key=lambda nt: -_tensor_bytes(nt[1]))[:2]
    given = field_values(agent.config)
    settings = {k: given[k] for k in ("net_arch", "action_head", "action_embed_dim") if k in given}
    return AgentMemory(
        type(agent).__name__,
        agent.device,
        agent.act_device,
        per_net,
        trained,
        sum(per_net[n] for n in policy_names),
        [(n, tuple(t.shape), _tensor_bytes(t)) for n, t in largest],
        settings,
        agent.n_actions,
    )


def planned(init: Callable[..., None]) -> Callable[..., None]:
    """``init`` (an agent's ``__init__``) preceded by a dry run and the memory check; nested
    agent constructors (``super().__init__``) and the dry run itself run as they are."""

    @functools.wraps(init)
    def checked_init(self: Any, *args: Any, **kwargs: Any) -> None:
        if _DRY_RUN.get() or _CHECKED.get():
            return init(self, *args, **kwargs)
        cls = type(self)
        memory = measure(lambda: cls.__init__(cls.__new__(cls), *args, **kwargs))
        if memory is not None:
            memory.check()
        token = _CHECKED.set(True)
        try:
            init(self, *args, **kwargs)
        finally:
            _CHECKED.reset(token)

    return checked_init


__all__ = ["AgentMemory", "AgentMemoryError", "measure", "planned"]
