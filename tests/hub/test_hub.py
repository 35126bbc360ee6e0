"""Sharing agents on the Hugging Face Hub: the package and its model card for real (the card
read back by huggingface_hub's own parsers), the upload and download against a local Hub
(:mod:`tests.hub.fake_hub`, ``HF_ENDPOINT``), the cache and offline use for real. Nothing here
reaches the real Hub."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

hf = pytest.importorskip("huggingface_hub", reason="sharing needs pip install 'rlstash[hub]'")
import huggingface_hub.constants  # noqa: E402, F401 - hf.constants, patched below

pytest.importorskip("imageio_ffmpeg", reason="the replay video needs pip install 'rlstash[video]'")

from huggingface_hub import ModelCard  # noqa: E402
from huggingface_hub.repocard import metadata_load  # noqa: E402
from huggingface_hub.repocard_data import model_index_to_eval_results  # noqa: E402

from rlstash.cli.main import main  # noqa: E402
from rlstash.hub.package import package  # noqa: E402
from rlstash.train.config import TrainConfig  # noqa: E402
from rlstash.train.evaluate import evaluate_run  # noqa: E402
from rlstash.train.loop import train  # noqa: E402
from tests.hub.fake_hub import FakeHub  # noqa: E402
from tests.hub.toy_env import ENV_ID, LENGTH  # noqa: E402
from tests.track.tiny import TINY  # noqa: E402


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trained run on an env that renders without pygame."""
    parent = tmp_path_factory.mktemp("runs")
    cfg = {**TINY, "steps": 128, "eval_every": 64}
    train(TrainConfig(env=ENV_ID, run_dir=str(parent), name="toy", **cfg))
    return parent / "toy"


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A local Hub at HF_ENDPOINT, an empty HF cache, online."""
    with FakeHub() as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        # what huggingface_hub read from HF_ENDPOINT when it was imported, as if set before
        monkeypatch.setattr(hf.constants, "ENDPOINT", server.url)
        template = server.url + "/{repo_id}/resolve/{revision}/{filename}"
        monkeypatch.setattr(hf.constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
        monkeypatch.setenv("HF_TOKEN", "hf_local_test_token")
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setattr(hf.constants, "HF_HUB_OFFLINE", False)
        monkeypatch.chdir(tmp_path)
        yield server


def test_package_and_its_card_as_the_hub_reads_them(run: Path, tmp_path: Path) -> None:
    out = tmp_path / "pkg"
    results = package(run, out, "alice/toy", episodes=3, seed=7)
    files = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    assert files == {
        "README.md", "checkpoint/COMPLETE", "checkpoint/MANIFEST.json", "checkpoint/state.pt",
        "config.json", "results.json", "replay.mp4", "learning_curve.png", "eval.csv",
        "progress.csv",
    }  # fmt: skip
    # the score is the packaged agent's, and the same as the run's own agent
    own = evaluate_run(run, episodes=3, seed=7)["returns"]
    assert results["mean_reward"] == pytest.approx(float(np.mean(own)))
    assert results["std_reward"] == pytest.approx(float(np.std(own)))
    assert json.loads((out / "results.json").read_text())["n_eval_episodes"] == 3
    assert json.loads((out / "config.json").read_text())["env"] == ENV_ID

    card = ModelCard.load(out / "README.md")  # huggingface_hub's parser
    assert card.data.library_name == "rlstash"
    assert card.data.tags[:3] == [ENV_ID, "deep-reinforcement-learning", "reinforcement-learning"]
    meta = metadata_load(out / "README.md")
    name, evals = model_index_to_eval_results(meta["model-index"])
    assert name == "DQN" and len(evals) == 1
    (ev,) = evals
    assert (ev.task_type, ev.dataset_type, ev.dataset_name) == (
        "reinforcement-learning", ENV_ID, ENV_ID,
    )  # fmt: skip
    assert ev.metric_type == "mean_reward"
    assert ev.metric_value == f"{results['mean_reward']:.2f} +/- {results['std_reward']:.2f}"
    assert card.data.eval_results[0].metric_value == ev.metric_value

    import imageio.v2 as imageio

    with imageio.get_reader(out / "replay.mp4") as reader:
        frames = list(reader.iter_data())
    assert len(frames) == LENGTH + 1 and frames[0].shape[:2] == (16, 16)


ROUTES = {
    ("POST", "create"), ("POST", "validate-yaml"), ("POST", "preupload"), ("POST", "commit"),
    ("GET", "revision"), ("GET", "tree"), ("HEAD", "resolve"), ("GET", "resolve"),
}  # fmt: skip


def test_push_pull_and_eval_through_a_local_hub_then_offline(
    run: Path, hub: FakeHub, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    assert main(["push", str(run), "--repo-id", "alice/toy", "--episodes", "2"]) == 0
    said = capsys.readouterr().out
    assert f"{hub.url}/alice/toy" in said and "mean_reward" in said
    ((sha, uploaded),) = hub.repos["alice/toy"].commits
    assert {"README.md", "checkpoint/state.pt", "replay.mp4", "config.json"} <= set(uploaded)

    assert main(["pull", "alice/toy"]) == 0
    path = Path(capsys.readouterr().out.splitlines()[0].split(" (")[0])
    assert path == tmp_path / "hf-cache" / "models--alice--toy" / "snapshots" / sha
    assert (path / "checkpoint" / "state.pt").read_bytes() == uploaded["checkpoint/state.pt"]
    assert (path / "README.md").read_bytes() == uploaded["README.md"]
    downloads = hub.requests.count(("GET", "resolve"))
    assert downloads == len(uploaded)

    assert main(["eval", "hf://alice/toy", "--episodes", "2"]) == 0
    assert "2 episodes, return mean" in capsys.readouterr().out
    assert hub.requests.count(("GET", "resolve")) == downloads  # cached: nothing fetched again
    assert ROUTES <= set(hub.requests) and not hub.unknown, hub.unknown

    hub.close()  # no Hub at all, and offline mode: the cache serves it
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    seen = len(hub.requests)
    assert main(["eval", "hf://alice/toy", "--episodes", "2"]) == 0
    assert "2 episodes, return mean" in capsys.readouterr().out
    assert main(["pull", "hf://alice/toy"]) == 0
    assert len(hub.requests) == seen
    assert main(["pull", "alice/other"]) == 2  # not cached: one line, exit 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not in the Hugging Face cache" in err, err
