"""What CQL, IQL and RIQL share: the offline run options, agent plumbing and the training loop.

The offline loop collects nothing: it loads a dataset in the D4RL layout (optionally corrupted, as in
RIQL's benchmark), fits the observation statistics to it, then updates on uniform batches, logs
losses every `log_freq` updates, evaluates the deterministic policy in the dataset's environment
(raw return and D4RL-normalised score), and checkpoints, until `total_updates`.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import time
from pathlib import Path
from typing import Any, ClassVar, Literal

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from keelrl.agents.common import (
    CHECKPOINT_FILE,
    DEFAULT_THREADS,
    RunLogger,
    TrainResult,
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
from keelrl.agents.off_policy import OffPolicyAgent, evaluate
from keelrl.buffers import Batch
from keelrl.buffers.corruption import corrupt_dataset
from keelrl.buffers.offline import (
    DatasetBuffer,
    DatasetInfo,
    check_env_matches,
    episode_ends,
    episode_returns,
    load_dataset_with_info,
    normalized_score,
    reference_scores,
)
from keelrl.envs import make_vec_env
from keelrl.networks import RunningObsNorm

ATTACKABLE_ALGOS = ("cql", "iql", "riql")


@dataclasses.dataclass
class OfflineConfig:
    dataset: str = "keelrl/hopper-medium-v0"
    """Minari dataset id (made by keelrl.benchmarks.make_datasets), a Minari dataset directory, or a D4RL-layout .hdf5/.npz"""
    data_path: str | None = None
    """Minari datasets root to look ids up in (default: $MINARI_DATASETS_PATH, else ~/.minari/datasets)"""
    env_id: str | None = None
    """evaluation environment (default: the one the dataset records; needed for .hdf5/.npz files)"""
    seed: int = 1
    """seed of python, numpy, torch, the batch sampler, the corruption and the evaluation envs"""
    total_updates: int = 1_000_000
    """gradient updates to train for"""
    batch_size: int = 256
    """transitions per gradient update"""
    gamma: float = 0.99
    """discount factor"""
    tau: float = 0.005
    """target network Polyak rate"""
    normalize_obs: bool = True
    """standardise observations by the dataset's mean and std (saved with the model)"""
    normalize_reward: bool = False
    """scale rewards by 1000 / (max − min episode return in the dataset), CORL's MuJoCo reward normalisation"""
    drop_timeout_transitions: bool = False
    """drop the last transition of time-limit episodes as D4RL's qlearning_dataset does (keelrl keeps them)"""
    corruption: Literal["obs", "act", "reward", "dynamics"] | None = None
    """corrupt one field of the dataset (RIQL's benchmark): observations, actions, rewards or next observations"""
    corruption_rate: float = 0.3
    """fraction of transitions corrupted"""
    corruption_range: float = 1.0
    """corruption scale: noise in ±range · std (rewards: ±range · 30), or the attack's bound"""
    corruption_mode: Literal["random", "adversarial"] = "random"
    """random noise, or perturbations that minimise the Q-values of --attack-model"""
    attack_model: str | None = None
    """model.pt of a keelrl offline agent (cql, iql, riql) trained on the clean data: the critic adversarial mode attacks"""
    eval_freq: int = 5_000
    """updates between evaluations (0: only at the end)"""
    eval_episodes: int = 10
    """episodes per evaluation (deterministic policy)"""
    checkpoint_freq: int = 50_000
    """updates between checkpoints (the last one is always written)"""
    log_freq: int = 1_000
    """updates between loss logs (losses stay on the device in between)"""
    threads: int = DEFAULT_THREADS
    """torch CPU threads (1 is robust to other busy processes; 2 is faster on an idle 2-core machine)"""
    device: str = "cpu"
    """torch device for networks and dataset"""
    runs_dir: str = "runs"
    """parent directory of run directories"""
    resume: str | None = None
    """continue the run in this directory to its total_updates (its saved config is used)"""
    quiet: bool = False
    """no progress bar"""


def validate_offline(config: OfflineConfig) -> None:
    """Reject option values no run can use, with the option's command-line name."""
    for name in ("total_updates", "batch_size", "eval_episodes", "checkpoint_freq", "log_freq", "threads"):
        if getattr(config, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(config, name)}.")
    if config.eval_freq < 0:
        raise ValueError(f"--eval-freq must be non-negative, got {config.eval_freq}.")
    if not 0.0 < config.gamma <= 1.0 or not 0.0 < config.tau <= 1.0:
        raise ValueError(f"--gamma and --tau must lie in (0, 1], got {config.gamma} and {config.tau}.")
    if not 0.0 <= config.corruption_rate <= 1.0 or config.corruption_range <= 0:
        raise ValueError(f"--corruption-rate must lie in [0, 1] and --corruption-range be positive, "
                         f"got {config.corruption_rate} and {config.corruption_range}.")
    if config.corruption_mode == "adversarial" and config.corruption in ("obs", "act", "dynamics") \
            and config.attack_model is None:
        raise ValueError(f"--corruption-mode adversarial --corruption {config.corruption} attacks a critic: give "
                         f"--attack-model, the model.pt of a keelrl offline agent trained on the clean dataset.")
    if config.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {config.device}: torch sees no CUDA GPU on this machine; use --device cpu.")


class OfflineAgent(nn.Module):
    """What the offline agents share: dataset observation statistics, optimiser steps, Polyak
    averaging, acting on raw numpy observations, the critic seen by an adversarial attack, save/load.

    Subclasses set `algo` and `config_cls`, build networks and optimisers in `__init__`, and
    implement `policy(obs, deterministic)`, `q_value(obs, actions)` and `learn(batch)` on
    normalised observations. `update(batch)` normalises, then calls `learn`.
    """

    algo: ClassVar[str]
    config_cls: ClassVar[type]

    def __init__(self, obs_dim: int, action_low: np.ndarray, action_high: np.ndarray, config: OfflineConfig):
        super().__init__()
        self.config = config
        self.obs_dim = obs_dim
        self.register_buffer("action_low", torch.as_tensor(action_low, dtype=torch.float32))
        self.register_buffer("action_high", torch.as_tensor(action_high, dtype=torch.float32))
        self.obs_norm = RunningObsNorm(obs_dim, clip=None, eps=1e-3, eps_on="std") if config.normalize_obs else nn.Identity()  # as CORL, RIQL
        self.optimizers: dict[str, torch.optim.Optimizer] = {}
        self.num_updates = 0

    # acting on numpy, checkpoints and optimiser steps work as for the online agents
    act = OffPolicyAgent.act
    save = OffPolicyAgent.save
    load = OffPolicyAgent.__dict__["load"]
    training_state = OffPolicyAgent.training_state
    load_training_state = OffPolicyAgent.load_training_state
    optimize = OffPolicyAgent.optimize

    def policy(self, obs: torch.Tensor, deterministic: bool) -> torch.Tensor:
        """Actions for normalised observations: sampled, or the policy's mode."""
        raise NotImplementedError

    def q_value(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """The pessimistic Q-value (B,) of normalised observations and actions."""
        raise NotImplementedError

    def learn(self, batch: Batch) -> dict[str, torch.Tensor]:
        """One update on a batch of normalised observations; returns detached scalars."""
        raise NotImplementedError

    def observation_statistics_data(self, data: dict[str, np.ndarray]) -> np.ndarray:
        """The observations the normaliser is fitted to (RIQL adds the next observations)."""
        return data["observations"]

    def fit_normalizer(self, data: dict[str, np.ndarray]) -> None:
        if self.config.normalize_obs:
            self.obs_norm.update(torch.as_tensor(self.observation_statistics_data(data)))

    def set_optimizers(self, learning_rates: dict[str, tuple[list[nn.Parameter], float]]) -> None:
        """One fused Adam per named group of parameters (all of a group's tensors in one kernel)."""
        for name, (params, lr) in learning_rates.items():
            self.optimizers[name] = torch.optim.Adam(params, lr=lr, fused=True)
            for group in self.optimizers[name].param_groups:
                group["initial_lr"] = lr

    def polyak(self, online: list[torch.Tensor], target: list[torch.Tensor]) -> None:
        with torch.no_grad():
            torch._foreach_lerp_(target, online, self.config.tau)

    def update(self, batch: Batch) -> dict[str, torch.Tensor]:
        if self.config.normalize_obs:
            batch = batch._replace(obs=self.obs_norm(batch.obs), next_obs=self.obs_norm(batch.next_obs))
        losses = self.learn(batch)
        self.num_updates += 1
        return losses

    def attack_q(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Q-values (B,) of raw observations, differentiable in both inputs (for adversarial corruption)."""
        return self.q_value(self.obs_norm(obs), actions)

    def attack_policy(self, obs: torch.Tensor) -> torch.Tensor:
        """Deterministic actions of raw observations, differentiable in them."""
        return self.policy(self.obs_norm(obs), deterministic=True)


def cosine_factor(step: int, total: int) -> float:
    """Cosine decay from 1 to 0 over `total` steps (CORL's CosineAnnealingLR on IQL's actor)."""
    return 0.5 * (1.0 + math.cos(math.pi * min(step, total) / total))


def normalize_rewards(data: dict[str, np.ndarray], ends: np.ndarray,
                      max_episode_steps: int = 1000) -> tuple[dict[str, np.ndarray], float]:
    """Rewards scaled by max_episode_steps / (max − min episode return) (CORL's MuJoCo normalisation);
    episodes end where `ends` is True (see `episode_ends`)."""
    returns = episode_returns(data, ends)
    spread = float(returns.max() - returns.min())
    if spread <= 0:
        raise ValueError(f"--normalize-reward needs episodes with different returns; this dataset's "
                         f"{len(returns)} episode(s) all return {returns[0]:.6g}.")
    scale = max_episode_steps / spread
    return {**data, "rewards": data["rewards"] * np.float32(scale)}, scale


def load_attack_model(path: str) -> OfflineAgent:
    """The keelrl offline agent saved at `path`, whatever its algorithm."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"--attack-model {path}: no such file.")
    state = torch.load(path, map_location="cpu", weights_only=True)
    algo = state.get("algo") if isinstance(state, dict) else None
    if algo not in ATTACKABLE_ALGOS:
        raise ValueError(f"--attack-model {path} is a {algo!r} model; adversarial corruption attacks the critic "
                         f"of a keelrl offline agent ({', '.join(ATTACKABLE_ALGOS)}).")
    agent_cls = getattr(importlib.import_module(f"keelrl.agents.{algo}"), algo.upper())
    return agent_cls.load(path).requires_grad_(False)


def prepare_dataset(config: OfflineConfig) -> tuple[dict[str, np.ndarray], DatasetInfo, dict[str, Any]]:
    """The training data (corrupted if asked), its info, and a summary for dataset.json."""
    data, info = load_dataset_with_info(config.dataset, config.data_path, config.drop_timeout_transitions)
    env_id = config.env_id or info.env_id
    ends = episode_ends(data, _max_episode_steps(env_id))  # of the clean data: corruption moves observations
    summary: dict[str, Any] = {
        "source": info.source, "env_id": env_id, "transitions": len(data["rewards"]),
        "episodes": int(ends.sum()), "behaviour_return": float(episode_returns(data, ends).mean()), "corruption": None,
    }
    if config.corruption is not None:
        attacker = load_attack_model(config.attack_model) if config.attack_model else None
        data, indices = corrupt_dataset(
            data, config.corruption, config.corruption_rate, config.corruption_range, config.corruption_mode,
            seed=config.seed, q_function=None if attacker is None else attacker.attack_q,
            policy=None if attacker is None else attacker.attack_policy,
        )
        summary["corruption"] = {"kind": config.corruption, "mode": config.corruption_mode,
                                 "rate": config.corruption_rate, "range": config.corruption_range,
                                 "corrupted_transitions": len(indices)}
    if config.normalize_reward:
        data, summary["reward_scale"] = normalize_rewards(data, ends)
    return data, info, summary


def _max_episode_steps(env_id: str | None) -> int | None:
    """The time limit of a registered environment (None when unknown)."""
    if env_id is None or env_id not in gym.registry:
        return None
    return gym.spec(env_id).max_episode_steps


def _env_spaces(env_id: str):
    env = make_vec_env(env_id, num_envs=1, seed=0)
    spaces = env.single_observation_space, env.single_action_space
    env.close()
    return spaces


def train_offline(agent_cls: type[OfflineAgent], config: OfflineConfig, validate) -> TrainResult:
    """Update on the dataset, log, evaluate and checkpoint until `total_updates` gradient updates."""
    algo = agent_cls.algo
    config, run_dir, checkpoint = start_or_resume(config, algo, validate,
                                                  checkpoint_keys=("global_step", "agent", "rng", "sampler"))
    set_threads(config.threads)
    seed_everything(config.seed)
    data, info, summary = prepare_dataset(config)
    env_id = config.env_id or info.env_id
    if env_id is None:
        raise ValueError(f"{config.dataset} does not record its environment: give --env-id to evaluate in.")
    observation_space, action_space = _env_spaces(env_id)
    check_env_matches(data, env_id, (observation_space, action_space))
    references = reference_scores(info, env_id)
    summary["ref_scores"] = references
    if run_dir is None:
        run_dir = new_run_dir(config.runs_dir, env_id, algo, config.seed)
        save_config(run_dir, algo, config)
        (run_dir / "dataset.json").write_text(json.dumps(summary, indent=2))
    agent = agent_cls(int(np.prod(observation_space.shape)), action_space.low, action_space.high, config)
    agent.fit_normalizer(data)
    agent.to(config.device)
    buffer = DatasetBuffer(data, config.gamma, config.device, seed=config.seed)
    numpy_rng = np.random.default_rng(config.seed)  # no numpy randomness in the loop; kept for rng_state
    step = 0
    if checkpoint is not None:
        with restoring(run_dir / CHECKPOINT_FILE):
            agent.load_training_state(checkpoint["agent"])
            restore_rng_state(checkpoint["rng"], numpy_rng)
            buffer.generator.set_state(checkpoint["sampler"])
            step = int(checkpoint["global_step"])

    def write_checkpoint() -> None:
        save_checkpoint(run_dir / CHECKPOINT_FILE, {
            "algo": algo, "global_step": step, "agent": agent.training_state(), "rng": rng_state(numpy_rng),
            "sampler": buffer.generator.get_state(),
        })

    def run_evaluation() -> tuple[np.ndarray, float]:
        returns, costs = evaluate(agent, env_id, config.eval_episodes, config.seed + 10_000)
        logger.evaluation(step, returns, costs)
        score = float("nan") if references is None else float(normalized_score(returns, *references).mean())
        logger.scalars({"eval/normalized_score": score}, step)
        return returns, score

    logger = RunLogger(run_dir, resume_step=None if checkpoint is None else step)
    bar = progress_bar(config.total_updates, step, config.quiet)
    start_step, update_time, losses, score = step, 0.0, {}, float("nan")
    try:
        while step < config.total_updates:
            tick = time.perf_counter()
            losses = agent.update(buffer.sample(config.batch_size))
            update_time += time.perf_counter() - tick
            step += 1
            bar.update(1)
            if step % config.log_freq == 0:
                ups = (step - start_step) / update_time
                logger.scalars({**losses, "charts/SPS": ups}, step)
                bar.set_postfix(score=f"{score:.1f}", ups=f"{ups:.0f}", refresh=False)
            if step >= config.total_updates:
                break  # the final evaluation and checkpoint follow the loop
            if config.eval_freq and step % config.eval_freq == 0:
                _, score = run_evaluation()
            if step % config.checkpoint_freq == 0:
                write_checkpoint()
        returns, score = run_evaluation()
        write_checkpoint()
        agent.save(run_dir / "model.pt")
    finally:
        bar.close()
        logger.close()
    ups = (step - start_step) / max(update_time, 1e-9)
    print(f"final evaluation return over {len(returns)} episodes: {returns.mean():.1f} ± {returns.std():.1f}"
          f" (normalised score {score:.1f})")
    if step > start_step:
        print(f"updates/s: {ups:.1f} ({1000 / ups:.2f} ms per update)")
    else:
        print(f"no updates left: the run had already reached its {config.total_updates} updates")
    print(f"run saved in {run_dir}; open the curves with: tensorboard --logdir {Path(config.runs_dir)}")
    return TrainResult(run_dir=run_dir, global_step=step, final_eval_returns=returns, sps=ups, update_sps=ups)
