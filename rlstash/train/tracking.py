"""Where a run's scalars go: one :class:`Logger` protocol, a CSV, a TensorBoard and a Weights &
Biases implementation of it.

::

    from rlstash.train.tracking import wandb_logger
    run_dir = Path(cfg.run_dir) / cfg.run_name
    train(cfg, loggers=[wandb_logger(run_dir, project="cartpole")])  # besides CSV/TensorBoard
    train(cfg, loggers=[MyLogger()])     # any object with log, log_config, log_video, close

:class:`~rlstash.train.runlog.RunLog` hands every progress row, evaluation row, video and the
resolved config to each of its loggers in turn. ``progress.csv`` and ``eval.csv``
(:class:`CsvLogger`) are always written and their errors (a full disk) stop the run; every other
logger is optional. A remote tracker runs behind :class:`Background`: a worker thread with a
bounded queue, so that a slow, hung or failing backend costs the training loop one
``put_nowait`` per row; it degrades to one warning (rows dropped, the tracker switched off),
never to a stalled or crashed run.

The names are the CSVs' names: a progress row's keys as they are (``step``, ``return_recent``,
the agent's losses), an evaluation row's under ``eval/`` (``eval/return_mean``, the memory
telemetry ``eval/rss_tree_mb`` ...), videos as ``eval/video``. ``rlstash train --track wandb``
makes a :func:`wandb_logger`; the W&B run id is kept in ``<run_dir>/wandb-run.json``, so that a
resumed run (``--resume``) continues the same W&B run.
"""

from __future__ import annotations

import csv
import io
import json
import math
import queue
import threading
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from rlstash.atomic import write_atomic

TRACKERS = ("", "wandb")
"""``track`` values: none besides the CSVs and TensorBoard, or Weights & Biases."""
WANDB_HINT = "pip install 'rlstash[wandb]'"
ID_FILE = "wandb-run.json"
"""The W&B run of a run directory (its id, project and entity), read back on resume."""


@runtime_checkable
class Logger(Protocol):
    """What receives a run's scalars (module docstring); ``kind`` is ``"progress"`` (a row of
    ``progress.csv``) or ``"eval"`` (a row of ``eval.csv``)."""

    def log(self, step: int, row: Mapping[str, Any], kind: str) -> None:
        """Record one row of scalars at env step ``step``."""

    def log_config(self, config: Mapping[str, Any]) -> None:
        """Record the run's resolved settings (once, before the first row)."""

    def log_video(self, step: int, path: Path) -> None:
        """Record an evaluation video written at ``path``."""

    def close(self) -> None:
        """Flush and release what the logger holds."""


class CsvLogger:
    """``progress.csv`` and ``eval.csv`` of a run directory (kept up to ``start_step`` on
    resume; :class:`CsvLog`)."""

    def __init__(self, run_dir: Path, start_step: int = 0) -> None:
        self.progress = CsvLog(run_dir / "progress.csv", start_step)
        self.evals = CsvLog(run_dir / "eval.csv", start_step)

    def log(self, step: int, row: Mapping[str, Any], kind: str) -> None:
        (self.evals if kind == "eval" else self.progress).write({"step": step, **row})

    def log_config(self, config: Mapping[str, Any]) -> None:
        """The config is in the checkpoint's manifest already: nothing to write."""

    def log_video(self, step: int, path: Path) -> None:
        """Videos are files of the run directory already: nothing to write."""

    def close(self) -> None:
        """Each row is appended and closed as it comes: nothing to flush."""


class TensorBoardLogger:
    """Event files under ``path`` (``<run>/tb``); a resumed run hides the events logged after
    its checkpoint (``purge_step``). :func:`tensorboard_logger` makes one when installed."""

    def __init__(self, writer: Any) -> None:
        self.writer = writer

    def log(self, step: int, row: Mapping[str, Any], kind: str) -> None:
        prefix = "eval/" if kind == "eval" else ""
        for k, v in _scalars(row).items():
            self.writer.add_scalar(prefix + k, v, step)

    def log_config(self, config: Mapping[str, Any]) -> None:
        self.writer.add_text("config", f"```\n{json.dumps(config, indent=1, default=str)}\n```")

    def log_video(self, step: int, path: Path) -> None:
        """TensorBoard video summaries need moviepy: the MP4 stays a file of the run."""

    def close(self) -> None:
        self.writer.close()


def tensorboard_logger(path: Path, start_step: int = 0) -> TensorBoardLogger | None:
    """A :class:`TensorBoardLogger` writing to ``path``, or None when TensorBoard is missing."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except (ImportError, ModuleNotFoundError):
        return None
    return TensorBoardLogger(SummaryWriter(str(path), purge_step=start_step or None))


def _scalars(row: Mapping[str, Any]) -> dict[str, float]:
    return {
        k: v
        for k, v in row.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }


class CsvLog:
    """Append-only CSV whose header grows when new keys appear (rewritten once then).

    An existing file is kept (resume) up to ``until_step``: rows of later steps were logged
    after the checkpoint the run resumes from, and are logged again, so they are dropped.
    """

    def __init__(self, path: Path, until_step: int = 0) -> None:
        self.path = path
        self.keys: list[str] = []
        if path.exists():
            with path.open() as f:
                self.keys = next(csv.reader(f), [])
            rows = self._read() if self.keys else []
            keep = [r for r in rows if _step(r) <= until_step]
            if len(keep) != len(rows):
                write_atomic(path, lambda f: self._dump(f, keep))

    def _dump(self, f: Any, rows: list[dict[str, str]]) -> None:
        text = io.StringIO(newline="")
        w = csv.DictWriter(text, self.keys)
        w.writeheader()
        w.writerows(rows)
        f.write(text.getvalue().encode())

    def write(self, row: dict[str, Any]) -> None:
        new = [k for k in row if k not in self.keys]
        if new:
            old_rows = self._read() if self.keys else []
            self.keys += new
            with self.path.open("w", newline="") as f:
                w = csv.DictWriter(f, self.keys)
                w.writeheader()
                w.writerows(old_rows)
        with self.path.open("a", newline="") as f:
            csv.DictWriter(f, self.keys).writerow({k: _fmt(v) for k, v in row.items()})

    def _read(self) -> list[dict[str, str]]:
        with self.path.open() as f:
            return list(csv.DictReader(f))


def _step(row: dict[str, str]) -> float:
    try:
        return float(row.get("step") or "nan")
    except ValueError:
        return math.inf  # unreadable: dropped with the rows past the checkpoint


def _fmt(v: Any) -> Any:
    return f"{v:.6g}" if isinstance(v, float) else v


# ---------------------------------------------------------------------------------- W&B
def import_wandb() -> Any:
    """The ``wandb`` module, or a ValueError naming the install command."""
    try:
        import wandb
    except ImportError:
        raise ValueError(
            f"track: wandb is not installed; install it with: {WANDB_HINT} (or drop --track)"
        ) from None
    return wandb


class WandbLogger:
    """A Weights & Biases run (``wandb.init`` when made; make it through :func:`wandb_logger`,
    which runs it in the background). ``run_id`` continues that W&B run (``resume="allow"``);
    ``mode`` ("online", "offline", "disabled") defaults to ``WANDB_MODE``."""

    def __init__(
        self,
        run_dir: Path,
        project: str = "rlstash",
        entity: str = "",
        tags: tuple[str, ...] = (),
        run_id: str = "",
        mode: str | None = None,
    ) -> None:
        wandb = import_wandb()
        self._wandb = wandb
        self.run = wandb.init(
            project=project or None,
            entity=entity or None,
            tags=list(tags) or None,
            name=run_dir.name,
            id=run_id or None,
            resume="allow" if run_id else None,
            dir=str(run_dir),
            mode=mode,
            reinit="create_new",
            settings=wandb.Settings(console="off", x_disable_stats=True),
        )
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")

    def log(self, step: int, row: Mapping[str, Any], kind: str) -> None:
        prefix = "eval/" if kind == "eval" else ""
        self.run.log({"step": step, **{prefix + k: v for k, v in _scalars(row).items()}})

    def log_config(self, config: Mapping[str, Any]) -> None:
        self.run.config.update(dict(config), allow_val_change=True)

    def log_video(self, step: int, path: Path) -> None:
        self.run.log({"step": step, "eval/video": self._wandb.Video(str(path), format="mp4")})

    def close(self) -> None:
        self.run.finish()


def wandb_logger(
    run_dir: Path,
    project: str = "rlstash",
    entity: str = "",
    tags: tuple[str, ...] = (),
    mode: str | None = None,
) -> Background:
    """A :class:`WandbLogger` for ``run_dir`` behind :class:`Background`. The W&B run id is read
    from ``<run_dir>/wandb-run.json`` (a resumed run continues its W&B run) or made and written
    there first; ``wandb`` must be installed (else a ValueError naming the install command)."""
    import_wandb()
    run_dir = Path(run_dir)
    id_file = run_dir / ID_FILE
    run_id = ""
    if id_file.exists():
        try:
            run_id = str(json.loads(id_file.read_text())["id"])
        except (OSError, ValueError, KeyError, TypeError):
            warnings.warn(
                f"track: {id_file} is unreadable; this run logs to a new W&B run",
                RuntimeWarning,
                stacklevel=2,
            )
    if not run_id:
        run_id = new_run_id()
        record = {"id": run_id, "project": project, "entity": entity}
        write_atomic(id_file, json.dumps(record).encode())

    def make() -> WandbLogger:
        return WandbLogger(run_dir, project, entity, tags, run_id, mode)

    return Background(make, "W&B")


def new_run_id() -> str:
    """A W&B run id: 8 random lowercase letters and digits (as W&B makes them)."""
    import secrets
    import string

    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))


def read_run_id(run_dir: Path) -> str | None:
    """The W&B run id recorded in ``run_dir`` (None when the run was not tracked)."""
    try:
        return str(json.loads((Path(run_dir) / ID_FILE).read_text())["id"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


# ------------------------------------------------------------------------- in the background
CLOSE_TIMEOUT = 30.0
"""Seconds :meth:`Background.close` waits for a backend to send what is queued and finish."""


class Background:
    """A :class:`Logger` that runs another one (made by ``make()``, in the worker thread, so a
    slow ``wandb.init`` does not hold up the start either) on a daemon thread behind a queue of
    ``maxsize`` calls. The training loop only enqueues: when the queue is full the call is
    dropped; when the backend raises it is switched off. Either is said once, as a
    RuntimeWarning naming the backend, and the CSVs stay complete. :meth:`close` waits up to
    :data:`CLOSE_TIMEOUT` seconds, then leaves a hung backend behind (a daemon thread)."""

    def __init__(
        self,
        make: Callable[[], Logger],
        name: str,
        maxsize: int = 10_000,
        close_timeout: float | None = None,
    ) -> None:
        self.name = name
        self.close_timeout = CLOSE_TIMEOUT if close_timeout is None else close_timeout
        self.warning: str | None = None  # the one warning given, if any
        self._make = make
        self._queue: queue.Queue[tuple[str, Callable[[Logger], None]] | None] = queue.Queue(maxsize)
        self._off = threading.Event()
        self._thread = threading.Thread(target=self._work, name=f"rlstash-{name}", daemon=True)
        self._thread.start()

    def log(self, step: int, row: Mapping[str, Any], kind: str) -> None:
        row = dict(row)
        self._put("log", lambda inner: inner.log(step, row, kind))

    def log_config(self, config: Mapping[str, Any]) -> None:
        config = dict(config)
        self._put("log_config", lambda inner: inner.log_config(config))

    def log_video(self, step: int, path: Path) -> None:
        self._put("log_video", lambda inner: inner.log_video(step, path))

    def _put(self, method: str, call: Callable[[Logger], None]) -> None:
        """Queue ``call(backend)`` (``method`` names it in a warning), or drop it when off."""
        if self._off.is_set():
            return
        try:
            self._queue.put_nowait((method, call))
        except queue.Full:
            self._warn(
                f"it falls behind ({self._queue.maxsize} calls queued); rows from here on are "
                "dropped there"
            )

    def _warn(self, why: str) -> None:
        if self.warning is None:
            self.warning = (
                f"{self.name} logging stopped: {why}; training goes on, progress.csv and "
                "eval.csv stay complete"
            )
            warnings.warn(self.warning, RuntimeWarning, stacklevel=3)
        self._off.set()

    def _work(self) -> None:
        try:
            inner = self._make()
        except BaseException as exc:  # noqa: BLE001 - any backend failure: one warning
            self._warn(f"starting it failed ({_why(exc)})")
            return
        while True:
            item = self._queue.get()
            if item is None or self._off.is_set():
                break
            method, call = item
            try:
                call(inner)
            except BaseException as exc:  # noqa: BLE001
                self._warn(f"{method} failed ({_why(exc)})")
                break
        try:
            inner.close()
        except BaseException as exc:  # noqa: BLE001
            self._warn(f"closing it failed ({_why(exc)})")

    def close(self) -> None:
        """Send what is queued, finish the backend (at most :attr:`close_timeout` seconds)."""
        try:
            self._queue.put_nowait(None)
        except queue.Full:  # behind: it stops after the call it is making
            self._off.set()
        self._thread.join(self.close_timeout)
        if self._thread.is_alive():
            self._warn(
                f"it did not finish within {self.close_timeout:g} s; what it had not sent is "
                "missing there"
            )

    @property
    def alive(self) -> bool:
        """Whether the worker thread still runs."""
        return self._thread.is_alive()


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:300]


def from_config(cfg: Any, run_dir: Path) -> list[Logger]:
    """The loggers a TrainConfig asks for besides the CSVs and TensorBoard (``track``)."""
    if cfg.track == "wandb":
        return [wandb_logger(run_dir, cfg.wandb_project, cfg.wandb_entity, cfg.wandb_tags)]
    return []
