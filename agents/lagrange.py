"""What the Lagrangian agents share: SAC-Lag's and TD3-Lag's options, the cost critic and the Lagrangian actor
loss, and the Lagrange multipliers (PPO-Lag's too).

A constrained agent maximises the return subject to J_c = E[episode cost] <= d (`--cost-limit`):
    max_π min_{λ>=0}  J_r(π) − λ (J_c(π) − d).
- The policy step descends (−Q_r(s, π(s)) + λ Q_c(s, π(s))) / (1 + λ): the cost critic Q_c estimates
  the discounted future cost, and dividing by 1 + λ keeps the loss (and Adam's step) on the scale of
  the reward loss however large λ grows.
- λ >= 0 descends the loss −λ (J_c − d): it rises while episodes cost more than the limit and falls
  (down to 0) while they cost less. When it steps: once per batch of finished training episodes, i.e.
  after each vector-env step at which at least one training episode ended (the loops of sac_lag.py and
  td3_lag.py call `Multiplier.observe`), and never otherwise: not per gradient update, not per epoch. J_c is the
  mean undiscounted cost of the episodes that ended at that step (with --num-envs 1: the one episode's
  cost); each episode counts in exactly one step. λ steps from the first episode on, also while
  actions are still random (before --learning-starts), unless `--lambda-warmup` holds it back.
  `--multiplier gradient` is a plain projected gradient step, no optimiser object and no momentum:
      λ ← max(0, λ + lambda_lr (J_c − d))   (lambda_lr 1e-3, no upper bound);
  `--multiplier pid` is Stooke et al.'s (2020) PID Lagrangian, stepped at the same moments:
      I ← max(0, I + k_i (J_c − d)),   λ = max(0, k_p (J_c − d) + I + k_d max(0, J_c − J_c,previous)),
  whose proportional and derivative terms damp the oscillation of the pure integral (gradient) form.
- λ stays at `--lambda-init` while global_step <= `--lambda-warmup` (environment steps, all envs).
No step divides by the limit, so a zero limit (no unsafe step allowed) is a valid setting.

How this differs from OmniSafe (PKU-Alignment/omnisafe, read at commit 15603dd):
- omnisafe/algorithms/off_policy/sac_lag.py and td3_lag.py step λ in `_update()`, which
  omnisafe/algorithms/off_policy/ddpg.py `learn()` calls once per `update_cycle` (1) environment
  steps once past `start_learning_steps`; the step is skipped until `epoch > warmup_epochs` (100 epochs
  of 2000 steps), and J_c is `logger.get_stats('Metrics/EpCost')[0]`, the mean cost of the last
  `window_lens` (10) finished episodes, so the same episodes drive many consecutive steps.
  omnisafe/common/lagrange.py `Lagrange.update_lagrange_multiplier` takes that step with a torch
  optimiser on −λ (J_c − d) (configs/off-policy/SACLag.yaml and TD3Lag.yaml: Adam, lambda_lr 1e-5,
  λ init 0.001), then clamps λ to [0, upper bound]. keelrl steps far less often (once per batch of
  finished episodes), on only those episodes' costs, by plain gradient steps, with a larger lr.
- OmniSafe's on-policy Lagrangian agents (on_policy/naive_lagrange/ppo_lag.py) step once per epoch,
  before the policy update, on the same windowed mean (window 100; Adam, lambda_lr 0.035).
- OmniSafe's PID variant (omnisafe/common/pid_lagrange.py `PIDLagrangian.pid_update`, called by
  off_policy/sac_pid.py and td3_pid.py exactly as above): see `PIDMultiplier`.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from keelrl.agents.harness.options import require_non_negative
from keelrl.buffers import Batch
from keelrl.envs.safety import require_cost_task
from keelrl.networks import build_critic, make_optimizer, optimizer_step, soft_update


@dataclasses.dataclass
class LagrangeOptions:
    cost_limit: float = 25.0
    """largest allowed undiscounted episode cost (25: the Safety-Gymnasium/OmniSafe benchmark budget)"""
    multiplier: Literal["gradient", "pid", "adam"] = "gradient"
    """λ update: projected gradient ascent on episode cost − limit, the PID Lagrangian, or Adam on −λ (cost −
    limit) with λ clamped at 0 (OmniSafe's Lagrange)"""
    lambda_init: float = 0.0
    """initial Lagrange multiplier"""
    lambda_lr: float = 1e-3
    """gradient multiplier's step: λ moves by lambda_lr × (mean cost of the episodes just ended − limit); the Adam
    multiplier's learning rate"""
    pid_kp: float = 0.1
    """PID multiplier: proportional gain on episode cost − limit"""
    pid_ki: float = 0.01
    """PID multiplier: integral gain"""
    pid_kd: float = 0.01
    """PID multiplier: derivative gain on the rise of the episode cost"""
    lambda_warmup: int = 0
    """λ stays at lambda_init for episodes that end at global_step <= lambda_warmup (environment steps)"""


def validate_lagrange(config: LagrangeOptions, agent: str) -> None:
    """Reject option values no constrained run can use, and tasks without a cost (`config` also has env_id and
    env_backend)."""
    if not config.cost_limit >= 0:  # also catches NaN
        raise ValueError(f"--cost-limit must be a non-negative number (the largest allowed episode cost; 0 allows "
                         f"no unsafe step), got {config.cost_limit}.")
    require_non_negative(config, "lambda_init", "lambda_lr", "pid_kp", "pid_ki", "pid_kd", "lambda_warmup")
    require_cost_task(config.env_id, config.env_backend, agent)


class Multiplier(nn.Module):
    """λ, the buffer `value`; `observe` is where it steps (`update`, by the rule of the subclass)."""

    def __init__(self, cost_limit: float, init: float, warmup: int):
        super().__init__()
        self.cost_limit, self.warmup = cost_limit, warmup
        self.register_buffer("value", torch.tensor(float(init)))

    def observe(self, episode_costs: np.ndarray | list[np.ndarray], global_step: int) -> None:
        """One λ step on the mean undiscounted cost of the training episodes just ended (SAC-Lag and TD3-Lag: at this
        vector-env step; PPO-Lag: during this rollout), the only place λ changes, unless none ended or global_step
        <= the warm-up. Stacked for a seed group
        (keelrl.networks.seeds), every state tensor has a leading seed axis and `episode_costs` is one array per
        seed: each seed's λ steps on its own episodes."""
        if global_step <= self.warmup:
            return
        # (seed index, that seed's costs); () indexes a single run's 0-d state whole
        per_seed = [((), episode_costs)] if self.value.dim() == 0 else enumerate(episode_costs)
        for seed, costs in per_seed:
            if len(costs):
                self.update(float(np.mean(costs)), seed)

    def update(self, episode_cost: float, seed: int | tuple[()] = ()) -> None:
        """One step of λ (a seed group's: of seed `seed`'s) on the mean cost J_c of a batch of episodes."""
        raise NotImplementedError


class GradientMultiplier(Multiplier):
    """λ ← max(0, λ − lr ∂/∂λ[−λ (J_c − d)]) = max(0, λ + lr (J_c − d)), one plain gradient step (no
    torch optimiser, no upper bound) per `update` call; the agent calls it once per batch of finished
    training episodes with J_c their mean cost (see the module docstring, which also compares OmniSafe)."""

    def __init__(self, cost_limit: float, lr: float, init: float, warmup: int = 0):
        super().__init__(cost_limit, init, warmup)
        self.lr = lr

    def update(self, episode_cost: float, seed: int | tuple[()] = ()) -> None:
        value = self.value[seed]
        value.copy_((value + self.lr * (episode_cost - self.cost_limit)).clamp(min=0.0))


class PIDMultiplier(Multiplier):
    """Stooke et al. 2020: per `update(J_c)` call, with e = J_c − d,
        I ← max(0, I + k_i e),   λ = max(0, k_p e + I + k_d max(0, J_c − J_c,previous)),
    I starting at lambda_init; J_c,previous is the J_c of the call before (no derivative term on the
    first call). The agent calls it at the gradient multiplier's moments: once per batch of finished
    training episodes, J_c their mean cost. With k_p = k_d = 0 it is the gradient multiplier (lr k_i).

    OmniSafe's `PIDLagrangian.pid_update` (omnisafe/common/pid_lagrange.py) is called once per update
    step on the mean cost of the last 10 episodes (see the module docstring), and differs in its terms:
    the proportional term acts on an exponential moving average (α 0.95) of e, the derivative on an
    average (α 0.95) of J_c compared with its value up to `pid_d_delay` (10) calls before, and λ is capped
    at `penalty_max` (100) unless sum_norm / diff_norm is set (diff_norm clips I and λ to [0, 1]).
    Here: raw e, the rise since the previous call, no cap. Its gains (configs/off-policy/SACPID.yaml:
    k_p 1e-6, k_i 1e-7, k_d 1e-7) suit a step per environment step, not keelrl's per-episode steps.
    """

    def __init__(self, cost_limit: float, kp: float, ki: float, kd: float, init: float, warmup: int = 0):
        super().__init__(cost_limit, init, warmup)
        self.kp, self.ki, self.kd = kp, ki, kd
        self.register_buffer("integral", torch.tensor(float(init)))
        self.register_buffer("previous_cost", torch.tensor(0.0))
        # calls so far (0: no J_c,previous yet); a NaN previous_cost would read as diverged weights at a checkpoint
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def update(self, episode_cost: float, seed: int | tuple[()] = ()) -> None:
        integral, previous_cost, calls = self.integral[seed], self.previous_cost[seed], self.calls[seed]
        error = episode_cost - self.cost_limit
        integral.copy_((integral + self.ki * error).clamp(min=0.0))
        rise = 0.0 if calls == 0 else max(0.0, episode_cost - float(previous_cost))
        self.value[seed].copy_((self.kp * error + integral + self.kd * rise).clamp(min=0.0))
        previous_cost.fill_(episode_cost)
        calls += 1


class AdamMultiplier(Multiplier):
    """OmniSafe's Lagrange (omnisafe/common/lagrange.py:99-136, read at 15603dd): λ is a parameter stepped by
    torch.optim.Adam (β 0.9, 0.999, ε 1e-8) on the loss −λ (J_c − d), then clamped at 0, once per `update`. Adam
    normalises the step, so λ moves by about lambda_lr per update whatever the size of the violation. Written out
    here (gradient g = d − J_c; m, v and the step count are buffers, so they travel with checkpoints):
        m ← β1 m + (1 − β1) g,  v ← β2 v + (1 − β2) g²,  λ ← max(0, λ − lr/(1 − β1ᵗ) · m / (√v/√(1 − β2ᵗ) + ε))."""

    BETA1, BETA2, EPS = 0.9, 0.999, 1e-8

    def __init__(self, cost_limit: float, lr: float, init: float, warmup: int = 0):
        super().__init__(cost_limit, max(init, 0.0), warmup)
        self.lr = lr
        for name in ("exp_avg", "exp_avg_sq", "steps"):
            self.register_buffer(name, torch.zeros((), dtype=torch.float64))

    def update(self, episode_cost: float, seed: int | tuple[()] = ()) -> None:
        value, steps, exp_avg, exp_avg_sq = (self.value[seed], self.steps[seed], self.exp_avg[seed],
                                             self.exp_avg_sq[seed])
        gradient = self.cost_limit - episode_cost  # d/dλ of −λ (J_c − d)
        steps += 1
        exp_avg.mul_(self.BETA1).add_((1 - self.BETA1) * gradient)
        exp_avg_sq.mul_(self.BETA2).add_((1 - self.BETA2) * gradient**2)
        bias1, bias2 = 1 - self.BETA1**steps, 1 - self.BETA2**steps
        step = self.lr / bias1 * exp_avg / (exp_avg_sq.sqrt() / bias2.sqrt() + self.EPS)
        value.copy_((value - step).clamp(min=0.0))


def build_multiplier(config: LagrangeOptions) -> Multiplier:
    if config.multiplier == "adam":
        return AdamMultiplier(config.cost_limit, config.lambda_lr, config.lambda_init, config.lambda_warmup)
    if config.multiplier == "pid":
        return PIDMultiplier(config.cost_limit, config.pid_kp, config.pid_ki, config.pid_kd, config.lambda_init,
                             config.lambda_warmup)
    return GradientMultiplier(config.cost_limit, config.lambda_lr, config.lambda_init, config.lambda_warmup)


class CostCritic(nn.Module):
    """The cost critic a Lagrangian agent adds to its base: an ensemble with the reward critic's architecture and
    one output per member, Q_c(s, a) (E, B), its Polyak-averaged target and its optimiser (learning rate `lr`).

    Its `loss` regresses every member onto c + γ(1 − terminated) Q_c,target(s', a'), the target's ensemble mean,
    with a' the agent's next actions (SAC-Lag: a' ~ π(·|s'); TD3-Lag: the smoothed target action); the agent
    computes it through its own loss function (one batched pass for a seed group, compiled where asked), and
    `step` takes the optimiser step on it, then moves the target by τ."""

    def __init__(self, config: Any, obs_dim: int, action_dim: int, lr: float):
        super().__init__()
        self.critic = build_critic(config, obs_dim, action_dim, num_outputs=1)
        self.target = copy.deepcopy(self.critic).requires_grad_(False)
        # the parameter lists Polyak averaging walks, gathered once (the tensors stay the same objects)
        self.polyak_target, self.polyak_online = list(self.target.parameters()), list(self.critic.parameters())
        self.optimizer = make_optimizer(list(self.critic.parameters()), config.optimizer, lr, config.weight_decay)
        self.tau = config.tau

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """The ensemble's mean cost value (B,): what the Lagrangian actor loss weighs by λ."""
        return self.critic(obs, actions).squeeze(-1).mean(dim=0)  # (E, B, 1) -> (B,)

    def loss(self, batch: Batch, next_actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every member's squared error against the target with a' = `next_actions` (B, A), summed, and the
        members' outputs (E, B)."""
        with torch.no_grad():
            next_cost_q = self.target(batch.next_obs, next_actions).squeeze(-1).mean(dim=0)  # (B,)
            target = batch.costs + batch.discounts * (1.0 - batch.terminated) * next_cost_q
        cost_q = self.critic(batch.obs, batch.actions).squeeze(-1)  # (E, B, 1) -> (E, B)
        return (cost_q - target).pow(2).mean(dim=1).sum(), cost_q.detach()

    def step(self, cost_loss: torch.Tensor, cost_q: torch.Tensor) -> dict[str, torch.Tensor]:
        """One optimiser step on `loss`'s outputs (a seed group's: (S,) and (S, E, B)), then the target follows by
        Polyak averaging."""
        optimizer_step(self.optimizer, cost_loss, self.critic)
        soft_update(self.polyak_target, self.polyak_online, self.tau)
        return {"losses/cost_qf_loss": cost_loss.detach() / cost_q.shape[-2],
                "losses/cost_qf_values": cost_q.flatten(-2).mean(-1)}


def final_cost_lines(run: Any, cost_limit: float) -> list[str]:
    """The line a constrained run ends with: its final evaluation's episode cost beside the limit (`run`: a `Run`
    whose final evaluation is done)."""
    costs = run.final_evaluation[1]
    verdict = "met" if costs.mean() <= cost_limit else "NOT met"
    return [f"final evaluation cost over {len(costs)} episodes: {costs.mean():.1f} ± {costs.std():.1f} "
            f"(cost limit {cost_limit:g}: {verdict})"]


def lagrangian_actor_loss(reward_loss: torch.Tensor, cost_q: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """mean(reward_loss + λ Q_c) / (1 + λ); reward_loss (B,) is the unconstrained agent's per-sample loss."""
    return (reward_loss + lam * cost_q).mean() / (1.0 + lam)
