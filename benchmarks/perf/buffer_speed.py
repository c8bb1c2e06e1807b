"""Replay buffer throughput: transitions sampled per second at batch 256, and adds per second.

    python -m keelrl.benchmarks.perf.buffer_speed --capacity 1000000
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import numpy as np
import torch

from keelrl.agents.harness.options import parse_command_line
from keelrl.buffers import ReplayBuffer


@dataclasses.dataclass
class Args:
    capacity: int = 1_000_000
    """buffer capacity, filled completely before sampling"""
    obs_dim: int = 17
    """observation size (HalfCheetah)"""
    action_dim: int = 6
    """action size (HalfCheetah)"""
    num_envs: int = 1
    """envs per add() call"""
    batch_size: int = 256
    """transitions per sample() call"""
    samples: int = 2_000
    """sample() calls per measurement"""
    repeats: int = 5
    """measurements (median reported)"""
    device: str = "cpu"
    """storage device"""
    threads: int = 1
    """torch threads"""


def fill(buffer: ReplayBuffer, args: Args) -> float:
    """Fill the buffer with add() calls of one vector step each; returns adds (transitions) per second."""
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(args.num_envs, args.obs_dim)).astype(np.float32)
    actions = rng.normal(size=(args.num_envs, args.action_dim)).astype(np.float32)
    rewards = rng.normal(size=args.num_envs)
    flags = np.zeros(args.num_envs, bool)
    start = time.perf_counter()
    for _ in range(buffer.capacity // args.num_envs):
        buffer.add(obs, actions, rewards, obs, flags, flags)
    return buffer.capacity / (time.perf_counter() - start)


def sample_rate(buffer: ReplayBuffer, args: Args) -> float:
    start = time.perf_counter()
    for _ in range(args.samples):
        batch = buffer.sample(args.batch_size)
    if buffer.device.type == "cuda":
        torch.cuda.synchronize()
    del batch
    return args.samples * args.batch_size / (time.perf_counter() - start)


def main(args: Args) -> None:
    torch.set_num_threads(args.threads)
    print(f"capacity {args.capacity}, obs {args.obs_dim}, action {args.action_dim}, batch {args.batch_size}, "
          f"device {args.device}, {args.threads} thread(s)")
    for n_step in (1, 3):
        buffer = ReplayBuffer(args.capacity, (args.obs_dim,), (args.action_dim,), args.num_envs, args.device,
                              n_step=n_step)
        add_rate = fill(buffer, args)
        rates = [sample_rate(buffer, args) for _ in range(args.repeats)]
        print(f"n_step={n_step}: sample {statistics.median(rates):,.0f} transitions/s "
              f"({1e6 * args.batch_size / statistics.median(rates):.0f} us per batch; min {min(rates):,.0f}, "
              f"max {max(rates):,.0f}); add {add_rate:,.0f} transitions/s")


if __name__ == "__main__":
    main(parse_command_line(Args))
