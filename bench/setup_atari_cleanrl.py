#!/usr/bin/env python3
"""Create (or reuse) ``.venv-cleanrl``: the packages CleanRL's ``ppo_atari_envpool.py`` needs
to run unchanged, in a folder put first on ``PYTHONPATH`` over ``.venv-atari``.

    python3 bench/setup_atari_cleanrl.py          # idempotent (a stamp file)

CleanRL pins ``envpool==0.6.6``, ``gym==0.23.1``, ``numpy==1.24.4`` on Python < 3.11
(requirements/requirements-envpool.txt). This machine has Python 3.11 only, and envpool 0.6.6
has no wheel for it; the oldest envpool with a 3.11 wheel is 0.8.4, so the folder holds
``envpool==0.8.4`` with the gym CleanRL pins (0.23.1, the old 4-tuple step API the script
unpacks) and a numpy 1.x. EnvPool >= 1.0 (``.venv-atari``) cannot run the script: its
``env_type="gym"`` returns a gymnasium pool whose ``num_envs`` the script cannot set.
torch, tyro and tensorboard come from ``.venv-atari`` (``bench/setup_atari.py``), whose
interpreter runs the script with ``PYTHONPATH=.venv-cleanrl``
(``bench/learn_atari_ppo.run_cleanrl``), so this folder's envpool, gym and numpy come first.
Installed with ``pip install --target`` (``--no-deps``: the rest is in ``.venv-atari``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / ".venv-cleanrl"
ATARI_PY = ROOT / ".venv-atari" / "bin" / "python"
PINS = ["envpool==0.8.4", "gym==0.23.1", "numpy<2"]
STAMP = TARGET / ".cleanrl-stamp"


def main() -> int:
    if STAMP.exists() and STAMP.read_text() == " ".join(PINS):
        print(f"{TARGET} is up to date")
        return 0
    if not ATARI_PY.exists():
        subprocess.check_call([sys.executable, str(ROOT / "bench" / "setup_atari.py")])
    pip = ["nice", "-n", "15", str(ATARI_PY), "-m", "pip", "install", "-q", "--no-deps"]
    subprocess.check_call([*pip, "--target", str(TARGET), *PINS])
    check = "import envpool, gym, numpy, tyro, torch; print(envpool.__version__, gym.__version__, numpy.__version__)"
    env = {"PYTHONPATH": str(TARGET), "PATH": "/usr/bin:/bin"}
    subprocess.check_call([str(ATARI_PY), "-c", check], env=env)
    STAMP.write_text(" ".join(PINS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
