"""Evaluating a policy: `play_episodes` rolls it out on fresh seeded envs (every agent's `evaluate` is this on its
own policy), and `Filming` records the first evaluation episode as a video after each evaluation
(--capture-video)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from keelrl.agents.harness.checkpoints import one_line
from keelrl.envs import make_vec_env
from keelrl.envs.video import VideoSource, VideoUnavailable, film_episode, offscreen_gl_backend, write_mp4


def play_episodes(
    policy: Callable[[np.ndarray], np.ndarray],
    env_id: str,
    episodes: int,
    seed: int,
    env_kwargs: dict[str, Any] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Run `episodes` episodes in parallel (one per sub-env) and return their returns and costs.

    `policy` maps a batch of raw observations (episodes, *obs_shape) to
    a batch of actions. Sub-env i is seeded with seed + i.
    """
    env = make_vec_env(env_id, num_envs=episodes, seed=seed, env_kwargs=env_kwargs)
    returns = np.full(episodes, np.nan)
    costs = np.zeros(episodes)
    finished = np.zeros(episodes, bool)
    obs, _ = env.reset()
    while not finished.all():
        obs, _, _, _, info = env.step(policy(obs))
        if "_episode" in info:
            first = info["_episode"] & ~finished
            returns[first] = info["episode"]["return"][first]
            costs[first] = info["episode"]["cost"][first]
            finished |= first
    env.close()
    return returns, costs


class Filming:
    """--capture-video: after each evaluation, an episode of the current policy replayed with the evaluation's
    seed, written as RUN_DIR/videos/step{N}.mp4 with a row of videos/videos.csv (return, cost, length) and a
    frame in TensorBoard. A machine that cannot render offscreen, or a failure later, is said in one line and
    training goes on without video."""

    def __init__(self, video: VideoSource):
        self.video: VideoSource | None = video
        try:
            offscreen_gl_backend()
        except VideoUnavailable as err:
            print(f"--capture-video: {err}; training goes on without video.", file=sys.stderr)
            self.video = None

    def film(self, run_dir: Path, step: int, writer: Any) -> None:
        """Film one episode at `step`; `writer`: the run's TensorBoard SummaryWriter."""
        if self.video is None:
            return
        try:
            episode = film_episode(self.video)
            path = run_dir / "videos" / f"step{step:09d}.mp4"
            write_mp4(path, episode.frames, episode.fps)
        except Exception as err:  # VideoUnavailable, or one of the many types rendering raises without GL
            print(f"--capture-video: no video ({one_line(err)}); training goes on without video.", file=sys.stderr)
            self.video = None
            return
        index = path.parent / "videos.csv"
        new_index = not index.is_file()
        with index.open("a") as f:
            if new_index:
                f.write("global_step,file,return,cost,length\n")
            f.write(f"{step},{path.name},{episode.episode_return},{episode.cost},{len(episode.frames)}\n")
        writer.add_image("eval/video_frame", episode.frames[len(episode.frames) // 2], step, dataformats="HWC")
