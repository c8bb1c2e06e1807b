"""Stream Q(λ) (Elsayed, Vasan & Mahmood 2024): Q-learning from one transition at a time, with ObGD.

Run:     python -m keelrl.agents.stream_q --env-id CartPole-v1
Import:  from keelrl.agents.stream_q import StreamQ, StreamQConfig, train, evaluate

The algorithm, top to bottom, on each transition (s, a, r, s') of an ε-greedy behaviour:
- δ = r + γ(1 − terminated)·max_a' Q(s', a') − Q(s, a) (bootstrapping through time limits);
- Watkins's traces: an exploratory action (one that is not greedy under Q(s, ·)) cuts the trace,
  since the returns that follow it no longer follow the greedy policy; then e ← γλe + ∇Q(s, a)
  and ObGD (κ 2) steps along δ; the trace is also reset when the episode ends;
- ε decays linearly from `start_e` to `end_e` over `exploration_fraction` of the run.
No replay buffer and no batch: each env step is one update. Observations are normalised, rewards
scaled and a time feature appended by the env wrappers (envs/streaming_wrappers.py); their
statistics are saved with checkpoints and with the model. Runs on the CPU: a one-sample update is a
few dozen small kernel launches.
"""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np
import torch

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

__all__ = ["StreamQ", "StreamQConfig", "train", "evaluate"]

ALGO = "stream_q"


@dataclasses.dataclass
class StreamQConfig(StreamOptions, RunOptions):
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
    eval_freq: int = 20_000
    """environment steps between evaluations (0: only at the end)"""
    checkpoint_freq: int = 100_000
    """environment steps between checkpoints (the last one is always written)"""


def validate(config: StreamQConfig) -> None:
    """Reject option values no run can use, with the option's command-line name."""
    validate_stream_options(config)
    if not (0.0 <= config.end_e <= config.start_e <= 1.0 and 0.0 < config.exploration_fraction <= 1.0):
        raise ValueError(f"Need 0 <= --end-e <= --start-e <= 1 and --exploration-fraction in (0, 1], got "
                         f"{config.end_e}, {config.start_e} and {config.exploration_fraction}.")


def check_action_space(action_space: gym.Space, env_id: str) -> None:
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ValueError(f"Stream Q needs a Discrete action space; {env_id!r} has {action_space}. "
                         f"For continuous actions use stream AC: python -m keelrl.agents.stream_ac.")


def as_tensor(obs: np.ndarray) -> torch.Tensor:
    return torch.as_tensor(obs, dtype=torch.float32)


class StreamQ(SavedStreamAgent):
    """An action-value network Q(s, ·), a LayerNorm MLP stepped by ObGD with Watkins's traces, and
    the ε-greedy behaviour it learns from."""

    algo = ALGO
    config_cls = StreamQConfig

    def __init__(self, obs_dim: int, action_space: gym.Space, config: StreamQConfig):
        super().__init__()
        self.config = config
        self.obs_dim = obs_dim
        self.action_space = action_space
        self.num_actions = int(action_space.n)
        self.env_state: dict[str, dict[str, torch.Tensor]] = {}
        """normaliser statistics of the env the agent learnt on (evaluation loads them, frozen)"""
        self.rng = np.random.default_rng(config.seed)
        """exploration's generator"""
        self.num_updates = 0
        self.decay_steps = max(1, int(config.exploration_fraction * config.total_timesteps))
        self.q_network = StreamMLP(obs_dim, config.hidden_sizes, self.num_actions, config.sparsity)
        self.optimizers = {"q_network": ObGD(self.q_network.parameters(), config.lr, config.gamma, config.lam,
                                             config.kappa_value, config.adaptive, config.beta2)}

    @property
    def epsilon(self) -> float:
        progress = min(1.0, self.num_updates / self.decay_steps)
        return self.config.start_e + (self.config.end_e - self.config.start_e) * progress

    def act(self, obs: np.ndarray, deterministic: bool = False) -> int:
        """ε-greedy (greedy when `deterministic`) for one normalised observation (obs_dim,)."""
        obs_t = self.observation_tensor(obs)
        if not deterministic and self.rng.random() < self.epsilon:
            return int(self.rng.integers(self.num_actions))
        with torch.no_grad():
            return int(self.q_network(obs_t).argmax())

    def update(self, transition: Transition) -> dict[str, float]:
        """One Q(λ) step on one transition; returns the scalars to log."""
        optimizer = self.optimizers["q_network"]
        # Q(s, ·) and Q(s', ·) in one forward pass; only Q(s, a) is differentiated
        q_values = self.q_network(torch.stack((as_tensor(transition.obs), as_tensor(transition.next_obs))))  # (2, A)
        q_numpy = q_values.detach().numpy()
        if transition.action != q_numpy[0].argmax():
            optimizer.reset_trace()  # Watkins: an exploratory action cuts the trace
        bootstrap = 0.0 if transition.terminated else self.config.gamma * q_numpy[1].max()
        delta = float(transition.reward + bootstrap - q_numpy[0, transition.action])
        q_values[0, transition.action].backward()
        # e ← γλe + ∇Q(s, a); θ ← θ + ηδe with the overshooting bound on η; e ← 0 at an episode end
        step_size = optimizer.step(delta, reset=transition.episode_end)
        optimizer.zero_grad()
        logged = {"losses/td_error": delta, "charts/epsilon": self.epsilon, "losses/q_network_step_size": step_size}
        self.num_updates += 1
        return logged

    def start_episode(self) -> None:
        """Forget the trace of the episode before (done by the episode's last update; the training loop
        calls this when a resumed run restarts its env mid-episode)."""
        self.optimizers["q_network"].reset_trace()


def evaluate(agent: StreamQ, env_id: str, episodes: int = 10, seed: int = 0,
             deterministic: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Undiscounted returns and costs of `episodes` episodes of the greedy policy, on an env with the
    agent's normaliser statistics, frozen; episode i is seeded seed + i."""
    env = frozen_stream_env(stream_env_for(agent.config, env_id), agent.env_state)
    return stream_returns_and_costs(env, lambda obs: agent.act(obs, deterministic=deterministic), episodes, seed)


def train(config: StreamQConfig) -> TrainResult:
    """Act, step, update on that one transition, until `config.total_timesteps` environment steps.

    A resumed run starts a fresh episode (the env is reseeded from the step it resumes at): the
    trace, the reward scaler's return trace and the time feature start from zero, as after any
    episode end. The normalisers' statistics, adaptive ObGD's second moments and ε carry on.
    """
    run = Run(config, ALGO, validate, total="total_timesteps")
    config = run.config
    with run:  # from here on, a failure releases the run's lock, threads and signals
        with stream_env_for(config) as env:
            check_action_space(env.unwrapped.action_space, config.env_id)
            agent = StreamQ(env.observation_space.shape[0], env.unwrapped.action_space, config)
            eval_seed = evaluation_seed(config.seed, config.eval_episodes)  # evaluation episode i: eval_seed + i

            def play_evaluation(agent: StreamQ, eval_seed: int) -> tuple[np.ndarray, np.ndarray]:
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
    raise SystemExit(run_cli(train, StreamQConfig))
