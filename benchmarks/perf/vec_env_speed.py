"""Cost of keelrl's `make_vec_env` over the raw backends, random actions, measured A B A B.

    python -m keelrl.benchmarks.perf.vec_env_speed --env-id HalfCheetah-v5 --num-envs 8

Raw gymnasium is `gym.make_vec(..., vectorization_mode="sync")` with its default (next-step)
autoreset; raw envpool is `envpool.make_gymnasium`. keelrl adds same-step autoreset with the
true final observation, episode statistics and NaN checks on top of each.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import gymnasium as gym
import numpy as np

from keelrl.agents.harness.options import parse_command_line
from keelrl.envs import make_vec_env


@dataclasses.dataclass
class Args:
    env_id: str = "HalfCheetah-v5"
    """environment id (the same id on both backends)"""
    num_envs: int = 8
    """sub-environments"""
    steps: int = 2_000
    """vector steps per measurement"""
    repeats: int = 5
    """measurements per implementation (alternated)"""
    seed: int = 0
    """seed of envs and actions"""


def steps_per_second(env, actions: np.ndarray) -> float:
    """Environment steps per second (vector steps × num_envs) over the pre-drawn actions."""
    env.reset()
    start = time.perf_counter()
    for step_actions in actions:
        env.step(step_actions)
    return actions.shape[0] * actions.shape[1] / (time.perf_counter() - start)


def main(args: Args) -> None:
    try:
        import envpool
    except ImportError:
        envpool = None
    makers = {
        "gymnasium (raw)": lambda: gym.make_vec(args.env_id, args.num_envs, vectorization_mode="sync"),
        "keelrl / gymnasium": lambda: make_vec_env(args.env_id, args.num_envs, args.seed, "gymnasium"),
    }
    if envpool is not None:
        makers["envpool (raw)"] = lambda: envpool.make_gymnasium(args.env_id, num_envs=args.num_envs, seed=args.seed)
        makers["keelrl / envpool"] = lambda: make_vec_env(args.env_id, args.num_envs, args.seed, "envpool")
    envs = {name: make() for name, make in makers.items()}
    space = envs["keelrl / gymnasium"].single_action_space
    actions = np.random.default_rng(args.seed).uniform(
        space.low, space.high, (args.steps, args.num_envs, *space.shape)).astype(np.float32)
    results: dict[str, list[float]] = {name: [] for name in envs}
    for _ in range(args.repeats):
        for name, env in envs.items():
            results[name].append(steps_per_second(env, actions))
    print(f"{args.env_id}, {args.num_envs} envs, {args.steps} vector steps x {args.repeats} repeats, random actions")
    print(f"{'implementation':<22}{'median steps/s':>16}{'min':>10}{'max':>10}")
    for name, values in results.items():
        print(f"{name:<22}{statistics.median(values):>16.0f}{min(values):>10.0f}{max(values):>10.0f}")
    for backend in ("gymnasium", "envpool"):
        raw, ours = f"{backend} (raw)", f"keelrl / {backend}"
        if raw in results:
            overhead = statistics.median(results[raw]) / statistics.median(results[ours]) - 1
            print(f"keelrl overhead on {backend}: {100 * overhead:+.1f}% (time per step)")
    for env in envs.values():
        env.close()


if __name__ == "__main__":
    main(parse_command_line(Args))
