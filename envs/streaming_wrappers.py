"""Wrappers for one (non-vector) gymnasium env that streaming agents learn from, one step at a time,
and the pieces every streaming agent's loop and evaluation share.

- `StreamObsNormalize`: observations standardised by running mean and sample variance (envs/normalize.py RunningStats, Welford updates);
- `StreamRewardScale`: rewards divided by the running std of a discounted-return trace
  u ← γu + r (u restarts at 0 after each episode);
- `TimeFeature`: the fraction of the time limit still ahead, appended to the observation.

`make_stream_env` stacks them; `stream_env_state` / `load_stream_env_state` carry their
statistics (and the return trace) through a checkpoint, and `set_stream_env_training(env, False)`
freezes them, e.g. for evaluation (`stream_episodes`, `stream_returns_and_costs`).
`RequireFinite` stops a run on a NaN or inf from the env; `Transition` is one step as an agent
learns from it; `space_to_dict` / `space_from_dict` keep an action space in a weights-only checkpoint.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch

from keelrl.envs.normalize import RunningStats
from keelrl.envs.vec_env import make_gym_env
from keelrl.envs.video import render_kwargs


class RequireFinite(gym.Wrapper):
    """Raises FloatingPointError when a step is given a NaN or inf action, or returns a NaN or inf reward or
    observation, before the normalisers' statistics take it in."""

    def __init__(self, env: gym.Env, env_id: str):
        super().__init__(env)
        self.env_id = env_id

    def step(self, action):
        if not np.isfinite(action).all():
            raise FloatingPointError(f"The action given to {self.env_id!r} is not finite (NaN or inf): the agent "
                                     f"diverged, not the environment (see losses/* in TensorBoard; a new run with "
                                     f"lower learning rates may not diverge).")
        obs, reward, terminated, truncated, info = self.env.step(action)
        if not (math.isfinite(reward) and np.isfinite(obs).all()):
            raise FloatingPointError(f"Environment {self.env_id!r} returned a non-finite reward or observation "
                                     f"(NaN or inf): fix the environment.")
        return obs, reward, terminated, truncated, info


class StreamObsNormalize(gym.ObservationWrapper):
    """(obs − mean) / sqrt(var + eps) with running Welford statistics, updated by every observation while `training`."""

    state_key = "obs_normalizer"

    def __init__(self, env: gym.Env, eps: float = 1e-8):
        super().__init__(env)
        self.stats = RunningStats(env.observation_space.shape)
        self.eps = eps
        self.training = True
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, env.observation_space.shape, np.float32)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        if self.training:
            self.stats.push(observation)
        return ((observation - self.stats.mean) / np.sqrt(self.stats.sample_var + self.eps)).astype(np.float32)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.stats.state_dict()

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.stats.load_state_dict(state)


class StreamRewardScale(gym.Wrapper):
    """r / sqrt(var(u) + eps), u ← γu + r the discounted-return trace, var its running Welford variance."""

    state_key = "reward_scaler"

    def __init__(self, env: gym.Env, gamma: float, eps: float = 1e-8):
        super().__init__(env)
        self.stats = RunningStats(())
        self.gamma = gamma
        self.eps = eps
        self.return_trace = 0.0
        self.training = True

    @property
    def scale(self) -> float:
        """The current divisor of rewards."""
        return math.sqrt(float(self.stats.sample_var) + self.eps)

    def reset(self, **kwargs):
        self.return_trace = 0.0
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self.training:
            self.return_trace = self.gamma * self.return_trace + reward
            self.stats.push(self.return_trace)
        if terminated or truncated:
            self.return_trace = 0.0
        return obs, reward / self.scale, terminated, truncated, info

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {**self.stats.state_dict(), "return_trace": torch.tensor(self.return_trace, dtype=torch.float64)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.stats.load_state_dict(state)
        self.return_trace = float(state["return_trace"])


class TimeFeature(gym.Wrapper):
    """Appends 1 − t/T (T the env's time limit, t the steps taken this episode) to the observation."""

    def __init__(self, env: gym.Env, max_episode_steps: int):
        super().__init__(env)
        self.max_episode_steps = max_episode_steps
        self.elapsed = 0
        low = np.append(env.observation_space.low, 0.0).astype(np.float32)
        high = np.append(env.observation_space.high, 1.0).astype(np.float32)
        self.observation_space = gym.spaces.Box(low, high, dtype=np.float32)

    def _append(self, obs: np.ndarray) -> np.ndarray:
        return np.append(obs, np.float32(1.0 - self.elapsed / self.max_episode_steps)).astype(np.float32)

    def reset(self, **kwargs):
        self.elapsed = 0
        obs, info = self.env.reset(**kwargs)
        return self._append(obs), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.elapsed += 1
        return self._append(obs), reward, terminated, truncated, info


def make_stream_env(
    env_id: str,
    gamma: float = 0.99,
    normalize_obs: bool = True,
    scale_rewards: bool = True,
    time_feature: bool = True,
    env_kwargs: dict[str, Any] | None = None,
) -> gym.Env:
    """One gymnasium env: a NaN/inf check → episode statistics (raw rewards, `info["episode"]`) →
    actions clipped to the bounds of a Box space (`env.unwrapped.action_space` keeps them) → obs
    normaliser → time feature → reward scaler, each of the last three on when asked for."""
    env = make_gym_env(env_id, **(env_kwargs or {}))
    space = env.observation_space
    if not (isinstance(space, gym.spaces.Box) and len(space.shape) == 1):
        env.close()
        raise ValueError(f"Streaming agents take flat (vector) Box observations; {env_id!r} has {space}.")
    env = gym.wrappers.RecordEpisodeStatistics(RequireFinite(env, env_id))
    if isinstance(env.action_space, gym.spaces.Box):
        env = gym.wrappers.ClipAction(env)  # agents may act outside the bounds (a Gaussian policy does)
    if normalize_obs:
        env = StreamObsNormalize(env)
    if time_feature:
        if env.spec is None or env.spec.max_episode_steps is None:
            env.close()
            raise ValueError(f"{env_id!r} has no time limit, which the time feature needs: pass --no-time-feature "
                             f"(or register the env with max_episode_steps).")
        env = TimeFeature(env, env.spec.max_episode_steps)
    if scale_rewards:
        env = StreamRewardScale(env, gamma)
    return env


def _stateful_wrappers(env: gym.Env) -> list[gym.Wrapper]:
    wrappers = []
    while isinstance(env, gym.Wrapper):
        if hasattr(env, "state_key"):
            wrappers.append(env)
        env = env.env
    return wrappers


def stream_wrapper(env: gym.Env, state_key: str) -> gym.Wrapper | None:
    """The stateful wrapper of `env` saved under `state_key` ("obs_normalizer", "reward_scaler"), if any."""
    return next((w for w in _stateful_wrappers(env) if w.state_key == state_key), None)


def stream_env_state(env: gym.Env) -> dict[str, dict[str, torch.Tensor]]:
    """The normalisers' statistics and the return trace, to save with a checkpoint."""
    return {wrapper.state_key: wrapper.state_dict() for wrapper in _stateful_wrappers(env)}


def load_stream_env_state(env: gym.Env, state: dict[str, dict[str, torch.Tensor]]) -> None:
    """Load what `stream_env_state` saved; every normaliser of `env` must have saved state."""
    for wrapper in _stateful_wrappers(env):
        if wrapper.state_key not in state:
            raise ValueError(f"Saved env state has {sorted(state)} but this env has a {wrapper.state_key}: "
                             f"use the same normalisation flags as the saved run.")
        wrapper.load_state_dict(state[wrapper.state_key])


def stream_env_for(config: Any, env_id: str | None = None, rendering: bool = False) -> gym.Env:
    """`config.env_id` (or `env_id`) behind the wrappers a stream agent's config asks for (its gamma,
    normalize_obs, scale_rewards and time_feature), rendering rgb_array frames for videos when asked."""
    env_id = env_id or config.env_id
    return make_stream_env(env_id, config.gamma, config.normalize_obs, config.scale_rewards, config.time_feature,
                           env_kwargs=render_kwargs(env_id) if rendering else None)


def set_stream_env_training(env: gym.Env, mode: bool) -> None:
    """Update the normalisers' statistics (True) or freeze them (False)."""
    for wrapper in _stateful_wrappers(env):
        wrapper.training = mode


def frozen_stream_env(env: gym.Env, state: dict[str, dict[str, torch.Tensor]]) -> gym.Env:
    """`env` with the streaming wrappers' statistics and return trace of `state` (`stream_env_state`), frozen: the
    env an agent is evaluated or filmed on."""
    load_stream_env_state(env, state)
    set_stream_env_training(env, False)
    return env


class Transition(NamedTuple):
    """One step of experience, as the streaming env returned it (normalised observation, scaled reward)."""

    obs: np.ndarray
    action: np.ndarray | int
    reward: float
    next_obs: np.ndarray
    """the observation the action led to (the true last one when the episode ended)"""
    terminated: bool
    """no bootstrapping from next_obs (a time-limit truncation is not a termination)"""
    episode_end: bool
    """terminated or truncated: traces are reset after this update"""


def space_to_dict(space: gym.Space) -> dict[str, Any]:
    """An action space as tensors and ints (for checkpoints loaded with weights_only)."""
    if isinstance(space, gym.spaces.Discrete):
        return {"n": int(space.n)}
    return {"low": torch.as_tensor(space.low), "high": torch.as_tensor(space.high)}


def space_from_dict(saved: dict[str, Any]) -> gym.Space:
    if "n" in saved:
        return gym.spaces.Discrete(saved["n"])
    return gym.spaces.Box(saved["low"].numpy(), saved["high"].numpy())


def stream_episodes(env: gym.Env, policy: Callable[[np.ndarray], Any], episodes: int, seed: int) -> Iterator[tuple]:
    """Every step (obs, reward, terminated, truncated, info) of `episodes` episodes of `policy` (one
    observation -> its action) on `env` with its statistics frozen; episode i is seeded seed + i.
    `env` is closed at the end."""
    set_stream_env_training(env, False)
    with env:
        for episode in range(episodes):
            obs, _ = env.reset(seed=seed + episode)
            terminated = truncated = False
            while not (terminated or truncated):
                next_obs, reward, terminated, truncated, info = env.step(policy(obs))
                yield obs, reward, terminated, truncated, info
                obs = next_obs


def stream_returns_and_costs(env: gym.Env, policy: Callable[[np.ndarray], Any], episodes: int,
                             seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Undiscounted returns (of the env's own rewards, before scaling) and costs of `stream_episodes`."""
    returns, costs, cost = [], [], 0.0
    for _, _, terminated, truncated, info in stream_episodes(env, policy, episodes, seed):
        cost += info.get("cost", 0.0)
        if terminated or truncated:
            returns.append(float(info["episode"]["r"]))
            costs.append(cost)
            cost = 0.0
    return np.array(returns), np.array(costs)
