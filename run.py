#!/usr/bin/env python3
"""One entry point for a fresh machine: creates and reuses ``.venv``, then runs a job.

    python3 run.py train [rlstash train args...]   # the main job
    python3 run.py test  [pytest args...]          # the test suite (+ the Ray tests, see below)
    python3 run.py docs  [--serve] [--port N]      # the documentation site into site/ (--strict)
    python3 run.py <any rlstash subcommand> ...    # e.g. plan, doctor, eval, bench

Only the Python standard library is used here. Torch is installed first, pinned to the
CPU build (2.13.0) when no torch is present, so pip never pulls a multi-GB CUDA build
to satisfy ``torch>=2.4``. Then the package is installed editable with its ``dev`` extra (and
``plots``, ``atari``, ``video`` and ``docs``: Atari ids and --video work, the site builds, and
their tests run).
The install is redone only when pyproject.toml changes (a stamp file records its hash).

``test`` without a test selection (no path, ``-m`` or ``-k``) then runs the ``ray`` tests a
second time for real: it installs the ``ray`` extra and runs ``pytest -m ray`` inside a network
namespace that has nothing but loopback (``unshare -n``, root only), so Ray never touches a
network. Where that is impossible it prints why and the Ray tests stay skipped.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
TORCH_PIN = "torch==2.13.0"
EXTRAS = "dev,plots,atari,video,docs,hub,minari,wandb,vmas,pettingzoo"


def _python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _stamp() -> str:
    text = (ROOT / "pyproject.toml").read_bytes() + TORCH_PIN.encode() + EXTRAS.encode()
    return hashlib.sha256(text).hexdigest()


def _pip(*args: str) -> None:
    subprocess.check_call([str(_python()), "-m", "pip", "install", "-q", *args])


def _locked(path: Path):
    """An exclusive lock on ``path`` held until the returned file is closed (POSIX ``flock``;
    elsewhere no lock): two ``run.py`` started at once on a fresh checkout must not both
    create ``.venv`` and install into it."""
    handle = open(path, "a")  # noqa: SIM115 - closed by the caller's ``with``
    try:
        import fcntl
    except ImportError:  # Windows
        return handle
    fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
    return handle


def ensure_venv() -> Path:
    """Create ``.venv`` and install the package into it (once per pyproject.toml), under a
    lock so that concurrent runs wait for one install instead of racing it."""
    if sys.version_info < (3, 10):  # noqa: UP036 - run.py runs under any python3
        sys.exit(f"rlstash needs Python >= 3.10, this is {sys.version.split()[0]}")
    py = _python()
    stamp_file = VENV / ".rlstash-stamp"
    if py.exists() and stamp_file.exists() and stamp_file.read_text() == _stamp():
        return py  # the common case: ready, no lock needed
    with _locked(ROOT / ".venv.lock"):
        return _install(py, stamp_file)


def _install(py: Path, stamp_file: Path) -> Path:
    if not py.exists():
        print(f"[run.py] creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    if stamp_file.exists() and stamp_file.read_text() == _stamp():
        return py
    has_torch = subprocess.call([str(py), "-c", "import torch"], stderr=subprocess.DEVNULL) == 0
    if not has_torch:
        print(f"[run.py] installing {TORCH_PIN} (CPU build when available)", flush=True)
        _pip(TORCH_PIN)
    print(f"[run.py] installing rlstash (editable) with extras {EXTRAS}", flush=True)
    _pip("-e", f"{ROOT}[{EXTRAS}]")
    stamp_file.write_text(_stamp())
    return py


def _ray_phase_blocker() -> str | None:
    """Why the Ray tests cannot run in a loopback-only network namespace here (None: they can)."""
    if not sys.platform.startswith("linux"):
        return "they need a Linux network namespace"
    if os.geteuid() != 0:
        return "they run under unshare -n (a loopback-only network namespace), which needs root"
    missing = [tool for tool in ("unshare", "ip") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not found (util-linux, iproute2)"
    if subprocess.call(["unshare", "-n", "true"], stderr=subprocess.DEVNULL) != 0:
        return "unshare -n is not permitted here (a container without CAP_SYS_ADMIN?)"
    return None


def _ensure_ray(py: Path) -> str | None:
    """Install the ``ray`` extra once per pyproject.toml (None: installed, else why not)."""
    stamp_file = VENV / ".rlstash-ray-stamp"
    if stamp_file.exists() and stamp_file.read_text() == _stamp():
        return None
    with _locked(ROOT / ".venv.lock"):  # one install at a time, as in ensure_venv
        if stamp_file.exists() and stamp_file.read_text() == _stamp():
            return None
        print("[run.py] installing the ray extra for the Ray tests", flush=True)
        try:
            _pip("-e", f"{ROOT}[{EXTRAS},ray]")
        except subprocess.CalledProcessError as exc:
            return f"pip could not install the ray extra (exit {exc.returncode})"
        stamp_file.write_text(_stamp())
    return None


def _selects_tests(args: list[str]) -> bool:
    """Whether pytest ``args`` pick tests (a path, ``-m``, ``-k``) rather than only options."""
    return any(a in ("-m", "-k") or os.path.exists(_from_caller(a).split("::")[0]) for a in args)


def run_tests(py: Path, rest: list[str]) -> int:
    """The suite as asked; then, for a whole-suite run, the Ray tests in a loopback-only
    network namespace (or a line saying why not)."""
    args = [str(py), "-m", "pytest", "-q", *(_from_caller(a) for a in rest)]
    os.chdir(ROOT)  # the suite's configuration lives there
    if _selects_tests(rest):
        sys.stdout.flush()
        os.execv(args[0], args)  # as any job: signals reach pytest itself
    code = subprocess.call(args)
    why = _ray_phase_blocker() or _ensure_ray(py)
    if why is not None:
        print(f"[run.py] Ray tests skipped: {why}", flush=True)
        return code
    print("[run.py] Ray tests, in a network namespace with nothing but loopback", flush=True)
    inner = [str(py), "-m", "pytest", "-q", "-m", "ray", "tests/collect", "tests/faults", *rest]
    ray_code = subprocess.call(
        ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *inner]
    )
    return code or ray_code


def _from_caller(arg: str) -> str:
    """A pytest path argument (``file`` or ``file::test``) relative to the caller's directory,
    made absolute (the suite runs in the repository root); anything else unchanged."""
    path = arg.split("::", 1)[0]
    if arg.startswith("-") or not path or os.path.isabs(path) or not os.path.exists(path):
        return arg
    return os.path.abspath(path) + arg[len(path) :]


def run_docs(py: Path, rest: list[str]) -> int:
    """Build the site into ``site/`` with ``mkdocs build --strict`` (any warning fails it) and
    print how long it took; ``--serve`` serves it on 127.0.0.1 instead (``--port``, 8000)."""
    os.chdir(ROOT)  # mkdocs.yml and the hooks' paths are the repository's
    os.environ.setdefault("NO_MKDOCS_2_WARNING", "1")  # Material's banner about its successor
    if "--serve" in rest:
        rest = [a for a in rest if a != "--serve"]
        port = "8000"
        if "--port" in rest:
            i = rest.index("--port")
            port, rest = rest[i + 1], rest[:i] + rest[i + 2 :]
        args = [str(py), "-m", "mkdocs", "serve", "--strict", "-a", f"127.0.0.1:{port}", *rest]
        print(f"[run.py] serving the docs on http://127.0.0.1:{port}/ (Ctrl-C stops)", flush=True)
        os.execv(args[0], args)
    import time

    start = time.monotonic()
    code = subprocess.call([str(py), "-m", "mkdocs", "build", "--strict", "-d", "site", *rest])
    took = time.monotonic() - start
    if code == 0:
        print(f"[run.py] site built in {took:.1f} s: open {ROOT / 'site' / 'index.html'}")
    return code


def main(argv: list[str]) -> int:
    """Run the job. The job replaces this process (``exec``): signals (Ctrl-C, SIGTERM,
    SIGKILL) reach the trainer itself, so none is left running as an orphan, and relative
    paths resolve against the caller's directory."""
    if not argv or argv[0] in {"-h", "--help"}:
        print(__doc__)
        return 0
    py = ensure_venv()
    cmd, rest = argv[0], argv[1:]
    if cmd == "docs":
        return run_docs(py, rest)
    if cmd == "test" and os.name != "nt":
        try:
            return run_tests(py, rest)
        except KeyboardInterrupt:
            return 130
    if cmd == "test":
        args = [str(py), "-m", "pytest", "-q", *(_from_caller(a) for a in rest)]
        os.chdir(ROOT)  # the suite's configuration lives there
    else:
        args = [str(py), "-m", "rlstash", cmd, *rest]
    sys.stdout.flush()
    sys.stderr.flush()
    if os.name == "nt":  # no exec that keeps the process: wait for the child instead
        return subprocess.call(args)
    os.execv(args[0], args)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
