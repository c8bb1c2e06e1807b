"""Uniform replay buffer with preallocated torch storage, vectorised adds and optional n-step returns."""

from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np
import torch

from keelrl.networks.transfers import to_device


class Batch(NamedTuple):
    """A sampled batch; every field has leading dimension B (batch size).

    The TD target of a transition is `rewards + discounts * (1 - terminated) * V(next_obs)`:
    with n-step returns, `rewards` is the discounted sum over the steps taken and `discounts`
    is gamma to the power of their number (gamma for 1-step).
    """

    obs: torch.Tensor  # (B, *obs_shape)
    actions: torch.Tensor  # (B, *action_shape)
    rewards: torch.Tensor  # (B,)
    next_obs: torch.Tensor  # (B, *obs_shape)
    terminated: torch.Tensor  # (B,) float 0/1; truncation is not termination
    discounts: torch.Tensor  # (B,)
    costs: torch.Tensor | None = None  # (B,) when the buffer stores costs
    mc_returns: torch.Tensor | None = None  # (B,) discounted return-to-go of each transition (offline data)


class ReplayBuffer:
    """Stores transitions from `num_envs` envs in preallocated tensors on `device`.

    Rows are written env-interleaved: the transition of env e at vector step t sits at
    `(t * num_envs + e) % capacity`, so the next step of the same env is `num_envs` rows later.
    `capacity` is rounded up to a multiple of `num_envs`.
    """

    FIELDS = ("obs", "next_obs", "actions", "rewards", "terminated", "truncated", "costs")
    """the stored tensors, a row per transition (`costs` None unless store_cost)"""

    def __init__(
        self,
        capacity: int,
        obs_shape: tuple[int, ...],
        action_shape: tuple[int, ...],
        num_envs: int = 1,
        device: str | torch.device = "cpu",
        n_step: int = 1,
        gamma: float = 0.99,
        store_cost: bool = False,
        seed: int = 0,
    ):
        if capacity < 1 or num_envs < 1:
            raise ValueError(f"capacity and num_envs must be positive, got {capacity} and {num_envs}.")
        if n_step < 1:
            raise ValueError(f"n_step must be at least 1, got {n_step}.")
        self.num_envs = num_envs
        self.capacity = -(-capacity // num_envs) * num_envs
        self.device = torch.device(device)
        self.n_step = n_step
        self.gamma = gamma
        self.pos = 0
        self.size = 0

        def storage(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return torch.zeros((self.capacity, *shape), dtype=dtype, device=self.device)

        self.obs = storage(*obs_shape)
        self.next_obs = storage(*obs_shape)
        self.actions = storage(*action_shape)
        self.rewards = storage()
        self.terminated = storage(dtype=torch.bool)
        self.truncated = storage(dtype=torch.bool)
        self.costs = storage() if store_cost else None
        self.stored = [name for name in self.FIELDS if getattr(self, name) is not None]
        """the names of the tensors this buffer keeps, in FIELDS' order"""
        self.columns: dict[str, slice] = {}
        """where each stored field sits in a `pack`ed row"""
        start = 0
        for name in self.stored:
            width = getattr(self, name).shape[1:].numel()
            self.columns[name], start = slice(start, start + width), start + width
        # on the CPU, numpy views of the storage: a numpy copy per field costs a tenth of a torch copy
        on_host = self.device.type == "cpu"
        self.host_views = {name: getattr(self, name).numpy() for name in self.stored} if on_host else {}
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        self._one_step_discounts: dict[int, torch.Tensor] = {}

    def __len__(self) -> int:
        return self.size

    def add(self, obs, actions, rewards, next_obs, terminated, truncated, costs=None) -> None:
        """Add one vector step: each argument has leading dimension num_envs (numpy or torch).

        `next_obs` must be the true observation each transition led to (`info["final_obs"]`
        from keelrl's vector envs), not the reset observation of a new episode.
        """
        self.write(self.pack(obs, actions, rewards, next_obs, terminated, truncated, costs))

    def pack(self, obs, actions, rewards, next_obs, terminated, truncated, costs=None) -> np.ndarray:
        """One vector step's fields side by side as float32 rows on the host (num_envs, F), each field at its
        `columns`, flags as 0/1: on a GPU one copy takes them all (a copy per field from pageable memory would each
        wait for the GPU to finish its queued work)."""
        if self.costs is not None and costs is None:
            raise ValueError("This buffer stores costs: pass costs to add() (the env's info['cost']).")
        given = {"obs": obs, "next_obs": next_obs, "actions": actions, "rewards": rewards, "terminated": terminated,
                 "truncated": truncated, "costs": costs}
        fields = []
        for name in self.stored:
            value = given[name].cpu() if isinstance(given[name], torch.Tensor) else given[name]
            value, columns = np.asarray(value, dtype=np.float32), self.columns[name]
            if value.size != self.num_envs * (columns.stop - columns.start):
                raise ValueError(f"add(): {name} has shape {value.shape}; this buffer stores "
                                 f"{(self.num_envs, *getattr(self, name).shape[1:])} per vector step.")
            fields.append(value.reshape(self.num_envs, -1))
        return np.concatenate(fields, axis=1)

    def write(self, packed: np.ndarray | torch.Tensor) -> None:
        """Store one `pack`ed vector step (num_envs, F) in the next rows: a numpy array (a buffer on the CPU writes it
        through numpy views of its storage, one on a GPU copies it there first) or a tensor on the storage device."""
        if isinstance(packed, np.ndarray) and not self.host_views:
            packed = to_device(packed, self.device)
        rows = slice(self.pos, self.pos + self.num_envs)
        for name in self.stored:
            storage = self.host_views[name] if isinstance(packed, np.ndarray) else getattr(self, name)
            # (num_envs, width) -> (num_envs, *row shape); a flag's storage is bool: 1.0 is stored as True
            storage[rows] = packed[:, self.columns[name]].reshape(-1, *storage.shape[1:])
        self.pos = (self.pos + self.num_envs) % self.capacity
        self.size = min(self.size + self.num_envs, self.capacity)

    def end_episodes(self) -> None:
        """Mark the newest transition of every env as the end of its episode (a truncation): call it when
        the envs restart mid-episode, as a resumed run does, so n-step returns do not run on into the new
        episodes. The transitions themselves stay valid (their next observations are the true ones)."""
        if self.size == 0:
            return
        newest = torch.arange(self.pos - self.num_envs, self.pos, device=self.device) % self.capacity
        self.truncated[newest] = True

    def sample(self, batch_size: int) -> Batch:
        """Sample `batch_size` transitions uniformly with replacement."""
        if self.size == 0:
            raise ValueError("Cannot sample from an empty replay buffer.")
        idx = torch.randint(0, self.size, (batch_size,), device=self.device, generator=self.generator)
        if self.n_step == 1:
            return Batch(
                obs=self.obs[idx],
                actions=self.actions[idx],
                rewards=self.rewards[idx],
                next_obs=self.next_obs[idx],
                terminated=self.terminated[idx].float(),
                discounts=self._constant_discounts(batch_size),
                costs=None if self.costs is None else self.costs[idx],
            )
        return self._sample_n_step(idx)

    def _constant_discounts(self, batch_size: int) -> torch.Tensor:
        if batch_size not in self._one_step_discounts:
            self._one_step_discounts[batch_size] = torch.full((batch_size,), self.gamma, device=self.device)
        return self._one_step_discounts[batch_size]

    def _sample_n_step(self, idx: torch.Tensor) -> Batch:
        """Sum up to n rewards of the same env, stopping at an episode end or the newest data."""
        num_blocks = self.capacity // self.num_envs
        newest_block = (self.pos // self.num_envs - 1) % num_blocks
        steps_stored_after = (newest_block - idx // self.num_envs) % num_blocks
        last = idx.clone()
        rewards = self.rewards[idx].clone()
        costs = None if self.costs is None else self.costs[idx].clone()
        discounts = torch.full_like(rewards, self.gamma)
        active = ~(self.terminated[idx] | self.truncated[idx])
        for k in range(1, self.n_step):
            following = (idx + k * self.num_envs) % self.capacity
            take = active & (steps_stored_after >= k)
            weight = take.float() * self.gamma**k
            rewards += weight * self.rewards[following]
            if costs is not None:
                costs += weight * self.costs[following]
            last = torch.where(take, following, last)
            discounts = torch.where(take, torch.full_like(discounts, self.gamma ** (k + 1)), discounts)
            active = take & ~(self.terminated[following] | self.truncated[following])
        return Batch(
            obs=self.obs[idx],
            actions=self.actions[idx],
            rewards=rewards,
            next_obs=self.next_obs[last],
            terminated=self.terminated[last].float(),
            discounts=discounts,
            costs=costs,
        )

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The stored transitions and sampling state (tensors only, safe to load with weights_only). The filled rows
        are copied to the host: torch.save writes a view's whole storage, so a view would save the full capacity
        (and a copy on the GPU would take a second buffer's memory there)."""
        rows = {name: getattr(self, name)[: self.size].to("cpu", copy=True) for name in self.stored}
        return {**rows, "pos": torch.tensor(self.pos), "capacity": torch.tensor(self.capacity),
                "num_envs": torch.tensor(self.num_envs), "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if int(state["capacity"]) != self.capacity or int(state["num_envs"]) != self.num_envs:
            raise ValueError(
                f"Saved buffer has capacity {int(state['capacity'])} for {int(state['num_envs'])} envs; "
                f"this one has {self.capacity} for {self.num_envs}: use the same buffer size and num_envs."
            )
        if ("costs" in state) != (self.costs is not None):
            raise ValueError("Saved buffer and this buffer disagree on storing costs.")
        self.size = state["obs"].shape[0]
        self.pos = int(state["pos"])
        for name in self.FIELDS:
            if name in state:
                getattr(self, name)[: self.size] = state[name].to(self.device)
        self.generator.set_state(state["generator"])

    def save(self, path: str | os.PathLike) -> None:
        """Write atomically (a temporary file, then a rename): a run killed mid-write keeps the previous file."""
        tmp = f"{path}.tmp"
        torch.save(self.state_dict(), tmp)
        os.replace(tmp, path)

    def load(self, path: str | os.PathLike) -> None:
        self.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))



class SeedReplay:
    """The replay buffers of S seeds used as one (several seeds trained in one process): `add` takes arrays with a
    leading seed axis, (S, num_envs, ...), and `sample` draws each seed's batch from its own buffer with its own
    generator and stacks them, every field (S, batch_size, ...)."""

    def __init__(self, buffers: list[ReplayBuffer]):
        self.buffers = buffers

    def __len__(self) -> int:
        return len(self.buffers[0])

    def add(self, obs, actions, rewards, next_obs, terminated, truncated, costs=None) -> None:
        packed = np.stack([buffer.pack(obs[i], actions[i], rewards[i], next_obs[i], terminated[i], truncated[i],
                                       None if costs is None else costs[i])
                           for i, buffer in enumerate(self.buffers)])  # (S, num_envs, F)
        if not self.buffers[0].host_views:
            packed = to_device(packed, self.buffers[0].device)  # one copy to the GPU for all seeds
        for buffer, rows in zip(self.buffers, packed):
            buffer.write(rows)

    def sample(self, batch_size: int) -> Batch:
        batches = [buffer.sample(batch_size) for buffer in self.buffers]
        return Batch(*(None if fields[0] is None else torch.stack(fields) for fields in zip(*batches)))
