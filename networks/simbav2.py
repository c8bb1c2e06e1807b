"""SimbaV2: SimBa with weights and features kept on the unit hypersphere.

Lee et al. 2025, "Hyperspherical Normalization for Scalable Deep Reinforcement Learning" (ICML,
arXiv:2502.15280). Structure and defaults follow the authors' code, github.com/dojeon-ai/SimbaV2
(scale_rl/agents/simbaV2/simbaV2_layer.py, configs/agent/simbaV2.yaml):

- `HyperLinear`: bias-free, orthogonally initialised, each weight row (one per output unit) on the
  unit sphere; the agent restores that after every optimiser step with `project_weights()`
  (target networks, Polyak averages of projected weights, are left as they are).
- `Scaler`: a learnable per-feature multiplier whose parameter starts at `scale` and is multiplied
  by init/scale in the forward pass, so the effective multiplier starts at `init` while Adam's
  steps are sized relative to `scale`. Hidden scalers use init = scale = sqrt(2/width).
- Embedding: append the constant 3.0 to the (normalised) input, l2-normalise, HyperLinear,
  Scaler, l2-normalise; the constant keeps the input's magnitude after normalising.
- Block: h ← l2norm(h + α ⊙ (mlp(h) − h)) with mlp = l2norm(HyperLinear(4d→d)(ReLU(Scaler(HyperLinear(d→4d)(h))) + 1e-8))
  and α a Scaler with init 1/(num_blocks + 1), scale 1/sqrt(d).
- Output: HyperLinear(d→d), Scaler (init 1), HyperLinear(d→out), plus a zero-initialised bias
  (the one bias in the network, not projected). The critic's outputs are logits over 101 atoms
  on [−5, 5] (use `C51Head`); actors use log-std in [−10, 2].
- Defaults: actor d = 128 with 1 block, critic d = 512 with 2 blocks.

Observations are normalised by the agent's `RunningObsNorm` before they enter these networks,
and rewards by `RewardScaler` (networks/normalization.py).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from keelrl.networks.actors import DeterministicActor, TanhGaussianActor
from keelrl.networks.simba import StateActionCritic, check_sizes

EPS = 1e-8


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    """Scale the last dim to unit l2 norm."""
    return x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(EPS)


@torch.no_grad()
def project_weight_rows_(module: nn.Module) -> None:
    """Rescale every row of every `HyperLinear` weight in `module` to unit l2 norm, in place.

    One norm per weight, then two foreach kernels (clamp, divide) over all of them.
    """
    weights = [layer.weight for layer in module.modules() if isinstance(layer, HyperLinear)]
    norms = [torch.linalg.vector_norm(weight, dim=-1, keepdim=True) for weight in weights]
    torch._foreach_clamp_min_(norms, EPS)
    torch._foreach_div_(weights, norms)


class HyperLinear(nn.Module):
    """Bias-free linear layer with unit-norm weight rows: (B, in) -> (B, out).

    With `num_members` set it is a batched ensemble, weight (E, out, in):
    (B, in) or (E, B, in) -> (E, B, out).
    """

    def __init__(self, in_features: int, out_features: int, num_members: int | None = None):
        super().__init__()
        shape = (out_features, in_features) if num_members is None else (num_members, out_features, in_features)
        self.weight = nn.Parameter(torch.empty(shape))
        with torch.no_grad():
            for matrix in self.weight.view(-1, out_features, in_features):  # one orthogonal matrix per member
                nn.init.orthogonal_(matrix)
        project_weight_rows_(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight.dim() == 2:
            return F.linear(x, self.weight)
        return torch.matmul(x, self.weight.mT)  # (B, in) or (E, B, in) @ (E, in, out) -> (E, B, out)

    def extra_repr(self) -> str:
        *members, fan_out, fan_in = self.weight.shape
        prefix = f"num_members={members[0]}, " if members else ""
        return f"{prefix}in_features={fan_in}, out_features={fan_out}"


class Scaler(nn.Module):
    """x ⊙ s with a learnable per-feature s; the parameter starts at `scale`, the effective s at `init`."""

    def __init__(self, dim: int, init: float, scale: float, num_members: int | None = None):
        super().__init__()
        shape = (dim,) if num_members is None else (num_members, 1, dim)
        self.scaler = nn.Parameter(torch.full(shape, float(scale)))
        self.forward_multiplier = init / scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * (self.scaler * self.forward_multiplier)


class HyperEmbedding(nn.Module):
    """Append the constant `c_shift`, l2-normalise, project to d, scale, l2-normalise: (..., in) -> (..., d)."""

    def __init__(self, in_dim: int, hidden_dim: int, c_shift: float, num_members: int | None = None):
        super().__init__()
        self.c_shift = c_shift
        self.linear = HyperLinear(in_dim + 1, hidden_dim, num_members)
        self.scaler = Scaler(hidden_dim, math.sqrt(2 / hidden_dim), math.sqrt(2 / hidden_dim), num_members)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shift = x.new_full((*x.shape[:-1], 1), self.c_shift)
        x = l2_normalize(torch.cat([x, shift], dim=-1))  # (..., in + 1)
        return l2_normalize(self.scaler(self.linear(x)))


class HyperLerpBlock(nn.Module):
    """h ← l2norm(h + α ⊙ (mlp(h) − h)), with mlp's output on the unit sphere too."""

    def __init__(self, hidden_dim: int, alpha_init: float, num_members: int | None = None, expansion: int = 4):
        super().__init__()
        width = expansion * hidden_dim
        self.up = HyperLinear(hidden_dim, width, num_members)
        self.up_scaler = Scaler(width, math.sqrt(2 / width), math.sqrt(2 / width), num_members)
        self.down = HyperLinear(width, hidden_dim, num_members)
        self.alpha = Scaler(hidden_dim, alpha_init, 1 / math.sqrt(hidden_dim), num_members)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        hidden = F.relu(self.up_scaler(self.up(h))) + EPS  # EPS keeps an all-zero vector off l2_normalize
        update = l2_normalize(self.down(hidden))
        return l2_normalize(h + self.alpha(update - h))


class SimbaV2Encoder(nn.Module):
    """Hyperspherical embedding and `num_blocks` LERP blocks: (B, in) -> unit-norm features (B, d).

    With `num_members` set, every layer is a batched ensemble: (B, in) or (E, B, in) -> (E, B, d).
    """

    def __init__(
        self, in_dim: int, hidden_dim: int, num_blocks: int, num_members: int | None = None, c_shift: float = 3.0
    ):
        super().__init__()
        check_sizes(hidden_dim, num_blocks, num_members)
        alpha_init = 1 / (num_blocks + 1)
        self.net = nn.Sequential(
            HyperEmbedding(in_dim, hidden_dim, c_shift, num_members),
            *(HyperLerpBlock(hidden_dim, alpha_init, num_members) for _ in range(num_blocks)),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class HyperPredictor(nn.Module):
    """Output layers: HyperLinear(d→d), Scaler (init 1), HyperLinear(d→out) + bias: (..., d) -> (..., out)."""

    def __init__(self, hidden_dim: int, out_dim: int, num_members: int | None = None):
        super().__init__()
        self.net = nn.Sequential(
            HyperLinear(hidden_dim, hidden_dim, num_members),
            Scaler(hidden_dim, 1.0, 1.0, num_members),
            HyperLinear(hidden_dim, out_dim, num_members),
        )
        self.bias = nn.Parameter(torch.zeros((out_dim,) if num_members is None else (num_members, 1, out_dim)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x) + self.bias


class _ProjectsWeights:
    """Gives a SimbaV2 network `project_weights()`."""

    def project_weights(self) -> None:
        """Put every weight row back on the unit sphere; call right after each `optimizer.step()`."""
        project_weight_rows_(self)


class SimbaV2Critic(_ProjectsWeights, StateActionCritic):
    """`num_critics` SimbaV2 Q-networks in one batched pass: (obs, actions) -> logits (E, B, num_outputs).

    The default 101 outputs are the logits of `C51Head(-5, 5, 101)`, SimbaV2's categorical critic.
    """

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        hidden_dim: int = 512,
        num_blocks: int = 2,
        num_critics: int = 2,
        num_outputs: int = 101,
        c_shift: float = 3.0,
    ):
        super().__init__(SimbaV2Encoder(obs_dim + action_dim, hidden_dim, num_blocks, num_critics, c_shift),
                         HyperPredictor(hidden_dim, num_outputs, num_critics), num_critics)


class SimbaV2Actor(_ProjectsWeights, TanhGaussianActor):
    """`TanhGaussianActor` on a SimbaV2 trunk, mean and log-std from separate `HyperPredictor`s."""

    def __init__(
        self,
        obs_dim: int,
        action_low: np.ndarray,
        action_high: np.ndarray,
        hidden_dim: int = 128,
        num_blocks: int = 1,
        log_std_min: float = -10.0,
        log_std_max: float = 2.0,
        c_shift: float = 3.0,
    ):
        super().__init__(obs_dim, action_low, action_high, (hidden_dim,), log_std_min, log_std_max,
                         trunk=SimbaV2Encoder(obs_dim, hidden_dim, num_blocks, c_shift=c_shift), head=HyperPredictor)


class SimbaV2DeterministicActor(_ProjectsWeights, DeterministicActor):
    """`DeterministicActor` (TD3) on a SimbaV2 trunk: a = tanh(HyperPredictor(encoder(s))) * scale + bias."""

    def __init__(
        self,
        obs_dim: int,
        action_low: np.ndarray,
        action_high: np.ndarray,
        hidden_dim: int = 128,
        num_blocks: int = 1,
        c_shift: float = 3.0,
    ):
        super().__init__(obs_dim, action_low, action_high, (hidden_dim,),
                         trunk=SimbaV2Encoder(obs_dim, hidden_dim, num_blocks, c_shift=c_shift), head=HyperPredictor)
