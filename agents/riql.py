"""Robust IQL (Yang et al. 2023, "Towards Robust Offline RL under Diverse Data Corruption") with the
defaults of the RIQL repository's TrainConfig (RIQL.py).

Run:     python -m keelrl.agents.riql --dataset keelrl/hopper-medium-v0 --corruption dynamics --corruption-rate 0.3
Import:  from keelrl.agents.riql import RIQL, RIQLConfig, train, evaluate

RIQL is IQL (agents/iql.py) made robust to corrupted data. The algorithm, top to bottom, with what RIQL
changes marked (RIQL):
- observation statistics over observations and next observations, so a corrupted s' counts too (RIQL);
- an ensemble of 5 critics (RIQL) with EDAC's initialisation: biases 0.1, output layer U(±3e-3) (RIQL);
- V(s) regresses onto the target critics' Q(s, a) of dataset actions by expectile regression
  (weight |τ − 1(Q − V < 0)|, τ = 0.7), the target being the critics' `quantile` (0.25) instead of their
  minimum (RIQL);
- the Q ensemble regresses onto r + γ(1 − terminated) V(s'), targets clipped into [−100, 1000], by a Huber
  loss, quadratic below |error| 1/σ² (σ = 1) and linear beyond (RIQL);
- target critics follow by Polyak averaging with rate τ;
- a deterministic actor (RIQL) does advantage-weighted regression: minimise exp(β (Q − V)) (clipped at 100)
  times the squared error to the dataset action, its learning rate on a cosine over all 3M updates (RIQL:
  3000 epochs × 1000 updates);
- the loop: load the dataset (corrupted as RIQL's benchmark does, if asked), fit the observation statistics,
  then update on uniform batches, evaluating the deterministic policy every 10k updates (the run options'
  default) in the dataset's environment (return and D4RL score).
Each robust choice is an option (--q-target min, --q-loss mse, --target-clip None, ... give IQL back). The
paper tunes σ, the quantile and the ensemble per task and corruption (hopper, random dynamics: σ 1, quantile
0.5, 5 critics; random observations: σ 0.1, quantile 0.25, 3 critics); pass them as options.
IQL's Gaussian actor (for --no-deterministic-actor), EDAC's initialisation and the cosine schedule come from
agents/iql.py; the dataset from keelrl.buffers (DatasetOptions, prepare_dataset, DatasetBuffer), the networks
and optimiser steps from keelrl.networks, the run plumbing (logs, evaluation and checkpoint timing, resume)
from agents/harness.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from keelrl.agents.harness import (
    Run,
    RunOptions,
    TrainResult,
    evaluate_policy,
    load_attacker,
    load_checkpoint,
    require_positive_counts,
    run_cli,
    save_checkpoint,
    validate_run_options,
)
from keelrl.agents.iql import GaussianActor, cosine_factor, edac_init_
from keelrl.buffers import Batch
from keelrl.buffers.offline import (
    DatasetBuffer,
    DatasetOptions,
    evaluation_spaces,
    normalized_score,
    prepare_dataset,
    validate_dataset_options,
)
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
    pack_training_state,
    scale_learning_rates,
    soft_update,
    unpack_training_state,
)

ALGO = "riql"
__all__ = ["RIQL", "RIQLConfig", "train", "evaluate"]


@dataclasses.dataclass
class RIQLConfig(DatasetOptions, RunOptions):
    total_updates: int = 3_000_000
    """gradient updates (RIQL: 3000 epochs × 1000); the actor's cosine schedule runs over all of them"""
    batch_size: int = 256
    """transitions per gradient update"""
    gamma: float = 0.99
    """discount factor"""
    tau: float = 0.005
    """target network Polyak rate"""
    expectile: float = 0.7
    """expectile τ of V's regression onto Q"""
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
    num_critics: int = 5
    """critics in the Q ensemble"""
    deterministic_actor: bool = True
    """a deterministic actor trained by weighted squared error (RIQL's default)"""
    log_std_min: float = -5.0
    """lower clip of a Gaussian actor's log-std (with --no-deterministic-actor)"""
    normalize_obs: bool = True
    """standardise observations by the dataset's mean and std (saved with the model)"""
    q_target: Literal["min", "quantile"] = "quantile"
    """how V's target combines the target critics: their `quantile`, or their minimum (IQL)"""
    quantile: float = 0.25
    """quantile of the target critics"""
    q_loss: Literal["mse", "huber"] = "huber"
    """critic regression loss (IQL: mse)"""
    huber_sigma: float = 1.0
    """σ: the Huber loss is quadratic for |error| < 1/σ² and linear beyond"""
    target_clip: tuple[float, float] | None = (-100.0, 1000.0)
    """clip Q targets into [low, high] (None: no clipping, as IQL)"""
    obs_stats_with_next: bool = True
    """fit the observation statistics to observations and next observations"""
    edac_critic_init: bool = True
    """EDAC's critic initialisation: every bias 0.1, the output layer's weights and bias U(±3e-3)"""
    device: str = "cpu"
    """torch device for networks and dataset"""
    precision: str = "fp32"
    """'fp32', or 'bf16': matrix products in bfloat16 under autocast; weights, optimiser state, losses, TD targets,
    log-probabilities and target updates stay float32 (fast only where the CPU or GPU has native bf16)"""


def validate(config: RIQLConfig) -> None:
    """Reject option values no run can use, with the option's command-line name."""
    validate_run_options(config, "total_updates")
    validate_dataset_options(config)
    check_device(config.device, compile=False, cudagraphs=False)
    check_precision(config.precision, config.device)
    require_positive_counts(config, "batch_size")
    if not 0.0 < config.gamma <= 1.0 or not 0.0 < config.tau <= 1.0:
        raise ValueError(f"--gamma and --tau must lie in (0, 1], got {config.gamma} and {config.tau}.")
    if not 0.0 < config.expectile < 1.0 or not 0.0 < config.quantile < 1.0:
        raise ValueError(f"--expectile and --quantile must lie in (0, 1), "
                         f"got {config.expectile} and {config.quantile}.")
    if config.num_critics < 1 or config.beta < 0 or config.huber_sigma <= 0:
        raise ValueError("--num-critics must be positive, --beta non-negative and --huber-sigma positive.")
    if config.target_clip is not None and config.target_clip[0] >= config.target_clip[1]:
        raise ValueError(f"--target-clip LOW HIGH needs LOW < HIGH, got {config.target_clip}.")


class RIQL(nn.Module):
    """The RIQL networks and update rule; takes raw observations (standardised inside when configured).

    IQL's networks and update order (V, Q, target critics, actor); what RIQL changes is marked "RIQL"."""

    def __init__(self, obs_dim: int, action_low: np.ndarray, action_high: np.ndarray, config: RIQLConfig):
        super().__init__()
        self.config = config
        self.obs_dim = obs_dim
        self.register_buffer("action_low", torch.as_tensor(action_low, dtype=torch.float32))
        self.register_buffer("action_high", torch.as_tensor(action_high, dtype=torch.float32))
        # (obs − mean) / (std + 1e-3) with the dataset's statistics, as CORL and RIQL
        self.obs_norm = RunningObsNorm(obs_dim, clip=None, eps=1e-3, eps_on="std") if config.normalize_obs \
            else nn.Identity()
        hidden, action_dim = tuple(config.hidden_sizes), len(action_low)
        self.critic = CriticEnsemble(obs_dim, action_dim, hidden, config.num_critics)  # -> (E, B, 1)
        if config.edac_critic_init:  # RIQL: EDAC's initialisation (agents/iql.py)
            edac_init_(self.critic)
        self.critic_target = CriticEnsemble(obs_dim, action_dim, hidden, config.num_critics).requires_grad_(False)
        self.critic_target.load_state_dict(self.critic.state_dict())
        # the parameter lists Polyak averaging walks, gathered once (the tensors stay the same objects)
        self.polyak_target, self.polyak_online = list(self.critic_target.parameters()), list(self.critic.parameters())
        self.value = mlp(obs_dim, hidden, 1)  # -> (B, 1)
        if config.deterministic_actor:  # RIQL: a deterministic actor
            self.actor = DeterministicActor(obs_dim, action_low, action_high, hidden)
        else:  # IQL's state-independent Gaussian (agents/iql.py)
            self.actor = GaussianActor(obs_dim, action_low, action_high, hidden, config.log_std_min)
        self.optimizers = {"actor": make_optimizer(list(self.actor.parameters()), "adam", config.actor_lr),
                           "critic": make_optimizer(list(self.critic.parameters()), "adam", config.qf_lr),
                           "value": make_optimizer(list(self.value.parameters()), "adam", config.vf_lr)}
        self.num_updates = 0

    def fit_normalizer(self, data: dict[str, np.ndarray]) -> None:
        """Fit the observation statistics to the dataset's observations and next observations (RIQL: a corrupted
        next observation counts too), or to its observations alone."""
        if not self.config.normalize_obs:
            return
        observations = data["observations"]
        if self.config.obs_stats_with_next:
            observations = np.concatenate([data["observations"], data["next_observations"]])
        self.obs_norm.update(torch.as_tensor(observations))

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
        obs_t = self.obs_norm(torch.as_tensor(obs, dtype=torch.float32, device=self.action_low.device))
        return self.policy(obs_t, deterministic).cpu().numpy()

    def attack_q(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Q-values (B,) of raw observations, differentiable in both inputs (for adversarial corruption)."""
        return self.q_value(self.obs_norm(obs), actions)

    def attack_policy(self, obs: torch.Tensor) -> torch.Tensor:
        """Deterministic actions of raw observations, differentiable in them (for adversarial corruption)."""
        return self.policy(self.obs_norm(obs), deterministic=True)

    def combine_targets(self, q_all: torch.Tensor) -> torch.Tensor:
        """V's target from the target critics' values (E, B) -> (B,): their `quantile` (RIQL), or their minimum
        (IQL); the quantile interpolates linearly between order statistics."""
        if self.config.q_target == "quantile":
            return torch.quantile(q_all, self.config.quantile, dim=0)
        return q_all.min(dim=0).values

    def update(self, batch: Batch) -> dict[str, torch.Tensor]:
        """One update on a batch of raw transitions: the V, Q and actor losses from the networks as they are
        before the update (none depends on another's step), then the steps of V, Q, the target critics and
        the actor (CORL's order)."""
        if self.config.normalize_obs:
            batch = batch._replace(obs=self.obs_norm(batch.obs), next_obs=self.obs_norm(batch.next_obs))
        with matmul_precision(self.config.precision, self.config.device):  # forward passes only, no optimiser step
            with torch.no_grad():
                target_q = self.combine_targets(self.critic_target(batch.obs, batch.actions)[..., 0])  # (E, B) -> (B,)
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
        """Q's loss: one-step TD onto r + γ(1 − terminated) V(s'), no maximisation over actions; and the
        critics' Q-values (E, B), detached."""
        config = self.config
        target = batch.rewards + batch.discounts * (1.0 - batch.terminated) * next_v
        if config.target_clip is not None:  # RIQL: targets clipped into [−100, 1000]
            target = target.clamp(*config.target_clip)
        q = self.critic(batch.obs, batch.actions)[..., 0]  # (E, B)
        target = target.expand_as(q)
        if config.q_loss == "huber":  # RIQL: quadratic below |error| 1/σ², linear beyond (IQL: MSE)
            q_loss = F.smooth_l1_loss(q, target, beta=1.0 / config.huber_sigma**2)
        else:
            q_loss = F.mse_loss(q, target)
        return q_loss, q.detach()

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

    def training_state(self) -> dict:
        """Networks, optimisers and the update counter: everything to continue training."""
        return pack_training_state(self, self.optimizers, self.num_updates)

    def load_training_state(self, state: dict) -> None:
        self.num_updates = unpack_training_state(self, self.optimizers, state)

    def save(self, path: str | os.PathLike) -> None:
        """Save networks (observation statistics included) and config: tensors and plain values only."""
        save_checkpoint(Path(path), {"algo": ALGO, "config": dataclasses.asdict(self.config), "obs_dim": self.obs_dim,
                                     "networks": self.state_dict()})

    @classmethod
    def load(cls, path: str | os.PathLike, device: str = "cpu") -> RIQL:
        state = load_checkpoint(path, ALGO)
        networks = state["networks"]
        agent = cls(state["obs_dim"], networks["action_low"].numpy(), networks["action_high"].numpy(),
                    RIQLConfig(**state["config"]))
        agent.load_state_dict(networks)
        return agent.to(device)


def evaluate(agent: RIQL, env_id: str, episodes: int = 10, seed: int = 0,
             deterministic: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Returns and costs of `episodes` episodes of the agent's deterministic (or stochastic) policy."""
    return evaluate_policy(lambda obs: agent.act(obs, deterministic=deterministic), env_id, episodes, seed)


def train(config: RIQLConfig) -> TrainResult:
    """Train RIQL for `config.total_updates` gradient updates on `config.dataset`."""
    run = Run(config, ALGO, validate, total="total_updates", checkpoint_keys=("global_step", "agent", "rng", "sampler"))
    config = run.config
    q_function = policy = None  # of the agent an adversarial corruption attacks
    if config.corruption is not None and config.attack_model is not None:
        q_function, policy = load_attacker(config.attack_model)
    data, summary = prepare_dataset(config, config.seed, q_function, policy)
    env_id, references = summary["env_id"], summary["ref_scores"]
    observation_space, action_space = evaluation_spaces(data, env_id)
    agent = RIQL(int(np.prod(observation_space.shape)), action_space.low, action_space.high, config)
    agent.fit_normalizer(data)
    agent.to(config.device)
    buffer = DatasetBuffer(data, config.gamma, config.device, seed=config.seed)
    numpy_rng = np.random.default_rng(config.seed)  # the loop draws nothing from numpy; checkpoints keep its state
    if run.resumed:
        run.restore(agent, numpy_rng)
        with run.restoring():
            buffer.generator.set_state(run.checkpoint["sampler"])
    run.open(env_id, files={"dataset.json": json.dumps(summary, indent=2)},  # logs start from the restored state
             video=gym_video(env_id, lambda obs: agent.act(obs, deterministic=True), config.seed + 10_000))

    def write_checkpoint() -> None:
        run.save_checkpoint(agent, numpy_rng, sampler=buffer.generator.get_state())

    def run_evaluation() -> tuple[np.ndarray, float]:
        returns, costs = evaluate(agent, env_id, config.eval_episodes, config.seed + 10_000)
        score = float("nan") if references is None else float(normalized_score(returns, *references).mean())
        run.evaluation(returns, costs, {"eval/normalized_score": score})
        return returns, score

    with run:
        run.updates_began()  # every loop step updates
        while not run.done:
            losses = agent.update(buffer.sample(config.batch_size))
            run.advance(1)
            run.log(losses)
            run.periodic(run_evaluation, write_checkpoint)
        returns, score = run.finish(run_evaluation, write_checkpoint, agent.save)
    run.report(returns, f"normalised score {score:.1f}; {run.loop_speed():.1f} updates/s")
    return run.result(returns)


if __name__ == "__main__":
    raise SystemExit(run_cli(train, RIQLConfig))
