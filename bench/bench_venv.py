"""Re-execute a benchmark script under ``.venv-bench`` (stdlib only: runs before any peer or
third-party import is possible)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENV_PY = HERE.parent / ".venv-bench" / "bin" / "python"


def ensure_bench_venv(script: str) -> None:
    """Return when running in ``.venv-bench``; else set it up if missing (bench/setup_env.py)
    and replace this process with ``script`` run by its interpreter, same arguments."""
    if Path(sys.prefix).resolve() == VENV_PY.parent.parent.resolve():
        return
    if not VENV_PY.exists():
        subprocess.check_call([sys.executable, str(HERE / "setup_env.py")])
    os.execv(str(VENV_PY), [str(VENV_PY), str(Path(script).resolve()), *sys.argv[1:]])
