"""Stream Q(λ) (Elsayed, Vasan & Mahmood 2024): Q-learning from one transition at a time, with ObGD.

Run:     python -m keelrl.agents.stream_q --env-id CartPole-v1
Import:  from keelrl.agents.stream_q import StreamQ, StreamQConfig, train, evaluate

The algorithm, top to bottom, on each transition (s, a, r, s') of an ε-greedy behaviour:
- δ = r + γ(1 − terminated)·max_a' Q(s', a') − Q(s, a) (bootstrapping through time limits);
- Watkins's traces: an exploratory action (one that is not greedy under Q(s, ·)) cuts the trace,
  since the returns that follow it no longer follow the greedy policy; then e ← γλe + ∇Q(s, a)
  and ObGD (κ 2) steps along δ; the trace is also reset when the episode ends;
- ε decays linearly from `start_e` to `end_e` over `exploration_fraction` of the run.
Observations are normalised, rewards scaled and a time feature appended by the env wrappers.
The training loop is in agents/streaming.py.
"""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np
import torch

from keelrl.agents.common import TrainResult, run_cli
from keelrl.agents.streaming import (
    StreamAgent,
    StreamConfig,
    Transition,
    as_tensor,
    evaluate,
    train_streaming,
    validate_stream,
)
from keelrl.networks.streaming import ObGD, StreamMLP

__all__ = ["StreamQ", "StreamQConfig", "train", "evaluate"]


@dataclasses.dataclass
class StreamQConfig(StreamConfig):
    env_id: str = "CartPole-v1"
    """gymnasium environment id with a Discrete action space (one env, flat observations)"""
    total_timesteps: int = 500_000
    """environment steps (= updates) to train for"""
    hidden_sizes: tuple[int, ...] = (32, 32)
    """hidden layer widths (Linear → LayerNorm without affine → leaky ReLU each)"""
    start_e: float = 1.0
    """ε of the ε-greedy behaviour at the start"""
    end_e: float = 0.01
    """ε at the end of the decay, kept afterwards"""
    exploration_fraction: float = 0.2
    """fraction of total_timesteps over which ε decays linearly"""


def validate(config: StreamQConfig) -> None:
    validate_stream(config)
    if not (0.0 <= config.end_e <= config.start_e <= 1.0 and 0.0 < config.exploration_fraction <= 1.0):
        raise ValueError(f"Need 0 <= --end-e <= --start-e <= 1 and --exploration-fraction in (0, 1], got "
                         f"{config.end_e}, {config.start_e} and {config.exploration_fraction}.")


class StreamQ(StreamAgent):
    """An action-value network Q(s, ·), a 2-layer LayerNorm MLP stepped by ObGD with Watkins's traces."""

    algo = "stream_q"
    config_cls = StreamQConfig

    def __init__(self, obs_dim: int, action_space: gym.Space, config: StreamQConfig):
        super().__init__(obs_dim, action_space, config)
        self.num_actions = int(action_space.n)
        self.q_network = StreamMLP(obs_dim, config.hidden_sizes, self.num_actions, config.sparsity)
        self.optimizers = {"q_network": ObGD(self.q_network.parameters(), config.lr, config.gamma, config.lam,
                                             config.kappa_value, config.adaptive, config.beta2)}
        self._decay_steps = max(1, int(config.exploration_fraction * config.total_timesteps))

    @classmethod
    def check_action_space(cls, action_space: gym.Space, env_id: str) -> None:
        if not isinstance(action_space, gym.spaces.Discrete):
            raise ValueError(f"Stream Q needs a Discrete action space; {env_id!r} has {action_space}. "
                             f"For continuous actions use stream AC: python -m keelrl.agents.stream_ac.")

    @property
    def epsilon(self) -> float:
        progress = min(1.0, self.num_updates / self._decay_steps)
        return self.config.start_e + (self.config.end_e - self.config.start_e) * progress

    def act(self, obs: np.ndarray, deterministic: bool = False) -> int:
        """ε-greedy (greedy when `deterministic`)."""
        if not deterministic and self.rng.random() < self.epsilon:
            return int(self.rng.integers(self.num_actions))
        with torch.no_grad():
            return int(self.q_network(as_tensor(obs)).argmax())

    def update(self, transition: Transition) -> dict[str, float]:
        # Q(s, ·) and Q(s', ·) in one forward pass; only Q(s, a) is differentiated
        q_values = self.q_network(torch.stack((as_tensor(transition.obs), as_tensor(transition.next_obs))))  # (2, A)
        q_numpy = q_values.detach().numpy()
        if transition.action != q_numpy[0].argmax():
            self.optimizers["q_network"].reset_trace()  # Watkins: an exploratory action cuts the trace
        bootstrap = 0.0 if transition.terminated else self.config.gamma * q_numpy[1].max()
        delta = float(transition.reward + bootstrap - q_numpy[0, transition.action])
        q_values[0, transition.action].backward()
        return {"losses/td_error": delta, "charts/epsilon": self.epsilon,
                **self.step_optimizers(delta, transition.episode_end)}


def train(config: StreamQConfig) -> TrainResult:
    """Train stream Q(λ) until `config.total_timesteps` environment steps (see agents/streaming.py)."""
    return train_streaming(StreamQ, config, validate)


if __name__ == "__main__":
    raise SystemExit(run_cli(train, StreamQConfig))
