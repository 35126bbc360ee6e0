"""run.py, the fresh-machine entry point: concurrent starts share one install."""

from __future__ import annotations

import importlib.util
import threading
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _load_run_py():
    spec = importlib.util.spec_from_file_location("_run_py_under_test", ROOT / "run.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_two_runs_started_at_once_create_and_install_the_venv_once(tmp_path, monkeypatch):
    run = _load_run_py()
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    monkeypatch.setattr(run, "ROOT", tmp_path)
    monkeypatch.setattr(run, "VENV", tmp_path / ".venv")
    events: list[str] = []

    def create(_builder, env_dir):  # slow, like the real one: the race window
        events.append("create")
        time.sleep(0.3)
        (Path(env_dir) / "bin").mkdir(parents=True)
        (Path(env_dir) / "bin" / "python").write_text("")

    def pip(*args):
        events.append("pip " + " ".join(args))
        time.sleep(0.3)

    monkeypatch.setattr(run.venv.EnvBuilder, "create", create)
    monkeypatch.setattr(run, "_pip", pip)
    monkeypatch.setattr(
        run, "subprocess", types.SimpleNamespace(call=lambda *a, **k: 0, DEVNULL=-3)
    )
    results, errors = [], []

    def start():
        try:
            results.append(run.ensure_venv())
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert results == [tmp_path / ".venv" / "bin" / "python"] * 3
    assert events == ["create", f"pip -e {tmp_path}[{run.EXTRAS}]"]  # once, not once per run
    assert (tmp_path / ".venv" / ".rlstash-stamp").read_text() == run._stamp()
