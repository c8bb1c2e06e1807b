"""Evaluate a saved agent: a run directory or a model.pt of any keelrl agent that acts in an environment.

Run:  python -m keelrl.evaluate runs/Hopper-v5__sac__1__1795250000 --episodes 10
      python -m keelrl.evaluate path/to/model.pt --env-id Hopper-v5 --stochastic --capture-video
Import: from keelrl.evaluate import EvaluateConfig, evaluate_saved

Prints the mean ± std return (and cost, on an env that reports one) over the episodes and writes one row per
episode to a CSV (default: evaluation.csv beside the model). Episode i is seeded seed + i, as the `evaluate()` of the agent's
module seeds them, so this command and that function give the same returns for the same seed. With
--capture-video the first episode is also written as an MP4 under videos/ beside the model.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import gymnasium as gym
import numpy as np
import tyro

from keelrl.agents.harness.checkpoints import MODEL_FILE, one_line, read_checkpoint, restoring
from keelrl.agents.harness.options import parse_command_line
from keelrl.agents.harness.run_directory import DATASET_FILE
from keelrl.agents.registry import agent_class, agent_module
from keelrl.envs.safety import reports_cost
from keelrl.envs.streaming_wrappers import frozen_stream_env, stream_env_for
from keelrl.envs.vec_env import make_gym_env
from keelrl.envs.video import (
    VideoSource,
    VideoUnavailable,
    film_episode,
    gym_video,
    offscreen_gl_backend,
    write_mp4,
)

STREAMING = ("stream_td", "stream_q", "stream_ac")


@dataclasses.dataclass
class EvaluateConfig:
    path: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="RUN_DIR_OR_MODEL")]
    """a run directory (its model.pt is evaluated) or a model.pt of a keelrl agent"""
    episodes: int = 10
    """episodes to play"""
    seed: int = 0
    """episode i is seeded seed + i"""
    stochastic: bool = False
    """sample actions from the policy instead of playing its deterministic action"""
    env_id: str | None = None
    """environment (default: the one the agent trained on, or its dataset's)"""
    capture_video: bool = False
    """also film the first episode: videos/evaluate_{env}_seed{seed}.mp4 beside the model"""
    csv: str | None = None
    """where to write one row per episode (default: evaluation.csv beside the model)"""


@dataclasses.dataclass
class Evaluation:
    """What `evaluate_saved` returns."""

    algo: str
    env_id: str
    returns: np.ndarray
    costs: np.ndarray | None
    """each episode's cost; None on an env that reports no cost"""
    csv_path: Path
    video_path: Path | None
    policy: str = "deterministic policy"
    """what acted: the agent's deterministic or stochastic policy, or the fixed policy a stream TD run evaluates"""


def model_path(path: str) -> Path:
    """The model.pt a path names: the file itself, or RUN_DIR/model.pt."""
    given = Path(path)
    if given.is_dir():
        if not (given / MODEL_FILE).is_file():
            raise FileNotFoundError(f"{given} has no {MODEL_FILE}: the run has not finished (resume it with "
                                    f"--resume {given}), or it is not a keelrl run directory.")
        return given / MODEL_FILE
    if not given.is_file():
        raise FileNotFoundError(f"No run directory or model file at {given}.")
    return given


def check_options(config: EvaluateConfig) -> None:
    """Refuse option values no evaluation can use, before anything is loaded."""
    if config.episodes < 1:
        raise ValueError(f"--episodes must be positive, got {config.episodes}.")
    if config.seed < 0:
        raise ValueError(f"--seed must be non-negative (gymnasium refuses negative seeds), got {config.seed}.")


def csv_path(config: EvaluateConfig, model: Path) -> Path:
    """Where the episodes go: --csv, else evaluation.csv beside the model; a directory, or a file in a directory
    that does not exist, is refused before any episode is played."""
    if not config.csv:
        return model.parent / "evaluation.csv"
    path = Path(config.csv)
    if path.is_dir():
        raise ValueError(f"--csv {path} is a directory: name a file, e.g. --csv {path / 'evaluation.csv'}.")
    if not path.parent.is_dir():
        raise ValueError(f"--csv {path}: the directory {path.parent} does not exist; create it or name a file "
                         f"in an existing directory.")
    return path


def check_saved_agent(state: dict[str, Any], model: Path) -> None:
    """Refuse a checkpoint that is not a saved agent, e.g. a run's training checkpoint."""
    if "config" in state:
        return
    if "global_step" in state:
        raise ValueError(f"{model} is a training checkpoint (what --resume continues from), not a saved agent: "
                         f"pass the run directory ({model.parent}) or its {MODEL_FILE}.")
    raise ValueError(f"{model} is not a saved keelrl agent (no 'config' entry): pass a run directory or its "
                     f"{MODEL_FILE}.")


def saved_env_id(state: dict[str, Any], model: Path) -> str | None:
    """The env the saved agent acts in: its config's env_id, else the run's DATASET_FILE (offline agents)."""
    env_id = state["config"].get("env_id")
    dataset_summary = model.parent / DATASET_FILE
    if env_id is None and dataset_summary.is_file():
        env_id = json.loads(dataset_summary.read_text()).get("env_id")
    return env_id


def saved_action_space(agent: Any) -> gym.Space | None:
    """The action space the saved agent acts in: a streaming agent's own, else the Box of its action bounds."""
    if hasattr(agent, "action_space"):
        return agent.action_space
    if hasattr(agent, "action_low"):
        return gym.spaces.Box(agent.action_low.cpu().numpy(), agent.action_high.cpu().numpy())
    return None


def same_kind(space: gym.Space, saved: gym.Space) -> bool:
    """Both Discrete with as many actions, or both Box of one shape (the bounds may differ)."""
    if isinstance(saved, gym.spaces.Discrete):
        return isinstance(space, gym.spaces.Discrete) and space.n == saved.n
    return isinstance(space, gym.spaces.Box) and space.shape == saved.shape


def check_env(agent: Any, env_id: str, algo: str) -> None:
    """Refuse an unknown env id, and an env whose observations or actions are not those the saved networks take."""
    if algo in STREAMING:
        env = stream_env_for(agent.config, env_id)  # the streaming wrappers may add a time feature
    else:
        env = make_gym_env(env_id)
    shape, actions = env.observation_space.shape, env.unwrapped.action_space  # unwrapped: before ClipAction
    env.close()
    expected, saved = getattr(agent, "obs_dim", None), saved_action_space(agent)
    size = None if shape is None else int(np.prod(shape))
    if expected is not None and size != expected:
        given = env.observation_space if size is None else f"{size}-dimensional"
        raise ValueError(f"{env_id} gives {given} observations, but the saved {algo} agent takes "
                         f"{expected}: evaluate it on the environment it was trained for.")
    if saved is not None and not same_kind(actions, saved):
        raise ValueError(f"{env_id} has {actions} actions, but the saved {algo} agent acts with {saved}: evaluate "
                         f"it on the environment it was trained for.")


def video_source(agent: Any, algo: str, env_id: str, config: EvaluateConfig) -> VideoSource:
    act = agent.act
    if algo in STREAMING:
        return VideoSource(lambda: frozen_stream_env(stream_env_for(agent.config, env_id, rendering=True),
                                                     agent.env_state),
                           lambda obs: act(obs, deterministic=not config.stochastic), config.seed)
    return gym_video(env_id, lambda obs: act(obs, deterministic=not config.stochastic), config.seed)


def evaluate_saved(config: EvaluateConfig) -> Evaluation:
    """Load the saved agent, play `episodes` episodes, write the CSV (and the video)."""
    check_options(config)
    model = model_path(config.path)
    csv_file = csv_path(config, model)
    state = read_checkpoint(model, algo=None)
    check_saved_agent(state, model)
    algo = state["algo"]
    agent_module(algo)  # an algorithm keelrl does not have is refused here
    if algo == "grpo":
        raise ValueError(f"{model} is a GRPO language model: it has no environment to play; evaluate it with "
                         f"keelrl.agents.grpo.heldout_metrics on a task's held-out prompts.")
    env_id = config.env_id or saved_env_id(state, model)
    if env_id is None:
        raise ValueError(f"{model} does not say which environment it acts in: give --env-id.")
    with restoring(model):
        agent = agent_class(algo).load(model)
    check_env(agent, env_id, algo)
    returns, costs = agent_module(algo).evaluate(agent, env_id, config.episodes, config.seed,
                                                 deterministic=not config.stochastic)
    if not reports_cost(env_id):  # zeros would read as a perfectly safe agent
        costs = None
    write_csv(csv_file, config.seed, returns, costs)
    video_path = film(agent, algo, env_id, config, model, csv_file) if config.capture_video else None
    return Evaluation(algo, env_id, returns, costs, csv_file, video_path, policy_played(agent, algo, config))


def policy_played(agent: Any, algo: str, config: EvaluateConfig) -> str:
    """What acted in the episodes, as the evaluation's summary line says it."""
    if algo == "stream_td":  # it learns the value of a policy it does not change: that policy plays
        return "uniform random policy" if agent.policy is None else f"{agent.policy.algo} model's deterministic policy"
    return "stochastic policy" if config.stochastic else "deterministic policy"


def film(agent: Any, algo: str, env_id: str, config: EvaluateConfig, model: Path, csv_file: Path) -> Path:
    """Film the first episode into videos/ beside the model; an env that cannot render here raises VideoUnavailable."""
    offscreen_gl_backend()
    try:
        episode = film_episode(video_source(agent, algo, env_id, config))
    except Exception as err:  # gymnasium's DependencyNotInstalled, MuJoCo's FatalError: the many ways rendering fails
        raise VideoUnavailable(f"--capture-video: {env_id} cannot render here ({one_line(err)}); the episodes are "
                               f"written to {csv_file}.") from None
    video_path = model.parent / "videos" / f"evaluate_{env_id.replace('/', '_')}_seed{config.seed}.mp4"
    write_mp4(video_path, episode.frames, episode.fps)
    return video_path


def write_csv(path: Path, seed: int, returns: np.ndarray, costs: np.ndarray | None) -> None:
    """One row per episode: episode, seed, return, and cost where the env reports one."""
    columns = {"return": returns} if costs is None else {"return": returns, "cost": costs}
    try:
        with path.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["episode", "seed", *columns])
            writer.writerows([i, seed + i, *(float(values[i]) for values in columns.values())]
                             for i in range(len(returns)))
    except OSError as err:
        raise ValueError(f"Cannot write {path} ({err.strerror}): give --csv a file in a directory you can "
                         f"write to.") from None


def main(args: list[str] | None = None) -> int:
    config = parse_command_line(EvaluateConfig, args=args)
    try:
        result = evaluate_saved(config)
    except (ValueError, FileNotFoundError, VideoUnavailable) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{result.algo} on {result.env_id}, {len(result.returns)} episodes ({result.policy}, seeds {config.seed}"
          f"-{config.seed + len(result.returns) - 1}): return {result.returns.mean():.1f} ± {result.returns.std():.1f}"
          + ("" if result.costs is None else f", cost {result.costs.mean():.1f} ± {result.costs.std():.1f}"))
    print(f"episodes written to {result.csv_path}" + (f"; video {result.video_path}" if result.video_path else ""))
    return 0
