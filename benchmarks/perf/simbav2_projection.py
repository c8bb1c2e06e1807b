"""Cost of SimbaV2's weight projection: ms per SAC update with and without `project_weights()`.

    taskset -c 1 python -m keelrl.benchmarks.perf.simbav2_projection

One update is what a SimbaV2 SAC agent does per gradient step: the C51 target from the target
critic (smaller-mean member, entropy-augmented projection), the critic ensemble's forward,
backward and Adam step, the actor's forward, backward and Adam step, and the Polyak update of the
target critic. With projection, `project_weights()` follows each Adam step. The two variants
alternate within every repeat so drift in machine load hits both alike; the median over repeats
is reported, with the time of the projections alone. Wall-clock and CPU time (this process only,
so robust to other processes sharing the core) are both reported.
"""

from __future__ import annotations

import copy
import dataclasses
import statistics
import time

import numpy as np
import torch

from keelrl.agents.harness.options import parse_command_line
from keelrl.networks.heads import C51Head
from keelrl.networks.simbav2 import SimbaV2Actor, SimbaV2Critic


@dataclasses.dataclass
class Args:
    batch_size: int = 256
    """transitions per update"""
    obs_dim: int = 11
    """observation size (Hopper)"""
    action_dim: int = 3
    """action size (Hopper)"""
    critic_hidden_dim: int = 512
    """critic width d"""
    critic_num_blocks: int = 2
    """critic residual blocks"""
    num_critics: int = 2
    """critics in the ensemble"""
    actor_hidden_dim: int = 128
    """actor width d"""
    actor_num_blocks: int = 1
    """actor residual blocks"""
    updates: int = 10
    """updates per measurement"""
    repeats: int = 9
    """measurements per variant (median reported)"""
    threads: int = 1
    """torch threads"""


class Learner:
    """SimbaV2 SAC networks, optimisers and one fixed batch."""

    gamma, alpha, tau = 0.99, 0.01, 0.005

    def __init__(self, args: Args):
        low, high = -np.ones(args.action_dim), np.ones(args.action_dim)
        self.actor = SimbaV2Actor(args.obs_dim, low, high, args.actor_hidden_dim, args.actor_num_blocks)
        self.critic = SimbaV2Critic(
            args.obs_dim, args.action_dim, args.critic_hidden_dim, args.critic_num_blocks, args.num_critics
        )
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.head = C51Head(-5.0, 5.0, 101)
        self.actor_optimizer = torch.optim.Adam(self.actor.parameters(), lr=1e-4)
        self.critic_optimizer = torch.optim.Adam(self.critic.parameters(), lr=1e-4)
        size = args.batch_size
        self.obs, self.next_obs = torch.randn(size, args.obs_dim), torch.randn(size, args.obs_dim)
        self.actions = torch.rand(size, args.action_dim) * 2 - 1
        self.rewards = torch.randn(size)
        self.not_done = (torch.rand(size) > 0.1).float()

    def update(self, project: bool) -> None:
        with torch.no_grad():
            next_actions, next_log_prob = self.actor.sample(self.next_obs)
            next_probs = self.head.min_value_probs(self.critic_target(self.next_obs, next_actions))
            soft_rewards = self.rewards - self.gamma * self.not_done * self.alpha * next_log_prob
            target = self.head.project(next_probs, soft_rewards, torch.full_like(self.rewards, self.gamma), self.not_done)
        critic_loss = self.head.loss(self.critic(self.obs, self.actions), target).mean(-1).sum()
        self.critic_optimizer.zero_grad(set_to_none=True)
        critic_loss.backward()
        self.critic_optimizer.step()
        if project:
            self.critic.project_weights()

        actions, log_prob = self.actor.sample(self.obs)
        self.critic.requires_grad_(False)
        q = self.head.value(self.critic(self.obs, actions)).min(dim=0).values
        self.critic.requires_grad_(True)
        actor_loss = (self.alpha * log_prob - q).mean()
        self.actor_optimizer.zero_grad(set_to_none=True)
        actor_loss.backward()
        self.actor_optimizer.step()
        if project:
            self.actor.project_weights()

        with torch.no_grad():
            torch._foreach_lerp_(list(self.critic_target.parameters()), list(self.critic.parameters()), self.tau)

    def project(self) -> None:
        self.critic.project_weights()
        self.actor.project_weights()


def ms_per_call(fn, calls: int) -> tuple[float, float]:
    """Wall-clock and CPU milliseconds per call of `fn`."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        fn()
    return 1e3 * (time.perf_counter() - wall) / calls, 1e3 * (time.process_time() - cpu) / calls


def medians(timings: list[tuple[float, float]]) -> tuple[float, float]:
    """Median wall-clock and median CPU time over repeats."""
    walls, cpus = zip(*timings)
    return statistics.median(walls), statistics.median(cpus)


def main(args: Args) -> None:
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    learner = Learner(args)
    for _ in range(3):  # warm-up: allocator, Adam state
        learner.update(project=True)
    plain, projected, projection = [], [], []
    for _ in range(args.repeats):
        plain.append(ms_per_call(lambda: learner.update(project=False), args.updates))
        projected.append(ms_per_call(lambda: learner.update(project=True), args.updates))
        projection.append(ms_per_call(learner.project, args.updates))
    (plain_wall, plain_cpu), (projected_wall, projected_cpu) = medians(plain), medians(projected)
    projection_wall, projection_cpu = medians(projection)
    print(f"torch {torch.__version__}, {args.threads} thread(s); SimbaV2 SAC update: critic {args.num_critics}×"
          f"(d={args.critic_hidden_dim}, {args.critic_num_blocks} blocks), actor (d={args.actor_hidden_dim}, "
          f"{args.actor_num_blocks} block), batch {args.batch_size}, obs {args.obs_dim}, action {args.action_dim}")
    print(f"{f'median of {args.repeats} repeats × {args.updates} calls':<40}{'wall ms':>10}{'CPU ms':>10}")
    print(f"{'update without projection':<40}{plain_wall:>10.2f}{plain_cpu:>10.2f}")
    print(f"{'update with projection':<40}{projected_wall:>10.2f}{projected_cpu:>10.2f}")
    print(f"{'projection alone (critic + actor)':<40}{projection_wall:>10.2f}{projection_cpu:>10.2f}")
    wall_overhead = 100 * (projected_wall / plain_wall - 1)
    cpu_overhead = 100 * (projected_cpu / plain_cpu - 1)
    print(f"{'relative overhead (%)':<40}{wall_overhead:>+10.1f}{cpu_overhead:>+10.1f}")


if __name__ == "__main__":
    main(parse_command_line(Args))
