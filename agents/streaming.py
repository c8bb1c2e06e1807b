"""What stream TD(λ), stream Q(λ) and stream AC(λ) share: options, agent plumbing and the training loop.

Streaming agents learn from each transition once, as it happens: no replay buffer, no batch.
An agent file (stream_ac.py, stream_q.py, stream_td.py) defines its config (a subclass of
`StreamConfig`) and its agent (a subclass of `StreamAgent` with `act` and `update`);
`train_streaming` then runs: act, step the env, update on that one transition, log, evaluate,
checkpoint, until the step budget. The env is one gymnasium env behind the streaming wrappers
(envs/streaming_wrappers.py); their statistics are saved with checkpoints and models.

Runs on the CPU: a one-sample update is a few dozen small kernel launches.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from keelrl.agents.common import (
    CHECKPOINT_FILE,
    DEFAULT_THREADS,
    RunLogger,
    TrainResult,
    load_checkpoint,
    new_run_dir,
    progress_bar,
    restore_rng_state,
    restoring,
    rng_state,
    save_checkpoint,
    save_config,
    seed_everything,
    set_threads,
    start_or_resume,
)
from keelrl.envs.streaming_wrappers import (
    load_stream_env_state,
    make_stream_env,
    set_stream_env_training,
    stream_env_state,
)
from keelrl.networks.streaming import ObGD


@dataclasses.dataclass
class StreamConfig:
    env_id: str = "Hopper-v5"
    """gymnasium environment id (one env, flat observations)"""
    seed: int = 1
    """seed of python, numpy, torch and the env"""
    total_timesteps: int = 1_000_000
    """environment steps (= updates) to train for"""
    gamma: float = 0.99
    """discount factor"""
    lam: float = 0.8
    """trace decay λ: eligibility traces decay by γλ per step"""
    lr: float = 1.0
    """ObGD learning rate (the step size before the overshooting bound)"""
    kappa_value: float = 2.0
    """ObGD bound κ of the value (or action-value) network"""
    hidden_sizes: tuple[int, ...] = (128, 128)
    """hidden layer widths (Linear → LayerNorm without affine → leaky ReLU each)"""
    sparsity: float = 0.9
    """fraction of each weight row's inputs zeroed at initialisation"""
    adaptive: bool = False
    """adaptive ObGD: trace coordinates divided by the root of a running mean of (δe)²"""
    beta2: float = 0.999
    """decay of adaptive ObGD's running mean of (δe)²"""
    normalize_obs: bool = True
    """standardise observations by running Welford mean and variance"""
    scale_rewards: bool = True
    """divide rewards by the running std of a discounted-return trace"""
    time_feature: bool = True
    """append the fraction of the time limit still ahead to the observation"""
    eval_freq: int = 20_000
    """environment steps between evaluations (0: only at the end)"""
    eval_episodes: int = 10
    """episodes per evaluation (deterministic policy, frozen normalisers)"""
    checkpoint_freq: int = 100_000
    """environment steps between checkpoints (the last one is always written)"""
    log_freq: int = 1_000
    """environment steps between loss logs"""
    threads: int = DEFAULT_THREADS
    """torch CPU threads (one-sample updates gain nothing from more)"""
    runs_dir: str = "runs"
    """parent directory of run directories"""
    resume: str | None = None
    """continue the run in this directory to its total_timesteps (its saved config is used)"""
    quiet: bool = False
    """no progress bar"""


def validate_stream(config: StreamConfig) -> None:
    """Reject option values no run can use, with the option's command-line name."""
    for name in ["total_timesteps", "eval_episodes", "checkpoint_freq", "log_freq", "threads"]:
        if getattr(config, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(config, name)}.")
    if config.eval_freq < 0:
        raise ValueError(f"--eval-freq must be non-negative, got {config.eval_freq}.")
    for name in ["gamma", "lam", "beta2"]:
        if not 0.0 <= getattr(config, name) <= 1.0:
            raise ValueError(f"--{name} must lie in [0, 1], got {getattr(config, name)}.")
    if config.lr <= 0 or config.kappa_value <= 0:
        raise ValueError(f"--lr and --kappa-value must be positive, got {config.lr} and {config.kappa_value}.")
    if not 0.0 <= config.sparsity < 1.0:
        raise ValueError(f"--sparsity must lie in [0, 1), got {config.sparsity}.")
    if not config.hidden_sizes or min(config.hidden_sizes) < 1:
        raise ValueError(f"--hidden-sizes needs positive widths, got {config.hidden_sizes}.")


class Transition(NamedTuple):
    """One step of experience, as the env returned it (normalised observation, scaled reward)."""

    obs: np.ndarray
    action: np.ndarray | int
    reward: float
    next_obs: np.ndarray
    """the observation the action led to (the true last one when the episode ended)"""
    terminated: bool
    """no bootstrapping from next_obs (a time-limit truncation is not a termination)"""
    episode_end: bool
    """terminated or truncated: traces are reset after this update"""


def as_tensor(obs: np.ndarray) -> torch.Tensor:
    return torch.as_tensor(obs, dtype=torch.float32)


def space_to_dict(space: gym.Space) -> dict[str, Any]:
    """An action space as tensors and ints (for checkpoints loaded with weights_only)."""
    if isinstance(space, gym.spaces.Discrete):
        return {"n": int(space.n)}
    return {"low": torch.as_tensor(space.low), "high": torch.as_tensor(space.high)}


def space_from_dict(saved: dict[str, Any]) -> gym.Space:
    if "n" in saved:
        return gym.spaces.Discrete(saved["n"])
    return gym.spaces.Box(saved["low"].numpy(), saved["high"].numpy())


class StreamAgent(nn.Module):
    """What every streaming agent shares: config, ObGD optimisers, the env statistics its inputs
    were normalised with, a numpy generator for exploration, save/load.

    Subclasses set `algo` and `config_cls`, build their networks and `self.optimizers` in
    `__init__`, and implement `act(obs, deterministic)` and `update(transition)`.
    """

    algo: ClassVar[str]
    config_cls: ClassVar[type]

    def __init__(self, obs_dim: int, action_space: gym.Space, config: StreamConfig):
        super().__init__()
        self.config = config
        self.obs_dim = obs_dim
        self.action_space = action_space
        self.optimizers: dict[str, ObGD] = {}
        self.env_state: dict[str, dict[str, torch.Tensor]] = {}
        """normaliser statistics of the env the agent learnt on (evaluation loads them, frozen)"""
        self.rng = np.random.default_rng(config.seed)
        self.num_updates = 0

    @classmethod
    def check_action_space(cls, action_space: gym.Space, env_id: str) -> None:
        """Raise a ValueError when the agent cannot act in `action_space`."""

    def prepare_env(self, env: gym.Env) -> None:
        """Adjust the training env before the first reset (stream TD loads its policy's statistics)."""

    def act(self, obs: np.ndarray, deterministic: bool = False) -> np.ndarray | int:
        """The action for one normalised observation (obs_dim,)."""
        raise NotImplementedError

    def update(self, transition: Transition) -> dict[str, float]:
        """One learning step on one transition; returns scalars to log."""
        raise NotImplementedError

    def evaluation(self, env_id: str, episodes: int, seed: int) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
        """Returns and costs of evaluation episodes, and any other scalars to log about them."""
        return *evaluate(self, env_id, episodes, seed), {}

    def start_episode(self) -> None:
        """Forget what belongs to the episode before: every optimiser's eligibility trace (stream Q's
        Watkins trace is that trace). `step_optimizers(delta, reset=True)` does this at each episode
        end; the training loop also calls it when a resumed run restarts its env mid-episode."""
        for optimizer in self.optimizers.values():
            optimizer.reset_trace()

    def step_optimizers(self, delta: float, reset: bool) -> dict[str, float]:
        """Step every ObGD optimiser with TD error `delta` (after a backward pass), then clear gradients."""
        step_sizes = {}
        for name, optimizer in self.optimizers.items():
            step_sizes[f"losses/{name}_step_size"] = optimizer.step(delta, reset)
            optimizer.zero_grad()
        self.num_updates += 1
        return step_sizes

    def training_state(self) -> dict:
        return {"networks": self.state_dict(),
                "optimizers": {name: opt.state_dict() for name, opt in self.optimizers.items()},
                "num_updates": self.num_updates}

    def load_training_state(self, state: dict) -> None:
        self.load_state_dict(state["networks"])
        for name, optimizer in self.optimizers.items():
            optimizer.load_state_dict(state["optimizers"][name])
        self.num_updates = state["num_updates"]

    def save(self, path: str | os.PathLike) -> None:
        """Networks, config, action space and env statistics: tensors and plain values only."""
        save_checkpoint(Path(path), {"algo": self.algo, "config": dataclasses.asdict(self.config),
                                     "obs_dim": self.obs_dim, "action_space": space_to_dict(self.action_space),
                                     "networks": self.state_dict(), "env_state": self.env_state})

    @classmethod
    def load(cls, path: str | os.PathLike):
        state = load_checkpoint(path, cls.algo)
        config = cls.config_cls(**{**state["config"], "hidden_sizes": tuple(state["config"]["hidden_sizes"])})
        agent = cls(state["obs_dim"], space_from_dict(state["action_space"]), config)
        agent.load_state_dict(state["networks"])
        agent.env_state = state["env_state"]
        return agent


def make_env(config: StreamConfig, env_id: str | None = None) -> gym.Env:
    """`config.env_id` (or `env_id`) behind the streaming wrappers `config` asks for."""
    return make_stream_env(env_id or config.env_id, config.gamma, config.normalize_obs, config.scale_rewards,
                           config.time_feature)


def run_episodes(agent: StreamAgent, env_id: str, episodes: int, seed: int) -> Iterator[tuple]:
    """Every step (obs, reward, terminated, truncated, info) of `episodes` episodes of the agent's
    deterministic policy, on an env with the agent's normaliser statistics, frozen; episode i is
    seeded seed + i."""
    env = make_env(agent.config, env_id)
    load_stream_env_state(env, agent.env_state)
    set_stream_env_training(env, False)
    try:
        for episode in range(episodes):
            obs, _ = env.reset(seed=seed + episode)
            terminated = truncated = False
            while not (terminated or truncated):
                next_obs, reward, terminated, truncated, info = env.step(agent.act(obs, deterministic=True))
                yield obs, reward, terminated, truncated, info
                obs = next_obs
    finally:
        env.close()


def evaluate(agent: StreamAgent, env_id: str, episodes: int = 10, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Undiscounted returns and costs of `episodes` episodes of the agent's deterministic policy."""
    returns, costs, cost = [], [], 0.0
    for _, _, terminated, truncated, info in run_episodes(agent, env_id, episodes, seed):
        cost += info.get("cost", 0.0)
        if terminated or truncated:
            returns.append(float(info["episode"]["r"]))
            costs.append(cost)
            cost = 0.0
    return np.array(returns), np.array(costs)


def _check_finite(reward: float, obs: np.ndarray, global_step: int, run_dir: Path) -> None:
    if not (math.isfinite(reward) and np.isfinite(obs).all()):
        raise FloatingPointError(
            f"The environment returned a non-finite reward or observation (NaN or inf) at global step "
            f"{global_step}. Training stopped; the last checkpoint in {run_dir} is kept (fix the environment, "
            f"then --resume {run_dir})."
        )


def train_streaming(agent_cls: type[StreamAgent], config: StreamConfig, validate) -> TrainResult:
    """Act, step, update on the one transition, log, evaluate and checkpoint until `total_timesteps`.

    A resumed run starts a fresh episode (the env is reseeded from the step it resumes at), so
    everything that belongs to one episode starts from zero, as after any episode end, even when
    the checkpoint was written mid-episode: the agent's eligibility traces (`start_episode`), the
    reward scaler's return trace and the time feature (both reset by `env.reset`). The normalisers'
    statistics, adaptive ObGD's second moments and the update count carry on.
    """
    algo = agent_cls.algo
    config, run_dir, checkpoint = start_or_resume(config, algo, validate,
                                                  checkpoint_keys=("global_step", "agent", "env", "rng"))
    set_threads(config.threads)
    seed_everything(config.seed)
    global_step = 0 if checkpoint is None else checkpoint["global_step"]
    env = make_env(config)
    try:
        agent_cls.check_action_space(env.unwrapped.action_space, config.env_id)
        agent = agent_cls(env.observation_space.shape[0], env.unwrapped.action_space, config)
        agent.prepare_env(env)
    except ValueError:
        env.close()
        raise
    if run_dir is None:  # a new run gets its directory once the env and agent are known to work
        run_dir = new_run_dir(config.runs_dir, config.env_id, algo, config.seed)
        save_config(run_dir, algo, config)
    if checkpoint is not None:
        with restoring(run_dir / CHECKPOINT_FILE):
            agent.load_training_state(checkpoint["agent"])
            load_stream_env_state(env, checkpoint["env"])
            restore_rng_state(checkpoint["rng"], agent.rng)

    def write_checkpoint() -> None:
        save_checkpoint(run_dir / CHECKPOINT_FILE, {"algo": algo, "global_step": global_step,
                                                   "agent": agent.training_state(), "env": stream_env_state(env),
                                                   "rng": rng_state(agent.rng)})

    def run_evaluation() -> tuple[np.ndarray, dict[str, float]]:
        agent.env_state = stream_env_state(env)
        returns, costs, scalars = agent.evaluation(config.env_id, config.eval_episodes, config.seed + 10_000)
        logger.evaluation(global_step, returns, costs)
        logger.scalars(scalars, global_step)
        return returns, scalars

    logger = RunLogger(run_dir, resume_step=None if checkpoint is None else global_step)
    bar = progress_bar(config.total_timesteps, global_step, config.quiet)
    start_time, start_step = time.perf_counter(), global_step
    recent_return, episode_cost, losses = float("nan"), 0.0, {}
    obs, _ = env.reset(seed=config.seed + global_step)
    agent.start_episode()  # a checkpoint's mid-episode traces do not belong to this new episode
    try:
        while global_step < config.total_timesteps:
            action = agent.act(obs)
            next_obs, reward, terminated, truncated, info = env.step(action)
            global_step += 1
            _check_finite(reward, next_obs, global_step, run_dir)
            episode_end = terminated or truncated
            losses = agent.update(Transition(obs, action, float(reward), next_obs, terminated, episode_end))
            obs = next_obs
            if "cost" in info:
                episode_cost += info["cost"]
            if episode_end:
                recent_return = float(info["episode"]["r"])
                logger.episode(global_step, recent_return, int(info["episode"]["l"]), episode_cost)
                episode_cost = 0.0
                obs, _ = env.reset()
                bar.set_postfix(ret=f"{recent_return:.1f}", refresh=False)
            bar.update(1)
            if global_step % config.log_freq == 0:
                sps = (global_step - start_step) / (time.perf_counter() - start_time)
                logger.scalars({**losses, "charts/SPS": sps}, global_step)
            if global_step >= config.total_timesteps:
                break  # the final evaluation and checkpoint follow the loop
            if config.eval_freq and global_step % config.eval_freq == 0:
                run_evaluation()
            if global_step % config.checkpoint_freq == 0:
                write_checkpoint()
        loop_end = time.perf_counter()
        returns, scalars = run_evaluation()
        write_checkpoint()
        agent.save(run_dir / "model.pt")
    finally:
        bar.close()
        logger.close()
        env.close()
    sps = (global_step - start_step) / max(loop_end - start_time, 1e-9)
    print(f"final evaluation return over {len(returns)} episodes: {returns.mean():.1f} ± {returns.std():.1f}")
    for name, value in scalars.items():
        print(f"final {name}: {value:.4f}")
    print(f"steps/s: {sps:.1f}")
    print(f"run saved in {run_dir}; open the curves with: tensorboard --logdir {Path(config.runs_dir)}")
    return TrainResult(run_dir=run_dir, global_step=global_step, final_eval_returns=returns, sps=sps, update_sps=sps)
