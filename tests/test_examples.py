"""Every example runs (in its few-second mode)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).parent.parent / "examples").glob("*.py"))


@pytest.mark.slow
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(path, tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # CI machines have no GPU; be explicit
    out = subprocess.run(
        [sys.executable, str(path), "--quick"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, f"{path.name} failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
