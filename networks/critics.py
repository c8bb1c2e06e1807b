"""Q-function ensembles: the twin critics of SAC/TD3 are one batched module, one forward pass."""

from __future__ import annotations

import torch
from torch import nn

from keelrl.networks.mlp import EnsembleMLP, Members


class CriticEnsemble(nn.Module):
    """`num_critics` independent Q(s, a) MLPs in one batched pass: outputs of shape (E, B, num_outputs).

    `num_outputs` is 1 for a scalar critic, the number of bins for a categorical one
    (see networks/heads.py, whose `value` turns the outputs into Q-values (E, B)).
    """

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        hidden_sizes: tuple[int, ...] = (256, 256),
        num_critics: int = 2,
        num_outputs: int = 1,
        layer_norm: bool = False,
    ):
        super().__init__()
        self.num_critics = num_critics
        self.net = EnsembleMLP(num_critics, obs_dim + action_dim, hidden_sizes, num_outputs, layer_norm=layer_norm)

    def forward(self, obs: torch.Tensor, actions: torch.Tensor, members: Members = slice(None)) -> torch.Tensor:
        """Outputs of the chosen critics (all by default): (E', B, num_outputs)."""
        x = torch.cat([obs, actions], dim=-1)  # (B, obs_dim + action_dim)
        return self.net(x, members).float()  # float32 also under bf16 autocast: targets and losses stay float32


def random_members(num_critics: int, size: int | None, device: torch.device | str) -> Members:
    """REDQ's random subset of critics (Chen et al. 2021) as WSRL draws it: `size` member indices uniform over
    0…num_critics−1 *with* replacement, one draw for the whole batch (wsrl/agents/sac.py:236-244 at 891ee35);
    None: every member. Index an ensemble's outputs (E, B, K) with it, or pass it as `members`."""
    if size is None:
        return slice(None)
    return torch.randint(num_critics, (size,), device=device)
