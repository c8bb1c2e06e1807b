"""Stream AC(λ) (Elsayed, Vasan & Mahmood 2024): actor-critic from one transition at a time, with ObGD.

Run:     python -m keelrl.agents.stream_ac --env-id Hopper-v5
Import:  from keelrl.agents.stream_ac import StreamAC, StreamACConfig, train, evaluate

The algorithm, top to bottom, on each transition (s, a, r, s'):
- δ = r + γ(1 − terminated)V(s') − V(s) (bootstrapping through time limits);
- the critic's trace takes ∇V(s) and ObGD (κ 2) steps it along δ;
- the actor's trace takes ∇[log π(a|s) + c·sign(δ)·H(π(·|s))] (c the entropy coefficient) and
  ObGD (κ 3) steps it along δ; both traces are reset when the episode ends.
The policy is a Gaussian (mean, softplus std) for Box actions, a softmax for Discrete ones.
No replay buffer and no batch: each env step is one update. Observations are normalised, rewards
scaled and a time feature appended by the env wrappers (envs/streaming_wrappers.py); their
statistics are saved with checkpoints and with the model. Runs on the CPU: a one-sample update is a
few dozen small kernel launches.
"""

from __future__ import annotations

import dataclasses
import math

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F

from keelrl.agents.harness.loop import Run, TrainResult
from keelrl.agents.harness.options import RunOptions, evaluation_seed, run_cli
from keelrl.agents.harness.saved_agent import SavedStreamAgent
from keelrl.agents.stream_options import StreamOptions, validate_stream_options
from keelrl.envs.streaming_wrappers import (
    Transition,
    frozen_stream_env,
    load_stream_env_state,
    stream_env_for,
    stream_env_state,
    stream_returns_and_costs,
)
from keelrl.envs.video import VideoSource
from keelrl.networks.streaming import ObGD, StreamMLP

__all__ = ["StreamAC", "StreamACConfig", "train", "evaluate"]

ALGO = "stream_ac"


@dataclasses.dataclass
class StreamACConfig(StreamOptions, RunOptions):
    env_id: str = "Hopper-v5"
    """gymnasium environment id (one env, flat observations; Box or Discrete actions)"""
    total_timesteps: int = 1_000_000
    """environment steps (= updates) to train for"""
    kappa_policy: float = 3.0
    """ObGD bound κ of the policy network"""
    entropy_coef: float = 0.01
    """entropy bonus c in the policy objective log π + c·sign(δ)·H"""
    hidden_sizes: tuple[int, ...] = (128, 128)
    """hidden layer widths of both networks (Linear → LayerNorm without affine → leaky ReLU each)"""
    eval_freq: int = 20_000
    """environment steps between evaluations (0: only at the end)"""
    checkpoint_freq: int = 100_000
    """environment steps between checkpoints (the last one is always written)"""


def validate(config: StreamACConfig) -> None:
    """Reject option values no run can use, with the option's command-line name."""
    validate_stream_options(config)
    if config.kappa_policy <= 0 or config.entropy_coef < 0:
        raise ValueError(f"--kappa-policy must be positive and --entropy-coef non-negative, got "
                         f"{config.kappa_policy} and {config.entropy_coef}.")


def check_action_space(action_space: gym.Space, env_id: str) -> None:
    box = isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1
    if not box and not isinstance(action_space, gym.spaces.Discrete):
        raise ValueError(f"Stream AC needs a Box (vector) or Discrete action space; {env_id!r} has {action_space}.")


def as_tensor(obs: np.ndarray) -> torch.Tensor:
    return torch.as_tensor(obs, dtype=torch.float32)


class StreamAC(SavedStreamAgent):
    """A policy π(a|s) and a critic V(s), each a LayerNorm MLP stepped by its own ObGD."""

    algo = ALGO
    config_cls = StreamACConfig

    def __init__(self, obs_dim: int, action_space: gym.Space, config: StreamACConfig):
        super().__init__()
        self.config = config
        self.obs_dim = obs_dim
        self.action_space = action_space
        self.continuous = isinstance(action_space, gym.spaces.Box)
        self.env_state: dict[str, dict[str, torch.Tensor]] = {}
        """normaliser statistics of the env the agent learnt on (evaluation loads them, frozen)"""
        self.rng = np.random.default_rng(config.seed)
        """a numpy generator saved with checkpoints (the policy samples with torch's generator)"""
        self.num_updates = 0
        # Box: mean and pre-softplus std of each action dimension; Discrete: one logit per action
        policy_outputs = 2 * action_space.shape[0] if self.continuous else int(action_space.n)
        self.actor = StreamMLP(obs_dim, config.hidden_sizes, policy_outputs, config.sparsity)
        self.critic = StreamMLP(obs_dim, config.hidden_sizes, 1, config.sparsity)
        shared = dict(lr=config.lr, gamma=config.gamma, lam=config.lam, adaptive=config.adaptive, beta2=config.beta2)
        self.optimizers = {"critic": ObGD(self.critic.parameters(), kappa=config.kappa_value, **shared),
                           "actor": ObGD(self.actor.parameters(), kappa=config.kappa_policy, **shared)}

    def _gaussian(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, raw_std = self.actor(obs).chunk(2)  # (2A,) -> (A,), (A,)
        return mean, F.softplus(raw_std)

    @torch.no_grad()
    def act(self, obs: np.ndarray, deterministic: bool = False) -> np.ndarray | int:
        """A Gaussian sample (unbounded; the env clips it), its mean, or a softmax sample / argmax."""
        obs_t = self.observation_tensor(obs)
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
        """One AC(λ) step of both networks on one transition; returns the scalars to log."""
        obs = as_tensor(transition.obs)
        # V(s) and V(s') in one forward pass; only V(s) is differentiated
        values = self.critic(torch.stack((obs, as_tensor(transition.next_obs))))  # (2, 1)
        value, next_value = values.detach().numpy()[:, 0]
        bootstrap = 0.0 if transition.terminated else self.config.gamma * next_value
        delta = float(transition.reward + bootstrap - value)
        # one backward pass fills both gradients: ∇V(s) for the critic, ∇(policy objective) for the actor
        (values[0, 0] + self._policy_objective(obs, transition.action, delta)).backward()
        logged = {"losses/td_error": delta}
        # each network: e ← γλe + ∇; θ ← θ + ηδe, η under its own bound κ; e ← 0 at an episode end
        for name, optimizer in self.optimizers.items():
            logged[f"losses/{name}_step_size"] = optimizer.step(delta, reset=transition.episode_end)
            optimizer.zero_grad()
        self.num_updates += 1
        return logged

    def start_episode(self) -> None:
        """Forget the traces of the episode before (done by the episode's last update; the training loop
        calls this when a resumed run restarts its env mid-episode)."""
        for optimizer in self.optimizers.values():
            optimizer.reset_trace()


def evaluate(agent: StreamAC, env_id: str, episodes: int = 10, seed: int = 0,
             deterministic: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Undiscounted returns and costs of `episodes` episodes of the deterministic policy (the Gaussian's
    mean, or the argmax), on an env with the agent's normaliser statistics, frozen; episode i is seeded
    seed + i."""
    env = frozen_stream_env(stream_env_for(agent.config, env_id), agent.env_state)
    return stream_returns_and_costs(env, lambda obs: agent.act(obs, deterministic=deterministic), episodes, seed)


def train(config: StreamACConfig) -> TrainResult:
    """Act, step, update on that one transition, until `config.total_timesteps` environment steps.

    A resumed run starts a fresh episode (the env is reseeded from the step it resumes at): the
    traces, the reward scaler's return trace and the time feature start from zero, as after any
    episode end. The normalisers' statistics and adaptive ObGD's second moments carry on.
    """
    run = Run(config, ALGO, validate, total="total_timesteps")
    config = run.config
    with run:  # from here on, a failure releases the run's lock, threads and signals
        with stream_env_for(config) as env:
            check_action_space(env.unwrapped.action_space, config.env_id)
            agent = StreamAC(env.observation_space.shape[0], env.unwrapped.action_space, config)
            eval_seed = evaluation_seed(config.seed, config.eval_episodes)  # evaluation episode i: eval_seed + i

            def play_evaluation(agent: StreamAC, eval_seed: int) -> tuple[np.ndarray, np.ndarray]:
                """Evaluate on the statistics the agent learnt so far (also what model.pt keeps)."""
                agent.env_state = stream_env_state(env)
                return evaluate(agent, config.env_id, config.eval_episodes, eval_seed)

            run.start(config.env_id, agent, play_evaluation, numpy_rng=agent.rng,
                      state={"env": (lambda: stream_env_state(env), lambda saved: load_stream_env_state(env, saved))},
                      video=VideoSource(
                          lambda: frozen_stream_env(stream_env_for(config, rendering=True), agent.env_state),
                          lambda obs: agent.act(obs, deterministic=True), eval_seed))
            obs, _ = env.reset(seed=config.seed + run.step)
            agent.start_episode()  # a checkpoint's mid-episode trace does not belong to this new episode
            episode_cost = 0.0
            for _ in run.steps():
                action = agent.act(obs)
                next_obs, reward, terminated, truncated, info = env.step(action)
                episode_end = terminated or truncated
                run.log(agent.update(Transition(obs, action, float(reward), next_obs, terminated, episode_end)))
                obs = next_obs
                episode_cost += info.get("cost", 0.0)
                if episode_end:
                    run.record_episode(info["episode"]["r"], int(info["episode"]["l"]), episode_cost)
                    obs, _ = env.reset()
                    episode_cost = 0.0
    return run.result()


if __name__ == "__main__":
    raise SystemExit(run_cli(train, StreamACConfig))
