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
The update is written out here (`RIQL.update`, in IQL's order); the rest is IQL's (agents/iql.py): its networks,
value and actor losses and cosine schedule, which `RIQL` takes from `IQL` with its own critic initialisation and
observation statistics.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

from keelrl.agents.harness.loop import Run, TrainResult
from keelrl.agents.harness.options import evaluation_seed, run_cli
from keelrl.agents.harness.run_directory import DATASET_FILE
from keelrl.agents.iql import IQL, IQLConfig, cosine_factor, evaluate, load_attacker
from keelrl.agents.iql import validate as validate_iql
from keelrl.buffers import Batch
from keelrl.buffers.offline import DatasetBuffer, evaluation_spaces, prepare_dataset
from keelrl.envs.video import gym_video
from keelrl.networks import (
    CriticEnsemble,
    matmul_precision,
    optimizer_step,
    scale_learning_rates,
    soft_update,
)

ALGO = "riql"
__all__ = ["RIQL", "RIQLConfig", "train", "evaluate"]


@dataclasses.dataclass
class RIQLConfig(IQLConfig):
    total_updates: int = 3_000_000
    """gradient updates (RIQL: 3000 epochs × 1000); the actor's cosine schedule runs over all of them"""
    eval_freq: int = 10_000
    """updates between evaluations (0: only at the end)"""
    num_critics: int = 5
    """critics in the Q ensemble"""
    deterministic_actor: bool = True
    """a deterministic actor trained by weighted squared error (RIQL's default)"""
    log_std_min: float = -5.0
    """lower clip of a Gaussian actor's log-std (with --no-deterministic-actor)"""
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


def validate(config: RIQLConfig) -> None:
    """Reject option values no run can use, with the option's command-line name."""
    validate_iql(config)
    if not 0.0 < config.quantile < 1.0 or config.huber_sigma <= 0:
        raise ValueError(f"--quantile must lie in (0, 1) and --huber-sigma be positive, got {config.quantile} and "
                         f"{config.huber_sigma}.")
    if config.target_clip is not None and config.target_clip[0] >= config.target_clip[1]:
        raise ValueError(f"--target-clip LOW HIGH needs LOW < HIGH, got {config.target_clip}.")


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


class RIQL(IQL):
    """IQL with RIQL's robust choices (each an option of RIQLConfig); takes raw observations."""

    algo = ALGO
    config_cls = RIQLConfig

    def initialise_critic(self, critic: CriticEnsemble) -> None:
        """EDAC's initialisation (RIQL), or PyTorch's default."""
        if self.config.edac_critic_init:
            edac_init_(critic)

    def fit_normalizer(self, data: dict[str, np.ndarray]) -> None:
        """Fit the observation statistics to the dataset's observations and next observations (RIQL: a corrupted
        next observation counts too), or to its observations alone."""
        if not self.config.obs_stats_with_next:
            return super().fit_normalizer(data)
        if self.config.normalize_obs:
            self.obs_norm.update(torch.as_tensor(np.concatenate([data["observations"], data["next_observations"]])))

    def update(self, batch: Batch) -> dict[str, torch.Tensor]:
        """One update on a batch of raw transitions, in IQL's order: the V, Q and actor losses from the networks as
        they are before the update, then the steps of V, Q, the target critics and the actor. RIQL's V target is
        `value_target`'s and its critic loss `critic_loss`'s."""
        if self.config.normalize_obs:
            batch = batch._replace(obs=self.obs_norm(batch.obs), next_obs=self.obs_norm(batch.next_obs))
        with matmul_precision(self.config.precision, self.config.device):  # forward passes only, no optimiser step
            with torch.no_grad():
                target_q = self.value_target(self.critic_target(batch.obs, batch.actions)[..., 0])  # (E, B) -> (B,)
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

    def value_target(self, q_all: torch.Tensor) -> torch.Tensor:
        """V's target from the target critics' values (E, B) -> (B,): their `quantile` (RIQL; interpolated linearly
        between order statistics), or their minimum (IQL)."""
        if self.config.q_target == "quantile":
            return torch.quantile(q_all, self.config.quantile, dim=0)
        return q_all.min(dim=0).values

    def critic_loss(self, batch: Batch, next_v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Q's loss: every critic's Q (E, B) regressed onto r + γ(1 − terminated) V(s') (B,), clipped into
        `target_clip` ([−100, 1000]) (RIQL), by the Huber loss, quadratic below |error| 1/σ² and linear beyond
        (RIQL), or IQL's squared error; and the critics' Q-values (E, B), detached."""
        q = self.critic(batch.obs, batch.actions)[..., 0]  # (E, B)
        target = batch.rewards + batch.discounts * (1.0 - batch.terminated) * next_v
        if self.config.target_clip is not None:
            target = target.clamp(*self.config.target_clip)
        if self.config.q_loss == "huber":
            return F.smooth_l1_loss(q, target.expand_as(q), beta=1.0 / self.config.huber_sigma**2), q.detach()
        return F.mse_loss(q, target.expand_as(q)), q.detach()


def train(config: RIQLConfig) -> TrainResult:
    """Train RIQL for `config.total_updates` gradient updates on `config.dataset`."""
    run = Run(config, ALGO, validate, total="total_updates")
    config = run.config
    with run:  # from here on, a failure releases the run's lock, threads and signals
        attacker = load_attacker(config.attack_model) if config.corruption and config.attack_model else (None, None)
        data, summary = prepare_dataset(config, config.seed, *attacker)
        env_id = summary["env_id"]
        observation_space, action_space = evaluation_spaces(data, env_id)
        agent = RIQL(int(np.prod(observation_space.shape)), action_space.low, action_space.high, config)
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
    raise SystemExit(run_cli(train, RIQLConfig))
