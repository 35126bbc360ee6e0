"""TrainConfig: every setting of a run that is not the learner's own.

The learner's settings (learning rate, networks, discount, targets, exploration) live in the
agent's config (:class:`~rlstash.agents.dqn.DQNConfig`, ...) and are given in ``agent``; the
loop's settings (how much to collect, how often and how much to learn, where the replay lives,
when to evaluate and checkpoint) live here. Each setting is given once: ``gamma`` is the
agent's and the replay buffer reads it from there; ``n_steps`` is the replay's (the agent reads
the ``discount`` field the buffer delivers); the run's ``seed`` also seeds the agent.

Loop settings left at ``None`` take the algorithm's default, then the env's preset
(:mod:`rlstash.train.algos`); :func:`rlstash.train.algos.resolve` fills them in. Every field's
help text is also its ``rlstash train --flag`` help (:mod:`rlstash.cli.flags`).
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any

import torch

from rlstash.device import COMPUTE, check_device
from rlstash.settings import SettingError, check_types, field_values
from rlstash.settings import setting as s

STORAGES = ("ram", "disk", "tiered")
ALGOS: dict[str, Any] = {}
"""The registry of algorithms, name -> :class:`rlstash.train.algos.Algo`: filled by
:func:`rlstash.train.algos.register` (the built-in ones when :mod:`rlstash.train` is imported),
read here to check ``algo``; config imports no algorithm."""
COMPRESSIONS = ("none", "lz4", "zstd")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")  # characters a default run name does not keep


@dataclass
class ReplayConfig:
    """The replay settings ``rlstash train`` and ``rlstash plan`` share: declared once here,
    taken by :class:`TrainConfig` and :class:`rlstash.cli.plan.PlanConfig` field by field
    (:func:`replay_field`: the same name, help, default and :func:`check_replay_fields` rules,
    so the two commands' flags cannot drift apart)."""

    storage: str = s(
        "ram", "Replay storage: ram | disk | tiered (hot on --buffer-device).", group="replay"
    )
    buffer_device: str = s(
        "cpu", "Device of a RAM replay buffer / of the hot tier.", group="replay"
    )
    buffer_size: int | None = s(None, "Replay capacity in transitions.", group="replay", at_least=1)
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

    def __post_init__(self) -> None:
        check_types(self)
        check_replay_fields(self)


def replay_field(name: str, default: Any = dataclasses.MISSING) -> Any:
    """A fresh dataclass field of :class:`ReplayConfig`'s ``name``: its help and metadata, its
    default unless ``default`` is given (``rlstash plan`` plans 1,000,000 rows where train
    takes the preset's)."""
    f = ReplayConfig.__dataclass_fields__[name]
    value = f.default if default is dataclasses.MISSING else default
    return dataclasses.field(default=value, metadata=f.metadata)


def check_replay_fields(cfg: Any) -> None:
    """The rules of :class:`ReplayConfig`'s fields on any config holding them (a
    :class:`SettingError`, or a ValueError naming the field): capacity >= 1, a known storage, a
    computing ``buffer_device`` (spelling only: no CUDA call), :func:`check_compression`."""
    if cfg.buffer_size is not None:
        _at_least(cfg, "buffer_size", 1)
    _one_of(cfg, "storage", STORAGES)
    check_device(cfg.buffer_device, "buffer_device", COMPUTE)
    check_compression(
        cfg.compress, cfg.compress_budget, cfg.compress_delta, cfg.storage, cfg.buffer_device
    )


@dataclass
class TrainConfig:
    """Settings of a run (agent settings go in ``agent``; ``rlstash train --help`` lists all)."""

    # what to train
    algo: str = s(
        "dqn",
        "Algorithm: dqn, sac (continuous or discrete, by the env's actions), td3 or ppo (both); "
        "offline from --dataset: iql or td3_bc; multi-agent (vmas/<scenario>, pettingzoo:<module>): "
        "mappo or ippo, qmix or vdn (Discrete actions).",
        group="run",
    )
    env: str = s(
        "CartPole-v1",
        "Gymnasium env id (vmas/<scenario>: a VMAS multi-agent scenario).",
        group="run",
    )
    env_kwargs: str = s(
        "", "Multi-agent env keyword arguments as a JSON object (vmas/<scenario>: scenario "
        "settings over BenchMARL's task config, e.g. '{\"n_agents\": 4}'; pettingzoo:<module>: "
        "parallel_env's). A gymnasium env takes its kwargs from a registered id instead "
        "(--env my_module:MyId-v0).", group="run"
    )  # fmt: skip
    dataset: str = s(
        "",
        "A local Minari dataset id (needs rlstash[minari]): offline algorithms (iql, td3_bc) "
        "learn from it alone, online ones (sac, td3) start with it in their replay; the env "
        "is the one the dataset names.",
        group="run",
    )
    steps: int | None = s(
        None,
        "Env steps at most; the run stops earlier once evaluations stay at --threshold "
        "(default: the env's). Default 100,000; on-policy algorithms (ppo) take it in rollouts "
        "of the env's preset, making as many rollouts at any --envs or --rollout-steps (PPO "
        "CartPole-v1: 391 rollouts of 8 envs x 32 steps; 12.8M steps at --envs 1024).",
        group="run",
    )
    seed: int = s(0, "Seed of envs, replay sampling and the agent's networks.", group="run")
    # collection
    envs: int = s(1, "Environments collected from in parallel.", group="collection")
    workers: int | str = s(
        0, "Env worker processes: 0 (in-process), N, or 'auto' (timed choice).", group="collection"
    )
    env_backend: str = s(
        "gymnasium",
        "Env source: gymnasium (rlstash's process pool), envpool (EnvPool's C++ envs, pip "
        "install 'rlstash[envpool]') or auto (EnvPool where installed and it has --env, else "
        "gymnasium); the resolved config records which ran.",
        group="collection",
    )
    env_batch: int = s(
        0,
        "B > 0: asynchronous batches: step whichever B of the --envs envs are ready and act "
        "on those (replay algorithms; each env's steps go to its own lane). --workers 0 then "
        "means the default layout (max(cores, envs / B) workers). 0: every env every step.",
        group="collection",
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
    storage: str = replay_field("storage")
    buffer_device: str = replay_field("buffer_device")
    buffer_size: int | None = replay_field("buffer_size")
    n_steps: int | None = s(
        None, "n of n-step returns (the replay rebuilds them on read).", group="replay"
    )
    batch_size: int | None = s(None, "Transitions per update.", group="replay")
    learning_starts: int | None = s(
        None, "Env steps collected before the first update.", group="replay"
    )
    train_freq: int | None = s(None, "Env steps between rounds of updates.", group="replay")
    gradient_steps: int | None = s(None, "Updates per round.", group="replay")
    compress: str = replay_field("compress")
    compress_budget: float = replay_field("compress_budget")
    compress_delta: bool = replay_field("compress_delta")
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
    track: str = s(
        "",
        "Experiment tracker besides progress.csv, eval.csv and TensorBoard: '' (none) or wandb "
        "(Weights & Biases, needs pip install 'rlstash[wandb]'; WANDB_MODE=offline works "
        "without a network).",
        group="output",
    )
    wandb_project: str = s("rlstash", "W&B project, with --track wandb.", group="output")
    wandb_entity: str = s(
        "", "W&B entity (team or user; '' = your default), with --track wandb.", group="output"
    )
    wandb_tags: tuple[str, ...] = s(
        (), "W&B tags, comma-separated, with --track wandb.", group="output"
    )
    agent: dict[str, Any] = s({}, "Agent settings (learner only; see the agent's config).")

    def __post_init__(self) -> None:
        check_types(self)
        _at_least(self, "envs", 1)
        if self.steps is not None:
            _at_least(self, "steps", 1)
        values = field_values(self)
        for name in RUN_DEFAULTS:
            if values[name] is not None:
                _at_least(self, name, 1)
        for name in ("patience", "torch_threads", "ray_actors"):
            _at_least(self, name, 1)
        for name in ("buffer_size", "n_steps", "batch_size", "train_freq", "gradient_steps"):
            if values[name] is not None:
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
        _one_of(self, "env_backend", ("auto", "gymnasium", "envpool"))
        _at_least(self, "env_batch", 0)
        if self.env_batch > self.envs:
            raise SettingError(
                "env_batch", f"0 (off) or 1..--envs ({self.envs})", self.env_batch,
                "give at most --envs",
            )  # fmt: skip
        if not self.ray and self.ray_actors != TrainConfig.ray_actors:
            raise SettingError(
                "ray_actors", f"the default ({TrainConfig.ray_actors}) without --ray",
                self.ray_actors, "give --ray ADDRESS (or local) too, or drop --ray-actors",
            )  # fmt: skip
        if self.threshold is not None and not math.isfinite(self.threshold):
            raise SettingError(
                "threshold", "a finite return", self.threshold, "give a number, or leave it unset"
            )
        check_replay_fields(self)  # storage, buffer_device, compression: plan's rules too
        check_device(self.device, "device", COMPUTE)  # no CUDA call: spelling and type only
        if self.name in (".", "..") or any(c in self.name for c in "/\\\0"):
            raise SettingError(
                "name", "one directory name (no '/', '\\', '.' or '..'; runs go under run_dir)",
                self.name, "e.g. --name pong-lz4, or --run-dir for the parent directory",
            )  # fmt: skip
        _one_of(self, "algo", tuple(ALGOS))
        if self.track not in TRACKERS:
            raise SettingError(
                "track", "'' (no tracker) or 'wandb'", self.track, "give --track wandb, or drop it"
            )
        check_wandb_names(self)

    def compression(self) -> Any:
        """The replay's :class:`~rlstash.storage.frames.FrameCompression`, or None. Once the
        loop settings are resolved (``buffer_size``, ``n_steps``: a run's buffer is made), the
        budget is checked against the lanes it sizes and the codec's package must be
        installed (a ValueError naming ``compress`` and the install command)."""
        comp = check_compression(
            self.compress, self.compress_budget, self.compress_delta, self.storage,
            self.buffer_device, **self._lanes_of_replay(),
        )  # fmt: skip
        if comp is not None and self.buffer_size is not None:
            from rlstash.storage.codecs import missing_package

            missing = missing_package(comp.codec)
            if missing:
                raise ValueError(f"compress: {missing}, or drop --compress {comp.codec}")
        return comp

    def check_replay(self) -> None:
        """The checks of a resolved config's replay (``buffer_size`` and ``n_steps`` set), made
        before anything is built: every env's lane holds a sampled row (``n_steps +
        frame_stack`` slots), and a compression budget keeps one (:func:`check_compression`).
        A :class:`SettingError` naming ``buffer_size`` or ``compress_budget``."""
        lanes = self._lanes_of_replay()
        if not lanes:
            return
        need = max(2, lanes["row_frames"])
        if lanes["lane_slots"] < need:
            raise SettingError(
                "buffer_size", f"at least {need * self.lanes} for {self.lanes} env(s): each "
                f"env's share holds a sampled row, n_steps + frame_stack = {need} slots",
                self.buffer_size, f"give {flag('buffer_size')} {need * self.lanes} or more",
            )  # fmt: skip
        check_compression(
            self.compress, self.compress_budget, self.compress_delta, self.storage,
            self.buffer_device, **lanes,
        )  # fmt: skip

    def _lanes_of_replay(self) -> dict[str, int]:
        """``lane_slots`` (replay slots per env) and ``row_frames`` (frames a sampled row
        spans) once ``buffer_size`` and ``n_steps`` are resolved, else {}."""
        if self.buffer_size is None or self.n_steps is None:
            return {}
        return {
            "lane_slots": self.buffer_size // self.lanes,
            "row_frames": self.n_steps + self.frame_stack,
        }

    @property
    def frame_stack(self) -> int:
        """Frames per observation: ``history``, else 4 for ALE ids (Atari preprocessing
        stacks 4), else 1 (the replay stores single frames and rebuilds the stacks)."""
        from rlstash.envs.atari import FRAME_STACK, is_atari

        return self.history or (FRAME_STACK if is_atari(self.env) else 1)

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
        directory, not ``dqn-ALE/`` holding ``Pong-v5-s0``). With ``dataset`` and the default
        ``env``, the env is the dataset's (the one the run trains and evaluates in)."""
        return self.name or f"{self.algo}-{_UNSAFE.sub('-', self._named_env())}-s{self.seed}"

    def _named_env(self) -> str:
        """``env``, or the env ``dataset`` names when ``env`` is the default (a dataset that
        does not load leaves ``env``: the run is refused with that error before it writes)."""
        if not self.dataset or self.env != TrainConfig.env:
            return self.env
        from rlstash.datasets import minari as mds

        try:
            return mds.env_id(self.dataset)
        except (ValueError, ImportError):
            return self.env


def check_compression(
    compress: str,
    budget: float,
    delta: bool,
    storage: str,
    device: str,
    *,
    lane_slots: int | None = None,
    row_frames: int | None = None,
    device_setting: str = "buffer_device",
) -> Any:
    """The compression rules ``rlstash train`` and ``rlstash plan`` share: the
    :class:`~rlstash.storage.frames.FrameCompression` of the settings (None for ``"none"``), or
    a :class:`SettingError` naming the setting (``compress``, ``compress_budget``). Compressed
    frames live in host RAM (``storage`` ram, ``device`` of type cpu; ``device_setting`` is its
    name: ``buffer_device`` in train, ``device`` in plan). With ``lane_slots`` (slots per env)
    and ``row_frames`` (frames one sampled row spans: ``n_steps + frame_stack``) the budget must
    keep a row's frames even when frames do not compress: ``floor(budget * lane_slots)`` frames
    per lane are kept then, less ``key_every - 1`` with delta coding (below that, sampling finds
    no valid row)."""
    if compress not in COMPRESSIONS:
        raise SettingError("compress", f"one of {', '.join(COMPRESSIONS)}", compress, "pick one")
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not 0.0 < budget <= 1.0:
        raise SettingError(
            "compress_budget", "a fraction in (0, 1] of a raw frame", budget, "e.g. 0.1 for Atari"
        )
    if compress == "none":
        for name, value in (("compress_budget", budget), ("compress_delta", delta)):
            default = ReplayConfig.__dataclass_fields__[name].default
            if value != default:  # a setting of the compression there is none of
                raise SettingError(
                    name, f"the default ({default}) without --compress", value,
                    f"give --compress lz4 or zstd too, or drop --{name.replace('_', '-')}",
                )  # fmt: skip
        return None
    place = flag(device_setting)
    try:
        on_cpu = torch.device(device).type == "cpu"
    except (RuntimeError, TypeError, ValueError):
        on_cpu = False
    if storage != "ram" or not on_cpu:
        raise SettingError(
            "compress", f"compressed frames in host RAM (storage ram, {device_setting} cpu)",
            f"{compress} with storage {storage}, {device_setting} {device}",
            f"give --storage ram {place} cpu, or drop it",
        )  # fmt: skip
    from rlstash.storage.frames import FrameCompression

    comp = FrameCompression(compress, delta=bool(delta), budget=float(budget))
    if lane_slots is not None and row_frames is not None:
        need = row_frames + comp.chain - 1  # frames a row spans, and a delta chain's head
        if budget * lane_slots + 1e-9 < need:
            low = math.ceil(need / max(1, lane_slots) * 1e4) / 1e4
            what = (
                f"at least {low:g}: {lane_slots} slots per env keep floor(budget x slots) "
                f"frames when frames do not compress, and a sampled row spans {row_frames}"
                + (f" (+ {comp.chain - 1} of a delta chain)" if comp.chain > 1 else "")
            )
            fix = f"give {flag('compress_budget')} {low:g} or more"
            if low > 1:
                fix = "raise the capacity (slots per env), or drop --compress-delta"
            raise SettingError("compress_budget", what, budget, fix)
    return comp


def flag(name: str) -> str:
    """The command-line flag of a setting: ``buffer_size`` -> ``--buffer-size``."""
    return "--" + name.replace("_", "-")


def _at_least(cfg: TrainConfig, name: str, low: int) -> None:
    value = field_values(cfg)[name]
    if value < low:
        raise SettingError(name, f"an int >= {low}", value, f"give {low} or more")


def _one_of(cfg: TrainConfig, name: str, options: tuple[str, ...]) -> None:
    value = field_values(cfg)[name]
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

TRACKERS = ("", "wandb")
"""``track`` values (:mod:`rlstash.train.tracking`)."""

RUN_DEFAULTS = {"eval_every": 1000, "eval_episodes": 10, "checkpoint_every": 10_000}
"""Output settings an env's preset may set (``None`` = the preset's, else these)."""


WANDB_BAD_CHARS = "/\\#?%:"
"""Characters W&B refuses in a project (and entity) name; at most 128 characters."""


def check_wandb_names(cfg: Any) -> None:
    """W&B's own rules on ``wandb_project``, ``wandb_entity`` (at most 128 characters, none
    of :data:`WANDB_BAD_CHARS`) and ``wandb_tags`` (1 to 64 characters each), checked before
    the run starts (W&B would refuse them only once it starts, switching tracking off); and
    these settings only with ``track="wandb"``."""
    values = field_values(cfg)
    if cfg.track != "wandb":
        for name in ("wandb_project", "wandb_entity", "wandb_tags"):
            if values[name] != TrainConfig.__dataclass_fields__[name].default:
                raise SettingError(
                    name, "the default without --track wandb", values[name],
                    f"give --track wandb too, or drop --{name.replace('_', '-')}",
                )  # fmt: skip
    for name in ("wandb_project", "wandb_entity"):
        value = values[name]
        bad = sorted({c for c in value if c in WANDB_BAD_CHARS})
        if len(value) > 128 or bad or (name == "wandb_project" and not value):
            raise SettingError(
                name, f"a W&B name of 1 to 128 characters without {' '.join(WANDB_BAD_CHARS)}",
                value, "e.g. --wandb-project cartpole-dqn",
            )  # fmt: skip
    for tag in cfg.wandb_tags:
        if not 1 <= len(tag) <= 64:
            raise SettingError(
                "wandb_tags", "tags of 1 to 64 characters each (W&B's rule)", tag,
                "shorten it, or drop the empty one",
            )  # fmt: skip
