"""SimBa (Lee et al. 2024, "SimBa: Simplicity Bias for Scaling Up Parameters in Deep RL"): a residual encoder for actors and critics.

    normalised obs → Linear(in→d, orthogonal) → N × [x + Linear(4d→d)(ReLU(Linear(d→4d)(LayerNorm(x))))] → LayerNorm

The observation normaliser is the agent's `RunningObsNorm` (networks/normalization.py): one set of
statistics shared by actor and critic, updated only on the observations the agent acts on while
training, applied before observations enter these networks as (obs − mean) / sqrt(var + 1e-8),
unclipped, as in the reference code (scale_rl/agents/wrappers/normalization.py). It stays out of the
networks so that actor, critic and target critic never hold diverging copies of the statistics.

Initialisation follows the reference code (github.com/dojeon-ai/SimbaV2, scale_rl/agents/simba):
orthogonal (gain 1) embedding and output layers, He-normal residual-block layers, zero biases.
Defaults: actor d = 128 with 1 block, critic d = 512 with 2 blocks.

The critic is a batched ensemble (one pass for all members, like `CriticEnsemble`) returning
(E, B, num_outputs), so it plugs into any value head of networks/heads.py. The actors subclass
`TanhGaussianActor` / `DeterministicActor` and only replace their networks, so they have the same
methods (`sample`, `act`, ...) and an agent can swap them in.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np
import torch
from torch import nn

from keelrl.networks.actors import DeterministicActor, TanhGaussianActor
from keelrl.networks.mlp import EnsembleLayerNorm, EnsembleLinear

InitFn = Callable[[torch.Tensor], torch.Tensor]
he_normal_: InitFn = partial(nn.init.kaiming_normal_, nonlinearity="relu")


def check_sizes(hidden_dim: int, num_blocks: int, num_members: int | None = None) -> None:
    """Raise a ValueError naming the argument when a network size is unusable."""
    if hidden_dim < 1:
        raise ValueError(f"hidden_dim must be positive, got {hidden_dim}.")
    if num_blocks < 0:
        raise ValueError(f"num_blocks must be zero or more, got {num_blocks}.")
    if num_members is not None and num_members < 1:
        raise ValueError(f"The number of ensemble members (critics) must be positive, got {num_members}.")


def linear(in_features: int, out_features: int, num_members: int | None, init: InitFn) -> nn.Module:
    """`nn.Linear`, or an `EnsembleLinear` of `num_members`, with weights from `init` and zero biases."""
    if num_members is None:
        layer = nn.Linear(in_features, out_features)
        init(layer.weight)
    else:
        layer = EnsembleLinear(num_members, in_features, out_features)
        with torch.no_grad():
            for member_weight in layer.weight:  # (in, out); initialisers expect nn.Linear's (out, in)
                init(member_weight.T)
    nn.init.zeros_(layer.bias)
    return layer


def layer_norm(dim: int, num_members: int | None) -> nn.Module:
    return nn.LayerNorm(dim) if num_members is None else EnsembleLayerNorm(num_members, dim)


class SimbaBlock(nn.Module):
    """Pre-LayerNorm residual MLP block: x + Linear(4d→d)(ReLU(Linear(d→4d)(LayerNorm(x))))."""

    def __init__(self, hidden_dim: int, num_members: int | None = None, expansion: int = 4):
        super().__init__()
        self.mlp = nn.Sequential(
            layer_norm(hidden_dim, num_members),
            linear(hidden_dim, expansion * hidden_dim, num_members, he_normal_),
            nn.ReLU(),
            linear(expansion * hidden_dim, hidden_dim, num_members, he_normal_),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(x)


class SimbaEncoder(nn.Module):
    """Linear embedding, `num_blocks` residual blocks, final LayerNorm: (B, in) -> (B, d).

    With `num_members` set, every layer is a batched ensemble: (B, in) or (E, B, in) -> (E, B, d).
    """

    def __init__(self, in_dim: int, hidden_dim: int, num_blocks: int, num_members: int | None = None):
        super().__init__()
        check_sizes(hidden_dim, num_blocks, num_members)
        self.net = nn.Sequential(
            linear(in_dim, hidden_dim, num_members, nn.init.orthogonal_),
            *(SimbaBlock(hidden_dim, num_members) for _ in range(num_blocks)),
            layer_norm(hidden_dim, num_members),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class StateActionCritic(nn.Module):
    """`num_critics` Q-networks in one batched pass over cat(obs, actions): an ensemble `encoder`, then its `output`
    layer: (obs, actions) -> outputs (E, B, num_outputs)."""

    def __init__(self, encoder: nn.Module, output: nn.Module, num_critics: int):
        super().__init__()
        self.num_critics = num_critics
        self.encoder = encoder
        self.output = output

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        x = torch.cat([obs, actions], dim=-1)  # (B, obs_dim + action_dim)
        return self.output(self.encoder(x)).float()  # (E, B, num_outputs), float32 also under bf16 autocast


class SimbaCritic(StateActionCritic):
    """`num_critics` SimBa Q-networks in one batched pass: (obs, actions) -> outputs (E, B, num_outputs).

    Use `num_outputs = head.num_outputs` for a value head of networks/heads.py
    (1 for `ScalarHead`, the number of bins for categorical heads).
    """

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        hidden_dim: int = 512,
        num_blocks: int = 2,
        num_critics: int = 2,
        num_outputs: int = 1,
    ):
        super().__init__(SimbaEncoder(obs_dim + action_dim, hidden_dim, num_blocks, num_members=num_critics),
                         linear(hidden_dim, num_outputs, num_critics, nn.init.orthogonal_), num_critics)


orthogonal_linear = partial(linear, num_members=None, init=nn.init.orthogonal_)
"""(in_features, out_features) -> an nn.Linear with orthogonal weights and zero biases: SimBa's output layers"""


class SimbaActor(TanhGaussianActor):
    """`TanhGaussianActor` on a SimBa trunk (defaults d = 128, 1 block, log-std in [−10, 2] as in the reference)."""

    def __init__(
        self,
        obs_dim: int,
        action_low: np.ndarray,
        action_high: np.ndarray,
        hidden_dim: int = 128,
        num_blocks: int = 1,
        log_std_min: float = -10.0,
        log_std_max: float = 2.0,
    ):
        super().__init__(obs_dim, action_low, action_high, (hidden_dim,), log_std_min, log_std_max,
                         trunk=SimbaEncoder(obs_dim, hidden_dim, num_blocks), head=orthogonal_linear)


class SimbaDeterministicActor(DeterministicActor):
    """`DeterministicActor` (TD3) on a SimBa trunk: a = tanh(Linear(encoder(s))) * scale + bias."""

    def __init__(
        self,
        obs_dim: int,
        action_low: np.ndarray,
        action_high: np.ndarray,
        hidden_dim: int = 128,
        num_blocks: int = 1,
    ):
        super().__init__(obs_dim, action_low, action_high, (hidden_dim,),
                         trunk=SimbaEncoder(obs_dim, hidden_dim, num_blocks), head=orthogonal_linear)
