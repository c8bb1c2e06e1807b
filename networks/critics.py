"""Q-function ensembles: the twin critics of SAC/TD3 are one batched module, one forward pass."""

from __future__ import annotations

import torch
from torch import nn

from keelrl.networks.mlp import EnsembleMLP


class CriticEnsemble(nn.Module):
    """`num_critics` independent Q(s, a) MLPs; forward returns Q-values of shape (E, B)."""

    def __init__(self, obs_dim: int, action_dim: int, hidden_sizes: tuple[int, ...] = (256, 256), num_critics: int = 2):
        super().__init__()
        self.num_critics = num_critics
        self.net = EnsembleMLP(num_critics, obs_dim + action_dim, hidden_sizes, 1)

    def forward(self, obs: torch.Tensor, actions: torch.Tensor, members: slice = slice(None)) -> torch.Tensor:
        """Q-values of the chosen critics (all by default): (E', B)."""
        x = torch.cat([obs, actions], dim=-1)  # (B, obs_dim + action_dim)
        return self.net(x, members).squeeze(-1)  # (E', B, 1) -> (E', B)
