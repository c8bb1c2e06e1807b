"""Conservative Q-Learning (Kumar et al. 2020) with CORL's defaults.

Run:     python -m keelrl.agents.cql --dataset keelrl/hopper-medium-v0
Import:  from keelrl.agents.cql import CQL, CQLConfig, train, evaluate

The algorithm, top to bottom (SAC on a fixed dataset, with a conservative critic):
- the tanh-Gaussian actor (CORL's parameterisation, `CQLActor`) takes a SAC step on α log π(a|s) − min Q(s, a), α tuned so the policy entropy tracks −|A|;
- the twin critics regress onto r + γ(1 − terminated) min Q_target(s', a'), a' ~ π(s'), and
  additionally push down a soft maximum of Q over actions the data does not contain while pushing up Q
  of the dataset action: α_cql (τ logsumexp(Q(s, a_i)/τ) − Q(s, a_data)), the a_i being
  `cql_n_actions` uniform actions, policy actions at s and policy actions at s', each (with
  importance sampling) corrected by its log-density;
- target critics follow by Polyak averaging with rate τ.
All three losses are computed from the networks (and α) as they are before the update, then α, the
actor and the critics step, in CORL's order.
The loop (dataset, corruption, evaluation, checkpoints) is in agents/offline_common.py.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from keelrl.agents.common import TrainResult, run_cli
from keelrl.agents.offline_common import OfflineAgent, OfflineConfig, evaluate, train_offline, validate_offline
from keelrl.buffers import Batch
from keelrl.networks import CriticEnsemble, mlp

__all__ = ["CQL", "CQLConfig", "train", "evaluate"]


@dataclasses.dataclass
class CQLConfig(OfflineConfig):
    policy_lr: float = 3e-5
    """actor (and entropy coefficient) learning rate"""
    qf_lr: float = 3e-4
    """critic learning rate"""
    cql_alpha: float = 10.0
    """weight of the conservative penalty"""
    cql_n_actions: int = 10
    """actions sampled per state for each of the three proposal sets (uniform, π(s), π(s'))"""
    cql_importance_sample: bool = True
    """correct each sampled action's Q by its log-density (CQL(H) with importance sampling)"""
    cql_temp: float = 1.0
    """temperature τ of the soft maximum over sampled actions"""
    autotune: bool = True
    """tune the entropy coefficient so the policy entropy tracks the target"""
    alpha: float = 1.0
    """entropy coefficient when not autotuned (and its initial value when autotuned)"""
    target_entropy_scale: float = -1.0
    """target entropy = target_entropy_scale * action dimension"""
    backup_entropy: bool = False
    """subtract α log π(a'|s') in the TD target (SAC's soft backup; CORL leaves it out)"""
    hidden_sizes: tuple[int, ...] = (256, 256, 256)
    """hidden layer sizes of actor and critics"""
    num_critics: int = 2
    """critics in the ensemble; targets and the actor take their minimum"""
    orthogonal_init: bool = True
    """orthogonal initialisation of the critics (gain √2, last layer 0.01, zero biases)"""


def validate(config: CQLConfig) -> None:
    validate_offline(config)
    if config.cql_n_actions < 1 or config.num_critics < 1:
        raise ValueError("--cql-n-actions and --num-critics must be positive.")
    if config.cql_alpha < 0 or config.cql_temp <= 0 or config.alpha <= 0:
        raise ValueError("--cql-alpha must be non-negative, --cql-temp and --alpha positive.")


class CQLActor(nn.Module):
    """CORL's CQL policy (TanhGaussianPolicy, from the CQL authors' code): a = tanh(u)·scale + bias,
    u ~ N(mean(s), std(s)²).

    One MLP outputs mean and raw log-std; log-std = m·raw + c with learnable scalars m (init 1) and
    c (init −1), clamped into [−20, 2]. Hidden layers keep PyTorch's default initialisation; the output
    layer is Xavier-uniform with gain 0.01 and zero bias, so a new policy has std ≈ e^−1 everywhere.
    """

    def __init__(self, obs_dim: int, action_low: np.ndarray, action_high: np.ndarray,
                 hidden_sizes: tuple[int, ...], log_std_min: float = -20.0, log_std_max: float = 2.0):
        super().__init__()
        self.action_dim = len(action_low)
        self.net = mlp(obs_dim, hidden_sizes, 2 * self.action_dim)
        nn.init.xavier_uniform_(self.net[-1].weight, gain=1e-2)
        nn.init.zeros_(self.net[-1].bias)
        self.log_std_multiplier = nn.Parameter(torch.tensor(1.0))
        self.log_std_offset = nn.Parameter(torch.tensor(-1.0))
        self.log_std_min, self.log_std_max = log_std_min, log_std_max
        low = torch.as_tensor(action_low, dtype=torch.float32)
        high = torch.as_tensor(action_high, dtype=torch.float32)
        self.register_buffer("action_scale", (high - low) / 2)
        self.register_buffer("action_bias", (high + low) / 2)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and log-std of the pre-tanh Gaussian: (B, A) each."""
        mean, raw_log_std = self.net(obs).split(self.action_dim, dim=-1)
        log_std = self.log_std_multiplier * raw_log_std + self.log_std_offset
        return mean, log_std.clamp(self.log_std_min, self.log_std_max)

    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterised action and its log-density in the action box: (B, A), (B,)."""
        mean, log_std = self(obs)
        noise = torch.randn_like(mean)
        u = mean + log_std.exp() * noise
        # log N(u) − log|d tanh(u)/du| − log(scale), with log(1 − tanh²u) = 2(log 2 − u − softplus(−2u))
        log_tanh_jacobian = 2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))
        log_prob = -0.5 * noise.pow(2) - log_std - 0.5 * math.log(2 * math.pi) - log_tanh_jacobian
        return torch.tanh(u) * self.action_scale + self.action_bias, (log_prob - self.action_scale.log()).sum(-1)

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        if deterministic:
            return torch.tanh(self(obs)[0]) * self.action_scale + self.action_bias
        return self.sample(obs)[0]


def orthogonal_init_(critic: CriticEnsemble) -> None:
    """Each member's layers orthogonal with gain √2 (0.01 for the output layer), biases zero."""
    layers = critic.net.layers
    with torch.no_grad():
        for i, layer in enumerate(layers):
            gain = 1e-2 if i == len(layers) - 1 else np.sqrt(2)
            for weight in layer.weight:  # (in, out) per member
                nn.init.orthogonal_(weight, gain=gain)
            layer.bias.zero_()


class CQL(OfflineAgent):
    """The CQL networks and update rule; takes raw observations (standardised inside when configured)."""

    algo = "cql"
    config_cls = CQLConfig

    def __init__(self, obs_dim: int, action_low: np.ndarray, action_high: np.ndarray, config: CQLConfig):
        super().__init__(obs_dim, action_low, action_high, config)
        hidden = tuple(config.hidden_sizes)
        self.actor = CQLActor(obs_dim, action_low, action_high, hidden)
        self.critic = CriticEnsemble(obs_dim, len(action_low), hidden, config.num_critics)
        if config.orthogonal_init:
            orthogonal_init_(self.critic)
        self.critic_target = CriticEnsemble(obs_dim, len(action_low), hidden, config.num_critics).requires_grad_(False)
        self.critic_target.load_state_dict(self.critic.state_dict())
        self.log_alpha = nn.Parameter(torch.tensor(float(np.log(config.alpha))), requires_grad=config.autotune)
        self.target_entropy = config.target_entropy_scale * len(action_low)
        # the log-density of a uniform action in the box, subtracted from its Q under importance sampling
        self.uniform_log_density = -float(np.log(np.asarray(action_high) - np.asarray(action_low)).sum())
        learning_rates = {"actor": (list(self.actor.parameters()), config.policy_lr),
                          "critic": (list(self.critic.parameters()), config.qf_lr)}
        if config.autotune:
            learning_rates["log_alpha"] = ([self.log_alpha], config.policy_lr)
        self.set_optimizers(learning_rates)
        self._critic_params = list(self.critic.parameters())
        self._target_params = list(self.critic_target.parameters())

    @property
    def alpha(self) -> torch.Tensor:
        return self.log_alpha.detach().exp()

    def policy(self, obs: torch.Tensor, deterministic: bool) -> torch.Tensor:
        return self.actor.act(obs, deterministic)

    def q_value(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return self.critic(obs, actions)[..., 0].min(dim=0).values

    def learn(self, batch: Batch) -> dict[str, torch.Tensor]:
        # every loss from the networks as they are before this update, then the steps (CORL's order)
        actor_loss, alpha_loss, losses = self._actor_and_alpha_losses(batch.obs)
        critic_loss, critic_losses = self._critic_loss(batch)
        if alpha_loss is not None:
            self.optimize("log_alpha", alpha_loss)
        self.optimize("actor", actor_loss)
        self.optimize("critic", critic_loss)
        self.polyak(self._critic_params, self._target_params)
        return {**losses, **critic_losses}

    def _actor_and_alpha_losses(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, dict]:
        actions, log_prob = self.actor.sample(obs)
        self.critic.requires_grad_(False)  # the actor loss needs gradients w.r.t. actions only
        q_pi = self.q_value(obs, actions)
        self.critic.requires_grad_(True)
        actor_loss = (self.alpha * log_prob - q_pi).mean()
        losses = {"losses/actor_loss": actor_loss.detach(), "losses/alpha": self.alpha}
        alpha_loss = None
        if self.config.autotune:
            alpha_loss = -(self.log_alpha * (log_prob.detach() + self.target_entropy)).mean()
            losses["losses/alpha_loss"] = alpha_loss.detach()
        return actor_loss, alpha_loss, losses

    @torch.no_grad()
    def _proposal_actions(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """3·N actions per state (uniform, π(·|s), π(·|s')) and their log-densities: (3·N·B, A), (3·N, B).

        Row k·B + b of the actions belongs to state b.
        """
        n, batch_size = self.config.cql_n_actions, batch.obs.shape[0]
        obs_repeated = batch.obs.repeat(n, 1)  # (N·B, obs_dim)
        next_obs_repeated = batch.next_obs.repeat(n, 1)
        uniform = torch.rand(n * batch_size, self.action_low.numel(), device=batch.obs.device)
        uniform = self.action_low + uniform * (self.action_high - self.action_low)
        current, current_log_prob = self.actor.sample(obs_repeated)
        following, following_log_prob = self.actor.sample(next_obs_repeated)
        actions = torch.cat([uniform, current, following])
        log_density = torch.cat([torch.full_like(current_log_prob, self.uniform_log_density),
                                 current_log_prob, following_log_prob]).view(3 * n, batch_size)
        return actions, log_density

    def _critic_loss(self, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        config = self.config
        with torch.no_grad():
            next_actions, next_log_prob = self.actor.sample(batch.next_obs)
            next_q = self.critic_target(batch.next_obs, next_actions)[..., 0].min(dim=0).values
            if config.backup_entropy:
                next_q = next_q - self.alpha * next_log_prob
            target = batch.rewards + batch.discounts * (1.0 - batch.terminated) * next_q
            proposals, log_density = self._proposal_actions(batch)
        q_data = self.critic(batch.obs, batch.actions)[..., 0]  # (E, B)
        td_loss = (q_data - target).pow(2).mean(dim=1).sum()
        # Q of every proposal, all critics in one pass; all proposals are scored at s
        num_proposals = log_density.shape[0]
        q_proposals = self.critic(batch.obs.repeat(num_proposals, 1), proposals)[..., 0]  # (E, 3·N·B)
        q_proposals = q_proposals.view(q_data.shape[0], num_proposals, -1)  # (E, 3·N, B)
        if config.cql_importance_sample:
            q_proposals = q_proposals - log_density
        else:
            q_proposals = torch.cat([q_proposals, q_data.unsqueeze(1)], dim=1)
        soft_max = config.cql_temp * torch.logsumexp(q_proposals / config.cql_temp, dim=1)  # (E, B)
        conservative_gap = (soft_max - q_data).mean(dim=1).sum()
        critic_loss = td_loss + config.cql_alpha * conservative_gap
        num_critics = q_data.shape[0]
        return critic_loss, {"losses/qf_loss": td_loss.detach() / num_critics,
                             "losses/cql_gap": conservative_gap.detach() / num_critics,
                             "losses/qf_values": q_data.detach().mean()}


def train(config: CQLConfig) -> TrainResult:
    """Train CQL for `config.total_updates` gradient updates on `config.dataset`."""
    return train_offline(CQL, config, validate)


if __name__ == "__main__":
    raise SystemExit(run_cli(train, CQLConfig))
