"""The training loop: collect -> extend -> sample -> update -> evaluate -> checkpoint.

::

    result = train(TrainConfig(algo="dqn", env="CartPole-v1"))   # what `rlstash train` runs
    result = train(resume="runs/dqn-CartPole-v1-s0")             # continue from a checkpoint

How often the learner samples relative to what is inserted is one :class:`RateLimiter`
(``min_size = learning_starts``, ``samples_per_insert = gradient_steps * batch_size /
train_freq``), not scattered checks. The run stops after ``steps`` env steps, or earlier
once the evaluation return has stayed at or above ``threshold`` for ``patience``
evaluations in a row. Evaluation and checkpoint time are excluded from ``train_seconds``.
What the loop runs (envs, buffer, agent, collectors) is built by
:func:`rlstash.train.builders.build_run`, top to bottom, before the first step.
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
from rlstash.finite import NonFiniteError
from rlstash.train import builders, checkpoint, ray_run, rundir
from rlstash.train.builders import Run, build_run
from rlstash.train.config import TrainConfig
from rlstash.train.runlog import RunLog, plot_learning_curve, run_length

__all__ = ["TrainConfig", "TrainResult", "train"]


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


def train(cfg: TrainConfig | None = None, resume: str | Path | None = None) -> TrainResult:
    """Run (or resume) training; returns where the results are. The run directory is held by
    this call alone (:func:`rlstash.train.rundir.hold`); a checkpoint is checked before it is
    used, and ``cfg`` given with ``resume`` must match the run's settings."""
    if resume is not None:
        run_dir = Path(resume)
        if checkpoint.latest(run_dir) is None:
            raise ValueError(
                f"resume: no complete checkpoint in {run_dir}; start a new run instead"
            )
    else:
        cfg = cfg or TrainConfig()
        run_dir = Path(cfg.run_dir) / cfg.run_name
    with rundir.hold(run_dir) as held:  # one trainer per run directory, until it ends
        state = None
        if resume is None and checkpoint.latest(run_dir) is not None:
            if not cfg.ray:
                raise ValueError(
                    f"run_dir: {run_dir} already holds a run; continue it with --resume {run_dir} or pick another --name"
                )
            ray_run.resume_dir(cfg, run_dir)  # a restarted cluster job: the same settings
            resume, cfg = run_dir, None
        if resume is not None:
            ckpt, state, _ = rundir.read_checkpoint(run_dir, cfg)
            if ckpt.name != checkpoint.NAME:
                ckpt.rename(run_dir / checkpoint.NAME)
            cfg = TrainConfig(**state["config"])
        from rlstash.train import onpolicy  # PPO: collect a rollout, update on it (its own loop)

        run = build_run(cfg, run_dir, state)  # refuses bad settings before writing anything
        held.keep = True
        total = run_length(run.cfg.steps, run.step, run.frames_per_collect)  # whole collections
        log = RunLog(run_dir, total, quiet=run.cfg.quiet, start_step=run.step)
        try:
            if isinstance(run, onpolicy.OnPolicyRun):
                return onpolicy.run_loop(run, log)
            return _loop(run, log)
        except NonFiniteError as exc:  # I10: a NaN/inf batch or loss; no checkpoint holds it
            kept = checkpoint.latest(run_dir)
            kept_text = (
                f"the checkpoint {kept} predates it" if kept else "no checkpoint was written"
            )
            raise NonFiniteError(
                f"{exc}; training stopped at step {run.step}, {kept_text}"
            ) from None
        finally:
            log.close()
            run.close()


def _loop(run: Run, log: RunLog) -> TrainResult:
    cfg, agent, rb, limiter = run.cfg, run.agent, run.rb, run.limiter
    log.info(f"run directory: {run.run_dir}")
    log.info(builders.describe_memory(rb, agent))
    if run.step:
        log.info(f"resumed at step {run.step} with {len(rb)} stored slots")

    def iterate(metrics: dict[str, Any]) -> dict[str, Any]:
        batch = run.collector.collect()
        rb.extend(batch)
        limiter.on_insert(run.frames_per_collect)
        run.step += run.frames_per_collect
        updates = agent.updates
        while limiter.can_sample():
            metrics = agent.update(rb.sample(cfg.batch_size))
            limiter.on_sample()
        if cfg.ray and agent.updates != updates:
            ray_run.publish(run)  # the new policy to the actors (one ray.put)
        return metrics

    return drive(run, log, iterate, lambda: checkpoint.save(run.run_dir, run.state(), rb))


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
                log.note_compile(getattr(agent, "compile_seconds", 0.0))
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
    log.note_compile(getattr(agent, "compile_seconds", 0.0), final=True)
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
        "updates": getattr(run.agent, "updates", 0),
    }
    row.update(read_metrics(metrics))  # the update's device scalars: read only when logging
    return row


def _evaluate(run: Any, log: RunLog) -> None:
    cfg = run.cfg
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


def _solved(run: Any) -> bool:
    k = run.cfg.patience
    if run.threshold is None or len(run.evals) < k:
        return False
    return all(e["return_mean"] >= run.threshold for e in run.evals[-k:])
