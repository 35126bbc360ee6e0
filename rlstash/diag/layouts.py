"""Bytes of a transition buffer as a naive (obs, next_obs) buffer and as a stream storage,
side by side (``rlstash plan``)."""

from __future__ import annotations

from collections.abc import Mapping

from rlstash.spec import Spec
from rlstash.storage.stream import StreamStorage
from rlstash.storage.stream_spec import transition_step


def compare_layouts(
    spec: Spec | Mapping, capacity: int, num_envs: int = 1, frame_stack: int = 1
) -> str:
    """Bytes of ``capacity`` transitions as a naive buffer (obs and next_obs stored) and as a
    stream storage (each frame once, plus one slot per episode end), as a text table.

    ``spec`` describes a transition (``next_obs`` fields are ignored). An observation with at
    least 3 dims whose first equals ``frame_stack`` (> 1) is taken as stacked frames
    (gymnasium's FrameStackObservation): the stream stores its newest frame only.
    """
    from rlstash.memory import human_bytes

    step, k, stacked = transition_step(spec, frame_stack)
    naive = sum(StreamStorage.naive_bytes(step, capacity, k, stacked).values())
    slots = capacity // num_envs * num_envs
    stream = sum(StreamStorage.plan_bytes(step, slots, k, stacked, num_envs).values())
    rows = [
        ("layout", "bytes/transition", "total", "vs naive"),
        ("naive (obs + next_obs)", f"{naive // capacity:,}", human_bytes(naive), "1.000"),
        (
            "stream (frames once)",
            f"{stream // slots:,}",
            human_bytes(stream),
            f"{stream / naive:.3f}",
        ),
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [
        "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
        for r in rows
    ]
    rebuilt = f"frame stacks of {k} and next obs" if k > 1 else "next obs"
    note = (
        f"stream: {num_envs} lanes of {slots // num_envs:,} slots; {rebuilt} rebuilt on read; "
        "an episode end takes one more slot (its final observation)"
    )
    return "\n".join([*lines, note])
