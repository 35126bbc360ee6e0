#!/usr/bin/env python3
"""Create (or reuse) ``.venv-cleanrl``: where CleanRL's ``ppo_atari_envpool.py`` runs unchanged.

    python3 bench/setup_atari_cleanrl.py          # idempotent (a stamp file)

CleanRL pins ``envpool==0.6.6``, ``gym==0.23.1``, ``numpy==1.24.4`` on Python < 3.11
(requirements/requirements-envpool.txt). This machine has Python 3.11 only, and envpool 0.6.6
has no wheel for it; the oldest envpool with a 3.11 wheel is 0.8.4, so this venv holds
``envpool==0.8.4`` with the gym CleanRL pins (0.23.1, the old 4-tuple step API the script
unpacks) and a numpy 1.x. EnvPool >= 1.0 (``.venv-atari``) cannot run the script: its
``env_type="gym"`` returns a gymnasium pool whose ``num_envs`` the script cannot set.
torch, tyro and tensorboard come from ``.venv-atari`` (``bench/setup_atari.py``), which this
venv sees through a ``.pth`` line after its own site-packages (as ``.venv-puffer`` sees
``.venv``): its own envpool, gym and numpy come first.
"""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-cleanrl"
PINS = ["envpool==0.8.4", "gym==0.23.1", "numpy<2"]
ATARI_VENV = ROOT / ".venv-atari"
STAMP = VENV / ".cleanrl-stamp"


def main() -> int:
    if STAMP.exists() and STAMP.read_text() == " ".join(PINS):
        print(f"{VENV} is up to date")
        return 0
    if not (ATARI_VENV / "bin" / "python").exists():
        subprocess.check_call([sys.executable, str(ROOT / "bench" / "setup_atari.py")])
    if not (VENV / "bin" / "python").exists():
        venv.EnvBuilder(with_pip=True).create(VENV)
    py = str(VENV / "bin" / "python")
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    seen = ATARI_VENV / "lib" / ver / "site-packages"
    line = f"import site; site.addsitedir({str(seen)!r})\n"
    (VENV / "lib" / ver / "site-packages" / "zz_atari_venv.pth").write_text(line)
    pip = ["nice", "-n", "15", py, "-m", "pip", "install", "-q", "--no-deps"]
    subprocess.check_call([*pip, *PINS])
    check = "import envpool, gym, tyro, torch; print('envpool', envpool.__version__, 'gym', gym.__version__)"
    subprocess.check_call([py, "-c", check])
    STAMP.write_text(" ".join(PINS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
