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
    """Generalised advantage estimation over a rollout (T, N) (a seed group's (S, T, N)): advantages and returns
    (advantages + values).

    δ_t = r_t + γ (1 − d_t) V_{t+1} − V_t, A_t = δ_t + γλ (1 − d_t) A_{t+1}, with V_T = `next_values` (N,) (a seed
    group's (S, N)), the value of the observation after the last step."""
    advantages = np.zeros_like(rewards)
    last = np.zeros_like(next_values)
    following = next_values
    for t in reversed(range(rewards.shape[-2])):
        not_done = 1.0 - dones[..., t, :]
        delta = rewards[..., t, :] + gamma * not_done * following - values[..., t, :]
        advantages[..., t, :] = last = delta + gamma * lam * not_done * last
        following = values[..., t, :]
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

    def add_episode_costs(self, costs: np.ndarray) -> None:
        """The costs of the episodes that ended at the last step."""
        self.episode_costs.extend(costs.tolist())

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


class SeedRollouts:
    """The rollouts of S seeds used as one (several seeds trained in one process): `add` takes arrays with a leading
    seed axis, (S, num_envs, ...), `data` and `next_obs` give them stacked, (S, num_steps, num_envs, ...) and
    (S, num_envs, ...); each seed's own rollout (`buffers`) is what that seed's checkpoint keeps."""

    def __init__(self, buffers: list[RolloutBuffer]):
        self.buffers = buffers

    @property
    def full(self) -> bool:
        return self.buffers[0].full

    @property
    def data(self) -> dict[str, np.ndarray]:
        return {name: np.stack([buffer.data[name] for buffer in self.buffers]) for name in self.buffers[0].data}

    @property
    def next_obs(self) -> np.ndarray | None:
        return None if self.buffers[0].next_obs is None else np.stack([buffer.next_obs for buffer in self.buffers])

    @next_obs.setter
    def next_obs(self, next_obs: np.ndarray) -> None:
        for buffer, seed_next_obs in zip(self.buffers, next_obs, strict=True):
            buffer.next_obs = seed_next_obs

    @property
    def episode_costs(self) -> list[list[float]]:
        """Each seed's episode costs of this rollout."""
        return [buffer.episode_costs for buffer in self.buffers]

    def add(self, **step: np.ndarray) -> None:
        for i, buffer in enumerate(self.buffers):
            buffer.add(**{name: value[i] for name, value in step.items()})

    def add_episode_costs(self, costs: list[np.ndarray]) -> None:
        for buffer, seed_costs in zip(self.buffers, costs, strict=True):
            buffer.add_episode_costs(seed_costs)

    def clear(self) -> None:
        for buffer in self.buffers:
            buffer.clear()

    def truncate_last_step(self, bootstraps: dict[str, np.ndarray], gamma: float) -> None:
        """Each seed's `RolloutBuffer.truncate_last_step`, with its values (S, N)."""
        for i, buffer in enumerate(self.buffers):
            buffer.truncate_last_step({name: values[i] for name, values in bootstraps.items()}, gamma)


def as_flat_tensors(arrays: dict[str, np.ndarray], device: str | torch.device,
                    seed_axis: bool = False) -> dict[str, torch.Tensor]:
    """Rollout-shaped arrays (T, N, ...) as (T·N, ...) tensors on `device` (with `seed_axis`, a seed group's
    (S, T, N, ...) as (S, T·N, ...)): one copy per field and rollout."""
    lead = int(seed_axis)
    return {name: torch.from_numpy(value.reshape(*value.shape[:lead], -1, *value.shape[lead + 2:])).to(device)
            for name, value in arrays.items()}
