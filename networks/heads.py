"""Value heads: how a critic's raw outputs become Q-values, and how they are trained.

A critic ensemble emits `head.num_outputs` numbers per member and sample, `logits` of shape
(E, B, num_outputs) (or (B, num_outputs) for a single critic). Every head has the same interface,
so an agent swaps regression for a categorical critic by changing the head only:

- `num_outputs`: 1 for `ScalarHead`, `num_bins` for the categorical heads;
- `value(logits) -> (E, B)`: the Q-values;
- `loss(logits, target) -> (E, B)`: the per-sample loss, where `target` holds scalar TD targets (B,)
  or, for categorical heads, target distributions (B, num_bins); reduce it with `.mean()` (or
  `.mean(-1).sum()` to add the critics' losses as CleanRL does). Targets are treated as constants.

Categorical heads (`C51Head`, `HLGaussHead`) put a softmax over a fixed support of bin centres
(value = Σ softmax(logits) · centres) and train by cross-entropy against a target histogram.
`C51Head` also projects a whole next-state distribution through the Bellman backup
(Bellemare et al. 2017); `HLGaussHead` spreads each scalar target as a Gaussian over the bins
(Farebrother et al. 2024, "Stop Regressing").
"""

from __future__ import annotations

import abc
import math

import torch
import torch.nn.functional as F
from torch import nn


class ValueHead(nn.Module, abc.ABC):
    """The interface shared by every value head (see the module docstring)."""

    num_outputs: int

    @abc.abstractmethod
    def value(self, logits: torch.Tensor) -> torch.Tensor:
        """Q-values from critic outputs: (..., num_outputs) -> (...)."""

    @abc.abstractmethod
    def loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Per-sample loss of `logits` (..., B, num_outputs) against `target`: -> (..., B)."""


class ScalarHead(ValueHead):
    """A critic with one output per sample, regressed onto scalar TD targets by squared error."""

    num_outputs = 1

    def value(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.squeeze(-1)  # (..., 1) -> (...)

    def loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Squared error against scalar targets (B,), broadcast over ensemble members."""
        if target.dim() != 1:
            raise ValueError(f"ScalarHead takes scalar TD targets of shape (B,), got shape {tuple(target.shape)}.")
        return (self.value(logits) - target.detach()).pow(2)


class CategoricalHead(ValueHead):
    """A softmax over `num_bins` fixed bin centres in [v_min, v_max]; cross-entropy loss.

    Subclasses choose the centres and how a scalar target becomes a histogram
    (`target_distribution`).
    """

    def __init__(self, v_min: float, v_max: float, num_bins: int, support: torch.Tensor):
        super().__init__()
        self.v_min = float(v_min)
        self.v_max = float(v_max)
        self.num_outputs = num_bins
        # derived from the options, so not saved with the model
        self.register_buffer("support", support, persistent=False)

    @staticmethod
    def check_range(v_min: float, v_max: float, num_bins: int) -> None:
        """Raise a ValueError naming the option when the support options are unusable."""
        if not (math.isfinite(v_min) and math.isfinite(v_max)):
            raise ValueError(f"--v-min and --v-max must be finite, got {v_min} and {v_max}.")
        if v_min >= v_max:
            raise ValueError(f"--v-min ({v_min}) must be smaller than --v-max ({v_max}).")
        if num_bins < 2:
            raise ValueError(f"--num-bins must be at least 2, got {num_bins}.")

    @abc.abstractmethod
    def target_distribution(self, values: torch.Tensor) -> torch.Tensor:
        """Histogram over the bins that encodes scalar `values`: (...) -> (..., num_bins)."""

    def value(self, logits: torch.Tensor) -> torch.Tensor:
        return self.expectation(F.softmax(logits, dim=-1))

    def expectation(self, probs: torch.Tensor) -> torch.Tensor:
        """Mean value of distributions (..., K) -> (...), in float32 also under bf16 autocast (it feeds TD targets
        and the actor's loss)."""
        with torch.autocast(probs.device.type, enabled=False):
            return probs @ self.support  # (..., K) @ (K,) -> (...)

    def loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Cross-entropy against a target distribution (B, K), or against the histogram of scalar targets (B,)."""
        if target.dim() == 1:
            with torch.no_grad():
                target = self.target_distribution(target)
        elif target.dim() != 2 or target.shape[-1] != self.num_outputs:
            raise ValueError(
                f"Targets must be scalars (B,) or distributions (B, {self.num_outputs}), got shape {tuple(target.shape)}."
            )
        return -(target.detach() * F.log_softmax(logits, dim=-1)).sum(-1)

    def min_value_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Clipped double-Q for distributional critics: per sample, the distribution of the member with the smallest mean.

        `logits` (E, B, K) from a (target) critic ensemble; returns that member's softmax (B, K).
        Taking the element-wise minimum of distributions would not be a distribution, so the
        whole distribution of the pessimistic member is used, as in the SimbaV2 reference code.
        """
        probs = F.softmax(logits, dim=-1)  # (E, B, K)
        chosen = self.expectation(probs).argmin(dim=0)  # (E, B) mean values -> member index (B,)
        return probs[chosen, torch.arange(probs.shape[1], device=probs.device)]  # (B, K)


class C51Head(CategoricalHead):
    """Categorical critic on `num_bins` evenly spaced atoms v_min … v_max (defaults: SimbaV2's 101 atoms on [−5, 5]).

    Scalar targets are encoded two-hot: the mass is split between the two neighbouring atoms
    in proportion to closeness, so the encoding's mean is the (clipped) target itself.
    """

    def __init__(self, v_min: float = -5.0, v_max: float = 5.0, num_bins: int = 101):
        self.check_range(v_min, v_max, num_bins)
        super().__init__(v_min, v_max, num_bins, torch.linspace(v_min, v_max, num_bins))
        self.delta = (self.v_max - self.v_min) / (num_bins - 1)

    def _neighbours(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Index of the atom at or below each (clipped) value, and the share of mass for the atom above it."""
        position = ((values - self.v_min) / self.delta).clamp(0, self.num_outputs - 1)  # clipped onto the atoms
        lower = position.floor().clamp(max=self.num_outputs - 2)  # the top atom splits as K−2 with share 1
        return lower.long(), position - lower

    def target_distribution(self, values: torch.Tensor) -> torch.Tensor:
        """Two-hot encoding of scalar `values` (...) -> (..., K); values outside the support go to its end atoms."""
        lower, upper_share = self._neighbours(values)
        probs = values.new_zeros(*values.shape, self.num_outputs)
        probs.scatter_(-1, lower.unsqueeze(-1), (1 - upper_share).unsqueeze(-1))
        return probs.scatter_add_(-1, lower.unsqueeze(-1) + 1, upper_share.unsqueeze(-1))

    def project(
        self, next_probs: torch.Tensor, rewards: torch.Tensor, discounts: torch.Tensor, not_done: torch.Tensor
    ) -> torch.Tensor:
        """The C51 projection of the distribution of r + γ(1 − d)·Z onto the fixed atoms.

        next_probs (B, K): probabilities of the next-state return over the atoms (e.g. from
        `min_value_probs` of the target critic); rewards, discounts, not_done: (B,).
        Each shifted atom r + γ(1 − d)·z_j passes its probability to its two neighbouring atoms
        (two-hot), so total mass is preserved; shifted atoms beyond the support land on the end atoms.
        For SAC's entropy-augmented target r + γ(1 − d)(Z − α log π), pass
        rewards − discounts · not_done · α log π.
        Returns the target distribution (B, K), without gradient.
        """
        with torch.no_grad():
            scale = (discounts * not_done).unsqueeze(-1)  # (B, 1)
            shifted = rewards.unsqueeze(-1) + scale * self.support  # (B, K): where each atom's mass goes
            lower, upper_share = self._neighbours(shifted)
            target = torch.zeros_like(next_probs)
            target.scatter_add_(-1, lower, next_probs * (1 - upper_share))
            return target.scatter_add_(-1, lower + 1, next_probs * upper_share)


class HLGaussHead(CategoricalHead):
    """Histogram loss with Gaussian smoothing (HL-Gauss) on `num_bins` equal bins covering [v_min, v_max].

    A scalar target y becomes the histogram of N(y, σ²) over the bins: differences of the
    Gaussian CDF at the bin edges, renormalised by the mass that falls inside [v_min, v_max].
    σ defaults to 0.75 × bin width. Values are Σ softmax(logits) · bin centres.
    """

    def __init__(self, v_min: float, v_max: float, num_bins: int, sigma: float | None = None):
        self.check_range(v_min, v_max, num_bins)
        if sigma is not None and not sigma > 0:
            raise ValueError(f"The HL-Gauss sigma must be positive, got {sigma}; leave it unset for 0.75 × bin width.")
        edges = torch.linspace(v_min, v_max, num_bins + 1)
        super().__init__(v_min, v_max, num_bins, (edges[:-1] + edges[1:]) / 2)
        self.register_buffer("edges", edges, persistent=False)
        self.sigma = 0.75 * (self.v_max - self.v_min) / num_bins if sigma is None else float(sigma)

    def target_distribution(self, values: torch.Tensor) -> torch.Tensor:
        """Gaussian histogram of scalar `values` (...) -> (..., K), summing to 1.

        Values are first clipped to [v_min, v_max], which keeps the renormalisation finite for
        targets far outside the support.
        """
        centred = self.edges - values.clamp(self.v_min, self.v_max).unsqueeze(-1)  # (..., K + 1)
        cdf = torch.special.ndtr(centred / self.sigma)
        inside = cdf[..., -1:] - cdf[..., :1]  # mass within [v_min, v_max]
        return (cdf[..., 1:] - cdf[..., :-1]) / inside


@torch.no_grad()
def td_target(head: ValueHead, next_outputs: torch.Tensor, rewards: torch.Tensor, discounts: torch.Tensor,
              terminated: torch.Tensor, next_bonus: torch.Tensor | float = 0.0) -> torch.Tensor:
    """The critic's target for r + γ(1 − terminated)(Q'(s', a') + bonus), Q' the pessimistic target critic.

    next_outputs (E, B, K): the target critics' outputs at (s', a'); rewards, discounts (γ^n of each
    sample's n-step return), terminated: (B,); next_bonus: SAC's −α log π(a'|s') (0 for TD3).
    Scalar and HL-Gauss critics get the scalar target (B,) with the smallest target Q-value; C51 critics
    the projection (B, K) of the distribution of the member with the smallest mean.
    """
    not_done = 1.0 - terminated
    if isinstance(head, C51Head):
        next_probs = head.min_value_probs(next_outputs)
        shifted_rewards = rewards + discounts * not_done * next_bonus
        return head.project(next_probs, shifted_rewards, discounts, not_done)
    next_q = head.value(next_outputs).min(dim=0).values  # (E, B) -> (B,)
    return rewards + discounts * not_done * (next_q + next_bonus)
