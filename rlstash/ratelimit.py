"""RateLimiter: how much the learner samples relative to what is inserted — in one object.

Instead of scattered ``learning_starts`` / ``train_freq`` / ``gradient_steps`` checks, the
loop asks the limiter (after Reverb's ``SampleToInsertRatio``)::

    limiter = RateLimiter(min_size=1000, samples_per_insert=32.0, tolerance=4096, batch_size=64)
    for batch in collector:
        rb.extend(batch); limiter.on_insert(rows)
        while limiter.can_sample():          # as many updates as the ratio allows now
            agent.update(rb.sample(64)); limiter.on_sample()

Let ``I`` be rows inserted, ``S`` rows sampled and ``r = samples_per_insert``. With
``diff = r * I - S``, sampling a batch of ``B`` rows is allowed when ``I >= min_size`` and
``diff - B >= r * min_size - tolerance``; inserting ``n`` rows is allowed while
``I < min_size`` or ``diff + r * n <= r * min_size + tolerance``. The window between the two
bounds is ``2 * tolerance`` wide; settings where one sample or one insert chunk cannot fit
in it would deadlock a blocking (async) loop and are refused up front.

For a synchronous loop ``samples_per_insert = gradient_steps * batch_size / train_freq``.
"""

from __future__ import annotations

import threading
from typing import Any


class RateLimiter:
    """Keeps the sample-to-insert ratio within ``tolerance`` rows of ``samples_per_insert``."""

    def __init__(
        self,
        min_size: int,
        samples_per_insert: float,
        batch_size: int,
        tolerance: float | None = None,
        insert_chunk: int = 1,
        capacity: int | None = None,
    ) -> None:
        if not isinstance(min_size, int) or min_size < 1:
            raise ValueError(f"min_size: expected an int >= 1, got {min_size!r}")
        if capacity is not None and min_size > capacity:
            raise ValueError(
                f"min_size: {min_size} rows can never be reached by a buffer of capacity {capacity}; "
                f"lower min_size or raise the capacity"
            )
        if not samples_per_insert > 0:
            raise ValueError(f"samples_per_insert: expected > 0, got {samples_per_insert!r}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size: expected an int >= 1, got {batch_size!r}")
        need = max(batch_size, samples_per_insert * insert_chunk)
        tolerance = float(need if tolerance is None else tolerance)
        if tolerance < need:
            raise ValueError(
                f"tolerance: {tolerance:g} rows is less than one sample ({batch_size}) or one insert chunk "
                f"({samples_per_insert:g} x {insert_chunk} rows); the loop would deadlock. Use >= {need:g}"
            )
        self.min_size = min_size
        self.ratio = float(samples_per_insert)
        self.batch_size = batch_size
        self.tolerance = tolerance
        self.inserted = 0
        self.sampled = 0
        self._cond = threading.Condition()

    @property
    def diff(self) -> float:
        return self.ratio * self.inserted - self.sampled

    def can_sample(self, rows: int | None = None) -> bool:
        rows = self.batch_size if rows is None else rows
        with self._cond:
            return (
                self.inserted >= self.min_size
                and self.diff - rows >= self.ratio * self.min_size - self.tolerance
            )

    def can_insert(self, rows: int = 1) -> bool:
        with self._cond:
            return self._insert_ok(rows)

    def on_insert(self, rows: int) -> None:
        with self._cond:
            self.inserted += rows
            self._cond.notify_all()

    def on_sample(self, rows: int | None = None) -> None:
        with self._cond:
            self.sampled += self.batch_size if rows is None else rows
            self._cond.notify_all()

    def wait_insert(self, rows: int, timeout: float | None = None) -> bool:
        """Block until inserting ``rows`` is allowed (for collectors running ahead)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._insert_ok(rows), timeout)

    def _insert_ok(self, rows: int) -> bool:
        return (
            self.inserted < self.min_size
            or self.diff + self.ratio * rows <= self.ratio * self.min_size + self.tolerance
        )

    def state_dict(self) -> dict[str, Any]:
        return {"inserted": self.inserted, "sampled": self.sampled}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inserted, self.sampled = int(state["inserted"]), int(state["sampled"])
