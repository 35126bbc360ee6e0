"""RingWriter: first in, first out; once full, each new row overwrites the oldest."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlstash.core import Index, check_capacity


class RingWriter:
    """Hands out write positions on a ring of ``capacity`` rows.

    ``reserve(n)`` returns where the next ``n`` rows go without moving anything (a ``slice``
    when they are contiguous, else an index array that wraps around); ``commit(n)`` then
    advances the cursor. A write that fails between the two leaves the writer unchanged.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = check_capacity(capacity)
        self.cursor = 0  # next write position
        self.size = 0  # rows stored
        self.total = 0  # rows ever committed

    def reserve(self, n: int) -> Index:
        if n < 0 or n > self.capacity:
            raise ValueError(f"n: expected 0 <= n <= capacity ({self.capacity}), got {n}")
        stop = self.cursor + n
        if stop <= self.capacity:
            return slice(self.cursor, stop)
        return np.arange(self.cursor, stop, dtype=np.int64) % self.capacity

    def commit(self, n: int) -> None:
        self.cursor = (self.cursor + n) % self.capacity
        self.size = min(self.size + n, self.capacity)
        self.total += n

    def state_dict(self) -> dict[str, Any]:
        return {
            "capacity": self.capacity,
            "cursor": self.cursor,
            "size": self.size,
            "total": self.total,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["capacity"] != self.capacity:
            raise ValueError(
                f"capacity: the saved writer has capacity {state['capacity']}, this one {self.capacity}"
            )
        self.cursor, self.size, self.total = (
            int(state["cursor"]),
            int(state["size"]),
            int(state["total"]),
        )
