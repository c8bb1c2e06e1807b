"""Stream TD(λ) (Elsayed, Vasan & Mahmood 2024): learns the value of a fixed policy from one
transition at a time, with ObGD, and reports its error against Monte-Carlo returns.

Run:     python -m keelrl.agents.stream_td --env-id CartPole-v1 --policy random
         python -m keelrl.agents.stream_td --env-id CartPole-v1 --policy runs/CartPole-v1__stream_q__1__.../model.pt
Import:  from keelrl.agents.stream_td import StreamTD, StreamTDConfig, train, value_error

The algorithm, top to bottom, on each transition (s, a, r, s') of the given policy:
- δ = r + γ(1 − terminated)V(s') − V(s) (bootstrapping through time limits);
- e ← γλe + ∇V(s) and ObGD (κ 2) steps along δ; the trace is reset when the episode ends.
The prediction error of an episode is the RMSE between the predictions V(s_t) made on the way
(before each update) and the discounted returns G_t of the (scaled) rewards that followed them.
The policy is uniform random, or the deterministic policy of a stream AC / stream Q model,
whose observation statistics the run then uses, frozen.
The training loop is in agents/streaming.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from keelrl.agents.common import TrainResult, run_cli
from keelrl.agents.stream_ac import StreamAC
from keelrl.agents.stream_q import StreamQ
from keelrl.agents.streaming import (
    StreamAgent,
    StreamConfig,
    Transition,
    as_tensor,
    evaluate,
    run_episodes,
    train_streaming,
    validate_stream,
)
from keelrl.envs.streaming_wrappers import stream_wrapper
from keelrl.networks.streaming import ObGD, StreamMLP

__all__ = ["StreamTD", "StreamTDConfig", "train", "evaluate", "value_error", "monte_carlo_errors"]

POLICY_AGENTS = {agent_cls.algo: agent_cls for agent_cls in (StreamAC, StreamQ)}
UNSEEN_TAIL_WEIGHT = 0.01
"""After a time-limit truncation, steps whose unseen return is discounted by more than this are left out."""


@dataclasses.dataclass
class StreamTDConfig(StreamConfig):
    env_id: str = "CartPole-v1"
    """gymnasium environment id (one env, flat observations)"""
    total_timesteps: int = 100_000
    """environment steps (= updates) to train for"""
    hidden_sizes: tuple[int, ...] = (32, 32)
    """hidden layer widths (Linear → LayerNorm without affine → leaky ReLU each)"""
    policy: str = "random"
    """the policy to evaluate: "random" (uniform actions) or the model.pt of a stream_ac or stream_q run"""


def load_policy(path: str) -> StreamAgent:
    """The stream AC or stream Q agent saved at `path`."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"--policy {path}: no such file; give 'random' or the model.pt of a stream_ac "
                                f"or stream_q run.")
    try:
        algo = torch.load(path, map_location="cpu", weights_only=True).get("algo")
    except Exception:  # torch raises several types for a corrupt or foreign file
        algo = None
    if algo not in POLICY_AGENTS:
        raise ValueError(f"--policy {path}: not the model.pt of a stream_ac or stream_q run (found {algo!r}).")
    return POLICY_AGENTS[algo].load(path)


def monte_carlo_errors(values: list[float], rewards: list[float], gamma: float, terminated: bool) -> np.ndarray:
    """V(s_t) − G_t over one episode, G_t the discounted return of the rewards from step t on.

    After a truncation G_t misses the rewards beyond the time limit, so only the steps whose
    missing tail is discounted by at most UNSEEN_TAIL_WEIGHT are kept.
    """
    returns = np.empty(len(rewards))
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = rewards[t] + gamma * running
        returns[t] = running
    errors = np.asarray(values) - returns
    if terminated:
        return errors
    steps_to_end = np.arange(len(rewards), 0, -1)
    return errors[gamma**steps_to_end <= UNSEEN_TAIL_WEIGHT]


def rmse(errors: np.ndarray) -> float:
    return float(np.sqrt(np.mean(errors**2))) if len(errors) else float("nan")


class StreamTD(StreamAgent):
    """A value network V(s), a 2-layer LayerNorm MLP stepped by ObGD, and the policy it evaluates."""

    algo = "stream_td"
    config_cls = StreamTDConfig

    def __init__(self, obs_dim: int, action_space: gym.Space, config: StreamTDConfig):
        super().__init__(obs_dim, action_space, config)
        self.critic = StreamMLP(obs_dim, config.hidden_sizes, 1, config.sparsity)
        self.optimizers = {"critic": ObGD(self.critic.parameters(), config.lr, config.gamma, config.lam,
                                          config.kappa_value, config.adaptive, config.beta2)}
        self.policy = None if config.policy == "random" else load_policy(config.policy)
        self._episode_values: list[float] = []
        self._episode_rewards: list[float] = []
        self.last_episode_rmse = float("nan")

    @classmethod
    def check_action_space(cls, action_space: gym.Space, env_id: str) -> None:
        if not isinstance(action_space, (gym.spaces.Box, gym.spaces.Discrete)):
            raise ValueError(f"Stream TD's random policy needs a Box or Discrete action space; {env_id!r} has "
                             f"{action_space}.")

    def prepare_env(self, env: gym.Env) -> None:
        """A loaded policy sees observations as it was trained on them: its statistics, frozen."""
        if self.policy is None:
            return
        policy_config = self.policy.config
        same_inputs = [(name, getattr(policy_config, name), getattr(self.config, name))
                       for name in ("env_id", "normalize_obs", "time_feature")]
        for name, policy_value, own_value in same_inputs:
            if policy_value != own_value:
                raise ValueError(f"--policy {self.config.policy} was trained with --{name.replace('_', '-')} "
                                 f"{policy_value}, this run has {own_value}: use the same value.")
        normalizer = stream_wrapper(env, "obs_normalizer")
        if normalizer is not None:
            normalizer.load_state_dict(self.policy.env_state["obs_normalizer"])
            normalizer.training = False

    def act(self, obs: np.ndarray, deterministic: bool = False) -> np.ndarray | int:
        """The evaluated policy's action (`deterministic` is ignored: the policy is what it is)."""
        if self.policy is not None:
            return self.policy.act(obs, deterministic=True)
        if isinstance(self.action_space, gym.spaces.Discrete):
            return int(self.rng.integers(self.action_space.n))
        return self.rng.uniform(self.action_space.low, self.action_space.high).astype(np.float32)

    def start_episode(self) -> None:
        """Reset the traces, and drop the predictions and rewards kept for an unfinished episode's RMSE."""
        super().start_episode()
        self._episode_values, self._episode_rewards = [], []

    @torch.no_grad()
    def predict(self, obs: np.ndarray) -> float:
        """V(s) for one normalised observation."""
        return float(self.critic(as_tensor(obs)))

    def update(self, transition: Transition) -> dict[str, float]:
        # V(s) and V(s') in one forward pass; only V(s) is differentiated
        values = self.critic(torch.stack((as_tensor(transition.obs), as_tensor(transition.next_obs))))  # (2, 1)
        value, next_value = values.detach().numpy()[:, 0]
        bootstrap = 0.0 if transition.terminated else self.config.gamma * next_value
        delta = float(transition.reward + bootstrap - value)
        values[0, 0].backward()
        self._record(float(value), transition)
        return {"losses/td_error": delta, "charts/value_rmse": self.last_episode_rmse,
                **self.step_optimizers(delta, transition.episode_end)}

    def _record(self, value: float, transition: Transition) -> None:
        """Keep the episode's predictions and rewards; score them when it ends."""
        self._episode_values.append(value)
        self._episode_rewards.append(transition.reward)
        if transition.episode_end:
            errors = monte_carlo_errors(self._episode_values, self._episode_rewards, self.config.gamma,
                                        transition.terminated)
            if len(errors):
                self.last_episode_rmse = rmse(errors)
            self._episode_values, self._episode_rewards = [], []

    def evaluation(self, env_id: str, episodes: int, seed: int) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
        """The policy's returns and costs, and the value error over the same episodes."""
        returns, costs, rmse = value_error(self, env_id, episodes, seed)
        return returns, costs, {"eval/value_rmse": rmse}


def value_error(agent: StreamTD, env_id: str, episodes: int = 10, seed: int = 0) -> tuple[np.ndarray, np.ndarray, float]:
    """Returns and costs of `episodes` episodes of the policy, and the RMSE of the (frozen) value
    network against their discounted returns, over the steps of every episode."""
    returns, costs, errors = [], [], []
    values, rewards, cost = [], [], 0.0
    for obs, reward, terminated, truncated, info in run_episodes(agent, env_id, episodes, seed):
        values.append(agent.predict(obs))
        rewards.append(reward)
        cost += info.get("cost", 0.0)
        if terminated or truncated:
            errors.append(monte_carlo_errors(values, rewards, agent.config.gamma, terminated))
            returns.append(float(info["episode"]["r"]))
            costs.append(cost)
            values, rewards, cost = [], [], 0.0
    return np.array(returns), np.array(costs), rmse(np.concatenate(errors))


def train(config: StreamTDConfig) -> TrainResult:
    """Train stream TD(λ) until `config.total_timesteps` environment steps (see agents/streaming.py)."""
    return train_streaming(StreamTD, config, validate_stream)


if __name__ == "__main__":
    raise SystemExit(run_cli(train, StreamTDConfig))
