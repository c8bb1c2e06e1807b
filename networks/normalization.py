"""Running normalisation inside the model, so it travels with `state_dict()`: observations (`RunningObsNorm`) and
rewards (`RewardScaler`, SimbaV2's reward scaling, which PPO's --normalize-reward uses too)."""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import torch
from torch import nn

from keelrl.networks.transfers import to_device


class RunningObsNorm(nn.Module):
    """Observations standardised by mean and variance, with statistics updated explicitly by `update`.

    Two placements of the stabilising epsilon, as the reference implementations do:

    - `eps_on="var"`: (x − mean) / sqrt(var + eps). SimBa and SimbaV2 (their `ObservationNormalizer`,
      scale_rl/agents/wrappers/normalization.py) with eps 1e-8, streamed over the observations acted on,
      no clipping.
    - `eps_on="std"`: (x − mean) / (std + eps). CORL and RIQL (`compute_mean_std(..., eps=1e-3)` adds eps
      to the dataset's standard deviation) with eps 1e-3, fitted once on a dataset, no clipping.

    `clip` bounds the result to ±clip (None: no bound). The variance is the population variance
    (numpy's `var(0)`, `std(0)`). Agents call `update` on the observations they act on while training
    (never on replayed batches), or once on a dataset, and `forward` wherever observations enter a
    network. Statistics are float64 buffers merged batch by batch (Chan et al.), so they are saved with
    the model; the options are not (the owner rebuilds the normaliser from its config).
    """

    def __init__(self, shape: int | tuple[int, ...], clip: float | None = 10.0, eps: float = 1e-8,
                 eps_on: Literal["var", "std"] = "var"):
        super().__init__()
        if clip is not None and not clip > 0:
            raise ValueError(f"The observation clip must be positive (or None for no clipping), got {clip}.")
        if not eps >= 0:
            raise ValueError(f"The normaliser's eps must be non-negative, got {eps}.")
        if eps_on not in ("var", "std"):
            raise ValueError(f"eps_on must be 'var' (sqrt(var + eps)) or 'std' (std + eps), got {eps_on!r}.")
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        self.shape = shape
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        self.clip = clip
        self.eps = eps
        self.eps_on = eps_on

    @torch.no_grad()
    def update(self, batch: torch.Tensor | np.ndarray) -> None:
        """Fold a batch (B, *shape) into the statistics (a seed group's (S, B, *shape): each seed's rows into its
        own). On the CPU the merge runs in numpy on the buffers' own memory, and a single row needs no reduction
        (its mean is itself, its variance 0): the same float64 arithmetic in a few µs where a dozen small torch
        ops take a hundred, which matters when an agent updates the statistics at every environment step. On a GPU
        every seed's rows are merged at once, after one copy that does not wait for the GPU (`update_on_device`)."""
        if self.mean.device.type != "cpu":
            self.update_on_device(batch)
        elif self.mean.dim() == len(self.shape):
            self._update_in_numpy(batch, self.mean, self.var, self.count)
        else:
            for i, rows in enumerate(batch):  # a seed group: statistics (S, *shape), counts (S,)
                self._update_in_numpy(rows, self.mean[i], self.var[i], self.count[i])

    @torch.no_grad()
    def update_on_device(self, batch: torch.Tensor | np.ndarray) -> None:
        """`update` in torch ops on the statistics' device, every seed of a group at once: a host batch goes there
        through pinned memory without waiting for the GPU, so an environment step's update costs no host
        synchronisation (the same arithmetic as the numpy merge, run on whatever device the statistics are)."""
        batch = to_device(batch, self.mean.device, torch.float64)  # (B, *shape); a seed group's (S, B, *shape)
        rows = batch.dim() - len(self.shape) - 1  # the batch's row axis: 0, or a seed group's 1
        count = self.count.view(self.count.shape + (1,) * len(self.shape))  # (), or (S, 1, ...) against (S, *shape)
        self._merge(batch.mean(rows), batch.var(rows, unbiased=False), batch.shape[rows], self.mean, self.var, count)

    @classmethod
    def _update_in_numpy(cls, batch: torch.Tensor | np.ndarray, mean: torch.Tensor, var: torch.Tensor,
                         count: torch.Tensor) -> None:
        buffers = mean.numpy(), var.numpy(), count.numpy()
        if len(batch) == 1:
            row = (batch.numpy(force=True) if isinstance(batch, torch.Tensor) else np.asarray(batch))[0]
            cls._merge(row.astype(np.float64), 0.0, 1, *buffers)
            return
        batch = torch.as_tensor(batch, dtype=torch.float64)
        cls._merge(batch.mean(0).numpy(), batch.var(0, unbiased=False).numpy(), batch.shape[0], *buffers)

    @staticmethod
    def _merge(batch_mean, batch_var, batch_count: int, mean, var, count) -> None:
        """Chan et al.'s merge of a batch's mean and (population) variance into mean, var and count, in place
        (numpy arrays or tensors alike)."""
        total = count + batch_count
        delta = batch_mean - mean
        mean += delta * (batch_count / total)
        var[...] = (var * count + batch_var * batch_count + delta**2 * (count * batch_count / total)) / total
        count[...] = total

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean, var = self._aligned(self.mean, x).to(x.dtype), self._aligned(self.var, x).to(x.dtype)
        if self.eps_on == "var":
            scaled = (x - mean) * torch.rsqrt(var + self.eps)
        else:
            scaled = (x - mean) / (torch.sqrt(var) + self.eps)
        return scaled if self.clip is None else scaled.clamp(-self.clip, self.clip)

    def _aligned(self, statistic: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """A statistic as it broadcasts against x: a seed group's (S, *shape) against x (S, B, *shape) as
        (S, 1, *shape)."""
        if statistic.dim() == len(self.shape):
            return statistic
        return statistic.view(statistic.shape[0], *[1] * (x.dim() - statistic.dim()), *self.shape)

    def standardize(self, obs: np.ndarray) -> np.ndarray:
        """`forward` for a numpy batch (B, *shape) (a seed group's (S, B, *shape)) -> float32, computed in float64:
        for acting loops on the CPU, where a handful of numpy ops cost less than torch's."""
        mean, var = self.mean.numpy(force=True), self.var.numpy(force=True)
        if mean.ndim > len(self.shape):  # a seed group's (S, *shape), as (S, 1, *shape) against (S, B, *shape)
            mean, var = np.expand_dims(mean, 1), np.expand_dims(var, 1)
        scale = np.sqrt(var + self.eps) if self.eps_on == "var" else np.sqrt(var) + self.eps
        scaled = (obs - mean) / scale
        if self.clip is not None:
            scaled = np.minimum(np.maximum(scaled, -self.clip), self.clip)
        return scaled.astype(np.float32)

    def extra_repr(self) -> str:
        return f"shape={tuple(self.mean.shape)}, clip={self.clip}, eps={self.eps}, eps_on={self.eps_on!r}"


class RewardScaler(nn.Module):
    """SimbaV2's reward scaling: r / max(std(G), max|G| / v_max), G a running discounted return per env.

    Dividing by the std of the discounted-return trace G_t = r_t + γ G_{t−1} (reset between
    episodes) puts returns on a unit scale; the second term guarantees that scaled returns stay
    within ±v_max, the edge of the categorical critic's support (5 in SimbaV2).

    `update(rewards, dones)` folds one vector-env step into the trace and its statistics; call it
    while collecting training data only. Calling the module scales a batch of rewards. The trace
    is reset after the step that ends an episode (terminated or truncated), so G is always the
    return of the current episode so far. The SimbaV2 code resets it on the same episode ends one step
    earlier; gymnasium's `NormalizeReward` (CleanRL's PPO) one step earlier too, and on terminations only, so
    its trace runs on across time limits. The state (trace, statistics, maximum) is tensors only and travels with
    `state_dict()`. Stacked for a seed group (keelrl.networks.seeds), every state tensor has a leading seed axis and
    each seed keeps its own trace, statistics and maximum.
    """

    def __init__(self, gamma: float, num_envs: int, v_max: float = 5.0, eps: float = 1e-8):
        super().__init__()
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"--gamma must be in [0, 1], got {gamma}.")
        if num_envs < 1:
            raise ValueError(f"--num-envs must be positive, got {num_envs}.")
        if not v_max > 0:
            raise ValueError(f"--v-max must be positive for reward scaling, got {v_max}.")
        self.gamma = gamma
        self.v_max = v_max
        self.eps = eps
        self.register_buffer("returns", torch.zeros(num_envs, dtype=torch.float64))
        self.register_buffer("max_abs_return", torch.zeros((), dtype=torch.float64))
        self.return_stats = RunningObsNorm(())  # mean/var of every G seen, merged batch by batch

    @torch.no_grad()
    def update(self, rewards: np.ndarray | torch.Tensor, dones: np.ndarray | torch.Tensor) -> None:
        """Fold one step of rewards (num_envs,) and episode ends (num_envs,) into the statistics (a seed group's
        (S, num_envs): each seed's into its own)."""
        if self.returns.device.type == "cpu":  # numpy on the buffers' memory: the same arithmetic, far fewer ops
            returns, max_abs_return = self.returns.numpy(), self.max_abs_return.numpy()
            returns *= self.gamma
            returns += np.asarray(rewards.cpu() if isinstance(rewards, torch.Tensor) else rewards, np.float64)
            self.return_stats.update(returns)
            np.maximum(max_abs_return, np.abs(returns).max(-1), out=max_abs_return)
            returns[np.asarray(dones.cpu() if isinstance(dones, torch.Tensor) else dones, bool)] = 0.0
            return
        # on a GPU: through pinned memory, without waiting for it (keelrl.networks.transfers)
        rewards = to_device(rewards, self.returns.device, torch.float64)
        dones = to_device(dones, self.returns.device, torch.bool)
        self.returns.mul_(self.gamma).add_(rewards)
        self.return_stats.update(self.returns)
        torch.maximum(self.max_abs_return, self.returns.abs().amax(-1), out=self.max_abs_return)
        self.returns.masked_fill_(dones, 0.0)

    def reset_returns(self) -> None:
        """Start every env's return trace afresh (new episodes begin without an episode end, as on resume)."""
        self.returns.zero_()

    def denominator(self) -> torch.Tensor:
        """max(std of G, max |G| / v_max) as a float64 scalar (a seed group's: (S,)); about 1 before any update."""
        std = torch.sqrt(self.return_stats.var + self.eps)
        return torch.maximum(std, self.max_abs_return / self.v_max)

    def scale(self, rewards: np.ndarray) -> np.ndarray:
        """`forward` for a numpy batch of rewards (B,), the denominator in Python floats: for acting loops on the
        CPU (a seed group's (S, B), each seed's by its own denominator, in the rewards' dtype)."""
        if self.max_abs_return.dim() > 0:
            return rewards / self.denominator().numpy(force=True).astype(rewards.dtype)[:, None]
        std = math.sqrt(self.return_stats.var.item() + self.eps)
        return rewards / max(std, self.max_abs_return.item() / self.v_max)

    def forward(self, rewards: torch.Tensor) -> torch.Tensor:
        """Scaled rewards (B,) (a seed group's (S, B), each seed's by its own denominator)."""
        denominator = self.denominator().to(rewards.dtype)
        return rewards / denominator.reshape(denominator.shape + (1,) * (rewards.dim() - denominator.dim()))
