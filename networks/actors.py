"""Policies for continuous actions: tanh-squashed Gaussian (SAC) and deterministic (TD3)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from keelrl.networks.mlp import hidden_layers, mlp

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


class _BoundedActor(nn.Module):
    """Holds the affine map from tanh's (-1, 1) to the action box [low, high]."""

    def __init__(self, action_low: np.ndarray, action_high: np.ndarray):
        super().__init__()
        low = torch.as_tensor(np.asarray(action_low), dtype=torch.float32)
        high = torch.as_tensor(np.asarray(action_high), dtype=torch.float32)
        if not (torch.isfinite(low).all() and torch.isfinite(high).all()):
            raise ValueError("The action space must be bounded (finite low and high) for a tanh-squashed actor.")
        self.register_buffer("action_scale", (high - low) / 2.0)
        self.register_buffer("action_bias", (high + low) / 2.0)


class TanhGaussianActor(_BoundedActor):
    """a = tanh(u) * scale + bias with u ~ N(mean(s), std(s)); log-std squashed into [min, max].

    The trunk is an MLP of `hidden_sizes` and the mean and log-std heads are `nn.Linear`s; SimBa and SimbaV2 give
    their own `trunk` (of hidden_sizes[-1] output features) and `head(in_features, action_dim)`.
    """

    def __init__(
        self,
        obs_dim: int,
        action_low: np.ndarray,
        action_high: np.ndarray,
        hidden_sizes: tuple[int, ...] = (256, 256),
        log_std_min: float = -5.0,
        log_std_max: float = 2.0,
        layer_norm: bool = False,
        *,
        trunk: nn.Module | None = None,
        head: Callable[[int, int], nn.Module] = nn.Linear,
    ):
        super().__init__(action_low, action_high)
        action_dim = self.action_scale.numel()
        self.trunk = hidden_layers(obs_dim, hidden_sizes, layer_norm=layer_norm) if trunk is None else trunk
        self.mean = head(hidden_sizes[-1], action_dim)
        self.log_std = head(hidden_sizes[-1], action_dim)
        self.log_std_min = log_std_min
        self.log_std_max = log_std_max

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.trunk(obs)
        # .float(): under bf16 autocast the heads' products are bfloat16; the distribution's math stays float32
        log_std = torch.tanh(self.log_std(features).float())
        log_std = self.log_std_min + 0.5 * (self.log_std_max - self.log_std_min) * (log_std + 1)
        return self.mean(features).float(), log_std

    def sample(self, obs: torch.Tensor, noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterised action and its log-probability (summed over action dims, shape (B,)); `noise`: the
        standard normal draw (B, A) to use (default: one from torch's generator)."""
        mean, log_std = self(obs)
        noise = torch.randn_like(mean) if noise is None else noise
        squashed = torch.tanh(mean + log_std.exp() * noise)
        gaussian_log_prob = -0.5 * noise.pow(2) - log_std - _HALF_LOG_2PI
        # change of variables through tanh and the affine map; 1e-6 keeps the log finite at |a| = 1
        log_prob = gaussian_log_prob - torch.log(self.action_scale * (1 - squashed.pow(2)) + 1e-6)
        return squashed * self.action_scale + self.action_bias, log_prob.sum(-1)

    def act(self, obs: torch.Tensor, deterministic: bool = False, noise: torch.Tensor | None = None) -> torch.Tensor:
        if deterministic:
            mean, _ = self(obs)
            return torch.tanh(mean) * self.action_scale + self.action_bias
        return self.sample(obs, noise)[0]


class DeterministicActor(_BoundedActor):
    """a = tanh(mlp(s)) * scale + bias; SimBa and SimbaV2 give their own `trunk` (of hidden_sizes[-1] output
    features) and output layer `head(in_features, action_dim)` in place of the MLP."""

    def __init__(
        self,
        obs_dim: int,
        action_low: np.ndarray,
        action_high: np.ndarray,
        hidden_sizes: tuple[int, ...] = (256, 256),
        layer_norm: bool = False,
        *,
        trunk: nn.Module | None = None,
        head: Callable[[int, int], nn.Module] = nn.Linear,
    ):
        super().__init__(action_low, action_high)
        action_dim = self.action_scale.numel()
        if trunk is None:
            self.net = mlp(obs_dim, hidden_sizes, action_dim, layer_norm=layer_norm)
        else:
            self.net = nn.Sequential(trunk, head(hidden_sizes[-1], action_dim))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        # tanh in float32 also under bf16 autocast, as TanhGaussianActor's: a bfloat16 tanh rounds to exactly ±1
        # from |x| ≈ 3.47 (the largest bfloat16 below 1 is 1 − 2⁻⁸), where its gradient 1 − tanh² is then 0
        return torch.tanh(self.net(obs).float()) * self.action_scale + self.action_bias
