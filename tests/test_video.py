"""Evaluation videos (issue 14): the episodes a Recorder asks for become MP4 files with one
frame per step plus the reset frame; nothing else is recorded; a missing encoder is a clear
error before anything runs. Skipped with the reason when imageio / imageio-ffmpeg are missing
(``python3 run.py test`` installs them: the ``video`` extra)."""

from __future__ import annotations

import importlib.util

import gymnasium as gym
import numpy as np
import pytest

from rlstash.train import video
from rlstash.train.config import TrainConfig

HAS_VIDEO = all(importlib.util.find_spec(p) for p in video.PACKAGES)
needs_video = pytest.mark.skipif(
    not HAS_VIDEO,
    reason="imageio / imageio-ffmpeg are not installed (pip install 'rlstash[video]')",
)


class Blink(gym.Env):
    """Episodes of ``length`` steps; frame t is a 48x64 image of brightness 20 * t."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(self, length: int = 7, render_mode: str | None = "rgb_array"):
        self.length, self.render_mode, self.t = length, render_mode, 0
        self.observation_space = gym.spaces.Box(0, 1, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(1, np.float32), 1.0, self.t >= self.length, False, {}

    def render(self):
        return np.full((48, 64, 3), min(255, 20 * self.t), np.uint8)


def _read(path) -> np.ndarray:
    import imageio.v2 as imageio

    with imageio.get_reader(path) as reader:
        return np.stack(list(reader.iter_data()))


@needs_video
def test_requested_episodes_become_mp4s_with_every_frame(tmp_path):
    rec = video.Recorder(tmp_path / "videos")
    env = rec.wrap(lambda: Blink(length=7))()
    env.reset(seed=0)  # nothing requested: not recorded
    for _ in range(7):
        env.step(0)
    rec.request("a", "b")
    for _ in range(3):  # two requested episodes, then one more that is not recorded
        env.reset()
        done = False
        while not done:
            done = env.step(0)[2]
    assert [p.name for p in rec.written] == ["a.mp4", "b.mp4"]
    assert sorted(p.name for p in (tmp_path / "videos").iterdir()) == ["a.mp4", "b.mp4"]
    frames = _read(rec.written[0])
    assert frames.shape[:3] == (8, 48, 64)  # reset frame + 7 steps, size kept
    brightness = frames.reshape(8, -1).mean(1)
    np.testing.assert_allclose(brightness, 20 * np.arange(8), atol=3)  # in step order


@needs_video
def test_cancel_drops_requests_and_an_unfinished_episode_writes_nothing(tmp_path):
    rec = video.Recorder(tmp_path)
    env = rec.wrap(lambda: Blink(length=50))()
    rec.request("x", "y")
    env.reset()
    env.step(0)
    rec.cancel()
    env.reset()  # "y" was cancelled, "x" never finished
    env.step(0)
    env.close()
    assert rec.written == [] and not list(tmp_path.glob("*.mp4"))


@needs_video
def test_env_must_render_rgb_arrays(tmp_path):
    rec = video.Recorder(tmp_path)
    with pytest.raises(ValueError, match="render_mode='rgb_array'"):
        rec.wrap(lambda: Blink(render_mode=None))()


def test_missing_encoder_is_refused_before_the_run(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "imageio_ffmpeg" else real(name, *a),
    )
    with pytest.raises(ValueError, match=r"video: needs imageio_ffmpeg .*rlstash\[video\]"):
        video.Recorder(tmp_path)
    from rlstash.train.loop import train

    cfg = TrainConfig(env="CartPole-v1", steps=10, video=True, device="cpu", run_dir=str(tmp_path))
    with pytest.raises(ValueError, match="video: needs imageio_ffmpeg"):
        train(cfg)
    assert not any(tmp_path.iterdir())  # nothing written


@needs_video
@pytest.mark.skipif(
    importlib.util.find_spec("mujoco") is None, reason="mujoco is not installed (rlstash[mujoco])"
)
def test_mujoco_evaluation_video(tmp_path):
    from rlstash.envs.registry import make

    rec = video.Recorder(tmp_path)  # headless: selects EGL rendering
    try:
        probe = make("InvertedPendulum-v5", render_mode="rgb_array")
        probe.reset(seed=0)
        probe.render()
        probe.close()
    except Exception as exc:  # no OpenGL context on this machine (set MUJOCO_GL=egl/osmesa)
        pytest.skip(f"MuJoCo cannot render here: {exc}")
    env = rec.wrap(
        lambda: gym.wrappers.TimeLimit(make("InvertedPendulum-v5", render_mode="rgb_array"), 20)
    )()
    rec.request("mujoco")
    env.reset(seed=0)
    steps, done = 0, False
    while not done:
        _, _, term, trunc, _ = env.step(env.action_space.sample())
        steps, done = steps + 1, term or trunc
    env.close()
    assert len(_read(rec.written[0])) == steps + 1
