"""Proximal Policy Optimization (Schulman et al. 2017) with CleanRL's defaults: ppo_continuous_action.py for Box
actions, ppo.py for Discrete ones (chosen from the env's action space).

Run:     python -m keelrl.agents.ppo --env-id Hopper-v5
         python -m keelrl.agents.ppo --env-id CartPole-v1
         python -m keelrl.agents.ppo --env-id Hopper-v5 --env-backend envpool --num-envs 8
Import:  from keelrl.agents.ppo import PPO, PPOConfig, train, evaluate

The algorithm, top to bottom:
- the policy: a Gaussian with a state-independent log-std over the actions (Box; actions clipped to the bounds for
  the env, stored unclipped) or a categorical (Discrete); a separate critic V(s); both 64-64 tanh MLPs with
  orthogonal initialisation (gain √2; 0.01 for the policy's output layer, 1 for the value's);
- observations standardised by running statistics and clipped to ±10, rewards divided by the running std of the
  discounted return and clipped to ±10 (Box defaults; statistics saved in checkpoints and in model.pt);
- a rollout of `num_steps` steps of `num_envs` envs; where an episode is truncated (a time limit), its reward
  gains γ V(true final observation), so the return is bootstrapped through the time limit (CleanRL's script
  treats a truncation as a termination; keelrl does not, here as everywhere);
- generalised advantage estimation (γ 0.99, λ 0.95); then `update_epochs` passes over `num_minibatches` shuffled
  minibatches: the clipped surrogate on advantages normalised per minibatch, the clipped value loss, an entropy
  bonus, one joint Adam step (eps 1e-5) after clipping the gradient norm to 0.5, the learning rate annealed
  linearly to 0 over the run; passes stop early once the approximate KL exceeds `target_kl` (when set).
The rollout building block comes from keelrl.buffers, the networks from keelrl.networks, the run plumbing (logs,
evaluations, checkpoints mid-rollout included, resume) from keelrl.agents.harness. A run resumed from a
checkpoint goes on with the very episodes it was in when the envs can be saved (MuJoCo envs: the same numbers as
a run never stopped); other envs start new episodes, the interrupted ones ending as truncations.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical, Normal

from keelrl.agents.harness.checkpoints import SavedSpaceAgent
from keelrl.agents.harness.loop import Run, TrainResult
from keelrl.agents.harness.options import (
    RunOptions,
    require_non_negative,
    require_positive_counts,
    run_cli,
    validate_run_options,
)
from keelrl.buffers.rollout import RolloutBuffer, gae
from keelrl.envs import make_vec_env, play_episodes
from keelrl.envs.video import gym_video
from keelrl.networks import (
    RewardScaler,
    RunningObsNorm,
    check_device,
    make_optimizer,
    mlp,
    orthogonal_init_,
    scale_learning_rates,
)

ALGO = "ppo"
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


BOX_DEFAULTS = dict(num_envs=1, num_steps=2048, learning_rate=3e-4, num_minibatches=32, update_epochs=10, ent_coef=0.0,
                    normalize_obs=True, normalize_reward=True)
"""CleanRL ppo_continuous_action.py (read at fe8d8a0): :49 num_envs, :51 num_steps, :47 learning_rate,
:59 num_minibatches, :61 update_epochs, :69 ent_coef; :97-100 NormalizeObservation, clip ±10, NormalizeReward,
clip ±10. The defaults shared with ppo.py are the fields' own (anneal, γ, λ, clip, value loss, grad norm)."""
DISCRETE_DEFAULTS = dict(num_envs=4, num_steps=128, learning_rate=2.5e-4, num_minibatches=4, update_epochs=4,
                         ent_coef=0.01, normalize_obs=False, normalize_reward=False)
"""CleanRL ppo.py (read at fe8d8a0): num_envs 4, num_steps 128, learning_rate 2.5e-4, num_minibatches 4,
update_epochs 4, ent_coef 0.01, and no normalisation wrappers (its make_env adds RecordEpisodeStatistics only)."""


def resolve(config: PPOConfig) -> PPOConfig:
    """The config a new run trains with: options left at None take CleanRL's defaults for the env's kind of action
    space (an env is made once to see it; an unknown env id or action space is refused in one line)."""
    if all(getattr(config, name) is not None for name in BOX_DEFAULTS):
        return config
    probe = make_vec_env(config.env_id, 1, 0, config.env_backend)
    space = probe.single_action_space
    probe.close()
    check_action_space(space, config.env_id)
    defaults = DISCRETE_DEFAULTS if isinstance(space, gym.spaces.Discrete) else BOX_DEFAULTS
    return dataclasses.replace(config, **{name: value for name, value in defaults.items()
                                          if getattr(config, name) is None})


def validate(config: PPOConfig) -> None:
    """Reject option values no run can use, with the option's command-line name."""
    validate_run_options(config, "total_timesteps")
    check_device(config.device, compile=False, cudagraphs=False)
    require_positive_counts(config, "num_envs", "num_steps", "num_minibatches", "update_epochs")
    require_non_negative(config, "ent_coef", "vf_coef", "clip_coef")
    if config.learning_rate <= 0 or config.max_grad_norm <= 0 or config.obs_clip <= 0 or config.reward_clip <= 0:
        raise ValueError("--learning-rate, --max-grad-norm, --obs-clip and --reward-clip must be positive.")
    if not 0.0 < config.gamma <= 1.0 or not 0.0 <= config.gae_lambda <= 1.0:
        raise ValueError(f"--gamma must lie in (0, 1] and --gae-lambda in [0, 1], got {config.gamma} and "
                         f"{config.gae_lambda}.")
    if (config.num_envs * config.num_steps) % config.num_minibatches:
        raise ValueError(f"--num-minibatches {config.num_minibatches} does not divide a rollout of "
                         f"{config.num_envs * config.num_steps} transitions (--num-envs × --num-steps).")
    if config.target_kl is not None and config.target_kl <= 0:
        raise ValueError(f"--target-kl must be positive (or None), got {config.target_kl}.")


def check_action_space(action_space: gym.Space, env_id: str) -> None:
    """Refuse an action space PPO has no policy for, in one line."""
    box = isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1
    if not box and not isinstance(action_space, gym.spaces.Discrete):
        raise ValueError(f"PPO acts in a Box (vector) or Discrete action space; {env_id!r} has {action_space}.")


class PPO(SavedSpaceAgent):
    """The PPO policy and value networks, observation and reward normalisers and update rule; takes raw
    observations. Saving and loading (`save`, `PPO.load`) and the training state come from SavedSpaceAgent."""

    algo = ALGO
    config_cls = PPOConfig

    def __init__(self, obs_dim: int, action_space: gym.Space, config: PPOConfig):
        super().__init__()
        self.config, self.obs_dim, self.action_space = config, obs_dim, action_space
        self.continuous = isinstance(action_space, gym.spaces.Box)
        action_outputs = action_space.shape[0] if self.continuous else int(action_space.n)
        self.obs_norm = RunningObsNorm(obs_dim, config.obs_clip, eps=1e-8) if config.normalize_obs else nn.Identity()
        # the running std of the discounted return, unbounded (SimbaV2's v_max bound off): CleanRL's NormalizeReward
        self.reward_scaler = RewardScaler(config.gamma, config.num_envs, v_max=math.inf) if config.normalize_reward \
            else None
        self.critic = orthogonal_init_(mlp(obs_dim, config.hidden_sizes, 1, nn.Tanh), last_gain=1.0)  # -> (B, 1)
        self.actor = orthogonal_init_(mlp(obs_dim, config.hidden_sizes, action_outputs, nn.Tanh), last_gain=0.01)
        if self.continuous:
            self.actor_logstd = nn.Parameter(torch.zeros(action_outputs))
            self.register_buffer("action_low", torch.as_tensor(action_space.low, dtype=torch.float32))
            self.register_buffer("action_high", torch.as_tensor(action_space.high, dtype=torch.float32))
        self.optimizers = {"ppo": make_optimizer(list(self.parameters()), "adam", config.learning_rate, eps=1e-5)}
        self.rng = np.random.default_rng(config.seed)
        """the minibatch shuffles' generator (checkpointed as the run's numpy generator)"""
        self.num_updates = 0
        self.total_updates = max(1, config.total_timesteps // (config.num_envs * config.num_steps))

    @property
    def device(self) -> torch.device:
        return self.critic[0].weight.device

    # ---- acting

    def observe(self, obs: np.ndarray) -> torch.Tensor:
        """Raw observations (N, obs_dim) of a training step, folded into the statistics, then standardised."""
        obs_t = torch.as_tensor(obs, dtype=torch.float32, device=self.device)
        if self.config.normalize_obs:
            self.obs_norm.update(obs_t)
        return self.obs_norm(obs_t)

    def normalized(self, obs: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Raw observations (B, obs_dim) standardised by the current statistics, which they do not change."""
        return self.obs_norm(torch.as_tensor(obs, dtype=torch.float32, device=self.device))

    def distribution(self, obs: torch.Tensor) -> Normal | Categorical:
        """π(·|s) for standardised observations (B, obs_dim): independent Normals (B, A), or a categorical."""
        outputs = self.actor(obs)
        if self.continuous:
            return Normal(outputs, self.actor_logstd.exp().expand_as(outputs))
        return Categorical(logits=outputs)

    def log_prob_and_entropy(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """log π(a|s) and the entropy of π(·|s), summed over action dimensions: (B,), (B,)."""
        dist = self.distribution(obs)
        if self.continuous:
            return dist.log_prob(actions).sum(-1), dist.entropy().sum(-1)
        return dist.log_prob(actions.long()), dist.entropy()

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """V(s) (B,) of standardised observations."""
        return self.critic(obs)[:, 0]

    def values(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        """The value (B,) of every return the agent learns, by the rollout field it sums: here the rewards'."""
        return {"rewards": self.value(obs)}

    @torch.no_grad()
    def explore(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A sampled action (B, A) or (B,), its log-probability (B,) and V(s) (B,), for standardised observations."""
        actions = self.distribution(obs).sample()
        log_probs, _ = self.log_prob_and_entropy(obs, actions)
        return actions, log_probs, self.value(obs)

    def env_actions(self, actions: torch.Tensor) -> np.ndarray:
        """What the env is given: Box actions clipped to the bounds (the rollout keeps them unclipped)."""
        if self.continuous:
            actions = torch.max(torch.min(actions, self.action_high), self.action_low)
        return actions.cpu().numpy()

    @torch.inference_mode()
    def act(self, obs: np.ndarray, deterministic: bool = False) -> np.ndarray:
        """Env actions for a batch of raw observations: the Gaussian's mean (clipped) or the most likely action
        when deterministic, else a sample."""
        dist = self.distribution(self.normalized(obs))
        if deterministic:
            actions = dist.mean if self.continuous else dist.probs.argmax(-1)
        else:
            actions = dist.sample()
        return self.env_actions(actions)

    def scale_rewards(self, rewards: np.ndarray, dones: np.ndarray) -> torch.Tensor:
        """One step's rewards (N,) for the rollout: divided by the running std of the discounted return (folded in
        first) and clipped to ±reward_clip, when configured."""
        if self.reward_scaler is None:
            return torch.as_tensor(rewards, dtype=torch.float32, device=self.device)
        self.reward_scaler.update(rewards, dones)
        scaled = self.reward_scaler(torch.as_tensor(rewards, dtype=torch.float64, device=self.device))
        return scaled.clamp(-self.config.reward_clip, self.config.reward_clip).float()

    @torch.no_grad()
    def bootstrap(self, final_obs: np.ndarray, truncated: np.ndarray) -> dict[str, torch.Tensor]:
        """γ V(true final observation) (N,) where the episode was truncated, 0 elsewhere, for every value in
        `values`: what a truncated step's reward (and cost) gains so its return is not cut at the time limit."""
        cut = torch.as_tensor(truncated, dtype=torch.float32, device=self.device)
        return {name: self.config.gamma * value * cut for name, value in self.values(self.normalized(final_obs)).items()}

    # ---- learning

    def batch(self, rollout: RolloutBuffer, next_obs: torch.Tensor) -> dict[str, torch.Tensor]:
        """The rollout flattened to (T·N, ...), with GAE advantages and value targets; `next_obs` (N, obs_dim):
        the standardised observations after its last step."""
        data = rollout.data
        with torch.no_grad():
            advantages, returns = gae(data["rewards"], data["values"], data["dones"], self.value(next_obs),
                                      self.config.gamma, self.config.gae_lambda)
        fields = {**data, "advantages": advantages, "returns": returns}
        return {name: value.flatten(0, 1) for name, value in fields.items()}  # (T, N, ...) -> (T·N, ...)

    def surrogate_advantages(self, minibatch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The advantages the clipped surrogate weighs (B,): normalised to mean 0, std 1 per minibatch."""
        advantages = minibatch["advantages"]
        if not self.config.norm_adv:
            return advantages
        return (advantages - advantages.mean()) / (advantages.std() + 1e-8)

    def policy_loss(self, minibatch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        """The clipped surrogate −E[min(ρA, clip(ρ, 1 ± ε)A)], ρ = π(a|s) / π_old(a|s); the mean entropy (to be
        maximised); the approximate KL (E[(ρ − 1) − log ρ]) and the fraction of clipped ratios."""
        log_probs, entropy = self.log_prob_and_entropy(minibatch["obs"], minibatch["actions"])
        log_ratio = log_probs - minibatch["log_probs"]
        ratio = log_ratio.exp()  # (B,)
        advantages = self.surrogate_advantages(minibatch)
        clip = self.config.clip_coef
        loss = torch.max(-advantages * ratio, -advantages * ratio.clamp(1.0 - clip, 1.0 + clip)).mean()
        with torch.no_grad():
            stats = {"approx_kl": ((ratio - 1.0) - log_ratio).mean(),
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
        policy_loss, entropy, stats = self.policy_loss(minibatch)
        value_loss = self.value_loss(self.value(minibatch["obs"]), minibatch["values"], minibatch["returns"])
        loss = policy_loss - self.config.ent_coef * entropy + self.config.vf_coef * value_loss
        return loss, {"policy_loss": policy_loss, "value_loss": value_loss, "entropy": entropy, **stats}

    def update(self, rollout: RolloutBuffer, next_obs: torch.Tensor) -> dict[str, torch.Tensor]:
        """`update_epochs` passes over the rollout in `num_minibatches` shuffled minibatches, one clipped-gradient
        Adam step each, the learning rate annealed linearly to 0 over the run; passes stop once the approximate
        KL of a pass's last minibatch exceeds `target_kl`."""
        config, optimizer = self.config, self.optimizers["ppo"]
        if config.anneal_lr:
            scale_learning_rates([optimizer], 1.0 - self.num_updates / self.total_updates)
        batch = self.batch(rollout, next_obs)
        size = len(batch["advantages"])
        clipfracs = []
        for _ in range(config.update_epochs):
            order = torch.as_tensor(self.rng.permutation(size), device=batch["advantages"].device)
            for rows in order.chunk(config.num_minibatches):
                loss, stats = self.loss({name: value[rows] for name, value in batch.items()})
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(self.parameters(), config.max_grad_norm)
                optimizer.step()
                clipfracs.append(stats["clipfrac"])
            if config.target_kl is not None and stats["approx_kl"] > config.target_kl:
                break
        self.num_updates += 1
        return {**{f"losses/{name}": value.detach() for name, value in stats.items() if name != "clipfrac"},
                "losses/clipfrac": torch.stack(clipfracs).mean(),
                "losses/explained_variance": explained_variance(batch["values"], batch["returns"]),
                "charts/learning_rate": optimizer.param_groups[0]["lr"]}


def explained_variance(predicted: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """1 − Var(target − predicted) / Var(target) (NaN when the target does not vary)."""
    variance = target.var(unbiased=False)
    return 1.0 - (target - predicted).var(unbiased=False) / variance if variance > 0 else torch.tensor(float("nan"))


def evaluate(agent: PPO, env_id: str, episodes: int = 10, seed: int = 0,
             deterministic: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Returns and costs of `episodes` episodes of the agent's deterministic (or stochastic) policy."""
    return play_episodes(lambda obs: agent.act(obs, deterministic=deterministic), env_id, episodes, seed)


def train(config: PPOConfig) -> TrainResult:
    """Collect rollouts and update on each until `total_timesteps` environment steps."""
    run = Run(resolve(config) if config.resume is None else config, ALGO, validate, total="total_timesteps")
    config = run.config
    env = make_vec_env(config.env_id, config.num_envs, config.seed + run.step, config.env_backend)
    check_action_space(env.single_action_space, config.env_id)
    obs_dim = int(np.prod(env.single_observation_space.shape))
    agent = PPO(obs_dim, env.single_action_space, config).to(config.device)
    rollout = RolloutBuffer(config.num_steps, config.num_envs, (obs_dim,), env.single_action_space.shape,
                            config.device)
    eval_seed = config.seed + 10_000  # evaluation episode i is seeded eval_seed + i
    obs, _ = env.reset()
    run.start(config.env_id, agent, evaluate=lambda: evaluate(agent, config.env_id, config.eval_episodes, eval_seed),
              numpy_rng=agent.rng, state={"rollout": (rollout.state_dict, rollout.load_state_dict),
                                          "episodes": (env.episode_state, env.load_episode_state)},
              video=gym_video(config.env_id, lambda obs: agent.act(obs, deterministic=True), eval_seed))
    if run.resumed:
        obs = go_on_with_the_rollout(agent, rollout, obs, episodes_continue=run.checkpoint["episodes"] is not None)

    with run, env:
        for _ in run.steps(config.num_envs):
            obs_t = agent.observe(obs)
            actions, log_probs, values = agent.explore(obs_t)
            next_obs, rewards, terminated, truncated, info = env.step(agent.env_actions(actions))
            rewards = agent.scale_rewards(rewards, terminated | truncated)
            if (truncated & ~terminated).any():  # bootstrap through the time limit from the true final observation
                rewards += agent.bootstrap(info["final_obs"], truncated & ~terminated)["rewards"]
            rollout.add(obs=obs_t, actions=actions, log_probs=log_probs, values=values, rewards=rewards,
                        dones=torch.as_tensor(terminated | truncated, dtype=torch.float32, device=config.device))
            obs, rollout.next_obs = next_obs, torch.as_tensor(next_obs)
            run.record_episodes(info)
            if rollout.full:
                run.log(agent.update(rollout, agent.normalized(obs)))
                rollout.clear()
    return run.result()


def go_on_with_the_rollout(agent: PPO, rollout: RolloutBuffer, new_obs: np.ndarray,
                           episodes_continue: bool) -> np.ndarray:
    """The observations a resumed run acts on next: the ones the checkpoint saved when the envs went on with their
    episodes; else `new_obs`, the first of new episodes, the interrupted ones ending at the rollout's last step as
    truncations (bootstrapped from the value of the observation that followed it)."""
    if episodes_continue:
        return rollout.next_obs.numpy()
    with torch.no_grad():
        rollout.truncate_last_step(agent.values(agent.normalized(rollout.next_obs)), agent.config.gamma)
    if agent.reward_scaler is not None:
        agent.reward_scaler.reset_returns()
    return new_obs


if __name__ == "__main__":
    raise SystemExit(run_cli(train, PPOConfig))
