#!/usr/bin/env python3
"""Create (or reuse) the benchmark venv ``.venv-bench`` with rlstash and its peers.

    python3 bench/setup_env.py            # idempotent: does nothing when up to date
    python3 bench/setup_env.py --force    # redo every step
    python3 bench/setup_env.py --check    # only verify the peers, exit 1 if one is broken

Only the Python standard library is used here, so it runs on a fresh machine with Python
>= 3.10 (plus a C++ compiler, for the TorchRL extension below). Steps:

1. ``torch==2.13.0`` first (the CPU build lies in this machine's wheel folder; pip finds it),
   so nothing later pulls a multi-GB CUDA build of another torch.
2. The peers, pinned, with a constraint file pinning torch so no peer can replace it:
   torchrl, tensordict, stable-baselines3, cpprb (and ale-py, mujoco for later benchmarks).
3. ``pip install -e <repo>`` (the same constraint; installs no other torch).
4. TorchRL's compiled extension: the torchrl 0.14.1 wheel's ``_torchrl`` binary does not load
   beside torch 2.13.0 ("undefined symbol"), and its prioritized buffer then fails with
   "SumSegmentTreeFp32 is not available". TorchRL publishes no sdist on PyPI, but the wheel
   ships the C++ sources (``torchrl/csrc``); they are compiled here against the installed torch
   with ``torch.utils.cpp_extension`` and the result replaces the wheel's binary.
5. Verification: TensorDictPrioritizedReplayBuffer samples by priority and takes updates,
   cpprb and Stable-Baselines3 buffers work, rlstash imports. What was installed and how the
   TorchRL peer was obtained is written to ``.venv-bench/bench-env.json`` (read by the
   benchmarks for their headers).

A stamp file (hash of the pins, this script's build recipe and pyproject.toml) makes a
second run a no-op apart from a quick check that the extension still loads.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-bench"
TORCH_PIN = "torch==2.13.0"
PEERS = {
    "torchrl": "0.14.1",
    "tensordict": "0.14.3",
    "stable-baselines3": "2.9.2",
    "cpprb": "11.0.0",
    "ale-py": "0.12.1",
    "opencv-python-headless": "5.0.0.93",  # gymnasium AtariPreprocessing (bench/stream.py)
    "mujoco": "4.0.0",
    "imageio": "2.38.1",  # gymnasium's MuJoCo envs (HalfCheetah-v5 in bench/learn.py) import it
    "lz4": "4.4.5",  # rlstash's compressed frames (bench/frames.py)
    "zstandard": "0.25.0",
}
RECIPE = "ext-build-v1"  # bump when the extension build below changes
STAMP = VENV / ".bench-stamp"
INFO = VENV / "bench-env.json"
CONSTRAINTS = VENV / "bench-constraints.txt"

# Compiles torchrl/csrc into torchrl._torchrl against the torch installed beside it.
_BUILD_EXT = r"""
import os, sys
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension
src, out = sys.argv[1], sys.argv[2]
ext = CppExtension(
    "torchrl._torchrl",
    [os.path.join(src, "pybind.cpp"), os.path.join(src, "utils.cpp")],
    extra_compile_args=["-O3"],
)
setup(
    name="torchrl_ext",
    ext_modules=[ext],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=False)},
    script_args=["build_ext", "--build-lib", out, "--build-temp", os.path.join(out, "tmp")],
)
"""

# Exercises every peer the replay benchmark uses; prints a JSON line of versions.
_VERIFY = r"""
import json, os, sys, warnings
warnings.filterwarnings("ignore")
import numpy as np, torch
import torchrl, tensordict, stable_baselines3, cpprb
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictPrioritizedReplayBuffer
import torchrl._torchrl  # the compiled extension must load
rb = TensorDictPrioritizedReplayBuffer(
    alpha=0.6, beta=0.4, storage=LazyTensorStorage(64), batch_size=256)
rb.extend(TensorDict({"x": torch.arange(64.0)}, batch_size=[64]))
td = rb.sample()
assert "priority_weight" in td.keys(), td
prio = torch.full((64,), 1e-6); prio[7] = 1e6
rb.update_priority(torch.arange(64), prio)
share = float((rb.sample()["x"] == 7).float().mean())
assert share > 0.9, f"TorchRL prioritized sampling ignored priorities: share {share}"
from cpprb import PrioritizedReplayBuffer
crb = PrioritizedReplayBuffer(64, {"x": {"shape": 1}}, alpha=0.6)
crb.add(x=np.arange(64.0)[:, None]); s = crb.sample(8, beta=0.4)
crb.update_priorities(s["indexes"], np.ones(8))
from stable_baselines3.common.buffers import ReplayBuffer
import gymnasium as gym
srb = ReplayBuffer(8, gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-1, 1, (2,)), device="cpu")
srb.add(np.zeros(3), np.zeros(3), np.zeros(2), np.zeros(1), np.zeros(1), [{}])
srb.sample(2)
import rlstash
print(json.dumps({
    "python": sys.version.split()[0], "torch": torch.__version__, "numpy": np.__version__,
    "torchrl": torchrl.__version__, "tensordict": tensordict.__version__,
    "stable_baselines3": stable_baselines3.__version__,
    "cpprb": __import__("importlib.metadata").metadata.version("cpprb"),
    "rlstash": rlstash.__version__,
}))
"""


def _python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _log(msg: str) -> None:
    print(f"[setup_env] {msg}", flush=True)


def _run(*args: str, capture: bool = False) -> subprocess.CompletedProcess:
    env = dict(os.environ, RL_WARNINGS="0", PIP_DISABLE_PIP_VERSION_CHECK="1")
    return subprocess.run(
        list(args), check=False, text=True, env=env, capture_output=capture, cwd=ROOT
    )


def _pip(*args: str) -> None:
    proc = _run(str(_python()), "-m", "pip", "install", "-q", *args)
    if proc.returncode != 0:
        sys.exit(f"[setup_env] pip install {' '.join(args)} failed (exit {proc.returncode})")


def _stamp() -> str:
    text = json.dumps([TORCH_PIN, PEERS, RECIPE]).encode() + (ROOT / "pyproject.toml").read_bytes()
    return hashlib.sha256(text).hexdigest()


def _py_ok(code: str) -> tuple[bool, str]:
    proc = _run(str(_python()), "-c", code, capture=True)
    return proc.returncode == 0, (proc.stdout + proc.stderr).strip()


def _torchrl_dir() -> Path:
    ok, out = _py_ok(
        "import importlib.util; "
        "print(importlib.util.find_spec('torchrl').submodule_search_locations[0])"
    )
    if not ok:
        sys.exit(f"[setup_env] cannot locate the torchrl package: {out}")
    return Path(out.splitlines()[-1])


def _compiler() -> str:
    for name in ("c++", "g++", "clang++"):
        path = shutil.which(name)
        if path:
            out = subprocess.run([path, "--version"], capture_output=True, text=True).stdout
            return out.splitlines()[0] if out else name
    sys.exit(
        "[setup_env] no C++ compiler found; TorchRL's extension must be built against the "
        "installed torch. Install one (Debian: apt-get install g++) and run again."
    )


def build_torchrl_extension(reason: str) -> str:
    """Compile the C++ sources shipped in the torchrl wheel; return how the peer was made."""
    pkg = _torchrl_dir()
    src = pkg / "csrc"
    if not (src / "pybind.cpp").exists():
        sys.exit(f"[setup_env] {src} has no pybind.cpp: this torchrl ships no C++ sources")
    compiler = _compiler()
    if not _py_ok("import setuptools")[0]:
        _pip("setuptools")
    _log(f"building torchrl._torchrl from {src} against the installed torch ({compiler})")
    with tempfile.TemporaryDirectory(prefix="torchrl-ext-") as tmp:
        script = Path(tmp) / "build_ext.py"
        script.write_text(_BUILD_EXT)
        proc = _run(str(_python()), str(script), str(src), str(Path(tmp) / "out"), capture=True)
        if proc.returncode != 0:
            sys.exit(f"[setup_env] extension build failed:\n{proc.stdout[-3000:]}{proc.stderr}")
        built = sorted((Path(tmp) / "out" / "torchrl").glob("_torchrl*.so"))
        if not built:
            sys.exit("[setup_env] extension build produced no _torchrl*.so")
        for old in pkg.glob("_torchrl*.so"):
            old.unlink()
        shutil.copy2(built[0], pkg / built[0].name)
    return (
        f"{reason}; rebuilt from the wheel's own C++ sources (torchrl/csrc) against the "
        f"installed torch with {compiler}, -O3"
    )


def ensure_venv(force: bool) -> None:
    """Create the venv and install torch, the peers and rlstash (skipped when stamped)."""
    if sys.version_info < (3, 10):  # noqa: UP036 (this script runs before any venv)
        sys.exit(f"[setup_env] needs Python >= 3.10, this is {sys.version.split()[0]}")
    if not _python().exists():
        _log(f"creating {VENV}")
        venv.EnvBuilder(with_pip=True).create(VENV)
    _log(f"installing {TORCH_PIN} first (CPU build when available)")
    _pip(TORCH_PIN)
    CONSTRAINTS.write_text(TORCH_PIN + "\n")
    peers = [f"{name}=={ver}" for name, ver in PEERS.items()]
    _log(f"installing peers with torch pinned: {' '.join(peers)}")
    _pip("-c", str(CONSTRAINTS), *peers)
    if force:  # restore the wheel's own binary, so the extension check below starts afresh
        _pip("-c", str(CONSTRAINTS), "--force-reinstall", "--no-deps", peers[0])
    _log("installing rlstash (editable) with torch pinned")
    _pip("-c", str(CONSTRAINTS), "-e", str(ROOT))


def ensure_torchrl() -> str:
    """Make ``torchrl._torchrl`` load; return how the extension was obtained."""
    ok, err = _py_ok("import torchrl._torchrl")
    if ok:
        previous = json.loads(INFO.read_text()).get("torchrl_extension") if INFO.exists() else None
        return previous or "the wheel's own binary loads beside the installed torch"
    last = err.splitlines()[-1] if err else "unknown error"
    _log(f"the wheel's torchrl._torchrl does not load: {last[:200]}")
    kind = "undefined symbol" if "undefined symbol" in last else last[:120]
    return build_torchrl_extension(f"the wheel's binary does not load beside this torch ({kind})")


def verify(how: str) -> dict:
    """Exercise every peer; write and return the environment record."""
    ok, out = _py_ok(_VERIFY)
    if not ok:
        sys.exit(f"[setup_env] verification failed:\n{out[-3000:]}")
    info = json.loads(out.splitlines()[-1])
    if not info["torch"].startswith(TORCH_PIN.split("==")[1]):
        sys.exit(f"[setup_env] torch was replaced: {info['torch']} (expected {TORCH_PIN})")
    info["torchrl_extension"] = how
    info["gxx"] = _compiler()
    INFO.write_text(json.dumps(info, indent=1) + "\n")
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--force", action="store_true", help="redo every step")
    parser.add_argument("--check", action="store_true", help="only verify the installed peers")
    args = parser.parse_args(argv)
    if args.check:
        how = json.loads(INFO.read_text())["torchrl_extension"] if INFO.exists() else "unknown"
        info = verify(how)
        _log(f"ok: {json.dumps(info)}")
        return 0
    stamped = STAMP.exists() and STAMP.read_text() == _stamp() and _python().exists()
    if stamped and not args.force and _py_ok("import torchrl._torchrl")[0]:
        _log(f"{VENV} is up to date (delete {STAMP.name} or pass --force to redo)")
        return 0
    STAMP.unlink(missing_ok=True)
    ensure_venv(args.force)
    how = ensure_torchrl()
    info = verify(how)
    STAMP.write_text(_stamp())
    _log(f"ready: {json.dumps(info)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
