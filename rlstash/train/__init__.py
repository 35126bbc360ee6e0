"""The training application: config, set-up, loop, checkpoints, run log, evaluation, CLI.

Everything here sits on top of the library (storages, samplers, replay, envs, collectors,
agents) and is what ``rlstash train`` / ``rlstash eval`` run.
"""
