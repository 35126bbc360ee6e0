#!/usr/bin/env python3
"""Create (or reuse) ``bench/.work/venv-pz-learn``: rlstash with PettingZoo, MPE, SuperSuit and
Stable-Baselines3, the peers of ``bench/marl_pz_learn.py`` (MAPPO/IPPO beside SB3 PPO with
SuperSuit's parameter sharing; none of them goes into the project's ``.venv``).

    python3 bench/setup_pz_learn.py        # idempotent: nothing to do when the stamp matches

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
VENV = ROOT / "bench" / ".work" / "venv-pz-learn"
PY = VENV / "bin" / "python"
TORCH_PIN = "torch==2.13.0"
PEERS = [
    "pettingzoo==1.27.0",
    "mpe2==1.1.1",
    "supersuit==3.11.0",
    "stable-baselines3==2.9.2",
    "psutil",
]


def _stamp() -> str:
    text = "\n".join([TORCH_PIN, *PEERS]).encode() + (ROOT / "pyproject.toml").read_bytes()
    return hashlib.sha256(text).hexdigest()


def main() -> None:
    stamp = VENV / ".stamp"
    if stamp.exists() and stamp.read_text() == _stamp() and PY.exists():
        return
    if not PY.exists():
        venv.create(VENV, with_pip=True)
    pip = [str(PY), "-m", "pip", "install", "-q"]
    subprocess.check_call([*pip, TORCH_PIN])
    constraints = VENV / "constraints.txt"
    constraints.write_text(TORCH_PIN + "\n")
    subprocess.check_call([*pip, "-c", str(constraints), *PEERS])
    subprocess.check_call([*pip, "-c", str(constraints), "-e", str(ROOT)])
    stamp.write_text(_stamp())
    print(f"[setup_pz_learn] ready: {PY}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
