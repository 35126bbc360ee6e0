"""``--env-backend auto|gymnasium|envpool`` (``TrainConfig.env_backend``): which backend
runs, why, refusals with the fix, and ``rlstash train`` on EnvPool recording it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlstash.envs import envpool_env
from rlstash.envs.make import resolve_backend
from rlstash.train.config import SettingError, TrainConfig


def _absent(monkeypatch):
    def missing():
        raise ModuleNotFoundError(
            f"the EnvPool env backend needs the envpool package ({envpool_env.INSTALL_HINT})"
        )

    monkeypatch.setattr(envpool_env, "import_envpool", missing)


def test_gymnasium_is_the_default_and_runs_as_asked():
    assert TrainConfig().env_backend == "gymnasium"
    assert resolve_backend("gymnasium", "ALE/Pong-v5") == ("gymnasium", "asked for")


def test_a_bad_backend_is_refused():
    with pytest.raises(SettingError, match="env_backend"):
        TrainConfig(env_backend="jax")


def test_auto_without_envpool_is_gymnasium_and_says_why(monkeypatch):
    _absent(monkeypatch)
    backend, why = resolve_backend("auto", "CartPole-v1")
    assert backend == "gymnasium" and "pip install 'rlstash[envpool]'" in why


def test_envpool_without_envpool_is_refused_with_the_install_hint(monkeypatch):
    _absent(monkeypatch)
    with pytest.raises(ValueError, match=r"env_backend: .*pip install 'rlstash\[envpool\]'"):
        resolve_backend("envpool", "CartPole-v1")


@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        ({"same_step": True}, "same-step autoreset"),
        ({"history": 4}, "--history"),
        ({"ray": True}, "--ray"),
    ],
)
def test_what_only_gymnasium_gives_keeps_auto_on_gymnasium_and_refuses_envpool(kwargs, why):
    backend, reason = resolve_backend("auto", "CartPole-v1", **kwargs)
    assert backend == "gymnasium" and why in reason
    with pytest.raises(ValueError, match=f"envpool cannot run CartPole-v1 here: .*{why}"):
        resolve_backend("envpool", "CartPole-v1", **kwargs)


def test_batched_ids_stay_on_gymnasium():
    assert resolve_backend("auto", "rlstash/CartPole-v1")[0] == "gymnasium"


def test_auto_picks_envpool_where_it_has_the_id():
    pytest.importorskip("envpool", reason="EnvPool backend: pip install 'rlstash[envpool]'")
    assert resolve_backend("auto", "CartPole-v1")[0] == "envpool"
    assert resolve_backend("auto", "ALE/Pong-v5")[0] == "envpool"
    backend, why = resolve_backend("auto", "Pendulum-v1")  # EnvPool has Pendulum-v1 too
    assert backend == "envpool" or "EnvPool has no" in why
    with pytest.raises(ValueError, match="EnvPool has no env 'NoSuchEnv-v0'"):
        resolve_backend("envpool", "NoSuchEnv-v0")


def test_rlstash_train_on_envpool_records_the_backend(tmp_path: Path, capsys):
    pytest.importorskip("envpool", reason="EnvPool backend: pip install 'rlstash[envpool]'")
    from rlstash import cli

    argv = [
        "train", "--env", "CartPole-v1", "--env-backend", "auto", "--envs", "4",
        "--steps", "256", "--eval-every", "256", "--eval-episodes", "1", "--quiet",
        "--device", "cpu", "--run-dir", str(tmp_path), "--name", "ep",
        "--set", "learning_starts=64", "--set", "batch_size=16",
    ]  # fmt: skip
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    assert "env: CartPole-v1 from envpool (EnvPool has CartPole-v1, EnvPool 1." in out + err
    saved = json.dumps(_config(tmp_path / "ep"))
    assert '"env_backend": "envpool"' in saved


def _config(run: Path) -> dict:
    from rlstash.train import checkpoint

    return checkpoint.load_state(run / "checkpoint")["config"]
