"""Running observation normalisation inside the model, so it travels with `state_dict()`."""

from __future__ import annotations

import torch
from torch import nn


class RunningObsNorm(nn.Module):
    """(x − mean) / sqrt(var + eps), clipped, with statistics updated explicitly by `update`.

    Agents call `update` on the observations they act on while training (never on replayed
    batches), and `forward` wherever observations enter a network. Statistics are float64
    buffers merged batch by batch (Chan et al.), so they are saved with the model.
    """

    def __init__(self, shape: int | tuple[int, ...], clip: float = 10.0, eps: float = 1e-8):
        super().__init__()
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        self.clip = clip
        self.eps = eps

    @torch.no_grad()
    def update(self, batch: torch.Tensor) -> None:
        """Fold a batch (B, *shape) into the statistics."""
        batch = batch.to(self.mean.device, torch.float64)
        batch_count = batch.shape[0]
        batch_mean = batch.mean(0)
        batch_var = batch.var(0, unbiased=False)
        total = self.count + batch_count
        delta = batch_mean - self.mean
        self.mean += delta * (batch_count / total)
        self.var.copy_((self.var * self.count + batch_var * batch_count + delta**2 * (self.count * batch_count / total)) / total)
        self.count.copy_(total)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scaled = (x - self.mean.to(x.dtype)) * torch.rsqrt(self.var.to(x.dtype) + self.eps)
        return scaled.clamp(-self.clip, self.clip)
