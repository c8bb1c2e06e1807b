"""CPU time of one SAC or TD3 update, robust to other processes on the machine.

    python -m keelrl.benchmarks.update_time --algos sac td3 --hidden 256 8
    python -m keelrl.benchmarks.update_time --compile

Times updates on random Hopper-sized batches (batch 256) with one torch thread, by the process's
CPU time rather than wall-clock time: another busy process then slows the figure far less (it
still shares caches), so before/after comparisons stay meaningful on a shared machine. With
`--hidden 8` the arithmetic nearly vanishes and what remains is the per-update overhead
(Python, dispatch, autograd, optimiser bookkeeping). Reports the median over repeats.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import numpy as np
import torch
import tyro

from keelrl.agents.sac import SAC, SACConfig
from keelrl.agents.td3 import TD3, TD3Config
from keelrl.buffers import ReplayBuffer

AGENTS = {"sac": (SAC, SACConfig), "td3": (TD3, TD3Config)}


@dataclasses.dataclass
class Args:
    algos: tuple[str, ...] = ("sac", "td3")
    """agents to time"""
    hidden: tuple[int, ...] = (256, 8)
    """hidden widths of the 2-layer networks to time (8: overhead only)"""
    compile: bool = False
    """time the --compile update"""
    updates: int = 150
    """updates per measurement"""
    repeats: int = 5
    """measurements per setting (median reported)"""
    obs_dim: int = 11
    """observation size (Hopper)"""
    action_dim: int = 3
    """action size (Hopper)"""


def filled_buffer(obs_dim: int, action_dim: int, transitions: int = 1_000) -> ReplayBuffer:
    """A replay buffer of random transitions with the given sizes."""
    buffer = ReplayBuffer(10_000, (obs_dim,), (action_dim,))
    rng = np.random.default_rng(0)
    for _ in range(transitions):
        obs = rng.normal(size=(1, obs_dim))
        buffer.add(obs, rng.uniform(-1, 1, (1, action_dim)), [1.0], obs, [False], [False])
    return buffer


def cpu_ms_per_update(algo: str, hidden: int, args: Args) -> list[float]:
    agent_cls, config_cls = AGENTS[algo]
    options = {"compile": True} if args.compile else {}
    torch.manual_seed(0)
    agent = agent_cls(args.obs_dim, -np.ones(args.action_dim), np.ones(args.action_dim),
                      config_cls(hidden_sizes=(hidden, hidden), **options))
    buffer = filled_buffer(args.obs_dim, args.action_dim)
    for _ in range(20):  # warm-up (and compilation)
        agent.update(buffer.sample(256))
    timings = []
    for _ in range(args.repeats):
        start = time.process_time()
        for _ in range(args.updates):
            agent.update(buffer.sample(256))
        timings.append(1e3 * (time.process_time() - start) / args.updates)
    return timings


def main(args: Args) -> None:
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread, batch 256, CPU ms per update (median of {args.repeats})"
          f"{', --compile' if args.compile else ''}")
    for algo in args.algos:
        for hidden in args.hidden:
            timings = cpu_ms_per_update(algo, hidden, args)
            print(f"  {algo} {hidden}-{hidden}: {statistics.median(timings):6.2f} ms "
                  f"(min {min(timings):.2f}, max {max(timings):.2f})")


if __name__ == "__main__":
    main(tyro.cli(Args))
