"""An env saved in the middle of an episode and restored exactly, so that a run resumed from a checkpoint goes on
with the very episodes it was in, bit for bit, instead of starting new ones.

What can be saved (`episode_state` returns None for anything else, and the run starts new episodes, as every
agent does on resume):
- gymnasium's MuJoCo envs: their full integration state (`mujoco.mj_getState` with mjSTATE_INTEGRATION, what
  MuJoCo gives for bit-for-bit continuation of a simulation), the body positions an env's `step` reads before it
  simulates (Ant's torso `xpos`, Humanoid's centre of mass from `xipos`: mj_step computed them from the
  positions before its last integration, so neither the state nor mj_forward gives them back) and their random
  generator (reset noise);
- any env whose unwrapped class has `episode_state()` and `load_episode_state(state)` (tensors and plain
  values);
- behind the wrappers gymnasium.make and keelrl put around them: TimeLimit and keelrl's CostWrapper (whose only
  state is a step counter), OrderEnforcing and PassiveEnvChecker. Any other wrapper may hold state of its own,
  so an env behind it is not saved.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.wrappers import OrderEnforcing, PassiveEnvChecker, TimeLimit

from keelrl.envs.safety import CostWrapper

COUNTERS = {TimeLimit: "_elapsed_steps", CostWrapper: "_episode_step", OrderEnforcing: "_has_reset"}
"""The wrappers an episode state covers, each with the one attribute it keeps between steps."""
STATELESS = (PassiveEnvChecker,)
DERIVED_POSITIONS = ("xpos", "xipos")
"""MjData's body positions (nbody, 3) that gymnasium's MuJoCo envs read in `step` before simulating."""


def episode_state(env: gym.Env) -> dict[str, Any] | None:
    """The state of `env`'s episode in progress (plain values and arrays), or None if it cannot be saved."""
    counters = []
    while isinstance(env, gym.Wrapper):
        if type(env) in COUNTERS:
            counters.append(getattr(env, COUNTERS[type(env)]))
        elif not isinstance(env, STATELESS):
            return None
        env = env.env
    inner = _inner_state(env)
    return None if inner is None else {"wrappers": counters, "env": inner}


def load_episode_state(env: gym.Env, state: dict[str, Any]) -> None:
    """Put `env` back where `episode_state` found it (the same env id and wrappers)."""
    counters = iter(state["wrappers"])
    while isinstance(env, gym.Wrapper):
        if type(env) in COUNTERS:
            setattr(env, COUNTERS[type(env)], next(counters))
        env = env.env
    if hasattr(env, "load_episode_state"):
        env.load_episode_state(state["env"])
        return
    import mujoco

    mujoco.mj_setState(env.model, env.data, np.asarray(state["env"]["mujoco"]), mujoco.mjtState.mjSTATE_INTEGRATION)
    for name in DERIVED_POSITIONS:
        if name in state["env"]:  # absent from checkpoints written before they were saved
            getattr(env.data, name)[:] = state["env"][name]
    env.np_random.bit_generator.state = state["env"]["np_random"]


def _inner_state(env: gym.Env) -> dict[str, Any] | None:
    if hasattr(env, "episode_state"):
        return env.episode_state()
    if not _is_mujoco(env):
        return None
    import mujoco

    spec = mujoco.mjtState.mjSTATE_INTEGRATION
    state = np.empty(mujoco.mj_stateSize(env.model, spec))
    mujoco.mj_getState(env.model, env.data, state, spec)
    derived = {name: getattr(env.data, name).tolist() for name in DERIVED_POSITIONS}
    return {"mujoco": state.tolist(), **derived, "np_random": env.np_random.bit_generator.state}


def _is_mujoco(env: gym.Env) -> bool:
    try:
        from gymnasium.envs.mujoco.mujoco_env import MujocoEnv
    except ImportError:  # gymnasium without mujoco
        return False
    return isinstance(env, MujocoEnv)
