"""Proximal Policy Optimization (Schulman et al. 2017) with CleanRL's defaults: ppo_continuous_action.py for Box
actions, ppo.py for Discrete ones (chosen from the env's action space).

Run:     python -m keelrl.agents.ppo --env-id Hopper-v5
         python -m keelrl.agents.ppo --env-id CartPole-v1
         python -m keelrl.agents.ppo --env-id Hopper-v5 --env-backend envpool --num-envs 8
         python -m keelrl.agents.ppo --env-id Hopper-v5 --num-seeds 3 --runs-dir runs/ppo-{seed}
Import:  from keelrl.agents.ppo import PPO, PPOConfig, train, evaluate

The algorithm, top to bottom:
- the policy: a Gaussian with a state-independent log-std over the actions (Box; actions clipped to the bounds for
  the env, stored unclipped) or a categorical (Discrete); a separate critic V(s); both 64-64 tanh MLPs with
  orthogonal initialisation (gain √2; 0.01 for the policy's output layer, 1 for the value's);
- observations standardised by running statistics and clipped to ±10, rewards divided by the running std of the
  discounted return and clipped to ±10 (Box defaults; statistics saved in checkpoints and in model.pt). These are
  CleanRL's NormalizeObservation and NormalizeReward wrappers (gymnasium's) but in four details: the return trace
  starts afresh after every episode end, a time limit's too, where gymnasium's is reset only by a termination and
  one step earlier (G ← γ(1 − terminated)G + r), so when episodes run to their time limit the trace does not carry
  over into the next one: on a made-up stream of rewards 3 ± 0.5 in 1000-step episodes that all reach the limit,
  gymnasium's rule gives a return std about 4.6 times smaller, and so rewards about 4.6 times larger; the
  statistics are of the observations acted on (a terminal observation, which no action follows, is not folded
  in); one set of statistics is kept for all envs (gymnasium's wrapper keeps one per env; the same at the Box
  default of one env); and they start from no data (gymnasium's from a count of 1e-4), which changes the first
  few steps only. On Hopper-v5 (1M steps, 3
  seeds) keelrl's PPO and CleanRL's script end within each other's spread (benchmarks/results/ppo.md);
- a rollout of `num_steps` steps of `num_envs` envs; where an episode is truncated (a time limit), its reward
  gains γ V(true final observation), so the return is bootstrapped through the time limit (CleanRL's script
  treats a truncation as a termination; keelrl does not, here as everywhere);
- generalised advantage estimation (γ 0.99, λ 0.95); then `update_epochs` passes over `num_minibatches` shuffled
  minibatches: the clipped surrogate on advantages normalised per minibatch, the clipped value loss, an entropy
  bonus, one joint Adam step (eps 1e-5) after clipping the gradient norm to 0.5, the learning rate annealed
  linearly to 0 over the run; passes stop early once the approximate KL exceeds `target_kl` (when set).
Speed: a rollout is acted by a numpy copy of the networks taken after each update (`RolloutPolicy`; the weights do
not change within a rollout, and at these sizes a numpy op costs a fraction of a torch op's fixed cost), stored in
numpy and moved to --device once per rollout for the update, which runs in torch.
Seeds: `--num-seeds S` trains seeds seed … seed+S−1 in one process, each in a run directory of its own as a run of
that seed alone: S vector envs and rollouts, the networks stacked along a leading seed axis (keelrl.networks.seeds),
each seed with its own normalisers, noise and shuffles, the losses of all S computed in one batched pass and each
seed's gradient clipped by its own norm.
The rollout building block comes from keelrl.buffers, the networks from keelrl.networks, the run plumbing (logs,
evaluations, checkpoints mid-rollout included, resume) from keelrl.agents.harness. A run resumed from a
checkpoint goes on with the very episodes it was in when the envs can be saved (MuJoCo envs: the same numbers as
a run never stopped); other envs start new episodes, the interrupted ones ending as truncations.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from keelrl.agents.harness.loop import Saved, TrainResult
from keelrl.agents.harness.options import (
    RunOptions,
    require_non_negative,
    require_positive_counts,
    require_positive_widths,
    run_cli,
    validate_run_options,
)
from keelrl.agents.harness.saved_agent import SavedSpaceAgent
from keelrl.agents.harness.seeds import SeedGenerators, SeedRuns, validate_seed_group
from keelrl.buffers.rollout import RolloutBuffer, SeedRollouts, as_flat_tensors, gae
from keelrl.envs import SeedEnvs, VecEnv, make_vec_env, play_episodes
from keelrl.envs.video import gym_video
from keelrl.networks import (
    RewardScaler,
    RunningObsNorm,
    check_device,
    clip_gradient_norm,
    loss_function,
    make_optimizer,
    NumpyMLP,
    mlp,
    orthogonal_init_,
    scale_learning_rates,
    to_device,
)
from keelrl.networks.seeds import seed_rows

ALGO = "ppo"
HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)
__all__ = ["PPO", "PPOConfig", "train", "evaluate"]


@dataclasses.dataclass
class PPOConfig(RunOptions):
    env_id: str = "Hopper-v5"
    """gymnasium (or envpool) environment id with a Box or Discrete action space"""
    total_timesteps: int = 1_000_000
    """environment steps to train for"""
    env_backend: Literal["gymnasium", "envpool"] = "gymnasium"
    """vector environment backend (envpool needs the envpool extra)"""
    num_envs: int | None = None
    """parallel environments (default: 1 for Box actions, 4 for Discrete)"""
    num_steps: int | None = None
    """steps per env in each rollout (default: 2048 for Box actions, 128 for Discrete)"""
    learning_rate: float | None = None
    """Adam learning rate of policy and value together (default: 3e-4 for Box actions, 2.5e-4 for Discrete)"""
    anneal_lr: bool = True
    """decay the learning rate linearly to 0 over the run's updates"""
    gamma: float = 0.99
    """discount factor"""
    gae_lambda: float = 0.95
    """λ of generalised advantage estimation"""
    num_minibatches: int | None = None
    """minibatches per pass over a rollout (default: 32 for Box actions, 4 for Discrete)"""
    update_epochs: int | None = None
    """passes over each rollout (default: 10 for Box actions, 4 for Discrete)"""
    norm_adv: bool = True
    """normalise the advantages of each minibatch to mean 0, std 1"""
    clip_coef: float = 0.2
    """surrogate clipping ε: the probability ratio's effect is cut outside [1 − ε, 1 + ε]"""
    clip_vloss: bool = True
    """clip the value update to ±clip_coef around the rollout's values (the larger of both losses counts)"""
    ent_coef: float | None = None
    """entropy bonus coefficient (default: 0 for Box actions, 0.01 for Discrete)"""
    vf_coef: float = 0.5
    """value loss coefficient in the joint loss"""
    max_grad_norm: float = 0.5
    """clip the gradient of the joint loss to this global norm"""
    target_kl: float | None = None
    """stop a rollout's passes once the approximate KL to the acting policy exceeds this (None: never)"""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """hidden layer sizes of the policy and the value network (tanh)"""
    normalize_obs: bool | None = None
    """standardise observations by running mean and variance, clipped to ±obs_clip (default: on for Box actions)"""
    obs_clip: float = 10.0
    """clip of the standardised observations"""
    normalize_reward: bool | None = None
    """divide rewards by the running std of the discounted return, clipped to ±reward_clip (default: on for Box)"""
    reward_clip: float = 10.0
    """clip of the scaled rewards"""
    device: str = "cpu"
    """torch device for networks and rollout"""
    num_seeds: int = 1
    """train seeds seed, seed+1, …, seed+num_seeds−1 in this one process as one batched network, each in a run
    directory of its own as a run of that seed alone (--runs-dir may hold {seed}: each seed's is filled in)"""


BOX_DEFAULTS = dict(num_envs=1, num_steps=2048, learning_rate=3e-4, num_minibatches=32, update_epochs=10, ent_coef=0.0,
                    normalize_obs=True, normalize_reward=True)
"""CleanRL ppo_continuous_action.py (read at fe8d8a0): :49 num_envs, :51 num_steps, :47 learning_rate,
:59 num_minibatches, :61 update_epochs, :69 ent_coef; :97-100 NormalizeObservation, clip ±10, NormalizeReward,
clip ±10. The defaults shared with ppo.py are the fields' own (anneal, γ, λ, clip, value loss, grad norm)."""
DISCRETE_DEFAULTS = dict(num_envs=4, num_steps=128, learning_rate=2.5e-4, num_minibatches=4, update_epochs=4,
                         ent_coef=0.01, normalize_obs=False, normalize_reward=False)
"""CleanRL ppo.py (read at fe8d8a0): num_envs 4, num_steps 128, learning_rate 2.5e-4, num_minibatches 4,
update_epochs 4, ent_coef 0.01, and no normalisation wrappers (its make_env adds RecordEpisodeStatistics only).
`total_timesteps` stays keelrl's 1M for both kinds (ppo.py's own default is 500k; its learning rate anneals over
whichever budget is given)."""


def resolve(config: PPOConfig, agent: str = "PPO") -> PPOConfig:
    """The config a new run trains with: options left at None take CleanRL's defaults for the env's kind of action
    space (an env is made once to see it; an unknown env id, an action space or an observation space `agent` cannot
    take is refused in one line)."""
    if all(getattr(config, name) is not None for name in BOX_DEFAULTS):
        return config
    probe = make_vec_env(config.env_id, 1, 0, config.env_backend)
    space, observation_space = probe.single_action_space, probe.single_observation_space
    probe.close()
    check_action_space(space, config.env_id)
    check_observation_space(observation_space, config.env_id, agent)
    return with_space_defaults(config, space)


def with_space_defaults(config: PPOConfig, space: gym.Space) -> PPOConfig:
    """`config` with the options left at None set to CleanRL's defaults for `space`'s kind of actions."""
    defaults = DISCRETE_DEFAULTS if isinstance(space, gym.spaces.Discrete) else BOX_DEFAULTS
    return dataclasses.replace(config, **{name: value for name, value in defaults.items()
                                          if getattr(config, name) is None})


def validate(config: PPOConfig) -> None:
    """Reject option values no run can use, with the option's command-line name."""
    validate_run_options(config, "total_timesteps")
    check_device(config.device, compile=False, cudagraphs=False)
    require_positive_widths(config)
    require_positive_counts(config, "num_envs", "num_steps", "num_minibatches", "update_epochs")
    require_non_negative(config, "ent_coef", "vf_coef", "clip_coef")
    if config.learning_rate <= 0 or config.max_grad_norm <= 0 or config.obs_clip <= 0 or config.reward_clip <= 0:
        raise ValueError("--learning-rate, --max-grad-norm, --obs-clip and --reward-clip must be positive.")
    if not 0.0 < config.gamma <= 1.0 or not 0.0 <= config.gae_lambda <= 1.0:
        raise ValueError(f"--gamma must lie in (0, 1] and --gae-lambda in [0, 1], got {config.gamma} and "
                         f"{config.gae_lambda}.")
    if config.total_timesteps < config.num_envs * config.num_steps:
        raise ValueError(f"--total-timesteps {config.total_timesteps} is less than one rollout of "
                         f"{config.num_envs * config.num_steps} steps (--num-envs × --num-steps): the run would end "
                         f"before its first update; raise --total-timesteps or lower --num-steps.")
    if (config.num_envs * config.num_steps) % config.num_minibatches:
        raise ValueError(f"--num-minibatches {config.num_minibatches} does not divide a rollout of "
                         f"{config.num_envs * config.num_steps} transitions (--num-envs × --num-steps).")
    if config.target_kl is not None and config.target_kl <= 0:
        raise ValueError(f"--target-kl must be positive (or None), got {config.target_kl}.")
    validate_seed_group(config)
    if config.num_seeds > 1 and config.target_kl is not None:
        raise ValueError("--target-kl stops a seed's passes over its rollout early, and the seeds of --num-seeds share "
                         "one optimiser step: train them in separate runs, or leave --target-kl unset.")


def check_action_space(action_space: gym.Space, env_id: str) -> None:
    """Refuse an action space PPO has no policy for, in one line."""
    box = isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1
    if not box and not isinstance(action_space, gym.spaces.Discrete):
        raise ValueError(f"PPO acts in a Box (vector) or Discrete action space; {env_id!r} has {action_space}.")


def check_observation_space(observation_space: gym.Space, env_id: str, agent: str = "PPO") -> None:
    """Refuse, in one line naming the space, observations the MLPs cannot take: anything but a flat Box (a Tuple
    such as Blackjack's, a Dict, a Discrete index, an image)."""
    if not (isinstance(observation_space, gym.spaces.Box) and len(observation_space.shape) == 1):
        raise ValueError(f"{agent} takes flat (vector) Box observations; {env_id!r} has {observation_space}.")


class PPO(SavedSpaceAgent):
    """The PPO policy and value networks, observation and reward normalisers and update rule; takes raw
    observations. Saving and loading (`save`, `PPO.load`) and the training state come from SavedSpaceAgent."""

    algo = ALGO
    config_cls = PPOConfig

    def __init__(self, obs_dim: int, action_space: gym.Space, config: PPOConfig):
        super().__init__()
        config = with_space_defaults(config, action_space)  # (a config `train` resolved has none left at None)
        self.config, self.obs_dim, self.action_space = config, obs_dim, action_space
        self.continuous = isinstance(action_space, gym.spaces.Box)
        action_outputs = action_space.shape[0] if self.continuous else int(action_space.n)
        self.obs_norm = RunningObsNorm(obs_dim, config.obs_clip, eps=1e-8) if config.normalize_obs else nn.Identity()
        # the running std of the discounted return, unbounded (SimbaV2's v_max bound off): CleanRL's NormalizeReward
        # but for the trace's reset at every episode end (module docstring)
        self.reward_scaler = RewardScaler(config.gamma, config.num_envs, v_max=math.inf) if config.normalize_reward \
            else None
        self.critic = orthogonal_init_(mlp(obs_dim, config.hidden_sizes, 1, nn.Tanh), last_gain=1.0)  # -> (B, 1)
        self.actor = orthogonal_init_(mlp(obs_dim, config.hidden_sizes, action_outputs, nn.Tanh), last_gain=0.01)
        if self.continuous:
            self.actor_logstd = nn.Parameter(torch.zeros(action_outputs))
        self.optimizers = {"ppo": make_optimizer(list(self.parameters()), "adam", config.learning_rate, eps=1e-5)}
        self.rng: np.random.Generator | SeedGenerators = np.random.default_rng(config.seed)
        """the generator of the rollouts' action noise and the minibatch shuffles (checkpointed as the run's; a seed
        group's: one per seed)"""
        self.num_updates = 0
        self.total_updates = max(1, config.total_timesteps // (config.num_envs * config.num_steps))
        # one seed; networks/seeds.stack_seeds makes several, every tensor with a leading seed axis (S, ...)
        self.num_seeds = 1
        self._loss = loss_function(self.loss, "fp32", config.device, seeds_of=self)

    @property
    def device(self) -> torch.device:
        return self.critic[0].weight.device

    def statistics_on_host(self) -> None:
        """The observation and reward statistics moved back to the CPU, whatever device the networks are on: the
        rollouts act in numpy (RolloutPolicy), reading and updating them at every step, and the update never uses
        them (the rollout holds observations standardised), so on a GPU they would cost host synchronisations
        and nothing else."""
        self.obs_norm.cpu()
        if self.reward_scaler is not None:
            self.reward_scaler.cpu()

    # ---- acting

    def observe(self, obs: np.ndarray) -> np.ndarray:
        """Raw observations (N, obs_dim) of a training step (a seed group's (S, N, obs_dim)), folded into the
        statistics, then standardised."""
        if self.config.normalize_obs:
            self.obs_norm.update(obs)
        return self.standardized(obs)

    def standardized(self, obs: np.ndarray) -> np.ndarray:
        """Raw observations (B, obs_dim) standardised by the current statistics (which they do not change), float32:
        what the networks take."""
        return self.obs_norm.standardize(obs) if self.config.normalize_obs else np.asarray(obs, np.float32)

    def value_networks(self) -> dict[str, nn.Module]:
        """The value network of every return the agent learns, by the rollout field it sums: here the rewards'."""
        return {"rewards": self.critic}

    def rollout_policy(self) -> RolloutPolicy:
        """The policy and value networks as they are now, in numpy, to act through the next rollout."""
        return RolloutPolicy(self)

    def env_actions(self, actions: np.ndarray) -> np.ndarray:
        """What the env is given: Box actions clipped to the bounds (the rollout keeps them unclipped)."""
        if self.continuous:
            return np.minimum(np.maximum(actions, self.action_space.low), self.action_space.high)
        return actions

    @torch.inference_mode()
    def act(self, obs: np.ndarray, deterministic: bool = False) -> np.ndarray:
        """Env actions for a batch of raw observations, from the networks as they are now: the Gaussian's mean
        (clipped) or the most likely action when deterministic, else a sample."""
        obs = self.observation_batch(obs)
        obs = obs.detach().float().cpu().numpy() if isinstance(obs, torch.Tensor) else obs  # standardised in numpy
        outputs = self.actor(to_device(self.standardized(obs), self.device))
        if deterministic:
            actions = outputs if self.continuous else outputs.argmax(-1)
        elif self.continuous:
            actions = outputs + self.actor_logstd.exp() * torch.randn_like(outputs)
        else:
            actions = torch.multinomial(outputs.softmax(-1), 1)[:, 0]
        return self.env_actions(actions.cpu().numpy())

    def scale_rewards(self, rewards: np.ndarray, dones: np.ndarray) -> np.ndarray:
        """One step's rewards (N,) (a seed group's (S, N)) for the rollout: divided by the running std of the
        discounted return (folded in first) and clipped to ±reward_clip, when configured."""
        if self.reward_scaler is None:
            return rewards
        self.reward_scaler.update(rewards, dones)
        clip = self.config.reward_clip
        return np.minimum(np.maximum(self.reward_scaler.scale(rewards), -clip), clip)

    # ---- learning

    def log_prob_and_entropy(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """log π(a|s) and the entropy of π(·|s) for standardised observations (B, obs_dim), summed over action
        dimensions: (B,), (B,). Written out rather than through torch.distributions, whose checks and objects cost
        more than the arithmetic at these sizes."""
        outputs = self.actor(obs)  # Box: the means (B, A); Discrete: the logits (B, n)
        if self.continuous:
            log_std = self.actor_logstd  # (A,)
            z = (actions - outputs) * torch.exp(-log_std)
            log_probs = -(0.5 * z.square() + log_std + HALF_LOG_2PI).sum(-1)
            return log_probs, (0.5 + HALF_LOG_2PI + log_std).sum().expand(len(obs))
        log_probs = outputs.log_softmax(-1)  # (B, n)
        return log_probs.gather(-1, actions.long()[:, None])[:, 0], -(log_probs.exp() * log_probs).sum(-1)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """V(s) (B,) of standardised observations."""
        return self.critic(obs)[:, 0]

    def batch(self, rollout: RolloutBuffer | SeedRollouts,
              next_values: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """The rollout as (T·N, ...) tensors on the agent's device (a seed group's (S, T·N, ...)), with GAE
        advantages and value targets; `next_values`: the values (N,) (a seed group's (S, N)) of the observations
        after its last step, by return."""
        data = rollout.data
        advantages, returns = gae(data["rewards"], data["values"], data["dones"], next_values["rewards"],
                                  self.config.gamma, self.config.gae_lambda)
        return as_flat_tensors({**data, "advantages": advantages, "returns": returns}, self.device,
                               seed_axis=self.num_seeds > 1)

    def normalized_advantages(self, minibatch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The minibatch's advantages (B,), normalised to mean 0, std 1 (when norm_adv: CleanRL's default)."""
        advantages = minibatch["advantages"]
        if not self.config.norm_adv:
            return advantages
        return (advantages - advantages.mean()) / (advantages.std() + 1e-8)

    def policy_loss(self, minibatch: dict[str, torch.Tensor],
                    advantages: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        """The clipped surrogate −E[min(ρA, clip(ρ, 1 ± ε)A)] of `advantages` A (B,), ρ = π(a|s) / π_old(a|s); the
        mean entropy (to be maximised); the approximate KLs (E[−log ρ], and E[(ρ − 1) − log ρ] that `target_kl`
        reads, CleanRL's old_approx_kl and approx_kl) and the fraction of clipped ratios."""
        log_probs, entropy = self.log_prob_and_entropy(minibatch["obs"], minibatch["actions"])
        log_ratio = log_probs - minibatch["log_probs"]
        ratio = log_ratio.exp()  # (B,)
        clip = self.config.clip_coef
        loss = torch.max(-advantages * ratio, -advantages * ratio.clamp(1.0 - clip, 1.0 + clip)).mean()
        with torch.no_grad():
            stats = {"old_approx_kl": (-log_ratio).mean(), "approx_kl": ((ratio - 1.0) - log_ratio).mean(),
                     "clipfrac": ((ratio - 1.0).abs() > clip).float().mean()}
        return loss, entropy.mean(), stats

    def value_loss(self, predicted: torch.Tensor, old: torch.Tensor, returns: torch.Tensor) -> torch.Tensor:
        """½ E[(V − G)²], or with clip_vloss ½ E[max((V − G)², (V_old + clip(V − V_old, ±ε) − G)²)]; all (B,)."""
        unclipped = (predicted - returns).pow(2)
        if not self.config.clip_vloss:
            return 0.5 * unclipped.mean()
        clipped = old + (predicted - old).clamp(-self.config.clip_coef, self.config.clip_coef)
        return 0.5 * torch.max(unclipped, (clipped - returns).pow(2)).mean()

    def loss(self, minibatch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, Any]]:
        """The joint loss policy − ent_coef · entropy + vf_coef · value, and the figures to log."""
        policy_loss, entropy, stats = self.policy_loss(minibatch, self.normalized_advantages(minibatch))
        value_loss = self.value_loss(self.value(minibatch["obs"]), minibatch["values"], minibatch["returns"])
        loss = policy_loss - self.config.ent_coef * entropy + self.config.vf_coef * value_loss
        return loss, {"policy_loss": policy_loss, "value_loss": value_loss, "entropy": entropy, **stats}

    def update(self, rollout: RolloutBuffer | SeedRollouts,
               next_values: dict[str, np.ndarray]) -> dict[str, torch.Tensor | float]:
        """One update on a rollout: its batch (GAE advantages, value targets) and PPO's `passes` over it with PPO's
        loss. A seed group's figures are per seed, (S,)."""
        return self.passes(self.batch(rollout, next_values), self._loss)

    def passes(self, batch: dict[str, torch.Tensor],
               loss: Callable[[dict[str, torch.Tensor]], tuple[torch.Tensor, dict[str, Any]]]
               ) -> dict[str, torch.Tensor | float]:
        """`update_epochs` passes over `batch` in `num_minibatches` shuffled minibatches, one clipped-gradient Adam
        step of `loss` (a minibatch -> the loss and its figures, among them clipfrac and approx_kl) each: the
        gradient norm clipped per parameter group (PPO's one group: policy and value together, as CleanRL's; a
        variant's added groups apart), per seed; the learning rate annealed linearly to 0 over the run; passes stop
        once the approximate KL of a pass's last minibatch exceeds `target_kl`. Returns the last minibatch's figures,
        the mean clip fraction, the value's explained variance and the learning rate, to log (a seed group's per
        seed, (S,))."""
        config, optimizer = self.config, self.optimizers["ppo"]
        if config.anneal_lr:
            scale_learning_rates([optimizer], 1.0 - self.num_updates / self.total_updates)
        sample_axis = batch["advantages"].dim() - 1  # 0; a seed group's 1, behind the seed axis
        size = batch["advantages"].shape[sample_axis]
        clipfracs = []
        minibatch_size = size // config.num_minibatches
        for _ in range(config.update_epochs):
            order = torch.as_tensor(self.rng.permutation(size), device=self.device)  # (T·N,); a group's (S, T·N)
            shuffled = {name: seed_rows(value, order) for name, value in batch.items()}  # one gather per field, pass
            for start in range(0, size, minibatch_size):
                minibatch_loss, stats = loss({name: value.narrow(sample_axis, start, minibatch_size)
                                              for name, value in shuffled.items()})
                optimizer.zero_grad(set_to_none=True)
                minibatch_loss.sum().backward()  # a seed group's losses (S,): each seed's steps only its own weights
                for group in optimizer.param_groups:
                    clip_gradient_norm(group["params"], config.max_grad_norm, seed_axis=self.num_seeds > 1)
                optimizer.step()
                clipfracs.append(stats["clipfrac"])
            if config.target_kl is not None and stats["approx_kl"] > config.target_kl:
                break
        self.num_updates += 1
        return {**{f"losses/{name}": value.detach() for name, value in stats.items() if name != "clipfrac"},
                "losses/clipfrac": torch.stack(clipfracs).mean(0),
                "losses/explained_variance": explained_variance(batch["values"], batch["returns"]),
                "charts/learning_rate": optimizer.param_groups[0]["lr"]}


class RolloutPolicy:
    """The agent's policy and value networks as they were when it was taken, copied to numpy (NumpyMLP), acting
    through one rollout: the weights do not change within a rollout, and at PPO's sizes a few numpy ops per step
    cost a fraction of torch's fixed cost per op (both 64-64 networks at batch 1: 40 µs against 175 µs, one
    thread, AMD EPYC). Its noise comes from the agent's numpy generator, which checkpoints keep."""

    def __init__(self, agent: PPO):
        self.continuous, self.rng = agent.continuous, agent.rng
        self.actor = NumpyMLP(agent.actor)
        self.critics = {name: NumpyMLP(network) for name, network in agent.value_networks().items()}
        if self.continuous:
            log_std = agent.actor_logstd.detach().cpu().numpy().copy()  # (A,); a seed group's (S, A)
            self.log_std = log_std if agent.num_seeds == 1 else log_std[:, None]  # (S, 1, A) against (S, B, A)
            self.std = np.exp(self.log_std)

    def values(self, obs: np.ndarray) -> dict[str, np.ndarray]:
        """The value (B,) of every return, by the rollout field it sums, for standardised observations (a seed
        group's: (S, B))."""
        return {name: critic(obs)[..., 0] for name, critic in self.critics.items()}

    def bootstraps(self, final_obs: np.ndarray, truncated: np.ndarray, gamma: float) -> dict[str, np.ndarray]:
        """γ V(true final observation) (N,) where the episode was truncated, 0 elsewhere, for every value: what a
        truncated step's reward (and cost) gains so its return is not cut at the time limit. `final_obs`
        standardised."""
        return {name: gamma * value * truncated for name, value in self.values(final_obs).items()}

    def explore(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """A sampled action (B, A) or (B,), its log-probability (B,) and the values, for standardised observations
        (a seed group's: (S, B, ...), each seed's noise from its own generator)."""
        outputs = self.actor(obs)  # Box: the means (B, A); Discrete: the logits (B, n)
        if self.continuous:  # a = μ + σ ε, log π(a|s) = Σ −(ε²/2 + log σ + log √(2π))
            noise = self.rng.standard_normal(outputs.shape[-2:], dtype=np.float32)  # (B, A), or one per seed
            actions = outputs + self.std * noise
            log_probs = -(0.5 * noise * noise + self.log_std + HALF_LOG_2PI).sum(-1)
        else:  # the Gumbel-max trick: argmax(logits + Gumbel noise) is a sample of the softmax
            shifted = outputs - outputs.max(-1, keepdims=True)
            all_log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))  # (B, n)
            actions = (all_log_probs + self.rng.gumbel(size=outputs.shape[-2:])).argmax(-1)
            log_probs = np.take_along_axis(all_log_probs, actions[..., None], -1)[..., 0]
        return actions, log_probs, self.values(obs)


def explained_variance(predicted: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """1 − Var(target − predicted) / Var(target) over the last axis (a seed group's: per seed), NaN where the
    target does not vary."""
    variance = target.var(-1, unbiased=False)
    explained = 1.0 - (target - predicted).var(-1, unbiased=False) / variance
    return torch.where(variance > 0, explained, torch.nan)


def evaluate(agent: PPO, env_id: str, episodes: int = 10, seed: int = 0,
             deterministic: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Returns and costs of `episodes` episodes of the agent's deterministic (or stochastic) policy."""
    return play_episodes(lambda obs: agent.act(obs, deterministic=deterministic), env_id, episodes, seed)


def train(config: PPOConfig) -> TrainResult:
    """Collect rollouts and update on each until `total_timesteps` environment steps (each seed of --num-seeds in
    its own run directory; the first seed's result is returned)."""
    run = SeedRuns(resolve(config) if config.resume is None else config, ALGO, validate, total="total_timesteps")
    config = run.config
    with run:  # from here on, a failure releases the run's lock, threads and signals
        env = run.group(lambda seed: make_vec_env(config.env_id, config.num_envs, seed + run.step, config.env_backend))
        check_action_space(env.single_action_space, config.env_id)
        check_observation_space(env.single_observation_space, config.env_id)
        obs_dim = int(np.prod(env.single_observation_space.shape))
        agent = run.agent(lambda: PPO(obs_dim, env.single_action_space, config)).to(config.device)
        agent.statistics_on_host()
        agent.rng = run.numpy_rng()  # each seed's own generator (one seed: the one PPO made, seeded alike)
        rollout = run.group(lambda seed: RolloutBuffer(config.num_steps, config.num_envs, (obs_dim,),
                                                       env.single_action_space.shape))
        obs, _ = env.reset()
        # evaluation episode i of a seed is seeded eval_seed + i (SeedRuns gives each seed its own)
        run.start(config.env_id, agent, numpy_rng=agent.rng, state=rollout_state(run, env, rollout),
                  play_evaluation=lambda agent, eval_seed: evaluate(
                      agent, config.env_id, config.eval_episodes, eval_seed),
                  video=lambda agent, eval_seed: gym_video(
                      config.env_id, lambda obs: agent.act(obs, deterministic=True), eval_seed))
        policy = agent.rollout_policy()  # taken after a resumed run's weights are loaded
        if run.resumed:
            obs = go_on_with_the_rollout(agent, policy, rollout, obs, run.checkpoint["episodes"] is not None)

        with env:
            for _ in run.steps(config.num_envs):
                obs_acted_on = agent.observe(obs)  # (N, obs_dim); a seed group's (S, N, obs_dim), and so on below
                actions, log_probs, values = policy.explore(obs_acted_on)
                next_obs, rewards, terminated, truncated, info = env.step(agent.env_actions(actions))
                rewards = agent.scale_rewards(rewards, terminated | truncated)
                if (truncated & ~terminated).any():  # bootstrap through the time limit from the true final observation
                    final_obs = agent.standardized(info["final_obs"])
                    rewards = rewards + policy.bootstraps(final_obs, truncated & ~terminated, config.gamma)["rewards"]
                rollout.add(obs=obs_acted_on, actions=actions, log_probs=log_probs, values=values["rewards"],
                            rewards=rewards, dones=terminated | truncated)
                obs = rollout.next_obs = next_obs
                run.record_episodes(info)
                if rollout.full:
                    run.log(agent.update(rollout, policy.values(agent.standardized(obs))))
                    rollout.clear()
                    policy = agent.rollout_policy()
    return run.result()


def rollout_state(run: SeedRuns, env: VecEnv | SeedEnvs,
                  rollout: RolloutBuffer | SeedRollouts) -> Callable[[int], dict[str, Saved]]:
    """What seed i's checkpoint keeps besides its agent: its rollout so far and its envs' episodes in progress."""
    def saved(i: int) -> dict[str, Saved]:
        seed_rollout, seed_env = run.part(rollout, i), run.part(env, i)
        return {"rollout": (seed_rollout.state_dict, seed_rollout.load_state_dict),
                "episodes": (seed_env.episode_state, seed_env.load_episode_state)}

    return saved


def go_on_with_the_rollout(agent: PPO, policy: RolloutPolicy, rollout: RolloutBuffer | SeedRollouts,
                           new_obs: np.ndarray, episodes_continue: bool) -> np.ndarray:
    """The observations a resumed run acts on next: the ones the checkpoint saved when the envs went on with their
    episodes; else `new_obs`, the first of new episodes, the interrupted ones ending at the rollout's last step as
    truncations (bootstrapped from the value of the observation that followed it)."""
    if episodes_continue:
        return rollout.next_obs
    rollout.truncate_last_step(policy.values(agent.standardized(rollout.next_obs)), agent.config.gamma)
    if agent.reward_scaler is not None:
        agent.reward_scaler.reset_returns()
    return new_obs


if __name__ == "__main__":
    raise SystemExit(run_cli(train, PPOConfig))
