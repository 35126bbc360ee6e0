"""Minari datasets in and out of a stream replay (``pip install 'rlstash[minari]'``).

In (:func:`from_minari`, ``ReplayBuffer.from_minari``): the dataset's episodes fill a
:class:`~rlstash.storage.StreamStorage` of one lane, episode after episode, in the next-step
layout the collectors write: each observation is stored once (an episode of T steps takes
T + 1 slots, its last observation a slot that is no transition start), next observations are
rebuilt on read, and each step keeps Minari's ``terminations`` and ``truncations`` apart. The
storage is sized and planned from the dataset's counts before anything is allocated
(invariant I2: ``total_steps + total_episodes`` slots), and the episodes go in as large
time-major chunks (:data:`CHUNK` slots per ``extend``).

Out (:func:`to_minari`, ``rlstash export RUN --minari NAME``): every episode a stream holds,
lane by lane, oldest first, becomes a Minari episode of ``observations`` (T + 1), ``actions``,
``rewards``, ``terminations``, ``truncations`` (T each) through
``minari.create_dataset_from_buffers``. An episode whose start the ring overwrote is exported
from its oldest kept observation; the episode still running in a lane ends at its newest
observation, marked truncated (its newest step has no next observation yet).

Observation fields: a Box space is the field ``obs``; a Dict space (nested too) is one field
``obs/<key>[/<key>...]`` per leaf, as everywhere in rlstash. Minari's ``infos`` are not kept.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import torch

from rlstash.spec import Field, Spec
from rlstash.storage.lanes import START, TERM, TRUNC, WRITTEN
from rlstash.storage.stream import StreamStorage
from rlstash.storage.stream_spec import ReadSpec

INSTALL_HINT = "pip install 'rlstash[minari]'"
CHUNK = 1 << 16
"""Slots per ``extend`` while filling (a few MB of temporaries for MuJoCo-sized rows)."""


def import_minari() -> Any:
    """The ``minari`` module, or an ImportError with the install hint."""
    try:
        import minari
    except ImportError as exc:
        raise ImportError(f"Minari datasets need the minari package: {INSTALL_HINT}") from exc
    return minari


def load(dataset: Any) -> Any:
    """A ``MinariDataset``: ``dataset`` itself, or the local dataset of that id (a ValueError
    naming the ids found under ``MINARI_DATASETS_PATH`` when there is none)."""
    minari = import_minari()
    if isinstance(dataset, minari.MinariDataset):
        return dataset
    if not isinstance(dataset, (str, os.PathLike)):
        raise TypeError(
            f"dataset: expected a minari.MinariDataset or a local dataset id, got "
            f"{type(dataset).__name__}"
        )
    name = os.fspath(dataset)
    local = sorted(minari.list_local_datasets())
    if name not in local:
        where = os.environ.get("MINARI_DATASETS_PATH", "~/.minari/datasets")
        shown = ", ".join(local[:8]) + (" ..." if len(local) > 8 else "") if local else "none"
        raise ValueError(
            f"dataset: no local Minari dataset {name!r} under {where} (found: {shown}); "
            f"create it (minari.DataCollector, rlstash export RUN --minari {name}) or set "
            f"MINARI_DATASETS_PATH"
        )
    return minari.load_dataset(name)


# ------------------------------------------------------------------ spaces and specs
def _leaves(space: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    from gymnasium import spaces

    if isinstance(space, spaces.Dict):
        for key, sub in space.spaces.items():
            yield from _leaves(sub, f"{prefix}/{key}")
    elif isinstance(space, spaces.Box):
        yield prefix, space
    else:
        raise ValueError(
            f"observation_space: expected a Box or a Dict of Boxes, got {space} at {prefix!r}; "
            f"rlstash stores Box observations"
        )


def dataset_spec(observation_space: Any, action_space: Any) -> Spec:
    """The step spec of a dataset with these spaces: ``obs`` (or ``obs/<key>`` per Dict
    leaf) in the space's dtype, ``action`` int64 (Discrete) or float32 (Box)."""
    from gymnasium import spaces

    fields = {
        name: Field(tuple(box.shape), torch.from_numpy(np.zeros(0, box.dtype)).dtype)
        for name, box in _leaves(observation_space, "obs")
    }
    if isinstance(action_space, spaces.Discrete):
        fields["action"] = Field((), torch.int64)
    elif isinstance(action_space, spaces.Box):
        fields["action"] = Field(tuple(action_space.shape), torch.float32)
    else:
        raise ValueError(
            f"action_space: expected a Discrete or a Box, got {action_space}; "
            f"rlstash stores those actions"
        )
    return Spec(fields)


def _flat_obs(obs: Any, prefix: str = "obs") -> dict[str, np.ndarray]:
    if isinstance(obs, Mapping):
        out: dict[str, np.ndarray] = {}
        for key, sub in obs.items():
            out.update(_flat_obs(sub, f"{prefix}/{key}"))
        return out
    return {prefix: np.asarray(obs)}


def _nest_obs(flat: Mapping[str, np.ndarray]) -> Any:
    if list(flat) == ["obs"]:
        return flat["obs"]
    root: dict[str, Any] = {}
    for name, value in flat.items():
        node = root
        keys = name.split("/")[1:]
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = value
    return root


# ------------------------------------------------------------------ in
def plan_slots(dataset: Any) -> int:
    """Slots a one-lane stream needs to hold every episode of ``dataset``: one per step plus
    one final observation per episode."""
    return int(dataset.total_steps) + int(dataset.total_episodes)


def _as(value: Any, field: Field, rows: int, name: str, episode: Any) -> np.ndarray:
    """``value`` as ``[rows, *field.shape]`` in the field's dtype, or a ValueError naming it."""
    arr = np.asarray(value)
    want = (rows, *field.shape)
    if arr.size != int(np.prod(want)):
        raise ValueError(
            f"episode {episode}: {name} has shape {arr.shape}, expected {want} (the spec's "
            f"{tuple(field.shape)} per row); the dataset does not match the env's spaces"
        )
    return arr.reshape(want).astype(torch.empty(0, dtype=field.dtype).numpy().dtype, copy=False)


def _episode_rows(ep: Any, spec: Spec) -> dict[str, np.ndarray]:
    """One episode in next-step rows: T + 1 observations, the steps' fields padded by one
    row (the final-observation slot's, dropped by the storage)."""
    obs = _flat_obs(ep.observations)
    if set(obs) != {k for k in spec if k.startswith("obs")}:
        raise ValueError(
            f"episode {ep.id}: observation fields {sorted(obs)} differ from the dataset's "
            f"space {sorted(k for k in spec if k.startswith('obs'))}"
        )
    T = len(ep.rewards)
    term = np.asarray(ep.terminations, bool).reshape(T)
    trunc = np.asarray(ep.truncations, bool).reshape(T).copy()
    if T and not (term[-1] or trunc[-1]):
        trunc[-1] = True  # an episode cut without a flag ends truncated, never stitched
    action = _as(ep.actions, spec["action"], T, "action", ep.id)
    rows = {name: _as(value, spec[name], T + 1, name, ep.id) for name, value in obs.items()}
    pad = np.zeros((1, *action.shape[1:]), action.dtype)
    rows["action"] = np.concatenate([action, pad])
    rows["reward"] = np.append(np.asarray(ep.rewards, np.float32).reshape(T), np.float32(0))
    rows["terminated"] = np.append(term, False)
    rows["truncated"] = np.append(trunc, False)
    return rows


def fill_stream(
    storage: StreamStorage, episodes: Iterable[Any], extend: Callable[[Any], Any] | None = None
) -> int:
    """Write Minari episodes into lane 0 of a one-lane next-step ``storage`` (module
    docstring); returns the steps written. Episodes of zero steps are skipped. ``extend``:
    what writes a chunk (default ``storage.extend``; a ReplayBuffer's over that storage)."""
    mode = storage.autoreset.value
    if storage.num_envs != 1 or mode != "NextStep":
        raise ValueError(
            f"storage: expected a one-lane next-step StreamStorage, got num_envs="
            f"{storage.num_envs}, autoreset={mode!r}"
        )
    spec, steps, pending, size = storage.spec, 0, [], 0

    def flush() -> None:
        if pending:
            chunk = {k: np.concatenate([p[k] for p in pending])[:, None] for k in pending[0]}
            (extend or storage.extend)({k: torch.from_numpy(v) for k, v in chunk.items()})
            pending.clear()

    for ep in episodes:
        if len(ep.rewards) == 0:
            continue
        rows = _episode_rows(ep, spec)
        steps += len(ep.rewards)
        pending.append(rows)
        size += len(rows["reward"])
        if size >= CHUNK:
            flush()
            size = 0
    flush()
    return steps


def from_minari(
    dataset: Any,
    reads: ReadSpec | None = None,
    spec: Spec | None = None,
    backing: str = "ram",
    device: str | torch.device = "cpu",
    path: str | os.PathLike | None = None,
    check_finite: bool = True,
) -> StreamStorage:
    """A one-lane :class:`StreamStorage` holding every episode of ``dataset`` (a
    ``MinariDataset`` or a local id), planned from the dataset's counts before allocating.
    ``spec``: the step fields to store (default: :func:`dataset_spec` of its spaces; an env's
    own spec stores the dataset in the env's dtypes, e.g. float32 observations)."""
    ds = load(dataset)
    if spec is None:
        spec = dataset_spec(ds.observation_space, ds.action_space)
    storage = StreamStorage(
        spec, 1, max(plan_slots(ds), 2), backing=backing, device=device, path=path,
        reads=reads, check_finite=check_finite,
    )  # fmt: skip
    try:
        fill_stream(storage, ds.iterate_episodes())
    except BaseException:
        storage.close()
        raise
    return storage


def env_id(dataset: Any) -> str:
    """The gymnasium id of the env a dataset was collected in (its ``env_spec``), or a
    ValueError when the dataset names none."""
    ds = load(dataset)
    spec = ds.env_spec
    if spec is None or not spec.id:
        raise ValueError(
            f"dataset: {ds.id} names no environment (its env_spec is empty); "
            f"give --env, or recreate it with an env"
        )
    return str(spec.id)


# ------------------------------------------------------------------ out
def stream_episodes(storage: StreamStorage) -> Iterator[dict[str, Any]]:
    """Every episode ``storage`` holds, lane by lane, oldest first, as Minari buffers:
    ``observations`` (an array, or a dict for Dict observations), ``actions``, ``rewards``,
    ``terminations``, ``truncations`` (module docstring)."""
    if storage.reads.frame_stack != 1 or storage.stacked_input:
        raise ValueError(
            "storage: a frame-stacked stream stores single frames of windows the env never "
            "returned; export needs frame_stack=1"
        )
    lanes = storage.lanes
    obs_keys = storage.obs_keys
    for lane in range(storage.num_envs):
        seqs = np.arange(lanes.alive_floor()[lane], lanes.count[lane])
        rows = lanes.row(lane, seqs)
        flags = lanes.flags[rows]
        keep = (flags & WRITTEN) != 0
        rows, flags = rows[keep], flags[keep]
        starts = (flags & START) != 0
        # an episode: a run of start slots and the slot after it (the final observation)
        ends = np.flatnonzero(~starts)
        begin = 0
        bounds = []
        for end in ends:
            bounds.append((begin, end))
            begin = end + 1
        if begin < len(rows):  # the running episode: its newest step has no next obs yet
            bounds.append((begin, len(rows) - 1))
        for b, e in bounds:
            if e <= b:
                continue
            running = bool(starts[e])  # the newest slot of the lane, its step unfinished
            yield _episode_buffer(storage, rows[b : e + 1], flags[b:e], obs_keys, running)


def _episode_buffer(
    storage: StreamStorage, rows: np.ndarray, flags: np.ndarray, obs_keys: list[str], running: bool
) -> dict[str, Any]:
    data = {k: v.cpu().numpy() for k, v in storage.backing.read(rows).items()}
    term = (flags & TERM) != 0
    trunc = (flags & TRUNC) != 0
    if running or not (term[-1] or trunc[-1]):
        trunc[-1] = True
    out: dict[str, Any] = {
        "observations": _nest_obs({k: data[k] for k in obs_keys}),
        "actions": data["action"][:-1],
        "rewards": data["reward"][:-1],
        "terminations": term,
        "truncations": trunc,
    }
    return out


def to_minari(
    storage: StreamStorage,
    dataset_id: str,
    env: Any,
    algorithm_name: str = "rlstash",
    author: str | None = None,
    observation_space: Any = None,
    action_space: Any = None,
) -> Any:
    """Write every episode of ``storage`` as the local Minari dataset ``dataset_id`` and
    return it (``minari.load_dataset(dataset_id)`` reads it back). ``env``: a gymnasium id,
    ``EnvSpec`` or env (the dataset's ``env_spec``; its spaces unless given)."""
    minari = import_minari()
    if dataset_id in minari.list_local_datasets():
        raise ValueError(
            f"dataset_id: a local Minari dataset {dataset_id!r} exists already; pick another "
            f"name or delete it (minari.delete_dataset)"
        )
    from minari.data_collector.episode_buffer import EpisodeBuffer

    episodes = [EpisodeBuffer(**ep) for ep in stream_episodes(storage)]
    if not episodes:
        raise ValueError("storage: holds no complete step to export; collect some first")
    kwargs: dict[str, Any] = {"algorithm_name": algorithm_name, "jpeg_encoding": False}
    if author is not None:
        kwargs["author"] = author
    if observation_space is not None:
        kwargs["observation_space"] = observation_space
    if action_space is not None:
        kwargs["action_space"] = action_space
    with warnings.catch_warnings():  # Minari's advice to set author, code_permalink, ...
        warnings.filterwarnings("ignore", r".* is set to None", UserWarning)
        return minari.create_dataset_from_buffers(dataset_id, episodes, env=env, **kwargs)
