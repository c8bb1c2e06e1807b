"""Running observation and reward normalisers whose state travels with a checkpoint."""

from __future__ import annotations

import numpy as np
import torch


class RunningMeanStd:
    """Mean and variance of a stream of arrays, merged batch by batch (Chan et al.), in float64."""

    def __init__(self, shape: tuple[int, ...] = ()):
        self.mean = np.zeros(shape, np.float64)
        self.var = np.ones(shape, np.float64)
        self.count = 0.0

    def update(self, batch: np.ndarray) -> None:
        """Fold a batch of shape (B, *shape) into the statistics."""
        batch = np.asarray(batch, np.float64)
        batch_count = batch.shape[0]
        if batch_count == 0:
            return
        batch_mean = batch.mean(axis=0)
        batch_var = batch.var(axis=0)
        total = self.count + batch_count
        delta = batch_mean - self.mean
        self.mean = self.mean + delta * (batch_count / total)
        merged_m2 = self.var * self.count + batch_var * batch_count + delta**2 * (self.count * batch_count / total)
        self.var = merged_m2 / total
        self.count = total

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {
            "mean": torch.tensor(self.mean, dtype=torch.float64),
            "var": torch.tensor(self.var, dtype=torch.float64),
            "count": torch.tensor(self.count, dtype=torch.float64),
        }

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.mean = state["mean"].numpy().astype(np.float64)
        self.var = state["var"].numpy().astype(np.float64)
        self.count = float(state["count"])


class ObsNormalizer:
    """(obs − mean) / sqrt(var + eps), clipped; statistics update only while `training` is True."""

    def __init__(self, shape: tuple[int, ...], clip: float = 10.0, eps: float = 1e-8):
        self.rms = RunningMeanStd(shape)
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
        self.rms = RunningMeanStd(())
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
