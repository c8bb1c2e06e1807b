"""Soft Actor-Critic (Haarnoja et al. 2018) with CleanRL's defaults.

Run:     python -m keelrl.agents.sac --env-id Hopper-v5
Import:  from keelrl.agents.sac import SAC, SACConfig, train, evaluate

The algorithm, top to bottom:
- twin Q critics (one batched ensemble) regress onto r + γ(1 − terminated)(min Q_target(s', a') − α log π(a'|s'));
- every `policy_frequency` critic updates, the tanh-Gaussian actor takes `policy_frequency` steps
  on α log π(a|s) − min Q(s, a), and α is tuned so the policy entropy tracks −|A|;
- target critics follow by Polyak averaging with rate τ.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from keelrl.agents.common import (
    BUFFER_FILE,
    CHECKPOINT_FILE,
    DEFAULT_THREADS,
    RunLogger,
    TrainResult,
    evaluate_policy,
    load_checkpoint,
    load_run_config,
    new_run_dir,
    progress_bar,
    restore_rng_state,
    rng_state,
    run_cli,
    save_checkpoint,
    save_config,
    seed_everything,
    set_threads,
)
from keelrl.buffers import Batch, ReplayBuffer
from keelrl.envs import make_vec_env
from keelrl.networks import CriticEnsemble, RunningObsNorm, TanhGaussianActor

ALGO = "sac"


@dataclasses.dataclass
class SACConfig:
    env_id: str = "Hopper-v5"
    """gymnasium (or envpool) environment id with a Box action space"""
    seed: int = 1
    """seed of python, numpy, torch and the envs"""
    total_timesteps: int = 1_000_000
    """environment steps to train for"""
    num_envs: int = 1
    """parallel environments (one gradient update per environment step)"""
    env_backend: str = "gymnasium"
    """'gymnasium' or 'envpool'"""
    buffer_size: int = 1_000_000
    """replay buffer capacity (transitions)"""
    gamma: float = 0.99
    """discount factor"""
    tau: float = 0.005
    """target network Polyak rate"""
    batch_size: int = 256
    """transitions per gradient update"""
    learning_starts: int = 5_000
    """environment steps of uniform random actions before learning starts"""
    policy_lr: float = 3e-4
    """actor learning rate"""
    q_lr: float = 1e-3
    """critic (and entropy coefficient) learning rate"""
    policy_frequency: int = 2
    """the actor is updated this many times every this many critic updates (delayed, compensated)"""
    target_network_frequency: int = 1
    """critic updates between target network updates"""
    alpha: float = 0.2
    """entropy coefficient (initial value when autotuned)"""
    autotune: bool = True
    """tune the entropy coefficient so the policy entropy tracks target_entropy_scale * |A|"""
    target_entropy_scale: float = -1.0
    """target entropy = target_entropy_scale * action dimension"""
    hidden_sizes: tuple[int, ...] = (256, 256)
    """hidden layer sizes of actor and critics"""
    num_critics: int = 2
    """critics in the ensemble; the target takes their minimum"""
    n_step: int = 1
    """n-step returns from the replay buffer"""
    normalize_obs: bool = False
    """normalise observations by running mean/std, updated on the observations acted on (saved with the model)"""
    eval_freq: int = 10_000
    """environment steps between evaluations (0: only at the end)"""
    eval_episodes: int = 10
    """episodes per evaluation (deterministic policy)"""
    checkpoint_freq: int = 50_000
    """environment steps between checkpoints (the last one is always written)"""
    log_freq: int = 1_000
    """environment steps between loss logs (losses stay on the device in between)"""
    threads: int = DEFAULT_THREADS
    """torch CPU threads (1 is fastest here for 256-wide networks; see agents/common.py)"""
    device: str = "cpu"
    """torch device for networks and replay buffer"""
    runs_dir: str = "runs"
    """parent directory of run directories"""
    resume: str | None = None
    """continue the run in this directory to its total_timesteps (its saved config is used)"""
    quiet: bool = False
    """no progress bar"""


def validate(config: SACConfig) -> None:
    positive = ["total_timesteps", "num_envs", "buffer_size", "batch_size", "policy_frequency",
                "target_network_frequency", "eval_episodes", "checkpoint_freq", "log_freq", "n_step",
                "num_critics"]
    for name in positive:
        if getattr(config, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(config, name)}.")
    if config.learning_starts < 0 or config.eval_freq < 0:
        raise ValueError("--learning-starts and --eval-freq must be non-negative.")
    if not 0.0 < config.gamma <= 1.0 or not 0.0 < config.tau <= 1.0:
        raise ValueError(f"gamma and tau must lie in (0, 1], got {config.gamma} and {config.tau}.")
    if config.batch_size > config.buffer_size:
        raise ValueError(f"--batch-size {config.batch_size} is larger than --buffer-size {config.buffer_size}.")
    if config.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {config.device}: torch sees no CUDA GPU on this machine; use --device cpu.")
    if config.num_critics < 2:
        raise ValueError("SAC takes the minimum over at least 2 critics: --num-critics must be >= 2.")


class SAC(nn.Module):
    """The SAC networks and update rule; takes raw observations (normalised inside when configured)."""

    def __init__(self, obs_dim: int, action_low: np.ndarray, action_high: np.ndarray, config: SACConfig):
        super().__init__()
        self.config = config
        self.obs_dim = obs_dim
        self.actor = TanhGaussianActor(obs_dim, action_low, action_high, config.hidden_sizes)
        action_dim = self.actor.action_scale.numel()
        self.critic = CriticEnsemble(obs_dim, action_dim, config.hidden_sizes, config.num_critics)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = nn.Parameter(torch.tensor(float(np.log(config.alpha))), requires_grad=config.autotune)
        self.target_entropy = config.target_entropy_scale * action_dim
        self.obs_norm = RunningObsNorm(obs_dim) if config.normalize_obs else nn.Identity()
        self.actor_optimizer = torch.optim.Adam(self.actor.parameters(), lr=config.policy_lr)
        self.critic_optimizer = torch.optim.Adam(self.critic.parameters(), lr=config.q_lr)
        self.alpha_optimizer = torch.optim.Adam([self.log_alpha], lr=config.q_lr) if config.autotune else None
        self.num_updates = 0
        self._critic_params = list(self.critic.parameters())
        self._target_params = list(self.critic_target.parameters())

    @property
    def alpha(self) -> torch.Tensor:
        return self.log_alpha.detach().exp()

    @torch.inference_mode()
    def act(self, obs: np.ndarray, deterministic: bool = False) -> np.ndarray:
        """Actions for a batch of observations (B, obs_dim) -> (B, action_dim)."""
        obs_t = self.obs_norm(torch.as_tensor(obs, dtype=torch.float32, device=self.log_alpha.device))
        return self.actor.act(obs_t, deterministic).cpu().numpy()

    def update(self, batch: Batch) -> dict[str, torch.Tensor]:
        """One critic step (and the delayed actor/α steps when due). Returns detached scalar tensors."""
        if self.config.normalize_obs:
            batch = batch._replace(obs=self.obs_norm(batch.obs), next_obs=self.obs_norm(batch.next_obs))
        losses = self._update_critic(batch)
        self.num_updates += 1
        if self.num_updates % self.config.policy_frequency == 0:
            for _ in range(self.config.policy_frequency):
                losses.update(self._update_actor_and_alpha(batch.obs))
        if self.num_updates % self.config.target_network_frequency == 0:
            with torch.no_grad():
                torch._foreach_lerp_(self._target_params, self._critic_params, self.config.tau)
        return losses

    def _update_critic(self, batch: Batch) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            next_actions, next_log_prob = self.actor.sample(batch.next_obs)
            next_q = self.critic_target(batch.next_obs, next_actions).min(dim=0).values  # (E, B) -> (B,)
            soft_value = next_q - self.alpha * next_log_prob
            target = batch.rewards + batch.discounts * (1.0 - batch.terminated) * soft_value
        q_values = self.critic(batch.obs, batch.actions)  # (E, B)
        # sum over critics of each critic's mean squared error, as CleanRL's qf1_loss + qf2_loss
        critic_loss = (q_values - target).pow(2).mean(dim=1).sum()
        self.critic_optimizer.zero_grad(set_to_none=True)
        critic_loss.backward()
        self.critic_optimizer.step()
        return {"losses/qf_loss": critic_loss.detach() / q_values.shape[0],
                "losses/qf_values": q_values.detach().mean()}

    def _update_actor_and_alpha(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        actions, log_prob = self.actor.sample(obs)
        self.critic.requires_grad_(False)  # the actor loss needs gradients w.r.t. actions only
        q_pi = self.critic(obs, actions).min(dim=0).values
        self.critic.requires_grad_(True)
        actor_loss = (self.alpha * log_prob - q_pi).mean()
        self.actor_optimizer.zero_grad(set_to_none=True)
        actor_loss.backward()
        self.actor_optimizer.step()
        losses = {"losses/actor_loss": actor_loss.detach(), "losses/alpha": self.alpha}
        if self.alpha_optimizer is not None:
            # the log-probs of this actor step, detached, as SB3 does (CleanRL resamples them)
            alpha_loss = -(self.log_alpha.exp() * (log_prob.detach() + self.target_entropy)).mean()
            self.alpha_optimizer.zero_grad(set_to_none=True)
            alpha_loss.backward()
            self.alpha_optimizer.step()
            losses["losses/alpha_loss"] = alpha_loss.detach()
        return losses

    def training_state(self) -> dict:
        """Networks, optimisers and counters: everything to continue training."""
        state = {
            "networks": self.state_dict(),
            "actor_optimizer": self.actor_optimizer.state_dict(),
            "critic_optimizer": self.critic_optimizer.state_dict(),
            "num_updates": self.num_updates,
        }
        if self.alpha_optimizer is not None:
            state["alpha_optimizer"] = self.alpha_optimizer.state_dict()
        return state

    def load_training_state(self, state: dict) -> None:
        self.load_state_dict(state["networks"])
        self.actor_optimizer.load_state_dict(state["actor_optimizer"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        if self.alpha_optimizer is not None:
            self.alpha_optimizer.load_state_dict(state["alpha_optimizer"])
        self.num_updates = state["num_updates"]

    def save(self, path: str | os.PathLike) -> None:
        """Save the networks (observation statistics included) and config: tensors and plain values only."""
        save_checkpoint(Path(path), {
            "algo": ALGO,
            "config": dataclasses.asdict(self.config),
            "obs_dim": self.obs_dim,
            "action_low": self.actor.action_bias - self.actor.action_scale,
            "action_high": self.actor.action_bias + self.actor.action_scale,
            "networks": self.state_dict(),
        })

    @classmethod
    def load(cls, path: str | os.PathLike, device: str = "cpu") -> SAC:
        state = load_checkpoint(path, ALGO)
        config = SACConfig(**state["config"])
        agent = cls(state["obs_dim"], state["action_low"].numpy(), state["action_high"].numpy(), config)
        agent.load_state_dict(state["networks"])
        return agent.to(device)


def evaluate(agent: SAC, env_id: str, episodes: int = 10, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Returns and costs of `episodes` episodes of the deterministic policy."""
    return evaluate_policy(lambda obs: agent.act(obs, deterministic=True), env_id, episodes, seed)


def _start_run(config: SACConfig) -> tuple[SACConfig, Path | None, dict | None]:
    """Validate a new config, or reload the config and checkpoint of an interrupted run."""
    if config.resume is None:
        validate(config)
        return config, None, None
    run_dir = Path(config.resume)
    saved = load_run_config(run_dir, ALGO, SACConfig)
    saved = dataclasses.replace(saved, hidden_sizes=tuple(saved.hidden_sizes), resume=str(run_dir), quiet=config.quiet)
    validate(saved)
    return saved, run_dir, load_checkpoint(run_dir / CHECKPOINT_FILE, ALGO)


def train(config: SACConfig) -> TrainResult:
    """Collect, update, log, evaluate and checkpoint until `total_timesteps` environment steps."""
    config, run_dir, checkpoint = _start_run(config)
    set_threads(config.threads)
    seed_everything(config.seed)
    global_step = 0 if checkpoint is None else checkpoint["global_step"]
    # a resumed run starts fresh episodes: envs are reseeded from the step they resume at
    env = make_vec_env(config.env_id, config.num_envs, config.seed + global_step, config.env_backend)
    if not isinstance(env.single_action_space, gym.spaces.Box):
        env.close()
        raise ValueError(f"SAC needs a continuous (Box) action space; {config.env_id!r} has "
                         f"{env.single_action_space}. Use a discrete-action agent for it.")
    if run_dir is None:  # a new run gets its directory once the env is known to work
        run_dir = new_run_dir(config.runs_dir, config.env_id, ALGO, config.seed)
        save_config(run_dir, ALGO, config)
    obs_dim = int(np.prod(env.single_observation_space.shape))
    low, high = env.single_action_space.low, env.single_action_space.high
    agent = SAC(obs_dim, low, high, config).to(config.device)
    buffer = ReplayBuffer(config.buffer_size, (obs_dim,), low.shape, config.num_envs, config.device,
                          config.n_step, config.gamma, seed=config.seed)
    action_rng = np.random.default_rng(config.seed)
    if checkpoint is not None:
        agent.load_training_state(checkpoint["agent"])
        restore_rng_state(checkpoint["rng"], action_rng)
        buffer.load(run_dir / BUFFER_FILE)

    def write_checkpoint() -> None:
        buffer.save(run_dir / BUFFER_FILE)
        save_checkpoint(run_dir / CHECKPOINT_FILE, {
            "algo": ALGO, "global_step": global_step, "agent": agent.training_state(),
            "rng": rng_state(action_rng),
        })

    logger = RunLogger(run_dir, resume_step=None if checkpoint is None else global_step)
    bar = progress_bar(config.total_timesteps, global_step, config.quiet)
    start_time, start_step = time.perf_counter(), global_step
    recent_return, losses = float("nan"), {}
    obs, _ = env.reset()
    try:
        while global_step < config.total_timesteps:
            if config.normalize_obs:
                agent.obs_norm.update(torch.as_tensor(obs))
            if global_step < config.learning_starts:
                actions = action_rng.uniform(low, high, (config.num_envs, *low.shape)).astype(np.float32)
            else:
                actions = agent.act(obs)
            try:
                next_obs, rewards, terminated, truncated, info = env.step(actions)
            except FloatingPointError as err:
                raise FloatingPointError(
                    f"{err} (global step {global_step + config.num_envs}). Training stopped; the last checkpoint in {run_dir} "
                    f"is kept (fix the environment, then --resume {run_dir})."
                ) from None
            buffer.add(obs, actions, rewards, info["final_obs"], terminated, truncated)
            obs = next_obs
            global_step += config.num_envs
            bar.update(config.num_envs)
            if "_episode" in info:
                for i in np.flatnonzero(info["_episode"]):
                    episode = info["episode"]
                    logger.episode(global_step, float(episode["return"][i]), int(episode["length"][i]),
                                   float(episode["cost"][i]))
                    recent_return = float(episode["return"][i])
                bar.set_postfix(ret=f"{recent_return:.1f}", refresh=False)

            if global_step > config.learning_starts:
                for _ in range(config.num_envs):
                    losses = agent.update(buffer.sample(config.batch_size))
            if global_step % config.log_freq < config.num_envs:
                sps = (global_step - start_step) / (time.perf_counter() - start_time)
                logger.scalars({**losses, "charts/SPS": sps}, global_step)
                bar.set_postfix(ret=f"{recent_return:.1f}", sps=f"{sps:.0f}", refresh=False)
            if global_step >= config.total_timesteps:
                break  # the final evaluation and checkpoint follow the loop
            if config.eval_freq and global_step % config.eval_freq < config.num_envs:
                logger.evaluation(global_step, *evaluate(agent, config.env_id, config.eval_episodes, config.seed + 10_000))
            if global_step % config.checkpoint_freq < config.num_envs:
                write_checkpoint()
        returns, costs = evaluate(agent, config.env_id, config.eval_episodes, config.seed + 10_000)
        logger.evaluation(global_step, returns, costs)
        write_checkpoint()
        agent.save(run_dir / "model.pt")
    finally:
        bar.close()
        logger.close()
        env.close()
    sps = (global_step - start_step) / (time.perf_counter() - start_time)
    print(f"final evaluation return over {len(returns)} episodes: {returns.mean():.1f} ± {returns.std():.1f}")
    print(f"run saved in {run_dir}; open the curves with: tensorboard --logdir {Path(config.runs_dir)}")
    return TrainResult(run_dir=run_dir, global_step=global_step, final_eval_returns=returns, sps=sps)


if __name__ == "__main__":
    raise SystemExit(run_cli(train, SACConfig))
