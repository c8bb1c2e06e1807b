"""`make_vec_env`: gymnasium or envpool environments behind one autoreset semantics.

keelrl uses *same-step* autoreset on every backend. When sub-env i ends an episode on a step
(terminated or truncated), that same `step` call resets it:

- `next_obs[i]` is the first observation of its next episode (what the agent acts on next);
- `info["final_obs"][i]` is the true last observation of the finished episode. For envs that did
  not finish, `info["final_obs"][i] == next_obs[i]`, so `info["final_obs"]` is always the
  observation each transition led to: store `(obs, action, reward, info["final_obs"], terminated)`.
- `info["_episode"]` marks the envs that finished, and `info["episode"]` holds their undiscounted
  `return`, `length` and `cost` (raw rewards, before any normalisation).

`terminated` and `truncated` are kept apart: a time-limit truncation is not a termination, and
agents bootstrap through it from the true final observation.

`play_episodes(policy, env_id, episodes, seed)` plays one episode per sub-env of fresh envs (sub-env i seeded
seed + i) and returns their returns and costs: every agent's `evaluate` is it, on the agent's policy.
"""

from __future__ import annotations

import difflib
import os
import traceback
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from keelrl.envs.episode_state import episode_state, load_episode_state
from keelrl.envs.normalize import ObsNormalizer, RewardNormalizer

BACKENDS = ("gymnasium", "envpool")


def _suggest(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    return f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""


def make_gym_env(env_id: str, **env_kwargs: Any) -> gym.Env:
    """`gym.make(env_id, **env_kwargs)`; an id gymnasium cannot make raises one ValueError suggesting close ids, and
    so do a missing package and a MUJOCO_GL backend that does not load, saying which."""
    try:
        return gym.make(env_id, **env_kwargs)
    except gym.error.DependencyNotInstalled as err:
        raise ValueError(f"{env_id} needs a package that is not installed here: {err}") from None
    except (ImportError, AttributeError) as err:  # PyOpenGL fails on import (AttributeError) without the library
        backend = os.environ.get("MUJOCO_GL")
        frames = traceback.extract_tb(err.__traceback__)
        if backend is None or not any("OpenGL" in frame.filename or "mujoco" in frame.filename for frame in frames):
            raise
        raise ValueError(f"{env_id}: MUJOCO_GL={backend}, and that OpenGL backend does not load here "
                         f"({type(err).__name__}: {str(err).splitlines()[0]}): install it (EGL: apt install libegl1; "
                         f"OSMesa: apt install libosmesa6) or unset MUJOCO_GL (keelrl finds one when it films)."
                         ) from None
    except gym.error.Error as err:
        known = [k for k in gym.registry if not k.startswith("keelrl_test")]
        raise ValueError(
            f"Unknown gymnasium environment id {env_id!r} ({err}).{_suggest(env_id, known)}"
        ) from None


class _GymnasiumBackend:
    """N gymnasium envs stepped in this process; sub-env i is seeded with seed + i."""

    def __init__(self, env_id: str, num_envs: int, seed: int, env_kwargs: dict[str, Any]):
        self.envs = [make_gym_env(env_id, **env_kwargs) for _ in range(num_envs)]
        self.seed = seed
        self.observation_space = self.envs[0].observation_space
        self.action_space = self.envs[0].action_space

    def reset(self) -> np.ndarray:
        return np.stack([env.reset(seed=self.seed + i)[0] for i, env in enumerate(self.envs)])

    def step(self, actions: np.ndarray):
        num_envs = len(self.envs)
        next_obs = np.empty((num_envs, *self.observation_space.shape), self.observation_space.dtype)
        final_obs = np.empty_like(next_obs)
        rewards = np.empty(num_envs, np.float64)
        terminated = np.empty(num_envs, bool)
        truncated = np.empty(num_envs, bool)
        costs = None
        for i, env in enumerate(self.envs):
            obs, rewards[i], terminated[i], truncated[i], info = env.step(actions[i])
            final_obs[i] = obs
            if "cost" in info:
                if costs is None:
                    costs = np.zeros(num_envs, np.float64)
                costs[i] = info["cost"]
            if terminated[i] or truncated[i]:
                obs, _ = env.reset()
            next_obs[i] = obs
        return next_obs, rewards, terminated, truncated, final_obs, costs

    def close(self) -> None:
        for env in self.envs:
            env.close()


class _EnvpoolBackend:
    """envpool's batched C++ envs; envpool seeds sub-env i with seed + i, like the gymnasium backend.

    envpool resets a finished env on the *next* step; keelrl resets it on the same step instead,
    with `reset(env_ids)`, so both backends hand agents the same transitions. envpool calls an episode that ends
    by itself on its time-limit step truncated only (terminated = done and not truncated), where gymnasium's
    TimeLimit says terminated and truncated: keelrl gives envpool a limit one step longer and applies the limit
    itself, so `terminated` is always the env's own ending, as on gymnasium, and never bootstrapped through.
    """

    def __init__(self, env_id: str, num_envs: int, seed: int, env_kwargs: dict[str, Any]):
        try:
            import envpool
        except ImportError:
            raise ValueError(
                "backend='envpool' needs the envpool package: pip install 'keelrl[envpool]' "
                "(or pip install envpool)."
            ) from None
        known = envpool.list_all_envs()
        if env_id not in known:
            if env_id in gym.registry:  # keelrl's own tasks (keelrl/Safe*), or a gymnasium version envpool lacks
                raise ValueError(f"envpool has no environment {env_id!r}; gymnasium has it: use --env-backend "
                                 f"gymnasium.")
            raise ValueError(f"envpool has no environment {env_id!r}.{_suggest(env_id, known)}")
        self.max_episode_steps = env_kwargs.get("max_episode_steps",
                                                envpool.make_spec(env_id).config.max_episode_steps)
        self.env = envpool.make_gymnasium(env_id, num_envs=num_envs, seed=seed,
                                          **{**env_kwargs, "max_episode_steps": self.max_episode_steps + 1})
        self.observation_space = self.env.observation_space
        self.action_space = self.env.action_space

    def reset(self) -> np.ndarray:
        obs, _ = self.env.reset()
        return obs

    def step(self, actions: np.ndarray):
        final_obs, rewards, terminated, _, info = self.env.step(actions)  # envpool's own limit is never reached
        truncated = info["elapsed_step"] >= self.max_episode_steps
        next_obs = final_obs.copy()
        done = terminated | truncated
        if done.any():
            reset_obs, reset_info = self.env.reset(np.flatnonzero(done))
            next_obs[reset_info["env_id"]] = reset_obs
        costs = np.asarray(info["cost"], np.float64) if "cost" in info else None
        return next_obs, np.asarray(rewards, np.float64), terminated, truncated, final_obs, costs

    def close(self) -> None:
        self.env.close()


class VecEnv:
    """N environments with same-step autoreset, episode statistics and optional normalisation.

    `step` returns `(next_obs, rewards, terminated, truncated, info)` (see the module docstring).
    Observations and rewards are normalised when the normalisers are on; `info["episode"]`
    always reports raw returns. Set `training = False` to freeze the normalisers' statistics.
    """

    def __init__(
        self,
        backend: _GymnasiumBackend | _EnvpoolBackend,
        env_id: str,
        num_envs: int,
        normalize_obs: bool,
        normalize_reward: bool,
        gamma: float,
    ):
        self._backend = backend
        self.env_id = env_id
        self.num_envs = num_envs
        self.single_observation_space = backend.observation_space
        self.single_action_space = backend.action_space
        self.obs_normalizer = ObsNormalizer(backend.observation_space.shape) if normalize_obs else None
        self.reward_normalizer = RewardNormalizer(num_envs, gamma) if normalize_reward else None
        self.num_steps = 0
        self._episode_return = np.zeros(num_envs, np.float64)
        self._episode_length = np.zeros(num_envs, np.int64)
        self._episode_cost = np.zeros(num_envs, np.float64)

    @property
    def training(self) -> bool:
        return all(n.training for n in (self.obs_normalizer, self.reward_normalizer) if n is not None)

    @training.setter
    def training(self, mode: bool) -> None:
        for normalizer in (self.obs_normalizer, self.reward_normalizer):
            if normalizer is not None:
                normalizer.training = mode

    def reset(self) -> tuple[np.ndarray, dict]:
        """Reset every sub-env (seeded at construction) and the episode statistics."""
        obs = self._backend.reset()
        self._episode_return[:] = 0.0
        self._episode_length[:] = 0
        self._episode_cost[:] = 0.0
        if self.obs_normalizer is not None:
            self.obs_normalizer.update(obs)
            obs = self.obs_normalizer(obs)
        return obs, {}

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        """Step every sub-env (see the module docstring). Actions that are not finite are refused before the envs
        see them, and a non-finite reward, observation or cost raises: FloatingPointError saying which."""
        self._check_finite_actions(actions)
        next_obs, rewards, terminated, truncated, final_obs, costs = self._backend.step(actions)
        self.num_steps += 1
        self._check_finite(rewards, "reward")
        self._check_finite(final_obs, "observation")
        self._check_finite(next_obs, "observation")
        done = terminated | truncated
        info: dict[str, Any] = {}
        self._episode_return += rewards
        self._episode_length += 1
        if costs is not None:
            self._check_finite(costs, "cost")
            self._episode_cost += costs
            info["cost"] = costs
        if done.any():
            info["_episode"] = done
            info["episode"] = {
                "return": self._episode_return.copy(),
                "length": self._episode_length.copy(),
                "cost": self._episode_cost.copy(),
            }
            self._episode_return[done] = 0.0
            self._episode_length[done] = 0
            self._episode_cost[done] = 0.0
        if self.obs_normalizer is not None:
            self.obs_normalizer.update(next_obs)
            next_obs = self.obs_normalizer(next_obs)
            final_obs = self.obs_normalizer(final_obs)
        if self.reward_normalizer is not None:
            rewards = self.reward_normalizer(rewards, done)
        info["final_obs"] = final_obs
        return next_obs, rewards, terminated, truncated, info

    def normalize_obs(self, obs: np.ndarray) -> np.ndarray:
        """Apply the observation normaliser (identity when off), e.g. to an evaluation env's obs."""
        return obs if self.obs_normalizer is None else self.obs_normalizer(obs)

    def state_dict(self) -> dict[str, dict[str, torch.Tensor]]:
        """Normaliser statistics, to save with a checkpoint."""
        state = {}
        if self.obs_normalizer is not None:
            state["obs_normalizer"] = self.obs_normalizer.state_dict()
        if self.reward_normalizer is not None:
            state["reward_normalizer"] = self.reward_normalizer.state_dict()
        return state

    def load_state_dict(self, state: dict[str, dict[str, torch.Tensor]]) -> None:
        for key, normalizer in (("obs_normalizer", self.obs_normalizer), ("reward_normalizer", self.reward_normalizer)):
            if (key in state) != (normalizer is not None):
                raise ValueError(f"Saved env state has {sorted(state)}, but this env's {key} is "
                                 f"{'on' if normalizer is not None else 'off'}: use the same normalisation flags.")
            if normalizer is not None:
                normalizer.load_state_dict(state[key])

    def episode_state(self) -> dict[str, Any] | None:
        """The episodes in progress: every sub-env's state and the statistics of its episode so far, or None when
        they cannot be saved (envpool, or an env keelrl.envs.episode_state does not cover)."""
        if not isinstance(self._backend, _GymnasiumBackend):
            return None
        envs = [episode_state(env) for env in self._backend.envs]
        if any(state is None for state in envs):
            return None
        return {"envs": envs, "num_steps": self.num_steps, "return": self._episode_return.tolist(),
                "length": self._episode_length.tolist(), "cost": self._episode_cost.tolist()}

    def load_episode_state(self, state: dict[str, Any] | None) -> bool:
        """Go on with the episodes `episode_state` saved (True); with None, keep the episodes the envs are in
        (False). Reset the envs before: their episodes are replaced."""
        if state is None:
            return False
        for env, env_state in zip(self._backend.envs, state["envs"], strict=True):
            load_episode_state(env, env_state)
        self.num_steps = state["num_steps"]
        self._episode_return[:] = state["return"]
        self._episode_length[:] = state["length"]
        self._episode_cost[:] = state["cost"]
        return True

    def close(self) -> None:
        self._backend.close()

    def __enter__(self) -> VecEnv:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _check_finite(self, values: np.ndarray, what: str) -> None:
        if not np.isfinite(values).all():
            raise FloatingPointError(
                f"Environment {self.env_id!r} returned a non-finite {what} (NaN or inf) at vector step "
                f"{self.num_steps} in sub-env(s) {self._non_finite_envs(values)}: fix the environment."
            )

    def _check_finite_actions(self, actions: np.ndarray) -> None:
        if not np.isfinite(actions).all():
            raise FloatingPointError(
                f"The actions given to {self.env_id!r} are not finite (NaN or inf) at vector step {self.num_steps + 1} "
                f"in sub-env(s) {self._non_finite_envs(actions)}: the agent diverged, not the environment (see "
                f"losses/* in TensorBoard; a new run with lower learning rates may not diverge)."
            )

    def _non_finite_envs(self, values: np.ndarray) -> list[int]:
        return np.flatnonzero(~np.isfinite(np.asarray(values).reshape(self.num_envs, -1)).all(axis=1)).tolist()


def make_vec_env(
    env_id: str,
    num_envs: int = 1,
    seed: int = 0,
    backend: str = "gymnasium",
    normalize_obs: bool = False,
    normalize_reward: bool = False,
    gamma: float = 0.99,
    env_kwargs: dict[str, Any] | None = None,
) -> VecEnv:
    """Make `num_envs` copies of `env_id` with keelrl's same-step autoreset semantics.

    Args:
        env_id: a gymnasium id (e.g. "Hopper-v5") or, with backend="envpool", an envpool task id.
        num_envs: number of sub-environments.
        seed: sub-env i is seeded with `seed + i` on both backends.
        backend: "gymnasium" (in-process, any registered env) or "envpool" (C++ batched envs).
        normalize_obs: normalise observations by running mean/std (state in `state_dict()`).
        normalize_reward: divide rewards by the running std of the discounted return.
        gamma: discount of the reward normaliser's return trace.
        env_kwargs: keyword arguments for the env constructor (e.g. max_episode_steps).
    """
    if num_envs < 1:
        raise ValueError(f"num_envs must be at least 1, got {num_envs}.")
    if backend not in BACKENDS:
        raise ValueError(f"Unknown backend {backend!r}: choose one of {BACKENDS}.")
    backend_cls = _GymnasiumBackend if backend == "gymnasium" else _EnvpoolBackend
    backend_env = backend_cls(env_id, num_envs, seed, dict(env_kwargs or {}))
    return VecEnv(backend_env, env_id, num_envs, normalize_obs, normalize_reward, gamma)


def play_episodes(
    policy: Callable[[np.ndarray], np.ndarray],
    env_id: str,
    episodes: int,
    seed: int,
    env_kwargs: dict[str, Any] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Run `episodes` episodes in parallel (one per sub-env) and return their returns and costs.

    `policy` maps a batch of raw observations (episodes, *obs_shape) to
    a batch of actions. Sub-env i is seeded with seed + i.
    """
    if episodes < 1:  # (it was said as make_vec_env's "num_envs must be at least 1")
        raise ValueError(f"episodes must be at least 1, got {episodes}.")
    env = make_vec_env(env_id, num_envs=episodes, seed=seed, env_kwargs=env_kwargs)
    returns = np.full(episodes, np.nan)
    costs = np.zeros(episodes)
    finished = np.zeros(episodes, bool)
    obs, _ = env.reset()
    while not finished.all():
        obs, _, _, _, info = env.step(policy(obs))
        if "_episode" in info:
            first = info["_episode"] & ~finished
            returns[first] = info["episode"]["return"][first]
            costs[first] = info["episode"]["cost"][first]
            finished |= first
    env.close()
    return returns, costs


def require_box_actions(env: VecEnv, agent: str) -> None:
    """Close `env` and refuse it unless its actions are continuous (a Box), naming the agent and the env."""
    if not isinstance(env.single_action_space, gym.spaces.Box):
        env.close()
        raise ValueError(f"{agent} needs a continuous (Box) action space; {env.env_id!r} has "
                         f"{env.single_action_space}. Use a discrete-action agent for it.")


class SeedEnvs:
    """The vector envs of S seeds stepped as one (several seeds trained in one process): arrays gain a leading seed
    axis, (S, num_envs, ...), and `info` holds the true final observations stacked ("final_obs"), on a task with a
    cost the step costs stacked ("cost"), and each seed's own info ("seeds")."""

    def __init__(self, envs: list[VecEnv]):
        self.envs = envs
        self.env_id = envs[0].env_id
        self.single_observation_space = envs[0].single_observation_space
        self.single_action_space = envs[0].single_action_space

    def reset(self) -> tuple[np.ndarray, dict]:
        return np.stack([env.reset()[0] for env in self.envs]), {}

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        """actions (S, num_envs, *action_shape)."""
        steps = [env.step(seed_actions) for env, seed_actions in zip(self.envs, actions)]
        next_obs, rewards, terminated, truncated = (np.stack([step[k] for step in steps]) for k in range(4))
        infos = [step[4] for step in steps]
        info = {"final_obs": np.stack([i["final_obs"] for i in infos]), "seeds": infos}
        if "cost" in infos[0]:
            info["cost"] = np.stack([i["cost"] for i in infos])
        return next_obs, rewards, terminated, truncated, info

    def close(self) -> None:
        for env in self.envs:
            env.close()

    def __enter__(self) -> SeedEnvs:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
