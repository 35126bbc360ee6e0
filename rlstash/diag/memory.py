"""Deprecated: memory planning is foundation code and moved to :mod:`rlstash.memory`; this
re-export goes in the next release."""

from rlstash.moved import moved_names

_PUBLIC = [
    "InsufficientMemoryError",
    "MemoryPlan",
    "PlaceUsage",
    "STORAGE_KINDS",
    "cgroup_available",
    "check_host_state",
    "check_needs",
    "cuda_free",
    "disk_free",
    "exact_bytes",
    "human_bytes",
    "place_of",
    "plan",
    "ram_available",
    "shm_free",
]
__getattr__ = moved_names(__name__, dict.fromkeys(_PUBLIC, "rlstash.memory"))
