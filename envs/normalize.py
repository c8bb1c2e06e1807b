"""Running statistics, and the observation and reward normalisers of vector envs built on them (their state
travels with a checkpoint)."""

from __future__ import annotations

import numpy as np
import torch


class RunningStats:
    """Running mean and variance of a stream of arrays in float64, kept as (count, mean, m2) with m2 the sum of
    squared deviations from the mean: the statistics under every environment-side normaliser.

    `push(sample)` folds in one sample (Welford 1962, as the stream-x wrappers update); `update(batch)` folds in a
    batch (B, *shape) at once (Chan et al.'s merge, as a vector env updates). `var` is the population variance
    (m2 / count, numpy's `var(0)`, what SB3's VecNormalize divides by), `sample_var` the sample variance
    (m2 / (count − 1), what stream-x divides by); each is 1 until there is a variance to report.
    """

    def __init__(self, shape: tuple[int, ...] = ()):
        self.count = 0
        self.mean = np.zeros(shape, np.float64)
        self.m2 = np.zeros(shape, np.float64)

    def push(self, sample: np.ndarray | float) -> None:
        self.count += 1
        deviation = sample - self.mean
        self.mean += deviation / self.count
        self.m2 += deviation * (sample - self.mean)

    def update(self, batch: np.ndarray) -> None:
        batch = np.asarray(batch, np.float64)
        batch_count = batch.shape[0]
        if batch_count == 0:
            return
        batch_mean = batch.mean(axis=0)
        total = self.count + batch_count
        delta = batch_mean - self.mean
        self.mean = self.mean + delta * (batch_count / total)
        self.m2 = self.m2 + ((batch - batch_mean) ** 2).sum(axis=0) + delta**2 * (self.count * batch_count / total)
        self.count = total

    @property
    def var(self) -> np.ndarray:
        return self.m2 / self.count if self.count > 0 else np.ones_like(self.m2)

    @property
    def sample_var(self) -> np.ndarray:
        return self.m2 / (self.count - 1) if self.count > 1 else np.ones_like(self.m2)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"count": torch.tensor(self.count), "mean": torch.tensor(self.mean, dtype=torch.float64),
                "m2": torch.tensor(self.m2, dtype=torch.float64)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.count = int(state["count"])
        self.mean = state["mean"].numpy().astype(np.float64)
        self.m2 = state["m2"].numpy().astype(np.float64)


class ObsNormalizer:
    """(obs − mean) / sqrt(var + eps), clipped; statistics update only while `training` is True."""

    def __init__(self, shape: tuple[int, ...], clip: float = 10.0, eps: float = 1e-8):
        self.rms = RunningStats(shape)
        self.clip = clip
        self.eps = eps
        self.training = True

    def update(self, obs: np.ndarray) -> None:
        if self.training:
            self.rms.update(obs)

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        scaled = (obs - self.rms.mean) / np.sqrt(self.rms.var + self.eps)
        return np.clip(scaled, -self.clip, self.clip).astype(np.float32)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.rms.state_dict()

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.rms.load_state_dict(state)


class RewardNormalizer:
    """Divides rewards by the running std of the discounted return (as SB3's VecNormalize does)."""

    def __init__(self, num_envs: int, gamma: float = 0.99, clip: float = 10.0, eps: float = 1e-8):
        self.rms = RunningStats(())
        self.returns = np.zeros(num_envs, np.float64)
        self.gamma = gamma
        self.clip = clip
        self.eps = eps
        self.training = True

    def __call__(self, rewards: np.ndarray, dones: np.ndarray) -> np.ndarray:
        if self.training:
            self.returns = self.returns * self.gamma + rewards
            self.rms.update(self.returns)
            self.returns[dones] = 0.0
        scaled = rewards / np.sqrt(self.rms.var + self.eps)
        return np.clip(scaled, -self.clip, self.clip).astype(np.float32)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {**self.rms.state_dict(), "returns": torch.tensor(self.returns, dtype=torch.float64)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.rms.load_state_dict(state)
        self.returns = state["returns"].numpy().astype(np.float64)
