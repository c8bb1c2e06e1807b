"""SAC-Lag: SAC under an episode-cost constraint by Lagrangian relaxation (Ray et al. 2019; Ha et al. 2020).

Run:     python -m keelrl.agents.sac_lag --env-id keelrl/SafeHopperVelocity-v1 --cost-limit 25
Import:  from keelrl.agents.sac_lag import SACLag, SACLagConfig, train, evaluate

The algorithm, top to bottom (what differs from agents/sac.py is all in this file):
- SAC's twin reward critics, tanh-Gaussian actor and autotuned α, unchanged;
- a cost critic ensemble regresses onto c + γ(1 − terminated) Q_c,target(s', a'), a' ~ π(·|s'), and its
  target follows by Polyak averaging after every step;
- the actor descends (α log π(a|s) − min Q_r(s, a) + λ Q_c(s, a)) / (1 + λ), a ~ π(·|s);
- λ >= 0 steps on (mean cost − `cost_limit`) of the training episodes that end at a vector-env step,
  once per such step and never on the gradient updates in between (gradient, Adam or PID; agents/lagrange.py
  gives the exact rules and how they differ from OmniSafe's);
- the loop is SAC's, with each step's cost stored in the replay buffer and finished episodes' costs fed to λ;
  `--num-seeds` trains several seeds as one batched network, each with its own cost critic and λ, as SAC does.
The task must report `info["cost"]` (keelrl/Safe*Velocity-v1, or an env in keelrl.envs.CostWrapper).
OmniSafe's SACLag (PKU-Alignment/omnisafe, read at 15603dd), whose figures the leaderboard shows beside keelrl's,
is configured differently underneath (keelrl keeps CleanRL's SAC): α fixed at 0.2, not tuned
(configs/off-policy/SACLag.yaml:74-76); critic learning rate 3e-4 for both critics, not 1e-3 (:120); learning
from step 10,000, not 5,000 (:62); costs normalised (:48) and gradient norms clipped at 40 (:52), neither here;
one actor step every second update, after which every target network moves, the cost critic's too
(algorithms/off_policy/ddpg.py:398-400), where keelrl takes CleanRL's two actor steps every second update and
moves the targets after every update; one cost critic, not an ensemble (models/actor_critic/
constraint_actor_q_critic.py:77), whose target takes the online actor's deterministic action at s' (ddpg.py:471),
not an action sampled from π.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from keelrl.agents.harness.loop import TrainResult
from keelrl.agents.harness.options import run_cli
from keelrl.agents.harness.seeds import SeedRuns
from keelrl.agents.lagrange import CostCritic, LagrangeOptions, build_multiplier, final_cost_lines, validate_lagrange
from keelrl.agents.lagrange import lagrangian_actor_loss
from keelrl.agents.sac import SAC, SACConfig, evaluate, resolve
from keelrl.agents.sac import validate as validate_sac
from keelrl.buffers import Batch, ReplayBuffer
from keelrl.envs import make_vec_env, require_box_actions
from keelrl.envs.video import gym_video
from keelrl.networks import frozen, loss_function, optimizer_step, soft_update

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
        self.cost = CostCritic(config, obs_dim, len(action_low), config.q_lr)
        self.optimizers["cost_critic"] = self.cost.optimizer
        self.lagrange = build_multiplier(config)
        self._cost_loss = loss_function(self.cost_loss, config.precision, config.device,
                                        config.compile or config.cudagraphs, seeds_of=self)

    @property
    def lagrange_multiplier(self) -> torch.Tensor:
        return self.lagrange.value

    def learn(self, batch: Batch) -> dict[str, torch.Tensor]:
        return {**super().learn(batch), "losses/lagrange_multiplier": self.lagrange.value.clone()}

    def learn_step(self, batch: Batch, actor_step: bool, target_step: bool) -> dict[str, torch.Tensor]:
        """SAC's reward critic step, `policy_frequency` Lagrangian actor/α steps when `actor_step`, the reward
        critics' target update when `target_step`, then one cost critic step on a' ~ π(·|s') of the actor just
        updated (its target follows at once; with --cudagraphs, all of it recorded in one graph)."""
        losses = self.update_critic(batch)
        if actor_step:
            for _ in range(self.config.policy_frequency):
                losses.update(self.update_actor_and_alpha(batch.obs))
        if target_step:
            soft_update(self.polyak_target, self.polyak_online, self.config.tau)
        noise = self.random.normal(*batch.rewards.shape[-1:], self.action_low.shape[-1])
        cost_loss, cost_q = self._cost_loss(batch, noise)  # a seed group: (S,), (S, E, B)
        return {**losses, **self.cost.step(cost_loss, cost_q)}

    def cost_loss(self, batch: Batch, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The cost critic's loss and values (`CostCritic.loss`) with a' ~ π(·|s') drawn with `noise` (B, A)."""
        with torch.no_grad():
            next_actions = self.actor.sample(batch.next_obs, noise)[0]
        return self.cost.loss(batch, next_actions)

    def actor_loss(self, obs: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(α log π(a|s) − min Q_r(s, a) + λ Q_c(s, a)) / (1 + λ), a ~ π(·|s) drawn with `noise`, and the detached
        log π(a|s)."""
        actions, log_prob = self.actor.sample(obs, noise)
        q_pi = self.head.value(self.critic(obs, actions)).min(dim=0).values  # (E, B) -> (B,)
        return lagrangian_actor_loss(self.alpha * log_prob - q_pi, self.cost(obs, actions),
                                     self.lagrange_multiplier), log_prob.detach()

    def update_actor_and_alpha(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        """One step of the Lagrangian actor loss through frozen reward and cost critics, then SAC's α step on its
        log-probs."""
        noise = self.random.normal(*obs.shape[-2:-1], self.action_low.shape[-1])
        with frozen(self.critic), frozen(self.cost):  # the actor loss needs gradients w.r.t. actions only
            actor_loss, log_prob = self._actor_loss(obs, noise)  # a seed group: (S,), (S, B)
        optimizer_step(self.optimizers["actor"], actor_loss, self.actor)
        return {"losses/actor_loss": actor_loss.detach(), **self.update_alpha(log_prob)}


def train(config: SACLagConfig) -> TrainResult:
    """SAC's loop with costs: stored per step, fed to λ per batch of finished episodes; the final evaluation
    cost is reported beside the limit (each seed of --num-seeds in its own run directory; the first seed's result
    is returned)."""
    run = SeedRuns(resolve(config) if config.resume is None else config, ALGO, validate, total="total_timesteps")
    config = run.config
    with run:  # from here on, a failure releases the run's lock, threads and signals
        env = run.group(lambda seed: make_vec_env(config.env_id, config.num_envs, seed + run.step, config.env_backend))
        require_box_actions(env, "SAC-Lag")
        obs_dim = int(np.prod(env.single_observation_space.shape))
        low, high = env.single_action_space.low, env.single_action_space.high
        agent = run.agent(lambda: SACLag(obs_dim, low, high, config)).to(config.device)  # a seed axis for S seeds
        buffer = run.group(lambda seed: ReplayBuffer(config.buffer_size, (obs_dim,), low.shape, config.num_envs,
                                                     config.device, config.n_step, config.gamma, store_cost=True,
                                                     seed=seed))
        action_rng = run.numpy_rng()
        # evaluation episode i of a seed is seeded eval_seed + i (SeedRuns gives each seed its own)
        run.start(config.env_id, agent, numpy_rng=action_rng, replay=buffer,
                  play_evaluation=lambda agent, eval_seed: evaluate(
                      agent, config.env_id, config.eval_episodes, eval_seed),
                  video=lambda agent, eval_seed: gym_video(
                      config.env_id, lambda obs: agent.act(obs, deterministic=True), eval_seed))
        if run.resumed and agent.reward_scaler is not None:
            agent.reward_scaler.reset_returns()  # the return trace of the interrupted episodes

        obs, _ = env.reset()
        with env:
            for global_step in run.steps(config.num_envs):
                if config.normalize_obs:
                    agent.obs_norm.update(torch.as_tensor(obs))
                if global_step < config.learning_starts:
                    # (N, A); a seed group's generators draw one (N, A) block per seed: (S, N, A)
                    actions = action_rng.uniform(low, high, (config.num_envs, *low.shape)).astype(np.float32)
                else:
                    actions = agent.act(obs)
                next_obs, rewards, terminated, truncated, info = env.step(actions)
                buffer.add(obs, actions, rewards, info["final_obs"], terminated, truncated, info["cost"])
                if agent.reward_scaler is not None:
                    agent.reward_scaler.update(rewards, terminated | truncated)
                obs = next_obs
                agent.lagrange.observe(run.record_episodes(info), run.step)  # the costs of the episodes just ended
                if global_step >= config.learning_starts:
                    for _ in range(config.num_envs * config.utd):
                        run.log(agent.update(buffer.sample(config.batch_size)))
    return run.result(lambda seed_run: final_cost_lines(seed_run, config.cost_limit))


if __name__ == "__main__":
    raise SystemExit(run_cli(train, SACLagConfig))
