"""The pool's side of the shared arrays: actions in, observations and final observations out
(torch-free). Used by :class:`~rlstash.envs.process_pool.ProcessPoolVectorEnv` for both
backends (worker processes and in-process).

* Actions are checked first (shape, dtype kind, the space: :mod:`rlstash.envs.actions`),
  then copied into the ``act`` arrays: nothing is written on error. Action spaces without an
  array layout are handed to the backend as one object per env.
* Observations are read from the ``obs`` arrays (copies unless ``copy=False``), or
  concatenated from the objects the workers pickled.
* ``same_step``: the final observations of the envs that ended go into ``infos`` as
  gymnasium puts them there (``final_obs`` object array, ``_final_obs`` and ``_final_info``
  masks).
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

from rlstash.envs import batching
from rlstash.envs.actions import check_each, check_leaf, leaf_spaces
from rlstash.envs.backend import Backend
from rlstash.envs.shm import assemble, copy_tree, flatten_value, is_fixed_custom, leaf_paths


class PoolArrays:
    """Views of a backend's shared arrays and the reads/writes the pool does through them."""

    def __init__(
        self, backend: Backend, obs_space: spaces.Space, act_space: spaces.Space, n: int
    ) -> None:
        shared = backend.shared
        layout = shared.layout
        self.backend = backend
        self.shared = shared
        self.obs_space, self.act_space, self.num_envs = obs_space, act_space, n
        self.batched_act_space = batch_space(act_space, n)
        self.obs_pickled, self.act_pickled = layout.obs_pickled, layout.act_pickled
        self.obs_leaves = shared.leaves("obs")
        flat = batching.is_flat(obs_space) and not is_fixed_custom(obs_space)
        self.obs_flat = self.obs_leaves[0] if not self.obs_pickled and flat else None
        self.final_leaves = shared.leaves("final_obs")
        self.act_leaves = shared.leaves("act")
        self.act_flat = (
            self.act_leaves[0] if not self.act_pickled and batching.is_flat(act_space) else None
        )
        self.act_names = [] if self.act_pickled else leaf_paths(act_space, "actions")
        self.act_spaces = leaf_spaces(act_space)
        self.obs_out = create_empty_array(obs_space, n, fn=np.zeros) if self.obs_pickled else None
        self.rewards = shared["reward"]
        self.terminated = shared["terminated"]
        self.truncated = shared["truncated"]
        self.final = shared["final"]

    def write_actions(self, actions: Any) -> None:
        """Check every leaf (shape, dtype kind, space) first, then copy; nothing is written
        on error."""
        if self.act_pickled:
            self.backend.actions = self._action_objects(actions)  # type: ignore[attr-defined]
            return
        if self.act_flat is not None:
            arrays = [np.asarray(actions)]
        else:
            arrays = [
                np.asarray(a) for a in flatten_value(self.batched_act_space, actions, "actions")
            ]
        for arr, view, name in zip(arrays, self.act_leaves, self.act_names):
            if arr.shape != view.shape:
                raise ValueError(
                    f"{name}: expected shape {view.shape} ({view.dtype}, one row per env), "
                    f"got {arr.shape}"
                )
            if arr.dtype != view.dtype and not batching.castable(arr.dtype, view.dtype):
                raise TypeError(f"{name}: expected dtype {view.dtype}, got {arr.dtype}")
        for arr, space, name in zip(arrays, self.act_spaces, self.act_names):
            check_leaf(space, arr, name)
        for arr, view in zip(arrays, self.act_leaves):
            np.copyto(view, arr, casting="unsafe")

    def _action_objects(self, actions: Any) -> list[Any]:
        """One action per env for an action space without an array layout, each checked
        with ``single_action_space.contains``."""
        try:
            items = list(iterate(self.batched_act_space, actions))
        except Exception as exc:
            raise ValueError(
                f"actions: expected an element of {self.batched_act_space}, got {type(actions)}"
            ) from exc
        if len(items) != self.num_envs:
            raise ValueError(
                f"actions: expected {self.num_envs} actions (one per env), got {len(items)}"
            )
        check_each(self.act_space, items, "actions")
        return items

    def read_obs(self, copied: bool) -> Any:
        """The batched observation: a copy, or (``copied=False``) views of shared memory
        valid until the next step (pickled observations: the pool's own array)."""
        if self.obs_pickled:
            objects = self.backend.obs_objects  # type: ignore[attr-defined]
            value = concatenate(self.obs_space, objects, self.obs_out)
            return copy.deepcopy(value) if copied else value
        if self.obs_flat is not None:
            return self.obs_flat.copy() if copied else self.obs_flat
        value = assemble(self.obs_space, self.obs_leaves)
        return copy_tree(value) if copied else value

    def add_final_obs(self, infos: dict[str, Any]) -> dict[str, Any]:
        """``same_step``: ``final_obs`` (object array of one element per env, None where the
        env did not end) with its mask first, and the ended envs in ``_final_info``."""
        ended = np.flatnonzero(self.final)
        if not ended.size:
            return infos
        final_obs = np.full(self.num_envs, None, dtype=object)
        for i in ended.tolist():
            final_obs[i] = (
                copy.deepcopy(self.backend.final_objects[i])  # type: ignore[attr-defined]
                if self.obs_pickled
                else batching.element(assemble(self.obs_space, self.final_leaves, i))
            )
        mask = np.zeros(self.num_envs, dtype=bool)
        mask[ended] = True
        infos = {"final_obs": final_obs, "_final_obs": mask, **infos}
        infos.setdefault("final_info", {})
        infos["_final_info"] = infos.get("_final_info", np.zeros_like(mask)) | mask
        return infos
