"""Run logs: CSV always, TensorBoard when installed, other loggers (W&B), a progress bar or
plain lines, a plot.

Everything goes to ``runs/<name>/``: ``progress.csv`` (one row per log call, columns fixed by
the first row plus any later keys appended), ``eval.csv``, ``tb/`` (TensorBoard) and
``learning_curve.png`` at the end.
"""

from __future__ import annotations

import csv
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlstash.train import tracking
from rlstash.train.tracking import CsvLog

__all__ = ["CsvLog", "RunLog", "plot_learning_curve", "progress_line", "run_length"]


class RunLog:
    """The run's loggers (:mod:`rlstash.train.tracking`: CSV always, TensorBoard when
    installed, then ``loggers``, e.g. W&B) + a progress display (tqdm bar, or plain lines when
    quiet)."""

    def __init__(
        self,
        run_dir: Path,
        total_steps: int,
        quiet: bool = False,
        start_step: int = 0,
        loggers: Sequence[Any] = (),
    ) -> None:
        self.run_dir = run_dir
        self.csv = tracking.CsvLogger(run_dir, start_step)
        self.progress, self.evals = self.csv.progress, self.csv.evals
        tb = tracking.tensorboard_logger(run_dir / "tb", start_step)
        self.loggers: list[Any] = [self.csv, *([tb] if tb is not None else []), *loggers]
        self.quiet = quiet
        self.total = total_steps
        self._bar = None if quiet else _tqdm(total_steps, start_step)
        self._last_line = 0.0
        self._t0 = time.monotonic()
        self._step0 = start_step
        self._compile_seen: float | None = 0.0  # None once said

    def note_compile(self, seconds: float, final: bool = False) -> None:
        """Say once how long compiling the agent's update took (``compile``): at the first
        call that finds ``seconds`` > 0 and no longer growing (every step compiled; TD3's actor
        step and PPO's last minibatch size compile a little later), or at the ``final`` call."""
        if self._compile_seen is None or seconds <= 0:
            return
        if final or seconds == self._compile_seen:
            self.info(f"compiled the update in {seconds:.1f} s (part of the training time)")
            self._compile_seen = None
        else:
            self._compile_seen = seconds

    def info(self, text: str) -> None:
        if self._bar is not None:
            self._bar.write(text)
        else:
            print(text, flush=True)

    def log(self, step: int, row: dict[str, Any]) -> None:
        for logger in self.loggers:
            logger.log(step, row, "progress")
        self._show(step, row)

    def log_eval(self, step: int, row: dict[str, Any]) -> None:
        for logger in self.loggers:
            logger.log(step, row, "eval")
        self.info(
            f"[eval] step {step}: return {row['return_mean']:.1f} +- {row['return_std']:.1f} "
            f"over {row['episodes']} episodes"
        )

    def log_config(self, config: dict[str, Any]) -> None:
        """The run's resolved settings, to every logger."""
        for logger in self.loggers:
            logger.log_config(config)

    def log_video(self, step: int, path: Path) -> None:
        """An evaluation video written at ``path``, to every logger."""
        for logger in self.loggers:
            logger.log_video(step, path)

    def _show(self, step: int, row: dict[str, Any]) -> None:
        sps = (step - self._step0) / max(time.monotonic() - self._t0, 1e-9)
        ret = row.get("return_recent", float("nan"))
        if self._bar is not None:
            self._bar.n = step
            self._bar.set_postfix_str(f"return {ret:.1f}, {sps:.0f} steps/s", refresh=False)
            self._bar.refresh()
        elif time.monotonic() - self._last_line > 5.0:
            self._last_line = time.monotonic()
            print(progress_line(step, self.total, sps, ret), flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        loggers, self.loggers = self.loggers, []
        for logger in loggers:  # each is closed, also when one before it fails
            try:
                logger.close()
            except Exception as exc:  # noqa: BLE001
                self.info(f"closing the {type(logger).__name__} failed: {exc}")


def run_length(steps: int, start: int, chunk: int) -> int:
    """The env step a loop stops at that starts at ``start``, advances ``chunk`` steps per
    iteration (a collection, a PPO rollout) and runs while below ``steps``: ``steps`` rounded up
    to whole chunks (PPO at 1024 envs x 32 steps with ``steps=100000``: 131072). The progress
    display's total, so that it never shows a step past it."""
    if start >= steps:
        return start
    return start + -(-(steps - start) // chunk) * chunk


def progress_line(step: int, total: int, steps_per_s: float, ret: float) -> str:
    """The plain (``--quiet``) progress line, ``step 4096/131072  812 steps/s  return 21.3  eta
    156s``: the step never past the total shown (``total``: :func:`run_length`), the eta
    never negative ('?' before a rate is known)."""
    total = max(total, step)
    eta = f"{(total - step) / steps_per_s:.0f}s" if steps_per_s > 0 else "?"
    return f"step {step}/{total}  {steps_per_s:.0f} steps/s  return {ret:.1f}  eta {eta}"


def _tqdm(total: int, initial: int) -> Any:
    if not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True)


def plot_learning_curve(run_dir: Path, threshold: float | None = None) -> Path | None:
    """Write ``learning_curve.png`` from ``eval.csv``; None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    path = run_dir / "eval.csv"
    if not path.exists():
        return None
    with path.open() as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return None
    steps = [int(r["step"]) for r in rows]
    mean = [float(r["return_mean"]) for r in rows]
    std = [float(r["return_std"]) for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, mean, label="evaluation return (mean)")
    ax.fill_between(
        steps, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)], alpha=0.25
    )
    if threshold is not None:
        ax.axhline(threshold, color="gray", linestyle="--", label=f"threshold {threshold:g}")
    ax.set_xlabel("env steps")
    ax.set_ylabel("return")
    ax.set_title(run_dir.name)
    ax.legend(loc="lower right")
    fig.tight_layout()
    out = run_dir / "learning_curve.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
