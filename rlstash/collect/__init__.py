"""Collectors: turn a vectorized env and a policy into batches in the stream layout.

- :class:`Collector`: the policy runs in this process, one forward pass for all envs.
- :class:`AsyncCollector`: each worker process holds its own CPU copy of the policy and runs
  ahead through shared-memory slots; weights reach the workers through shared memory.
- :class:`~rlstash.collect.ray.RayCollector` (``rlstash.collect.ray``, needs ``rlstash[ray]``):
  Ray actors on a cluster, each with envs and a policy copy, fill the same [T, N] batches.
"""

from rlstash.collect.async_ import AsyncBatch, AsyncCollector
from rlstash.collect.sync import Collector, EpisodeStats

__all__ = ["AsyncBatch", "AsyncCollector", "Collector", "EpisodeStats"]
