"""Soft Actor-Critic (Haarnoja et al. 2018) with CleanRL's defaults.

Run:     python -m keelrl.agents.sac --env-id Hopper-v5
Import:  from keelrl.agents.sac import SAC, SACConfig, train, evaluate

The algorithm, top to bottom:
- twin Q critics (one batched ensemble) regress onto r + γ(1 − terminated)(min Q_target(s', a') − α log π(a'|s'));
- every `policy_frequency` critic updates, the tanh-Gaussian actor takes `policy_frequency` steps
  on α log π(a|s) − min Q(s, a), and α is tuned so the policy entropy tracks −|A|;
- target critics follow by Polyak averaging with rate τ.
The training loop (collect, store, update, log, evaluate, checkpoint) is in agents/off_policy.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from torch import nn

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

__all__ = ["SAC", "SACConfig", "train", "evaluate"]


@dataclasses.dataclass
class SACConfig(OffPolicyConfig):
    policy_lr: float = 3e-4
    """actor learning rate"""
    q_lr: float = 1e-3
    """critic (and entropy coefficient) learning rate"""
    target_network_frequency: int = 1
    """critic updates between target network updates"""
    alpha: float = 0.2
    """entropy coefficient when not autotuned"""
    autotune: bool = True
    """tune the entropy coefficient, from 1.0 as CleanRL does, so the policy entropy tracks the target"""
    alpha_init: float = 1.0
    """initial entropy coefficient when autotuned"""
    target_entropy_scale: float = -1.0
    """target entropy = target_entropy_scale * action dimension"""


def validate(config: SACConfig) -> None:
    validate_off_policy(config)
    if config.target_network_frequency < 1:
        raise ValueError(f"--target-network-frequency must be positive, got {config.target_network_frequency}.")
    if config.alpha <= 0 or config.alpha_init <= 0:
        raise ValueError(f"--alpha and --alpha-init must be positive, got {config.alpha} and {config.alpha_init}.")


class SAC(OffPolicyAgent):
    """The SAC networks and update rule; takes raw observations (normalised inside when configured)."""

    algo = "sac"
    config_cls = SACConfig
    # The references' MuJoCo configurations (1000-step episodes, no action repeat). Options not named here
    # already have the reference's value as keelrl's default: batch 256, buffer 1e6, learning starts 5000
    # (both repos' configs/buffer/numpy_uniform.yaml:6-9), τ 0.005, 1-step returns, twin critics with the
    # minimum (critic_use_cdq = env.episodic, true on MuJoCo), actor d 128 × 1 block, critic d 512 × 2 blocks.
    # Both references update actor and temperature once with every critic update (policy_frequency 1).
    presets = {
        # Lee et al. 2024 (SimBa), github.com/SonyResearch/simba:
        #   configs/agent/sac_simba.yaml:10 normalize_observation (agents/wrappers/normalization.py:32: no clip)
        #   :13-14,19-20 actor 1 × 128, critic 2 × 512 (keelrl's defaults); :15,21,28 lr 1e-4 actor, critic, temperature;
        #   :16,22 AdamW weight decay 1e-2 on actor and critic, :29 none on the temperature (SAC never decays it);
        #   :26 target entropy −|A|/2, :27 initial temperature 0.01, :31 τ 0.005;
        #   configs/base.yaml:17 γ from the episode-length heuristic (0.995 at 1000 steps), :25 2 updates per step;
        #   agents/sac/sac_agent.py:198-229 actor, temperature, critic and target each step once per update.
        # The repo has no MuJoCo env config; its heuristics are applied with MuJoCo's 1000 steps and action repeat 1.
        "simba": dict(network="simba", normalize_obs=True, obs_clip=None, optimizer="adamw", weight_decay=1e-2,
                      policy_lr=1e-4, q_lr=1e-4, utd=2, gamma=MUJOCO_DISCOUNT, policy_frequency=1,
                      alpha_init=0.01, target_entropy_scale=-0.5),
        # Lee et al. 2025 (SimbaV2), github.com/dojeon-ai/SimbaV2:
        #   configs/agent/simbaV2.yaml:8 normalize_observation (agents/wrappers/normalization.py:28: no clip),
        #   :9-10,35,38-39 scaled rewards with G_max 5 and a 101-bin categorical critic on [−5, 5];
        #   :17-18 Adam (agents/simbaV2/simbaV2_agent.py:114,157,183, no weight decay) lr 1e-4 → 5e-5 linearly,
        #   for actor, critic and temperature; :22-23,32-33 actor 1 × 128, critic 2 × 512 (keelrl's defaults);
        #   :43 τ 0.005; :45 initial temperature 0.01; :47 target entropy −|A|/2;
        #   configs/online_rl.yaml:20 γ from the episode-length heuristic, :28 updates per interaction step =
        #   action_repeat, with configs/env/mujoco.yaml:13 action_repeat 1, :15 max_episode_steps 1000: γ 0.995, UTD 1;
        #   agents/simbaV2/simbaV2_agent.py:247-282 actor, temperature, critic and target each step once per update.
        "simbav2": dict(network="simbav2", normalize_obs=True, obs_clip=None, critic_head="c51", num_bins=101,
                        scale_rewards=True, optimizer="adam", policy_lr=1e-4, q_lr=1e-4, final_lr_fraction=0.5,
                        utd=1, gamma=MUJOCO_DISCOUNT, policy_frequency=1, alpha_init=0.01, target_entropy_scale=-0.5),
    }

    def __init__(self, obs_dim: int, action_low: np.ndarray, action_high: np.ndarray, config: SACConfig):
        super().__init__(obs_dim, action_low, action_high, config)  # critics, value head, normalisers
        self.actor = build_actor(config, obs_dim, action_low, action_high, stochastic=True)
        initial_alpha = config.alpha_init if config.autotune else config.alpha
        self.log_alpha = nn.Parameter(torch.tensor(float(np.log(initial_alpha))), requires_grad=config.autotune)
        self.target_entropy = config.target_entropy_scale * len(action_low)
        learning_rates = {"actor": (list(self.actor.parameters()), config.policy_lr),
                          "critic": (list(self.critic.parameters()), config.q_lr)}
        if config.autotune:
            learning_rates["alpha"] = ([self.log_alpha], config.q_lr)
        self.set_optimizers(learning_rates, no_weight_decay=("alpha",))  # decay would pull log α to 0 (α to 1)
        self._critic_params = list(self.critic.parameters())
        self._target_params = list(self.critic_target.parameters())
        self._critic_loss, self._actor_loss = self.compiled(self.critic_loss), self.compiled(self.actor_loss)

    @property
    def alpha(self) -> torch.Tensor:
        return self.log_alpha.detach().exp()

    def policy(self, obs: torch.Tensor, deterministic: bool) -> torch.Tensor:
        return self.actor.act(obs, deterministic)

    def learn(self, batch: Batch) -> dict[str, torch.Tensor]:
        """One critic step, and `policy_frequency` actor/α steps every `policy_frequency` updates."""
        losses = self._update_critic(batch)
        step = self.num_updates + 1
        if step % self.config.policy_frequency == 0:
            for _ in range(self.config.policy_frequency):
                losses.update(self._update_actor_and_alpha(batch.obs))
        if step % self.config.target_network_frequency == 0:
            with torch.no_grad():
                torch._foreach_lerp_(self._target_params, self._critic_params, self.config.tau)
        return losses

    def critic_loss(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Every critic's loss against r + γ(1 − terminated)(min Q'(s', a') − α log π(a'|s')), a' ~ π(·|s'),
        and the critics' outputs."""
        with torch.no_grad():
            next_actions, next_log_prob = self.actor.sample(batch.next_obs)
            target = self.td_target(batch, next_actions, next_bonus=-self.alpha * next_log_prob)
        return self.critic_regression_loss(batch, target)

    def actor_loss(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """α log π(a|s) − min_i Q_i(s, a) with a ~ π(·|s), and the detached log π(a|s)."""
        actions, log_prob = self.actor.sample(obs)
        q_pi = self.q_values(obs, actions).min(dim=0).values
        return (self.alpha * log_prob - q_pi).mean(), log_prob.detach()

    def _update_critic(self, batch: Batch) -> dict[str, torch.Tensor]:
        return self.apply_critic_loss(*self._critic_loss(batch))

    def _update_actor_and_alpha(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        self.critic.requires_grad_(False)  # the actor loss needs gradients w.r.t. actions only
        actor_loss, log_prob = self._actor_loss(obs)
        self.critic.requires_grad_(True)
        self.optimize("actor", actor_loss)
        losses = {"losses/actor_loss": actor_loss.detach(), "losses/alpha": self.alpha}
        if self.config.autotune:
            # the log-probs of this actor step, detached, as SB3 does (CleanRL resamples them)
            alpha_loss = -(self.log_alpha.exp() * (log_prob + self.target_entropy)).mean()
            self.optimize("alpha", alpha_loss)
            losses["losses/alpha_loss"] = alpha_loss.detach()
        return losses


def train(config: SACConfig) -> TrainResult:
    """Train SAC until `config.total_timesteps` environment steps (see agents/off_policy.py)."""
    return train_off_policy(SAC, config, validate)


if __name__ == "__main__":
    raise SystemExit(run_cli(train, SACConfig))
