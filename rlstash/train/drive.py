"""The loop skeleton every run shares (:func:`drive`): timing, progress rows, evaluation, the
stopping rule and checkpoints around the run's own step (collect, learn, advance: the
``iterate`` of its :class:`~rlstash.train.run.Learning`). The run stops after ``steps`` env
steps, or earlier once the evaluation return has stayed at or above ``threshold`` for
``patience`` evaluations in a row; evaluation and checkpoint time are excluded from
``train_seconds``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlstash.agents.base import read_metrics
from rlstash.diag import telemetry
from rlstash.train.runlog import RunLog, plot_learning_curve


@dataclass
class TrainResult:
    """Where a run's results are, and how it ended."""

    run_dir: Path
    steps: int
    train_seconds: float
    solved: bool
    last_eval: float
    checkpoint: Path | None
    plot: Path | None


def drive(
    run: Any,
    log: RunLog,
    iterate: Callable[[dict[str, Any]], dict[str, Any]],
    save: Callable[[], Path],
) -> TrainResult:
    """The loop skeleton both loops share: ``iterate(metrics)`` collects, learns and advances
    ``run.step`` (returning the latest update's metrics); around it, timing
    (``train_seconds``), progress rows, evaluation, the stopping rule and checkpoints
    (``save()``, also on Ctrl-C), then the final checkpoint, plot and verdict. The agent's
    losses are checked finite when progress is logged, and its state before every save
    (:meth:`~rlstash.agents.base.AgentBase.check_finite`): a checkpoint never holds NaN."""
    cfg, agent = run.cfg, run.agent

    def finite_save() -> Path:
        agent.check_finite(metrics, params=True)
        return save()

    next_eval = (run.step // cfg.eval_every + 1) * cfg.eval_every
    next_ckpt = (run.step // cfg.checkpoint_every + 1) * cfg.checkpoint_every
    metrics: dict[str, Any] = {}
    last_log = 0.0
    solved = _solved(run)
    try:
        while run.step < cfg.steps and not solved:
            t0 = time.perf_counter()
            metrics = iterate(metrics)
            run.train_seconds += time.perf_counter() - t0
            if time.monotonic() - last_log > 1.0:  # device metrics are read only here
                last_log = time.monotonic()
                log.log(run.step, _progress_row(run, metrics))
                agent.check_finite(metrics)  # the loss flag: read once per progress row
                log.note_compile(agent.compile_seconds)
            if run.step >= next_eval:
                next_eval += cfg.eval_every * math.ceil((run.step - next_eval + 1) / cfg.eval_every)
                _evaluate(run, log)
                solved = _solved(run)
            if run.step >= next_ckpt:
                next_ckpt += cfg.checkpoint_every
                finite_save()
    except KeyboardInterrupt:
        log.info(f"interrupted at step {run.step}; writing a checkpoint")
        finite_save()
        raise
    ckpt = finite_save()
    log.note_compile(agent.compile_seconds, final=True)
    plot = plot_learning_curve(run.run_dir, run.threshold)
    last = run.evals[-1]["return_mean"] if run.evals else float("nan")
    verdict = "solved" if solved else "stopped"
    log.info(
        f"{verdict} at step {run.step} after {run.train_seconds:.1f} s of training (last evaluation {last:.1f})"
    )
    log.info(f"checkpoint: {ckpt}")
    if plot is not None:
        log.info(f"learning curve: {plot}")
    return TrainResult(run.run_dir, run.step, run.train_seconds, solved, last, ckpt, plot)


def _progress_row(run: Any, metrics: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {
        "train_seconds": run.train_seconds,
        "return_recent": run.collector.stats.mean_return(),
        "episodes": run.collector.stats.count,
        "updates": run.agent.updates,
    }
    row.update(read_metrics(metrics))  # the update's device scalars: read only when logging
    return row


def _evaluate(run: Any, log: RunLog) -> None:
    cfg = run.cfg
    videos = len(run.recorder.written) if run.recorder is not None else 0
    if run.recorder is not None:  # --video: the first episode of eval env 0
        run.recorder.request(f"step-{run.step:09d}")
    try:
        out = run.eval_collector.rollout(
            run.agent,
            episodes=cfg.eval_episodes,
            deterministic=True,
            seed=cfg.seed + 10_000 + len(run.evals),
        )
    finally:
        if run.recorder is not None:
            run.recorder.cancel()
    returns = out["returns"]
    row = {
        "train_seconds": run.train_seconds,
        "return_mean": float(np.mean(returns)),
        "return_std": float(np.std(returns)),
        "return_min": float(np.min(returns)),
        "length_mean": float(np.mean(out["lengths"])),
        "episodes": int(len(returns)),
        **telemetry.snapshot(run.run_dir, run.device),
    }
    run.evals.append({"step": run.step, **row})
    log.log_eval(run.step, row)
    for path in run.recorder.written[videos:] if run.recorder is not None else ():
        log.log_video(run.step, path)


def _solved(run: Any) -> bool:
    k = run.cfg.patience
    if run.threshold is None or len(run.evals) < k:
        return False
    return all(e["return_mean"] >= run.threshold for e in run.evals[-k:])
