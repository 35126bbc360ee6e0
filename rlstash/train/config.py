"""TrainConfig: every setting of a run that is not the learner's own.

The learner's settings (learning rate, networks, discount, targets, exploration) live in the
agent's config (:class:`~rlstash.agents.dqn.DQNConfig`, ...) and are given in ``agent``; the
loop's settings (how much to collect, how often and how much to learn, where the replay lives,
when to evaluate and checkpoint) live here. Each setting is given once: ``gamma`` is the
agent's and the replay buffer reads it from there; ``n_steps`` is the replay's (the agent reads
the ``discount`` field the buffer delivers); the run's ``seed`` also seeds the agent.

Loop settings left at ``None`` take the algorithm's default, then the env's preset
(:mod:`rlstash.train.algos`); :func:`rlstash.train.algos.resolve` fills them in. Every field's
help text is also its ``rlstash train --flag`` help (:mod:`rlstash.train.flags`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from rlstash.settings import SettingError, check_types
from rlstash.settings import setting as s

STORAGES = ("ram", "disk", "tiered")
COMPRESSIONS = ("none", "lz4", "zstd")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")  # characters a default run name does not keep


@dataclass
class TrainConfig:
    """Settings of a run (agent settings go in ``agent``; ``rlstash train --help`` lists all)."""

    # what to train
    algo: str = s(
        "dqn",
        "Algorithm: dqn, sac (continuous or discrete, by the env's actions), td3 or ppo (both).",
        group="run",
    )
    env: str = s("CartPole-v1", "Gymnasium env id.", group="run")
    steps: int = s(100_000, "Env steps at most.", group="run")
    seed: int = s(0, "Seed of envs, replay sampling and the agent's networks.", group="run")
    # collection
    envs: int = s(1, "Environments collected from in parallel.", group="collection")
    workers: int | str = s(
        0, "Env worker processes: 0 (in-process), N, or 'auto' (timed choice).", group="collection"
    )
    history: int = s(
        0,
        "K > 0: the agent sees windows of the last K observations through an LSTM (0 = off).",
        group="collection",
    )
    ray: str = s(
        "",
        "Collect on Ray: 'local' (a private Ray on this machine) or a cluster address host:port "
        "('' = no Ray); needs pip install 'rlstash[ray]'.",
        group="collection",
    )
    ray_actors: int = s(
        2,
        "Ray actors with --ray; each steps --envs envs with --workers processes.",
        group="collection",
    )
    # replay and learning schedule (None: the algorithm's default, then the env's preset)
    storage: str = s(
        "ram", "Replay storage: ram | disk | tiered (hot on --buffer-device).", group="replay"
    )
    buffer_device: str = s(
        "cpu", "Device of a RAM replay buffer / of the hot tier.", group="replay"
    )
    buffer_size: int | None = s(None, "Replay capacity in transitions.", group="replay")
    n_steps: int | None = s(
        None, "n of n-step returns (the replay rebuilds them on read).", group="replay"
    )
    batch_size: int | None = s(None, "Transitions per update.", group="replay")
    learning_starts: int | None = s(
        None, "Env steps collected before the first update.", group="replay"
    )
    train_freq: int | None = s(None, "Env steps between rounds of updates.", group="replay")
    gradient_steps: int | None = s(None, "Updates per round.", group="replay")
    compress: str = s(
        "none",
        "Compress the replay's pixel frames: none | lz4 (fast reads) | zstd (smaller); RAM "
        "storage on the CPU only; needs pip install 'rlstash[compress]'.",
        group="replay",
    )
    compress_budget: float = s(
        0.5,
        "With --compress: planned stored bytes per frame, as a fraction of a raw frame, in "
        "(0, 1] (Atari frames take ~0.04 with lz4; frames that compress worse keep fewer "
        "transitions, never more bytes; see rlstash plan --compress).",
        group="replay",
    )
    compress_delta: bool = s(
        False,
        "With --compress: code each frame against the previous frame of its env (smaller, "
        "slower reads).",
        group="replay",
    )
    # learner
    device: str = s("auto", "Learner device: auto | cpu | cuda[:N].", group="learner")
    torch_threads: int = s(1, "Torch CPU threads (small networks: 1 is fastest).", group="learner")
    # evaluation, checkpoints, output
    eval_every: int | None = s(
        None, "Env steps between evaluations (default: the env's preset, else 1000).",
        group="output",
    )  # fmt: skip
    eval_episodes: int | None = s(
        None, "Episodes per evaluation (default: the env's preset, else 10).", group="output"
    )
    video: bool = s(
        False, "Record an evaluation episode per evaluation to <run>/videos/*.mp4.", group="output"
    )
    threshold: float | None = s(
        None, "Stop once evaluations stay at or above this (default: the env's).", group="output"
    )
    patience: int = s(5, "Evaluations in a row at or above --threshold.", group="output")
    checkpoint_every: int | None = s(
        None,
        "Env steps between checkpoints, and one at the end (default: the env's preset, else "
        "10000; Atari DQN: 50000, its 0.7 GB replay goes into each).",
        group="output",
    )
    run_dir: str = s("runs", "Parent directory of runs.", group="output")
    name: str = s("", "Run name (default <algo>-<env>-s<seed>).", group="output")
    quiet: bool = s(False, "Plain log lines instead of a progress bar.", group="output")
    agent: dict[str, Any] = s({}, "Agent settings (learner only; see the agent's config).")

    def __post_init__(self) -> None:
        check_types(self)
        for name in ("steps", "envs"):
            _at_least(self, name, 1)
        for name in RUN_DEFAULTS:
            if getattr(self, name) is not None:
                _at_least(self, name, 1)
        for name in ("patience", "torch_threads", "ray_actors"):
            _at_least(self, name, 1)
        for name in ("buffer_size", "n_steps", "batch_size", "train_freq", "gradient_steps"):
            if getattr(self, name) is not None:
                _at_least(self, name, 1)
        if self.learning_starts is not None:
            _at_least(self, "learning_starts", 0)
        _at_least(self, "seed", 0)
        _at_least(self, "history", 0)
        if self.history == 1:
            raise SettingError(
                "history", "0 (off) or a window of >= 2 observations", 1, "give 0 or 2 and more"
            )
        if isinstance(self.workers, str) and self.workers != "auto":
            raise SettingError(
                "workers", "an int >= 0 or 'auto'", self.workers, "give 0, N or auto"
            )
        if isinstance(self.workers, int):
            _at_least(self, "workers", 0)
        if self.threshold is not None and not math.isfinite(self.threshold):
            raise SettingError(
                "threshold", "a finite return", self.threshold, "give a number, or leave it unset"
            )
        _one_of(self, "storage", STORAGES)
        if self.name in (".", "..") or any(c in self.name for c in "/\\\0"):
            raise SettingError(
                "name", "one directory name (no '/', '\\', '.' or '..'; runs go under run_dir)",
                self.name, "e.g. --name pong-lz4, or --run-dir for the parent directory",
            )  # fmt: skip
        self._check_compression()
        from rlstash.train.algos import ALGOS

        _one_of(self, "algo", tuple(ALGOS))

    def _check_compression(self) -> None:
        _one_of(self, "compress", COMPRESSIONS)
        b = self.compress_budget
        if not 0.0 < b <= 1.0:
            raise SettingError(
                "compress_budget", "a fraction in (0, 1] of a raw frame", b, "e.g. 0.1 for Atari"
            )
        if self.compress == "none":
            return
        if self.storage != "ram" or self.buffer_device != "cpu":
            raise SettingError(
                "compress", "compressed frames in host RAM (storage ram, buffer_device cpu)",
                f"{self.compress} with storage {self.storage}, buffer_device "
                f"{self.buffer_device}", "give --storage ram --buffer-device cpu, or drop it",
            )  # fmt: skip

    def compression(self) -> Any:
        """The replay's :class:`~rlstash.storage.frames.FrameCompression`, or None."""
        if self.compress == "none":
            return None
        from rlstash.storage.frames import FrameCompression

        return FrameCompression(
            self.compress, delta=self.compress_delta, budget=float(self.compress_budget)
        )

    @property
    def lanes(self) -> int:
        """Envs collected from in all: ``envs``, times ``ray_actors`` with ``ray`` (the replay
        buffer keeps one lane per env)."""
        return self.envs * self.ray_actors if self.ray else self.envs

    @property
    def run_name(self) -> str:
        """The run's directory name under ``run_dir``: ``name``, else
        ``<algo>-<env>-s<seed>`` with every character of the env id but letters, digits,
        ``.``, ``_`` and ``-`` written as ``-`` (``ALE/Pong-v5`` -> ``dqn-ALE-Pong-v5-s0``: one
        directory, not ``dqn-ALE/`` holding ``Pong-v5-s0``)."""
        return self.name or f"{self.algo}-{_UNSAFE.sub('-', self.env)}-s{self.seed}"


def _at_least(cfg: TrainConfig, name: str, low: int) -> None:
    value = getattr(cfg, name)
    if value < low:
        raise SettingError(name, f"an int >= {low}", value, f"give {low} or more")


def _one_of(cfg: TrainConfig, name: str, options: tuple[str, ...]) -> None:
    value = getattr(cfg, name)
    if value not in options:
        raise SettingError(name, f"one of {', '.join(options)}", value, "pick one of those")


LOOP_SETTINGS = (
    "buffer_size",
    "n_steps",
    "batch_size",
    "learning_starts",
    "train_freq",
    "gradient_steps",
)
"""The loop settings whose default depends on the algorithm and the env (``None`` = preset)."""

RUN_DEFAULTS = {"eval_every": 1000, "eval_episodes": 10, "checkpoint_every": 10_000}
"""Output settings an env's preset may set (``None`` = the preset's, else these)."""
