"""Multi-layer perceptrons, single, as a numpy copy for acting, and as a batched ensemble."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def hidden_layers(
    in_dim: int,
    hidden_sizes: tuple[int, ...],
    activation: type[nn.Module] = nn.ReLU,
    layer_norm: bool = False,
) -> nn.Sequential:
    """Linear → activation blocks over `hidden_sizes`; with `layer_norm`, Linear → LayerNorm → activation (WSRL's
    MLP, wsrl/networks/mlp.py:29-45 at 891ee35)."""
    layers: list[nn.Module] = []
    sizes = (in_dim, *hidden_sizes)
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(fan_in, fan_out), *([nn.LayerNorm(fan_out)] if layer_norm else []), activation()]
    return nn.Sequential(*layers)


def mlp(
    in_dim: int,
    hidden_sizes: tuple[int, ...],
    out_dim: int,
    activation: type[nn.Module] = nn.ReLU,
    output_activation: type[nn.Module] | None = None,
    layer_norm: bool = False,
) -> nn.Sequential:
    """`hidden_layers` over `hidden_sizes`, then a Linear to `out_dim`."""
    layers = list(hidden_layers(in_dim, hidden_sizes, activation, layer_norm))
    layers.append(nn.Linear((in_dim, *hidden_sizes)[-1], out_dim))
    if output_activation is not None:
        layers.append(output_activation())
    return nn.Sequential(*layers)




class NumpyMLP:
    """A numpy copy of an `mlp` (Linear layers with Tanh or ReLU between) as it is now, for acting on the CPU at
    small batch sizes, where each torch op's fixed cost outweighs its arithmetic: PPO's two 64-64 tanh networks at
    batch 1 take 40 µs in numpy against 175 µs in torch (one thread, AMD EPYC). The copy does not follow the
    module's later updates: take a new one after each."""

    ACTIVATIONS = {nn.Tanh: np.tanh, nn.ReLU: lambda x: np.maximum(x, 0.0)}

    def __init__(self, net: nn.Sequential):
        self.layers: list[tuple[np.ndarray, np.ndarray] | Callable] = []
        for layer in net:
            if isinstance(layer, nn.Linear):  # weight (out, in) kept transposed, (in, out), for x @ W
                weight, bias = layer.weight.detach(), layer.bias.detach()
                if weight.dim() == 3:  # a seed group's (S, out, in), (S, out): (S, in, out), (S, 1, out)
                    weight, bias = weight.transpose(-2, -1), bias.unsqueeze(-2)
                else:
                    weight = weight.T
                self.layers.append((weight.float().numpy(force=True).copy(), bias.float().numpy(force=True).copy()))
            elif type(layer) in self.ACTIVATIONS:
                self.layers.append(self.ACTIVATIONS[type(layer)])
            else:
                raise TypeError(f"NumpyMLP copies Linear, Tanh and ReLU layers, not {type(layer).__name__}.")

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """(B, in) float32 -> (B, out) float32 (a seed group's (S, B, in) -> (S, B, out), each seed by its own
        weights)."""
        for layer in self.layers:
            x = x @ layer[0] + layer[1] if isinstance(layer, tuple) else layer(x)
        return x


Members = slice | torch.Tensor
"""Which members of an ensemble to evaluate: a slice, or a tensor of member indices (repeats allowed)."""


class EnsembleLinear(nn.Module):
    """`num_members` independent Linear layers evaluated as one batched matmul.

    Input (B, in) is shared by every member; input (E, B, in) gives each member its own rows.
    Output is (E, B, out). Each member is initialised like `nn.Linear`.
    """

    def __init__(self, num_members: int, in_features: int, out_features: int):
        super().__init__()
        bound = 1.0 / math.sqrt(in_features)
        self.weight = nn.Parameter(torch.empty(num_members, in_features, out_features).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(num_members, 1, out_features).uniform_(-bound, bound))

    def forward(self, x: torch.Tensor, members: Members = slice(None)) -> torch.Tensor:
        """Evaluate the chosen members only (all by default): (B, in) or (E', B, in) -> (E', B, out)."""
        weight, bias = self.weight[members], self.bias[members]
        if weight.shape[-1] == 1:
            # a scalar output (a Q-value): batched matrix-vector products as multiply-and-sum, since a
            # bmm with one output column takes several times longer on CPU, forward and backward
            return (x * weight.transpose(1, 2)).sum(dim=-1, keepdim=True) + bias  # (E', B, in) -> (E', B, 1)
        if x.dim() == 2:
            x = x.expand(weight.shape[0], *x.shape)  # (B, in) -> (E', B, in), no copy
        return torch.baddbmm(bias, x, weight)

    def extra_repr(self) -> str:
        members, fan_in, fan_out = self.weight.shape
        return f"num_members={members}, in_features={fan_in}, out_features={fan_out}"


def orthogonal_init_(net: nn.Module, last_gain: float, gain: float = 2**0.5) -> nn.Module:
    """CleanRL's `layer_init` on every Linear and EnsembleLinear of `net`, in registration order: orthogonal weights
    with `gain` (the last layer's with `last_gain`), zero biases; an EnsembleLinear's members one by one, each on its
    stored (in, out) weight."""
    linears = [layer for layer in net.modules() if isinstance(layer, (nn.Linear, EnsembleLinear))]
    for layer in linears:
        layer_gain = last_gain if layer is linears[-1] else gain
        for weight in (layer.weight if isinstance(layer, EnsembleLinear) else [layer.weight]):
            nn.init.orthogonal_(weight, layer_gain)
        nn.init.zeros_(layer.bias)
    return net


class EnsembleLayerNorm(nn.Module):
    """LayerNorm over the last dimension with each member's own scale and bias (init 1 and 0), as `nn.LayerNorm`:
    (E', B, features) -> (E', B, features)."""

    def __init__(self, num_members: int, features: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(num_members, 1, features))
        self.bias = nn.Parameter(torch.zeros(num_members, 1, features))
        self.eps = eps

    def forward(self, x: torch.Tensor, members: Members = slice(None)) -> torch.Tensor:
        """(E', B, features) -> (E', B, features)."""
        normalised = F.layer_norm(x, x.shape[-1:], eps=self.eps)
        return torch.addcmul(self.bias[members], normalised, self.weight[members])

    def extra_repr(self) -> str:
        members, _, features = self.weight.shape
        return f"num_members={members}, features={features}, eps={self.eps}"


class EnsembleMLP(nn.Module):
    """`num_members` MLPs with the same shape, evaluated in one pass: (B, in) -> (E, B, out). With `layer_norm`,
    each hidden layer is Linear → LayerNorm → activation."""

    def __init__(
        self,
        num_members: int,
        in_dim: int,
        hidden_sizes: tuple[int, ...],
        out_dim: int,
        activation: type[nn.Module] = nn.ReLU,
        layer_norm: bool = False,
    ):
        super().__init__()
        sizes = (in_dim, *hidden_sizes, out_dim)
        self.layers = nn.ModuleList(EnsembleLinear(num_members, a, b) for a, b in zip(sizes[:-1], sizes[1:]))
        self.norms = nn.ModuleList(EnsembleLayerNorm(num_members, size) for size in hidden_sizes) if layer_norm \
            else None
        self.activation = activation()

    def forward(self, x: torch.Tensor, members: Members = slice(None)) -> torch.Tensor:
        for i, layer in enumerate(self.layers[:-1]):
            x = layer(x, members)
            if self.norms is not None:
                x = self.norms[i](x, members)
            x = self.activation(x)
        return self.layers[-1](x, members)
