"""The on-policy rollout: `num_steps` vector-env steps of `num_envs` envs, then generalised advantage estimation.

Step t of env e holds the observation acted on (as the networks saw it), the action, its log-probability under
the acting policy, the value V(obs), the reward, and `dones`: whether the episode ended at that step
(terminated or truncated; a truncated step's reward already carries γ V(true final observation), so cutting the
return there loses nothing). An agent with a constraint also stores costs and cost values.

The rollout lives in numpy on the CPU, as the envs' steps arrive (a numpy row write costs a fraction of a torch
op's fixed cost), and goes to the learner's device once per rollout (`as_flat_tensors`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

FIELDS = ("obs", "actions", "log_probs", "values", "rewards", "dones")
COST_FIELDS = ("costs", "cost_values")


def gae(rewards: np.ndarray, values: np.ndarray, dones: np.ndarray, next_values: np.ndarray, gamma: float,
        lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Generalised advantage estimation over a rollout (T, N): advantages and returns (advantages + values).

    δ_t = r_t + γ (1 − d_t) V_{t+1} − V_t, A_t = δ_t + γλ (1 − d_t) A_{t+1}, with V_T = `next_values` (N,), the
    value of the observation after the last step."""
    advantages = np.zeros_like(rewards)
    last = np.zeros_like(next_values)
    following = next_values
    for t in reversed(range(len(rewards))):
        not_done = 1.0 - dones[t]
        delta = rewards[t] + gamma * not_done * following - values[t]
        advantages[t] = last = delta + gamma * lam * not_done * last
        following = values[t]
    return advantages, advantages + values


class RolloutBuffer:
    """Preallocated storage for one rollout; `add` one vector step at a time until `full`."""

    def __init__(self, num_steps: int, num_envs: int, obs_shape: tuple[int, ...], action_shape: tuple[int, ...],
                 store_cost: bool = False):
        self.num_steps, self.num_envs = num_steps, num_envs
        shapes = {"obs": obs_shape, "actions": action_shape}
        names = FIELDS + (COST_FIELDS if store_cost else ())
        self.data = {name: np.zeros((num_steps, num_envs, *shapes.get(name, ())), np.float32) for name in names}
        """every field (num_steps, num_envs, ...), float32 (Discrete actions as their index)"""
        self.step = 0
        self.next_obs: np.ndarray | None = None
        """the raw observations the next step acts on (kept with a checkpoint)"""
        self.episode_costs: list[float] = []
        """the costs of the episodes that ended during this rollout (with store_cost: what a Lagrange multiplier
        steps on)"""

    @property
    def full(self) -> bool:
        return self.step == self.num_steps

    def add(self, **step: np.ndarray) -> None:
        """Store one vector step (every field, each (num_envs, ...))."""
        for name, value in step.items():
            self.data[name][self.step] = value
        self.step += 1

    def clear(self) -> None:
        """Start the next rollout (the storage is overwritten, not freed)."""
        self.step = 0
        self.episode_costs = []

    def truncate_last_step(self, bootstraps: dict[str, np.ndarray], gamma: float) -> None:
        """End every env's episode at the last stored step (a resumed run whose envs start new episodes): each
        field of `bootstraps` (rewards, and costs) gains γ times the value (N,) of the observation that followed,
        where the episode had not ended there already."""
        if self.step == 0:
            return
        last = self.step - 1
        not_done = 1.0 - self.data["dones"][last]
        for name, next_values in bootstraps.items():
            self.data[name][last] += gamma * not_done * next_values
        self.data["dones"][last] = 1.0

    def state_dict(self) -> dict[str, Any]:
        """The steps stored so far and the next observations, as tensors: what a checkpoint keeps of a rollout in
        progress."""
        next_obs = None if self.next_obs is None else torch.from_numpy(self.next_obs.copy())
        return {"step": self.step, "next_obs": next_obs, "episode_costs": list(self.episode_costs),
                **{name: torch.from_numpy(value[: self.step].copy()) for name, value in self.data.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) - {"step", "next_obs", "episode_costs"} != set(self.data):
            raise ValueError(f"the saved rollout holds {sorted(state)}, this one {sorted(self.data)}: use the same "
                             f"options as the saved run.")
        self.step, self.episode_costs = int(state["step"]), list(state["episode_costs"])
        self.next_obs = None if state["next_obs"] is None else state["next_obs"].numpy()
        for name, value in self.data.items():
            value[: self.step] = state[name].numpy()


def as_flat_tensors(arrays: dict[str, np.ndarray], device: str | torch.device) -> dict[str, torch.Tensor]:
    """Rollout-shaped arrays (T, N, ...) as (T·N, ...) tensors on `device`: one copy per field and rollout."""
    return {name: torch.from_numpy(value.reshape(-1, *value.shape[2:])).to(device) for name, value in arrays.items()}
