"""Conservative Q-Learning (Kumar et al. 2020) with CORL's defaults, and Cal-QL (Nakamoto et al. 2023) as an option.

Run:     python -m keelrl.agents.cql --dataset keelrl/hopper-medium-v0             (add --cal-ql for Cal-QL)
Import:  from keelrl.agents.cql import CQL, CQLConfig, train, evaluate

The algorithm, top to bottom (SAC on a fixed dataset, with a conservative critic):
- the tanh-Gaussian actor (CORL's parameterisation, `CQLActor`) takes a SAC step on α log π(a|s) − min Q(s, a),
  α tuned so the policy entropy tracks −|A|;
- the twin critics regress onto r + γ(1 − terminated) min Q_target(s', a'), a' ~ π(s'), and
  additionally push down a soft maximum of Q over actions the data does not contain while pushing up Q
  of the dataset action: α_cql (τ logsumexp(Q(s, a_i)/τ) − Q(s, a_data)), the a_i being
  `cql_n_actions` uniform actions, policy actions at s and policy actions at s', each (with
  importance sampling) corrected by its log-density; with `--cal-ql` (Cal-QL) the policy actions' Q-values in
  that soft maximum are first raised to the dataset's Monte-Carlo return-to-go of the transition where below it;
- target critics follow by Polyak averaging with rate τ;
- as WSRL pre-trains (`--preset wsrl`): N critics whose targets take the minimum over a random subset of M
  (REDQ; only another such subset gets the conservative penalty), LayerNorm in actor and critics, and the target
  taken at the best of `cql_n_actions` next actions (max target backup);
- the loop: load the dataset (corrupted if asked), fit the observation statistics to it, then update on
  uniform batches, evaluating the deterministic policy in the dataset's environment (return and D4RL score).
All three losses are computed from the networks (and α) as they are before the update, then α, the
actor and the critics step, in CORL's order.
The dataset comes from keelrl.buffers (DatasetOptions, prepare_dataset, DatasetBuffer), the networks and
optimiser steps from keelrl.networks, the run plumbing (logs, evaluations, checkpoints, resume) from
keelrl.agents.harness, and the agent an adversarial data corruption attacks from agents/iql.py (`load_attacker`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from keelrl.agents.harness.loop import Run, TrainResult
from keelrl.agents.harness.options import (
    RunOptions,
    apply_preset,
    evaluation_seed,
    require_positive,
    require_positive_counts,
    require_positive_widths,
    run_cli,
    validate_run_options,
)
from keelrl.agents.harness.run_directory import DATASET_FILE
from keelrl.agents.harness.saved_agent import SavedAgent
from keelrl.agents.iql import load_attacker
from keelrl.buffers import Batch
from keelrl.buffers.offline import (
    DatasetBuffer,
    DatasetOptions,
    evaluation_spaces,
    prepare_dataset,
    validate_dataset_options,
)
from keelrl.envs import play_episodes
from keelrl.envs.video import gym_video
from keelrl.networks import (
    CriticEnsemble,
    RunningObsNorm,
    check_device,
    check_precision,
    frozen,
    make_optimizer,
    matmul_precision,
    mlp,
    optimizer_step,
    orthogonal_init_,
    random_members,
    soft_update,
    to_device,
)

ALGO = "cql"
__all__ = ["CQL", "CQLConfig", "train", "evaluate"]


@dataclasses.dataclass
class CQLConfig(DatasetOptions, RunOptions):
    total_updates: int = 1_000_000
    """gradient updates to train for"""
    batch_size: int = 256
    """transitions per gradient update"""
    gamma: float = 0.99
    """discount factor"""
    tau: float = 0.005
    """target network Polyak rate"""
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
    cal_ql: bool = False
    """Cal-QL (Nakamoto et al. 2023): in the conservative term, the Q-values of the policy's actions (at s and s')
    are bounded below by the transition's Monte-Carlo return-to-go in the dataset; uniform actions are not"""
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
    critic_subset_size: int | None = None
    """REDQ-style ensemble (WSRL's critic_subsample_size): the TD target takes the minimum over this many critics
    drawn at random with replacement at each update, and only another such draw gets the conservative penalty
    (None: every critic, in both)"""
    layer_norm: bool = False
    """LayerNorm after each hidden layer's Linear, before its ReLU, in actor and critics (WSRL's --use_redq networks)"""
    max_target_backup: bool = False
    """the TD target takes, per next state, the maximum over cql_n_actions actions a' ~ π(s') of the pessimistic
    target Q (the CQL authors' cql_max_target_backup) instead of one a'"""
    orthogonal_init: bool = True
    """orthogonal initialisation of the critics (gain √2, last layer 0.01, zero biases)"""
    normalize_obs: bool = True
    """standardise observations by the dataset's mean and std (saved with the model)"""
    eval_freq: int = 5_000
    """updates between evaluations (0: only at the end)"""
    device: str = "cpu"
    """torch device for networks and dataset"""
    precision: Literal["fp32", "tf32", "bf16"] = "fp32"
    """'fp32'; 'tf32': during a run, CUDA multiplies float32 matrices on TensorFloat-32 tensor cores (Ampere on; JAX's
    default there); 'bf16': matrix products in bfloat16 under autocast (fast only where the CPU or GPU has native
    bf16). Weights, optimiser state, losses, TD targets, log-probabilities and target updates stay float32"""
    preset: Literal["wsrl"] | None = None
    """'wsrl': the pre-training WSRL fine-tunes from (its locomotion CQL with --use_redq, see PRESETS); an explicit
    option that contradicts it is refused"""


PRESETS = {
    # Zhou et al. 2024 (WSRL), github.com/zhouzypaul/wsrl at 891ee35, locomotion pre-training:
    #   experiments/scripts/locomotion/launch_cql_finetune.sh:6-12 plain CQL (not Cal-QL: README.md:80-81) with
    #   reward scale 1 and bias 0, 250k updates; README.md:81 --use_redq, which sets (experiments/configs/
    #   ensemble_config.py:6-9) 10 critics, targets over a random pair, LayerNorm in actor and critics;
    #   experiments/configs/train_config.py:229-238 actor and critics 2 × 256 ReLU, :239-240 α_cql 5 fixed;
    #   experiments/configs/cql_config.py:10-13 10 uniform actions, max target backup, importance sampling;
    #   experiments/configs/sac_config.py:37-51 lr 1e-4 actor, 3e-4 critic, 1e-4 temperature (keelrl's policy_lr
    #   drives both), :6,9 γ 0.99, τ 0.005, :7 no entropy in the backup, :12-13 temperature from 1 autotuned, :8 with
    #   wsrl/agents/cql.py:510-511 target entropy −|A|; finetune.py:65 batch 256.
    #   No observation normalisation anywhere in WSRL.
    # Where the preset still differs from that pre-training (behaviour kept; matching it is later work):
    #   - the actor is CORL's (`CQLActor`: one output layer for the mean and the raw log-std, log-std = m·raw + c
    #     with learnable m and c, clamped to [−20, 2]); WSRL's has separate mean and log-std output layers,
    #     std = exp(log-std) clipped to [1e-5, 10] (wsrl/networks/actor_critic_nets.py:92-93,112-126,153);
    #   - the temperature is α = exp(log α), loss log α·(H − H̄) with H from the actor step's actions at s; WSRL's is
    #     α = softplus(θ) (wsrl/networks/lagrange.py:28-29,47-49,77-79; wsrl/agents/cql.py:452-456), loss
    #     α·(H − H̄) (lagrange.py:65-72; wsrl/agents/sac.py:165-177) with H = −mean log π(a'|s′) over the 10
    #     max-backup samples per next state (sac.py:340-351 through wsrl/agents/cql.py:206-223);
    #   - with --cal-ql (WSRL's pre-training on its antmaze, adroit and kitchen tasks), the logged bound rate is out
    #     of the 2·N policy proposals; WSRL's out of all 3·N, the uniform ones (bound −∞) included
    #     (wsrl/agents/cql.py:135-153): keelrl's is 3/2 of WSRL's.
    "wsrl": dict(hidden_sizes=(256, 256), num_critics=10, critic_subset_size=2, layer_norm=True, cql_alpha=5.0,
                 cql_n_actions=10, max_target_backup=True, cql_importance_sample=True, policy_lr=1e-4, qf_lr=3e-4,
                 normalize_obs=False),
}


def validate(config: CQLConfig) -> None:
    """Reject option values no run can use, with the option's command-line name."""
    validate_run_options(config, "total_updates")
    validate_dataset_options(config)
    require_positive_widths(config)
    check_device(config.device, compile=False, cudagraphs=False)
    check_precision(config.precision, config.device)
    require_positive_counts(config, "batch_size")
    require_positive(config, "policy_lr", "qf_lr")
    if not 0.0 < config.gamma <= 1.0 or not 0.0 < config.tau <= 1.0:
        raise ValueError(f"--gamma and --tau must lie in (0, 1], got {config.gamma} and {config.tau}.")
    if config.cql_n_actions < 1 or config.num_critics < 1:
        raise ValueError("--cql-n-actions and --num-critics must be positive.")
    subset = config.critic_subset_size
    if subset is not None and not 1 <= subset <= config.num_critics:
        raise ValueError(f"--critic-subset-size must lie in [1, --num-critics {config.num_critics}], got {subset}.")
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
                 hidden_sizes: tuple[int, ...], log_std_min: float = -20.0, log_std_max: float = 2.0,
                 layer_norm: bool = False):
        super().__init__()
        self.action_dim = len(action_low)
        self.net = mlp(obs_dim, hidden_sizes, 2 * self.action_dim, layer_norm=layer_norm)
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
        mean, raw_log_std = self.net(obs).float().split(self.action_dim, dim=-1)  # float32 under bf16 autocast too
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


def cql_networks(obs_dim: int, action_low: np.ndarray, action_high: np.ndarray, config: CQLConfig | Any,
                 orthogonal: bool) -> tuple[nn.Module, CQLActor, CriticEnsemble, CriticEnsemble]:
    """The observation normaliser ((obs − mean) / (std + 1e-3) with the dataset's statistics, as CORL; identity
    without normalize_obs), the actor, the critics (orthogonally initialised when asked) and the target critics
    (a copy) of `config`'s hidden_sizes, num_critics and layer_norm: CQL's, and WSRL's, which fine-tunes them."""
    obs_norm = RunningObsNorm(obs_dim, clip=None, eps=1e-3, eps_on="std") if config.normalize_obs else nn.Identity()
    hidden, action_dim = tuple(config.hidden_sizes), len(action_low)
    actor = CQLActor(obs_dim, action_low, action_high, hidden, layer_norm=config.layer_norm)
    critic = CriticEnsemble(obs_dim, action_dim, hidden, config.num_critics, layer_norm=config.layer_norm)  # (E, B, 1)
    if orthogonal:
        orthogonal_init_(critic, last_gain=1e-2)  # every member's layers: gain √2, the output layer's 0.01
    critic_target = CriticEnsemble(obs_dim, action_dim, hidden, config.num_critics,
                                   layer_norm=config.layer_norm).requires_grad_(False)
    critic_target.load_state_dict(critic.state_dict())
    return obs_norm, actor, critic, critic_target


class CQL(SavedAgent):
    """The CQL networks and update rule; takes raw observations (standardised inside when configured). Saving and
    loading (`save`, `CQL.load`) and the training state a checkpoint carries come from SavedAgent."""

    algo = ALGO
    config_cls = CQLConfig

    def __init__(self, obs_dim: int, action_low: np.ndarray, action_high: np.ndarray, config: CQLConfig):
        super().__init__()
        self.remember(obs_dim, action_low, action_high, config)
        self.obs_norm, self.actor, self.critic, self.critic_target = cql_networks(
            obs_dim, action_low, action_high, config, config.orthogonal_init)
        # the parameter lists Polyak averaging walks, gathered once (the tensors stay the same objects)
        self.polyak_target, self.polyak_online = list(self.critic_target.parameters()), list(self.critic.parameters())
        self.log_alpha = nn.Parameter(torch.tensor(float(np.log(config.alpha))), requires_grad=config.autotune)
        self.target_entropy = config.target_entropy_scale * len(action_low)
        # the log-density of a uniform action in the box, subtracted from its Q under importance sampling
        self.uniform_log_density = -float(np.log(np.asarray(action_high) - np.asarray(action_low)).sum())
        self.optimizers = {"actor": make_optimizer(list(self.actor.parameters()), "adam", config.policy_lr),
                           "critic": make_optimizer(list(self.critic.parameters()), "adam", config.qf_lr)}
        if config.autotune:
            self.optimizers["log_alpha"] = make_optimizer([self.log_alpha], "adam", config.policy_lr)
        self.num_updates = 0

    @property
    def alpha(self) -> torch.Tensor:
        return self.log_alpha.detach().exp()

    def fit_normalizer(self, data: dict[str, np.ndarray]) -> None:
        """Fit the observation statistics to the dataset's observations."""
        if self.config.normalize_obs:
            self.obs_norm.update(torch.as_tensor(data["observations"]))

    def policy(self, obs: torch.Tensor, deterministic: bool) -> torch.Tensor:
        """Actions (B, A) for normalised observations: tanh of the mean, or a sample."""
        return self.actor.act(obs, deterministic)

    def q_value(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """The pessimistic Q-value (B,) of normalised observations: the critics' minimum."""
        return self.critic(obs, actions)[..., 0].min(dim=0).values

    @torch.inference_mode()
    def act(self, obs: np.ndarray, deterministic: bool = False) -> np.ndarray:
        """Actions for a batch of raw observations (B, obs_dim) -> (B, action_dim)."""
        obs = self.observation_batch(obs)
        obs_t = self.obs_norm(to_device(obs, self.action_low.device))
        return self.policy(obs_t, deterministic).cpu().numpy()

    def update(self, batch: Batch) -> dict[str, torch.Tensor]:
        """One update on a batch of raw transitions: every loss from the networks (and α) as they are before
        the update, then the steps of α, the actor and the critics, then the target critics (CORL's order)."""
        if self.config.normalize_obs:
            batch = batch._replace(obs=self.obs_norm(batch.obs), next_obs=self.obs_norm(batch.next_obs))
        with matmul_precision(self.config.precision, self.config.device):
            actor_loss, alpha_loss = self.actor_and_alpha_losses(batch.obs)
            critic_loss, critic_losses = self.critic_loss(batch)
        losses = {"losses/actor_loss": actor_loss.detach(), "losses/alpha": self.alpha}
        if alpha_loss is not None:
            optimizer_step(self.optimizers["log_alpha"], alpha_loss, self.log_alpha)
            losses["losses/alpha_loss"] = alpha_loss.detach()
        optimizer_step(self.optimizers["actor"], actor_loss, self.actor)
        optimizer_step(self.optimizers["critic"], critic_loss, self.critic)
        soft_update(self.polyak_target, self.polyak_online, self.config.tau)
        self.num_updates += 1
        return {**losses, **critic_losses}

    def actor_and_alpha_losses(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The actor's loss α log π(a|s) − min Q(s, a), a ~ π(·|s), and α's loss −log α (log π(a|s) +
        target_entropy) (None when α is fixed)."""
        actions, log_prob = self.actor.sample(obs)
        with frozen(self.critic):  # the actor loss needs gradients w.r.t. actions only
            q_pi = self.q_value(obs, actions)
        actor_loss = (self.alpha * log_prob - q_pi).mean()
        alpha_loss = None
        if self.config.autotune:
            alpha_loss = -(self.log_alpha * (log_prob.detach() + self.target_entropy)).mean()
        return actor_loss, alpha_loss

    @torch.no_grad()
    def proposal_actions(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
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

    def critic_loss(self, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The critics' TD loss plus cql_alpha times the conservative gap, summed over critics; the logged
        per-critic TD loss, gap and Q-values."""
        config = self.config
        with torch.no_grad():
            next_q = self.next_value(batch.next_obs)
            target = batch.rewards + batch.discounts * (1.0 - batch.terminated) * next_q
            proposals, log_density = self.proposal_actions(batch)
        q_data = self.critic(batch.obs, batch.actions)[..., 0]  # (E, B)
        td_loss = (q_data - target).pow(2).mean(dim=1).sum()
        # the penalised critics (all, or a random subset), each scoring every proposal in one pass, all at s
        members = random_members(config.num_critics, config.critic_subset_size, q_data.device)
        q_data = q_data[members]  # (E, B) -> (M, B)
        num_proposals = log_density.shape[0]
        q_proposals = self.critic(batch.obs.repeat(num_proposals, 1), proposals, members)[..., 0]  # (M, 3·N·B)
        q_proposals = q_proposals.view(q_data.shape[0], num_proposals, -1)  # (M, 3·N, B)
        bound_rate = None
        if config.cal_ql:
            q_proposals, bound_rate = self.calibrated(q_proposals, batch.mc_returns)
        if config.cql_importance_sample:
            q_proposals = q_proposals - log_density
        else:
            q_proposals = torch.cat([q_proposals, q_data.unsqueeze(1)], dim=1)  # (M, 3·N + 1, B)
        soft_max = config.cql_temp * torch.logsumexp(q_proposals / config.cql_temp, dim=1)  # (M, B)
        # the penalised critics' gaps summed, scaled by E/M: their weight beside the TD loss (a sum over the E
        # critics) is then the same with or without a subset, as in WSRL, whose two losses are means over members
        conservative_gap = (soft_max - q_data).mean(dim=1).sum() * (config.num_critics / q_data.shape[0])
        critic_loss = td_loss + config.cql_alpha * conservative_gap
        logged = {"losses/qf_loss": td_loss.detach() / config.num_critics,
                  "losses/cql_gap": conservative_gap.detach() / config.num_critics,
                  "losses/qf_values": q_data.detach().mean()}
        if bound_rate is not None:
            logged["losses/calql_bound_rate"] = bound_rate
        return critic_loss, logged

    def next_value(self, next_obs: torch.Tensor) -> torch.Tensor:
        """The backed-up value (B,) at s': the minimum over the target critics (or a random subset of them) of
        Q'(s', a'), a' ~ π(s'); with max_target_backup the maximum of that over cql_n_actions such a'; with
        backup_entropy minus α log π(a'|s') of the a' taken."""
        config = self.config
        samples = config.cql_n_actions if config.max_target_backup else 1
        batch_size = next_obs.shape[0]
        next_actions, next_log_prob = self.actor.sample(next_obs.repeat(samples, 1))  # (n·B, A), (n·B,)
        members = random_members(config.num_critics, config.critic_subset_size, next_obs.device)
        next_q = self.critic_target(next_obs.repeat(samples, 1), next_actions, members)[..., 0].min(dim=0).values
        next_q, best = next_q.view(samples, batch_size).max(dim=0)  # (n·B,) -> (B,): the best of the n actions
        if config.backup_entropy:
            next_q = next_q - self.alpha * next_log_prob.view(samples, batch_size).gather(0, best[None])[0]
        return next_q

    def calibrated(self, q_proposals: torch.Tensor, mc_returns: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cal-QL's lower bound (WSRL's wsrl/agents/cql.py:127-154 at 891ee35): the Q-values (M, 3·N, B) of the
        policy's proposals, rows N… (π(·|s), then π(·|s')), raised to the Monte-Carlo return (B,) where below it;
        the uniform proposals, rows 0…N−1, untouched. Also the fraction of policy Q-values that were below."""
        if mc_returns is None:
            raise ValueError("--cal-ql bounds Q-values by the dataset's Monte-Carlo returns, and this batch has none: "
                             "sample a DatasetBuffer of data prepared with prepare_dataset(..., mc_returns_gamma=γ).")
        n = self.config.cql_n_actions
        uniform, policy = q_proposals[:, :n], q_proposals[:, n:]
        bound_rate = (policy.detach() < mc_returns).float().mean()
        return torch.cat([uniform, torch.maximum(policy, mc_returns)], dim=1), bound_rate


def evaluate(agent: CQL, env_id: str, episodes: int = 10, seed: int = 0,
             deterministic: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Returns and costs of `episodes` episodes of the agent's deterministic (or stochastic) policy."""
    return play_episodes(lambda obs: agent.act(obs, deterministic=deterministic), env_id, episodes, seed)


def train(config: CQLConfig) -> TrainResult:
    """Train CQL for `config.total_updates` gradient updates on `config.dataset`."""
    run = Run(apply_preset(config, PRESETS) if config.resume is None else config, ALGO, validate,
              total="total_updates")
    config = run.config
    with run:  # from here on, a failure releases the run's lock, threads and signals
        attacker = load_attacker(config.attack_model) if config.corruption and config.attack_model else (None, None)
        data, summary = prepare_dataset(config, config.seed, *attacker,
                                        mc_returns_gamma=config.gamma if config.cal_ql else None)
        env_id = summary["env_id"]
        observation_space, action_space = evaluation_spaces(data, env_id)
        agent = CQL(int(np.prod(observation_space.shape)), action_space.low, action_space.high, config)
        agent.fit_normalizer(data)
        agent.to(config.device)
        buffer = DatasetBuffer(data, config.gamma, config.device, seed=config.seed)
        eval_seed = evaluation_seed(config.seed, config.eval_episodes)  # evaluation episode i is seeded eval_seed + i
        run.start(env_id, agent, lambda agent, eval_seed: evaluate(agent, env_id, config.eval_episodes, eval_seed),
                  state={"sampler": (buffer.generator.get_state, buffer.generator.set_state)},
                  reference_returns=summary["ref_scores"], files={DATASET_FILE: json.dumps(summary, indent=2)},
                  video=gym_video(env_id, lambda obs: agent.act(obs, deterministic=True), eval_seed))
        for _ in run.steps():
            run.log(agent.update(buffer.sample(config.batch_size)))
    return run.result()


if __name__ == "__main__":
    raise SystemExit(run_cli(train, CQLConfig))
