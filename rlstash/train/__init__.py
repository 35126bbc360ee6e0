"""The training application: config, set-up, loop, checkpoints, run log, evaluation.

Everything here sits on top of the library (storages, samplers, replay, envs, collectors,
agents) and is what ``rlstash train`` / ``rlstash eval`` run::

    from rlstash.train import TrainConfig, train
    result = train(TrainConfig(algo="sac", env="Pendulum-v1", steps=20_000))

Modules, top to bottom: :mod:`.loop` (``train``), :mod:`.builders` (``build_run``: env
source -> store -> agent -> collector; the off-policy :class:`~.builders.ReplayLearning`),
:mod:`.onpolicy` (the on-policy :class:`~.onpolicy.RolloutLearning`), :mod:`.ray_run` (Ray
as a collector choice), :mod:`.drive` (the loop skeleton), :mod:`.run` (``Run`` and the
``Learning`` interface), :mod:`.algos` (the registry: algo -> agent config, agent, store,
loop defaults; presets from :mod:`rlstash.presets`), :mod:`.config` (TrainConfig),
:mod:`.checkpoint`, :mod:`.rundir`, :mod:`.runlog`, :mod:`.evaluate`. Env construction is
:mod:`rlstash.envs.make`. The command line is :mod:`rlstash.cli` (``.flags`` and the
``cli*`` modules here are its deprecated re-exports).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rlstash.train import algos as algos  # registers the built-in algorithms (config.ALGOS)

_EXPORTS = {
    "TrainConfig": "rlstash.train.config",
    "train": "rlstash.train.loop",
    "TrainResult": "rlstash.train.loop",
    "build_run": "rlstash.train.builders",
}
__all__ = ["TrainConfig", "TrainResult", "build_run", "train"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rlstash.train' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


if TYPE_CHECKING:
    from rlstash.train.builders import build_run
    from rlstash.train.config import TrainConfig
    from rlstash.train.loop import TrainResult, train
