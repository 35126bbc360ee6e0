#!/usr/bin/env python3
"""Create (or reuse) ``.venv-atari``: the venv of the Atari benchmarks of issue 27.

    python3 bench/setup_atari.py           # idempotent: a stamp makes a second run a no-op
    python3 bench/setup_atari.py --force   # redo every step

What it holds (stdlib only here, so it runs on a fresh machine):

* ``torch==2.13.0`` first (the CPU build in this machine's wheel folder), then everything else
  with a constraint file pinning torch, so no package can replace it;
* rlstash (editable) with its ``atari`` and ``envpool`` extras and ``dev`` (ruff, pytest);
* the peers: Stable-Baselines3 (DQN and PPO, ``bench/learn_atari.py``), and what CleanRL's
  ``ppo_atari_envpool.py`` imports, run unchanged: ``gym`` (EnvPool's ``env_type="gym"``),
  ``tyro`` (its command line) and ``tensorboard`` (its ``SummaryWriter``).

The project's ``.venv`` (CI extras) has no envpool and no peer: benchmarks never add peers there.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-atari"
TORCH_PIN = "torch==2.13.0"
PEERS = [
    "stable-baselines3==2.9.2",
    "ale-py==0.12.1",
    "gym==0.26.2",
    "tyro",
    "tensorboard",
]
STAMP = VENV / ".atari-stamp"


def _pip(*args: str) -> None:
    py = VENV / "bin" / "python"
    subprocess.check_call(["nice", "-n", "15", str(py), "-m", "pip", "install", "-q", *args])


def _stamp() -> str:
    text = (ROOT / "pyproject.toml").read_bytes() + TORCH_PIN.encode() + " ".join(PEERS).encode()
    return hashlib.sha256(text).hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="redo every step")
    args = parser.parse_args()
    if not args.force and STAMP.exists() and STAMP.read_text() == _stamp():
        print(f"{VENV} is up to date")
        return 0
    if not (VENV / "bin" / "python").exists() or args.force:
        venv.EnvBuilder(with_pip=True, clear=args.force).create(VENV)
    _pip(TORCH_PIN)
    constraints = VENV / "atari-constraints.txt"
    constraints.write_text(TORCH_PIN + "\n")
    _pip("-c", str(constraints), "-e", f"{ROOT}[atari,envpool,dev]", *PEERS)
    check = (
        "import envpool, gym, tyro, torch, stable_baselines3, ale_py, rlstash;"
        "from torch.utils.tensorboard import SummaryWriter;"
        "assert torch.__version__.startswith('2.13.0'), torch.__version__;"
        "print('envpool', envpool.__version__, 'sb3', stable_baselines3.__version__)"
    )
    subprocess.check_call([str(VENV / "bin" / "python"), "-c", check])
    STAMP.write_text(_stamp())
    return 0


if __name__ == "__main__":
    sys.exit(main())
