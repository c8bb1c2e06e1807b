"""Stream AC(λ) (Elsayed, Vasan & Mahmood 2024): actor-critic from one transition at a time, with ObGD.

Run:     python -m keelrl.agents.stream_ac --env-id Hopper-v5
Import:  from keelrl.agents.stream_ac import StreamAC, StreamACConfig, train, evaluate

The algorithm, top to bottom, on each transition (s, a, r, s'):
- δ = r + γ(1 − terminated)V(s') − V(s) (bootstrapping through time limits);
- the critic's trace takes ∇V(s) and ObGD (κ 2) steps it along δ;
- the actor's trace takes ∇[log π(a|s) + c·sign(δ)·H(π(·|s))] (c the entropy coefficient) and
  ObGD (κ 3) steps it along δ; both traces are reset when the episode ends.
The policy is a Gaussian (mean, softplus std) for Box actions, a softmax for Discrete ones.
Observations are normalised, rewards scaled and a time feature appended by the env wrappers.
The training loop is in agents/streaming.py.
"""

from __future__ import annotations

import dataclasses
import math

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F

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

__all__ = ["StreamAC", "StreamACConfig", "train", "evaluate"]

@dataclasses.dataclass
class StreamACConfig(StreamConfig):
    kappa_policy: float = 3.0
    """ObGD bound κ of the policy network"""
    entropy_coef: float = 0.01
    """entropy bonus c in the policy objective log π + c·sign(δ)·H"""


def validate(config: StreamACConfig) -> None:
    validate_stream(config)
    if config.kappa_policy <= 0 or config.entropy_coef < 0:
        raise ValueError(f"--kappa-policy must be positive and --entropy-coef non-negative, got "
                         f"{config.kappa_policy} and {config.entropy_coef}.")


class StreamAC(StreamAgent):
    """A critic V(s) and a policy π(a|s), each a 2-layer LayerNorm MLP stepped by its own ObGD."""

    algo = "stream_ac"
    config_cls = StreamACConfig

    def __init__(self, obs_dim: int, action_space: gym.Space, config: StreamACConfig):
        super().__init__(obs_dim, action_space, config)
        self.continuous = isinstance(action_space, gym.spaces.Box)
        # Box: mean and pre-softplus std of each action dimension; Discrete: one logit per action
        policy_outputs = 2 * action_space.shape[0] if self.continuous else int(action_space.n)
        self.actor = StreamMLP(obs_dim, config.hidden_sizes, policy_outputs, config.sparsity)
        self.critic = StreamMLP(obs_dim, config.hidden_sizes, 1, config.sparsity)
        shared = dict(lr=config.lr, gamma=config.gamma, lam=config.lam, adaptive=config.adaptive, beta2=config.beta2)
        self.optimizers = {"critic": ObGD(self.critic.parameters(), kappa=config.kappa_value, **shared),
                           "actor": ObGD(self.actor.parameters(), kappa=config.kappa_policy, **shared)}

    @classmethod
    def check_action_space(cls, action_space: gym.Space, env_id: str) -> None:
        box = isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1
        if not box and not isinstance(action_space, gym.spaces.Discrete):
            raise ValueError(f"Stream AC needs a Box (vector) or Discrete action space; {env_id!r} has {action_space}.")

    def _gaussian(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, raw_std = self.actor(obs).chunk(2)  # (2A,) -> (A,), (A,)
        return mean, F.softplus(raw_std)

    @torch.no_grad()
    def act(self, obs: np.ndarray, deterministic: bool = False) -> np.ndarray | int:
        """A Gaussian sample (unbounded; the env clips it), its mean, or a softmax sample / argmax."""
        obs_t = as_tensor(obs)
        if self.continuous:
            mean, std = self._gaussian(obs_t)
            return (mean if deterministic else torch.normal(mean, std)).numpy()
        logits = self.actor(obs_t)
        return int(logits.argmax() if deterministic else torch.multinomial(logits.softmax(-1), 1))

    def _policy_objective(self, obs: torch.Tensor, action: np.ndarray | int, delta: float) -> torch.Tensor:
        """log π(a|s) + c·sign(δ)·H(π(·|s)) (up to a constant), whose gradient feeds the actor's trace."""
        entropy_weight = self.config.entropy_coef * math.copysign(1.0, delta)
        if self.continuous:
            # Gaussian: log π = Σ(−½z² − log σ) − const, H = Σ log σ + const, with z = (a − μ)/σ
            mean, std = self._gaussian(obs)
            sum_log_std = std.log().sum()
            squared_z = ((as_tensor(action) - mean) / std).square().sum()
            return -0.5 * squared_z + (entropy_weight - 1.0) * sum_log_std
        log_probs = self.actor(obs).log_softmax(-1)
        entropy = -(log_probs.exp() * log_probs).sum()
        return log_probs[action] + entropy_weight * entropy

    def update(self, transition: Transition) -> dict[str, float]:
        obs = as_tensor(transition.obs)
        # V(s) and V(s') in one forward pass; only V(s) is differentiated
        values = self.critic(torch.stack((obs, as_tensor(transition.next_obs))))  # (2, 1)
        value, next_value = values.detach().numpy()[:, 0]
        bootstrap = 0.0 if transition.terminated else self.config.gamma * next_value
        delta = float(transition.reward + bootstrap - value)
        (values[0, 0] + self._policy_objective(obs, transition.action, delta)).backward()
        return {"losses/td_error": delta, **self.step_optimizers(delta, transition.episode_end)}


def train(config: StreamACConfig) -> TrainResult:
    """Train stream AC(λ) until `config.total_timesteps` environment steps (see agents/streaming.py)."""
    return train_streaming(StreamAC, config, validate)


if __name__ == "__main__":
    raise SystemExit(run_cli(train, StreamACConfig))
