"""Twin Delayed DDPG (Fujimoto et al. 2018) with CleanRL's defaults.

Run:     python -m keelrl.agents.td3 --env-id Hopper-v5
Import:  from keelrl.agents.td3 import TD3, TD3Config, train, evaluate

The algorithm, top to bottom:
- a deterministic tanh actor explores with Gaussian noise of std `exploration_noise` × action scale;
- twin Q critics (one batched ensemble) regress onto r + γ(1 − terminated) min Q_target(s', ã'), where
  ã' is the target actor's action plus clipped Gaussian noise (target policy smoothing);
- every `policy_frequency` critic updates, the actor ascends Q1(s, actor(s)) (the first critic only) and
  the target actor and critics follow by Polyak averaging with rate τ;
- the loop: uniform random actions for `learning_starts` steps, then the noisy policy's; every environment
  step is stored in the replay buffer and followed by `utd` updates per environment.
The networks come from keelrl.networks (NetworkOptions: MLP, SimBa or SimbaV2; scalar, C51 or HL-Gauss
critic outputs), the replay buffer from keelrl.buffers, the run plumbing (logs, evaluation and checkpoint
timing, resume) from keelrl.agents.harness.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Literal

import numpy as np
import torch
from torch import nn

from keelrl.agents.harness.saved_agent import SavedAgent
from keelrl.agents.harness.seeds import SeedRuns, validate_seed_group
from keelrl.agents.harness.loop import TrainResult
from keelrl.agents.harness.options import (
    RunOptions,
    apply_preset,
    require_non_negative,
    require_positive_counts,
    require_positive_widths,
    run_cli,
    validate_run_options,
    warn_without_updates,
)
from keelrl.agents.off_policy_options import OffPolicyOptions
from keelrl.buffers import Batch, ReplayBuffer
from keelrl.envs import make_vec_env, play_episodes, require_box_actions
from keelrl.envs.video import gym_video
from keelrl.networks import (
    CriticEnsemble,
    NetworkOptions,
    RunningObsNorm,
    build_actor,
    build_critic,
    build_head,
    check_device,
    check_precision,
    frozen,
    loss_function,
    make_optimizer,
    optimizer_step,
    scale_learning_rates,
    soft_update,
    td_target,
    to_device,
    validate_network_options,
)
from keelrl.networks.builders import (
    MUJOCO_DISCOUNT,
    build_reward_scaler,
    validate_scaled_support,
    with_default_support,
)
from keelrl.networks.cuda_graphs import GraphedUpdate
from keelrl.networks.seeds import GlobalRandom, SeedMapped

ALGO = "td3"
__all__ = ["TD3", "TD3Config", "train", "evaluate"]


@dataclasses.dataclass
class TD3Config(OffPolicyOptions, NetworkOptions, RunOptions):
    # the environments, replay buffer, γ, τ, batch size, n-step returns, UTD, observation and reward scaling, the
    # learning-rate schedule, preset, device, precision and seeds: OffPolicyOptions (agents/off_policy_options.py),
    # as SAC's; the run options: RunOptions; the networks: NetworkOptions
    learning_starts: int = 25_000
    """environment steps of uniform random actions before learning starts"""
    learning_rate: float = 3e-4
    """actor and critic learning rate"""
    policy_frequency: int = 2
    """delayed policy updates: one actor step and one target update every this many critic updates"""
    policy_noise: float = 0.2
    """std of the target policy smoothing noise, in units of the action scale"""
    noise_clip: float = 0.5
    """the smoothing noise is clipped to ±noise_clip (action-scale units)"""
    exploration_noise: float = 0.1
    """std of the exploration noise, in units of the action scale"""
    optimizer: Literal["adam", "adamw"] = "adam"
    """optimiser of actor and critics"""
    weight_decay: float = 0.0
    """decoupled weight decay of actor and critics (--optimizer adamw)"""


# The SimBa and SimbaV2 papers' networks, critics, optimisers and MuJoCo run settings on TD3's update rule (the
# policy delay and target smoothing stay TD3's: neither reference has TD3). Values and sources as SAC's presets
# (agents/sac.py); SimBa's DDPG (github.com/SonyResearch/simba configs/agent/ddpg_simba.yaml:10,15-16,21-22) has
# the same observation normalisation, lr 1e-4 and AdamW weight decay 1e-2 on actor and critic, and exploration
# noise 0.1 (:32, keelrl's default). Learning starts at 5000 steps (configs/buffer/numpy_uniform.yaml:7 of both
# repos) instead of TD3's 25000; γ 0.995 from their episode-length heuristic on MuJoCo's 1000-step episodes.
PRESETS = {
    "simba": dict(network="simba", normalize_obs=True, obs_clip=None, optimizer="adamw", weight_decay=1e-2,
                  learning_rate=1e-4, utd=2, gamma=MUJOCO_DISCOUNT, learning_starts=5_000),
    "simbav2": dict(network="simbav2", normalize_obs=True, obs_clip=None, critic_head="c51", num_bins=101,
                    scale_rewards=True, optimizer="adam", learning_rate=1e-4, final_lr_fraction=0.5, utd=1,
                    gamma=MUJOCO_DISCOUNT, learning_starts=5_000),
}


def validate(config: TD3Config) -> None:
    """Reject option values no run can use, with the option's command-line name."""
    validate_run_options(config, "total_timesteps")
    validate_network_options(config)
    validate_scaled_support(config, config.scale_rewards)
    require_positive_widths(config)
    check_device(config.device, config.compile, config.cudagraphs)
    check_precision(config.precision, config.device)
    require_positive_counts(config, "num_envs", "buffer_size", "batch_size", "policy_frequency", "n_step", "utd")
    require_non_negative(config, "learning_starts", "learning_rate", "policy_noise", "noise_clip", "exploration_noise")
    warn_without_updates(config, "learning_starts")
    if not 0.0 < config.gamma <= 1.0 or not 0.0 < config.tau <= 1.0:
        raise ValueError(f"--gamma and --tau must lie in (0, 1], got {config.gamma} and {config.tau}.")
    if config.batch_size > config.buffer_size:
        raise ValueError(f"--batch-size {config.batch_size} is larger than --buffer-size {config.buffer_size}.")
    if config.weight_decay < 0 or not 0.0 < config.final_lr_fraction <= 1.0:
        raise ValueError("--weight-decay must be non-negative and --final-lr-fraction in (0, 1].")
    if config.obs_clip is not None and not config.obs_clip > 0:
        raise ValueError(f"--obs-clip must be positive (or None for no clipping), got {config.obs_clip}.")
    validate_seed_group(config)


def resolve(config: TD3Config) -> TD3Config:
    """The config a new run trains with: the preset's settings applied, then a categorical critic on scaled
    rewards given the support [−5, 5] unless --v-min/--v-max are set."""
    config = apply_preset(config, PRESETS)
    return with_default_support(config, config.scale_rewards)


class TD3(SavedAgent):
    """The TD3 networks and update rule; takes raw observations (normalised inside when configured). Saving and
    loading (`save`, `TD3.load`) and the training state a checkpoint carries come from SavedAgent."""

    algo = ALGO
    config_cls = TD3Config

    def __init__(self, obs_dim: int, action_low: np.ndarray, action_high: np.ndarray, config: TD3Config):
        super().__init__()
        self.remember(obs_dim, action_low, action_high, config)
        # (obs − mean) / sqrt(var + 1e-8) as SimBa and SimbaV2 (which do not clip: --obs-clip None in their presets)
        self.obs_norm = RunningObsNorm(obs_dim, config.obs_clip, eps=1e-8) if config.normalize_obs else nn.Identity()
        self.reward_scaler = build_reward_scaler(config, config.gamma, config.num_envs) if config.scale_rewards \
            else None
        self.head = build_head(config)  # critic outputs -> Q-values, and the critic's loss against its target
        self.critic = build_critic(config, obs_dim, len(action_low), self.head.num_outputs)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.actor = build_actor(config, obs_dim, action_low, action_high, stochastic=False)
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        # the parameter lists Polyak averaging walks, gathered once (the tensors stay the same objects)
        self.polyak_target = [*self.actor_target.parameters(), *self.critic_target.parameters()]
        self.polyak_online = [*self.actor.parameters(), *self.critic.parameters()]
        self.optimizers = {
            "actor": make_optimizer(list(self.actor.parameters()), config.optimizer, config.learning_rate,
                                    config.weight_decay),
            "critic": make_optimizer(list(self.critic.parameters()), config.optimizer, config.learning_rate,
                                     config.weight_decay),
        }
        self.num_updates = 0
        self.total_updates = max(1, (config.total_timesteps - config.learning_starts) * config.utd)
        # one seed; networks/seeds.stack_seeds makes several, every tensor with a leading seed axis (S, ...)
        self.num_seeds, self.random = 1, GlobalRandom(config.device)
        self._critic_loss = loss_function(self.critic_loss, config.precision, config.device,
                                          config.compile or config.cudagraphs, seeds_of=self)
        self._actor_loss = loss_function(self.actor_loss, config.precision, config.device,
                                         config.compile or config.cudagraphs, seeds_of=self)
        # a seed group acts in one batched pass (vmap), compiled with the losses: host time per act of 3 seeds
        # 0.57-0.59 → 0.14 ms (SAC), 0.76-0.77 → 0.16 ms (TD3) on one CPU core (benchmarks/results/seeds.md)
        self._act = SeedMapped(self.noisy_actions, self, compile=config.compile or config.cudagraphs)
        # --cudagraphs: the whole of `learn_step` recorded as one CUDA graph per branch, then replayed
        self._learn_step = GraphedUpdate(self.learn_step, self) if config.cudagraphs else self.learn_step

    @torch.inference_mode()
    def act(self, obs: np.ndarray, deterministic: bool = False) -> np.ndarray:
        """Actions for a batch of raw observations (B, obs_dim) -> (B, action_dim): the actor's, plus Gaussian
        noise of std exploration_noise × action scale clipped to the action bounds unless deterministic."""
        obs = self.observation_batch(obs)
        obs_t = self.obs_norm(to_device(obs, self.action_low.device))
        noise = None if deterministic else self.random.normal(*obs.shape[-2:-1], self.action_low.shape[-1])
        return self._act(obs_t, noise).cpu().numpy()  # a seed group: (S, B, obs_dim) -> (S, B, action_dim)

    def noisy_actions(self, obs: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
        """The actor's actions (B, A) for normalised observations, plus `noise` (a standard normal draw, None: no
        noise) × exploration_noise × action scale, clipped to the action bounds."""
        actions = self.actor(obs)
        if noise is None:
            return actions
        noise = noise * (self.actor.action_scale * self.config.exploration_noise)
        return torch.clamp(actions + noise, self.action_low, self.action_high)

    def update(self, batch: Batch) -> dict[str, torch.Tensor]:
        """Normalise the batch's observations and scale its rewards (when configured), decay the learning
        rates (when configured), then `learn` from it."""
        if self.config.normalize_obs:
            batch = batch._replace(obs=self.obs_norm(batch.obs), next_obs=self.obs_norm(batch.next_obs))
        if self.reward_scaler is not None:
            batch = batch._replace(rewards=self.reward_scaler(batch.rewards))
        if self.config.final_lr_fraction < 1.0:  # linear decay over every update after learning_starts
            progress = min(1.0, self.num_updates / self.total_updates)
            scale_learning_rates(self.optimizers.values(), 1.0 - (1.0 - self.config.final_lr_fraction) * progress)
        self.num_updates += 1
        return self.learn(batch)

    def learn(self, batch: Batch) -> dict[str, torch.Tensor]:
        """One critic step; every `policy_frequency` updates, one actor step, then the target actor and critics
        follow by Polyak averaging (counted from update 1: the first actor step comes at update `policy_frequency`,
        as CleanRL's, whose updates start at step learning_starts + 1, odd, and step the actor at even steps)."""
        return self._learn_step(batch, self.num_updates % self.config.policy_frequency == 0)

    def learn_step(self, batch: Batch, actor_step: bool) -> dict[str, torch.Tensor]:
        losses = self.update_critic(batch)
        if actor_step:
            losses.update(self.update_actor(batch.obs))
            soft_update(self.polyak_target, self.polyak_online, self.config.tau)
        return losses

    def smoothed_target_actions(self, next_obs: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
        """The target actor's actions plus Gaussian noise clipped to ±noise_clip (target policy smoothing);
        `noise`: the standard normal draw (B, A) (default: one from torch's generator)."""
        actions = self.actor_target(next_obs)
        noise = (torch.randn_like(actions) if noise is None else noise) * self.config.policy_noise
        noise = noise.clamp(-self.config.noise_clip, self.config.noise_clip) * self.actor.action_scale
        return torch.clamp(actions + noise, self.action_low, self.action_high)

    def critic_loss(self, batch: Batch, noise: torch.Tensor, members: torch.Tensor | slice) -> tuple[torch.Tensor,
                                                                                                      torch.Tensor]:
        """The critics' summed loss against r + γ(1 − terminated) min Q'(s', ã'), ã' the target action smoothed
        with `noise` (B, A), the minimum over the target critics `members` (all, or a random subset), and the
        critics' detached values Q(s, a) (E, B) (taken here, where a seed group's batched pass gives each seed its
        own categorical support)."""
        with torch.no_grad():
            next_actions = self.smoothed_target_actions(batch.next_obs, noise)
            next_outputs = self.critic_target(batch.next_obs, next_actions)[members]  # (E, B, K) -> (M, B, K)
            target = td_target(self.head, next_outputs, batch.rewards, batch.discounts, batch.terminated)
        outputs = self.critic(batch.obs, batch.actions)  # (E, B, K)
        # squared error (scalar critic) or cross-entropy against the target distribution (C51, HL-Gauss), (E, B)
        per_sample = self.head.loss(outputs, target)
        return per_sample.mean(dim=1).sum(), self.head.value(outputs.detach())  # values (E, B)

    def first_critic_value(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Q1(s, a) (B,), the first critic's (an MLP ensemble computes that member alone)."""
        if isinstance(self.critic, CriticEnsemble):
            outputs = self.critic(obs, actions, members=slice(0, 1))
        else:
            outputs = self.critic(obs, actions)[:1]
        return self.head.value(outputs).squeeze(0)  # (1, B) -> (B,)

    def actor_loss(self, obs: torch.Tensor) -> torch.Tensor:
        """−Q1(s, actor(s)): the first critic only, as in the TD3 paper."""
        return -self.first_critic_value(obs, self.actor(obs)).mean()

    def update_critic(self, batch: Batch) -> dict[str, torch.Tensor]:
        noise = self.random.normal(*batch.rewards.shape[-1:], self.action_low.shape[-1])
        members = self.random.members(self.config.num_critics, self.config.critic_subset_size)
        critic_loss, values = self._critic_loss(batch, noise, members)  # a seed group: (S,), (S, E, B)
        optimizer_step(self.optimizers["critic"], critic_loss, self.critic)
        return {"losses/qf_loss": critic_loss.detach() / self.config.num_critics,
                "losses/qf_values": values.flatten(-2).mean(-1)}

    def update_actor(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        with frozen(self.critic):  # the actor loss needs gradients w.r.t. actions only
            actor_loss = self._actor_loss(obs)
        optimizer_step(self.optimizers["actor"], actor_loss, self.actor)
        return {"losses/actor_loss": actor_loss.detach()}


def evaluate(agent: TD3, env_id: str, episodes: int = 10, seed: int = 0,
             deterministic: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Returns and costs of `episodes` episodes of the agent's deterministic (or stochastic) policy."""
    return play_episodes(lambda obs: agent.act(obs, deterministic=deterministic), env_id, episodes, seed)


def train(config: TD3Config) -> TrainResult:
    """Collect, update, log, evaluate and checkpoint until `total_timesteps` environment steps (each seed of
    --num-seeds in its own run directory; the first seed's result is returned)."""
    run = SeedRuns(resolve(config) if config.resume is None else config, ALGO, validate, total="total_timesteps")
    config = run.config
    with run:  # from here on, a failure releases the run's lock, threads and signals
        # one vector env per seed; a resumed run starts fresh episodes: envs are reseeded from the step they resume at
        env = run.group(lambda seed: make_vec_env(config.env_id, config.num_envs, seed + run.step, config.env_backend))
        require_box_actions(env, "TD3")
        obs_dim = int(np.prod(env.single_observation_space.shape))
        low, high = env.single_action_space.low, env.single_action_space.high
        agent = run.agent(lambda: TD3(obs_dim, low, high, config)).to(config.device)  # a seed axis for several seeds
        buffer = run.group(lambda seed: ReplayBuffer(config.buffer_size, (obs_dim,), low.shape, config.num_envs,
                                                     config.device, config.n_step, config.gamma, seed=seed))
        action_rng = run.numpy_rng()
        # evaluation episode i of a seed is seeded eval_seed + i (SeedRuns gives each seed its own)
        run.start(config.env_id, agent, numpy_rng=action_rng, replay=buffer,
                  play_evaluation=lambda agent, eval_seed: evaluate(
                      agent, config.env_id, config.eval_episodes, eval_seed),
                  video=lambda agent, eval_seed: gym_video(
                      config.env_id, lambda obs: agent.act(obs, deterministic=True), eval_seed))
        if run.resumed and agent.reward_scaler is not None:
            agent.reward_scaler.reset_returns()  # the return trace of the interrupted episodes

        obs, _ = env.reset()
        with env:
            for global_step in run.steps(config.num_envs):
                if config.normalize_obs:
                    agent.obs_norm.update(torch.as_tensor(obs))
                if global_step < config.learning_starts:
                    # (N, A); a seed group's generators draw one (N, A) block per seed: (S, N, A)
                    actions = action_rng.uniform(low, high, (config.num_envs, *low.shape)).astype(np.float32)
                else:
                    actions = agent.act(obs)
                next_obs, rewards, terminated, truncated, info = env.step(actions)
                buffer.add(obs, actions, rewards, info["final_obs"], terminated, truncated)
                if agent.reward_scaler is not None:
                    agent.reward_scaler.update(rewards, terminated | truncated)
                obs = next_obs
                run.record_episodes(info)
                if global_step >= config.learning_starts:
                    for _ in range(config.num_envs * config.utd):
                        run.log(agent.update(buffer.sample(config.batch_size)))
    return run.result()


if __name__ == "__main__":
    raise SystemExit(run_cli(train, TD3Config))
