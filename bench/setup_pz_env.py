#!/usr/bin/env python3
"""Create (or reuse) ``bench/.work/venv-pz``: rlstash with PettingZoo, MPE and SuperSuit, the
peer of ``bench/marl_pz.py`` (SuperSuit never goes into the project's ``.venv``).

    python3 bench/setup_pz_env.py          # idempotent: nothing to do when the stamp matches

Standard library only. ``torch==2.13.0`` first (the local CPU build), then the pinned peers and
``pip install -e <repo>`` with a constraint file pinning torch, so nothing installs another.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / "bench" / ".work" / "venv-pz"
PY = VENV / "bin" / "python"
TORCH_PIN = "torch==2.13.0"
PEERS = ["pettingzoo==1.27.0", "mpe2==1.1.1", "supersuit==3.11.0", "psutil"]


def _stamp(peers: list[str]) -> str:
    text = "\n".join([TORCH_PIN, *peers]).encode() + (ROOT / "pyproject.toml").read_bytes()
    return hashlib.sha256(text).hexdigest()


def build(venv_dir: Path, peers: list[str], name: str) -> Path:
    """Create (or reuse, when its stamp matches) ``venv_dir`` with torch, ``peers`` and rlstash
    (editable) installed, torch pinned; returns its python. Shared by the setup_pz_* scripts."""
    py, stamp = venv_dir / "bin" / "python", venv_dir / ".stamp"
    if stamp.exists() and stamp.read_text() == _stamp(peers) and py.exists():
        return py
    if not py.exists():
        venv.create(venv_dir, with_pip=True)
    pip = [str(py), "-m", "pip", "install", "-q"]
    subprocess.check_call([*pip, TORCH_PIN])
    constraints = venv_dir / "constraints.txt"
    constraints.write_text(TORCH_PIN + "\n")
    subprocess.check_call([*pip, "-c", str(constraints), *peers])
    subprocess.check_call([*pip, "-c", str(constraints), "-e", str(ROOT)])
    stamp.write_text(_stamp(peers))
    print(f"[{name}] ready: {py}", flush=True)
    return py


def main() -> None:
    build(VENV, PEERS, "setup_pz_env")


if __name__ == "__main__":
    sys.exit(main())
