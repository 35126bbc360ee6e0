"""The training loop: collect -> extend -> sample -> update -> evaluate -> checkpoint.

::

    result = train(TrainConfig(algo="dqn", env="CartPole-v1"))   # what `rlstash train` runs
    result = train(resume="runs/dqn-CartPole-v1-s0")             # continue from a checkpoint

What the loop runs (envs, store, agent, collectors) is built by
:func:`rlstash.train.builders.build_run`, top to bottom, before the first step; the loop is
:func:`rlstash.train.drive.drive` around the step of the run's
:class:`~rlstash.train.run.Learning`. Off-policy (store "replay"): how often the learner
samples relative to what is inserted is one :class:`RateLimiter` (``min_size =
learning_starts``, ``samples_per_insert = gradient_steps * batch_size / train_freq``), not
scattered checks; on-policy (store "rollout", :mod:`rlstash.train.onpolicy`): collection and
updates alternate.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from rlstash.finite import NonFiniteError
from rlstash.train import checkpoint, ray_run, rundir, tracking
from rlstash.train.builders import build_run
from rlstash.train.config import TrainConfig
from rlstash.train.drive import TrainResult, _progress_row, drive
from rlstash.train.run import Run
from rlstash.train.runlog import RunLog, run_length
from rlstash.train.tracking import Logger

__all__ = ["TrainConfig", "TrainResult", "train"]
_ = _progress_row  # re-exported (tests read progress rows through rlstash.train.loop)


def train(
    cfg: TrainConfig | None = None,
    resume: str | Path | None = None,
    loggers: Sequence[Logger] = (),
) -> TrainResult:
    """Run (or resume) training; returns where the results are. The run directory is held by
    this call alone (:func:`rlstash.train.rundir.hold`); a checkpoint is checked before it is
    used, and ``cfg`` given with ``resume`` must match the run's settings. ``loggers``
    (:class:`~rlstash.train.tracking.Logger`) get every row besides the CSVs and TensorBoard,
    and those ``cfg.track`` asks for (``wandb``); the run closes them when it ends."""
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
        if cfg.track:
            tracking.import_wandb()  # refused before anything is built
        run = build_run(cfg, run_dir, state)  # refuses bad settings before writing anything
        held.keep = True
        total = run_length(run.cfg.steps, run.step, run.frames_per_collect)  # whole collections
        try:
            tracked = [*tracking.from_config(run.cfg, run_dir), *loggers]
            log = RunLog(run_dir, total, quiet=run.cfg.quiet, start_step=run.step, loggers=tracked)
        except BaseException:
            run.close()
            raise
        try:
            log.log_config(dataclasses.asdict(run.cfg))
            return run_loop(run, log)
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


def run_loop(run: Run, log: RunLog) -> TrainResult:
    """The run's loop: :func:`~rlstash.train.drive.drive` around its learning's step."""
    log.info(f"run directory: {run.run_dir}")
    log.info(run.describe())
    if run.env_note:
        log.info(run.env_note)
    if run.step:
        log.info(run.learning.resumed(run))
    return drive(run, log, run.learning.iterate(run), lambda: run.learning.save(run))
