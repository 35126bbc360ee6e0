"""Samplers pick row indices; storages move the data (see :mod:`rlstash.core`).

Three behaviours, one class each:

* :class:`UniformSampler` -- uniform with replacement, or epochs without replacement.
* :class:`PrioritizedSampler` -- proportional prioritized replay (Schaul et al. 2016) over a
  vectorized :class:`~rlstash.sampler.sumtree.SumMinTree`.
* :class:`SequenceSampler` -- windows of ``length`` consecutive steps that never cross an
  episode end or the write cursor.

Each has ``check_spec(spec)``, which :class:`~rlstash.replay.ReplayBuffer` calls when the
sampler is bound to its storage, so a sampler refuses rows it cannot work with (the sequence
sampler: no episode-end flags) before anything is written. Shared argument and state checks
live in :mod:`rlstash.sampler.checks`; row indices go through :mod:`rlstash.indices`. Each
kind registers how a saved ``state_dict`` rebuilds it (:mod:`rlstash.sampler.kinds`).
"""

from rlstash.sampler.kinds import register_kind, sampler_from_state
from rlstash.sampler.prioritized import PrioritizedSampler
from rlstash.sampler.sequence import SequenceSampler
from rlstash.sampler.uniform import UniformSampler, uniform_ints

__all__ = [
    "PrioritizedSampler",
    "SequenceSampler",
    "UniformSampler",
    "register_kind",
    "sampler_from_state",
    "uniform_ints",
]
