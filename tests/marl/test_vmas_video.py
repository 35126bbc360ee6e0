"""``--video`` for VMAS: ``rlstash train --env vmas/navigation --video`` and ``rlstash eval
--video`` record evaluation episodes of env 0 headless (pyglet through EGL without a display),
``length + 1`` frames each; a machine that cannot render is refused in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vmas", reason="VMAS is an optional extra: pip install 'rlstash[vmas]'")
pytest.importorskip("imageio_ffmpeg", reason="videos need rlstash[video]")

ROOT = Path(__file__).resolve().parents[2]
STEPS = 5  # the episode horizon (max_steps): a video holds STEPS + 1 frames
ARGS = ["--algo", "mappo", "--env", "vmas/navigation", "--envs", "2", "--steps", "20",
        "--env-kwargs", f'{{"max_steps": {STEPS}}}', "--set", "rollout_steps=10",
        "--set", "n_epochs=1", "--set", "minibatch_size=20", "--set", "net_arch=[8]",
        "--eval-every", "20", "--eval-episodes", "1", "--checkpoint-every", "20",
        "--video", "--quiet"]  # fmt: skip


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DISPLAY"}  # headless, as in CI
    return {**env, **extra}


def _frames(path: Path) -> int:
    import imageio.v2 as imageio

    with imageio.get_reader(path, format="FFMPEG") as reader:
        return sum(1 for _ in reader)


def test_train_and_eval_record_vmas_episodes_headless(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "rlstash", "train", "--run-dir", str(tmp_path), "--name", "r"]
    out = subprocess.run(cmd + ARGS, capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env=_env())  # fmt: skip
    if out.returncode == 2 and "cannot render frames on this machine" in out.stderr:
        pytest.skip(f"no EGL renderer here (CI installs libegl1 libgl1-mesa-dri): {out.stderr}")
    assert out.returncode == 0, out.stderr[-3000:]
    videos = sorted((tmp_path / "r" / "videos").glob("*.mp4"))
    assert [v.name for v in videos] == ["step-000000020.mp4"]
    assert _frames(videos[0]) == STEPS + 1
    cmd = [sys.executable, "-m", "rlstash", "eval", str(tmp_path / "r"), "--episodes", "2",
           "--video"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT, env=_env())
    assert out.returncode == 0, out.stderr[-3000:]
    made = sorted((tmp_path / "r" / "videos").glob("eval-*.mp4"))
    assert [v.name for v in made] == ["eval-s12345-0.mp4"]  # 2 episodes on 2 envs: env 0 has 1
    assert _frames(made[0]) == STEPS + 1
    assert f"video: {made[0]}" in out.stdout
    _package_for_the_hub(tmp_path / "r", tmp_path / "pkg")


def _package_for_the_hub(run: Path, out: Path) -> None:
    """``rlstash push``'s package of a multi-agent run: evaluated, a replay video of env 0,
    a card whose metadata huggingface_hub's own parser reads (the upload itself is covered by
    tests/hub against a local endpoint)."""
    hub = pytest.importorskip("huggingface_hub.repocard", reason="pip install 'rlstash[hub]'")
    from rlstash.hub.package import package

    results = package(run, out, repo_id="user/mappo-navigation", episodes=2, video=True)
    assert (results["algo"], results["env_id"], results["n_eval_episodes"]) == (
        "mappo", "vmas/navigation", 2)  # fmt: skip
    assert _frames(out / "replay.mp4") == STEPS + 1
    meta = hub.metadata_load(out / "README.md")
    assert meta["library_name"] == "rlstash" and "mappo" in meta["tags"]
    metric = meta["model-index"][0]["results"][0]["metrics"][0]
    assert metric["value"] == f"{results['mean_reward']:.2f} +/- {results['std_reward']:.2f}"


def test_a_machine_that_cannot_render_is_refused_in_one_line(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "rlstash", "train", "--run-dir", str(tmp_path), "--name", "r"]
    # pyglet's headless option on an EGL device that does not exist: rendering fails
    out = subprocess.run(cmd + ARGS, capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env=_env(PYGLET_HEADLESS_DEVICE="97"))  # fmt: skip
    assert out.returncode == 2, out.stderr[-3000:]
    err = out.stderr.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in out.stderr
    assert "video: env vmas/navigation cannot render frames on this machine" in err[0]
    assert "apt-get install libegl1 libgl1-mesa-dri" in err[0]
    assert not (tmp_path / "r").exists()  # a refused run leaves nothing
