"""Soft Actor-Critic (Haarnoja et al. 2018) with CleanRL's defaults.

Run:     python -m keelrl.agents.sac --env-id Hopper-v5
Import:  from keelrl.agents.sac import SAC, SACConfig, train, evaluate

The algorithm, top to bottom:
- twin Q critics (one batched ensemble) regress onto r + γ(1 − terminated)(min Q_target(s', a') − α log π(a'|s'));
- every `policy_frequency` critic updates, the tanh-Gaussian actor takes `policy_frequency` steps
  on α log π(a|s) − min Q(s, a), and α is tuned so the policy entropy tracks −|A|;
- target critics follow by Polyak averaging with rate τ (with --critic-subset-size M, the target's minimum is over M
  critics drawn at random at each update: REDQ-style ensembles of --num-critics);
- the loop: uniform random actions for `learning_starts` steps, then the policy's; every environment
  step is stored in the replay buffer and followed by `utd` updates per environment.
The networks come from keelrl.networks (NetworkOptions: MLP, SimBa or SimbaV2; scalar, C51 or HL-Gauss
critic outputs), the replay buffer from keelrl.buffers, the run plumbing (logs, evaluations, checkpoints,
resume) from keelrl.agents.harness.
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

ALGO = "sac"
__all__ = ["SAC", "SACConfig", "train", "evaluate"]


@dataclasses.dataclass
class SACConfig(OffPolicyOptions, NetworkOptions, RunOptions):
    # the environments, replay buffer, γ, τ, batch size, n-step returns, UTD, observation and reward scaling, the
    # learning-rate schedule, preset, device, precision and seeds: OffPolicyOptions (agents/off_policy_options.py),
    # as TD3's; the run options: RunOptions; the networks: NetworkOptions
    learning_starts: int = 5_000
    """environment steps of uniform random actions before learning starts"""
    policy_lr: float = 3e-4
    """actor learning rate"""
    q_lr: float = 1e-3
    """critic (and entropy coefficient) learning rate"""
    policy_frequency: int = 2
    """delayed policy updates: actor steps come every this many critic updates, this many at a time"""
    target_network_frequency: int = 1
    """critic updates between target network updates"""
    alpha: float = 0.2
    """entropy coefficient when not autotuned"""
    autotune: bool = True
    """tune the entropy coefficient, from `alpha_init` (CleanRL's 1.0), so the policy entropy tracks the target"""
    alpha_init: float = 1.0
    """initial entropy coefficient when autotuned"""
    target_entropy_scale: float = -1.0
    """target entropy = target_entropy_scale * action dimension"""
    rescale_actions: bool = False
    """act and learn (log-probabilities, entropy, critic inputs) in actions rescaled to [−1, 1], as SimBa and
    SimbaV2 do with gymnasium's RescaleAction; the env still gets actions in its own box (no change where that box
    is [−1, 1])"""
    optimizer: Literal["adam", "adamw"] = "adam"
    """optimiser of every network"""
    weight_decay: float = 0.0
    """decoupled weight decay of actor and critics (--optimizer adamw); never on the temperature"""


# The references' MuJoCo configurations (1000-step episodes, no action repeat). Options not named here
# already have the reference's value as keelrl's default: batch 256, buffer 1e6, learning starts 5000
# (both repos' configs/buffer/numpy_uniform.yaml:6-9), τ 0.005, 1-step returns, twin critics with the
# minimum (critic_use_cdq = env.episodic, true on MuJoCo), actor d 128 × 1 block, critic d 512 × 2 blocks.
# Both references update actor and temperature once with every critic update (policy_frequency 1).
# Both rescale every env's actions to [−1, 1] (RescaleAction: SimBa scale_rl/envs/__init__.py:60, SimbaV2
# configs/env/mujoco.yaml:14), so their log-probabilities, entropy target and critic inputs are in that box:
# --rescale-actions (on Humanoid-v5's ±0.4 box, the target −|A|/2 in the env's box would ask for an entropy
# Σ log(1/0.4) = 15.6 nats higher than theirs).
PRESETS = {
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
                  alpha_init=0.01, target_entropy_scale=-0.5, rescale_actions=True),
    # Lee et al. 2025 (SimbaV2), github.com/dojeon-ai/SimbaV2:
    #   configs/agent/simbaV2.yaml:8 normalize_observation (agents/wrappers/normalization.py:28: no clip),
    #   :9-10,35,38-39 scaled rewards with G_max 5 and a 101-bin categorical critic on [−5, 5];
    #   :17-18 Adam (agents/simbaV2/simbaV2_agent.py:114,157,183, no weight decay) lr 1e-4 → 5e-5 linearly,
    #   for actor, critic and temperature; :22-23,32-33 actor 1 × 128, critic 2 × 512 (keelrl's defaults);
    #   :43 τ 0.005; :45 initial temperature 0.01; :47 target entropy −|A|/2;
    #   configs/online_rl.yaml:20 γ from the episode-length heuristic, :28 updates per interaction step =
    #   action_repeat, with configs/env/mujoco.yaml:13 action_repeat 1, :15 max_episode_steps 1000: γ 0.995, UTD 1;
    #   agents/simbaV2/simbaV2_agent.py:247-282 actor, temperature, critic and target each step once per update.
    #   Its published Gym MuJoCo figures are of another setting: results/baseline/simbaV2_utd2.csv is SimbaV2 at UTD 2
    #   on the v4 tasks (Hopper-v4 2821 at 100k steps, mean of ten seeds; benchmarks/anchors/), where this preset
    #   runs UTD 1 and keelrl's MuJoCo tasks are v5.
    "simbav2": dict(network="simbav2", normalize_obs=True, obs_clip=None, critic_head="c51", num_bins=101,
                    scale_rewards=True, optimizer="adam", policy_lr=1e-4, q_lr=1e-4, final_lr_fraction=0.5,
                    utd=1, gamma=MUJOCO_DISCOUNT, policy_frequency=1, alpha_init=0.01, target_entropy_scale=-0.5,
                    rescale_actions=True),
}


def validate(config: SACConfig) -> None:
    """Reject option values no run can use, with the option's command-line name."""
    validate_run_options(config, "total_timesteps")
    validate_network_options(config)
    validate_scaled_support(config, config.scale_rewards)
    require_positive_widths(config)
    check_device(config.device, config.compile, config.cudagraphs)
    check_precision(config.precision, config.device)
    require_positive_counts(config, "num_envs", "buffer_size", "batch_size", "policy_frequency",
                            "target_network_frequency", "n_step", "utd")
    require_non_negative(config, "learning_starts")
    warn_without_updates(config, "learning_starts")
    if not 0.0 < config.gamma <= 1.0 or not 0.0 < config.tau <= 1.0:
        raise ValueError(f"--gamma and --tau must lie in (0, 1], got {config.gamma} and {config.tau}.")
    if config.batch_size > config.buffer_size:
        raise ValueError(f"--batch-size {config.batch_size} is larger than --buffer-size {config.buffer_size}.")
    if config.weight_decay < 0 or not 0.0 < config.final_lr_fraction <= 1.0:
        raise ValueError("--weight-decay must be non-negative and --final-lr-fraction in (0, 1].")
    if config.obs_clip is not None and not config.obs_clip > 0:
        raise ValueError(f"--obs-clip must be positive (or None for no clipping), got {config.obs_clip}.")
    if not config.policy_lr > 0 or not config.q_lr > 0:  # (NaN too)
        raise ValueError(f"--policy-lr and --q-lr must be positive, got {config.policy_lr} and {config.q_lr}.")
    if config.alpha <= 0 or config.alpha_init <= 0:
        raise ValueError(f"--alpha and --alpha-init must be positive, got {config.alpha} and {config.alpha_init}.")
    validate_seed_group(config)


def resolve(config: SACConfig) -> SACConfig:
    """The config a new run trains with: the preset's settings applied, then a categorical critic on scaled
    rewards given the support [−5, 5] unless --v-min/--v-max are set."""
    config = apply_preset(config, PRESETS)
    return with_default_support(config, config.scale_rewards)


class SAC(SavedAgent):
    """The SAC networks and update rule; takes raw observations (normalised inside when configured). Saving and
    loading (`save`, `SAC.load`) and the training state a checkpoint carries come from SavedAgent."""

    algo = ALGO
    config_cls = SACConfig

    def __init__(self, obs_dim: int, action_low: np.ndarray, action_high: np.ndarray, config: SACConfig):
        super().__init__()
        self.remember(obs_dim, action_low, action_high, config)
        # (obs − mean) / sqrt(var + 1e-8) as SimBa and SimbaV2 (which do not clip: --obs-clip None in their presets)
        self.obs_norm = RunningObsNorm(obs_dim, config.obs_clip, eps=1e-8) if config.normalize_obs else nn.Identity()
        self.reward_scaler = build_reward_scaler(config, config.gamma, config.num_envs) if config.scale_rewards \
            else None
        self.head = build_head(config)  # critic outputs -> Q-values, and the critic's loss against its target
        self.critic = build_critic(config, obs_dim, len(action_low), self.head.num_outputs)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        # the parameter lists Polyak averaging walks, gathered once (the tensors stay the same objects)
        self.polyak_target, self.polyak_online = list(self.critic_target.parameters()), list(self.critic.parameters())
        # --rescale-actions: the actor acts in [−1, 1]; `act` maps its actions to the env's box, `update` the
        # replayed ones back
        unit = np.ones_like(action_low)
        actor_box = (-unit, unit) if config.rescale_actions else (action_low, action_high)
        self.actor = build_actor(config, obs_dim, *actor_box, stochastic=True)
        initial_alpha = config.alpha_init if config.autotune else config.alpha
        self.log_alpha = nn.Parameter(torch.tensor(float(np.log(initial_alpha))), requires_grad=config.autotune)
        self.target_entropy = config.target_entropy_scale * len(action_low)
        self.optimizers = {
            "actor": make_optimizer(list(self.actor.parameters()), config.optimizer, config.policy_lr,
                                    config.weight_decay),
            "critic": make_optimizer(list(self.critic.parameters()), config.optimizer, config.q_lr, config.weight_decay),
        }
        if config.autotune:  # no weight decay: it would pull log α to 0 (α to 1)
            self.optimizers["alpha"] = make_optimizer([self.log_alpha], config.optimizer, config.q_lr)
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
        self._act = SeedMapped(self.actor.act, self, compile=config.compile or config.cudagraphs)
        # --cudagraphs: the whole of `learn_step` recorded as one CUDA graph per branch, then replayed
        self._learn_step = GraphedUpdate(self.learn_step, self) if config.cudagraphs else self.learn_step

    @property
    def alpha(self) -> torch.Tensor:
        return self.log_alpha.detach().exp()

    @torch.inference_mode()
    def act(self, obs: np.ndarray, deterministic: bool = False) -> np.ndarray:
        """Actions for a batch of raw observations (B, obs_dim) -> (B, action_dim): sampled, or tanh of the mean
        (a seed group: (S, B, obs_dim) -> (S, B, action_dim))."""
        obs = self.observation_batch(obs)
        obs_t = self.obs_norm(to_device(obs, self.action_low.device))
        noise = None if deterministic else self.random.normal(*obs.shape[-2:-1], self.action_low.shape[-1])
        actions = self._act(obs_t, deterministic, noise)
        if self.config.rescale_actions:
            centre, half_width = self.action_box()
            actions = centre + half_width * actions
        return actions.cpu().numpy()

    def action_box(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The centre and half-width of the env's action box (A,) (a seed group's (S, 1, A), against (S, B, A))."""
        low, high = self.action_low, self.action_high
        if low.dim() > 1:
            low, high = low.unsqueeze(-2), high.unsqueeze(-2)
        return (high + low) / 2, (high - low) / 2

    def update(self, batch: Batch) -> dict[str, torch.Tensor]:
        """Normalise the batch's observations, rescale its actions to [−1, 1] and scale its rewards (when
        configured), decay the learning rates (when configured), then `learn` from it."""
        if self.config.normalize_obs:
            batch = batch._replace(obs=self.obs_norm(batch.obs), next_obs=self.obs_norm(batch.next_obs))
        if self.config.rescale_actions:
            centre, half_width = self.action_box()
            batch = batch._replace(actions=(batch.actions - centre) / half_width)
        if self.reward_scaler is not None:
            batch = batch._replace(rewards=self.reward_scaler(batch.rewards))
        if self.config.final_lr_fraction < 1.0:  # linear decay over every update after learning_starts
            progress = min(1.0, self.num_updates / self.total_updates)
            scale_learning_rates(self.optimizers.values(), 1.0 - (1.0 - self.config.final_lr_fraction) * progress)
        self.num_updates += 1
        return self.learn(batch)

    def learn(self, batch: Batch) -> dict[str, torch.Tensor]:
        """One critic step, `policy_frequency` actor/α steps every `policy_frequency` updates, the target update
        every `target_network_frequency` (counted from update 1: the first actor steps come at update
        `policy_frequency`, where CleanRL's, counted from its even learning_starts, come at its first)."""
        actor_step = self.num_updates % self.config.policy_frequency == 0
        target_step = self.num_updates % self.config.target_network_frequency == 0
        return self._learn_step(batch, actor_step, target_step)

    def learn_step(self, batch: Batch, actor_step: bool, target_step: bool) -> dict[str, torch.Tensor]:
        losses = self.update_critic(batch)
        if actor_step:
            for _ in range(self.config.policy_frequency):
                losses.update(self.update_actor_and_alpha(batch.obs))
        if target_step:
            soft_update(self.polyak_target, self.polyak_online, self.config.tau)
        return losses

    def critic_loss(self, batch: Batch, noise: torch.Tensor, members: torch.Tensor | slice) -> tuple[torch.Tensor,
                                                                                                      torch.Tensor]:
        """The critics' summed loss against r + γ(1 − terminated)(min Q'(s', a') − α log π(a'|s')), a' ~ π(·|s')
        drawn with `noise` (B, A), the minimum over the target critics `members` (all, or a random subset), and
        the critics' detached values Q(s, a) (E, B) (taken here, where a seed group's batched pass gives each seed
        its own categorical support)."""
        with torch.no_grad():
            next_actions, next_log_prob = self.actor.sample(batch.next_obs, noise)
            next_outputs = self.critic_target(batch.next_obs, next_actions)[members]  # (E, B, K) -> (M, B, K)
            target = td_target(self.head, next_outputs, batch.rewards, batch.discounts, batch.terminated,
                               next_bonus=-self.alpha * next_log_prob)
        outputs = self.critic(batch.obs, batch.actions)  # (E, B, K)
        # squared error (scalar critic) or cross-entropy against the target distribution (C51, HL-Gauss), (E, B)
        per_sample = self.head.loss(outputs, target)
        return per_sample.mean(dim=1).sum(), self.head.value(outputs.detach())  # values (E, B)

    def actor_loss(self, obs: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """α log π(a|s) − min_i Q_i(s, a) with a ~ π(·|s) drawn with `noise` (B, A), and the detached log π(a|s)."""
        actions, log_prob = self.actor.sample(obs, noise)
        q_pi = self.head.value(self.critic(obs, actions)).min(dim=0).values  # (E, B) -> (B,)
        return (self.alpha * log_prob - q_pi).mean(), log_prob.detach()

    def update_critic(self, batch: Batch) -> dict[str, torch.Tensor]:
        noise = self.random.normal(*batch.rewards.shape[-1:], self.action_low.shape[-1])
        members = self.random.members(self.config.num_critics, self.config.critic_subset_size)
        critic_loss, values = self._critic_loss(batch, noise, members)  # a seed group: (S,), (S, E, B)
        optimizer_step(self.optimizers["critic"], critic_loss, self.critic)
        return {"losses/qf_loss": critic_loss.detach() / self.config.num_critics,
                "losses/qf_values": values.flatten(-2).mean(-1)}

    def update_actor_and_alpha(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        noise = self.random.normal(*obs.shape[-2:-1], self.action_low.shape[-1])
        with frozen(self.critic):  # the actor loss needs gradients w.r.t. actions only
            actor_loss, log_prob = self._actor_loss(obs, noise)  # a seed group: (S,), (S, B)
        optimizer_step(self.optimizers["actor"], actor_loss, self.actor)
        return {"losses/actor_loss": actor_loss.detach(), **self.update_alpha(log_prob)}

    def update_alpha(self, log_prob: torch.Tensor) -> dict[str, torch.Tensor]:
        """With --autotune, one step of −α (log π(a|s) + target_entropy) on the detached log-probs (B,) of the actor
        step just taken, as SB3 does (CleanRL resamples them); α per seed. Logs α as it was during that step."""
        losses = {"losses/alpha": self.alpha}
        if self.config.autotune:
            alpha_loss = -(self.log_alpha.exp().unsqueeze(-1) * (log_prob + self.target_entropy)).mean(-1)
            optimizer_step(self.optimizers["alpha"], alpha_loss, self.log_alpha)
            losses["losses/alpha_loss"] = alpha_loss.detach()
        return losses


def evaluate(agent: SAC, env_id: str, episodes: int = 10, seed: int = 0,
             deterministic: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Returns and costs of `episodes` episodes of the agent's deterministic (or stochastic) policy."""
    return play_episodes(lambda obs: agent.act(obs, deterministic=deterministic), env_id, episodes, seed)


def train(config: SACConfig) -> TrainResult:
    """Collect, update, log, evaluate and checkpoint until `total_timesteps` environment steps (each seed of
    --num-seeds in its own run directory; the first seed's result is returned)."""
    run = SeedRuns(resolve(config) if config.resume is None else config, ALGO, validate, total="total_timesteps")
    config = run.config
    with run:  # from here on, a failure releases the run's lock, threads and signals
        # one vector env per seed; a resumed run starts fresh episodes: envs are reseeded from the step they resume at
        env = run.group(lambda seed: make_vec_env(config.env_id, config.num_envs, seed + run.step, config.env_backend))
        require_box_actions(env, "SAC")
        obs_dim = int(np.prod(env.single_observation_space.shape))
        low, high = env.single_action_space.low, env.single_action_space.high
        agent = run.agent(lambda: SAC(obs_dim, low, high, config)).to(config.device)  # a seed axis for several seeds
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
    raise SystemExit(run_cli(train, SACConfig))
