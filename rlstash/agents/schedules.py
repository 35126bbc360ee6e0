"""Schedules: a number as a function of a step counter (exploration epsilon, learning rates).

A schedule is a plain callable ``schedule(step: int) -> float`` with no state, so it is
checkpointed by saving the step counter it is evaluated at.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LinearSchedule:
    """Linear interpolation from ``start`` to ``end`` over ``duration`` steps, then ``end``.

    value(t) = start + (end - start) * min(1, t / duration);  duration 0 means ``end`` at once.
    This is Stable-Baselines3's epsilon schedule with duration = exploration_fraction * steps.
    """

    start: float
    end: float
    duration: int

    def __post_init__(self) -> None:
        if isinstance(self.duration, bool) or not isinstance(self.duration, int):
            raise TypeError(f"duration: expected an int number of steps, got {self.duration!r}")
        if self.duration < 0:
            raise ValueError(f"duration: expected >= 0 steps, got {self.duration}")

    def __call__(self, step: int) -> float:
        if step < 0:
            raise ValueError(f"step: expected >= 0, got {step}")
        if step >= self.duration:
            return float(self.end)
        frac = min(1.0, step / self.duration)
        return float(self.start + (self.end - self.start) * frac)


@dataclass(frozen=True)
class ConstantSchedule:
    """Always ``value``."""

    value: float

    def __call__(self, step: int) -> float:
        if step < 0:
            raise ValueError(f"step: expected >= 0, got {step}")
        return float(self.value)


def epsilon_schedule(
    initial_eps: float, final_eps: float, fraction: float, total_steps: int
) -> LinearSchedule:
    """The epsilon-greedy schedule: ``initial_eps`` to ``final_eps`` over the first
    ``fraction * total_steps`` env steps (Stable-Baselines3's ``exploration_fraction``)."""
    for name, value in (
        ("exploration_initial_eps", initial_eps),
        ("exploration_final_eps", final_eps),
    ):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name}: expected a probability in [0, 1], got {value}")
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"exploration_fraction: expected a value in [0, 1], got {fraction}")
    if total_steps < 0:
        raise ValueError(f"total_steps: expected >= 0, got {total_steps}")
    return LinearSchedule(initial_eps, final_eps, int(round(fraction * total_steps)))
