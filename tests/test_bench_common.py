"""bench/common.py's statement of the machine's load: measured, never assumed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

pytest.importorskip("psutil", reason="bench/common.py needs psutil (the bench extra)")
import common  # noqa: E402


@pytest.mark.parametrize(
    ("before", "after", "loaded"),
    [
        (" 06:30:49 up  3:28,  0 user,  load average: 0.81, 0.50, 0.40", 1.04, False),
        ((13.2, 9.0, 8.0), " load average: 23.00, 20.1, 19.0", True),
        (0.5, 2.6, True),  # above 1.25 x 2 cores at the end
        (2.4, 2.5, False),  # the benchmark's own two processes on two cores
    ],
)
def test_the_load_sentence_follows_the_measured_load(before, after, loaded):
    text = common.load_sentence(before, after, cores=2)
    assert text.startswith("**The machine was LOADED**" if loaded else "The machine was quiet"), (
        text
    )
    assert f"{common.load_of(before)} before" in text and f"{common.load_of(after)} after" in text


def test_no_measured_load_says_so():
    assert "not measured" in common.load_sentence(None, "no load here", cores=2)
