"""How many torch threads an agent should use: SAC update time by thread count, idle and under load.

    python -m keelrl.benchmarks.perf.threads

For each thread count, times SAC updates (256-256 networks, batch 256, Hopper sizes) with the
machine otherwise idle, then again while a competing process keeps one core busy (as a second
training run or an env worker would). Reports the median milliseconds per update.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import statistics
import time

import numpy as np
import torch

from keelrl.agents.harness.options import parse_command_line
from keelrl.agents.sac import SAC, SACConfig
from keelrl.benchmarks.perf.update_time import filled_buffer


@dataclasses.dataclass
class Args:
    thread_counts: tuple[int, ...] = (1, 2)
    """torch thread counts to compare"""
    updates: int = 200
    """SAC updates per measurement"""
    repeats: int = 5
    """measurements per setting (median reported)"""
    obs_dim: int = 11
    """observation size (Hopper)"""
    action_dim: int = 3
    """action size (Hopper)"""


def _burn(stop) -> None:
    """A competing process that keeps exactly one core busy (pure Python: no thread pool)."""
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def ms_per_update(threads: int, args: Args) -> list[float]:
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    agent = SAC(args.obs_dim, -np.ones(args.action_dim), np.ones(args.action_dim), SACConfig())
    buffer = filled_buffer(args.obs_dim, args.action_dim)
    for _ in range(20):  # warm-up
        agent.update(buffer.sample(256))
    timings = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        for _ in range(args.updates):
            agent.update(buffer.sample(256))
        timings.append(1e3 * (time.perf_counter() - start) / args.updates)
    return timings


def main(args: Args) -> None:
    print(f"{os.cpu_count()} CPUs, torch {torch.__version__}, SAC update 256-256, batch 256")
    print(f"{'threads':>8}{'idle ms/update':>16}{'loaded ms/update':>18}")
    for threads in args.thread_counts:
        idle = statistics.median(ms_per_update(threads, args))
        stop = mp.Event()
        burner = mp.Process(target=_burn, args=(stop,), daemon=True)
        burner.start()
        try:
            loaded = statistics.median(ms_per_update(threads, args))
        finally:
            stop.set()
            burner.join()
        print(f"{threads:>8}{idle:>16.2f}{loaded:>18.2f}")


if __name__ == "__main__":
    main(parse_command_line(Args))
