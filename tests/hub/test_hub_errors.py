"""``rlstash push`` / ``pull`` / ``eval hf://`` refuse bad input with one line, exit 2, and
write nothing: a bad repo id, a missing or empty run directory, the missing extra, a
repository the Hub does not have."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rlstash.cli.main import main


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run" / "checkpoint").mkdir(parents=True)
    (tmp_path / "run" / "checkpoint" / "COMPLETE").write_text("1")  # found, never read here
    return tmp_path


def _one_line(capsys: pytest.CaptureFixture[str], prog: str, *words: str) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"rlstash {prog}: error: "), err
    for word in words:
        assert word in err, err
    return err


@pytest.mark.parametrize("bad", ["nope", "a/b/c", "alice/dqn cartpole", "alice-/x", "a--b/c", "/x"])
def test_bad_repo_ids(here: Path, bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    before = sorted(here.rglob("*"))
    assert main(["push", "run", "--repo-id", bad]) == 2
    _one_line(capsys, "push", "--repo-id", "USER/NAME", repr(bad))
    assert main(["pull", bad]) == 2
    _one_line(capsys, "pull", "repo: expected a Hub repo id")
    assert main(["eval", f"hf://{bad}"]) == 2
    _one_line(capsys, "eval", "run: expected a Hub repo id")
    assert sorted(here.rglob("*")) == before


def test_push_needs_a_repo_id_and_a_run(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["push", "run"]) == 2
    _one_line(capsys, "push", "--repo-id")
    assert main(["push", "nowhere", "--repo-id", "alice/x"]) == 2
    _one_line(capsys, "push", "nowhere is not a directory")
    (here / "empty").mkdir()
    assert main(["push", "empty", "--repo-id", "alice/x"]) == 2
    _one_line(capsys, "push", "no complete checkpoint in empty")


def test_missing_extra_names_the_install(
    here: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import -> ImportError
    for argv in (["push", "run", "--repo-id", "alice/x"], ["pull", "alice/x"],
                 ["eval", "hf://alice/x"]):  # fmt: skip
        assert main(argv) == 2
        _one_line(capsys, argv[0], "pip install 'rlstash[hub]'")


def test_a_repo_the_hub_does_not_have(
    here: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    hf = pytest.importorskip("huggingface_hub", reason="needs pip install 'rlstash[hub]'")
    import huggingface_hub.constants  # noqa: F401 - hf.constants, patched below

    from tests.hub.fake_hub import FakeHub

    with FakeHub() as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setattr(hf.constants, "ENDPOINT", hub.url)
        monkeypatch.setenv("HF_HUB_CACHE", str(here / "hf-cache"))
        monkeypatch.setenv("HF_TOKEN", "hf_local_test_token")
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setattr(hf.constants, "HF_HUB_OFFLINE", False)
        assert main(["pull", "alice/missing"]) == 2
        _one_line(capsys, "pull", "alice/missing is not on the Hub")
        assert main(["eval", "hf://alice/missing"]) == 2
        _one_line(capsys, "eval", "alice/missing is not on the Hub")
        assert ("GET", "revision") in hub.requests and not hub.unknown
