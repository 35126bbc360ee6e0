"""The training loop: collect -> extend -> sample -> update -> evaluate -> checkpoint.

::

    result = train(TrainConfig(algo="dqn", env="CartPole-v1"))   # what `rlstash train` runs
    result = train(resume="runs/dqn-CartPole-v1-s0")             # continue from a checkpoint

How often the learner samples relative to what is inserted is one :class:`RateLimiter`
(``min_size = learning_starts``, ``samples_per_insert = gradient_steps * batch_size /
train_freq``), not scattered checks. The run stops after ``steps`` env steps, or earlier
once the evaluation return has stayed at or above ``threshold`` for ``patience``
evaluations in a row. Evaluation and checkpoint time are excluded from ``train_seconds``.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlstash.collect.sync import Collector
from rlstash.diag import telemetry
from rlstash.ratelimit import RateLimiter
from rlstash.replay import ReplayBuffer
from rlstash.train import builders, checkpoint
from rlstash.train.runlog import RunLog, plot_learning_curve

DEFAULT_THRESHOLDS = {"Pendulum-v1": -200.0}


@dataclass
class TrainConfig:
    """Settings of a run (agent hyperparameters go in ``agent``; see ``DQNConfig.help()``)."""

    algo: str = "dqn"  # dqn | sac (discrete or continuous, by the env's action space)
    env: str = "CartPole-v1"  # gymnasium env id
    steps: int = 100_000  # env steps at most
    seed: int = 0
    envs: int = 1  # environments collected from in parallel
    workers: int | str = (
        0  # ProcessPoolVectorEnv worker processes (0: in-process, "auto": timed choice)
    )
    storage: str = "ram"  # ram | disk | tiered (hot on --buffer-device, cold on disk)
    device: str = "auto"  # learner device: auto | cpu | cuda[:N]
    buffer_device: str = "cpu"  # where a RAM buffer / the hot tier lives
    run_dir: str = "runs"
    name: str = ""  # default: <algo>-<env>-s<seed>
    eval_every: int = 1000  # env steps between evaluations
    eval_episodes: int = 10
    checkpoint_every: int = 10_000  # env steps between checkpoints (and one at the end)
    threshold: float | None = None  # stop when evaluations stay >= this (default: env's)
    patience: int = 5  # evaluations in a row at or above the threshold
    quiet: bool = False  # plain log lines instead of a progress bar
    torch_threads: int = 1  # small networks are fastest on one thread
    history: int = 0  # > 0: the agent sees windows of the last k observations through an LSTM
    agent: dict[str, Any] = field(default_factory=dict)  # agent config overrides

    def __post_init__(self) -> None:
        for name in (
            "steps",
            "envs",
            "eval_every",
            "eval_episodes",
            "checkpoint_every",
            "patience",
            "torch_threads",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
        if isinstance(self.history, bool) or not isinstance(self.history, int) or self.history < 0:
            raise ValueError(f"history: expected an int >= 0 (0 = off), got {self.history!r}")
        if self.history == 1:
            raise ValueError("history: expected 0 (off) or a window of >= 2 observations, got 1")
        if self.storage not in builders.STORAGES:
            raise ValueError(f"storage: expected one of {builders.STORAGES}, got {self.storage!r}")
        if self.algo not in builders.ALGOS:
            raise ValueError(f"algo: expected one of {builders.ALGOS}, got {self.algo!r}")


@dataclass
class TrainResult:
    run_dir: Path
    steps: int
    train_seconds: float
    solved: bool
    last_eval: float
    checkpoint: Path | None
    plot: Path | None


class _Run:
    """The objects of one run, built (or restored) before the first step."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, state: dict[str, Any] | None) -> None:
        torch.set_num_threads(cfg.torch_threads)
        self.cfg, self.run_dir = cfg, run_dir
        obs_space, act_space, threshold = builders.env_spaces(cfg.env, cfg.history)
        self.threshold = (
            cfg.threshold
            if cfg.threshold is not None
            else DEFAULT_THRESHOLDS.get(cfg.env, threshold)
        )
        self.device = builders.resolve_learner_device(cfg.device)
        self.agent = builders.make_agent(
            cfg.algo, cfg.env, obs_space, act_space, self.device, dict(cfg.agent), cfg.history
        )
        acfg = self.agent.config
        if state is not None:
            self.agent.load_state_dict(state["agent"])
            self.rb = ReplayBuffer.load(run_dir / checkpoint.NAME / "buffer.pt", device=self.device)
        else:
            self.rb = builders.make_buffer(
                builders.step_spec(obs_space, act_space), cfg.envs, acfg.buffer_size, cfg.storage, run_dir,
                builders.resolve_learner_device(cfg.buffer_device), acfg.n_steps, acfg.gamma, cfg.seed, self.device,
                cfg.history,
            )  # fmt: skip
        steps_per_collect = max(1, acfg.train_freq // cfg.envs)
        self.frames_per_collect = steps_per_collect * cfg.envs
        self.limiter = RateLimiter(
            min_size=max(acfg.learning_starts, acfg.batch_size),
            samples_per_insert=acfg.gradient_steps * acfg.batch_size / acfg.train_freq,
            batch_size=acfg.batch_size,
            insert_chunk=self.frames_per_collect,
        )
        self.env = builders.make_vec_env(cfg.env, cfg.envs, cfg.workers, None, cfg.history)
        seed = cfg.seed + (state["step"] if state else 0)
        self.collector = Collector(
            self.env,
            self.agent.act,
            self.frames_per_collect,
            device=self.agent.act_device,
            seed=seed,
        )
        n_eval = min(cfg.eval_episodes, 10)
        self.eval_collector = Collector(
            builders.make_eval_env(cfg.env, n_eval, cfg.history),
            self.agent.act,
            n_eval,
            device=self.agent.act_device,
        )
        self.step = state["step"] if state else 0
        self.train_seconds = state["train_seconds"] if state else 0.0
        self.evals: list[dict[str, Any]] = state["evals"] if state else []
        if state is not None:
            self.limiter.load_state_dict(state["limiter"])

    def close(self) -> None:
        self.env.close()
        self.eval_collector.env.close()
        self.rb.close()

    def state(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "train_seconds": self.train_seconds,
            "config": dataclasses.asdict(self.cfg),
            "agent": self.agent.state_dict(),
            "limiter": self.limiter.state_dict(),
            "evals": self.evals,
        }


def train(cfg: TrainConfig | None = None, resume: str | Path | None = None) -> TrainResult:
    """Run (or resume) training; returns where the results are."""
    state = None
    if resume is not None:
        run_dir = Path(resume)
        ckpt = checkpoint.latest(run_dir)
        if ckpt is None:
            raise ValueError(
                f"resume: no complete checkpoint in {run_dir}; start a new run instead"
            )
        state = checkpoint.load_state(ckpt)
        if ckpt.name != checkpoint.NAME:
            ckpt.rename(run_dir / checkpoint.NAME)
        cfg = TrainConfig(**state["config"])
    else:
        cfg = cfg or TrainConfig()
        run_dir = Path(cfg.run_dir) / (cfg.name or f"{cfg.algo}-{cfg.env}-s{cfg.seed}")
        if checkpoint.latest(run_dir) is not None:
            raise ValueError(
                f"run_dir: {run_dir} already holds a run; continue it with --resume {run_dir} or pick another --name"
            )
    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        run = _Run(cfg, run_dir, state)
    except BaseException:
        if created:  # a refused run leaves nothing behind
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    log = RunLog(run_dir, cfg.steps, quiet=cfg.quiet, start_step=run.step)
    try:
        return _loop(run, log)
    finally:
        log.close()
        run.close()


def _loop(run: _Run, log: RunLog) -> TrainResult:
    cfg, agent, rb, limiter = run.cfg, run.agent, run.rb, run.limiter
    log.info(f"run directory: {run.run_dir}")
    log.info(builders.describe_memory(rb, agent))
    if run.step:
        log.info(f"resumed at step {run.step} with {len(rb)} stored slots")
    next_eval = (run.step // cfg.eval_every + 1) * cfg.eval_every
    next_ckpt = (run.step // cfg.checkpoint_every + 1) * cfg.checkpoint_every
    metrics: dict[str, Any] = {}
    last_log = 0.0
    solved = _solved(run)
    try:
        while run.step < cfg.steps and not solved:
            t0 = time.perf_counter()
            batch = run.collector.collect()
            rb.extend(batch)
            limiter.on_insert(run.frames_per_collect)
            run.step += run.frames_per_collect
            while limiter.can_sample():
                metrics = agent.update(rb.sample(agent.config.batch_size))
                limiter.on_sample()
            run.train_seconds += time.perf_counter() - t0
            if time.monotonic() - last_log > 1.0:
                last_log = time.monotonic()
                log.log(run.step, _progress_row(run, metrics))
            if run.step >= next_eval:
                next_eval += cfg.eval_every * math.ceil((run.step - next_eval + 1) / cfg.eval_every)
                _evaluate(run, log)
                solved = _solved(run)
            if run.step >= next_ckpt:
                next_ckpt += cfg.checkpoint_every
                checkpoint.save(run.run_dir, run.state(), rb)
    except KeyboardInterrupt:
        log.info(f"interrupted at step {run.step}; writing a checkpoint")
        checkpoint.save(run.run_dir, run.state(), rb)
        raise
    ckpt = checkpoint.save(run.run_dir, run.state(), rb)
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


def _progress_row(run: _Run, metrics: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {
        "train_seconds": run.train_seconds,
        "return_recent": run.collector.stats.mean_return(),
        "episodes": run.collector.stats.count,
        "updates": getattr(run.agent, "updates", 0),
    }
    for k, v in metrics.items():
        if isinstance(v, float | int):
            row[k] = float(v)
    return row


def _evaluate(run: _Run, log: RunLog) -> None:
    cfg = run.cfg
    out = run.eval_collector.rollout(
        run.agent,
        episodes=cfg.eval_episodes,
        deterministic=True,
        seed=cfg.seed + 10_000 + len(run.evals),
    )
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


def _solved(run: _Run) -> bool:
    k = run.cfg.patience
    if run.threshold is None or len(run.evals) < k:
        return False
    return all(e["return_mean"] >= run.threshold for e in run.evals[-k:])
