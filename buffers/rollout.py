"""The on-policy rollout: `num_steps` vector-env steps of `num_envs` envs, then generalised advantage estimation.

Step t of env e holds the observation acted on (as the networks saw it), the action, its log-probability under
the acting policy, the value V(obs), the reward, and `dones`: whether the episode ended at that step
(terminated or truncated; a truncated step's reward already carries γ V(true final observation), so cutting the
return there loses nothing). An agent with a constraint also stores costs and cost values.
"""

from __future__ import annotations

from typing import Any

import torch

FIELDS = ("obs", "actions", "log_probs", "values", "rewards", "dones")
COST_FIELDS = ("costs", "cost_values")


def gae(rewards: torch.Tensor, values: torch.Tensor, dones: torch.Tensor, next_values: torch.Tensor, gamma: float,
        lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over a rollout (T, N): advantages and returns (advantages + values).

    δ_t = r_t + γ (1 − d_t) V_{t+1} − V_t, A_t = δ_t + γλ (1 − d_t) A_{t+1}, with V_T = `next_values` (N,), the
    value of the observation after the last step."""
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(next_values)
    for t in reversed(range(rewards.shape[0])):
        following = next_values if t == rewards.shape[0] - 1 else values[t + 1]
        not_done = 1.0 - dones[t]
        delta = rewards[t] + gamma * not_done * following - values[t]
        advantages[t] = last = delta + gamma * lam * not_done * last
    return advantages, advantages + values


class RolloutBuffer:
    """Preallocated storage for one rollout on `device`; `add` one vector step at a time until `full`."""

    def __init__(self, num_steps: int, num_envs: int, obs_shape: tuple[int, ...], action_shape: tuple[int, ...],
                 device: str | torch.device = "cpu", store_cost: bool = False, action_dtype: torch.dtype = torch.float32):
        self.num_steps, self.num_envs = num_steps, num_envs
        shapes = {"obs": obs_shape, "actions": action_shape}
        names = FIELDS + (COST_FIELDS if store_cost else ())
        self.data = {name: torch.zeros((num_steps, num_envs, *shapes.get(name, ())), device=device,
                                       dtype=action_dtype if name == "actions" else torch.float32) for name in names}
        self.step = 0
        self.next_obs: torch.Tensor | None = None
        """the raw observations the next step acts on (kept with a checkpoint)"""
        self.episode_costs: list[float] = []
        """the costs of the episodes that ended during this rollout (with store_cost: what a Lagrange multiplier
        steps on)"""

    @property
    def full(self) -> bool:
        return self.step == self.num_steps

    def add(self, **step: torch.Tensor) -> None:
        """Store one vector step (every field, each (num_envs, ...))."""
        for name, value in step.items():
            self.data[name][self.step] = value
        self.step += 1

    def clear(self) -> None:
        """Start the next rollout (the storage is overwritten, not freed)."""
        self.step = 0
        self.episode_costs = []

    def truncate_last_step(self, bootstraps: dict[str, torch.Tensor], gamma: float) -> None:
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
        """The steps stored so far and the next observations: what a checkpoint keeps of a rollout in progress."""
        return {"step": self.step, "next_obs": self.next_obs, "episode_costs": list(self.episode_costs),
                **{name: value[: self.step].clone() for name, value in self.data.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) - {"step", "next_obs", "episode_costs"} != set(self.data):
            raise ValueError(f"the saved rollout holds {sorted(state)}, this one {sorted(self.data)}: use the same "
                             f"options as the saved run.")
        self.step, self.next_obs, self.episode_costs = int(state["step"]), state["next_obs"], state["episode_costs"]
        for name, value in self.data.items():
            value[: self.step] = state[name].to(value.device)
