"""Evaluation videos: MP4 files of chosen evaluation episodes (``--video``).

One evaluation env (env 0 of the evaluation envs, made with ``render_mode="rgb_array"``) is
wrapped in :class:`RecordEpisode`; it records nothing until its :class:`Recorder` is asked for
episodes::

    recorder = Recorder(run_dir / "videos")                      # refuses if imageio is missing
    env = recorder.wrap(factory)()         # what make_eval_env does; refuses an env that cannot
                                           # render (its renderer's package missing, e.g. pygame)
    recorder.request("step-00050000")                            # the next episode of env 0 ...
    ... run the evaluation ...                                   # ... is written on its end
    recorder.cancel()                                            # nothing left pending

An episode's video holds the frame after reset and one frame per step (``length + 1``
frames) at the env's ``render_fps`` (Atari: 15, one frame per agent step of 4 frames). Without
a display MuJoCo envs render through EGL (``MUJOCO_GL=egl`` unless set otherwise). Multi-agent VMAS evaluations are recorded the same way (:func:`record_batched`: env 0 of the
batched evaluation env, rendered by VMAS's pyglet renderer; without a display pyglet renders
through EGL, its ``headless`` option, e.g. Mesa's software EGL: ``apt-get install libegl1
libgl1-mesa-dri``). Files
are written with imageio's ffmpeg plugin (``pip install 'rlstash[video]'``), H.264, each
replaced atomically, so a file that exists is complete.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

PACKAGES = ("imageio", "imageio_ffmpeg")


def check_available() -> None:
    """Raise a ValueError naming the fix when imageio, its ffmpeg plugin or the plugin's
    ffmpeg binary is missing (before a run starts; the env's renderer is checked when the
    recorded env is made, :class:`RecordEpisode`)."""
    missing = [p for p in PACKAGES if importlib.util.find_spec(p) is None]
    if missing:
        raise ValueError(
            f"video: needs {' and '.join(missing)} to write MP4 files, not installed; "
            "install them with: pip install 'rlstash[video]' (or drop --video)"
        )
    import imageio_ffmpeg

    try:
        imageio_ffmpeg.get_ffmpeg_exe()
    except RuntimeError as exc:
        raise ValueError(
            f"video: imageio-ffmpeg finds no ffmpeg binary ({' '.join(str(exc).split())}); "
            "reinstall it with: pip install --force-reinstall 'rlstash[video]' (or drop --video)"
        ) from None


class Recorder:
    """Which episodes of the wrapped env to record, and where (module docstring)."""

    def __init__(self, folder: str | Path):
        check_available()
        if not os.environ.get("DISPLAY"):  # headless: MuJoCo renders through EGL, not a window
            os.environ.setdefault("MUJOCO_GL", "egl")
        self.folder = Path(folder)
        self.pending: list[Path] = []
        self.written: list[Path] = []

    def request(self, *names: str) -> None:
        """Record the next ``len(names)`` episodes to ``<folder>/<name>.mp4``."""
        self.pending = [self.folder / f"{name}.mp4" for name in names]

    def cancel(self) -> None:
        """Forget requested episodes that have not started."""
        self.pending = []

    def wrap(self, factory: Callable[[], Any]) -> Callable[[], Any]:
        """An env factory whose env records the episodes this recorder asks for (the env
        must render ``rgb_array`` frames). For in-process envs only (it shares ``self``)."""
        return functools.partial(_recorded, factory, self)


def _recorded(factory: Callable[[], Any], recorder: Recorder) -> RecordEpisode:
    return RecordEpisode(factory(), recorder)


class RecordEpisode(gym.Wrapper):
    """Renders each step of the episodes its recorder requested and writes them as MP4."""

    def __init__(self, env: Any, recorder: Recorder):
        super().__init__(env)
        if env.render_mode != "rgb_array":
            raise ValueError(
                f"env: video recording needs render_mode='rgb_array', got {env.render_mode!r}"
            )
        self.recorder = recorder
        self.path: Path | None = None
        self.frames: list[np.ndarray] = []
        check_renders(env)

    def reset(self, **kwargs: Any) -> tuple[Any, dict]:
        obs, info = self.env.reset(**kwargs)
        self.path, self.frames = None, []
        if self.recorder.pending:
            self.path = self.recorder.pending.pop(0)
            self.frames = [self.env.render()]
        return obs, info

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self.path is not None:
            self.frames.append(self.env.render())
            if terminated or truncated:
                fps = self.env.metadata.get("render_fps") or 30
                self.recorder.written.append(write_mp4(self.path, self.frames, fps))
                self.path, self.frames = None, []
        return obs, reward, terminated, truncated, info


def check_renders(env: Any) -> None:
    """Reset ``env`` and render one frame, so that an env that cannot render is refused when
    it is made (before a run starts), not at the first evaluation: a ValueError naming the env,
    the missing package and its install command (gymnasium's own hint, e.g. ``pip install
    "gymnasium[classic-control]"`` for pygame), or what came instead of an RGB frame."""
    name = env.spec.id if env.spec is not None else type(env.unwrapped).__name__
    env.reset()
    try:
        frame = env.render()
    except (ImportError, gym.error.DependencyNotInstalled) as exc:
        raise ValueError(
            f"video: env {name} cannot render frames: {' '.join(str(exc).split())}; install "
            "it, or drop --video"
        ) from None
    except Exception as exc:  # noqa: BLE001 - a renderer fails in its own ways (GL, EGL)
        raise ValueError(
            f"video: env {name} cannot render frames ({type(exc).__name__}: "
            f"{' '.join(str(exc).split())}); fix its renderer (MuJoCo without a display: "
            "MUJOCO_GL=egl or osmesa), or drop --video"
        ) from None
    shape = None if frame is None else np.shape(frame)
    if shape is None or len(shape) != 3 or shape[2] != 3:
        raise ValueError(
            f"video: env {name} renders {type(frame).__name__} of shape {shape}, not an RGB "
            "frame [H, W, 3]; drop --video"
        )


def headless_gl() -> None:
    """Without a display (no ``DISPLAY``), make pyglet render offscreen through EGL (its
    ``headless`` option; set before pyglet's window module loads, as VMAS loads it lazily)."""
    if os.environ.get("DISPLAY"):
        return
    try:
        import pyglet
    except ImportError:
        return  # the render check names the missing package
    pyglet.options["headless"] = True


class BatchedEpisodes:
    """Records env 0 of a batched multi-agent env that renders its env 0 (``render_frame()``
    -> [H, W, 3] uint8, e.g. :class:`rlstash.envs.vmas.VmasVectorEnv`) for the episodes its
    recorder requests. The env calls :meth:`started` after a reset of env 0 and
    :meth:`stepped` after each step, before it resets ended envs (so the last frame is the
    episode's last state): an episode's video has ``length + 1`` frames."""

    def __init__(self, env: Any, recorder: Recorder, fps: float) -> None:
        self.env, self.recorder, self.fps = env, recorder, fps
        self.path: Path | None = None
        self.frames: list[np.ndarray] = []

    def started(self) -> None:
        """Env 0 begins an episode: record it when one is pending."""
        if self.path is not None and len(self.frames) <= 1:  # reset again before a step
            self.frames = [self.env.render_frame()]
            return
        self.path, self.frames = None, []
        if self.recorder.pending:
            self.path = self.recorder.pending.pop(0)
            self.frames = [self.env.render_frame()]

    def stepped(self, done: Any) -> None:
        """Env 0 stepped (``done``: the [E] env-done flags): add its frame; write the video
        when its episode ended."""
        if self.path is None:
            return
        self.frames.append(self.env.render_frame())
        if bool(done[0]):
            self.recorder.written.append(write_mp4(self.path, self.frames, self.fps))
            self.path, self.frames = None, []


def record_batched(env: Any, recorder: Recorder, name: str) -> Any:
    """``env`` (a batched multi-agent env, ``name`` its id) with its env 0 recorded for
    ``recorder`` (:class:`BatchedEpisodes`); one frame is rendered now, so that a machine that
    cannot render is refused before the run starts, with a one-line ValueError naming the
    fix. An env that cannot render its env 0 (PettingZoo in the process pool) is refused."""
    if not callable(getattr(env, "render_frame", None)):
        raise ValueError(
            f"video: env {name} cannot be recorded (multi-agent videos record VMAS envs, "
            "vmas/<scenario>); drop --video"
        )
    headless_gl()
    why = ""
    try:
        frame = env.render_frame()
    except Exception as exc:  # noqa: BLE001 - pyglet/EGL/GL fail in their own ways
        why = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
    if why:
        _collect_quietly()  # the half-made renderer's destructor fails too: not a 2nd error
        raise ValueError(
            f"video: env {name} cannot render frames on this machine ({why}); without a "
            "display VMAS renders through EGL: install Mesa's EGL (apt-get install libegl1 "
            "libgl1-mesa-dri) or run under xvfb-run, or drop --video"
        )
    shape = np.shape(frame)
    if len(shape) != 3 or shape[2] != 3:
        raise ValueError(
            f"video: env {name} renders {type(frame).__name__} of shape {shape}, not an RGB "
            "frame [H, W, 3]; drop --video"
        )
    env.recording = BatchedEpisodes(env, recorder, env.render_fps)
    return env


def _collect_quietly() -> None:
    """Collect garbage with errors raised in destructors ignored (a renderer that failed to
    start, e.g. pyglet's EGL display, fails again when it is collected)."""
    import gc
    import sys

    hook = sys.unraisablehook
    sys.unraisablehook = lambda _: None
    try:
        gc.collect()
    finally:
        sys.unraisablehook = hook


def write_mp4(path: Path, frames: list[np.ndarray], fps: float) -> Path:
    """Frames [H, W, 3] uint8 -> an H.264 MP4 at ``path``, replaced atomically
    (:func:`rlstash.atomic.write_atomic`: ffmpeg encodes to a scratch file first)."""
    import tempfile

    import imageio.v2 as imageio

    from rlstash.atomic import write_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".video-") as scratch:
        tmp = Path(scratch) / path.name
        # macro_block_size 2: keep the frame size (H.264 only needs even sides; imageio pads)
        with imageio.get_writer(
            tmp, format="FFMPEG", mode="I", fps=fps, codec="libx264", macro_block_size=2
        ) as writer:
            for frame in frames:
                writer.append_data(np.asarray(frame, dtype=np.uint8))
        write_atomic(path, tmp.read_bytes())
    return path
