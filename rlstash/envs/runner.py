"""Stepping a block of environments against shared arrays (torch-free; used by workers and
by the in-process pool).

A runner owns envs ``start .. start+K-1`` of a pool. Per step it reads their actions from the
``act`` arrays, steps each env, writes observations, rewards and flags into rows
``start .. start+K-1`` and returns only the non-empty info dicts. Autoreset follows
gymnasium's modes (https://farama.org/Vector-Autoreset-Mode):

* ``next_step``: an env that ended at step t is reset at step t+1 instead of stepped (its action
  is ignored); that step returns the reset observation with reward 0 and both flags False.
* ``same_step``: an env that ends is reset in the same step; the returned observation is the
  reset one, the final observation goes to the ``final_obs`` arrays, ``final[i]`` is set and
  the info is ``{"final_info": step_info, **reset_info}``.
* ``disabled``: envs are only reset when asked (``reset`` with a mask).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gymnasium import Env, spaces

from rlstash.envs.shm import SharedArrays, make_reader, make_writer

MODES = ("next_step", "same_step", "disabled")


class EnvRunner:
    """Steps ``envs`` (pool rows ``start .. start+len(envs)-1``) in the calling process."""

    def __init__(
        self,
        envs: list[Env],
        start: int,
        shared: SharedArrays,
        obs_space: spaces.Space,
        act_space: spaces.Space,
        mode: str,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"autoreset_mode: expected one of {MODES}, got {mode!r}")
        self.envs = envs
        self.start = start
        self.mode = mode
        stop = start + len(envs)
        rows = slice(start, stop)
        self.autoreset = [False] * len(envs)
        self._pending: set[int] = set()  # restarted envs to report truncated at the next step
        layout = shared.layout
        # pickled observations (layout.obs_pickled): one object per env, sent with replies
        self.obs_objects: list[Any] = [None] * len(envs)
        self.final_objects: list[Any] = [None] * len(envs)
        self._actions: list[Any] = []  # pickled actions (layout.act_pickled), from STEP
        if layout.obs_pickled:
            self._write_obs = self.obs_objects.__setitem__
            self._obs_rows = None
            self._write_final = self.final_objects.__setitem__ if mode == "same_step" else None
        else:
            obs_rows = [a[rows] for a in shared.leaves("obs")]
            self._write_obs = make_writer(obs_space, obs_rows, "observation", start)
            flat = not isinstance(obs_space, (spaces.Dict, spaces.Tuple))
            self._obs_rows = obs_rows[0] if flat else None  # fast path: one array
            self._write_final = (
                make_writer(
                    obs_space, [a[rows] for a in shared.leaves("final_obs")], "observation", start
                )
                if mode == "same_step"
                else None
            )
        self._read_act = (
            (lambda: self._actions)
            if layout.act_pickled
            else make_reader(act_space, [a[rows] for a in shared.leaves("act")])
        )
        self._reward = shared["reward"][rows]
        self._terminated = shared["terminated"][rows]
        self._truncated = shared["truncated"][rows]
        self._final = shared["final"][rows]

    def reset(
        self, seeds: list[int | None], options: dict | None, mask: list[bool] | None
    ) -> list[tuple[int, dict]]:
        """Reset the envs (those with ``mask[j]`` if a mask is given); returns non-empty infos
        as ``(j, info)`` (``j``: index within this runner); clears flags and autoreset marks."""
        infos = []
        write_obs = self._write_obs
        j = 0
        try:
            for j, env in enumerate(self.envs):
                if mask is not None and not mask[j]:
                    continue
                obs, info = env.reset(seed=seeds[j], options=options)
                write_obs(j, obs)
                self.autoreset[j] = False
                self._pending.discard(j)
                self._reward[j] = 0.0
                self._terminated[j] = self._truncated[j] = self._final[j] = False
                if info:
                    infos.append((j, info))
        except Exception as exc:
            _tag(exc, self.start + j)
            raise
        return infos

    def step(self, actions: list[Any] | None = None) -> list[tuple[int, dict]]:
        """Step every env once with its action from shared memory (or ``actions``, one per
        env, for an action space without an array layout); see the module docstring.

        Returns the non-empty infos as ``(j, info)``, ``j`` the index within this runner.

        Envs marked by :meth:`mark_restarted` with code 2 are not stepped: they report
        truncated (reward 0) with the fresh reset observation already in their rows.
        """
        if actions is not None:
            self._actions = actions
        if self._pending:
            return self._step_with_pending()
        if self.mode == "same_step":
            return self._step_same(range(len(self.envs)), slice(None))
        return self._step_next(range(len(self.envs)), slice(None))

    def _step_next(self, js: Sequence[int], rows: slice | list[int]) -> list[tuple[int, dict]]:
        actions = self._read_act()
        autoreset, envs = self.autoreset, self.envs
        write_obs, obs_rows = self._write_obs, self._obs_rows
        next_step = self.mode == "next_step"
        rewards, terms, truncs, infos = [], [], [], []
        j = 0
        try:
            for j in js:
                if autoreset[j] and next_step:
                    obs, info = envs[j].reset()
                    reward, term, trunc = 0.0, False, False
                else:
                    obs, reward, term, trunc, info = envs[j].step(actions[j])
                if obs_rows is None:
                    write_obs(j, obs)
                else:
                    try:
                        obs_rows[j] = obs  # fast path: one flat array
                    except (ValueError, TypeError):
                        write_obs(j, obs)  # raises the error that names the env
                rewards.append(reward)
                terms.append(term)
                truncs.append(trunc)
                autoreset[j] = term or trunc
                if info:
                    infos.append((j, info))
        except Exception as exc:
            _tag(exc, self.start + j)
            raise
        self._reward[rows] = rewards
        self._terminated[rows] = terms
        self._truncated[rows] = truncs
        return infos

    def _step_same(self, js: Sequence[int], rows: slice | list[int]) -> list[tuple[int, dict]]:
        actions = self._read_act()
        write_obs, write_final, envs = self._write_obs, self._write_final, self.envs
        assert write_final is not None
        rewards, terms, truncs, finals, infos = [], [], [], [], []
        j = 0
        try:
            for j in js:
                obs, reward, term, trunc, info = envs[j].step(actions[j])
                done = bool(term or trunc)
                if done:
                    write_final(j, obs)
                    obs, reset_info = envs[j].reset()
                    if info or reset_info:
                        info = {"final_info": info, **reset_info}
                write_obs(j, obs)
                rewards.append(reward)
                terms.append(term)
                truncs.append(trunc)
                finals.append(done)
                if info:
                    infos.append((j, info))
        except Exception as exc:
            _tag(exc, self.start + j)
            raise
        self._reward[rows] = rewards
        self._terminated[rows] = terms
        self._truncated[rows] = truncs
        self._final[rows] = finals
        return infos

    def _step_with_pending(self) -> list[tuple[int, dict]]:
        pending, self._pending = self._pending, set()
        js = [j for j in range(len(self.envs)) if j not in pending]
        infos = []
        if js:
            step = self._step_same if self.mode == "same_step" else self._step_next
            infos = step(js, js)
        for j in pending:
            self._report_truncated(j)
        return infos

    def _report_truncated(self, j: int) -> None:
        self._reward[j] = 0.0
        self._terminated[j] = False
        self._truncated[j] = True
        self._final[j] = False
        self.autoreset[j] = self.mode == "next_step"

    def mark_restarted(self, codes: Sequence[int]) -> None:
        """After a restart's fresh reset, per env: 0 nothing (a reset asked for it),
        1 report truncated now (reward 0; in ``next_step`` mode the next step resets again, so
        the step after a truncation stays a reset step), 2 report it at the next step."""
        for j, code in enumerate(codes):
            if code == 1:
                self._report_truncated(j)
            elif code == 2:
                self._pending.add(j)

    def call(self, name: str, args: tuple, kwargs: dict) -> list[Any]:
        """``env.get_wrapper_attr(name)`` per env, called with the arguments if callable."""
        out = []
        for env in self.envs:
            attr = env.get_wrapper_attr(name)
            out.append(attr(*args, **kwargs) if callable(attr) else attr)
        return out

    def set_attr(self, name: str, values: list[Any]) -> None:
        """``env.set_wrapper_attr(name, values[j])`` per env."""
        for env, value in zip(self.envs, values):
            env.set_wrapper_attr(name, value)

    def close(self) -> None:
        """Close every env; the first error is raised after all were tried."""
        first: BaseException | None = None
        for env in self.envs:
            try:
                env.close()
            except Exception as exc:  # noqa: BLE001 - close the others first
                first = first or exc
        self.envs = []
        if first is not None:
            raise first


def _tag(exc: Exception, env: int) -> None:
    """Mark ``exc`` with the pool index of the env that raised it (``exc.env_index``)."""
    try:
        exc.env_index = env  # type: ignore[attr-defined]
    except AttributeError:  # exceptions with __slots__
        pass


def check_spaces(envs: list[Env], first_index: int) -> tuple[spaces.Space, spaces.Space]:
    """The common (observation_space, action_space) of ``envs``; ValueError if they differ."""
    obs_space, act_space = envs[0].observation_space, envs[0].action_space
    for j, env in enumerate(envs):
        for what, got, want in (
            ("observation_space", env.observation_space, obs_space),
            ("action_space", env.action_space, act_space),
        ):
            if got != want:
                raise ValueError(
                    f"env {first_index + j}: {what} {got} differs from env {first_index}'s "
                    f"{want}; every env of a pool needs the same spaces"
                )
    return obs_space, act_space
