"""RolloutStorage: one on-policy rollout of T steps of N envs, [T, N], on any device.

PPO and other on-policy learners consume each rollout once, right after collecting it::

    rollout = RolloutStorage(Spec({"obs": ((4,), "float32"), "action": ((), "int64")}),
                             steps=32, num_envs=8, device="cpu")
    batch = collector.collect()                 # [T, N] fields from rlstash.collect.Collector
    rollout.add(batch, collector.next_obs)      # + the observation after the last step [N, ...]
    for idx in rollout.minibatches(256, generator):   # shuffled row indices into T * N
        ...

The storage lives on ``device`` (where the env data arrives: the host for the process pool,
the env's GPU for GPU-batched envs); ``add`` copies into preallocated tensors and derives, with
whole-tensor operations only (no host read, so no synchronization on a GPU):

=========== ================ ===================================================================
field       shape            meaning
=========== ================ ===================================================================
obs         [T + 1, N, ...]  row t: the observation action t was taken from; row T: the one after
                             (dict observations: a dict of such tensors by key, see below)
action      [T, N, ...]      as the collector stored it (int64 indices, or float vectors)
reward      [T, N] float32
terminated, [T, N] bool      as the env reported them
truncated
final_obs   [T, N, ...]      same-step autoreset only: the final observation of an episode
                             ending at t (the next row then holds the reset observation)
valid       [T, N] bool      a real step: False for next-step autoreset's reset steps (the row
                             after an episode end, whose action the env ignored) and for steps
                             of a restarted worker (they never happened); ``all_valid`` says on
                             the host, without reading it, that every row is (same-step mode, no
                             restarted worker): learners can skip the weighting then
cont        [T, N] bool      step t+1 continues step t's episode (see :mod:`rlstash.agents.gae`)
action_mask [T, N, ...]      when the spec has it
=========== ================ ===================================================================

The observation step t led to is ``obs[t + 1]``, except in same-step mode where an episode
ended at t: there it is ``final_obs[t]``. In next-step mode ``obs[t + 1]`` *is* the final
observation after an episode end (the reset comes one step later), and for the last row
``obs[T]`` is what the collector holds next, so truncated and running episodes bootstrap from
the right observation in both modes. Whether row 0 is a reset step depends on the previous
rollout's last row: that flag is carried over (and saved in ``state_dict``).

Dict observations (Isaac Lab's observation groups, ``{"policy": [N, ...], "critic": ...}``,
nested dicts too): the spec holds ``obs/<key>`` fields (nested keys joined by ``/``) instead of
``obs``, as the batched :class:`~rlstash.collect.sync.Collector` names them; ``obs`` and
``final_obs`` are then dicts of tensors by key, and ``add`` takes ``next_obs`` as the env
returns it (a nested dict) or with joined keys.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from rlstash.finite import OPT_OUT, check_finite, rows_where
from rlstash.memory import check_needs
from rlstash.spec import Batch, Field, Spec, flat_obs

Obs = Any  # a tensor, or a dict of tensors by key (a dict observation)
DICT_PREFIX = "obs/"

_FLAGS = ("reward", "terminated", "truncated")
_FINITE_FIX = f"find where the env produces it, or {OPT_OUT} (RolloutStorage)"


class RolloutStorage:
    """[T, N] rollout storage (module docstring); ``spec`` holds ``obs`` and ``action`` per step
    (and optionally ``action_mask``).

    ``add`` refuses (ValueError naming the field, nothing changed) a field it does not know and,
    unless ``check_finite=False``, NaN or +-inf in a float field (invariant I10: observations,
    float actions, rewards, the final observations of ended episodes, ``next_obs``): one sum
    per float field, read back once per ``add`` (one host read on a GPU)."""

    def __init__(
        self,
        spec: Spec,
        steps: int,
        num_envs: int,
        device: torch.device | str = "cpu",
        same_step: bool = False,
        check_finite: bool = True,
    ) -> None:
        for name, value in (("steps", steps), ("num_envs", num_envs)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
        if not isinstance(spec, Spec) or "action" not in spec:
            raise ValueError(f"spec: expected a Spec with 'obs' and 'action' fields, got {spec!r}")
        self.obs_fields = obs_fields(spec)  # {"": obs} or {key: obs/key} of a dict observation
        known = {
            "action",
            "action_mask",
            *(DICT_PREFIX + k if k else "obs" for k in self.obs_fields),
        }
        unknown = sorted(set(spec) - known)
        if unknown:
            raise ValueError(
                f"spec: unexpected fields {unknown}; expected obs (or obs/<key> fields of a dict "
                "observation), action, action_mask"
            )
        self.spec, self.steps, self.num_envs = spec, steps, num_envs
        self.device, self.same_step = torch.device(device), bool(same_step)
        self.check_finite = bool(check_finite)
        T, N = steps, num_envs
        check_needs(  # refused before anything is allocated (invariant I2)
            f"a RolloutStorage of {T:,} steps x {N:,} envs",
            {str(self.device): self.plan_bytes(spec, T, N, same_step)},
            "fewer steps (PPO's rollout_steps) or num_envs (rlstash train --envs)",
        )

        def alloc(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=self.device)

        def alloc_obs(rows: int) -> Obs:
            out = {k: alloc((rows, N, *f.shape), f.dtype) for k, f in self.obs_fields.items()}
            return out[""] if "" in out else out

        self.obs = alloc_obs(T + 1)
        self.action = alloc((T, N, *spec["action"].shape), spec["action"].dtype)
        self.action_mask = None
        if "action_mask" in spec:
            self.action_mask = alloc((T, N, *spec["action_mask"].shape), spec["action_mask"].dtype)
        self.final_obs = alloc_obs(T) if same_step else None
        self.reward = alloc((T, N), torch.float32)
        self.terminated, self.truncated = alloc((T, N), torch.bool), alloc((T, N), torch.bool)
        self.valid, self.cont = alloc((T, N), torch.bool), alloc((T, N), torch.bool)
        self._after_done = alloc((N,), torch.bool)  # next-step mode: row 0 is a reset step
        self.filled = False
        self.all_valid = False  # known on the host without reading ``valid``

    @staticmethod
    def plan_bytes(
        spec: Spec, steps: int, num_envs: int, same_step: bool = False
    ) -> dict[str, int]:
        """Exact bytes of the tensors a rollout of ``steps`` x ``num_envs`` allocates, by name."""
        T, N = steps, num_envs
        obs = sum(f.row_bytes for f in obs_fields(spec).values())
        out = {"obs": (T + 1) * N * obs, "action": T * N * spec["action"].row_bytes}
        if "action_mask" in spec:
            out["action_mask"] = T * N * spec["action_mask"].row_bytes
        if same_step:
            out["final_obs"] = T * N * obs
        out["reward and flags"] = 8 * T * N + N  # reward, 4 bool flags; the carried-over flag
        return out

    @property
    def nbytes(self) -> int:
        """Bytes held by the rollout's tensors."""
        tensors = [*obs_tensors(self.obs), self.action, self.reward, self.terminated,
                   self.truncated, self.valid, self.cont, *obs_tensors(self.final_obs),
                   self.action_mask]  # fmt: skip
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    @property
    def size(self) -> int:
        """Rows per rollout: T * N."""
        return self.steps * self.num_envs

    def add(self, batch: Mapping[str, torch.Tensor], next_obs: Obs) -> None:
        """Replace the rollout by ``batch`` ([T, N] fields of a collector) and ``next_obs`` [N, ...]
        (the observation after its last step; a dict of them, nested or with ``/``-joined keys,
        for dict observations, whose batch fields are ``obs/<key>``). Validates everything
        first: a bad batch changes nothing."""
        data = self._checked(batch, next_obs)
        done = data["terminated"] | data["truncated"]  # [T, N]
        if self.same_step:
            after = torch.zeros_like(done)
        else:  # next-step autoreset: the row after an episode end is a reset step
            after = torch.cat([self._after_done[None], done[:-1]])  # [T, N]
        valid = ~after
        if "restarted" in data:
            valid &= ~data["restarted"]
        nxt = torch.cat([valid[1:], torch.ones_like(valid[:1])])  # [T, N]: row t+1 is a real step
        for key, name in self._obs_names("obs"):
            _obs_part(self.obs, key)[: self.steps].copy_(data[name])
            _obs_part(self.obs, key)[self.steps].copy_(data[f"next_{name}"])
            if self.final_obs is not None:
                _obs_part(self.final_obs, key).copy_(data[f"final_{name}"])
        for name in ("action", *_FLAGS):
            self.tensors()[name].copy_(data[name])
        if self.action_mask is not None:
            self.action_mask.copy_(data["action_mask"])
        self.valid.copy_(valid)
        # every row is a real step: same-step mode and no restarted worker (no device read)
        self.all_valid = self.same_step and "restarted" not in data
        self.cont.copy_(~done & nxt)
        if not self.same_step:
            self._after_done.copy_(done[-1])
        self.filled = True

    def _obs_names(self, prefix: str) -> list[tuple[str, str]]:
        """(key, batch field) of each observation part: ("", prefix) or (key, prefix/key)."""
        return [(k, f"{prefix}/{k}" if k else prefix) for k in self.obs_fields]

    def _checked(self, batch: Mapping[str, torch.Tensor], next_obs: Obs) -> Batch:
        T, N = self.steps, self.num_envs
        if not isinstance(batch, Mapping):
            raise TypeError(f"batch: expected a dict of [T, N] tensors, got {type(batch).__name__}")
        want: dict[str, tuple[tuple[int, ...], torch.dtype | None]] = {
            name: ((T, N, *f.shape), f.dtype) for name, f in self.spec.items()
        }
        want.update({"reward": ((T, N), None), "terminated": ((T, N), torch.bool),
                     "truncated": ((T, N), torch.bool)})  # fmt: skip
        if self.same_step:
            for key, name in self._obs_names("final_obs"):
                f = self.obs_fields[key]
                want[name] = ((T, N, *f.shape), f.dtype)
        optional = {"restarted": ((T, N), torch.bool)}
        unknown = sorted(set(batch) - set(want) - set(optional), key=str)
        if unknown:
            finals = "" if self.same_step else "; final_obs needs RolloutStorage(same_step=True)"
            raise ValueError(
                f"batch: unexpected fields {unknown}; RolloutStorage.add takes {sorted(want)} "
                f"and optionally {sorted(optional)}: drop the others{finals}"
            )
        out: Batch = {}
        for name, (shape, dtype) in {**want, **optional}.items():
            if name not in batch:
                if name in optional:
                    continue
                raise ValueError(f"batch: missing field {name!r} (got {sorted(batch)})")
            out[name] = _field(f"batch[{name!r}]", batch[name], shape, dtype, self.device)
        if "reward" in out and not out["reward"].is_floating_point():
            raise TypeError(f"batch['reward']: expected a float tensor, got {out['reward'].dtype}")
        out["reward"] = out["reward"].float()
        if "" in self.obs_fields:
            parts = {"": next_obs}
        elif not isinstance(next_obs, Mapping):
            raise TypeError(
                f"next_obs: expected a dict of [N, ...] tensors (keys {sorted(self.obs_fields)}), "
                f"got {type(next_obs).__name__}"
            )
        else:
            parts = flat_obs("", next_obs)
        for key, name in self._obs_names("next_obs"):
            if key not in parts:
                raise ValueError(f"next_obs: missing key {key!r} (got {sorted(parts)})")
            f = self.obs_fields[key]
            out[name] = _field(name, parts[key], (N, *f.shape), f.dtype, self.device)
        if self.check_finite:  # I10: [T, N] fields time-major; final obs where episodes ended
            nxt = {k: v for k, v in out.items() if k.startswith("next_obs")}  # [N, ...]
            steps = {k: v.flatten(0, 1) for k, v in out.items() if k not in nxt}
            finals = {k: steps.pop(k) for k in list(steps) if k.startswith("final_obs")}
            done = (out["terminated"] | out["truncated"]).reshape(-1)
            check_finite(steps, rows_where(finals, done), nxt, envs=N, fix=_FINITE_FIX)
        return out

    def tensors(self) -> dict[str, Any]:
        """Every tensor field by name (None where this rollout has no such field)."""
        return {
            "obs": self.obs,
            "action": self.action,
            "action_mask": self.action_mask,
            "final_obs": self.final_obs,
            "reward": self.reward,
            "terminated": self.terminated,
            "truncated": self.truncated,
            "valid": self.valid,
            "cont": self.cont,
            "_after_done": self._after_done,
        }

    def flat(self, name: str) -> Any:
        """Field ``name`` with T and N merged: [T * N, ...] (a view; ``obs`` without row T; for
        dict observations ``obs`` and ``final_obs`` are dicts of them by key)."""
        t = self.tensors()[name]
        if name == "obs":
            t = obs_map(lambda x: x[: self.steps], t)
        return obs_map(lambda x: x.reshape(self.size, *x.shape[2:]), t)

    def minibatches(
        self, batch_size: int, generator: torch.Generator
    ) -> Iterator[torch.Tensor | None]:
        """Shuffled row indices into the T * N rows (int64 on ``generator``'s device), in chunks
        of ``batch_size`` (the last one smaller when it does not divide T * N). When one chunk
        holds every row it is ``None``: all rows, in storage order (a mean over all rows does
        not depend on their order, so no gather is needed)."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size: expected an int >= 1, got {batch_size!r}")
        if batch_size >= self.size:
            yield None
            return
        perm = torch.randperm(self.size, generator=generator, device=generator.device)
        yield from perm.split(batch_size)

    def to(self, device: torch.device | str) -> RolloutStorage:
        """This rollout on ``device``: ``self`` when it is there already, else a copy (blocking
        copies, safe to read when this returns)."""
        device = torch.device(device)
        here = self.device
        if here.type == device.type and (here.index is None or device.index in (None, here.index)):
            return self
        out = copy.copy(self)
        for name, t in self.tensors().items():
            setattr(out, name, None if t is None else obs_map(lambda x: x.to(device), t))
        out.device = device
        return out

    def state_dict(self) -> dict[str, Any]:
        """What carries over to the next rollout (whether row 0 will be a reset step)."""
        return {"after_done": self._after_done.cpu()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        after = state["after_done"]
        if tuple(after.shape) != (self.num_envs,):
            raise ValueError(
                f"state['after_done']: expected shape [{self.num_envs}] (num_envs), got "
                f"{list(after.shape)}; resume with the same number of envs"
            )
        self._after_done.copy_(after.to(self.device))


def _field(
    name: str,
    value: Any,
    shape: tuple[int, ...],
    dtype: torch.dtype | None,
    device: torch.device,
) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(value).__name__}")
    if tuple(value.shape) != shape:
        raise ValueError(f"{name}: expected shape {list(shape)}, got {list(value.shape)}")
    if dtype is not None and value.dtype != dtype:
        if dtype == torch.bool or (value.is_floating_point() and not dtype.is_floating_point):
            raise TypeError(f"{name}: expected {dtype}, got {value.dtype}")
        value = value.to(dtype)
    return value.to(device)


def obs_fields(spec: Spec) -> dict[str, Field]:
    """The observation's fields of a step spec: ``{"": spec["obs"]}``, or for a dict
    observation (fields ``obs/<key>``, nested keys joined by ``/``) ``{key: field}``."""
    if "obs" in spec:
        return {"": spec["obs"]}
    out = {n[len(DICT_PREFIX) :]: f for n, f in spec.items() if n.startswith(DICT_PREFIX)}
    if not out:
        raise ValueError(
            f"spec: expected an 'obs' field (or obs/<key> fields of a dict observation), got "
            f"{sorted(spec)}"
        )
    return out


def obs_map(fn: Any, obs: Obs) -> Obs:
    """``fn`` applied to an observation tensor, or to each tensor of a dict observation."""
    if isinstance(obs, Mapping):
        return {k: fn(v) for k, v in obs.items()}
    return fn(obs)


def obs_tensors(obs: Obs | None) -> list[torch.Tensor]:
    """The tensors of an observation (none for None)."""
    if obs is None:
        return []
    return list(obs.values()) if isinstance(obs, Mapping) else [obs]


def _obs_part(obs: Obs, key: str) -> torch.Tensor:
    return obs if key == "" else obs[key]
