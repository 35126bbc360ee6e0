#!/usr/bin/env python3
"""Create (or reuse) ``bench/.work/venv-pz-learn``: rlstash with PettingZoo, MPE, SuperSuit and
Stable-Baselines3, the peers of ``bench/marl_pz_learn.py`` (MAPPO/IPPO beside SB3 PPO with
SuperSuit's parameter sharing; none of them goes into the project's ``.venv``).

    python3 bench/setup_pz_learn.py        # idempotent: nothing to do when the stamp matches

Standard library only. ``torch==2.13.0`` first (the local CPU build), then the pinned peers and
``pip install -e <repo>`` with a constraint file pinning torch, so nothing installs another.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from setup_pz_env import ROOT, build  # noqa: E402 - the one venv builder of the setup_pz_* scripts

VENV = ROOT / "bench" / ".work" / "venv-pz-learn"
PY = VENV / "bin" / "python"
PEERS = [
    "pettingzoo==1.27.0",
    "mpe2==1.1.1",
    "supersuit==3.11.0",
    "stable-baselines3==2.9.2",
    "psutil",
]


def main() -> None:
    build(VENV, PEERS, "setup_pz_learn")


if __name__ == "__main__":
    sys.exit(main())
