"""Safe RL tasks: environments whose `step` reports a per-step cost in `info["cost"]`.

`CostWrapper(env, cost_fn)` adds a user-defined cost to any gymnasium env. The registered
velocity tasks are Safety-Gymnasium's v1 velocity constraints built on gymnasium's own v5 MuJoCo
envs (safety-gymnasium itself pins gymnasium 0.28 and cannot be installed beside gymnasium 1.x):
the cost of a step is 1.0 when the robot moves faster than its threshold, else 0.0, and a
Lagrangian agent keeps the undiscounted episode cost under a limit (25 by default).

    keelrl/SafeHopperVelocity-v1       x-velocity   > 0.7402
    keelrl/SafeHalfCheetahVelocity-v1  x-velocity   > 3.2096
    keelrl/SafeWalker2dVelocity-v1     x-velocity   > 2.3415
    keelrl/SafeAntVelocity-v1          planar speed > 2.6222
    keelrl/SafeHumanoidVelocity-v1     planar speed > 1.4149
    keelrl/SafeSwimmerVelocity-v1      x-velocity   > 0.2282

Reward, observation, termination and the 1000-step time limit are those of the v5 env. The
velocities are the ones the v5 env reports in `info` (`x_velocity`, `y_velocity`: the change of
the robot's position over one control step). These are Python envs: the envpool backend cannot
run them (use the gymnasium backend).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

CostFn = Callable[[np.ndarray, Any, dict[str, Any]], float]
"""cost_fn(action, next_obs, info) -> the step's cost."""

# base env, velocity threshold, whether the speed is planar (|(vx, vy)|) rather than the signed x-velocity
VELOCITY_TASKS: dict[str, tuple[str, float, bool]] = {
    "keelrl/SafeHopperVelocity-v1": ("Hopper-v5", 0.7402, False),
    "keelrl/SafeHalfCheetahVelocity-v1": ("HalfCheetah-v5", 3.2096, False),
    "keelrl/SafeWalker2dVelocity-v1": ("Walker2d-v5", 2.3415, False),
    "keelrl/SafeAntVelocity-v1": ("Ant-v5", 2.6222, True),
    "keelrl/SafeHumanoidVelocity-v1": ("Humanoid-v5", 1.4149, True),
    "keelrl/SafeSwimmerVelocity-v1": ("Swimmer-v5", 0.2282, False),
}


class CostWrapper(gym.Wrapper):
    """Adds `info["cost"] = cost_fn(action, next_obs, info)` to every step of `env`.

    A cost that is not a finite number (NaN, inf, or not convertible to float) stops the episode
    with a ValueError naming the cost function and the step, instead of poisoning a cost critic.
    """

    def __init__(self, env: gym.Env, cost_fn: CostFn):
        if not callable(cost_fn):
            raise ValueError(f"cost_fn must be callable as cost_fn(action, next_obs, info), got {cost_fn!r}.")
        super().__init__(env)
        self.cost_fn = cost_fn
        self._episode_step = 0

    def reset(self, **kwargs):
        self._episode_step = 0
        return self.env.reset(**kwargs)

    def step(self, action):
        next_obs, reward, terminated, truncated, info = self.env.step(action)
        self._episode_step += 1
        cost = self.cost_fn(action, next_obs, info)
        try:
            cost = float(cost)
        except (TypeError, ValueError):
            cost = math.nan
        if not math.isfinite(cost):
            name = getattr(self.cost_fn, "__name__", repr(self.cost_fn))
            raise ValueError(f"The cost function {name} returned {cost!r} at step {self._episode_step} of an "
                             f"episode; a cost must be a finite number (fix the cost function).")
        return next_obs, reward, terminated, truncated, {**info, "cost": cost}


def velocity_cost(threshold: float, planar: bool) -> CostFn:
    """The velocity tasks' cost: 1.0 when the x-velocity (or the planar speed) exceeds `threshold`."""

    def cost_fn(action: np.ndarray, next_obs: Any, info: dict[str, Any]) -> float:
        speed = math.hypot(info["x_velocity"], info["y_velocity"]) if planar else info["x_velocity"]
        return float(speed > threshold)

    cost_fn.__name__ = f"velocity_cost(threshold={threshold}, planar={planar})"
    return cost_fn


def make_velocity_task(base_id: str, velocity_threshold: float, planar: bool, **kwargs) -> gym.Env:
    """The registered tasks' entry point: the v5 env (`kwargs` go to it) with the velocity cost. The v5 env is made
    without its time limit: the task's own, registered as the v5 env's and put outside by gym.make, is the one
    limit, so `gym.make(task, max_episode_steps=...)` sets it (an inner 1000 cut every longer one)."""
    base = dataclasses.replace(gym.spec(base_id), max_episode_steps=None)
    return CostWrapper(gym.make(base, **kwargs), velocity_cost(velocity_threshold, planar))


def reports_cost(env_id: str) -> bool:
    """Whether the gymnasium env `env_id` reports a per-step `info["cost"]` (one step of a fresh one tells)."""
    env = gym.make(env_id)
    try:
        env.reset(seed=0)
        env.action_space.seed(0)
        return "cost" in env.step(env.action_space.sample())[-1]
    finally:
        env.close()


def require_cost_task(env_id: str, backend: str, agent: str) -> None:
    """Check that `env_id` reports `info["cost"]` before a cost-using agent trains on it."""
    if backend != "gymnasium":
        raise ValueError(f"{agent} needs a task with a cost; the {backend} backend's tasks report none and it "
                         f"cannot run keelrl's Python safety tasks: use --env-backend gymnasium.")
    try:
        has_cost = reports_cost(env_id)
    except gym.error.Error as err:
        raise ValueError(f"Unknown gymnasium environment id {env_id!r} ({err}). Safety tasks: "
                         f"{', '.join(VELOCITY_TASKS)}.") from None
    if not has_cost:
        raise ValueError(f"{agent} needs a task that reports a per-step cost in info['cost'], and {env_id!r} "
                         f"does not. Use a safety task ({', '.join(VELOCITY_TASKS)}) or wrap your env in "
                         f"keelrl.envs.CostWrapper(env, cost_fn) and register it.")


for _task_id, (_base_id, _threshold, _planar) in VELOCITY_TASKS.items():
    # the inner v5 env already has gymnasium's order enforcing and env checker
    gym.register(_task_id, entry_point=make_velocity_task, order_enforce=False, disable_env_checker=True,
                 max_episode_steps=gym.spec(_base_id).max_episode_steps,
                 kwargs={"base_id": _base_id, "velocity_threshold": _threshold, "planar": _planar})
