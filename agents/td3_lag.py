"""TD3-Lag: TD3 under an episode-cost constraint, by a learned Lagrange multiplier.

Run:     python -m keelrl.agents.td3_lag --env-id keelrl/SafeHopperVelocity-v1 --cost-limit 25
Import:  from keelrl.agents.td3_lag import TD3Lag, TD3LagConfig, train, evaluate

The algorithm, top to bottom (TD3's parts come from agents/td3.py, the cost side from agents/lagrange.py):
- TD3's twin reward critics, deterministic actor, target policy smoothing and delayed updates, unchanged;
- a cost critic ensemble regresses onto c + γ(1 − terminated) Q_c,target(s', ã'), ã' the target
  actor's action with the same clipped smoothing noise; its target follows after every step;
- every `policy_frequency` updates the actor descends (−Q1_r(s, π(s)) + λ Q_c(s, π(s))) / (1 + λ);
- λ >= 0 steps on (mean cost − `cost_limit`) of the training episodes that end at a vector-env step,
  once per such step and never on the gradient updates in between (gradient or PID; agents/lagrange.py
  gives the exact rule and how it differs from OmniSafe's).
The task must report `info["cost"]` (keelrl/Safe*Velocity-v1, or an env in keelrl.envs.CostWrapper).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from keelrl.agents.common import TrainResult, run_cli
from keelrl.agents.lagrange import (
    LagrangeOptions,
    LagrangianMixin,
    lagrangian_actor_loss,
    train_constrained,
    validate_lagrange,
)
from keelrl.agents.off_policy import evaluate
from keelrl.agents.td3 import TD3, TD3Config
from keelrl.agents.td3 import validate as validate_td3
from keelrl.buffers import Batch

__all__ = ["TD3Lag", "TD3LagConfig", "train", "evaluate"]


@dataclasses.dataclass
class TD3LagConfig(LagrangeOptions, TD3Config):
    env_id: str = "keelrl/SafeHopperVelocity-v1"
    """gymnasium id of a task that reports info["cost"] (keelrl/Safe{Hopper,HalfCheetah,Walker2d,Ant,Humanoid,Swimmer}Velocity-v1)"""


def validate(config: TD3LagConfig) -> None:
    validate_td3(config)
    validate_lagrange(config, "TD3-Lag")


class TD3Lag(LagrangianMixin, TD3):
    """TD3 plus a cost critic and a Lagrange multiplier; takes raw observations."""

    algo = "td3_lag"
    config_cls = TD3LagConfig
    presets = TD3.presets

    def __init__(self, obs_dim: int, action_low: np.ndarray, action_high: np.ndarray, config: TD3LagConfig):
        super().__init__(obs_dim, action_low, action_high, config)  # TD3's networks and optimisers
        self.init_cost_side(obs_dim, len(action_low), config, lr=config.learning_rate)

    def learn(self, batch: Batch) -> dict[str, torch.Tensor]:
        """TD3's update (its actor loss is the Lagrangian one below), then one cost critic step."""
        losses = super().learn(batch)
        with torch.no_grad():
            next_actions = self.smoothed_target_actions(batch.next_obs)
        losses.update(self.cost_critic_step(batch, next_actions))
        return losses

    def actor_loss(self, obs: torch.Tensor) -> torch.Tensor:
        """(−Q1(s, π(s)) + λ Q_c(s, π(s))) / (1 + λ): the first reward critic, as in the TD3 paper."""
        actions = self.actor(obs)
        q_pi = self.q_values(obs, actions, first_only=True).squeeze(0)  # (1, B) -> (B,)
        return lagrangian_actor_loss(-q_pi, self.cost_values(obs, actions), self.lagrange_multiplier)

    def _update_actor(self, obs: torch.Tensor) -> torch.Tensor:
        with self.frozen_cost_critic():
            return super()._update_actor(obs)


def train(config: TD3LagConfig) -> TrainResult:
    """Train TD3-Lag until `config.total_timesteps` environment steps (see agents/off_policy.py); prints the
    final evaluation cost beside the limit."""
    return train_constrained(TD3Lag, config, validate)


if __name__ == "__main__":
    raise SystemExit(run_cli(train, TD3LagConfig))
