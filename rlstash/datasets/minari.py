"""Minari datasets in and out of a stream replay (``pip install 'rlstash[minari]'``).

In (:func:`from_minari`, ``ReplayBuffer.from_minari``): the dataset's episodes fill a
:class:`~rlstash.storage.StreamStorage` of one lane, episode after episode, in the next-step
layout the collectors write: each observation is stored once (an episode of T steps takes
T + 1 slots, its last observation a slot that is no transition start), next observations are
rebuilt on read, and each step keeps Minari's ``terminations`` and ``truncations`` apart. The
storage is sized and planned from the dataset's counts before anything is allocated
(invariant I2: ``total_steps + total_episodes`` slots), and each episode is copied once, from
the arrays Minari decodes straight into the storage's slots (:mod:`.minari_fill`, which also
deals a dataset over several lanes for offline-to-online runs).

Infos (``infos=True`` or a list of keys): each kept per-step info is a field
``info/<key>`` (``info/<key>/<sub>`` for nested dicts) stored per slot like an observation:
Minari records T + 1 infos per episode (the reset's, then each step's), so a sampled row's
``info/<key>`` is the info that came with its ``obs``. Kept: numeric or bool infos of one
shape per step; ``infos=True`` skips the others with a warning naming them, a listed key
that is not kept is a ValueError naming it.

Out (:func:`to_minari`, ``rlstash export RUN --minari NAME``): every episode a stream holds,
lane by lane, oldest first, becomes a Minari episode of ``observations`` (T + 1), ``actions``,
``rewards``, ``terminations``, ``truncations`` (T each) and ``infos`` (T + 1, from the
stream's ``info/...`` fields) through ``minari.create_dataset_from_buffers``. An episode
whose start the ring overwrote is exported from its oldest kept observation; the episode
still running in a lane ends at its newest observation, marked truncated (its newest step
has no next observation yet). A frame-stacked stream exports the single frames it stores,
with the frame's observation space and ``frame_stack: k`` in the dataset's metadata; loading
it back stacks by k again (:func:`frame_stack_of`), the same windows.

Damage: a dataset whose files do not read (metadata that does not parse, a truncated or
overwritten HDF5 file, a missing data file, an episode missing a field) is refused with a
:class:`~rlstash.manifest.DamagedFile` naming the file, wherever the read happens (loading,
the episodes' metadata, each decoded episode): :func:`reading` around every read of the
dataset's files, and only those (a full disk while filling a disk storage is no damage).

Observation fields: a Box space is the field ``obs``; a Dict space (nested too) is one field
``obs/<key>[/<key>...]`` per leaf, as everywhere in rlstash.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlstash.finite import OPT_OUT, NonFiniteError
from rlstash.manifest import DamagedFile, digest, one_line
from rlstash.spec import Field, Spec
from rlstash.storage.lanes import START, TERM, TRUNC, WRITTEN
from rlstash.storage.stream import StreamStorage
from rlstash.storage.stream_spec import ReadSpec

INSTALL_HINT = "pip install 'rlstash[minari]'"
RECREATE = "recreate the dataset (minari.DataCollector, rlstash export) or restore it from a copy"
FRAME_STACK = "frame_stack"
"""Dataset metadata key: the frames per observation of a dataset of single frames."""


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
    name = check_dataset_id(os.fspath(dataset), "dataset")
    data = Path(minari.storage.get_dataset_path(name), "data")
    if not data.is_dir():
        where = os.environ.get("MINARI_DATASETS_PATH", "~/.minari/datasets")
        local = _local_ids()
        shown = (
            ", ".join(local[:8]) + (" ..." if len(local) > 8 else "")
            if isinstance(local, list) and local
            else local or "none"
        )
        raise ValueError(
            f"dataset: no local Minari dataset {name!r} under {where} (found: {shown}); "
            f"create it (minari.DataCollector, rlstash export RUN --minari {name}) or set "
            f"MINARI_DATASETS_PATH"
        )
    _check_metadata(name, data)
    with reading(_main_file(data)):
        return minari.load_dataset(name)


def check_dataset_id(dataset_id: str, field: str) -> str:
    """``dataset_id`` when it is a Minari id, ``(namespace/)name-vN``, else a ValueError
    naming ``field`` (a path or a malformed id would make Minari's listing of every local
    dataset fail)."""
    from minari.dataset.minari_dataset import parse_dataset_id

    try:
        parse_dataset_id(dataset_id)
    except (ValueError, TypeError):
        raise ValueError(
            f"{field}: expected a Minari dataset id, (namespace/)name-vN with letters, digits, "
            f"'-' and '_' (a namespace of 2 characters or more), got {dataset_id!r}; e.g. "
            f"mine/pendulum-v0 (a dataset's folder: set MINARI_DATASETS_PATH to its root)"
        ) from None
    return dataset_id


def _local_ids() -> list[str] | str:
    """The ids of the local datasets Minari lists, or why its listing fails (a folder under
    its root that is no dataset id makes it raise)."""
    minari = import_minari()
    with warnings.catch_warnings():  # Minari warns of each misconfigured dataset it skips
        warnings.simplefilter("ignore", UserWarning)
        try:
            return sorted(minari.list_local_datasets())
        except (ValueError, TypeError, OSError) as exc:
            return f"none listed, Minari's listing fails: {one_line(exc)}"


@contextlib.contextmanager
def reading(file: str | os.PathLike) -> Iterator[None]:
    """Reads of a dataset's ``file``: whatever reading it raises (OSError, h5py's KeyError of
    a missing object and RuntimeError of a damaged heap, a metadata ValueError, ...) becomes a
    :class:`DamagedFile` naming it; an ImportError (a missing package) passes unchanged."""
    try:
        yield
    except (DamagedFile, ImportError):
        raise
    except Exception as exc:  # noqa: BLE001 - the class is "whatever damaged bytes raise"
        raise DamagedFile(file, f"it does not read ({one_line(exc)})", RECREATE) from None


def _check_metadata(name: str, data: Path) -> None:
    """A DamagedFile when the metadata in dataset ``name``'s ``data`` folder does not read,
    or names another id (Minari's listing skips such a dataset)."""
    from minari.dataset.minari_storage import MinariStorage

    with reading(data / "metadata.json"):
        meta = MinariStorage.read_raw_metadata(str(data))
        if meta.get("dataset_id") != name:
            raise ValueError(f"it names the dataset {meta.get('dataset_id')!r}, not {name!r}")


def data_file(dataset: Any) -> Path:
    """The file holding a loaded dataset's episodes (its HDF5 file; its data folder for
    another storage)."""
    return _main_file(Path(dataset.storage.data_path))


def _main_file(data: Path) -> Path:
    """The HDF5 file in a dataset's ``data`` folder, or the folder (another storage)."""
    return data / "main_data.hdf5" if (data / "main_data.hdf5").exists() else data


def fingerprint(dataset: Any) -> str:
    """What identifies a loaded dataset's contents: its id, counts and the SHA-256 of its data
    file (``"<id>: <steps> steps, <episodes> episodes, sha256 <16 hex>"``); an offline run
    records it and a resumed one checks it (the dataset is read again on resume)."""
    file = data_file(dataset)
    with reading(file):
        stat = file.stat()
        sha = _file_sha(str(file), stat.st_size, stat.st_mtime_ns) if file.is_file() else "-"
    return (
        f"{dataset.id}: {dataset.total_steps} steps, {dataset.total_episodes} episodes, "
        f"sha256 {sha[:16]}"
    )


@functools.lru_cache(maxsize=8)
def _file_sha(path: str, size: int, mtime_ns: int) -> str:
    """The SHA-256 of ``path`` (cached while its size and mtime stay)."""
    return digest(path)["sha256"]


def episodes(dataset: Any, indices: Any = None) -> Iterator[Any]:
    """The episodes of a loaded ``dataset`` (``indices``: those), each decoded under
    :func:`reading` its data file: a damaged episode is a :class:`DamagedFile`."""
    where = data_file(dataset)
    with reading(where):
        it = dataset.iterate_episodes(indices)
    end = object()
    while True:
        with reading(where):
            ep = next(it, end)
        if ep is end:
            return
        yield ep


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


def _nest_obs(flat: Mapping[str, np.ndarray], prefix: str = "obs") -> Any:
    if list(flat) == [prefix]:
        return flat[prefix]
    root: dict[str, Any] = {}
    for name, value in flat.items():
        node = root
        keys = name.split("/")[1:]
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = value
    return root


# ------------------------------------------------------------------ in
INFO_DTYPES = (np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64, np.float16,
               np.float32, np.float64)  # fmt: skip
"""Info dtypes kept as stream fields (numeric or bool, one fixed shape per step)."""


def plan_slots(dataset: Any) -> int:
    """Slots a one-lane stream needs to hold every episode of ``dataset``: one per step plus
    one final observation per episode."""
    return int(dataset.total_steps) + int(dataset.total_episodes)


def episode_lengths(dataset: Any) -> list[int]:
    """The steps of each episode of ``dataset``, in its order, from the episodes' metadata
    (nothing decoded)."""
    ds = load(dataset)
    with reading(data_file(ds)):
        meta = ds.storage.get_episode_metadata(ds.episode_indices)
        return [int(m["total_steps"]) for m in meta]


def frame_stack_of(dataset: Any) -> int:
    """The frame stack a dataset's observations are read with: its ``frame_stack`` metadata
    (written by :func:`to_minari` for a frame-stacked stream), else 1."""
    return int(load(dataset).storage.metadata.get(FRAME_STACK, 1))


def info_spec(dataset: Any, infos: bool | Iterable[str]) -> dict[str, Field]:
    """The stream fields ``info/<key>`` (``info/<key>/<sub>`` for nested dicts) of the per-step
    infos ``infos`` names: True every numeric or bool key of fixed shape (others skipped with
    a warning naming them), a list those keys (an unknown or unsupported one is a ValueError
    naming it), False none. Read from the dataset's first episode."""
    if infos is False or infos is None:
        return {}
    if infos is not True:
        infos = [infos] if isinstance(infos, str) else list(infos)
        if not infos:
            return {}
    ds = load(dataset)
    first = next(episodes(ds, ds.episode_indices[:1]), None)
    found = _flat_obs(first.infos or {}, "info") if first is not None else {}
    want = list(found) if infos is True else [_info_name(k) for k in infos]
    if not found:
        raise ValueError(
            f"infos: dataset {ds.id} records no infos; record them when collecting "
            f"(minari.DataCollector(env, record_infos=True)) or drop infos"
        )
    unknown = [k for k in want if k not in found]
    if unknown:
        raise ValueError(
            f"infos: {', '.join(k[5:] for k in unknown)} not in the infos of dataset {ds.id} "
            f"(found: {', '.join(k[5:] for k in found)}); name keys it has"
        )
    T = len(first.rewards)
    fields, skipped = {}, []
    for name in want:
        arr = np.asarray(found[name])
        if arr.dtype.type not in INFO_DTYPES or arr.ndim < 1 or len(arr) != T + 1:
            if infos is True:
                skipped.append(f"{name[5:]} ({arr.dtype} {list(arr.shape)})")
                continue
            raise ValueError(
                f"infos: key {name[5:]!r} of dataset {ds.id} is {arr.dtype} {list(arr.shape)}; "
                f"rlstash keeps numeric or bool infos of one shape per step ([T + 1, ...]); "
                f"drop it from infos"
            )
        fields[name] = Field(tuple(arr.shape[1:]), torch.from_numpy(arr[:0]).dtype)
    if skipped:
        warnings.warn(
            f"infos: skipped {', '.join(skipped)} of dataset {ds.id}: rlstash keeps numeric or "
            f"bool infos of one shape per step",
            UserWarning,
            stacklevel=2,
        )
    return fields


def _info_name(key: str) -> str:
    if not isinstance(key, str) or not key:
        raise TypeError(f"infos: expected True, False or a list of info keys, got {key!r}")
    return key if key.startswith("info/") else f"info/{key}"


def _per_slot(info_keys: list[str]) -> Callable[[Any], dict[str, Any]]:
    """An episode's per-slot fields: its observations and the infos ``info_keys``."""

    def per_slot(ep: Any) -> dict[str, Any]:
        out: dict[str, Any] = _flat_obs(ep.observations)
        if info_keys:
            got = _flat_obs(ep.infos or {}, "info")
            missing = [k[5:] for k in info_keys if k not in got]
            if missing:
                raise ValueError(
                    f"episode {ep.id}: infos {missing} missing (the first episode has them); "
                    f"the dataset's infos differ between episodes"
                )
            out.update({k: got[k] for k in info_keys})
        return out

    return per_slot


def fill_dataset(target: Any, storage: StreamStorage, dataset: Any) -> int:
    """Write every episode of ``dataset`` into the fresh next-step ``storage``, dealt over
    its lanes (:mod:`rlstash.datasets.minari_fill`), each copied once into its slots;
    ``target``: the storage or a ReplayBuffer over it. The storage's ``info/...`` fields are
    filled from the episodes' infos. Returns the steps written."""
    from rlstash.datasets.minari_fill import deal, fill

    mode = storage.autoreset.value
    if mode != "NextStep" or storage.stacked_input or storage.lanes.count.any():
        raise ValueError(
            f"storage: expected a fresh next-step StreamStorage of single frames, got "
            f"autoreset={mode!r}, stacked_input={storage.stacked_input}, "
            f"{int(storage.lanes.count.sum())} slots written"
        )
    ds = load(dataset)
    lanes, P = deal(episode_lengths(ds), storage.num_envs)
    if P > storage.lane_capacity:
        raise ValueError(
            f"storage: {storage.lane_capacity} slots per lane, the dataset needs {P}; plan "
            f"the capacity with plan_slots (or minari_fill.deal for several lanes)"
        )
    info_keys = [k for k in storage.slot_spec if k.startswith("info/")]
    any_fields = target is storage
    try:
        return fill(target, storage, episodes(ds), lanes, P, _per_slot(info_keys), any_fields)
    except NonFiniteError as exc:  # say where in the dataset, not where in the fill
        raise NonFiniteError(
            f"dataset {ds.id} ({data_file(ds)}): {_first_non_finite(ds)} holds a non-finite "
            f"value; nothing was written. Fix: clean the dataset, or {OPT_OUT}"
        ) from exc
    except ValueError as exc:  # an episode that does not match its metadata or the fields
        if type(exc) is not ValueError:  # DamagedFile: it names the file already
            raise
        raise ValueError(f"dataset {ds.id} ({data_file(ds)}): {exc}") from None


def _first_non_finite(dataset: Any) -> str:
    """``episode <id>'s <field>`` of the first non-finite value in ``dataset`` (its
    observations, actions, rewards), or ``an episode`` when none is found."""
    for ep in episodes(dataset):
        for name, value in (("observations", ep.observations), ("actions", ep.actions),
                            ("rewards", ep.rewards)):  # fmt: skip
            for key, arr in _flat_obs(value, name).items():
                if arr.dtype.kind == "f" and not np.isfinite(arr).all():
                    return f"episode {ep.id}'s {key}"
    return "an episode"


def from_minari(
    dataset: Any,
    reads: ReadSpec | None = None,
    spec: Spec | None = None,
    backing: str = "ram",
    device: str | torch.device = "cpu",
    path: str | os.PathLike | None = None,
    check_finite: bool = True,
    infos: bool | Iterable[str] = False,
) -> StreamStorage:
    """A one-lane :class:`StreamStorage` holding every episode of ``dataset`` (a
    ``MinariDataset`` or a local id), planned from the dataset's counts before allocating.
    ``spec``: the step fields to store (default: :func:`dataset_spec` of its spaces; an env's
    own spec stores the dataset in the env's dtypes, e.g. float32 observations). ``reads``:
    default n_step 1 and the dataset's :func:`frame_stack_of`. ``infos``: per-step infos kept
    as fields ``info/<key>`` (:func:`info_spec`)."""
    ds = load(dataset)
    if spec is None:
        spec = dataset_spec(ds.observation_space, ds.action_space)
    extra = info_spec(ds, infos)
    if extra:
        spec = Spec({**Spec(spec), **extra})
    if reads is None:
        reads = ReadSpec(frame_stack=frame_stack_of(ds))
    storage = StreamStorage(
        spec, 1, max(plan_slots(ds), 2, reads.n_step + reads.frame_stack), backing=backing,
        device=device, path=path, reads=reads, check_finite=check_finite,
    )  # fmt: skip
    try:
        fill_dataset(storage, storage, ds)
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
    ``observations`` (an array, or a dict for Dict observations; single frames of a
    frame-stacked stream, as stored), ``actions``, ``rewards``, ``terminations``,
    ``truncations`` and, where the stream has ``info/...`` fields, ``infos`` (module
    docstring)."""
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
    infos = {k: data[k] for k in data if k.startswith("info/")}
    if infos:  # one row per observation, as Minari's DataCollector records them
        out["infos"] = _nest_obs(infos, "info")
    return out


def frame_space(space: Any, storage: StreamStorage) -> Any:
    """``space`` (the env's observations as the agent saw them) as the stored single frames
    of ``storage``: a Box of ``[k, *frame]`` windows becomes the Box of its newest frame
    (a Dict leaf by leaf); a space of frames already is returned as it is."""
    from gymnasium import spaces

    k = storage.reads.frame_stack

    def frame(box: Any, name: str) -> Any:
        want = tuple(storage.slot_spec[name].shape)
        if tuple(box.shape) == want:
            return box
        if k > 1 and tuple(box.shape) == (k, *want):
            return spaces.Box(box.low[-1], box.high[-1], want, box.dtype)
        raise ValueError(
            f"observation_space: {name} is {box}, the stream stores frames of shape {want}"
            f"{f' stacked by {k}' if k > 1 else ''}; give the env's space"
        )

    if isinstance(space, spaces.Dict):

        def walk(sp: Any, prefix: str) -> Any:
            if isinstance(sp, spaces.Dict):
                return spaces.Dict({key: walk(sub, f"{prefix}/{key}") for key, sub in sp.items()})
            return frame(sp, prefix)

        return walk(space, "obs")
    return frame(space, storage.obs_keys[0])


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
    ``EnvSpec`` or env (the dataset's ``env_spec``; its spaces unless given). A frame-stacked
    stream (``reads.frame_stack`` k > 1) writes its single frames, the observation space is
    the frame's (:func:`frame_space`) and the dataset's metadata records ``frame_stack: k``:
    :func:`from_minari` reads it back stacked by k, the same windows."""
    minari = import_minari()
    check_dataset_id(dataset_id, "dataset_id")
    target = Path(minari.storage.get_dataset_path(dataset_id))
    if target.exists():
        raise ValueError(
            f"dataset_id: a local Minari dataset {dataset_id!r} exists already ({target}); "
            f"pick another name or delete it (minari.delete_dataset)"
        )
    from minari.data_collector.episode_buffer import EpisodeBuffer

    k = storage.reads.frame_stack
    if observation_space is not None:
        observation_space = frame_space(observation_space, storage)
    elif k > 1 or storage.stacked_input:
        raise ValueError(
            "observation_space: a frame-stacked stream needs the env's observation space to "
            "write its frames' space; give observation_space"
        )
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
    made = target  # the outermost folder the dataset creates: removed if the write fails
    root = Path(minari.storage.get_dataset_path())
    while made.parent != root and not made.parent.exists():
        made = made.parent
    try:
        with warnings.catch_warnings():  # Minari's advice to set author, code_permalink, ...
            warnings.filterwarnings("ignore", r".* is set to None", UserWarning)
            ds = minari.create_dataset_from_buffers(dataset_id, episodes, env=env, **kwargs)
        if k > 1:
            ds.storage.update_metadata({FRAME_STACK: k})
    except BaseException:  # a failed export leaves no partial dataset behind
        shutil.rmtree(made, ignore_errors=True)
        raise
    return ds
