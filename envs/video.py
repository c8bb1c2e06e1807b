"""Videos of a policy: one episode rendered offscreen and written as an MP4 (what --capture-video records).

MuJoCo renders without a display through EGL (Mesa's libEGL works on CPU-only machines) or OSMesa;
`offscreen_gl_backend` picks the first that works here, in a child process, so a missing library cannot
break the process that trains. Writing MP4 needs imageio with its ffmpeg plugin (`pip install 'keelrl[video]'`).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np

GL_BACKENDS = ("egl", "osmesa")
_GL_PROBE = "import mujoco.{0}; c = mujoco.{0}.GLContext(16, 16); c.make_current(); c.free()"


class VideoUnavailable(RuntimeError):
    """Why no video can be recorded on this machine, in one line that says what to install."""


class VideoSource(NamedTuple):
    """What a video films: `make_env()` gives one env with render_mode="rgb_array", `policy` maps one of its
    observations to an action, and the episode is seeded `seed` (evaluation episode 0's seed, so the video
    shows that episode)."""

    make_env: Callable[[], gym.Env]
    policy: Callable[[np.ndarray], Any]
    seed: int


class FilmedEpisode(NamedTuple):
    frames: list[np.ndarray]
    """one (H, W, 3) uint8 frame per step: what the env looked like when the policy acted"""
    episode_return: float
    """undiscounted return of the env's own rewards (before any reward scaling a wrapper applies)"""
    cost: float
    fps: int


@functools.lru_cache(maxsize=None)  # the probe env is made once per env id, not once per video
def render_kwargs(env_id: str) -> dict[str, Any]:
    """gym.make keyword arguments that make `env_id` render rgb_array frames, through the model's "track" camera
    where it has one (the MuJoCo locomotion tasks: the free camera would watch the robot walk out of the picture)."""
    probe = gym.make(env_id)
    model = getattr(probe.unwrapped, "model", None)
    probe.close()
    if model is not None:
        import mujoco

        if mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, "track") >= 0:
            return {"render_mode": "rgb_array", "camera_name": "track"}
    return {"render_mode": "rgb_array"}


def gym_video(env_id: str, act: Callable[[np.ndarray], np.ndarray], seed: int) -> VideoSource:
    """A VideoSource for a gymnasium id and a policy on batches of observations (N, *obs_shape) -> (N, *act)."""
    return VideoSource(lambda: gym.make(env_id, **render_kwargs(env_id)), lambda obs: act(obs[None])[0], seed)


def offscreen_gl_backend() -> str:
    """The OpenGL backend MuJoCo renders with here: $MUJOCO_GL if set, else the first of EGL and OSMesa that
    makes a context (tried in a child process). Sets MUJOCO_GL and PYOPENGL_PLATFORM for this process."""
    chosen = os.environ.get("MUJOCO_GL")
    if chosen is None:
        for backend in GL_BACKENDS:
            probe = subprocess.run([sys.executable, "-c", _GL_PROBE.format(backend)], capture_output=True, timeout=120,
                                   env={**os.environ, "MUJOCO_GL": backend, "PYOPENGL_PLATFORM": backend})
            if probe.returncode == 0:
                chosen = backend
                break
        else:
            raise VideoUnavailable("no OpenGL library for offscreen rendering: install EGL (apt install libegl1 "
                                   "libgl1) or OSMesa (apt install libosmesa6), or set MUJOCO_GL")
        os.environ["MUJOCO_GL"] = chosen
    os.environ.setdefault("PYOPENGL_PLATFORM", chosen)
    return chosen


def film_episode(source: VideoSource) -> FilmedEpisode:
    """Play one episode of `source` and keep a frame per step."""
    env = source.make_env()
    try:
        obs, _ = env.reset(seed=source.seed)
        frames, episode_return, cost, done, info = [], 0.0, 0.0, False, {}
        while not done:
            frames.append(env.render())
            obs, reward, terminated, truncated, info = env.step(source.policy(obs))
            episode_return += float(reward)
            cost += float(info.get("cost", 0.0))
            done = terminated or truncated
        if "episode" in info:  # a reward-scaling wrapper sits above RecordEpisodeStatistics: its raw return
            episode_return = float(np.asarray(info["episode"]["r"]).item())
        fps = int(env.metadata.get("render_fps") or 30)
    finally:
        env.close()
    return FilmedEpisode(frames, episode_return, cost, fps)


def write_mp4(path: Path, frames: list[np.ndarray], fps: int) -> None:
    """H.264 MP4 of `frames` (frame sizes are padded to multiples of 8 by imageio if needed)."""
    try:
        import imageio.v2 as imageio
        import imageio_ffmpeg  # noqa: F401  (imageio's MP4 writer)
    except ImportError:
        raise VideoUnavailable("writing MP4 needs imageio and its ffmpeg plugin: pip install 'keelrl[video]'") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    imageio.mimwrite(path, frames, fps=fps, macro_block_size=8)
