"""What an agent's networks save and load, written once: the training state a checkpoint carries, the model file
(model.pt) `load` reads, and the config it recorded. The agents built from (obs_dim, action_low, action_high, config)
subclass `SavedAgent`; those built from (obs_dim, action_space, config) `SavedSpaceAgent`; the streaming agents
`SavedStreamAgent`."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from keelrl.agents.harness.checkpoints import MODEL_FILE, read_checkpoint, write_atomically
from keelrl.envs.streaming_wrappers import space_from_dict, space_to_dict
from keelrl.networks import pack_training_state, unpack_training_state


def saved_config(config_cls: type, values: dict[str, Any]) -> Any:
    """The config a model file recorded, as `config_cls` (lists back to tuples; an option keelrl has since
    removed does not change the model and is left out)."""
    known = {field.name for field in dataclasses.fields(config_cls)}
    return config_cls(**{name: tuple(value) if isinstance(value, list) else value
                         for name, value in values.items() if name in known})


class SavedAgent(nn.Module):
    """What an agent's networks save and load, written once: the training state a checkpoint carries and the
    model file (model.pt) `load` reads. A subclass sets `algo` and `config_cls`, takes (obs_dim, action_low,
    action_high, config) and calls `remember` with them first, and holds `optimizers` (name -> optimiser) and
    `num_updates`."""

    algo: ClassVar[str]
    """the name saved with the model, which `load` checks"""
    config_cls: ClassVar[type]

    def remember(self, obs_dim: int, action_low: np.ndarray, action_high: np.ndarray, config: Any) -> None:
        """Keep what `from_model_file` builds the agent again from: `config`, `obs_dim`, and the action bounds as
        the buffers `action_low` and `action_high` (saved with the networks)."""
        self.config, self.obs_dim = config, obs_dim
        self.register_buffer("action_low", torch.as_tensor(action_low, dtype=torch.float32))
        self.register_buffer("action_high", torch.as_tensor(action_high, dtype=torch.float32))

    def training_state(self) -> dict:
        """Networks, optimisers and the update counter: everything to continue training."""
        return pack_training_state(self, self.optimizers, self.num_updates)

    def load_training_state(self, state: dict) -> None:
        self.num_updates = unpack_training_state(self, self.optimizers, state)

    def save(self, path: str | os.PathLike) -> None:
        """Save networks (observation statistics included) and config: tensors and plain values only."""
        write_atomically(Path(path), self.model_file())

    def model_file(self) -> dict[str, Any]:
        return {"algo": self.algo, "config": dataclasses.asdict(self.config), "obs_dim": self.obs_dim,
                "networks": self.state_dict(), "num_updates": self.num_updates}

    def observation_batch(self, obs: Any) -> np.ndarray | torch.Tensor:
        """`obs` as the observations (B, obs_dim) `act` takes (a seed group's (S, B, obs_dim)): a numpy array or a
        tensor as it is, anything else (a list) as a numpy array; another shape is refused in one line, where it met
        torch's matmul error deep in the networks."""
        if not isinstance(obs, (np.ndarray, torch.Tensor)):
            obs = np.asarray(obs)
        dims = 3 if getattr(self, "num_seeds", 1) > 1 else 2
        if obs.ndim != dims or obs.shape[-1] != self.obs_dim:
            batch = "(S, B, obs_dim) for S seeds" if dims == 3 else "(B, obs_dim): obs[None] for one observation"
            raise ValueError(f"{self.algo} acts on a batch of observations {batch}, obs_dim {self.obs_dim} here; got "
                             f"shape {tuple(obs.shape)}.")
        return obs

    @classmethod
    def load(cls, path: str | os.PathLike, device: str = "cpu") -> SavedAgent:
        """The agent saved at `path` (a model.pt, or a run directory holding one), on `device`, which its config then
        names too: a model trained on a GPU acts on the CPU (its sampling noise and compiled losses follow the
        config's device)."""
        path = Path(path) / MODEL_FILE if Path(path).is_dir() else Path(path)
        state = read_checkpoint(path, cls.algo)
        if "networks" not in state:
            raise ValueError(f"{path} is a run's checkpoint (its training state), not a model file: load the run's "
                             f"{MODEL_FILE}, written when it finished.")
        if "device" in state["config"]:
            state = {**state, "config": {**state["config"], "device": str(torch.device(device))}}
        return cls.from_model_file(state).to(device)

    @classmethod
    def from_model_file(cls, state: dict[str, Any]) -> SavedAgent:
        networks = state["networks"]
        agent = cls(state["obs_dim"], networks["action_low"].cpu().numpy(), networks["action_high"].cpu().numpy(),
                    saved_config(cls.config_cls, state["config"]))
        agent.load_state_dict(networks)
        agent.num_updates = int(state.get("num_updates", 0))  # what schedules read (a loaded Q(λ)'s ε, say)
        return agent


class SavedSpaceAgent(SavedAgent):
    """`SavedAgent` for the agents built from (obs_dim, action_space, config), Box or Discrete actions: their model
    file also keeps the action space."""

    def model_file(self) -> dict[str, Any]:
        return {**super().model_file(), "action_space": space_to_dict(self.action_space)}

    @classmethod
    def from_model_file(cls, state: dict[str, Any]) -> SavedSpaceAgent:
        action_space: gym.Space = space_from_dict(state["action_space"])
        agent = cls(state["obs_dim"], action_space, saved_config(cls.config_cls, state["config"]))
        agent.load_state_dict(state["networks"])
        agent.num_updates = int(state.get("num_updates", 0))  # what schedules read (a loaded Q(λ)'s ε, say)
        return agent


class SavedStreamAgent(SavedSpaceAgent):
    """`SavedSpaceAgent` for the streaming agents, whose model file also keeps `env_state`: the statistics of the
    env wrappers they act through."""

    env_state: dict[str, dict[str, torch.Tensor]]

    def model_file(self) -> dict[str, Any]:
        return {**super().model_file(), "env_state": self.env_state}

    @classmethod
    def from_model_file(cls, state: dict[str, Any]) -> SavedStreamAgent:
        agent = super().from_model_file(state)
        agent.env_state = state["env_state"]
        return agent

    def observation_tensor(self, obs: np.ndarray) -> torch.Tensor:
        """One observation (obs_dim,) as the networks take it. A batch, or the env's own observation (without the
        wrappers' normalisation and time feature), is refused in one line: acting on either gave a wrong answer
        (a batch's flattened argmax) or torch's shape error."""
        if np.shape(obs) != (self.obs_dim,):
            raise ValueError(f"{self.algo} acts on one observation at a time, as its env wrappers give it (shape "
                             f"({self.obs_dim},): normalised, with the time feature), got shape {np.shape(obs)}; "
                             f"keelrl.agents.{self.algo}.evaluate plays episodes through those wrappers.")
        return torch.as_tensor(obs, dtype=torch.float32)
