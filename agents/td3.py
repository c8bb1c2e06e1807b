"""Twin Delayed DDPG (Fujimoto et al. 2018) with CleanRL's defaults.

Run:     python -m keelrl.agents.td3 --env-id Hopper-v5
Import:  from keelrl.agents.td3 import TD3, TD3Config, train, evaluate

The algorithm, top to bottom:
- a deterministic tanh actor explores with Gaussian noise of std `exploration_noise` × action scale;
- twin Q critics (one batched ensemble) regress onto r + γ(1 − terminated) min Q_target(s', ã'), where
  ã' is the target actor's action plus clipped Gaussian noise (target policy smoothing);
- every `policy_frequency` critic updates, the actor ascends Q1(s, actor(s)) and the target actor
  and critics follow by Polyak averaging with rate τ.
The training loop (collect, store, update, log, evaluate, checkpoint) is in agents/off_policy.py.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import torch

from keelrl.agents.common import TrainResult, run_cli
from keelrl.agents.off_policy import (
    MUJOCO_DISCOUNT,
    OffPolicyAgent,
    OffPolicyConfig,
    build_actor,
    evaluate,
    train_off_policy,
    validate_off_policy,
)
from keelrl.buffers import Batch

__all__ = ["TD3", "TD3Config", "train", "evaluate"]


@dataclasses.dataclass
class TD3Config(OffPolicyConfig):
    learning_starts: int = 25_000
    """environment steps of uniform random actions before learning starts"""
    learning_rate: float = 3e-4
    """actor and critic learning rate"""
    policy_noise: float = 0.2
    """std of the target policy smoothing noise, in units of the action scale"""
    noise_clip: float = 0.5
    """the smoothing noise is clipped to ±noise_clip (action-scale units)"""
    exploration_noise: float = 0.1
    """std of the exploration noise, in units of the action scale"""


def validate(config: TD3Config) -> None:
    validate_off_policy(config)
    for name in ("learning_rate", "policy_noise", "noise_clip", "exploration_noise"):
        if getattr(config, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be non-negative, got {getattr(config, name)}.")


class TD3(OffPolicyAgent):
    """The TD3 networks and update rule; takes raw observations (normalised inside when configured)."""

    algo = "td3"
    config_cls = TD3Config
    # The SimBa and SimbaV2 papers' networks, critics, optimisers and MuJoCo run settings on TD3's update rule
    # (the policy delay stays TD3's: neither reference has TD3). Values and sources as SAC's presets
    # (agents/sac.py); SimBa's DDPG (github.com/SonyResearch/simba configs/agent/ddpg_simba.yaml:10,15-16,21-22)
    # has the same observation normalisation, lr 1e-4 and AdamW weight decay 1e-2 on actor and critic, and
    # exploration noise 0.1 (:32, keelrl's default). Learning starts at 5000 steps (configs/buffer/
    # numpy_uniform.yaml:7 of both repos) instead of TD3's 25000; γ 0.995 from their episode-length heuristic.
    presets = {
        "simba": dict(network="simba", normalize_obs=True, obs_clip=None, optimizer="adamw", weight_decay=1e-2,
                      learning_rate=1e-4, utd=2, gamma=MUJOCO_DISCOUNT, learning_starts=5_000),
        "simbav2": dict(network="simbav2", normalize_obs=True, obs_clip=None, critic_head="c51", num_bins=101,
                        scale_rewards=True, optimizer="adam", learning_rate=1e-4, final_lr_fraction=0.5, utd=1,
                        gamma=MUJOCO_DISCOUNT, learning_starts=5_000),
    }

    def __init__(self, obs_dim: int, action_low: np.ndarray, action_high: np.ndarray, config: TD3Config):
        super().__init__(obs_dim, action_low, action_high, config)  # critics, value head, normalisers
        self.actor = build_actor(config, obs_dim, action_low, action_high, stochastic=False)
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self.set_optimizers({"actor": (list(self.actor.parameters()), config.learning_rate),
                             "critic": (list(self.critic.parameters()), config.learning_rate)})
        self._online_params = [*self.actor.parameters(), *self.critic.parameters()]
        self._target_params = [*self.actor_target.parameters(), *self.critic_target.parameters()]
        self._critic_loss, self._actor_loss = self.compiled(self.critic_loss), self.compiled(self.actor_loss)

    def policy(self, obs: torch.Tensor, deterministic: bool) -> torch.Tensor:
        actions = self.actor(obs)
        if deterministic:
            return actions
        noise = torch.randn_like(actions) * (self.actor.action_scale * self.config.exploration_noise)
        return torch.clamp(actions + noise, self.action_low, self.action_high)

    def learn(self, batch: Batch) -> dict[str, torch.Tensor]:
        """One critic step; every `policy_frequency` updates, one actor step and the target updates."""
        losses = self._update_critic(batch)
        if (self.num_updates + 1) % self.config.policy_frequency == 0:
            losses["losses/actor_loss"] = self._update_actor(batch.obs)
            with torch.no_grad():
                torch._foreach_lerp_(self._target_params, self._online_params, self.config.tau)
        return losses

    def critic_loss(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Every critic's loss against r + γ(1 − terminated) min Q'(s', ã'), ã' the target actor's action
        plus clipped noise; and the critics' outputs."""
        with torch.no_grad():
            target = self.td_target(batch, self.smoothed_target_actions(batch.next_obs), next_bonus=0.0)
        return self.critic_regression_loss(batch, target)

    def smoothed_target_actions(self, next_obs: torch.Tensor) -> torch.Tensor:
        """The target actor's actions plus Gaussian noise clipped to ±noise_clip (target policy smoothing)."""
        actions = self.actor_target(next_obs)
        noise = torch.randn_like(actions) * self.config.policy_noise
        noise = noise.clamp(-self.config.noise_clip, self.config.noise_clip) * self.actor.action_scale
        return torch.clamp(actions + noise, self.action_low, self.action_high)

    def actor_loss(self, obs: torch.Tensor) -> torch.Tensor:
        """−Q1(s, actor(s)): the first critic only, as in the TD3 paper."""
        return -self.q_values(obs, self.actor(obs), first_only=True).mean()

    def _update_critic(self, batch: Batch) -> dict[str, torch.Tensor]:
        return self.apply_critic_loss(*self._critic_loss(batch))

    def _update_actor(self, obs: torch.Tensor) -> torch.Tensor:
        self.critic.requires_grad_(False)  # the actor loss needs gradients w.r.t. actions only
        actor_loss = self._actor_loss(obs)
        self.critic.requires_grad_(True)
        self.optimize("actor", actor_loss)
        return actor_loss.detach()

def train(config: TD3Config) -> TrainResult:
    """Train TD3 until `config.total_timesteps` environment steps (see agents/off_policy.py)."""
    return train_off_policy(TD3, config, validate)


if __name__ == "__main__":
    raise SystemExit(run_cli(train, TD3Config))
