"""Diagnostics: memory planning before allocation, the machine doctor, run telemetry."""
