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
whose observation statistics the run then uses, frozen. Rewards are scaled and a time feature
appended by the env wrappers (envs/streaming_wrappers.py), as for the control agents.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from keelrl.agents.harness.loop import Run, TrainResult
from keelrl.agents.harness.options import RunOptions, evaluation_seed, run_cli
from keelrl.agents.harness.saved_agent import SavedStreamAgent, saved_config
from keelrl.agents.stream_options import StreamOptions, validate_stream_options
from keelrl.agents.stream_ac import StreamAC
from keelrl.agents.stream_q import StreamQ
from keelrl.envs.streaming_wrappers import (
    Transition,
    frozen_stream_env,
    load_stream_env_state,
    space_from_dict,
    stream_env_for,
    stream_env_state,
    stream_episodes,
    stream_returns_and_costs,
    stream_wrapper,
)
from keelrl.envs.video import VideoSource
from keelrl.networks.streaming import ObGD, StreamMLP

__all__ = ["StreamTD", "StreamTDConfig", "train", "evaluate", "value_error", "monte_carlo_errors"]

ALGO = "stream_td"
POLICY_AGENTS = {"stream_ac": StreamAC, "stream_q": StreamQ}
"""The agents whose saved model can be the evaluated policy, by the algo name model.pt records."""
UNSEEN_TAIL_WEIGHT = 0.01
"""After a time-limit truncation, steps whose unseen return is discounted by more than this are left out."""


@dataclasses.dataclass
class StreamTDConfig(StreamOptions, RunOptions):
    env_id: str = "CartPole-v1"
    """gymnasium environment id (one env, flat observations)"""
    total_timesteps: int = 100_000
    """environment steps (= updates) to train for"""
    policy: str = "random"
    """the policy to evaluate: "random" (uniform actions) or the model.pt of a stream_ac or stream_q run"""
    hidden_sizes: tuple[int, ...] = (32, 32)
    """hidden layer widths (Linear → LayerNorm without affine → leaky ReLU each)"""
    eval_freq: int = 20_000
    """environment steps between evaluations (0: only at the end)"""
    checkpoint_freq: int = 100_000
    """environment steps between checkpoints (the last one is always written)"""


def validate(config: StreamTDConfig) -> None:
    """Reject option values no run can use, with the option's command-line name."""
    validate_stream_options(config)


def check_action_space(action_space: gym.Space, env_id: str) -> None:
    if not isinstance(action_space, (gym.spaces.Box, gym.spaces.Discrete)):
        raise ValueError(f"Stream TD's random policy needs a Box or Discrete action space; {env_id!r} has "
                         f"{action_space}.")


def load_policy(path: str) -> StreamAC | StreamQ:
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


def as_tensor(obs: np.ndarray) -> torch.Tensor:
    return torch.as_tensor(obs, dtype=torch.float32)


class StreamTD(SavedStreamAgent):
    """A value network V(s), a LayerNorm MLP stepped by ObGD, and the policy it evaluates."""

    algo = ALGO
    config_cls = StreamTDConfig

    def __init__(self, obs_dim: int, action_space: gym.Space, config: StreamTDConfig,
                 policy: StreamAC | StreamQ | None = None):
        """`policy`: the agent whose value is learnt (default: --policy's, 'random' or loaded from its model.pt)."""
        super().__init__()
        self.config = config
        self.obs_dim = obs_dim
        self.action_space = action_space
        self.env_state: dict[str, dict[str, torch.Tensor]] = {}
        """normaliser statistics of the env the agent learnt on (evaluation loads them, frozen)"""
        self.rng = np.random.default_rng(config.seed)
        """the random policy's generator"""
        self.num_updates = 0
        self.critic = StreamMLP(obs_dim, config.hidden_sizes, 1, config.sparsity)
        self.optimizers = {"critic": ObGD(self.critic.parameters(), config.lr, config.gamma, config.lam,
                                          config.kappa_value, config.adaptive, config.beta2)}
        self.policy = policy if policy is not None or config.policy == "random" else load_policy(config.policy)
        self.episode_values: list[float] = []
        """this episode's predictions V(s_t), scored against its returns when it ends"""
        self.episode_rewards: list[float] = []
        self.last_episode_rmse = float("nan")

    def model_file(self) -> dict[str, Any]:
        """SavedStreamAgent's, with what rebuilds the evaluated policy around its weights (among the networks, as
        `policy.*`): model.pt loads (and evaluates) without the policy's own file."""
        model_file = super().model_file()
        if self.policy is not None:
            model_file["policy"] = {name: value for name, value in self.policy.model_file().items()
                                    if name != "networks"}
        return model_file

    @classmethod
    def from_model_file(cls, state: dict[str, Any]) -> StreamTD:
        if "policy" not in state:  # the random policy, or a model.pt from before the policy was kept in it
            return super().from_model_file(state)
        networks = {name.removeprefix("policy."): tensor for name, tensor in state["networks"].items()
                    if name.startswith("policy.")}
        policy = POLICY_AGENTS[state["policy"]["algo"]].from_model_file({**state["policy"], "networks": networks})
        agent = cls(state["obs_dim"], space_from_dict(state["action_space"]),
                    saved_config(cls.config_cls, state["config"]), policy)
        agent.load_state_dict(state["networks"])
        agent.env_state = state["env_state"]
        return agent

    def act(self, obs: np.ndarray, deterministic: bool = False) -> np.ndarray | int:
        """The evaluated policy's action (`deterministic` is ignored: the policy is what it is)."""
        if self.policy is not None:
            return self.policy.act(obs, deterministic=True)
        if isinstance(self.action_space, gym.spaces.Discrete):
            return int(self.rng.integers(self.action_space.n))
        return self.rng.uniform(self.action_space.low, self.action_space.high).astype(np.float32)

    @torch.no_grad()
    def predict(self, obs: np.ndarray) -> float:
        """V(s) for one normalised observation."""
        return float(self.critic(as_tensor(obs)))

    def update(self, transition: Transition) -> dict[str, float]:
        """One TD(λ) step on one transition; returns the scalars to log."""
        optimizer = self.optimizers["critic"]
        # V(s) and V(s') in one forward pass; only V(s) is differentiated
        values = self.critic(torch.stack((as_tensor(transition.obs), as_tensor(transition.next_obs))))  # (2, 1)
        value, next_value = values.detach().numpy()[:, 0]
        bootstrap = 0.0 if transition.terminated else self.config.gamma * next_value
        delta = float(transition.reward + bootstrap - value)
        values[0, 0].backward()
        self._record(float(value), transition)
        # e ← γλe + ∇V(s); θ ← θ + ηδe with the overshooting bound on η; e ← 0 at an episode end
        step_size = optimizer.step(delta, reset=transition.episode_end)
        optimizer.zero_grad()
        self.num_updates += 1
        return {"losses/td_error": delta, "charts/value_rmse": self.last_episode_rmse,
                "losses/critic_step_size": step_size}

    def _record(self, value: float, transition: Transition) -> None:
        """Keep the episode's predictions and rewards; score them when it ends."""
        self.episode_values.append(value)
        self.episode_rewards.append(transition.reward)
        if transition.episode_end:
            errors = monte_carlo_errors(self.episode_values, self.episode_rewards, self.config.gamma,
                                        transition.terminated)
            if len(errors):
                self.last_episode_rmse = rmse(errors)
            self.episode_values, self.episode_rewards = [], []

    def start_episode(self) -> None:
        """Forget the trace, predictions and rewards of the episode before (the episode's last update does;
        the training loop calls this when a resumed run restarts its env mid-episode)."""
        self.optimizers["critic"].reset_trace()
        self.episode_values, self.episode_rewards = [], []


def use_policy_statistics(env: gym.Env, agent: StreamTD) -> None:
    """A loaded policy sees observations as it was trained on them: its normaliser statistics, frozen."""
    config, policy_config = agent.config, agent.policy.config
    for name in ("env_id", "normalize_obs", "time_feature"):
        policy_value, own_value = getattr(policy_config, name), getattr(config, name)
        if policy_value != own_value:
            raise ValueError(f"--policy {config.policy} was trained with --{name.replace('_', '-')} {policy_value}, "
                             f"this run has {own_value}: use the same value.")
    normalizer = stream_wrapper(env, "obs_normalizer")
    if normalizer is not None:
        normalizer.load_state_dict(agent.policy.env_state["obs_normalizer"])
        normalizer.training = False


def evaluate(agent: StreamTD, env_id: str, episodes: int = 10, seed: int = 0,
             deterministic: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Undiscounted returns and costs of `episodes` episodes of the evaluated policy, on an env with the
    agent's normaliser statistics, frozen; episode i is seeded seed + i."""
    env = frozen_stream_env(stream_env_for(agent.config, env_id), agent.env_state)
    return stream_returns_and_costs(env, lambda obs: agent.act(obs, deterministic=deterministic), episodes, seed)


def value_error(agent: StreamTD, env_id: str, episodes: int = 10, seed: int = 0) -> tuple[np.ndarray, np.ndarray, float]:
    """Returns and costs of `episodes` episodes of the policy (as `evaluate`), and the RMSE of the
    (frozen) value network against their discounted returns, over the steps of every episode."""
    env = stream_env_for(agent.config, env_id)
    load_stream_env_state(env, agent.env_state)
    returns, costs, errors = [], [], []
    values, rewards, cost = [], [], 0.0
    steps = stream_episodes(env, lambda obs: agent.act(obs, deterministic=True), episodes, seed)
    for obs, reward, terminated, truncated, info in steps:
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
    """Act with the policy, step, update V on that one transition, until `config.total_timesteps`
    environment steps.

    A resumed run starts a fresh episode (the env is reseeded from the step it resumes at): the
    trace, the episode's predictions, the reward scaler's return trace and the time feature start
    from zero, as after any episode end. The normalisers' statistics and adaptive ObGD's second
    moments carry on.
    """
    run = Run(config, ALGO, validate, total="total_timesteps")
    config = run.config
    with run:  # from here on, a failure releases the run's lock, threads and signals
        with stream_env_for(config) as env:
            check_action_space(env.unwrapped.action_space, config.env_id)
            agent = StreamTD(env.observation_space.shape[0], env.unwrapped.action_space, config)
            if agent.policy is not None:
                use_policy_statistics(env, agent)
            value_rmses = []  # of every evaluation
            eval_seed = evaluation_seed(config.seed, config.eval_episodes)  # evaluation episode i: eval_seed + i

            def play_evaluation(agent: StreamTD, eval_seed: int) -> tuple[np.ndarray, np.ndarray]:
                """Evaluate on the statistics the agent learnt so far (also what model.pt keeps)."""
                agent.env_state = stream_env_state(env)
                returns, costs, value_rmse = value_error(agent, config.env_id, config.eval_episodes, eval_seed)
                run.logger.scalars({"eval/value_rmse": value_rmse}, run.step)
                value_rmses.append(value_rmse)
                return returns, costs

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
    return run.result(f"final eval/value_rmse: {value_rmses[-1]:.4f}")


if __name__ == "__main__":
    raise SystemExit(run_cli(train, StreamTDConfig))
