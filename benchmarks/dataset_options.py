"""The options of keelrl.benchmarks.make_datasets (`MakeDatasetsConfig`, what --quick changes) and their checks:
before anything is made (the work directory included), option values no run can use are refused, the environment
must exist and have continuous (Box) actions, and the given files must be readable keelrl SAC files that fit its
observations and actions."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

import gymnasium as gym
import numpy as np
import torch

from keelrl.agents.harness.checkpoints import one_line, read_checkpoint
from keelrl.envs import make_vec_env

DatasetKind = Literal["random", "medium", "medium-replay", "expert", "medium-expert"]
ALL_KINDS: tuple[DatasetKind, ...] = ("random", "medium", "medium-replay", "expert", "medium-expert")
BUFFER_KEYS = ("obs", "next_obs", "actions", "rewards", "terminated", "truncated", "pos", "capacity", "num_envs")
"""what a keelrl replay buffer's buffer.pt holds that medium-replay reads"""

@dataclasses.dataclass
class MakeDatasetsConfig:
    env_id: str = "Hopper-v5"
    """environment to collect in (Hopper-v5, HalfCheetah-v5, Walker2d-v5, or any Box-action env)"""
    datasets: tuple[DatasetKind, ...] = ALL_KINDS
    """which datasets to make"""
    steps: int = 1_000_000
    """transitions in each of the random, medium and expert datasets (D4RL: 1M)"""
    sac_steps: int = 1_000_000
    """SAC training budget of the expert (environment steps)"""
    medium_return: float | None = None
    """evaluation return at which the medium policy is taken (default: a third of D4RL's expert return)"""
    eval_every: int = 10_000
    """SAC steps between evaluations (and checkpoints) while looking for the medium policy"""
    learning_starts: int = 5_000
    """SAC's random steps before learning starts"""
    medium_model: str | None = None
    """an existing keelrl SAC model.pt to use as the medium policy instead of training"""
    medium_buffer: str | None = None
    """the buffer.pt of the run that medium_model comes from (for medium-replay)"""
    expert_model: str | None = None
    """an existing keelrl SAC model.pt to use as the expert instead of training"""
    ref_episodes: int = 100
    """episodes averaged for the random and expert reference returns"""
    num_envs: int = 10
    """parallel environments while collecting"""
    seed: int = 1
    """seed of SAC and of the collection envs"""
    data_path: str | None = None
    """Minari datasets root to write to (default: $MINARI_DATASETS_PATH, else ~/.minari/datasets)"""
    work_dir: str | None = None
    """where the SAC run and finished policies are kept (default: runs/make_datasets/{env_id})"""
    version: int = 0
    """dataset version: ids are keelrl/{env}-{kind}-v{version}"""
    quick: bool = False
    """a quick look (about 3 minutes on 2 cores): random, medium and medium-replay of 10,000 transitions, "medium"
    being SAC after only 10,000 steps whatever its return; ids keelrl/{env}-{kind}-quick-v{version} (options given
    explicitly keep their values)"""
    quiet: bool = False
    """no progress bars"""


QUICK = {"datasets": ("random", "medium", "medium-replay"), "steps": 10_000, "sac_steps": 10_000, "eval_every": 10_000,
         "ref_episodes": 20}
"""What --quick changes (options left at their defaults only); the medium policy is SAC at the end of sac_steps."""


def with_quick(config: MakeDatasetsConfig) -> MakeDatasetsConfig:
    """`config` with --quick's values for the options left at their defaults."""
    defaults = MakeDatasetsConfig()
    return dataclasses.replace(config, **{name: value for name, value in QUICK.items()
                                          if getattr(config, name) == getattr(defaults, name)})


def validate(config: MakeDatasetsConfig) -> None:
    """Refuse option values no run can use, an env without continuous actions, and given files that are not keelrl
    SAC files for it, before anything is made."""
    for name in ("steps", "sac_steps", "eval_every", "ref_episodes", "num_envs"):
        if getattr(config, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(config, name)}.")
    unknown = set(config.datasets) - set(ALL_KINDS)
    if unknown:
        raise ValueError(f"Unknown dataset kind(s) {sorted(unknown)}: choose from {', '.join(ALL_KINDS)}.")
    if config.medium_buffer and not config.medium_model:
        raise ValueError("--medium-buffer belongs to --medium-model: give both.")
    if config.medium_model and not config.medium_buffer and "medium-replay" in config.datasets:
        raise ValueError("medium-replay needs the medium run's replay buffer: give --medium-buffer with "
                         "--medium-model.")
    obs_dim, action_shape = continuous_env(config.env_id)
    for option, path in (("--medium-model", config.medium_model), ("--expert-model", config.expert_model)):
        if path:
            check_sac_model(option, Path(path), config.env_id, obs_dim, action_shape)
    if config.medium_buffer:
        check_medium_buffer(Path(config.medium_buffer), config.env_id, obs_dim, action_shape)


def continuous_env(env_id: str) -> tuple[int, tuple[int, ...]]:
    """The observation size and action shape of `env_id`; an unknown id, or actions that are not a Box, is refused."""
    env = make_vec_env(env_id, num_envs=1, seed=0)  # an unknown id raises one ValueError suggesting close ids
    observations, actions = env.single_observation_space, env.single_action_space
    env.close()
    if not isinstance(actions, gym.spaces.Box):
        raise ValueError(f"--env-id {env_id} has {actions} actions: make_datasets collects with SAC and uniform random "
                         f"actions, which need continuous (Box) actions; give an environment with Box actions, e.g. "
                         f"Hopper-v5.")
    return int(np.prod(observations.shape)), actions.shape


def check_sac_model(option: str, path: Path, env_id: str, obs_dim: int, action_shape: tuple[int, ...]) -> None:
    """Refuse a policy file (--medium-model, --expert-model) that is not a keelrl SAC model.pt taking `env_id`'s
    observations and actions."""
    expected = f"give the model.pt of a keelrl SAC run on {env_id}"
    if not path.is_file():
        raise FileNotFoundError(f"{option} {path}: no such file; {expected}.")
    try:
        state = read_checkpoint(path, algo=None)
    except ValueError as err:  # damaged, or not written by keelrl
        raise ValueError(f"{option} {err} Instead, {expected}.") from None
    if state["algo"] != "sac":
        raise ValueError(f"{option} {path} is a saved {state['algo']!r} agent, not SAC: {expected}.")
    if "networks" not in state:
        raise ValueError(f"{option} {path} is a training checkpoint (what --resume continues from), not a saved "
                         f"agent: {expected}.")
    saved_shape = tuple(state["networks"]["action_low"].shape)
    if (state["obs_dim"], saved_shape) != (obs_dim, action_shape):
        raise ValueError(f"{option} {path} takes {state['obs_dim']}-dimensional observations and actions of shape "
                         f"{saved_shape}, but {env_id} has {obs_dim}-dimensional observations and actions of shape "
                         f"{action_shape}: {expected}.")


def check_medium_buffer(path: Path, env_id: str, obs_dim: int, action_shape: tuple[int, ...]) -> None:
    """Refuse a --medium-buffer that is not the buffer.pt of a single-env keelrl SAC run on `env_id` (read lazily:
    its transitions are not loaded)."""
    expected = f"give the buffer.pt of the one-env keelrl SAC run on {env_id} that --medium-model comes from"
    if not path.is_file():
        raise FileNotFoundError(f"--medium-buffer {path}: no such file; {expected}.")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # torch raises several types for a damaged or foreign file
        raise ValueError(f"--medium-buffer {path} is not a readable keelrl replay buffer: it is damaged, truncated or "
                         f"not written by keelrl ({one_line(err)}); {expected}.") from None
    missing = [key for key in BUFFER_KEYS if not isinstance(state, dict) or key not in state]
    if missing:
        raise ValueError(f"--medium-buffer {path} is not a keelrl replay buffer (it has no {', '.join(missing)}): "
                         f"{expected}.")
    if int(state["num_envs"]) != 1:
        raise ValueError(f"--medium-buffer {path} comes from a run with {int(state['num_envs'])} envs; medium-replay "
                         f"needs one env, whose transitions follow each other: {expected}.")
    saved_obs, saved_shape = int(np.prod(state["obs"].shape[1:])), tuple(state["actions"].shape[1:])
    if (saved_obs, saved_shape) != (obs_dim, action_shape):
        raise ValueError(f"--medium-buffer {path} holds {saved_obs}-dimensional observations and actions of shape "
                         f"{saved_shape}, but {env_id} has {obs_dim}-dimensional observations and actions of shape "
                         f"{action_shape}: {expected}.")
