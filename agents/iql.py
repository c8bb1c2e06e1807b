"""Implicit Q-Learning (Kostrikov et al. 2021) with CORL's defaults.

Run:     python -m keelrl.agents.iql --dataset keelrl/hopper-medium-v0
Import:  from keelrl.agents.iql import IQL, IQLConfig, train, evaluate

The algorithm, top to bottom (no action outside the dataset is ever evaluated):
- V(s) regresses onto the target critics' Q(s, a) of dataset actions by expectile regression
  (weight |τ − 1(Q − V < 0)|, τ = 0.7), so V approaches an upper expectile of Q over the data's actions;
- the Q ensemble regresses onto r + γ(1 − terminated) V(s') (MSE);
- target critics follow by Polyak averaging with rate τ;
- the actor does advantage-weighted regression: maximise exp(β (Q − V)) (clipped at 100) times the
  log-likelihood of the dataset action (or minus its squared error, for a deterministic actor),
  with a cosine-decaying learning rate;
- the loop: load the dataset (corrupted if asked), fit the observation statistics to it, then update on
  uniform batches, evaluating the deterministic policy in the dataset's environment (return and D4RL score).
agents/riql.py is RIQL, IQL made robust to corrupted data: its own update, written out there, and IQL's networks
with `initialise_critic` and `fit_normalizer` of its own. A saved IQL or RIQL agent is also what the adversarial
data corruption attacks (`load_attacker`). The dataset comes from keelrl.buffers (DatasetOptions,
prepare_dataset, DatasetBuffer), the networks and optimiser steps from keelrl.networks, the run plumbing (logs,
evaluations, checkpoints, resume) from keelrl.agents.harness.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from keelrl.agents.harness.checkpoints import read_checkpoint
from keelrl.agents.harness.loop import Run, TrainResult
from keelrl.agents.harness.options import (
    RunOptions,
    evaluation_seed,
    require_positive,
    require_positive_counts,
    require_positive_widths,
    run_cli,
    validate_run_options,
)
from keelrl.agents.harness.run_directory import DATASET_FILE
from keelrl.agents.harness.saved_agent import SavedAgent
from keelrl.buffers import Batch
from keelrl.buffers.corruption import Policy, QFunction
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
    DeterministicActor,
    RunningObsNorm,
    check_device,
    check_precision,
    make_optimizer,
    matmul_precision,
    mlp,
    optimizer_step,
    scale_learning_rates,
    soft_update,
    to_device,
)

ALGO = "iql"
__all__ = ["IQL", "IQLConfig", "train", "evaluate"]


@dataclasses.dataclass
class IQLConfig(DatasetOptions, RunOptions):
    total_updates: int = 1_000_000
    """gradient updates to train for"""
    batch_size: int = 256
    """transitions per gradient update"""
    gamma: float = 0.99
    """discount factor"""
    tau: float = 0.005
    """target network Polyak rate"""
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
    hidden_sizes: tuple[int, ...] = (256, 256)
    """hidden layer sizes of actor, critics and value network"""
    num_critics: int = 2
    """critics in the Q ensemble"""
    deterministic_actor: bool = False
    """a deterministic actor trained by weighted squared error (CORL uses it on hopper-medium and RIQL everywhere)"""
    log_std_min: float = -20.0
    """lower clip of the Gaussian actor's state-independent log-std (RIQL: -5)"""
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


def validate(config: IQLConfig) -> None:
    """Reject option values no run can use, with the option's command-line name."""
    validate_run_options(config, "total_updates")
    validate_dataset_options(config)
    require_positive_widths(config)
    check_device(config.device, compile=False, cudagraphs=False)
    check_precision(config.precision, config.device)
    require_positive_counts(config, "batch_size")
    require_positive(config, "actor_lr", "qf_lr", "vf_lr")
    if not 0.0 < config.gamma <= 1.0 or not 0.0 < config.tau <= 1.0:
        raise ValueError(f"--gamma and --tau must lie in (0, 1], got {config.gamma} and {config.tau}.")
    if not 0.0 < config.expectile < 1.0:
        raise ValueError(f"--expectile must lie in (0, 1), got {config.expectile}.")
    if config.num_critics < 1 or config.beta < 0:
        raise ValueError("--num-critics must be positive and --beta non-negative.")


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
        """The mean, or a sample clipped into the action box: (B, A)."""
        mean = self.mean_net(obs)
        if deterministic:
            return mean
        std = self.log_std.clamp(self.log_std_min, self.log_std_max).exp()
        return torch.max(torch.min(mean + std * torch.randn_like(mean), self.high), self.low)


def cosine_factor(step: int, total: int) -> float:
    """Cosine decay from 1 to 0 over `total` steps (CORL's CosineAnnealingLR on IQL's actor)."""
    return 0.5 * (1.0 + math.cos(math.pi * min(step, total) / total))


class IQL(SavedAgent):
    """The IQL networks and update rule; takes raw observations (standardised inside when configured). Saving and
    loading (`save`, `IQL.load`) and the training state a checkpoint carries come from SavedAgent."""

    algo = ALGO
    config_cls = IQLConfig

    def __init__(self, obs_dim: int, action_low: np.ndarray, action_high: np.ndarray, config: IQLConfig):
        super().__init__()
        self.remember(obs_dim, action_low, action_high, config)
        # (obs − mean) / (std + 1e-3) with the dataset's statistics, as CORL and RIQL
        self.obs_norm = RunningObsNorm(obs_dim, clip=None, eps=1e-3, eps_on="std") if config.normalize_obs \
            else nn.Identity()
        hidden, action_dim = tuple(config.hidden_sizes), len(action_low)
        self.critic = CriticEnsemble(obs_dim, action_dim, hidden, config.num_critics)  # -> (E, B, 1)
        self.initialise_critic(self.critic)
        self.critic_target = CriticEnsemble(obs_dim, action_dim, hidden, config.num_critics).requires_grad_(False)
        self.critic_target.load_state_dict(self.critic.state_dict())
        # the parameter lists Polyak averaging walks, gathered once (the tensors stay the same objects)
        self.polyak_target, self.polyak_online = list(self.critic_target.parameters()), list(self.critic.parameters())
        self.value = mlp(obs_dim, hidden, 1)  # -> (B, 1)
        if config.deterministic_actor:
            self.actor = DeterministicActor(obs_dim, action_low, action_high, hidden)
        else:
            self.actor = GaussianActor(obs_dim, action_low, action_high, hidden, config.log_std_min)
        self.optimizers = {"actor": make_optimizer(list(self.actor.parameters()), "adam", config.actor_lr),
                           "critic": make_optimizer(list(self.critic.parameters()), "adam", config.qf_lr),
                           "value": make_optimizer(list(self.value.parameters()), "adam", config.vf_lr)}
        self.num_updates = 0

    def initialise_critic(self, critic: CriticEnsemble) -> None:
        """IQL keeps PyTorch's default initialisation of the critics (RIQL: EDAC's)."""

    def fit_normalizer(self, data: dict[str, np.ndarray]) -> None:
        """Fit the observation statistics to the dataset's observations."""
        if self.config.normalize_obs:
            self.obs_norm.update(torch.as_tensor(data["observations"]))

    def policy(self, obs: torch.Tensor, deterministic: bool) -> torch.Tensor:
        """Actions (B, A) for normalised observations: the policy's mean, or a sample."""
        if self.config.deterministic_actor:
            return self.actor(obs)
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

    def attack_q(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Q-values (B,) of raw observations, differentiable in both inputs (for adversarial corruption)."""
        return self.q_value(self.obs_norm(obs), actions)

    def attack_policy(self, obs: torch.Tensor) -> torch.Tensor:
        """Deterministic actions of raw observations, differentiable in them (for adversarial corruption)."""
        return self.policy(self.obs_norm(obs), deterministic=True)

    def update(self, batch: Batch) -> dict[str, torch.Tensor]:
        """One update on a batch of raw transitions: the V, Q and actor losses from the networks as they are
        before the update (none depends on another's step), then the steps of V, Q, the target critics and
        the actor (CORL's order)."""
        if self.config.normalize_obs:
            batch = batch._replace(obs=self.obs_norm(batch.obs), next_obs=self.obs_norm(batch.next_obs))
        with matmul_precision(self.config.precision, self.config.device):  # forward passes only, no optimiser step
            with torch.no_grad():
                target_q = self.critic_target(batch.obs, batch.actions)[..., 0].min(dim=0).values  # (E, B) -> (B,)
                next_v = self.value(batch.next_obs).float()[:, 0]  # (B, 1) -> (B,)
            value_loss, advantage = self.value_loss(batch.obs, target_q)
            q_loss, q = self.critic_loss(batch, next_v)
            actor_loss = self.actor_loss(batch, advantage)
        optimizer_step(self.optimizers["value"], value_loss, self.value)
        optimizer_step(self.optimizers["critic"], q_loss, self.critic)
        soft_update(self.polyak_target, self.polyak_online, self.config.tau)
        scale_learning_rates([self.optimizers["actor"]], cosine_factor(self.num_updates, self.config.total_updates))
        optimizer_step(self.optimizers["actor"], actor_loss, self.actor)
        self.num_updates += 1
        return {"losses/qf_loss": q_loss.detach(), "losses/vf_loss": value_loss.detach(),
                "losses/actor_loss": actor_loss.detach(), "losses/qf_values": q.mean(),
                "losses/advantage": advantage.mean()}

    def value_loss(self, obs: torch.Tensor, target_q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """V's loss: expectile regression onto the target Q of dataset actions; and the advantages Q − V (B,),
        detached."""
        advantage = target_q - self.value(obs).float()[:, 0]
        value_loss = (torch.abs(self.config.expectile - (advantage < 0).float()) * advantage.pow(2)).mean()
        return value_loss, advantage.detach()

    def critic_loss(self, batch: Batch, next_v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Q's loss: the mean squared error of every critic's Q (E, B) to the one-step target r + γ(1 − terminated)
        V(s') (B,), no maximisation over actions; and the critics' Q-values (E, B), detached."""
        q = self.critic(batch.obs, batch.actions)[..., 0]  # (E, B)
        target = batch.rewards + batch.discounts * (1.0 - batch.terminated) * next_v
        return F.mse_loss(q, target.expand_as(q)), q.detach()

    def actor_loss(self, batch: Batch, advantage: torch.Tensor) -> torch.Tensor:
        """The actor's loss: advantage-weighted regression onto dataset actions (its learning rate follows a
        cosine, see `update`)."""
        config = self.config
        weights = torch.exp(config.beta * advantage).clamp(max=config.exp_adv_max)
        if config.deterministic_actor:
            regression = (self.actor(batch.obs) - batch.actions).pow(2).sum(-1)
        else:
            regression = -self.actor.log_prob(batch.obs, batch.actions)
        return (weights * regression).mean()


def evaluate(agent: IQL, env_id: str, episodes: int = 10, seed: int = 0,
             deterministic: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Returns and costs of `episodes` episodes of the agent's deterministic (or stochastic) policy."""
    return play_episodes(lambda obs: agent.act(obs, deterministic=deterministic), env_id, episodes, seed)


def load_attacker(path: str) -> tuple[QFunction, Policy]:
    """The critic and deterministic policy, on raw observations, of the IQL or RIQL agent saved at `path`
    (--attack-model): what --corruption-mode adversarial perturbs the dataset against. As the RIQL paper attacks
    every algorithm with one pre-trained agent's critic (EDAC's there), keelrl attacks with an IQL-family one."""
    state = read_checkpoint(path, algo=None)
    if state["algo"] not in ("iql", "riql"):
        raise ValueError(f"--attack-model {path} is a {state['algo']!r} model; adversarial corruption attacks the "
                         f"critic of an IQL or RIQL agent trained on the clean dataset (python -m keelrl.agents.iql).")
    attacker = IQL.from_model_file(state).requires_grad_(False)  # RIQL's networks are IQL's
    return attacker.attack_q, attacker.attack_policy


def train(config: IQLConfig) -> TrainResult:
    """Train IQL for `config.total_updates` gradient updates on `config.dataset`."""
    run = Run(config, ALGO, validate, total="total_updates")
    config = run.config
    with run:  # from here on, a failure releases the run's lock, threads and signals
        attacker = load_attacker(config.attack_model) if config.corruption and config.attack_model else (None, None)
        data, summary = prepare_dataset(config, config.seed, *attacker)
        env_id = summary["env_id"]
        observation_space, action_space = evaluation_spaces(data, env_id)
        agent = IQL(int(np.prod(observation_space.shape)), action_space.low, action_space.high, config)
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
    raise SystemExit(run_cli(train, IQLConfig))
