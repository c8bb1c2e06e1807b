"""MR.Q, model-based representations for Q-learning (Fujimoto et al. 2025, "Towards General-Purpose Model-Free
Reinforcement Learning", ICLR), for continuous (Box) actions.

Run:     python -m keelrl.agents.mrq --env-id Hopper-v5
Import:  from keelrl.agents.mrq import MRQ, MRQConfig, train, evaluate

The algorithm, top to bottom:
- a state encoder maps an observation to z_s (512), a state-action encoder maps (z_s, a) to z_sa (512); a linear
  model on z_sa predicts the termination, the next z_s and the reward (65 logits over symexp-spaced bins);
- the encoder is trained alone by the model's losses unrolled over `enc_horizon` (5) steps of the replay: from z_s of
  the first observation, each step's predicted next embedding feeds the next step, and is regressed (MSE) onto the
  target encoder's embedding of the true next observation (weight 1); the reward is classified by cross-entropy
  against its two-hot encoding (weight 0.1); the termination regressed onto 0/1 (weight 0.1, only once the buffer
  holds a terminal transition); steps past the end of an episode are masked out;
- twin critics Q_1, Q_2 on z_sa (the encoder frozen for them) regress by a Huber loss onto the `q_horizon`-step
  (3) return, scaled by the replay's mean absolute reward r̄ (refreshed with the targets):
      y = (Σ_k γ^k r_k + γ^n (1 − terminated) r̄_target min_i Q'_i(z'_s', ã')) / r̄,
  where z' is the target encoder's, ã' the target policy's action with clipped Gaussian noise (TD3's smoothing),
  and r̄_target the scale the target critics were trained at; gradients clipped to norm 20;
- a deterministic tanh policy on z_s ascends the mean of both critics, with a penalty 1e-5 · mean(pre-tanh²);
- every `target_update_freq` (250) updates the target encoder, critics and policy are copied from the online ones,
  the reward scales refreshed, and the encoder takes `target_update_freq` steps (so one per update on average);
- LAP replay (keelrl.buffers.LAPReplayBuffer): transitions drawn in proportion to max(|δ|, 1)^0.4, δ the larger
  of the two critics' TD errors at their last update; the encoder's sequences are drawn the same way;
- the loop: uniform random actions for `learning_starts` (10k) steps, then the policy's with Gaussian noise 0.2; one
  update per environment step (per env).
AdamW everywhere (lr 1e-4 encoder, 3e-4 critics and policy, weight decay 1e-4); actions are learnt in [−1, 1] (the
env's box mapped there). The facts are the paper's, checked against its code (github.com/facebookresearch/MRQ at
8a44a7d, CC BY-NC 4.0: read for facts only; cited as MRQ.py:line, models.py:line, buffer.py:line under MRQ/).

Where keelrl differs from that code, on purpose:
- the multi-step return sums the rewards up to and including a terminal step (keelrl's n-step returns), where
  MRQ.py:314-315 multiplies each reward by its own step's not-done flag, which drops the terminal step's reward;
- a sequence or n-step return that meets a truncation stops there (and bootstraps, for the return), where the
  reference never samples a start whose horizon reaches a truncation (buffer.py:105-108,124-126);
- the two-hot encoding clips rewards into the outermost bins (±e^10 − 1); the reference's is undefined there.

--num-seeds is not an option of MR.Q: keelrl's seed groups (agents/harness/seeds.py) turn each seed's ReplayBuffer
into a SeedReplay, which draws one-step batches uniformly; MR.Q draws its rows by priority, reads 5-step sequences
at them and writes each seed's TD errors back as priorities, and its encoder takes 250 steps in a burst on the
buffer's reward scale. A group would need each of these as a special case of the seed machinery, so one process
trains one seed (run several processes, or the leaderboard's cells, for several seeds).
"""

from __future__ import annotations

import copy
import dataclasses
import sys
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from keelrl.agents.harness.loop import Run, TrainResult
from keelrl.agents.harness.options import (
    RunOptions,
    evaluation_seed,
    require_non_negative,
    require_positive,
    require_positive_counts,
    run_cli,
    validate_run_options,
    warn_without_updates,
)
from keelrl.agents.harness.saved_agent import SavedAgent
from keelrl.buffers import Batch, LAPReplayBuffer, SequenceBatch
from keelrl.envs import make_vec_env, play_episodes, require_box_actions
from keelrl.envs.video import gym_video
from keelrl.networks import (
    EnsembleLinear,
    check_device,
    check_precision,
    clip_gradient_norm,
    frozen,
    loss_function,
    make_optimizer,
    optimizer_step,
    to_device,
)
from keelrl.networks.seeds import GlobalRandom

ALGO = "mrq"
__all__ = ["MRQ", "MRQConfig", "SymexpTwoHot", "train", "evaluate", "main"]


@dataclasses.dataclass
class MRQConfig(RunOptions):
    # the algorithm's defaults are MR.Q's one set for all its benchmarks (MRQ/MRQ.py at 8a44a7d, the line named);
    # the environments and run length keelrl's, as its other online agents'; the run options: RunOptions
    env_id: str = "Hopper-v5"
    """gymnasium (or envpool) environment id with a Box action space"""
    total_timesteps: int = 1_000_000
    """environment steps to train for (MR.Q's Gym runs: main.py:30)"""
    num_envs: int = 1
    """parallel environments (one update per environment step of each: num_envs updates per loop step)"""
    env_backend: Literal["gymnasium", "envpool"] = "gymnasium"
    """vector environment backend (envpool needs the envpool extra)"""
    buffer_size: int = 1_000_000
    """replay buffer capacity (transitions) (MRQ.py:25)"""
    batch_size: int = 256
    """transitions (or sequences) per gradient step (MRQ.py:24)"""
    gamma: float = 0.99
    """discount factor (MRQ.py:26)"""
    learning_starts: int = 10_000
    """environment steps of uniform random actions before learning starts (MRQ.py:30, buffer_size_before_training)"""
    exploration_noise: float = 0.2
    """std of the Gaussian noise on the policy's actions in [−1, 1] (MRQ.py:31)"""
    target_policy_noise: float = 0.2
    """std of the target policy smoothing noise, in [−1, 1] units (MRQ.py:34)"""
    noise_clip: float = 0.3
    """the smoothing noise is clipped to ±noise_clip (MRQ.py:35)"""
    target_update_freq: int = 250
    """updates between copies of the online networks into the targets; the encoder takes this many steps at each copy
    (MRQ.py:27, :154-164)"""
    enc_horizon: int = 5
    """steps the encoder's model is unrolled over (MRQ.py:46)"""
    q_horizon: int = 3
    """steps of the critics' multi-step return (MRQ.py:47)"""
    dyn_weight: float = 1.0
    """weight of the next-embedding loss (MRQ.py:38)"""
    reward_weight: float = 0.1
    """weight of the reward cross-entropy (MRQ.py:39)"""
    done_weight: float = 0.1
    """weight of the termination loss (MRQ.py:40)"""
    alpha: float = 0.4
    """LAP exponent: priorities max(|δ|, min_priority)^alpha (MRQ.py:44; 0 samples uniformly)"""
    min_priority: float = 1.0
    """LAP's clamp of the TD error, and a new transition's first priority (MRQ.py:45, :99)"""
    zs_dim: int = 512
    """state embedding width (MRQ.py:50)"""
    zsa_dim: int = 512
    """state-action embedding width (MRQ.py:51)"""
    za_dim: int = 256
    """width of the action's embedding inside the state-action encoder (MRQ.py:52)"""
    enc_hidden_dim: int = 512
    """hidden width of the encoders (MRQ.py:53)"""
    enc_lr: float = 1e-4
    """encoder learning rate (MRQ.py:55)"""
    enc_weight_decay: float = 1e-4
    """encoder AdamW weight decay (MRQ.py:56)"""
    value_hidden_dim: int = 512
    """hidden width of each critic (MRQ.py:60)"""
    value_lr: float = 3e-4
    """critic learning rate (MRQ.py:62)"""
    value_weight_decay: float = 1e-4
    """critic AdamW weight decay (MRQ.py:63)"""
    value_grad_clip: float = 20.0
    """the critics' gradients are clipped to this global norm (MRQ.py:64)"""
    policy_hidden_dim: int = 512
    """hidden width of the policy (MRQ.py:67)"""
    policy_lr: float = 3e-4
    """policy learning rate (MRQ.py:69)"""
    policy_weight_decay: float = 1e-4
    """policy AdamW weight decay (MRQ.py:70)"""
    pre_activ_weight: float = 1e-5
    """weight of the penalty on the policy's squared pre-tanh outputs (MRQ.py:72)"""
    num_bins: int = 65
    """reward bins of the two-hot classification (MRQ.py:75)"""
    bins_low: float = -10.0
    """lowest bin in symlog space: the bins are symexp(linspace(bins_low, bins_high, num_bins)) (MRQ.py:76, :277)"""
    bins_high: float = 10.0
    """highest bin in symlog space (MRQ.py:77)"""
    device: str = "cpu"
    """torch device for networks and replay buffer"""
    precision: Literal["fp32", "tf32", "bf16"] = "fp32"
    """'fp32'; 'tf32': CUDA multiplies float32 matrices on TensorFloat-32 tensor cores; 'bf16': matrix products in
    bfloat16 under autocast (fast only where the CPU or GPU has native bf16). Weights, optimiser state, losses,
    targets and target copies stay float32"""


def validate(config: MRQConfig) -> None:
    """Reject option values no run can use, with the option's command-line name."""
    validate_run_options(config, "total_timesteps")
    check_device(config.device, False, False)
    check_precision(config.precision, config.device)
    require_positive_counts(config, "num_envs", "buffer_size", "batch_size", "target_update_freq", "enc_horizon",
                            "q_horizon", "zs_dim", "zsa_dim", "za_dim", "enc_hidden_dim", "value_hidden_dim",
                            "policy_hidden_dim")
    require_non_negative(config, "learning_starts", "exploration_noise", "target_policy_noise", "noise_clip",
                         "dyn_weight", "reward_weight", "done_weight", "alpha", "enc_weight_decay",
                         "value_weight_decay", "policy_weight_decay", "pre_activ_weight")
    require_positive(config, "enc_lr", "value_lr", "policy_lr", "min_priority", "value_grad_clip")
    warn_without_updates(config, "learning_starts")
    if not 0.0 < config.gamma <= 1.0:
        raise ValueError(f"--gamma must lie in (0, 1], got {config.gamma}.")
    if config.batch_size > config.buffer_size:
        raise ValueError(f"--batch-size {config.batch_size} is larger than --buffer-size {config.buffer_size}.")
    if config.num_bins < 2 or not config.bins_low < config.bins_high:
        raise ValueError(f"--num-bins must be at least 2 and --bins-low below --bins-high, got {config.num_bins}, "
                         f"{config.bins_low} and {config.bins_high}.")


class SymexpTwoHot(nn.Module):
    """Rewards as a categorical over `num_bins` bins spaced evenly in symlog space, symexp(linspace(low, high, K))
    (MRQ.py:276-277): a reward's two-hot encoding splits its mass between the two bins around it in proportion to
    closeness (so the encoding's mean is the reward itself), and logits decode to Σ softmax · bins."""

    def __init__(self, low: float, high: float, num_bins: int):
        super().__init__()
        symlog_bins = torch.linspace(low, high, num_bins)
        # derived from the options, so not saved with the model
        self.register_buffer("bins", symlog_bins.sign() * torch.expm1(symlog_bins.abs()), persistent=False)

    def encode(self, values: torch.Tensor) -> torch.Tensor:
        """Two-hot encoding (..., K) of `values` (...), clipped into [bins[0], bins[-1]]."""
        bins = self.bins.to(values.dtype)
        values = values.clamp(bins[0], bins[-1])
        lower = (torch.searchsorted(bins, values.contiguous(), right=True) - 1).clamp(0, len(bins) - 2)  # (...)
        upper_share = (values - bins[lower]) / (bins[lower + 1] - bins[lower])
        probs = values.new_zeros(*values.shape, len(bins))
        probs.scatter_(-1, lower.unsqueeze(-1), (1 - upper_share).unsqueeze(-1))
        return probs.scatter_(-1, lower.unsqueeze(-1) + 1, upper_share.unsqueeze(-1))

    def decode(self, logits: torch.Tensor) -> torch.Tensor:
        """The expected value (...) of the categoricals `logits` (..., K) (MRQ.py:296-297)."""
        return F.softmax(logits.float(), dim=-1) @ self.bins

    def cross_entropy(self, logits: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """−Σ two-hot(values) · log softmax(logits): (..., K), (...) -> (...) (MRQ.py:300-303)."""
        return -(self.encode(values) * F.log_softmax(logits.float(), dim=-1)).sum(-1)


def xavier_init_(module: nn.Module) -> nn.Module:
    """Every Linear (and each member of an EnsembleLinear) of `module`: Xavier-uniform weights with ReLU's gain √2,
    zero biases (models.py:16-20)."""
    gain = nn.init.calculate_gain("relu")
    for layer in module.modules():
        if isinstance(layer, nn.Linear):
            nn.init.xavier_uniform_(layer.weight, gain)
            nn.init.zeros_(layer.bias)
        elif isinstance(layer, EnsembleLinear):  # weight (E, in, out): Xavier's bound is symmetric in in and out
            for weight in layer.weight:
                nn.init.xavier_uniform_(weight, gain)
            nn.init.zeros_(layer.bias)
    return module


def layer_norm_mlp(in_dim: int, hidden_dim: int, out_dim: int, activation: type[nn.Module]) -> nn.Sequential:
    """Linear → LayerNorm (no affine) → activation, twice, then Linear (models.py:28-42)."""
    return nn.Sequential(nn.Linear(in_dim, hidden_dim), nn.LayerNorm(hidden_dim, elementwise_affine=False),
                         activation(), nn.Linear(hidden_dim, hidden_dim),
                         nn.LayerNorm(hidden_dim, elementwise_affine=False), activation(),
                         nn.Linear(hidden_dim, out_dim))


class Encoder(nn.Module):
    """The state encoder z_s, the state-action encoder z_sa and the linear model on z_sa (models.py:45-91), ELU."""

    def __init__(self, obs_dim: int, action_dim: int, config: MRQConfig):
        super().__init__()
        self.zs_dim = config.zs_dim
        self.state = layer_norm_mlp(obs_dim, config.enc_hidden_dim, config.zs_dim, nn.ELU)
        self.action = nn.Linear(action_dim, config.za_dim)
        self.state_action = layer_norm_mlp(config.zs_dim + config.za_dim, config.enc_hidden_dim, config.zsa_dim,
                                           nn.ELU)
        self.model = nn.Linear(config.zsa_dim, 1 + config.zs_dim + config.num_bins)  # termination, next z_s, reward
        xavier_init_(self)

    def zs(self, obs: torch.Tensor) -> torch.Tensor:
        """(B, obs_dim) -> z_s (B, zs_dim): the MLP, then LayerNorm and ELU (models.py:90-91)."""
        return F.elu(F.layer_norm(self.state(obs).float(), (self.zs_dim,)))

    def zsa(self, zs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """(B, zs_dim), actions in [−1, 1] (B, A) -> z_sa (B, zsa_dim) (models.py:70-72)."""
        za = F.elu(self.action(actions))  # (B, za_dim)
        return self.state_action(torch.cat([zs, za.to(zs.dtype)], dim=-1)).float()

    def predict(self, zsa: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The model's termination (B,), next z_s (B, zs_dim) and reward logits (B, K) (models.py:75-78)."""
        out = self.model(zsa).float()  # (B, 1 + zs_dim + K)
        return out[:, 0], out[:, 1:1 + self.zs_dim], out[:, 1 + self.zs_dim:]


class TwinValue(nn.Module):
    """Two critics on z_sa in one batched pass: each Linear → LayerNorm (no affine) → ELU three times, then a Linear
    to one output (models.py:113-135): (B, zsa_dim) -> (2, B)."""

    def __init__(self, zsa_dim: int, hidden_dim: int):
        super().__init__()
        self.hidden = nn.ModuleList([EnsembleLinear(2, zsa_dim, hidden_dim), EnsembleLinear(2, hidden_dim, hidden_dim),
                                     EnsembleLinear(2, hidden_dim, hidden_dim)])
        self.output = EnsembleLinear(2, hidden_dim, 1)
        xavier_init_(self)

    def forward(self, zsa: torch.Tensor) -> torch.Tensor:
        x = zsa  # (B, zsa_dim), shared by both critics
        for layer in self.hidden:
            x = layer(x)  # (2, B, hidden_dim)
            x = F.elu(F.layer_norm(x, x.shape[-1:]))
        return self.output(x).float().squeeze(-1)  # (2, B, 1) -> (2, B)


class Policy(nn.Module):
    """a = tanh(MLP(z_s)), ReLU (models.py:94-110), in [−1, 1]."""

    def __init__(self, zs_dim: int, hidden_dim: int, action_dim: int):
        super().__init__()
        self.net = xavier_init_(layer_norm_mlp(zs_dim, hidden_dim, action_dim, nn.ReLU))

    def forward(self, zs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, zs_dim) -> actions (B, A) and their pre-tanh values (B, A)."""
        pre_activation = self.net(zs).float()
        return torch.tanh(pre_activation), pre_activation


class MRQ(SavedAgent):
    """The MR.Q networks and update rule; acts on raw observations in the env's action box, learns in [−1, 1]. Saving
    and loading (`save`, `MRQ.load`) and the training state a checkpoint carries come from SavedAgent."""

    algo = ALGO
    config_cls = MRQConfig

    def __init__(self, obs_dim: int, action_low: np.ndarray, action_high: np.ndarray, config: MRQConfig):
        super().__init__()
        self.remember(obs_dim, action_low, action_high, config)
        action_dim = len(action_low)
        self.encoder = Encoder(obs_dim, action_dim, config)
        self.value = TwinValue(config.zsa_dim, config.value_hidden_dim)
        self.policy = Policy(config.zs_dim, config.policy_hidden_dim, action_dim)
        self.encoder_target = copy.deepcopy(self.encoder).requires_grad_(False)
        self.value_target = copy.deepcopy(self.value).requires_grad_(False)
        self.policy_target = copy.deepcopy(self.policy).requires_grad_(False)
        self.two_hot = SymexpTwoHot(config.bins_low, config.bins_high, config.num_bins)
        # r̄ the online critics learn at, and r̄ of the targets (MRQ.py:133, :158-159); saved with the networks
        self.register_buffer("reward_scale", torch.tensor(1.0))
        self.register_buffer("target_reward_scale", torch.tensor(0.0))
        self.optimizers = {  # AdamW for all three (MRQ.py:104, :109, :113)
            "encoder": make_optimizer(list(self.encoder.parameters()), "adamw", config.enc_lr, config.enc_weight_decay),
            "value": make_optimizer(list(self.value.parameters()), "adamw", config.value_lr, config.value_weight_decay),
            "policy": make_optimizer(list(self.policy.parameters()), "adamw", config.policy_lr,
                                     config.policy_weight_decay),
        }
        self.num_updates = 0
        self.encoder_losses: dict[str, torch.Tensor] = {}
        """the losses of the encoder's latest step (logged with every update until its next burst)"""
        self.random = GlobalRandom(config.device)
        self._state_embedding = loss_function(self.state_embedding, config.precision, config.device)
        self._encoder_loss = loss_function(self.encoder_loss, config.precision, config.device)
        self._value_loss = loss_function(self.value_loss, config.precision, config.device)
        self._policy_loss = loss_function(self.policy_loss, config.precision, config.device)

    def training_state(self) -> dict:
        """SavedAgent's, with the encoder's latest losses, so a resumed run logs them until the encoder's next burst."""
        return {**super().training_state(), "encoder_losses": dict(self.encoder_losses)}

    def load_training_state(self, state: dict) -> None:
        super().load_training_state(state)
        self.encoder_losses = dict(state.get("encoder_losses", {}))  # a checkpoint written before they were kept

    def unit_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """Env actions (..., A) mapped from the env's box onto [−1, 1]."""
        return (2 * actions - (self.action_high + self.action_low)) / (self.action_high - self.action_low)

    def env_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """Actions in [−1, 1] (..., A) mapped onto the env's box."""
        return self.action_low + (actions + 1) * (self.action_high - self.action_low) / 2

    @torch.inference_mode()
    def act(self, obs: np.ndarray, deterministic: bool = False) -> np.ndarray:
        """Actions for a batch of raw observations (B, obs_dim) -> (B, action_dim): the policy's on z_s, plus Gaussian
        noise of std exploration_noise clipped to [−1, 1] unless deterministic (MRQ.py:141-146), in the env's box."""
        obs_t = to_device(self.observation_batch(obs), self.action_low.device).float()
        actions, _ = self.policy(self.encoder.zs(obs_t))
        if not deterministic:
            noise = self.random.normal(*actions.shape)
            actions = (actions + self.config.exploration_noise * noise).clamp(-1.0, 1.0)
        return self.env_actions(actions).cpu().numpy()

    def update(self, buffer: LAPReplayBuffer) -> dict[str, torch.Tensor]:
        """One update (MRQ.py:149-176): every `target_update_freq` updates (from the first) copy the targets, refresh
        the reward scales and train the encoder `target_update_freq` steps; then one critic and one policy step on a
        prioritised batch, whose TD errors become its priorities."""
        if self.num_updates % self.config.target_update_freq == 0:
            self.copy_targets(buffer.reward_scale())
            terminations = buffer.has_terminations()
            for _ in range(self.config.target_update_freq):
                sequences = buffer.sequences_at(buffer.sample_indices(self.config.batch_size), self.config.enc_horizon)
                self.encoder_losses = self.update_encoder(sequences, terminations)
        idx = buffer.sample_indices(self.config.batch_size)
        value_losses, td_errors = self.update_value_and_policy(buffer.batch_at(idx))
        buffer.update_priorities(idx, td_errors)
        self.num_updates += 1
        return {**self.encoder_losses, **value_losses, "charts/reward_scale": self.reward_scale.clone()}

    @torch.no_grad()
    def copy_targets(self, reward_scale: float) -> None:
        """Targets ← online networks; the targets' reward scale ← the online one's, which becomes `reward_scale`."""
        for target, online in ((self.encoder_target, self.encoder), (self.value_target, self.value),
                               (self.policy_target, self.policy)):
            for target_param, param in zip(target.parameters(), online.parameters()):
                target_param.copy_(param)
        self.target_reward_scale.copy_(self.reward_scale)
        self.reward_scale.fill_(reward_scale)

    def encoder_loss(self, seq: SequenceBatch, terminations: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The model's losses unrolled over the H steps of `seq` (MRQ.py:179-203), summed over steps:
        dyn_weight · MSE(ẑ_k, z'(s_{k+1})) + reward_weight · CE(r̂_k, two-hot(r_k)) + done_weight · MSE(d̂_k, d_k)
        (the termination term only with `terminations`), ẑ_0 = z_s(s_0) and ẑ_{k+1} the model's prediction from
        z_sa(ẑ_k, a_k); each step's terms are masked by `seq.live` and averaged over the whole batch (masked entries
        count as zeros, MRQ.py:310-311). Returns the loss and its three parts, summed over steps."""
        batch_size, horizon = seq.rewards.shape
        with torch.no_grad():
            target_zs = self.encoder_target.zs(seq.next_obs.flatten(0, 1)).view(batch_size, horizon, -1)  # (B, H, Z)
        actions = self.unit_actions(seq.actions)  # (B, H, A)
        zs = self.encoder.zs(seq.obs[:, 0])  # (B, Z)
        parts = dict.fromkeys(("dynamics", "reward", "termination"), torch.zeros((), device=zs.device))
        for k in range(horizon):
            termination, zs, reward_logits = self.encoder.predict(self.encoder.zsa(zs, actions[:, k]))
            live = seq.live[:, k]  # (B,)
            parts["dynamics"] = parts["dynamics"] + ((zs - target_zs[:, k]).pow(2) * live.unsqueeze(-1)).mean()
            parts["reward"] = parts["reward"] + (self.two_hot.cross_entropy(reward_logits, seq.rewards[:, k])
                                                 * live).mean()
            if terminations:
                parts["termination"] = parts["termination"] + ((termination - seq.terminated[:, k]).pow(2)
                                                               * live).mean()
        loss = (self.config.dyn_weight * parts["dynamics"] + self.config.reward_weight * parts["reward"]
                + self.config.done_weight * parts["termination"])
        return loss, parts

    def update_encoder(self, seq: SequenceBatch, terminations: bool) -> dict[str, torch.Tensor]:
        loss, parts = self._encoder_loss(seq, terminations)
        optimizer_step(self.optimizers["encoder"], loss, self.encoder)
        return {"losses/encoder_loss": loss.detach(), **{f"losses/{name}_loss": part.detach()
                                                        for name, part in parts.items()}}

    @torch.no_grad()
    def td_target(self, batch: Batch, noise: torch.Tensor) -> torch.Tensor:
        """y = (R + γ^n (1 − terminated) r̄_target min_i Q'_i(z'_sa(s', ã'))) / r̄ (B,) (MRQ.py:209-216), R and γ^n the
        batch's n-step return and discount; ã' = clip(π'(z'_s(s')) + clip(target_policy_noise · noise, ±noise_clip),
        ±1), `noise` a standard normal draw (B, A)."""
        next_zs = self.encoder_target.zs(batch.next_obs)  # (B, Z)
        smoothing = (noise * self.config.target_policy_noise).clamp(-self.config.noise_clip, self.config.noise_clip)
        next_actions = (self.policy_target(next_zs)[0] + smoothing).clamp(-1.0, 1.0)  # (B, A)
        next_q = self.value_target(self.encoder_target.zsa(next_zs, next_actions)).min(dim=0).values  # (2, B) -> (B,)
        bootstrap = batch.discounts * (1.0 - batch.terminated) * next_q * self.target_reward_scale
        return (batch.rewards + bootstrap) / self.reward_scale

    @torch.no_grad()
    def state_embedding(self, obs: torch.Tensor) -> torch.Tensor:
        """z_s (B, Z) of the online encoder, without gradient: what the critic and policy steps both start from
        (MRQ.py:218)."""
        return self.encoder.zs(obs)

    def value_loss(self, zs: torch.Tensor, batch: Batch, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                                                      torch.Tensor]:
        """Huber(Q_i(z_sa(s, a)), y) averaged over both critics and the batch (MRQ.py:221-222), z_s `zs` (B, Z) of the
        online encoder (not trained by it); also the TD errors max_i |Q_i − y| (B,) (MRQ.py:174) and Q (2, B)."""
        target = self.td_target(batch, noise)  # (B,)
        with torch.no_grad():
            zsa = self.encoder.zsa(zs, self.unit_actions(batch.actions))
        q = self.value(zsa)  # (2, B)
        loss = F.smooth_l1_loss(q, target.expand_as(q))
        return loss, (q.detach() - target).abs().max(dim=0).values, q.detach()

    def policy_loss(self, zs: torch.Tensor) -> torch.Tensor:
        """−mean_i,b Q_i(z_sa(z_s, π(z_s))) + pre_activ_weight · mean(pre-tanh²) (MRQ.py:229-232): both critics'
        mean, not their minimum."""
        actions, pre_activation = self.policy(zs)
        q = self.value(self.encoder.zsa(zs, actions))  # (2, B)
        return -q.mean() + self.config.pre_activ_weight * pre_activation.pow(2).mean()

    def update_value_and_policy(self, batch: Batch) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """One critic step (gradients clipped to `value_grad_clip`) and one policy step, both on z_s of the batch's
        observations; the logged losses and the TD errors (B,)."""
        zs = self._state_embedding(batch.obs)  # (B, Z)
        noise = self.random.normal(*batch.actions.shape)
        value_loss, td_errors, q = self._value_loss(zs, batch, noise)
        self.optimizers["value"].zero_grad(set_to_none=True)
        value_loss.backward()
        clip_gradient_norm(list(self.value.parameters()), self.config.value_grad_clip)
        self.optimizers["value"].step()
        with frozen(self.value), frozen(self.encoder):  # the policy loss needs gradients w.r.t. actions only
            policy_loss = self._policy_loss(zs)
        optimizer_step(self.optimizers["policy"], policy_loss, self.policy)
        return {"losses/qf_loss": value_loss.detach(), "losses/qf_values": q.mean(),
                "losses/actor_loss": policy_loss.detach()}, td_errors


def evaluate(agent: MRQ, env_id: str, episodes: int = 10, seed: int = 0,
             deterministic: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Returns and costs of `episodes` episodes of the agent's deterministic (or noisy) policy."""
    return play_episodes(lambda obs: agent.act(obs, deterministic=deterministic), env_id, episodes, seed)


def train(config: MRQConfig) -> TrainResult:
    """Collect, update, log, evaluate and checkpoint until `total_timesteps` environment steps."""
    run = Run(config, ALGO, validate, total="total_timesteps")
    config = run.config
    with run:  # from here on, a failure releases the run's lock, threads and signals
        # a resumed run starts fresh episodes: the envs are reseeded from the step it resumes at
        env = make_vec_env(config.env_id, config.num_envs, config.seed + run.step, config.env_backend)
        require_box_actions(env, "MR.Q")
        obs_dim = int(np.prod(env.single_observation_space.shape))
        low, high = env.single_action_space.low, env.single_action_space.high
        agent = MRQ(obs_dim, low, high, config).to(config.device)
        buffer = LAPReplayBuffer(config.buffer_size, (obs_dim,), low.shape, config.num_envs, config.device,
                                 n_step=config.q_horizon, gamma=config.gamma, seed=config.seed, alpha=config.alpha,
                                 min_priority=config.min_priority)
        action_rng = np.random.default_rng(config.seed)
        eval_seed = evaluation_seed(config.seed, config.eval_episodes)  # evaluation episode i: eval_seed + i
        run.start(config.env_id, agent, numpy_rng=action_rng, replay=buffer,
                  play_evaluation=lambda agent, eval_seed: evaluate(agent, config.env_id, config.eval_episodes,
                                                                    eval_seed),
                  video=gym_video(config.env_id, lambda obs: agent.act(obs, deterministic=True), eval_seed))

        obs, _ = env.reset()
        with env:
            for global_step in run.steps(config.num_envs):
                if global_step < config.learning_starts:
                    actions = action_rng.uniform(low, high, (config.num_envs, *low.shape)).astype(np.float32)
                else:
                    actions = agent.act(obs)
                next_obs, rewards, terminated, truncated, info = env.step(actions)
                buffer.add(obs, actions, rewards, info["final_obs"], terminated, truncated)
                obs = next_obs
                run.record_episodes(info)
                if global_step >= config.learning_starts:
                    for _ in range(config.num_envs):
                        run.log(agent.update(buffer))
    return run.result()


NUM_SEEDS_REFUSED = ("MR.Q trains one seed per process, so it has no --num-seeds: keelrl's seed groups sample each "
                     "seed's replay uniformly one step at a time, and MR.Q samples by LAP priority, reads 5-step "
                     "sequences and writes each seed's TD errors back as priorities (agents/mrq.py says more). Start "
                     "one process per seed (--seed 1, --seed 2, ...).")


def main(args: list[str] | None = None) -> int:
    """The command line: `run_cli`, with --num-seeds refused in one line (exit code 2)."""
    args = sys.argv[1:] if args is None else args
    if any(arg == "--num-seeds" or arg.startswith(("--num-seeds=", "--num_seeds")) for arg in args):
        print(f"error: {NUM_SEEDS_REFUSED}", file=sys.stderr)
        return 2
    return run_cli(train, MRQConfig, args=args)


if __name__ == "__main__":
    raise SystemExit(main())
