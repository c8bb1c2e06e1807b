"""PPO-Lag: PPO under an episode-cost constraint by Lagrangian relaxation, the Lagrangian parts as OmniSafe's
PPOLag (PKU-Alignment/omnisafe, read at 15603dd).

Run:     python -m keelrl.agents.ppo_lag --env-id keelrl/SafeHopperVelocity-v1 --cost-limit 25
Import:  from keelrl.agents.ppo_lag import PPOLag, PPOLagConfig, train, evaluate

The algorithm, top to bottom (what differs from agents/ppo.py is all in this file):
- PPO's policy, value network, normalisers, rollouts and clipped updates (CleanRL's, agents/ppo.py): `PPOLag.update`
  runs PPO's minibatch passes (`PPO.passes`) on this file's batch (`PPOLag.batch`) and Lagrangian loss
  (`PPOLag.loss`);
- a cost value network V_c (the value network's architecture) and the rollout's costs; cost advantages by GAE
  with PPO's γ and λ (OmniSafe's cost_gamma 0.99 and lam_c 0.95: configs/on-policy/PPOLag.yaml:62-66), centred
  on the rollout's mean but not scaled (omnisafe/common/buffer/onpolicy_buffer.py:232-236, standardized_cost_adv);
  costs are not normalised (PPOLag.yaml:46 cost_normalize False); V_c regresses onto the cost returns by plain
  squared error, as OmniSafe's (omnisafe/algorithms/on_policy/base/policy_gradient.py:469, mse_loss), in the joint
  loss, its gradient norm clipped apart from the policy's and value's (OmniSafe steps it with an optimiser and a
  clip of its own). PPO's clipped value loss is not used for it: it lets a value move at most clip_coef (0.2) a
  rollout, and cost returns, unnormalised, run to tens (on Pendulum with cost 1 a step, V_c reached 12.3 of its
  true 100 after 20 rollouts clipped, 77.3 unclipped); and clipped together with the policy, its large gradient
  would scale the policy's steps down;
- the policy's surrogate weighs (A_r − λ A_c) / (1 + λ), A_r PPO's advantage normalised per minibatch, as CleanRL
  does (OmniSafe normalises it once over the rollout: onpolicy_buffer.py:231-234)
  (omnisafe/algorithms/on_policy/naive_lagrange/ppo_lag.py:82-102);
- λ ≥ 0 steps once per rollout, before the update (ppo_lag.py:73-78), on the mean undiscounted cost of the
  training episodes that ended during the rollout (OmniSafe: of the last 100 episodes) against `--cost-limit`:
  by default OmniSafe's rule, Adam (lr 0.035) on −λ (J_c − d) from λ 0.001 (PPOLag.yaml:124-130; agents/lagrange.py
  AdamMultiplier), or the gradient and PID rules of agents/lagrange.py.
OmniSafe's PPO underneath differs from CleanRL's, which keelrl keeps: 20,000 steps per epoch, 40 passes over
them in minibatches of 64, stopped early once the KL after a pass exceeds 0.02, no entropy bonus, gradient norm 40, a critic weight penalty, no
reward normalisation (PPOLag.yaml:36-60). The task must report `info["cost"]` (keelrl/Safe*Velocity-v1).
`--num-seeds` trains several seeds as one batched network, each with its own cost value and λ, as PPO does.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from keelrl.agents.harness.loop import TrainResult
from keelrl.agents.harness.options import run_cli
from keelrl.agents.harness.seeds import SeedRuns
from keelrl.agents.lagrange import LagrangeOptions, build_multiplier, final_cost_lines, validate_lagrange
from keelrl.agents.ppo import (
    PPO,
    PPOConfig,
    check_action_space,
    check_observation_space,
    evaluate,
    go_on_with_the_rollout,
    resolve,
    rollout_state,
)
from keelrl.agents.ppo import validate as validate_ppo
from keelrl.buffers.rollout import RolloutBuffer, SeedRollouts, as_flat_tensors, gae
from keelrl.envs import make_vec_env
from keelrl.envs.safety import require_cost_task
from keelrl.envs.video import gym_video
from keelrl.networks import mlp, orthogonal_init_

ALGO = "ppo_lag"
__all__ = ["PPOLag", "PPOLagConfig", "train", "evaluate"]


@dataclasses.dataclass
class PPOLagConfig(LagrangeOptions, PPOConfig):
    env_id: str = "keelrl/SafeHopperVelocity-v1"
    """a task that reports info["cost"] (keelrl/Safe{Hopper,Walker2d,HalfCheetah,Ant,Humanoid,Swimmer}Velocity-v1)"""
    multiplier: Literal["gradient", "pid", "adam"] = "adam"
    """λ update: OmniSafe's Adam on −λ (cost − limit) (PPOLag.yaml:130), the gradient rule, or the PID Lagrangian"""
    lambda_init: float = 0.001
    """initial Lagrange multiplier (OmniSafe: PPOLag.yaml:126)"""
    lambda_lr: float = 0.035
    """λ's learning rate (OmniSafe: PPOLag.yaml:128)"""


def validate(config: PPOLagConfig) -> None:
    validate_ppo(config)
    validate_lagrange(config, "PPO-Lag")


class PPOLag(PPO):
    """PPO plus a cost value network and a Lagrange multiplier; takes raw observations."""

    algo = ALGO
    config_cls = PPOLagConfig

    def __init__(self, obs_dim: int, action_space: gym.Space, config: PPOLagConfig):
        super().__init__(obs_dim, action_space, config)  # PPO's networks, normalisers and optimiser
        self.cost_critic = orthogonal_init_(mlp(obs_dim, config.hidden_sizes, 1, nn.Tanh), last_gain=1.0)  # (B, 1)
        optimizer = self.optimizers["ppo"]  # V_c in a group of its own: its gradient norm is clipped apart
        optimizer.add_param_group({"params": list(self.cost_critic.parameters()),
                                   "initial_lr": optimizer.param_groups[0]["initial_lr"]})
        self.lagrange = build_multiplier(config)

    @property
    def lagrange_multiplier(self) -> torch.Tensor:
        return self.lagrange.value

    def cost_value(self, obs: torch.Tensor) -> torch.Tensor:
        """V_c(s) (B,) of standardised observations."""
        return self.cost_critic(obs)[:, 0]

    def value_networks(self) -> dict[str, nn.Module]:
        """V and V_c, by the rollout field each sums."""
        return {"rewards": self.critic, "costs": self.cost_critic}

    def batch(self, rollout: RolloutBuffer | SeedRollouts,
              next_values: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """PPO's batch plus the cost advantages, centred on the rollout's mean (a seed group's: on each seed's), and
        the cost value targets."""
        data = rollout.data
        cost_advantages, cost_returns = gae(data["costs"], data["cost_values"], data["dones"], next_values["costs"],
                                            self.config.gamma, self.config.gae_lambda)  # (T, N); a group's (S, T, N)
        centred = cost_advantages - cost_advantages.mean(axis=(-2, -1), keepdims=True)
        cost_fields = {"cost_advantages": centred, "cost_returns": cost_returns}
        return {**super().batch(rollout, next_values),
                **as_flat_tensors(cost_fields, self.device, seed_axis=self.num_seeds > 1)}

    def surrogate_advantages(self, minibatch: dict[str, torch.Tensor]) -> torch.Tensor:
        """(A_r − λ A_c) / (1 + λ) (B,), A_r PPO's normalised advantage, A_c the centred cost advantage."""
        lam = self.lagrange_multiplier
        return (self.normalized_advantages(minibatch) - lam * minibatch["cost_advantages"]) / (1.0 + lam)

    def loss(self, minibatch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The joint loss: PPO's clipped surrogate on the Lagrangian advantages − ent_coef · entropy + vf_coef ·
        PPO's value loss + vf_coef · the cost value loss ½ E[(V_c − G_c)²], unclipped (module docstring); and the
        figures to log."""
        policy_loss, entropy, stats = self.policy_loss(minibatch, self.surrogate_advantages(minibatch))
        value_loss = self.value_loss(self.value(minibatch["obs"]), minibatch["values"], minibatch["returns"])
        cost_loss = 0.5 * (self.cost_value(minibatch["obs"]) - minibatch["cost_returns"]).pow(2).mean()
        vf_coef = self.config.vf_coef
        loss = policy_loss - self.config.ent_coef * entropy + vf_coef * value_loss + vf_coef * cost_loss
        return loss, {"policy_loss": policy_loss, "value_loss": value_loss, "entropy": entropy, **stats,
                      "cost_value_loss": cost_loss}

    def update(self, rollout: RolloutBuffer | SeedRollouts,
               next_values: dict[str, np.ndarray]) -> dict[str, torch.Tensor | float]:
        """PPO's passes (`PPO.passes`) over this file's batch with its Lagrangian loss: V_c's parameter group (added
        in __init__) has its gradient norm clipped apart from the policy's and value's (each per seed); λ is logged
        with the losses. A seed group's figures are per seed, (S,)."""
        figures = self.passes(self.batch(rollout, next_values), self._loss)  # _loss: `loss` above, as PPO wraps it
        return {**figures, "losses/lagrange_multiplier": self.lagrange_multiplier.clone()}


def train(config: PPOLagConfig) -> TrainResult:
    """PPO's loop with costs: stored per step, λ stepped per rollout on the episodes that ended in it; the final
    evaluation cost is reported beside the limit (each seed of --num-seeds in its own run directory; the first
    seed's result is returned)."""
    if config.resume is None:
        require_cost_task(config.env_id, config.env_backend, "PPO-Lag")  # before `resolve` makes the env to see it
    run = SeedRuns(resolve(config, "PPO-Lag") if config.resume is None else config, ALGO, validate,
                   total="total_timesteps")
    config = run.config
    with run:  # from here on, a failure releases the run's lock, threads and signals
        env = run.group(lambda seed: make_vec_env(config.env_id, config.num_envs, seed + run.step, config.env_backend))
        check_action_space(env.single_action_space, config.env_id)
        check_observation_space(env.single_observation_space, config.env_id, "PPO-Lag")
        obs_dim = int(np.prod(env.single_observation_space.shape))
        agent = run.agent(lambda: PPOLag(obs_dim, env.single_action_space, config)).to(config.device)
        agent.statistics_on_host()
        agent.rng = run.numpy_rng()  # each seed's own generator (one seed: the one PPO made, seeded alike)
        rollout = run.group(lambda seed: RolloutBuffer(config.num_steps, config.num_envs, (obs_dim,),
                                                       env.single_action_space.shape, store_cost=True))
        obs, _ = env.reset()
        # evaluation episode i of a seed is seeded eval_seed + i (SeedRuns gives each seed its own)
        run.start(config.env_id, agent, numpy_rng=agent.rng, state=rollout_state(run, env, rollout),
                  play_evaluation=lambda agent, eval_seed: evaluate(
                      agent, config.env_id, config.eval_episodes, eval_seed),
                  video=lambda agent, eval_seed: gym_video(
                      config.env_id, lambda obs: agent.act(obs, deterministic=True), eval_seed))
        policy = agent.rollout_policy()  # taken after a resumed run's weights are loaded
        if run.resumed:
            obs = go_on_with_the_rollout(agent, policy, rollout, obs, run.checkpoint["episodes"] is not None)

        with env:
            for _ in run.steps(config.num_envs):
                obs_acted_on = agent.observe(obs)  # (N, obs_dim); a seed group's (S, N, obs_dim), and so on below
                actions, log_probs, values = policy.explore(obs_acted_on)
                next_obs, rewards, terminated, truncated, info = env.step(agent.env_actions(actions))
                rewards, costs = agent.scale_rewards(rewards, terminated | truncated), info["cost"]
                if (truncated & ~terminated).any():  # bootstrap through the time limit from the true final observation
                    bootstraps = policy.bootstraps(agent.standardized(info["final_obs"]), truncated & ~terminated,
                                                   config.gamma)
                    rewards, costs = rewards + bootstraps["rewards"], costs + bootstraps["costs"]
                rollout.add(obs=obs_acted_on, actions=actions, log_probs=log_probs, values=values["rewards"],
                            rewards=rewards, costs=costs, cost_values=values["costs"], dones=terminated | truncated)
                obs = rollout.next_obs = next_obs
                rollout.add_episode_costs(run.record_episodes(info))
                if rollout.full:  # λ first, on this rollout's finished episodes (each seed's own); then the policy
                    agent.lagrange.observe(rollout.episode_costs, run.step)
                    run.log(agent.update(rollout, policy.values(agent.standardized(obs))))
                    rollout.clear()
                    policy = agent.rollout_policy()
    return run.result(lambda seed_run: final_cost_lines(seed_run, config.cost_limit))


if __name__ == "__main__":
    raise SystemExit(run_cli(train, PPOLagConfig))
