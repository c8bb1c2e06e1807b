"""SAC-Lag: Soft Actor-Critic under an episode-cost constraint, by a learned Lagrange multiplier.

Run:     python -m keelrl.agents.sac_lag --env-id keelrl/SafeHopperVelocity-v1 --cost-limit 25
Import:  from keelrl.agents.sac_lag import SACLag, SACLagConfig, train, evaluate

The algorithm, top to bottom (SAC's parts come from agents/sac.py, the cost side from agents/lagrange.py):
- SAC's twin reward critics, tanh-Gaussian actor and autotuned α, unchanged;
- a cost critic ensemble regresses onto c + γ(1 − terminated) Q_c,target(s', a'), a' ~ π(·|s'), and its
  target follows by Polyak averaging after every step;
- the actor descends (α log π(a|s) − min Q_r(s, a) + λ Q_c(s, a)) / (1 + λ), a ~ π(·|s);
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
from keelrl.agents.sac import SAC, SACConfig
from keelrl.agents.sac import validate as validate_sac
from keelrl.buffers import Batch

__all__ = ["SACLag", "SACLagConfig", "train", "evaluate"]


@dataclasses.dataclass
class SACLagConfig(LagrangeOptions, SACConfig):
    env_id: str = "keelrl/SafeHopperVelocity-v1"
    """gymnasium id of a task that reports info["cost"] (keelrl/Safe{Hopper,HalfCheetah,Walker2d,Ant,Humanoid,Swimmer}Velocity-v1)"""


def validate(config: SACLagConfig) -> None:
    validate_sac(config)
    validate_lagrange(config, "SAC-Lag")


class SACLag(LagrangianMixin, SAC):
    """SAC plus a cost critic and a Lagrange multiplier; takes raw observations."""

    algo = "sac_lag"
    config_cls = SACLagConfig
    presets = SAC.presets

    def __init__(self, obs_dim: int, action_low: np.ndarray, action_high: np.ndarray, config: SACLagConfig):
        super().__init__(obs_dim, action_low, action_high, config)  # SAC's networks and optimisers
        self.init_cost_side(obs_dim, len(action_low), config, lr=config.q_lr)

    def learn(self, batch: Batch) -> dict[str, torch.Tensor]:
        """SAC's update (its actor loss is the Lagrangian one below), then one cost critic step."""
        losses = super().learn(batch)
        with torch.no_grad():
            next_actions, _ = self.actor.sample(batch.next_obs)
        losses.update(self.cost_critic_step(batch, next_actions))
        return losses

    def actor_loss(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(α log π(a|s) − min_i Q_i(s, a) + λ Q_c(s, a)) / (1 + λ) with a ~ π(·|s), and the detached log π(a|s)."""
        actions, log_prob = self.actor.sample(obs)
        q_pi = self.q_values(obs, actions).min(dim=0).values
        loss = lagrangian_actor_loss(self.alpha * log_prob - q_pi, self.cost_values(obs, actions),
                                     self.lagrange_multiplier)
        return loss, log_prob.detach()

    def _update_actor_and_alpha(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        with self.frozen_cost_critic():
            return super()._update_actor_and_alpha(obs)


def train(config: SACLagConfig) -> TrainResult:
    """Train SAC-Lag until `config.total_timesteps` environment steps (see agents/off_policy.py); prints the
    final evaluation cost beside the limit."""
    return train_constrained(SACLag, config, validate)


if __name__ == "__main__":
    raise SystemExit(run_cli(train, SACLagConfig))
