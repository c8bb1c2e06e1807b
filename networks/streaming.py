"""Streaming deep RL parts (Elsayed, Vasan & Mahmood 2024, "stream-x"): the ObGD optimiser,
sparse initialisation and LayerNorm MLPs, for agents that learn from one sample at a time.

ObGD (overshooting-bounded gradient descent) keeps an eligibility trace per parameter,
e ← γλe + ∇f (f: the value, the action-value, or the policy objective), and steps
θ ← θ + η·δ·e with η = lr / max(1, lr·κ·max(|δ|, 1)·‖e‖₁), where ‖e‖₁ sums over every
parameter. The bound keeps the update from overshooting the TD target; whenever it is active,
η·max(|δ|, 1)·‖e‖₁ = 1/κ exactly.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn


@torch.no_grad()
def sparse_init_(weight: torch.Tensor, sparsity: float = 0.9) -> torch.Tensor:
    """Uniform ±1/√fan_in, then zero a random `sparsity` fraction of each row's inputs (at least one kept)."""
    fan_out, fan_in = weight.shape
    bound = 1.0 / math.sqrt(fan_in)
    weight.uniform_(-bound, bound)
    num_zeros = min(int(sparsity * fan_in), fan_in - 1)
    zeroed_inputs = torch.rand(fan_out, fan_in).argsort(dim=1)[:, :num_zeros]  # (fan_out, num_zeros)
    return weight.scatter_(1, zeroed_inputs, 0.0)


class StreamMLP(nn.Module):
    """[Linear → LayerNorm (no affine parameters) → leaky ReLU] per hidden size, then a Linear output.

    Every Linear is sparse-initialised with zero biases. The forward pass calls the functional
    ops directly: one-sample updates are bound by per-call overhead, not arithmetic.
    """

    def __init__(self, in_dim: int, hidden_sizes: Iterable[int], out_dim: int, sparsity: float = 0.9):
        super().__init__()
        sizes = (in_dim, *hidden_sizes)
        self.hidden = nn.ModuleList(nn.Linear(fan_in, width) for fan_in, width in zip(sizes[:-1], sizes[1:]))
        self.output = nn.Linear(sizes[-1], out_dim)
        for layer in (*self.hidden, self.output):
            sparse_init_(layer.weight, sparsity)
            nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.hidden:
            x = F.linear(x, layer.weight, layer.bias)
            x = F.leaky_relu(F.layer_norm(x, x.shape[-1:]))
        return F.linear(x, self.output.weight, self.output.bias)


class ObGD:
    """Overshooting-bounded gradient descent with eligibility traces; one sample per step.

    Usage: `f.backward()` (f the quantity whose gradient feeds the trace), then
    `step(delta, reset)`, then `zero_grad()`. With `adaptive=True` each coordinate of the trace is
    divided by sqrt(v̂ + eps), v̂ a bias-corrected running mean of (δe)² (decay `beta2`), as RMSProp
    does, before the bound and the step (the paper's adaptive ObGD).

    For speed the optimiser keeps one flat buffer each for the parameters, their gradients and
    the trace: every parameter and its `.grad` become views into the first two (build the
    optimiser after moving the network to its device), and a step is a handful of operations on
    whole buffers, however many tensors the network has.
    """

    def __init__(self, params: Iterable[nn.Parameter], lr: float = 1.0, gamma: float = 0.99, lam: float = 0.8,
                 kappa: float = 2.0, adaptive: bool = False, beta2: float = 0.999, eps: float = 1e-8):
        if adaptive and not 0.0 <= beta2 < 1.0:  # the bias correction 1 − β₂ⁿ would be 0: every step NaN
            raise ValueError(f"adaptive ObGD's beta2 must lie in [0, 1), got {beta2}.")
        self.params = list(params)
        self.lr, self.kappa, self.trace_decay = lr, kappa, gamma * lam
        self.adaptive, self.beta2, self.eps = adaptive, beta2, eps
        self.flat_params = torch.cat([p.detach().reshape(-1) for p in self.params])
        self.flat_grads = torch.zeros_like(self.flat_params)
        self.trace = torch.zeros_like(self.flat_params)
        self.second_moment = torch.zeros_like(self.flat_params) if adaptive else torch.zeros(0)
        for p, flat_param in zip(self.params, self._views(self.flat_params)):
            p.data = flat_param
        self._grad_views = self._views(self.flat_grads)
        self.num_steps = 0
        self.zero_grad()

    def _views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """`flat` cut into views shaped like the parameters."""
        chunks = flat.split([p.numel() for p in self.params])
        return [chunk.view_as(p) for chunk, p in zip(chunks, self.params)]

    @torch.no_grad()
    def step(self, delta: float, reset: bool = False) -> float:
        """e ← γλe + grad; θ ← θ + η·δ·e; then zero the trace if `reset` (episode end). Returns η."""
        self.trace.mul_(self.trace_decay).add_(self.flat_grads)
        self.num_steps += 1
        direction = self._adaptive_direction(delta) if self.adaptive else self.trace
        trace_l1 = direction.abs().sum().item()
        bound = self.lr * self.kappa * max(abs(delta), 1.0) * trace_l1
        step_size = self.lr / max(1.0, bound)
        self.flat_params.add_(direction, alpha=step_size * delta)
        if reset:
            self.reset_trace()
        return step_size

    def _adaptive_direction(self, delta: float) -> torch.Tensor:
        """e / sqrt(v̂ + eps): v ← β₂v + (1 − β₂)(δe)², v̂ = v / (1 − β₂ⁿ) after n steps.

        eps sits inside the root, as in stream-x's adaptive ObGD: where v̂ is far below eps a
        coordinate is divided by about sqrt(eps), not by eps."""
        self.second_moment.lerp_((delta * self.trace).square_(), 1.0 - self.beta2)
        bias_correction = 1.0 - self.beta2**self.num_steps
        return self.trace / (self.second_moment / bias_correction).add_(self.eps).sqrt_()

    def reset_trace(self) -> None:
        self.trace.zero_()

    def zero_grad(self) -> None:
        """Zero the gradient buffer and (re)attach each parameter's `.grad` to it, so that
        backward passes accumulate there even after `module.zero_grad()` dropped the views."""
        self.flat_grads.zero_()
        for p, grad_view in zip(self.params, self._grad_views):
            if p.grad is not grad_view:
                p.grad = grad_view

    def state_dict(self) -> dict:
        return {"trace": self.trace.clone(), "second_moment": self.second_moment.clone(), "num_steps": self.num_steps}

    def load_state_dict(self, state: dict) -> None:
        self.trace.copy_(state["trace"])
        self.second_moment.copy_(state["second_moment"])
        self.num_steps = state["num_steps"]
