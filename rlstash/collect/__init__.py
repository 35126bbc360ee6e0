"""Collectors: turn a vectorized env and a policy into batches in the stream layout."""

from rlstash.collect.sync import Collector, EpisodeStats

__all__ = ["Collector", "EpisodeStats"]
