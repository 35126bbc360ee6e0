"""rlstash: reinforcement-learning experience, collected in parallel, stored once, delivered anywhere."""

__version__ = "0.1.0"
