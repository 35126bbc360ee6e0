"""Parallel environments: :class:`EnvPool` (torch-free worker processes over shared memory).

Nothing under ``rlstash.envs`` imports torch, so worker processes stay small and can never
touch CUDA (invariant I1).
"""

from rlstash.envs.cpus import usable_cpus
from rlstash.envs.errors import (
    AutoChoiceWarning,
    OversubscriptionWarning,
    RestartEvent,
    WorkerFailedError,
    WorkerRestartWarning,
)
from rlstash.envs.pool import EnvPool

__all__ = [
    "AutoChoiceWarning",
    "EnvPool",
    "OversubscriptionWarning",
    "RestartEvent",
    "WorkerFailedError",
    "WorkerRestartWarning",
    "usable_cpus",
]
