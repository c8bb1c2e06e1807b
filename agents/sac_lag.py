"""SAC-Lag: SAC under an episode-cost constraint by Lagrangian relaxation (Ray et al. 2019; Ha et al. 2020).

Run:     python -m keelrl.agents.sac_lag --env-id keelrl/SafeHopperVelocity-v1 --cost-limit 25
Import:  from keelrl.agents.sac_lag import SACLag, SACLagConfig, train, evaluate

The algorithm, top to bottom (what differs from agents/sac.py is all in this file):
- SAC's twin reward critics, tanh-Gaussian actor and autotuned α, unchanged;
- a cost critic ensemble regresses onto c + γ(1 − terminated) Q_c,target(s', a'), a' ~ π(·|s'), and its
  target follows by Polyak averaging after every step;
- the actor descends (α log π(a|s) − min Q_r(s, a) + λ Q_c(s, a)) / (1 + λ), a ~ π(·|s);
- λ >= 0 steps on (mean cost − `cost_limit`) of the training episodes that end at a vector-env step,
  once per such step and never on the gradient updates in between (gradient or PID; agents/lagrange.py
  gives the exact rule and how it differs from OmniSafe's);
- the loop is SAC's, with each step's cost stored in the replay buffer and finished episodes' costs fed to λ.
The task must report `info["cost"]` (keelrl/Safe*Velocity-v1, or an env in keelrl.envs.CostWrapper).
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import torch

from keelrl.agents.harness import Run, TrainResult, run_cli
from keelrl.agents.lagrange import LagrangeOptions, build_multiplier, lagrangian_actor_loss, validate_lagrange
from keelrl.agents.sac import SAC, SACConfig, evaluate, resolve
from keelrl.agents.sac import validate as validate_sac
from keelrl.buffers import Batch, ReplayBuffer
from keelrl.envs import make_vec_env, require_box_actions
from keelrl.envs.video import gym_video
from keelrl.networks import build_critic, frozen, loss_function, make_optimizer, optimizer_step, soft_update

ALGO = "sac_lag"
__all__ = ["SACLag", "SACLagConfig", "train", "evaluate"]


@dataclasses.dataclass
class SACLagConfig(LagrangeOptions, SACConfig):
    env_id: str = "keelrl/SafeHopperVelocity-v1"
    """a task that reports info["cost"] (keelrl/Safe{Hopper,Walker2d,HalfCheetah,Ant,Humanoid,Swimmer}Velocity-v1)"""


def validate(config: SACLagConfig) -> None:
    validate_sac(config)
    validate_lagrange(config, "SAC-Lag")


class SACLag(SAC):
    """SAC plus a cost critic and a Lagrange multiplier; takes raw observations."""

    algo = ALGO
    config_cls = SACLagConfig

    def __init__(self, obs_dim: int, action_low: np.ndarray, action_high: np.ndarray, config: SACLagConfig):
        super().__init__(obs_dim, action_low, action_high, config)  # SAC's networks and optimisers
        # the cost critic: the reward critic's architecture with one scalar output per member, its own target
        self.cost_critic = build_critic(config, obs_dim, len(action_low), num_outputs=1)
        self.cost_critic_target = copy.deepcopy(self.cost_critic).requires_grad_(False)
        self.cost_polyak_target = list(self.cost_critic_target.parameters())
        self.cost_polyak_online = list(self.cost_critic.parameters())
        self.lagrange = build_multiplier(config)
        self.optimizers["cost_critic"] = make_optimizer(list(self.cost_critic.parameters()), config.optimizer,
                                                        config.q_lr, config.weight_decay)
        self._cost_critic_loss = loss_function(self.cost_critic_loss, config.precision, config.device,
                                               config.compile, config.cudagraphs)

    @property
    def lagrange_multiplier(self) -> torch.Tensor:
        return self.lagrange.value

    def observe_episode_costs(self, episode_costs: np.ndarray, global_step: int) -> None:
        """One λ step on the mean undiscounted cost of the training episodes that ended at this vector-env
        step (the only place λ changes), unless global_step <= lambda_warmup."""
        if global_step > self.config.lambda_warmup:
            self.lagrange.update(float(np.mean(episode_costs)))

    def learn(self, batch: Batch) -> dict[str, torch.Tensor]:
        """SAC's update (with the Lagrangian actor loss below), then one cost critic step on a' ~ π(·|s')."""
        losses = super().learn(batch)
        losses.update(self.cost_critic_step(batch))
        return losses

    def actor_loss(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(α log π(a|s) − min Q_r(s, a) + λ Q_c(s, a)) / (1 + λ), a ~ π(·|s), and the detached log π(a|s)."""
        actions, log_prob = self.actor.sample(obs)
        q_pi = self.head.value(self.critic(obs, actions)).min(dim=0).values  # (E, B) -> (B,)
        cost_q = self.cost_critic(obs, actions).squeeze(-1).mean(dim=0)  # (E, B, 1) -> (B,): the ensemble's mean
        return lagrangian_actor_loss(self.alpha * log_prob - q_pi, cost_q, self.lagrange_multiplier), log_prob.detach()

    def update_actor_and_alpha(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        with frozen(self.cost_critic):  # the actor loss needs gradients w.r.t. actions only
            return super().update_actor_and_alpha(obs)

    def cost_critic_loss(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Every cost critic's squared error against c + γ(1 − terminated) Q_c,target(s', a'), a' ~ π(·|s'),
        summed, and the cost critics' outputs (E, B)."""
        with torch.no_grad():
            next_actions, _ = self.actor.sample(batch.next_obs)  # the actor after this update's actor step
            next_cost_q = self.cost_critic_target(batch.next_obs, next_actions).squeeze(-1).mean(dim=0)  # (B,)
            target = batch.costs + batch.discounts * (1.0 - batch.terminated) * next_cost_q
        cost_q = self.cost_critic(batch.obs, batch.actions).squeeze(-1)  # (E, B, 1) -> (E, B)
        return (cost_q - target).pow(2).mean(dim=1).sum(), cost_q.detach()

    def cost_critic_step(self, batch: Batch) -> dict[str, torch.Tensor]:
        """One optimiser step of the cost critics, then their targets follow by Polyak averaging."""
        cost_loss, cost_q = self._cost_critic_loss(batch)
        optimizer_step(self.optimizers["cost_critic"], cost_loss, self.cost_critic)
        soft_update(self.cost_polyak_target, self.cost_polyak_online, self.config.tau)
        return {"losses/cost_qf_loss": cost_loss.detach() / cost_q.shape[0], "losses/cost_qf_values": cost_q.mean(),
                "losses/lagrange_multiplier": self.lagrange.value.clone()}


def train(config: SACLagConfig) -> TrainResult:
    """SAC's loop with costs: stored per step, fed to λ per batch of finished episodes; the final evaluation
    cost is reported beside the limit."""
    if config.resume is None:
        config = resolve(config)
    run = Run(config, ALGO, validate, total="total_timesteps")
    config = run.config
    env = make_vec_env(config.env_id, config.num_envs, config.seed + run.step, config.env_backend)
    require_box_actions(env, "SAC-Lag")
    obs_dim = int(np.prod(env.single_observation_space.shape))
    low, high = env.single_action_space.low, env.single_action_space.high
    agent = SACLag(obs_dim, low, high, config).to(config.device)
    buffer = ReplayBuffer(config.buffer_size, (obs_dim,), low.shape, config.num_envs, config.device, config.n_step,
                          config.gamma, store_cost=True, seed=config.seed)
    action_rng = np.random.default_rng(config.seed)
    if run.resumed:
        run.restore(agent, action_rng, replay=buffer)  # the interrupted episodes end where the checkpoint cut them
        if agent.reward_scaler is not None:
            agent.reward_scaler.reset_returns()

    # after the restore: a damaged checkpoint fails before the logs are cut back to it
    run.open(config.env_id, video=gym_video(config.env_id, lambda obs: agent.act(obs, deterministic=True),
                                            config.seed + 10_000))

    def write_checkpoint() -> None:
        run.save_checkpoint(agent, action_rng, replay=buffer)

    def run_evaluation() -> tuple[np.ndarray, np.ndarray]:
        returns, costs = evaluate(agent, config.env_id, config.eval_episodes, config.seed + 10_000)
        run.evaluation(returns, costs)
        return returns, costs

    losses = {}
    obs, _ = env.reset()
    with run:
        try:
            while not run.done:
                if config.normalize_obs:
                    agent.obs_norm.update(torch.as_tensor(obs))
                if run.step < config.learning_starts:
                    actions = action_rng.uniform(low, high, (config.num_envs, *low.shape)).astype(np.float32)
                else:
                    actions = agent.act(obs)
                with run.stepping_env(actions, config.num_envs):
                    next_obs, rewards, terminated, truncated, info = env.step(actions)
                buffer.add(obs, actions, rewards, info["final_obs"], terminated, truncated, info["cost"])
                if agent.reward_scaler is not None:
                    agent.reward_scaler.update(rewards, terminated | truncated)
                obs = next_obs
                run.advance(config.num_envs)
                episode_costs = run.vector_episodes(info)
                if len(episode_costs):
                    agent.observe_episode_costs(episode_costs, run.step)
                if run.step > config.learning_starts:
                    run.updates_began()
                    for _ in range(config.num_envs * config.utd):
                        losses = agent.update(buffer.sample(config.batch_size))
                run.log(losses)
                run.periodic(run_evaluation, write_checkpoint)
            returns, costs = run.finish(run_evaluation, write_checkpoint, agent.save)
        finally:
            env.close()
    verdict = "met" if costs.mean() <= config.cost_limit else "NOT met"
    run.report(returns, f"steps/s: {run.loop_speed():.1f} overall, {run.update_speed():.1f} while updating",
               f"final evaluation cost over {len(costs)} episodes: {costs.mean():.1f} ± {costs.std():.1f} "
               f"(cost limit {config.cost_limit:g}: {verdict})")
    return run.result(returns, costs)


if __name__ == "__main__":
    raise SystemExit(run_cli(train, SACLagConfig))
