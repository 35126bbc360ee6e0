"""The :class:`~rlstash.collect.sync.Collector`'s path for batched torch envs.

A batched env is a gymnasium ``VectorEnv`` whose ``reset``/``step`` take and return torch
tensors on one device (ManiSkill3's ``ManiSkillVectorEnv``, Isaac Lab's envs, rlstash's
``rlstash/CartPole-v1``). It is recognised by its ``device`` attribute, found through its
wrappers; its first reset and step are checked (:mod:`rlstash.collect.env_contract`:
shapes ``[N]``, dtypes, devices, gymnasium's step tuple). Then:

* observations go straight to the policy and actions straight back to the env, on the env's
  device; batches ``[T, N, ...]`` are assembled there (nothing passes through the host);
* all work is queued on the caller's current CUDA stream: no ``torch.cuda.synchronize``,
  no side stream, unless ``cuda_stream="dedicated"`` (the policy then runs on a side stream
  that waits for the caller's and that the caller's waits for before the env steps);
* the only device-to-host copies are the episode returns and lengths that are logged: once
  per batch into pinned memory with ``non_blocking=True``, an event recorded behind the
  copy, and the event waited on before the host reads them (invariant I4);
* dict observations (Isaac Lab's observation groups, ``{"policy": [N, ...], "critic": ...}``;
  nested dicts too) go to the policy as the env returns them and into the batch as fields
  ``obs/<key>`` (``obs/<key>/<subkey>``; same-step final observations ``final_obs/<key>``),
  the names :class:`~rlstash.storage.stream.StreamStorage` and ``TensorStorage`` specs use;
* autoreset is the env's: ``metadata["autoreset_mode"]``, or gymnasium's default, NextStep,
  when the env does not say (as on the host path; an undeclared env showing same-step
  behaviour is refused with the declaration to add). In same-step mode the final
  observations come from ``info["final_obs"]`` (gymnasium >= 1.0, rlstash envs) or
  ``info["final_observation"]`` (ManiSkill3), a tensor ``[N, ...]`` read where the mask
  ``info["_final_obs"]`` (or the step's done flags) is set.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from rlstash import autoreset
from rlstash.collect.env_contract import (
    FINAL_KEYS,
    UndeclaredNextStep,
    check_leading,
    check_step,
    same_device,
)
from rlstash.core import DirectSteps
from rlstash.device import CudaOps
from rlstash.spec import Batch, flat_obs
from rlstash.storage.ram import numpy_view
from rlstash.storage.stream_direct import check_step_fields


def cuda_ops_for(device: torch.device) -> CudaOps | None:
    """The CUDA operations the path needs (None off CUDA; tests substitute fakes)."""
    return CudaOps() if device.type == "cuda" else None


def host(x: Any) -> np.ndarray:
    """A host copy (blocking, so complete when it returns) of a tensor or array."""
    if isinstance(x, torch.Tensor):
        return (x if x.device.type == "cpu" else x.to("cpu")).numpy()
    return np.asarray(x)


class _Numpy:
    """Array operations of :func:`episode_ends` on the CPU (numpy over the tensors' memory:
    several times cheaper per operation than torch there)."""

    where, cat = staticmethod(np.where), staticmethod(np.concatenate)

    @staticmethod
    def cumsum(x: Any, dtype: Any) -> Any:
        return _accumulate(np.add, np.asarray(x, dtype=dtype))

    @staticmethod
    def cummax(x: Any) -> Any:
        return _accumulate(np.maximum, np.array(x))

    @staticmethod
    def take(x: Any, i: Any) -> Any:
        return np.take_along_axis(x, i, 0)

    @staticmethod
    def steps(x: Any) -> Any:
        return np.arange(x.shape[0])[:, None]


def _accumulate(op: Any, out: Any) -> Any:
    """``op.accumulate(out, 0)`` in place. Along axis 0 of a wide [T, N] array numpy's
    accumulate runs element by element; T row operations over N contiguous values are
    ~30x faster when N is large."""
    if out.shape[0] > 4 * out.shape[1]:
        return op.accumulate(out, 0, out=out)
    for t in range(1, out.shape[0]):
        op(out[t - 1], out[t], out=out[t])
    return out


class _Torch:
    """The same on an accelerator: torch kernels on the device, nothing on the host."""

    where, cat = staticmethod(torch.where), staticmethod(torch.cat)

    @staticmethod
    def cumsum(x: Any, dtype: Any) -> Any:
        return torch.cumsum(x, 0, dtype=dtype)

    @staticmethod
    def cummax(x: Any) -> Any:
        return torch.cummax(x, 0).values

    @staticmethod
    def take(x: Any, i: Any) -> Any:
        return x.gather(0, i)

    @staticmethod
    def steps(x: Any) -> Any:
        return torch.arange(x.shape[0], device=x.device)[:, None]


def episode_ends(xp: Any, reward: Any, done: Any, live: Any, carry: tuple) -> tuple:
    """Returns and lengths where episodes end in a batch ``[T, N]``, and the new carry.

    ``live`` marks steps that belong to an episode (next-step mode: not the reset step after
    an end); ``carry`` = (return, length) ``[N]`` of the open episodes. With the running sums
    ``c[t] = carry + sum_{s <= t} live[s] r[s]`` and ``p(t)`` the env's previous end before
    ``t``: the return of an episode ending at ``t`` is ``c[t] - c[p(t)]`` (``c[-1] = 0``); the
    new carry is ``c[T - 1] - c[last end]``. A few whole-batch operations, whatever ``T``."""
    c_ret = xp.cumsum(reward * live, dtype=carry[0].dtype) + carry[0]  # [T, N]
    c_len = xp.cumsum(live, dtype=carry[1].dtype) + carry[1]  # [T, N]
    last = xp.cummax(xp.where(done, xp.steps(done), -1))  # [T, N] the env's last end <= t
    prev = xp.cat([last[:1] * 0 - 1, last[:-1]])  # [T, N] its previous end < t
    at, has = prev * (prev >= 0), prev >= 0
    ret = c_ret - xp.where(has, xp.take(c_ret, at), 0)
    length = c_len - xp.where(has, xp.take(c_len, at), 0)
    end, ended = last[-1:] * (last[-1:] >= 0), last[-1] >= 0
    carry = (
        c_ret[-1] - xp.where(ended, xp.take(c_ret, end)[0], 0),
        c_len[-1] - xp.where(ended, xp.take(c_len, end)[0], 0),
    )
    return ret, length, carry


class EpisodeLog:
    """Returns and lengths of finished episodes, computed on the env's device once per batch
    (:func:`episode_ends`); on CUDA they reach the host by one asynchronous copy per batch
    that is read only after its event completed (``flush``, ``drain``)."""

    def __init__(self, num_envs: int, device: torch.device, cuda: CudaOps | None) -> None:
        self.device, self.cuda = device, cuda
        self.xp = _Numpy if device.type == "cpu" and cuda is None else _Torch
        z = torch.zeros(num_envs, dtype=torch.float64, device=device)
        self.carry: tuple = (z, z.to(torch.int64))
        self.after_done = torch.zeros(num_envs, dtype=torch.bool, device=device)
        if self.xp is _Numpy:  # rows of numpy operations on the CPU (_add_rows)
            self.carry = tuple(c.numpy() for c in self.carry)
            self.after_done = self.after_done.numpy()
        self.rows: list[tuple[Any, Any, Any]] = []
        self.pending: list[tuple[Any, dict[str, Any]]] = []

    def reset(self) -> None:
        for a in (*self.carry, self.after_done):
            a[...] = 0
        self.rows.clear()

    def add(self, reward: Any, done: torch.Tensor, next_step: bool) -> None:
        """Record the episodes ended in a batch of rewards and end flags ``[T, N]`` (the
        rewards may be a list of T tensors or arrays ``[N]``: rows of a storage, not copied
        on the CPU)."""
        if self.xp is _Numpy:
            rows = [np.asarray(r) for r in reward] if isinstance(reward, list) else reward.numpy()
            self._add_rows(rows, done.numpy(), next_step)
            return
        if isinstance(reward, list):
            reward = torch.stack([torch.as_tensor(r) for r in reward])
        if next_step:  # the step after an end is a reset step: it belongs to no episode
            live = ~self.xp.cat([self.after_done[None], done[:-1]])
            self.after_done = done[-1].copy() if self.xp is _Numpy else done[-1].clone()
        else:
            live = done == done  # all True, in the right namespace
        ret, length, self.carry = episode_ends(self.xp, reward, done, live, self.carry)
        self.rows.append((done, ret, length))

    def _add_rows(self, reward: Any, done: np.ndarray, next_step: bool) -> None:
        """The CPU: T row operations over N envs in place (no [T, N] temporaries, whose
        allocation costs more than the arithmetic); finished episodes in step order."""
        ret, length = self.carry
        out_r, out_l = [], []
        live = np.ones(done.shape[1], bool)
        for t in range(done.shape[0]):
            if next_step:  # the step after an end is a reset step: no episode's
                np.logical_not(self.after_done, out=live)
                ret += reward[t] * live
                np.add(length, live, out=length)
                np.logical_and(done[t], live, out=self.after_done)
                ended = self.after_done
            else:
                ret += reward[t]
                length += 1
                ended = done[t]
            i = np.flatnonzero(ended)
            if i.size:
                out_r.append(ret[i])
                out_l.append(length[i])
                ret[i], length[i] = 0, 0
        if out_r:
            self.pending.append(
                (None, {"ret": np.concatenate(out_r), "len": np.concatenate(out_l)})
            )

    def flush(self) -> None:
        """Queue the host copy of the finished episodes (CPU: they are host arrays already)."""
        if not self.rows:
            return
        names = ("done", "ret", "len")
        got = {k: self.xp.cat(list(v)) for k, v in zip(names, zip(*self.rows))}
        self.rows.clear()
        if self.xp is _Numpy:
            self.pending.append((None, got))
            return
        if self.cuda is None:  # another accelerator: a blocking copy, complete when it returns
            self.pending.append((None, {k: v.to("cpu").numpy() for k, v in got.items()}))
            return
        out = {}
        for k, v in got.items():
            out[k] = self.cuda.empty_pinned(v.shape, v.dtype)
            out[k].copy_(v, non_blocking=True)  # async D2H on the caller's stream ...
        event = self.cuda.new_event()
        event.record(self.cuda.current_stream(self.device))
        self.pending.append((event, out))  # ... read only after the event (drain)

    def drain(self, returns: Any, lengths: Any) -> int:
        """Append finished episodes (in step order) to ``returns``/``lengths``; their count."""
        count = 0
        for event, got in self.pending:
            if event is not None:
                event.synchronize()  # the copy has landed: now the host may read it (I4)
                got = {k: v.numpy() for k, v in got.items()}
            if "done" in got:  # a [T, N] batch from the device
                t, i = np.nonzero(got["done"])
                got = {"ret": got["ret"][t, i], "len": got["len"][t, i]}
            returns.extend(got["ret"].tolist())
            lengths.extend(got["len"].tolist())
            count += len(got["ret"])
        self.pending.clear()
        return count


class BatchedPath:
    """Steps a batched env with a policy on the env's device (see the module docstring)."""

    def __init__(
        self, env: Any, device: torch.device, cuda_stream: str, wrappers: tuple[str, ...] = ()
    ) -> None:
        self.env, self.device, self.wrappers = env, device, wrappers
        self.num_envs = int(env.num_envs)
        self.cuda = cuda_ops_for(device)
        self.dedicated = cuda_stream == "dedicated" and self.cuda is not None
        self._side: Any = None
        declared = autoreset.declared(env)
        mode = autoreset.DEFAULT if declared is None else declared
        if mode not in autoreset.STEP_MODES:
            raise ValueError(
                f"env: autoreset_mode {mode.value!r} is not supported by the Collector; make "
                "the env with autoreset_mode NextStep or SameStep"
            )
        self.same_step = mode == AutoresetMode.SAME_STEP
        self.watch = None  # an env that says nothing: watched for same-step behaviour
        if declared is None:
            ended = torch.zeros(self.num_envs, dtype=torch.bool, device=device)
            self.watch = UndeclaredNextStep(ended)
        self.log = EpisodeLog(self.num_envs, device, self.cuda)
        self.obs: torch.Tensor | dict[str, Any] | None = None  # as the env returns it
        self.fields: dict[str, torch.Tensor] = {}  # its tensors by field name (flat_obs)

    def reset(self, seed: int | None) -> None:
        obs, _ = self.env.reset(seed=seed)
        self.obs, self.fields = obs, self._check_obs("observations", "obs", obs)
        self.log.reset()
        if self.watch is not None:
            self.watch.reset()

    def _check_obs(self, name: str, prefix: str, obs: Any) -> dict[str, torch.Tensor]:
        """The tensors of an observation (a tensor or a dict of them) by field name, checked."""
        fields = flat_obs(prefix, obs)
        if not fields:
            raise TypeError(f"{name}: got an empty dict; expected tensors on {self.device}")
        for key, t in fields.items():
            label = name if key == prefix else f"{name}[{key.partition('/')[2]!r}]"
            check_leading(label, self._check(label, t), self.num_envs)
        return fields

    def _check(self, name: str, t: Any) -> torch.Tensor:
        if not isinstance(t, torch.Tensor) or not same_device(t.device, self.device):
            where = t.device if isinstance(t, torch.Tensor) else type(t).__name__
            fix = (
                "wrap the env so that it does, or give it no 'device' attribute to use the "
                "host path"
            )
            if self.wrappers:
                fix = (
                    f"{self.device} is the device of the env inside {' > '.join(self.wrappers)}"
                    f"; make {self.wrappers[0]} return tensors there, or give it a 'device' "
                    "attribute of None (it returns host arrays: the host path)"
                )
            raise TypeError(
                f"{name}: a batched env on {self.device} must return torch tensors on "
                f"{self.device}, got {where}; {fix}"
            )
        return t

    @torch.no_grad()
    def act(self, policy: Any, obs: torch.Tensor) -> torch.Tensor:
        """``policy(obs)`` on the env's device, queued behind ``obs`` on the stream."""
        return self._act(policy, obs)

    def _act(self, policy: Any, obs: torch.Tensor) -> torch.Tensor:
        """:meth:`act` inside a ``no_grad`` region already."""
        if not self.dedicated:
            return self._checked_policy(policy, obs)
        cuda = self.cuda
        assert cuda is not None
        caller = cuda.current_stream(self.device)
        if self._side is None:
            self._side = cuda.new_stream(self.device)
        self._side.wait_stream(caller)  # the policy sees the env's latest observations
        with cuda.use_stream(self._side):
            actions = self._checked_policy(policy, obs)
        caller.wait_stream(self._side)  # the env steps only after the actions exist
        for t in flat_obs("obs", obs).values():
            cuda.record_stream(t, self._side)
        cuda.record_stream(actions, caller)
        return actions

    def _checked_policy(self, policy: Any, obs: torch.Tensor) -> torch.Tensor:
        actions = policy(obs)
        if not isinstance(actions, torch.Tensor) or not same_device(actions.device, self.device):
            where = actions.device if isinstance(actions, torch.Tensor) else type(actions)
            raise ValueError(
                f"policy: expected actions as a tensor on {self.device} (the env's device), "
                f"got {where}; put the policy on {self.device}"
            )
        return actions

    @torch.no_grad()
    def collect(self, policy: Any, steps: int, actions: torch.Tensor | None = None) -> Batch:
        """``steps`` env steps; returns the ``[T, N, ...]`` batch on the env's device
        (``actions``: the policy's actions for the current observations, when already made)."""
        if self.obs is None:
            raise RuntimeError("collect: reset() first")
        obs, fields = self.obs, self.fields
        if actions is None:
            actions = self._act(policy, obs)
        out = self._allocate(steps, fields, actions)
        o_t = {k: out[k].unbind(0) for k in fields}  # per-step views of the batch
        a_t, r_t, term_t, trunc_t = (
            out[k].unbind(0) for k in ("action", "reward", "terminated", "truncated")
        )
        for t in range(steps):
            if t:
                actions = self._act(policy, obs)
            for k, v in fields.items():
                o_t[k][t].copy_(v)  # before the step: an env may reuse its buffers
            a_t[t].copy_(actions)
            next_obs, reward, term, trunc, info = self._step(actions, t)
            r_t[t].copy_(reward)
            term_t[t].copy_(term)
            trunc_t[t].copy_(trunc)
            if self.same_step:
                self._final_obs(out, t, info, term_t[t] | trunc_t[t])
            obs, fields = next_obs, self._check_obs("observations", "obs", next_obs)
        self.obs, self.fields = obs, fields
        if self.watch is not None:  # before anything is logged or returned
            self.watch.rows(out["reward"], out["terminated"], out["truncated"])
        self.log.add(out["reward"], out["terminated"] | out["truncated"], not self.same_step)
        self.log.flush()
        if "final_missing" in out:
            _refuse_missing_final(out.pop("final_missing"))
        return out

    def _step(self, actions: torch.Tensor, t: int) -> tuple[Any, Any, Any, Any, Any]:
        """``env.step``; the first step of a batch is checked (:func:`check_step`), each
        step's info too while the env's autoreset mode is undeclared."""
        result = self.env.step(actions)
        if t == 0:
            result = check_step(self.env, result, self.num_envs, self.device)
        if self.watch is not None:
            self.watch.info(result[4])
        return result

    @torch.no_grad()
    def collect_into(self, policy: Any, steps: int, target: Any) -> np.ndarray:
        """``steps`` env steps stored in ``target``: each step's observation, action and
        reward copied once, straight into the slots ``target.open_steps`` gives (a stream's
        rows: :mod:`rlstash.storage.stream_direct`), the flags into a small ``[2, T, N]``
        buffer; where that is not possible (same-step mode, another storage, other dtypes),
        ``target.extend`` of the batch. Returns the slots written."""
        if self.obs is None:
            raise RuntimeError("collect: reset() first")
        obs, fields = self.obs, self.fields
        actions = self._act(policy, obs)
        direct = not self.same_step and isinstance(target, DirectSteps)
        slots = target.open_steps(steps) if direct else None
        if slots is None or check_step_fields(slots.step(0), fields, actions) is not None:
            return target.extend(self.collect(policy, steps, actions))
        flags = np.empty((2, steps, self.num_envs), bool)  # the direct path is on the CPU
        rewards = []
        for t in range(steps):
            row = slots.step_arrays(t)  # numpy views of the stream's rows
            if t:
                actions = self._act(policy, obs)
            for k, v in fields.items():
                np.copyto(row[k], numpy_view(v))  # before the step: an env may reuse its buffers
            np.copyto(row["action"], numpy_view(actions))
            next_obs, reward, term, trunc, _ = self._step(actions, t)
            np.copyto(row["reward"], numpy_view(reward), casting="same_kind")
            np.copyto(flags[0, t], numpy_view(term), casting="unsafe")
            np.copyto(flags[1, t], numpy_view(trunc), casting="unsafe")
            rewards.append(row["reward"])
            obs, fields = next_obs, self._check_obs("observations", "obs", next_obs)
        self.obs, self.fields = obs, fields
        if self.watch is not None:  # before the steps are committed
            r, f = torch.from_numpy(np.stack(rewards)), torch.from_numpy(flags)
            self.watch.rows(r, f[0], f[1])
        self.log.add(rewards, torch.from_numpy(flags[0] | flags[1]), True)  # before the rows move
        self.log.flush()
        terminated, truncated = torch.from_numpy(flags[0]), torch.from_numpy(flags[1])
        return slots.commit(terminated, truncated)

    def _allocate(self, T: int, fields: dict[str, torch.Tensor], actions: torch.Tensor) -> Batch:
        dev, n = self.device, self.num_envs
        out = {k: torch.empty((T, *v.shape), dtype=v.dtype, device=dev) for k, v in fields.items()}
        out.update(
            action=torch.empty((T, *actions.shape), dtype=actions.dtype, device=dev),
            reward=torch.empty((T, n), dtype=torch.float32, device=dev),
            terminated=torch.empty((T, n), dtype=torch.bool, device=dev),
            truncated=torch.empty((T, n), dtype=torch.bool, device=dev),
        )
        if self.same_step:
            for k, v in fields.items():
                out["final_" + k] = torch.zeros((T, *v.shape), dtype=v.dtype, device=dev)
        return out

    def _final_obs(self, out: Batch, t: int, info: dict, done: torch.Tensor) -> None:
        for key, mask_key in FINAL_KEYS:
            if key in info:
                finals = self._check_obs(f"info[{key!r}]", "final_obs", info[key])
                want = ["final_" + k for k in self.fields]
                if list(finals) != want:
                    raise ValueError(
                        f"info[{key!r}]: expected the observation's fields {want}, got "
                        f"{list(finals)}; report final observations shaped like observations"
                    )
                mask = info.get(mask_key, done)
                for name, final in finals.items():
                    m = mask.view(-1, *([1] * (final.dim() - 1)))
                    out[name][t] = torch.where(m, final, 0)
                return
        # no final observation given: fine if no episode ended; checked once per batch
        missing = out.get("final_missing")
        out["final_missing"] = done.any() if missing is None else missing | done.any()


def _refuse_missing_final(missing: torch.Tensor) -> None:
    if bool(missing):  # one blocking read per batch, only for envs that omit the key
        raise ValueError(
            "env: an episode ended in same-step autoreset mode but info has no 'final_obs' "
            "(or 'final_observation') tensor, so its last observation is lost; make the env "
            "report it, or use next-step autoreset (metadata['autoreset_mode'])"
        )
