"""Loss-adjusted prioritised replay (LAP; Fujimoto, Meger & Precup 2020, "An Equivalence between Loss Functions and
Non-Uniform Sampling in Experience Replay") on keelrl's replay buffer, and short sequences of one env's steps.

A transition is drawn with probability p_i / Σ_j p_j over the stored rows, where its priority is

    p_i = max(|δ_i|, min_priority) ** alpha

δ_i being the TD error the agent last measured on it; a new transition gets the largest priority any transition has
had (`max_priority`, which starts at min_priority ** alpha = 1), so it is drawn soon. With the clamp at 1 (LAP's), a
Huber loss (quadratic below 1) on prioritised samples has the gradient, in expectation, of an MSE on uniform ones
above 1 and of an L1 below it. alpha 0 samples uniformly.

The agent draws indices (`sample_indices`), reads what it needs at them (`batch_at`: one transition with the buffer's
n-step return, as `ReplayBuffer.sample` gives it; `sequences_at`: `horizon` consecutive steps of the same env) and
gives the TD errors back (`update_priorities`). `sample` is `batch_at(sample_indices(...))`, so an agent that only
samples (and never updates priorities) may take this buffer in place of a ReplayBuffer.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from keelrl.buffers.replay import Batch, ReplayBuffer


class SequenceBatch(NamedTuple):
    """`horizon` consecutive steps of one env from each sampled row: step k of sample b is the transition stored
    num_envs × k rows after row b. Steps past the end of the sampled transition's episode (terminated or truncated),
    or past the newest stored step, are not `live`: their rows hold another episode's data (or none) and a loss
    must mask them out."""

    obs: torch.Tensor  # (B, H, *obs_shape)
    actions: torch.Tensor  # (B, H, *action_shape)
    rewards: torch.Tensor  # (B, H)
    next_obs: torch.Tensor  # (B, H, *obs_shape): the true next observation of each step
    terminated: torch.Tensor  # (B, H) float 0/1
    live: torch.Tensor  # (B, H) float 0/1: step k belongs to the episode of step 0 (step 0 always does)


class LAPReplayBuffer(ReplayBuffer):
    """A `ReplayBuffer` whose rows are sampled in proportion to their LAP priorities (module docstring)."""

    def __init__(self, capacity: int, obs_shape: tuple[int, ...], action_shape: tuple[int, ...], num_envs: int = 1,
                 device: str | torch.device = "cpu", n_step: int = 1, gamma: float = 0.99, seed: int = 0,
                 alpha: float = 0.4, min_priority: float = 1.0):
        super().__init__(capacity, obs_shape, action_shape, num_envs, device, n_step, gamma, seed=seed)
        if not alpha >= 0 or not min_priority > 0:
            raise ValueError(f"LAP needs alpha >= 0 and min_priority > 0, got {alpha} and {min_priority}.")
        self.alpha, self.min_priority = alpha, min_priority
        self.priorities = torch.zeros(self.capacity, device=self.device)
        self.max_priority = min_priority**alpha
        """the priority a new transition gets: the largest any transition has had"""

    def write(self, packed: np.ndarray | torch.Tensor) -> None:
        """Store one vector step (`ReplayBuffer.write`), each new row at the largest priority so far."""
        rows = slice(self.pos, self.pos + self.num_envs)
        super().write(packed)
        self.priorities[rows] = self.max_priority

    def priority(self, td_errors: torch.Tensor) -> torch.Tensor:
        """LAP's priority of TD errors (B,): max(|δ|, min_priority) ** alpha."""
        return td_errors.abs().clamp(min=self.min_priority).pow(self.alpha)

    def probabilities(self) -> torch.Tensor:
        """The probability (size,) float64 of drawing each stored row: its priority over the sum of them all."""
        weights = self.priorities[: self.size].double()
        return weights / weights.sum()

    def sample_indices(self, batch_size: int) -> torch.Tensor:
        """`batch_size` rows (B,) drawn with replacement, each with its `probabilities()`: a uniform draw on
        [0, Σ p) falls in row i's stretch [Σ_{j<i} p_j, Σ_{j<=i} p_j) of the cumulative sum (float64: at a million
        rows a float32 sum would round stretches away)."""
        if self.size == 0:
            raise ValueError("Cannot sample from an empty replay buffer.")
        cumulative = torch.cumsum(self.priorities[: self.size].double(), 0)
        draws = torch.rand(batch_size, generator=self.generator, device=self.device, dtype=torch.float64)
        return torch.searchsorted(cumulative, draws * cumulative[-1], right=True).clamp(max=self.size - 1)

    def batch_at(self, idx: torch.Tensor) -> Batch:
        """The transitions at rows `idx` (B,), with the buffer's n-step returns (as `ReplayBuffer.sample`)."""
        return self._sample_n_step(idx)

    def sample(self, batch_size: int) -> Batch:
        """`batch_size` transitions drawn by priority (their rows are not returned: an agent that updates priorities
        calls `sample_indices` and `batch_at` itself)."""
        return self.batch_at(self.sample_indices(batch_size))

    def sequences_at(self, idx: torch.Tensor, horizon: int) -> SequenceBatch:
        """`horizon` consecutive steps of the env of each row in `idx` (B,), starting there (`SequenceBatch`)."""
        num_blocks = self.capacity // self.num_envs
        newest_block = (self.pos // self.num_envs - 1) % num_blocks
        steps_stored_after = (newest_block - idx // self.num_envs) % num_blocks  # (B,)
        offsets = torch.arange(horizon, device=self.device)
        rows = (idx.unsqueeze(1) + offsets * self.num_envs) % self.capacity  # (B, H)
        ended = self.terminated[rows] | self.truncated[rows]  # (B, H)
        # step k is live when no step before it ended its episode and it is stored
        ended_before = torch.cumsum(ended.long(), dim=1) - ended.long()  # (B, H): episode ends among steps 0..k-1
        live = (ended_before == 0) & (offsets <= steps_stored_after.unsqueeze(1))
        return SequenceBatch(obs=self.obs[rows], actions=self.actions[rows], rewards=self.rewards[rows],
                             next_obs=self.next_obs[rows], terminated=self.terminated[rows].float(), live=live.float())

    def update_priorities(self, idx: torch.Tensor, td_errors: torch.Tensor) -> None:
        """Set the priorities of rows `idx` (B,) from their new TD errors (B,) (a row drawn twice keeps one of its
        two), and raise `max_priority` to the largest of them."""
        priorities = self.priority(td_errors.detach()).to(self.priorities.dtype)
        self.priorities[idx] = priorities
        self.max_priority = max(self.max_priority, float(priorities.max()))

    def reward_scale(self, eps: float = 1e-8) -> float:
        """The mean absolute reward of the stored transitions (at least `eps`)."""
        return max(float(self.rewards[: self.size].abs().mean()), eps)

    def has_terminations(self) -> bool:
        """Whether any stored transition terminated its episode."""
        return bool(self.terminated[: self.size].any())

    def state_dict(self) -> dict[str, torch.Tensor]:
        """`ReplayBuffer.state_dict` with the priorities of the stored rows and `max_priority`."""
        return {**super().state_dict(), "priorities": self.priorities[: self.size].to("cpu", copy=True),
                "max_priority": torch.tensor(self.max_priority, dtype=torch.float64)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if "priorities" not in state:
            raise ValueError("The saved buffer has no LAP priorities: it was written by a uniform ReplayBuffer.")
        super().load_state_dict(state)
        self.priorities[: self.size] = state["priorities"].to(self.device)
        self.max_priority = float(state["max_priority"])
