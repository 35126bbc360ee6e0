"""``rlstash verify RUN``: check a whole run directory and print what was found, a line a check.

For each checkpoint (``checkpoint/``, and ``checkpoint.old/`` where it is kept):

1. ``MANIFEST.json`` parses and is a checkpoint's;
2. every file it lists has the listed size and SHA-256;
3. ``state.pt`` loads, the settings it records match the env as it is now, and its agent loads
   into a new agent built from its config;
4. ``buffer.pt`` loads, its disk directories (relative to it) are there, and each disk buffer's
   ``meta.json``, ``commit.rec`` and data-file sizes check out, read-only
   (:func:`rlstash.storage.disk.inspect`: no lock on the buffer, nothing written), and a
   disk stream's bookkeeping as reopening reads it (``stream.npz``, ``lanes.bin``,
   ``lanes.rec``, the slots' flags: :func:`rlstash.storage.stream_commit.inspect_stream`).

Then each buffer's rows: the float fields of every written slot are scanned for NaN and inf,
and the bool fields' bytes for values other than 0 and 1 (damage: no writer stores them), in
chunks of about 64 MiB (a disk buffer through read-only memory maps, so a buffer larger than
RAM is fine). The run is held while it is checked (:func:`rlstash.train.rundir.hold`): a
trainer running in it makes ``verify`` refuse (exit 2, naming its PID), and no trainer starts
meanwhile. Exit 0 when every check passed, 1 when one failed (each failure names the file,
what is wrong and the fix), 2 when the run cannot be checked at all.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlstash import manifest
from rlstash.cli.main import describe
from rlstash.manifest import DamagedFile
from rlstash.train import checkpoint, rundir

_CHUNK_BYTES = 64 << 20
_SHOW = 5  # slots named per field with non-finite values


@dataclass
class Finding:
    """One check: ``ok`` True (passed), False (failed) or None (could not be checked here)."""

    ok: bool | None
    item: str
    text: str

    def line(self) -> str:
        tag = {True: "ok  ", False: "FAIL", None: "skip"}[self.ok]
        return f"{tag}  {self.item}: {self.text}"


@dataclass
class _Buffers:
    """Row sources already scanned (a disk buffer is shared by both checkpoints)."""

    seen: set[str] = field(default_factory=set)


def verify_run(run_dir: Path) -> list[Finding]:
    """Every check of the module docstring on ``run_dir`` (held while it runs)."""
    if not run_dir.is_dir():
        raise ValueError(f"run: {run_dir} is not a directory; give a run directory (runs/<name>)")
    found: list[Finding] = []
    with rundir.hold(run_dir, create=False, doing="rlstash verify"):
        ckpts = [run_dir / n for n in (checkpoint.NAME, f"{checkpoint.NAME}.old")]
        ckpts = [c for c in ckpts if c.is_dir()]
        if not ckpts:
            raise ValueError(f"run: no checkpoint in {run_dir}; nothing to verify")
        buffers = _Buffers()
        for ckpt in ckpts:
            found += _check_checkpoint(ckpt, buffers)
        tmp = run_dir / f"{checkpoint.NAME}.tmp"
        if tmp.exists():
            found.append(Finding(None, str(tmp), "an unfinished checkpoint (its writer stopped); "
                                 "ignored, the next checkpoint replaces it"))  # fmt: skip
    return found


def _check_checkpoint(ckpt: Path, buffers: _Buffers) -> Iterator[Finding]:
    if not (ckpt / "COMPLETE").exists():
        yield Finding(False, str(ckpt), f"no COMPLETE marker; fix: {checkpoint.fix_for(ckpt)}")
    man, man_ok = None, True
    try:
        man = checkpoint.read_manifest(ckpt)
        if man is not None:
            files = ", ".join(sorted(man["files"]))
            yield Finding(
                True, str(ckpt / "MANIFEST.json"), f"step {man.get('step')}, lists {files}"
            )
    except DamagedFile as exc:
        man_ok = False
        yield _failed(exc)
    for name in sorted(man["files"]) if man else ():
        try:
            checkpoint.verify_file(ckpt, name, man)
            size = man["files"][name]["bytes"]
            yield Finding(True, str(ckpt / name), f"{size:,} bytes, SHA-256 as listed")
        except DamagedFile as exc:
            yield _failed(exc)
    state = None
    try:
        with checkpoint.reading(ckpt / checkpoint.STATE):
            state = manifest.load_torch(ckpt / checkpoint.STATE)
            step = state["step"]
            state["config"], state["agent"]  # noqa: B018 - a KeyError names the missing key
        yield Finding(True, str(ckpt / checkpoint.STATE), f"loads (step {step})")
    except DamagedFile as exc:
        yield _failed(exc)
    if state is not None and man is None and man_ok:
        if state.get("format", 1) >= 2:
            yield Finding(False, str(ckpt / "MANIFEST.json"), "it is missing (state.pt was "
                          f"written with one); fix: {checkpoint.fix_for(ckpt)}")  # fmt: skip
        else:
            yield Finding(None, str(ckpt), "written before manifests: files not checksummed")
    if state is not None:
        yield _check_agent(ckpt, state, man)
    if (ckpt / checkpoint.BUFFER).exists() or (man and checkpoint.BUFFER in man["files"]):
        yield from _check_buffer(ckpt / checkpoint.BUFFER, buffers)


def _failed(exc: DamagedFile) -> Finding:
    return Finding(False, str(exc.file), f"{exc.what}; fix: {exc.fix}")


def _check_agent(ckpt: Path, state: dict[str, Any], man: dict[str, Any] | None) -> Finding:
    """The settings against the env now, then the agent into a new one of its config."""
    from rlstash.train import algos, builders
    from rlstash.train.config import TrainConfig

    item = f"{ckpt / checkpoint.STATE} agent"
    try:
        cfg = TrainConfig(**state["config"])
        info = builders.probe_env(cfg.env, cfg.history)
    except (ValueError, TypeError) as exc:
        return Finding(None, item, f"not checked: {exc}")
    spaces = {k: checkpoint.describe_space(s) for k, s in
              (("obs_space", info.obs_space), ("action_space", info.act_space))}  # fmt: skip
    recorded = (man or {}).get("settings") or state.get("settings") or {}
    try:
        checkpoint.check_settings(ckpt, recorded, spaces, f"the env {cfg.env} now has",
                                  "make the env as it was when the run was trained")  # fmt: skip
        cfg, agent_cfg = algos.resolve(cfg, info.act_space)
        agent = builders.make_agent(cfg, agent_cfg, info, torch.device("cpu"))
        with checkpoint.reading(ckpt / checkpoint.STATE):
            agent.load_state_dict(state["agent"])
    except DamagedFile as exc:
        return _failed(exc)
    except ValueError as exc:
        return Finding(False, item, str(exc))
    arch = cfg.agent.get("net_arch")
    return Finding(True, item, f"loads into a new {cfg.algo} agent (net_arch {list(arch or [])}, "
                   f"{spaces['obs_space']} -> {spaces['action_space']})")  # fmt: skip


def _check_buffer(file: Path, buffers: _Buffers) -> Iterator[Finding]:
    from rlstash.storage.disk import inspect
    from rlstash.storage.state_paths import resolve, stream_dirs
    from rlstash.storage.stream_commit import inspect_stream

    try:
        with checkpoint.reading(file):
            raw = manifest.load_torch(file)
            storage = resolve(raw["storage"], file)
        yield Finding(True, str(file), f"loads ({storage.get('kind')})")
    except DamagedFile as exc:
        yield _failed(exc)
        return
    maps: dict[str, dict[str, np.ndarray]] = {}
    for path in _disk_paths(storage):
        try:
            meta, _, maps[path] = inspect(path)
        except ValueError as exc:
            yield Finding(False, path, f"{exc}")
            return
        yield Finding(True, path, f"meta.json, commit.rec and {len(meta['spec'])} data files "
                      f"of the expected sizes ({meta['capacity']:,} rows)")  # fmt: skip
    for path in stream_dirs(storage):  # what reopening the stream reads beside its rows
        try:
            yield Finding(True, path, inspect_stream(Path(path)))
        except ValueError as exc:
            yield Finding(False, path, f"{exc}")
            return
    yield from _scan_rows(file, raw, storage, maps, buffers)


def _disk_paths(state: Any) -> list[str]:
    if not isinstance(state, Mapping):
        return []
    if state.get("kind") == "MemmapStorage":
        return [state["path"]]
    return [p for v in state.values() for p in _disk_paths(v)]


# ---------------------------------------------------------------------------- rows
def _rows(state: Mapping[str, Any], maps: dict[str, dict[str, np.ndarray]]) -> tuple[str, Any, Any]:
    """(source key, {field: array or tensor [capacity, ...]}, spec dict) of a storage state."""
    kind = state.get("kind")
    if kind == "StreamStorage":
        return _rows(state["backing"], maps)
    if kind == "TieredStorage":  # every row is in the cold tier once saved
        return _rows(state["cold"], maps)
    if kind == "FrameBacking":  # compressed frames are uint8: the other fields are plain
        return _rows(state["plain"], maps)
    if kind == "MemmapStorage":
        return state["path"], maps[state["path"]], state["spec"]
    return "", state.get("data", {}), state.get("spec", {})


def _written(raw: Mapping[str, Any], capacity: int) -> np.ndarray:
    """bool[capacity]: the slots holding data (a stream's flags; a ring's first ``size`` rows)."""
    from rlstash.storage.lanes import WRITTEN

    lanes = raw["storage"].get("lanes") if isinstance(raw["storage"], Mapping) else None
    if lanes is not None and "flags" in lanes:
        return (np.asarray(lanes["flags"]).reshape(-1)[:capacity] & WRITTEN) != 0
    mask = np.zeros(capacity, bool)
    mask[: int((raw.get("writer") or {}).get("size", capacity))] = True
    return mask


def _scan_rows(
    file: Path, raw: Any, storage: Any, maps: Any, buffers: _Buffers
) -> Iterator[Finding]:
    from rlstash.spec import Spec

    source, arrays, spec_dict = _rows(storage, maps)
    key = source or str(file)
    if key in buffers.seen:
        return
    buffers.seen.add(key)
    spec = Spec.from_dict(spec_dict)
    floats = [k for k, f in spec.items() if f.dtype.is_floating_point and k in arrays]
    bools = [k for k, f in spec.items() if f.dtype == torch.bool and k in arrays]
    capacity = int(next(iter(arrays.values())).shape[0]) if arrays else 0
    written = _written(raw, capacity)
    row_bytes = max(1, sum(spec[k].row_bytes for k in floats + bools))
    step = max(1, _CHUNK_BYTES // row_bytes)
    bad: dict[str, list[int]] = {k: [] for k in floats + bools}
    counts = dict.fromkeys(floats + bools, 0)
    for lo in range(0, capacity, step):
        hi = min(capacity, lo + step)
        sel = written[lo:hi]
        if not sel.any():
            continue
        for k in floats + bools:
            ok = _finite_rows if k in floats else _bool_rows
            rows = ok(arrays[k][lo:hi], spec[k].dtype)
            slots = np.flatnonzero(sel & ~rows) + lo
            counts[k] += slots.size
            bad[k] += slots[: _SHOW - len(bad[k])].tolist()
    item = f"buffer rows ({key})"
    n = int(written.sum())
    failed = [k for k in floats + bools if counts[k]]
    if not failed:
        yield Finding(True, item, f"{n:,} written slots, float fields {floats} all finite"
                      + (f", bool fields {bools} all 0 or 1" if bools else ""))  # fmt: skip
    for k in failed:
        where = (f"{counts[k]:,} of {n:,} written slots hold {{}} (slots {bad[k]}"
                 f"{' ...' if counts[k] > len(bad[k]) else ''})")  # fmt: skip
        if k in bools:
            yield Finding(False, item, f"field {k!r}: " + where.format("bytes other than 0 and 1")
                          + "; fix: no writer stores them, so the file was damaged since: "
                          f"restore {key} from a copy")  # fmt: skip
            continue
        yield Finding(False, item, f"field {k!r}: " + where.format("NaN or inf") + "; fix: "
                      "they were stored so (an env or a wrapper produced them): training samples "
                      "them, so start a new buffer after fixing their source")  # fmt: skip


def _bool_rows(chunk: Any, dtype: torch.dtype) -> np.ndarray:
    """bool[rows]: rows of a bool field's ``chunk`` whose bytes are all 0 or 1 (read as
    bytes: a damaged byte, e.g. 0xFE, is neither)."""
    if isinstance(chunk, torch.Tensor):
        chunk = chunk.cpu().numpy()
    b = np.asarray(chunk).view(np.uint8)
    return (b.reshape(b.shape[0], -1) <= 1).all(1)


def _finite_rows(chunk: Any, dtype: torch.dtype) -> np.ndarray:
    """bool[rows]: rows of ``chunk`` (a tensor, or a numpy map of the field) that are finite."""
    t = chunk if isinstance(chunk, torch.Tensor) else torch.from_numpy(np.array(chunk))
    if t.dtype != dtype:
        t = t.view(dtype)  # bfloat16 is stored as int16 bit patterns on disk
    return torch.isfinite(t.reshape(t.shape[0], -1)).all(1).numpy()


# ---------------------------------------------------------------------------- command
def cmd_verify(args: argparse.Namespace) -> int:
    run_dir = Path(args.run)
    found = verify_run(run_dir)
    for f in found:
        print(f.line(), flush=True)
    failed = [f for f in found if f.ok is False]
    checked = sum(f.ok is not None for f in found)
    if failed:
        items = ", ".join(dict.fromkeys(f.item for f in failed))
        print(f"{run_dir}: {len(failed)} of {checked} checks failed: {items}")
        return 1
    print(f"{run_dir}: all {checked} checks passed")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    v = sub.add_parser(
        "verify",
        help="check a run: checkpoint checksums, that every file loads, the buffer's files and rows",
        **describe(
            "Check a whole run directory and print what was found, a line a check: each\n"
            "checkpoint's MANIFEST.json sizes and SHA-256 sums, that the agent and the buffer\n"
            "load, and the disk buffer's files and rows. Nothing is written.",
            "rlstash verify runs/dqn-CartPole-v1-s0",
            "getting-started/#reading-the-run-directory",
        ),
    )
    v.add_argument("run", help="run directory (runs/<name>)")
    v.set_defaults(func=cmd_verify)
