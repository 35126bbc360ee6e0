#!/usr/bin/env python3
"""Create (or reuse) ``.venv-marl``: BenchMARL and its pinned peers beside rlstash, for
``bench/marl.py``.

    python3 bench/setup_marl.py            # idempotent: does nothing when the stamp matches
    python3 bench/setup_marl.py --force    # redo every step

BenchMARL 1.5.2 needs torchrl < 0.12, so it cannot share ``.venv-bench`` (torchrl 0.14). Steps
(stdlib only, runs on a fresh machine):

1. ``torch==2.13.0`` first (the local CPU build), so no peer pulls another torch.
2. The peers pinned, with a constraint file pinning torch: benchmarl 1.5.2, torchrl 0.11.1,
   tensordict 0.11.0, vmas 1.5.2 (and BenchMARL's hydra/omegaconf dependencies).
3. ``pip install -e <repo>`` under the same constraint.
4. Check: benchmarl, torchrl, vmas and rlstash import.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-marl"
PY = VENV / "bin" / "python"
TORCH_PIN = "torch==2.13.0"
PEERS = {"benchmarl": "1.5.2", "torchrl": "0.11.1", "tensordict": "0.11.0", "vmas": "1.5.2"}
STAMP = VENV / ".marl-stamp"
CONSTRAINTS = VENV / "marl-constraints.txt"


def _stamp() -> str:
    text = TORCH_PIN + repr(sorted(PEERS.items())) + (ROOT / "pyproject.toml").read_text()
    return hashlib.sha256(text.encode()).hexdigest()


def _pip(*args: str) -> None:
    subprocess.check_call([str(PY), "-m", "pip", "install", "-q", *args])


def setup(force: bool = False) -> Path:
    """Build the venv unless it is up to date; returns its python."""
    if not force and STAMP.exists() and STAMP.read_text() == _stamp():
        return PY
    if not PY.exists():
        venv.create(VENV, with_pip=True)
    _pip(TORCH_PIN)
    CONSTRAINTS.write_text(TORCH_PIN + "\n")
    _pip("-c", str(CONSTRAINTS), *(f"{k}=={v}" for k, v in PEERS.items()))
    _pip("-c", str(CONSTRAINTS), "-e", str(ROOT))
    subprocess.check_call(
        [str(PY), "-c", "import benchmarl, torchrl, vmas, rlstash; print('marl venv ok')"]
    )
    STAMP.write_text(_stamp())
    return PY


def ensure_marl_venv(script: str) -> None:
    """Return when running in ``.venv-marl``; else set it up and re-exec ``script`` in it."""
    import os

    if Path(sys.prefix).resolve() == VENV.resolve():
        return
    setup()
    os.execv(str(PY), [str(PY), str(Path(script).resolve()), *sys.argv[1:]])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true")
    print(setup(parser.parse_args().force))
