"""Implicit Q-Learning (Kostrikov et al. 2021) with CORL's defaults, and RIQL's robust options.

Run:     python -m keelrl.agents.iql --dataset keelrl/hopper-medium-v0
Import:  from keelrl.agents.iql import IQL, IQLConfig, train, evaluate

The algorithm, top to bottom (no action outside the dataset is ever evaluated):
- V(s) regresses onto the target critics' Q(s, a) of dataset actions by expectile regression
  (weight |τ − 1(Q − V < 0)|, τ = 0.7), so V approaches an upper expectile of Q over the data's actions;
- the Q ensemble regresses onto r + γ(1 − terminated) V(s') (MSE; RIQL: Huber, targets clipped);
- the actor does advantage-weighted regression: maximise exp(β (Q − V)) (clipped at 100) times the
  log-likelihood of the dataset action (or minus its squared error, for a deterministic actor),
  with a cosine-decaying learning rate;
- target critics follow by Polyak averaging with rate τ.
RIQL (agents/riql.py) is this file with: observation statistics over observations and next
observations, 5 critics whose V target is a quantile of the ensemble instead of its minimum, a Huber
Q loss and clipped targets. The loop (dataset, corruption, evaluation, checkpoints) is in agents/offline_common.py.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from keelrl.agents.common import TrainResult, run_cli
from keelrl.agents.offline_common import OfflineAgent, OfflineConfig, evaluate, cosine_factor, train_offline, validate_offline
from keelrl.buffers import Batch
from keelrl.networks import CriticEnsemble, DeterministicActor, mlp

__all__ = ["IQL", "IQLConfig", "train", "evaluate"]


@dataclasses.dataclass
class IQLConfig(OfflineConfig):
    expectile: float = 0.7
    """expectile τ of V's regression onto Q (CORL's iql_tau)"""
    beta: float = 3.0
    """inverse temperature of the advantage weights: small → behaviour cloning, large → greedy"""
    exp_adv_max: float = 100.0
    """upper clip of the advantage weights exp(β A)"""
    actor_lr: float = 3e-4
    """actor learning rate (decays by a cosine to 0 over total_updates)"""
    qf_lr: float = 3e-4
    """Q critics learning rate"""
    vf_lr: float = 3e-4
    """value network learning rate"""
    deterministic_actor: bool = False
    """a deterministic actor trained by weighted squared error (CORL uses it on hopper-medium and RIQL everywhere)"""
    log_std_min: float = -20.0
    """lower clip of the Gaussian actor's state-independent log-std (RIQL: -5)"""
    hidden_sizes: tuple[int, ...] = (256, 256)
    """hidden layer sizes of actor, critics and value network"""
    num_critics: int = 2
    """critics in the Q ensemble"""
    q_target: Literal["min", "quantile"] = "min"
    """how V's target combines the target critics: their minimum, or their `quantile` (RIQL)"""
    quantile: float = 0.25
    """quantile of the target critics with --q-target quantile"""
    q_loss: Literal["mse", "huber"] = "mse"
    """critic regression loss (RIQL: huber)"""
    huber_sigma: float = 1.0
    """RIQL's σ: the Huber loss is quadratic for |error| < 1/σ² and linear beyond"""
    target_clip: tuple[float, float] | None = None
    """clip Q targets into [low, high] (RIQL: -100 1000)"""
    obs_stats_with_next: bool = False
    """fit the observation statistics to observations and next observations (RIQL)"""
    edac_critic_init: bool = False
    """EDAC's critic initialisation (RIQL): every bias 0.1, the output layer's weights and bias U(±3e-3)"""


def validate(config: IQLConfig) -> None:
    validate_offline(config)
    if not 0.0 < config.expectile < 1.0 or not 0.0 < config.quantile < 1.0:
        raise ValueError(f"--expectile and --quantile must lie in (0, 1), "
                         f"got {config.expectile} and {config.quantile}.")
    if config.num_critics < 1 or config.beta < 0 or config.huber_sigma <= 0:
        raise ValueError("--num-critics must be positive, --beta non-negative and --huber-sigma positive.")
    if config.target_clip is not None and config.target_clip[0] >= config.target_clip[1]:
        raise ValueError(f"--target-clip LOW HIGH needs LOW < HIGH, got {config.target_clip}.")


class GaussianActor(nn.Module):
    """π(a|s) = N(tanh(mlp(s)) · scale + bias, diag(exp(log_std)²)), log-std state-independent (IQL's policy)."""

    def __init__(self, obs_dim: int, action_low: np.ndarray, action_high: np.ndarray,
                 hidden_sizes: tuple[int, ...], log_std_min: float, log_std_max: float = 2.0):
        super().__init__()
        self.mean_net = DeterministicActor(obs_dim, action_low, action_high, hidden_sizes)
        self.log_std = nn.Parameter(torch.zeros(len(action_low)))
        self.log_std_min, self.log_std_max = log_std_min, log_std_max
        self.register_buffer("low", torch.as_tensor(action_low, dtype=torch.float32))
        self.register_buffer("high", torch.as_tensor(action_high, dtype=torch.float32))

    def log_prob(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """log π(a|s) summed over action dimensions: (B,)."""
        log_std = self.log_std.clamp(self.log_std_min, self.log_std_max)
        z = (actions - self.mean_net(obs)) * torch.exp(-log_std)
        return (-0.5 * z.pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)

    def act(self, obs: torch.Tensor, deterministic: bool) -> torch.Tensor:
        mean = self.mean_net(obs)
        if deterministic:
            return mean
        std = self.log_std.clamp(self.log_std_min, self.log_std_max).exp()
        return torch.max(torch.min(mean + std * torch.randn_like(mean), self.high), self.low)


def edac_init_(critic: CriticEnsemble) -> None:
    """EDAC's critic initialisation (An et al. 2021) as RIQL's VectorizedQ draws it: hidden weights
    U(±1/√out_features) (its kaiming_uniform_ on an (in, out) weight takes out_features as the fan-in),
    every bias 0.1, then the output layer's weights and bias U(±3e-3)."""
    layers = critic.net.layers
    with torch.no_grad():
        for layer in layers:
            bound = 1.0 / math.sqrt(layer.weight.shape[-1])  # weight: (E, in, out)
            layer.weight.uniform_(-bound, bound)
            layer.bias.fill_(0.1)
        layers[-1].weight.uniform_(-3e-3, 3e-3)
        layers[-1].bias.uniform_(-3e-3, 3e-3)


class IQL(OfflineAgent):
    """The IQL networks and update rule; takes raw observations (standardised inside when configured)."""

    algo = "iql"
    config_cls = IQLConfig

    def __init__(self, obs_dim: int, action_low: np.ndarray, action_high: np.ndarray, config: IQLConfig):
        super().__init__(obs_dim, action_low, action_high, config)
        hidden = tuple(config.hidden_sizes)
        self.critic = CriticEnsemble(obs_dim, len(action_low), hidden, config.num_critics)
        if config.edac_critic_init:
            edac_init_(self.critic)
        self.critic_target = CriticEnsemble(obs_dim, len(action_low), hidden, config.num_critics).requires_grad_(False)
        self.critic_target.load_state_dict(self.critic.state_dict())
        self.value = mlp(obs_dim, hidden, 1)
        if config.deterministic_actor:
            self.actor = DeterministicActor(obs_dim, action_low, action_high, hidden)
        else:
            self.actor = GaussianActor(obs_dim, action_low, action_high, hidden, config.log_std_min)
        self.set_optimizers({"actor": (list(self.actor.parameters()), config.actor_lr),
                             "critic": (list(self.critic.parameters()), config.qf_lr),
                             "value": (list(self.value.parameters()), config.vf_lr)})
        self._critic_params = list(self.critic.parameters())
        self._target_params = list(self.critic_target.parameters())

    def observation_statistics_data(self, data: dict[str, np.ndarray]) -> np.ndarray:
        if self.config.obs_stats_with_next:
            return np.concatenate([data["observations"], data["next_observations"]])
        return data["observations"]

    def policy(self, obs: torch.Tensor, deterministic: bool) -> torch.Tensor:
        if self.config.deterministic_actor:
            return self.actor(obs)
        return self.actor.act(obs, deterministic)

    def q_value(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return self.critic(obs, actions)[..., 0].min(dim=0).values

    def _combine_targets(self, q_all: torch.Tensor) -> torch.Tensor:
        """(E, B) target critics' values -> (B,) target of V."""
        if self.config.q_target == "quantile":
            return torch.quantile(q_all, self.config.quantile, dim=0)
        return q_all.min(dim=0).values

    def learn(self, batch: Batch) -> dict[str, torch.Tensor]:
        config = self.config
        with torch.no_grad():
            target_q = self._combine_targets(self.critic_target(batch.obs, batch.actions)[..., 0])  # (B,)
            next_v = self.value(batch.next_obs)[:, 0]
        # V: expectile regression onto the target Q of dataset actions
        advantage = target_q - self.value(batch.obs)[:, 0]
        value_loss = (torch.abs(config.expectile - (advantage < 0).float()) * advantage.pow(2)).mean()
        self.optimize("value", value_loss)
        # Q: one-step TD onto V(s'), no maximisation over actions
        target = batch.rewards + batch.discounts * (1.0 - batch.terminated) * next_v
        if config.target_clip is not None:
            target = target.clamp(*config.target_clip)
        q = self.critic(batch.obs, batch.actions)[..., 0]  # (E, B)
        target = target.expand_as(q)
        if config.q_loss == "huber":
            q_loss = F.smooth_l1_loss(q, target, beta=1.0 / config.huber_sigma**2)
        else:
            q_loss = F.mse_loss(q, target)
        self.optimize("critic", q_loss)
        self.polyak(self._critic_params, self._target_params)
        # actor: advantage-weighted regression onto dataset actions
        weights = torch.exp(config.beta * advantage.detach()).clamp(max=config.exp_adv_max)
        if config.deterministic_actor:
            regression = (self.actor(batch.obs) - batch.actions).pow(2).sum(-1)
        else:
            regression = -self.actor.log_prob(batch.obs, batch.actions)
        actor_loss = (weights * regression).mean()
        for group in self.optimizers["actor"].param_groups:
            group["lr"] = group["initial_lr"] * cosine_factor(self.num_updates, config.total_updates)
        self.optimize("actor", actor_loss)
        return {"losses/qf_loss": q_loss.detach(), "losses/vf_loss": value_loss.detach(),
                "losses/actor_loss": actor_loss.detach(), "losses/qf_values": q.detach().mean(),
                "losses/advantage": advantage.detach().mean()}


def train(config: IQLConfig) -> TrainResult:
    """Train IQL for `config.total_updates` gradient updates on `config.dataset`."""
    return train_offline(IQL, config, validate)


if __name__ == "__main__":
    raise SystemExit(run_cli(train, IQLConfig))
