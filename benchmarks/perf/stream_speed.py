"""Stream AC(λ) agent speed: updates per second on one core, without the environment.

    taskset -c 0 python -m keelrl.benchmarks.perf.stream_speed                          # Hopper-v5 sizes
    taskset -c 0 python -m keelrl.benchmarks.perf.stream_speed --obs-dim 28 --action-dim 8   # Ant-v4 sizes

Observations come from a fixed random stream (obs_dim includes the time feature), episodes end
every `episode_length` steps. Reported: `update` calls per second alone, and agent steps
(`act` + `update`, what the training loop asks of the agent per env step) per second.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import gymnasium as gym
import numpy as np
import torch

from keelrl.agents.harness.options import parse_command_line
from keelrl.agents.stream_ac import StreamAC, StreamACConfig
from keelrl.envs.streaming_wrappers import Transition


@dataclasses.dataclass
class Args:
    obs_dim: int = 12
    """network input size (Hopper-v5: 11 observations + the time feature)"""
    action_dim: int = 3
    """action size (Hopper-v5)"""
    hidden_sizes: tuple[int, ...] = (128, 128)
    """hidden widths of actor and critic (stream AC's default)"""
    adaptive: bool = False
    """measure adaptive ObGD"""
    steps: int = 2_000
    """updates per measurement"""
    repeats: int = 7
    """measurements (median reported)"""
    episode_length: int = 1_000
    """steps between episode ends (trace resets)"""
    threads: int = 1
    """torch threads"""
    seed: int = 0
    """seed of the networks and the observation stream"""


def make_stream(args: Args) -> list[Transition]:
    rng = np.random.default_rng(args.seed)
    obs = rng.normal(size=(args.steps + 1, args.obs_dim)).astype(np.float32)
    actions = rng.normal(size=(args.steps, args.action_dim)).astype(np.float32)
    rewards = rng.normal(size=args.steps)
    return [Transition(obs[i], actions[i], float(rewards[i]), obs[i + 1], False,
                       (i + 1) % args.episode_length == 0) for i in range(args.steps)]


def updates_per_second(agent: StreamAC, stream: list[Transition], with_act: bool) -> float:
    start = time.perf_counter()
    for transition in stream:
        if with_act:
            transition = transition._replace(action=agent.act(transition.obs))
        agent.update(transition)
    return len(stream) / (time.perf_counter() - start)


def main(args: Args) -> None:
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    bounds = np.ones(args.action_dim, np.float32)
    agent = StreamAC(args.obs_dim, gym.spaces.Box(-bounds, bounds),
                     StreamACConfig(hidden_sizes=args.hidden_sizes, adaptive=args.adaptive))
    stream = make_stream(args)
    updates_per_second(agent, stream[:200], with_act=True)  # warm-up
    update_only = [updates_per_second(agent, stream, with_act=False) for _ in range(args.repeats)]
    act_and_update = [updates_per_second(agent, stream, with_act=True) for _ in range(args.repeats)]
    parameters = sum(p.numel() for p in agent.parameters())
    print(f"stream AC, obs {args.obs_dim}, actions {args.action_dim}, hidden {args.hidden_sizes}, "
          f"{parameters} parameters, adaptive={args.adaptive}, {args.threads} thread(s), torch {torch.__version__}")
    print(f"update:       {statistics.median(update_only):8.0f} /s (median of {args.repeats}; "
          f"min {min(update_only):.0f}, max {max(update_only):.0f})")
    print(f"act + update: {statistics.median(act_and_update):8.0f} /s (median of {args.repeats}; "
          f"min {min(act_and_update):.0f}, max {max(act_and_update):.0f})")


if __name__ == "__main__":
    main(parse_command_line(Args))
