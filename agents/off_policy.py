"""The parts SAC, TD3 and their variants share: run options, agent plumbing and the training loop.

An off-policy agent file (sac.py, td3.py) defines its config (a subclass of `OffPolicyConfig`)
and its agent (a subclass of `OffPolicyAgent` that builds the networks and implements
`policy` and `learn`); `train_off_policy` then runs: act, step the envs, store the transition,
update, log, evaluate, checkpoint, until the step budget.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import shutil
import time
from pathlib import Path
from typing import Any, ClassVar, Literal

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
from keelrl.buffers import Batch, ReplayBuffer
from keelrl.envs import make_vec_env
from keelrl.networks import (
    C51Head,
    CategoricalHead,
    CriticEnsemble,
    DeterministicActor,
    HLGaussHead,
    RewardScaler,
    RunningObsNorm,
    ScalarHead,
    SimbaActor,
    SimbaCritic,
    SimbaDeterministicActor,
    SimbaV2Actor,
    SimbaV2Critic,
    SimbaV2DeterministicActor,
    TanhGaussianActor,
    ValueHead,
)


@dataclasses.dataclass
class OffPolicyConfig:
    env_id: str = "Hopper-v5"
    """gymnasium (or envpool) environment id with a Box action space"""
    seed: int = 1
    """seed of python, numpy, torch and the envs"""
    total_timesteps: int = 1_000_000
    """environment steps to train for"""
    num_envs: int = 1
    """parallel environments (one gradient update per environment step)"""
    env_backend: Literal["gymnasium", "envpool"] = "gymnasium"
    """vector environment backend (envpool needs the envpool extra)"""
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
    policy_frequency: int = 2
    """delayed policy updates: actor steps come every this many critic updates (SAC then takes this many)"""
    hidden_sizes: tuple[int, ...] = (256, 256)
    """hidden layer sizes of actor and critics (--network mlp)"""
    num_critics: int = 2
    """critics in the ensemble; targets take the one with the smallest value"""
    network: Literal["mlp", "simba", "simbav2"] = "mlp"
    """actor and critic architecture: plain MLPs, SimBa (residual, LayerNorm) or SimbaV2 (hyperspherical)"""
    actor_hidden_dim: int = 128
    """SimBa/SimbaV2 actor width"""
    actor_num_blocks: int = 1
    """SimBa/SimbaV2 actor residual blocks"""
    critic_hidden_dim: int = 512
    """SimBa/SimbaV2 critic width"""
    critic_num_blocks: int = 2
    """SimBa/SimbaV2 critic residual blocks"""
    critic_head: Literal["scalar", "c51", "hlgauss"] = "scalar"
    """critic output: a scalar (MSE), or a categorical distribution trained by cross-entropy against the C51
    projection of the target distribution or the HL-Gauss histogram of the scalar target"""
    v_min: float | None = None
    """lowest value of a categorical critic's support (with --scale-rewards: -5 by default)"""
    v_max: float | None = None
    """highest value of a categorical critic's support (with --scale-rewards: 5 by default)"""
    num_bins: int = 101
    """bins (atoms) of a categorical critic"""
    scale_rewards: bool = False
    """divide rewards by SimbaV2's running scale of the discounted return, so returns stay within ±v_max"""
    utd: int = 1
    """gradient updates per environment step (update-to-data ratio)"""
    optimizer: Literal["adam", "adamw"] = "adam"
    """optimiser of every network"""
    weight_decay: float = 0.0
    """decoupled weight decay (--optimizer adamw)"""
    final_lr_fraction: float = 1.0
    """learning rates decay linearly over the run to this fraction of their start (1: constant)"""
    preset: Literal["simba", "simbav2"] | None = None
    """the SimBa or SimbaV2 paper's settings in one flag; an explicit option that contradicts it is refused"""
    n_step: int = 1
    """n-step returns from the replay buffer"""
    normalize_obs: bool = False
    """normalise observations by running mean/std, (obs − mean) / sqrt(var + 1e-8), updated on the observations
    acted on (saved with the model)"""
    obs_clip: float | None = 10.0
    """with --normalize-obs: clip normalised observations to ±obs_clip (None: no clipping, as SimBa and SimbaV2)"""
    eval_freq: int = 10_000
    """environment steps between evaluations (0: only at the end)"""
    eval_episodes: int = 10
    """episodes per evaluation (deterministic policy)"""
    checkpoint_freq: int = 50_000
    """environment steps between checkpoints (the last one is always written)"""
    log_freq: int = 1_000
    """environment steps between loss logs (losses stay on the device in between)"""
    threads: int = DEFAULT_THREADS
    """torch CPU threads (1 is robust to other busy processes; 2 is faster on an idle 2-core machine)"""
    device: str = "cpu"
    """torch device for networks and replay buffer"""
    compile: bool = False
    """compile the loss computations with torch.compile (a C++ compiler is needed on CPU)"""
    cudagraphs: bool = False
    """with --device cuda: replay the compiled losses as CUDA graphs (torch.compile's "reduce-overhead" mode)"""
    runs_dir: str = "runs"
    """parent directory of run directories"""
    resume: str | None = None
    """continue the run in this directory to its total_timesteps (its saved config is used)"""
    extend_to: int | None = None
    """with --resume: train the run on until this many environment steps, past the total_timesteps it was
    started with (a finished run continues; a learning-rate decay stretches to the new end)"""
    quiet: bool = False
    """no progress bar"""


def validate_off_policy(config: OffPolicyConfig) -> None:
    """Reject option values no run can use, with the option's command-line name."""
    positive = ["total_timesteps", "num_envs", "buffer_size", "batch_size", "policy_frequency", "eval_episodes",
                "checkpoint_freq", "log_freq", "n_step", "threads"]
    for name in positive:
        if getattr(config, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(config, name)}.")
    if config.learning_starts < 0 or config.eval_freq < 0:
        raise ValueError("--learning-starts and --eval-freq must be non-negative.")
    if not 0.0 < config.gamma <= 1.0 or not 0.0 < config.tau <= 1.0:
        raise ValueError(f"--gamma and --tau must lie in (0, 1], got {config.gamma} and {config.tau}.")
    if config.batch_size > config.buffer_size:
        raise ValueError(f"--batch-size {config.batch_size} is larger than --buffer-size {config.buffer_size}.")
    if config.num_critics < 2:
        raise ValueError("Clipped double-Q takes the minimum over at least 2 critics: --num-critics must be >= 2.")
    if config.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {config.device}: torch sees no CUDA GPU on this machine; use --device cpu.")
    if config.cudagraphs and not config.device.startswith("cuda"):
        raise ValueError("--cudagraphs captures the update in CUDA graphs, which needs --device cuda (and a GPU); "
                         "on CPU use --compile alone.")
    if config.compile and config.device == "cpu" and not any(map(shutil.which, ("g++", "c++", "clang++"))):
        raise ValueError("--compile on CPU needs a C++ compiler for torch.compile's generated kernels: install "
                         "g++ (e.g. apt install g++) or drop --compile.")
    if config.utd < 1:
        raise ValueError(f"--utd (updates per environment step) must be at least 1, got {config.utd}.")
    if config.extend_to is not None:
        if config.resume is None:
            raise ValueError("--extend-to trains a saved run further: give it with --resume RUN_DIR.")
        if config.extend_to < config.total_timesteps:
            raise ValueError(f"--extend-to {config.extend_to} is below the run's --total-timesteps "
                             f"{config.total_timesteps}: a run cannot be shortened.")
    if config.weight_decay < 0 or not 0.0 < config.final_lr_fraction <= 1.0:
        raise ValueError("--weight-decay must be non-negative and --final-lr-fraction in (0, 1].")
    if config.obs_clip is not None and not config.obs_clip > 0:
        raise ValueError(f"--obs-clip must be positive (or None for no clipping), got {config.obs_clip}.")
    if config.critic_head != "scalar":
        if config.v_min is None or config.v_max is None:
            raise ValueError(f"--critic-head {config.critic_head} needs a support: give --v-min and --v-max (the range "
                             f"of returns), or --scale-rewards, which fits returns into [-5, 5].")
        CategoricalHead.check_range(config.v_min, config.v_max, config.num_bins)


def episode_length_discount(max_episode_steps: int, action_repeat: int = 1) -> float:
    """SimBa's and SimbaV2's discount heuristic (taken from TD-MPC2): with the effective episode length
    L = max_episode_steps / action_repeat, γ = (L/5 − 1) / (L/5) clipped to [0.95, 0.995]
    (SonyResearch/simba configs/base.yaml:16-17, dojeon-ai/SimbaV2 configs/online_rl.yaml:19-20).
    MuJoCo's 1000-step episodes without action repeat give 0.995."""
    horizon = max_episode_steps / action_repeat / 5
    return max(min((horizon - 1) / horizon, 0.995), 0.95)


MUJOCO_DISCOUNT = episode_length_discount(1000)
"""The presets' discount: the heuristic on MuJoCo's 1000-step episodes (configs/env/mujoco.yaml:13,15 of SimbaV2)."""


def apply_preset(config: OffPolicyConfig, presets: dict[str, dict[str, Any]]) -> OffPolicyConfig:
    """The config with `config.preset`'s settings, and its derived defaults resolved.

    An option set to a third value (neither its default nor the preset's) is a contradiction and is
    refused. With or without a preset, a categorical critic on scaled rewards gets the support
    [−5, 5] that the reward scaling fits returns into, unless --v-min/--v-max are given.
    """
    if config.preset is not None:
        defaults = type(config)()
        for name, value in presets[config.preset].items():
            given = getattr(config, name)
            if given != value and given != getattr(defaults, name):
                raise ValueError(f"--preset {config.preset} sets --{name.replace('_', '-')} {value}, but "
                                 f"--{name.replace('_', '-')} {given} was also given: drop one of them.")
        config = dataclasses.replace(config, **presets[config.preset])
    if config.scale_rewards and config.critic_head != "scalar":
        config = dataclasses.replace(config, v_min=-5.0 if config.v_min is None else config.v_min,
                                     v_max=5.0 if config.v_max is None else config.v_max)
    return config


def build_head(config: OffPolicyConfig) -> ValueHead:
    if config.critic_head == "c51":
        return C51Head(config.v_min, config.v_max, config.num_bins)
    if config.critic_head == "hlgauss":
        return HLGaussHead(config.v_min, config.v_max, config.num_bins)
    return ScalarHead()


def build_critic(config: OffPolicyConfig, obs_dim: int, action_dim: int, num_outputs: int) -> nn.Module:
    """The critic ensemble: (obs (B, obs_dim), actions (B, action_dim)) -> outputs (E, B, num_outputs)."""
    if config.network == "simba":
        return SimbaCritic(obs_dim, action_dim, config.critic_hidden_dim, config.critic_num_blocks,
                           config.num_critics, num_outputs)
    if config.network == "simbav2":
        return SimbaV2Critic(obs_dim, action_dim, config.critic_hidden_dim, config.critic_num_blocks,
                             config.num_critics, num_outputs)
    return CriticEnsemble(obs_dim, action_dim, config.hidden_sizes, config.num_critics, num_outputs)


def build_actor(config: OffPolicyConfig, obs_dim: int, low: np.ndarray, high: np.ndarray, stochastic: bool) -> nn.Module:
    """A tanh-Gaussian (SAC) or deterministic (TD3) actor of the configured architecture."""
    if config.network == "mlp":
        actor_cls = TanhGaussianActor if stochastic else DeterministicActor
        return actor_cls(obs_dim, low, high, config.hidden_sizes)
    simba = {("simba", True): SimbaActor, ("simba", False): SimbaDeterministicActor,
             ("simbav2", True): SimbaV2Actor, ("simbav2", False): SimbaV2DeterministicActor}
    return simba[config.network, stochastic](obs_dim, low, high, config.actor_hidden_dim, config.actor_num_blocks)


class OffPolicyAgent(nn.Module):
    """What SAC and TD3 share: the critic ensemble and its value head, the TD target, observation
    and reward normalisation, optimiser steps, acting on numpy, save/load.

    Subclasses set `algo`, `config_cls` and `presets`, build their actor (`build_actor`) and
    optimisers (`set_optimizers`) in `__init__`, and implement `policy(obs, deterministic)` and
    `learn(batch)`. `update(batch)` normalises observations and rewards, then calls `learn`.
    """

    algo: ClassVar[str]
    config_cls: ClassVar[type]
    presets: ClassVar[dict[str, dict[str, Any]]] = {}
    uses_cost: ClassVar[bool] = False
    """Cost-constrained agents (agents/lagrange.py) set this: the replay buffer then stores info["cost"] and
    `observe_episode_costs(costs, global_step)` receives the cost of every finished training episode."""

    def __init__(self, obs_dim: int, action_low: np.ndarray, action_high: np.ndarray, config: OffPolicyConfig):
        super().__init__()
        self.config = config
        self.obs_dim = obs_dim
        self.register_buffer("action_low", torch.as_tensor(action_low, dtype=torch.float32))
        self.register_buffer("action_high", torch.as_tensor(action_high, dtype=torch.float32))
        # (obs − mean) / sqrt(var + 1e-8) as SimBa and SimbaV2 (which do not clip: --obs-clip None in their presets)
        self.obs_norm = RunningObsNorm(obs_dim, config.obs_clip, eps=1e-8) if config.normalize_obs else nn.Identity()
        self.reward_scaler = RewardScaler(config.gamma, config.num_envs) if config.scale_rewards else None
        self.head = build_head(config)
        self.critic = build_critic(config, obs_dim, len(action_low), self.head.num_outputs)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.optimizers: dict[str, torch.optim.Optimizer] = {}
        self.num_updates = 0
        # learning-rate decay runs over every update after learning_starts
        self._total_updates = max(1, (config.total_timesteps - config.learning_starts) * config.utd)

    def policy(self, obs: torch.Tensor, deterministic: bool) -> torch.Tensor:
        """Actions for normalised observations: exploratory, or the deterministic mode."""
        raise NotImplementedError

    def learn(self, batch: Batch) -> dict[str, torch.Tensor]:
        """One update on a batch of normalised observations and scaled rewards; returns detached scalars."""
        raise NotImplementedError

    @torch.inference_mode()
    def act(self, obs: np.ndarray, deterministic: bool = False) -> np.ndarray:
        """Actions for a batch of raw observations (B, obs_dim) -> (B, action_dim)."""
        obs_t = self.obs_norm(torch.as_tensor(obs, dtype=torch.float32, device=self.action_low.device))
        return self.policy(obs_t, deterministic).cpu().numpy()

    def update(self, batch: Batch) -> dict[str, torch.Tensor]:
        if self.config.normalize_obs:
            batch = batch._replace(obs=self.obs_norm(batch.obs), next_obs=self.obs_norm(batch.next_obs))
        if self.reward_scaler is not None:
            batch = batch._replace(rewards=self.reward_scaler(batch.rewards))
        if self.config.final_lr_fraction < 1.0:
            self._decay_learning_rates()
        losses = self.learn(batch)
        self.num_updates += 1
        return losses

    def set_optimizers(self, learning_rates: dict[str, tuple[list[nn.Parameter], float]],
                       no_weight_decay: tuple[str, ...] = ()) -> None:
        """One optimiser (--optimizer, --weight-decay) per named group of parameters; the groups named
        in `no_weight_decay` get none (SAC's temperature, as SimBa's `temp_weight_decay: 0.0`).

        The fused implementation updates all of a group's parameters in one kernel (the same
        arithmetic as the per-parameter loop, a few percent faster per SAC update here).
        """
        optimizer_cls = torch.optim.AdamW if self.config.optimizer == "adamw" else torch.optim.Adam
        for name, (params, lr) in learning_rates.items():
            weight_decay = 0.0 if name in no_weight_decay else self.config.weight_decay
            self.optimizers[name] = optimizer_cls(params, lr=lr, weight_decay=weight_decay, fused=True)
            for group in self.optimizers[name].param_groups:
                group["initial_lr"] = lr

    def _decay_learning_rates(self) -> None:
        progress = min(1.0, self.num_updates / self._total_updates)
        factor = 1.0 - (1.0 - self.config.final_lr_fraction) * progress
        for optimizer in self.optimizers.values():
            for group in optimizer.param_groups:
                group["lr"] = group["initial_lr"] * factor

    def optimize(self, name: str, loss: torch.Tensor) -> None:
        """Backpropagate `loss` and step optimiser `name`; SimbaV2 networks then re-project their weights."""
        optimizer = self.optimizers[name]
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        network = getattr(self, name)
        if hasattr(network, "project_weights"):
            network.project_weights()

    def q_values(self, obs: torch.Tensor, actions: torch.Tensor, first_only: bool = False) -> torch.Tensor:
        """Q-values (E, B) of every critic, or (1, B) of the first only."""
        if first_only and isinstance(self.critic, CriticEnsemble):
            return self.head.value(self.critic(obs, actions, members=slice(0, 1)))  # skips the other members
        outputs = self.critic(obs, actions)
        return self.head.value(outputs[:1] if first_only else outputs)

    @torch.no_grad()
    def td_target(self, batch: Batch, next_actions: torch.Tensor, next_bonus: torch.Tensor | float) -> torch.Tensor:
        """The critic's target for r + γ(1 − terminated)(Q'(s', a') + bonus), Q' the pessimistic target critic.

        Scalar and HL-Gauss critics get the scalar target with the smallest target Q-value;
        C51 critics get the projection of the distribution of the member with the smallest mean.
        `next_bonus` is SAC's −α log π(a'|s') (0 for TD3).
        """
        next_outputs = self.critic_target(batch.next_obs, next_actions)  # (E, B, K)
        not_done = 1.0 - batch.terminated
        if isinstance(self.head, C51Head):
            next_probs = self.head.min_value_probs(next_outputs)
            shifted_rewards = batch.rewards + batch.discounts * not_done * next_bonus
            return self.head.project(next_probs, shifted_rewards, batch.discounts, not_done)
        next_q = self.head.value(next_outputs).min(dim=0).values  # (E, B) -> (B,)
        return batch.rewards + batch.discounts * not_done * (next_q + next_bonus)

    def compiled(self, loss_fn):
        """`loss_fn` through torch.compile under --compile (CUDA graphs too under --cudagraphs), else itself.

        Only loss computations are compiled (forward, and with it the backward graph); `optimize` runs
        the backward pass and the fused optimiser step eagerly.
        """
        if not (self.config.compile or self.config.cudagraphs):
            return loss_fn
        return torch.compile(loss_fn, mode="reduce-overhead" if self.config.cudagraphs else None)

    def critic_regression_loss(self, batch: Batch, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The sum over critics of their mean loss against `target`, and the detached outputs (E, B, K)."""
        outputs = self.critic(batch.obs, batch.actions)  # (E, B, K)
        return self.head.loss(outputs, target).mean(dim=1).sum(), outputs.detach()

    def apply_critic_loss(self, critic_loss: torch.Tensor, outputs: torch.Tensor) -> dict[str, torch.Tensor]:
        """One optimiser step of the critics on `critic_loss`; the logged loss and Q-values."""
        self.optimize("critic", critic_loss)
        return {"losses/qf_loss": critic_loss.detach() / outputs.shape[0],
                "losses/qf_values": self.head.value(outputs).mean()}

    def critic_step(self, batch: Batch, target: torch.Tensor) -> dict[str, torch.Tensor]:
        """One optimiser step of every critic towards `target`."""
        return self.apply_critic_loss(*self.critic_regression_loss(batch, target))

    def training_state(self) -> dict:
        """Networks, optimisers and the update counter: everything to continue training."""
        return {
            "networks": self.state_dict(),
            "optimizers": {name: opt.state_dict() for name, opt in self.optimizers.items()},
            "num_updates": self.num_updates,
        }

    def load_training_state(self, state: dict) -> None:
        self.load_state_dict(state["networks"])
        for name, optimizer in self.optimizers.items():
            optimizer.load_state_dict(state["optimizers"][name])
        self.num_updates = state["num_updates"]

    def save(self, path: str | os.PathLike) -> None:
        """Save networks (observation statistics included) and config: tensors and plain values only."""
        save_checkpoint(Path(path), {
            "algo": self.algo,
            "config": dataclasses.asdict(self.config),
            "obs_dim": self.obs_dim,
            "networks": self.state_dict(),
        })

    @classmethod
    def load(cls, path: str | os.PathLike, device: str = "cpu"):
        state = load_checkpoint(path, cls.algo)
        config = cls.config_cls(**state["config"])
        networks = state["networks"]
        agent = cls(state["obs_dim"], networks["action_low"].numpy(), networks["action_high"].numpy(), config)
        agent.load_state_dict(networks)
        return agent.to(device)


def evaluate(agent: OffPolicyAgent, env_id: str, episodes: int = 10, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Returns and costs of `episodes` episodes of the agent's deterministic policy."""
    return evaluate_policy(lambda obs: agent.act(obs, deterministic=True), env_id, episodes, seed)


def train_off_policy(agent_cls: type[OffPolicyAgent], config: OffPolicyConfig, validate) -> TrainResult:
    """Collect, update, log, evaluate and checkpoint until `total_timesteps` environment steps."""
    algo = agent_cls.algo
    if config.resume is None:
        config = apply_preset(config, agent_cls.presets)
    config, run_dir, checkpoint = start_or_resume(config, algo, validate, keep_from_command_line=("quiet", "extend_to"))
    if config.extend_to is not None:  # the new end is saved, so a later plain --resume continues to it
        config = dataclasses.replace(config, total_timesteps=config.extend_to, extend_to=None)
        save_config(run_dir, algo, config)
    set_threads(config.threads)
    seed_everything(config.seed)
    global_step = 0 if checkpoint is None else checkpoint["global_step"]
    # a resumed run starts fresh episodes: envs are reseeded from the step they resume at
    env = make_vec_env(config.env_id, config.num_envs, config.seed + global_step, config.env_backend)
    if not isinstance(env.single_action_space, gym.spaces.Box):
        env.close()
        raise ValueError(f"{algo.upper()} needs a continuous (Box) action space; {config.env_id!r} has "
                         f"{env.single_action_space}. Use a discrete-action agent for it.")
    if run_dir is None:  # a new run gets its directory once the env is known to work
        run_dir = new_run_dir(config.runs_dir, config.env_id, algo, config.seed)
        save_config(run_dir, algo, config)
    obs_dim = int(np.prod(env.single_observation_space.shape))
    low, high = env.single_action_space.low, env.single_action_space.high
    agent = agent_cls(obs_dim, low, high, config).to(config.device)
    buffer = ReplayBuffer(config.buffer_size, (obs_dim,), low.shape, config.num_envs, config.device,
                          config.n_step, config.gamma, store_cost=agent_cls.uses_cost, seed=config.seed)
    action_rng = np.random.default_rng(config.seed)
    if checkpoint is not None:
        if not (run_dir / BUFFER_FILE).is_file():
            raise FileNotFoundError(f"--resume {run_dir}: {BUFFER_FILE} is missing (it is written with every "
                                    f"checkpoint); the run cannot continue without its replay buffer.")
        with restoring(run_dir / CHECKPOINT_FILE):
            agent.load_training_state(checkpoint["agent"])
            restore_rng_state(checkpoint["rng"], action_rng)
        with restoring(run_dir / BUFFER_FILE):
            buffer.load(run_dir / BUFFER_FILE)
        # the envs restart: the interrupted episodes end where the checkpoint cut them
        buffer.end_episodes()
        if agent.reward_scaler is not None:
            agent.reward_scaler.reset_returns()

    def write_checkpoint() -> None:
        buffer.save(run_dir / BUFFER_FILE)
        save_checkpoint(run_dir / CHECKPOINT_FILE, {
            "algo": algo, "global_step": global_step, "agent": agent.training_state(), "rng": rng_state(action_rng),
        })

    def run_evaluation() -> tuple[np.ndarray, np.ndarray]:
        returns, costs = evaluate(agent, config.env_id, config.eval_episodes, config.seed + 10_000)
        logger.evaluation(global_step, returns, costs)
        return returns, costs

    logger = RunLogger(run_dir, resume_step=None if checkpoint is None else global_step)
    bar = progress_bar(config.total_timesteps, global_step, config.quiet)
    start_time, start_step = time.perf_counter(), global_step
    update_start: tuple[float, int] | None = None  # (time, step) when updates began in this process
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
                    f"{err} (global step {global_step + config.num_envs}). Training stopped; the last checkpoint "
                    f"in {run_dir} is kept (fix the environment, then --resume {run_dir})."
                ) from None
            buffer.add(obs, actions, rewards, info["final_obs"], terminated, truncated, info.get("cost"))
            if agent.reward_scaler is not None:
                agent.reward_scaler.update(rewards, terminated | truncated)
            obs = next_obs
            global_step += config.num_envs
            bar.update(config.num_envs)
            if "_episode" in info:
                episode = info["episode"]
                for i in np.flatnonzero(info["_episode"]):
                    recent_return = float(episode["return"][i])
                    logger.episode(global_step, recent_return, int(episode["length"][i]), float(episode["cost"][i]))
                bar.set_postfix(ret=f"{recent_return:.1f}", refresh=False)
                if agent_cls.uses_cost:
                    agent.observe_episode_costs(episode["cost"][info["_episode"]], global_step)

            if global_step > config.learning_starts:
                if update_start is None:
                    update_start = (time.perf_counter(), global_step)
                for _ in range(config.num_envs * config.utd):
                    losses = agent.update(buffer.sample(config.batch_size))
            if global_step % config.log_freq < config.num_envs:
                sps = (global_step - start_step) / (time.perf_counter() - start_time)
                logger.scalars({**losses, "charts/SPS": sps}, global_step)
                bar.set_postfix(ret=f"{recent_return:.1f}", sps=f"{sps:.0f}", refresh=False)
            if global_step >= config.total_timesteps:
                break  # the final evaluation and checkpoint follow the loop
            if config.eval_freq and global_step % config.eval_freq < config.num_envs:
                run_evaluation()
            if global_step % config.checkpoint_freq < config.num_envs:
                write_checkpoint()
        loop_end = time.perf_counter()
        returns, costs = run_evaluation()
        write_checkpoint()
        agent.save(run_dir / "model.pt")
    finally:
        bar.close()
        logger.close()
        env.close()
    sps = (global_step - start_step) / (loop_end - start_time)
    update_sps = float("nan") if update_start is None else (global_step - update_start[1]) / (loop_end - update_start[0])
    print(f"final evaluation return over {len(returns)} episodes: {returns.mean():.1f} ± {returns.std():.1f}")
    print(f"steps/s: {sps:.1f} overall, {update_sps:.1f} while updating")
    print(f"run saved in {run_dir}; open the curves with: tensorboard --logdir {Path(config.runs_dir)}")
    return TrainResult(run_dir=run_dir, global_step=global_step, final_eval_returns=returns, sps=sps,
                       update_sps=update_sps, final_eval_costs=costs)
