"""What several test files share: a step-counting test environment, a random InvertedPendulum dataset, a run killed
in the middle of an update, the first critic update checked by hand, and the RLVR tests' tokenizer and prompts.
Imported as `helpers` (pytest puts tests/ on sys.path, as for conftest.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import gymnasium as gym
import numpy as np
import pytest
import torch

from keelrl.networks.char_lm import CharTokenizer

TOKENIZER = CharTokenizer()
PROMPTS = ["3+5=", "12+7-4=", "9=", "sort 3,1="]  # different lengths: left padding is exercised


class CountingEnv(gym.Env):
    """A test environment that counts its steps t (0 at reset): it observes `obs_dim` copies of observe(t) in
    [low, 1], pays reward(t, action) for an action in [-1, 1]^1 and never terminates; it truncates an episode at
    step `length` (never when None; a callable draws each episode's length from the env's np_random at reset)."""

    def __init__(self, obs_dim: int, length: int | Callable[[np.random.Generator], int] | None = None,
                 observe: Callable[[int], float] = lambda t: 0.0,
                 reward: Callable[[int, np.ndarray], float] = lambda t, action: 0.0, low: float = -1.0):
        self.observation_space = gym.spaces.Box(low, 1.0, (obs_dim,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.episode_length, self.observe, self.reward = length, observe, reward

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        drawn = callable(self.episode_length)
        self.length = int(self.episode_length(self.np_random)) if drawn else self.episode_length
        return self.observation(), {}

    def step(self, action):
        self.t += 1
        truncated = self.length is not None and self.t >= self.length
        return self.observation(), float(self.reward(self.t, action)), False, truncated, {}

    def observation(self) -> np.ndarray:
        return np.full(self.observation_space.shape, self.observe(self.t), np.float32)


def first_action(t: int, action: np.ndarray) -> float:
    """A CountingEnv reward: the action itself."""
    return float(action[0])


def random_pendulum_npz(path: Path, steps: int, num_envs: int) -> Path:
    """Writes `steps` transitions of InvertedPendulum-v5 under uniform random actions in [−3, 3] (seed 0) to the
    .npz file `path`, and returns it."""
    from keelrl.benchmarks.make_datasets import collect

    rng = np.random.default_rng(0)
    np.savez(path, **collect("InvertedPendulum-v5", lambda obs: rng.uniform(-3, 3, (len(obs), 1)), steps, num_envs,
                             seed=0))
    return path


def killed_in_call(monkeypatch, owner: type, name: str, at_call: int, start: Callable[[], object]) -> None:
    """Runs start() with owner.<name> raising KeyboardInterrupt (a kill) in its `at_call`-th call, expects that
    interrupt, and undoes the test's monkeypatching."""
    method, calls = getattr(owner, name), []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == at_call:
            raise KeyboardInterrupt
        return method(*args, **kwargs)

    monkeypatch.setattr(owner, name, interrupted)
    with pytest.raises(KeyboardInterrupt):
        start()
    monkeypatch.undo()


def assert_critic_update_then_fit(agent, batch, seed: int, q: torch.Tensor, y: torch.Tensor) -> None:
    """An off-policy agent's first update_critic(batch), drawing from torch's generator seeded `seed` as the by-hand
    target y did, logs the critics' mean of their MSEs against y and the mean of their values q (a network pass in
    float32); 299 more updates on the batch take the loss below a fifth of the first."""
    torch.manual_seed(seed)
    first = agent.update_critic(batch)
    assert first["losses/qf_loss"].item() == pytest.approx(((q - y) ** 2).mean(dim=1).mean().item(), rel=1e-5)
    assert first["losses/qf_values"].item() == pytest.approx(q.mean().item(), rel=1e-5, abs=1e-6)
    losses = [first["losses/qf_loss"].item()] + [agent.update_critic(batch)["losses/qf_loss"].item()
                                                  for _ in range(299)]
    assert losses[-1] < 0.2 * losses[0]
