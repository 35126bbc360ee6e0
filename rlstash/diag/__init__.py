"""Diagnostics: the machine doctor, benchmarks, run telemetry, layout comparisons (memory planning is foundation code: :mod:`rlstash.memory`)."""
