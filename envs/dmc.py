"""DeepMind Control suite tasks as gymnasium environments (`pip install 'keelrl[dmc]'`: dm-control 1.0.50 on the
pinned mujoco 3.17.0).

Importing keelrl.envs registers two ids per task of `dm_control.suite.ALL_TASKS` (`DMC_TASKS`):

    dm_control/{domain}-{task}-v0   action repeat 1: one env step is one DMC control step (as shimmy's ids step)
    {domain}-{task}, every '_' a '-' (cheetah-run, ball-in-cup-catch, walker-walk, ...): the names and the
                                    convention of the published curves in benchmarks/anchors/, action repeat 2

`DMCEnv` holds the suite's env (`suite.load(domain, task, task_kwargs={"random": seed})`):
- observation: the suite's observation dict flattened into one float32 vector, in the suite's key order (a scalar
  is one element), unbounded;
- action: a float32 Box with the action spec's bounds; an action is clipped to them before the suite sees it;
- episode: the suite's own time limit (1000 control steps on every task but lqr's, which have none) ends it as a
  truncation; it terminates only where the suite's time step says discount 0 (lqr, once its state is at rest);
- action repeat: each `step` holds the action for `action_repeat` control steps and returns the sum of their
  rewards, so an episode's return sums every control step's reward (0 to 1000) whatever the repeat; an episode
  that ends within a repeat ends there (1000 control steps are 500 steps at repeat 2);
- `reset(seed=s)` loads a fresh suite env drawing from RandomState(s) (bit for bit the episodes of `suite.load`
  with `random=s`); `reset()` draws the next episode from the same RandomState (the first, from the OS's entropy);
- `render()` (render_mode="rgb_array"): a 240×320 frame of the model's camera 0.

The anchors' convention, from dojeon-ai/SimbaV2 at 14fafb2 (Apache-2.0; the source of published_curves.csv):
- configs/env/dmc.yaml:13 `action_repeat: 2`, :15 `max_episode_steps: 1000`; scale_rl/envs/__init__.py:84-88 puts
  that TimeLimit inside the action repeat (1000 control steps, 500 decisions); scale_rl/envs/wrappers/
  repeat_action.py:16-21 sums the rewards of the repeats and stops at an episode's end; scale_rl/envs/dmc.py:62-66
  loads the task with task_kwargs={"random": seed}.
- Their step counts control steps: run_online.py:159-161 logs at `env_step = interaction_step * action_repeat *
  num_train_envs`, the `env_step` column of results/baseline/*.csv (line 1) that the anchors' `step` is;
  configs/online_rl.yaml:27 runs 1M env steps as 500k decisions and :29 evaluates every 50k decisions, which is
  why their DMC rows come every 100k steps and their Gym MuJoCo rows (repeat 1) every 50k.
- Per decision they make `action_repeat` updates (configs/online_rl.yaml:28: one per control step), with γ from an
  episode of 1000 / action_repeat decisions (:19-20: 0.99 on DMC, where keelrl's `--preset simbav2` takes MuJoCo's
  0.995).

keelrl's run harness counts one step per `env.step` call, so on the anchors' ids a keelrl step is two control
steps: keelrl's step s stands beside the anchors' step 2s (`--total-timesteps 150000` is their 300k column, and
keelrl's 300k their 600k). The dm_control/...-v0 ids count control steps as the anchors do, but at twice their
decision rate: a different control problem, not theirs.

No episode is saved in a checkpoint (keelrl.envs.episode_state does not cover these envs): a resumed run starts
new episodes. quadruped-escape draws its terrain into a rendering context at every reset: on a machine without a
display it needs MUJOCO_GL=egl or osmesa set before dm_control is imported.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np

DMC_TASKS: tuple[tuple[str, str], ...] = (
    ("acrobot", "swingup"), ("acrobot", "swingup_sparse"), ("ball_in_cup", "catch"), ("cartpole", "balance"),
    ("cartpole", "balance_sparse"), ("cartpole", "swingup"), ("cartpole", "swingup_sparse"),
    ("cartpole", "two_poles"), ("cartpole", "three_poles"), ("cheetah", "run"), ("dog", "stand"), ("dog", "walk"),
    ("dog", "trot"), ("dog", "run"), ("dog", "fetch"), ("finger", "spin"), ("finger", "turn_easy"),
    ("finger", "turn_hard"), ("fish", "upright"), ("fish", "swim"), ("hopper", "stand"), ("hopper", "hop"),
    ("humanoid", "stand"), ("humanoid", "walk"), ("humanoid", "run"), ("humanoid", "run_pure_state"),
    ("humanoid_CMU", "stand"), ("humanoid_CMU", "walk"), ("humanoid_CMU", "run"), ("lqr", "lqr_2_1"),
    ("lqr", "lqr_6_2"), ("manipulator", "bring_ball"), ("manipulator", "bring_peg"), ("manipulator", "insert_ball"),
    ("manipulator", "insert_peg"), ("pendulum", "swingup"), ("point_mass", "easy"), ("point_mass", "hard"),
    ("quadruped", "walk"), ("quadruped", "run"), ("quadruped", "escape"), ("quadruped", "fetch"),
    ("reacher", "easy"), ("reacher", "hard"), ("stacker", "stack_2"), ("stacker", "stack_4"),
    ("swimmer", "swimmer6"), ("swimmer", "swimmer15"), ("walker", "stand"), ("walker", "walk"), ("walker", "run"),
)
"""dm_control.suite.ALL_TASKS of dm-control 1.0.50, written out so that registering them imports no dm_control"""
ANCHOR_ACTION_REPEAT = 2
"""the action repeat of the anchors' DMC runs (SimbaV2's configs/env/dmc.yaml:13), that of the short ids"""
RENDER_SIZE = (240, 320)
"""height, width of a rendered frame: dm_control's own default (Physics.render)"""


class DMCEnv(gym.Env):
    """One DeepMind Control suite task as a gymnasium env (see the module docstring)."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, domain: str, task: str, action_repeat: int = 1, render_mode: str | None = None):
        if isinstance(action_repeat, bool) or not isinstance(action_repeat, int) or action_repeat < 1:
            raise ValueError(f"action_repeat must be a whole number of at least 1, got {action_repeat!r}.")
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"DMC tasks render rgb_array frames only, got render_mode={render_mode!r}.")
        self.domain, self.task, self.action_repeat, self.render_mode = domain, task, action_repeat, render_mode
        self._spec = task_spec(domain, task)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (self._spec.observation_size,), np.float32)
        self.action_space = gym.spaces.Box(self._spec.low.astype(np.float32), self._spec.high.astype(np.float32),
                                           dtype=np.float32)
        self.metadata = {**self.metadata, "render_fps": round(1 / (self._spec.control_timestep * action_repeat))}
        self.suite_env = None  # the dm_control env underneath (its physics, its task), loaded at the first reset
        self._renderer = None
        self._episode_over = True

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        if seed is not None or self.suite_env is None:
            self._close_renderer()  # it draws the old env's physics
            self.suite_env = load_suite_env(self.domain, self.task, seed)
        self._episode_over = False
        return self._flatten(self.suite_env.reset().observation), {}

    def step(self, action):
        if self._episode_over:  # the suite would start a new episode silently
            raise ValueError(f"{self.domain}-{self.task}: step() after the episode ended (or before the first "
                             f"reset): call reset() first.")
        action = np.clip(action, self._spec.low, self._spec.high)
        reward = 0.0
        for _ in range(self.action_repeat):
            timestep = self.suite_env.step(action)
            reward += float(timestep.reward)
            if timestep.last():
                break
        terminated = timestep.last() and timestep.discount == 0
        truncated = timestep.last() and not terminated
        self._episode_over = timestep.last()
        return self._flatten(timestep.observation), reward, terminated, truncated, {}

    def render(self) -> np.ndarray:
        """A frame of camera 0 through gymnasium's MuJoCo renderer, which takes its OpenGL backend from MUJOCO_GL
        when it first draws (as keelrl's other MuJoCo envs do): dm_control's own Physics.render fixes its backend
        when dm_control is imported, before --capture-video has chosen one, and cannot draw on a machine without
        a display (seen here: GLFW)."""
        if self.render_mode is None:
            raise ValueError(f"{self.domain}-{self.task} was made without render_mode='rgb_array': make it with "
                             f"gym.make(id, render_mode='rgb_array') to render.")
        if self.suite_env is None:
            raise ValueError(f"{self.domain}-{self.task}: render() before the first reset: call reset() first.")
        if self._renderer is None:
            from gymnasium.envs.mujoco.mujoco_rendering import MujocoRenderer

            physics = self.suite_env.physics
            height, width = RENDER_SIZE
            self._renderer = MujocoRenderer(physics.model.ptr, physics.data.ptr, width=width, height=height,
                                            camera_id=0)
        return self._renderer.render(self.render_mode)

    def close(self) -> None:
        self._close_renderer()

    def _close_renderer(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None

    def _flatten(self, observation: dict[str, np.ndarray]) -> np.ndarray:
        return np.concatenate([np.asarray(observation[key], np.float32).ravel() for key in self._spec.keys])


class TaskSpec(NamedTuple):
    """What a task's spaces are made of."""

    keys: tuple[str, ...]
    """the observation dict's keys, in the suite's order"""
    observation_size: int
    low: np.ndarray
    """the action spec's bounds, float64, (action size,)"""
    high: np.ndarray
    control_timestep: float
    """seconds of simulated time per control step"""


@functools.lru_cache(maxsize=None)
def task_spec(domain: str, task: str) -> TaskSpec:
    """A task's spec, from one load per process (shared by its envs, so read-only): a load takes 0.2 s (cheetah) to
    1 s (dog) here, and an evaluation makes a fresh env per episode, which then loads once, at its seeded reset."""
    suite_env = load_suite_env(domain, task, seed=None)
    observation_spec = suite_env.observation_spec()
    action_spec = suite_env.action_spec()
    size = sum(int(np.prod(spec.shape)) for spec in observation_spec.values())
    low, high = (np.broadcast_to(bound, action_spec.shape).astype(np.float64) for bound in
                 (action_spec.minimum, action_spec.maximum))
    low.flags.writeable = high.flags.writeable = False
    return TaskSpec(tuple(observation_spec), size, low, high, suite_env.control_timestep())


def load_suite_env(domain: str, task: str, seed: int | None):
    """`dm_control.suite.load` with the task's random state seeded (None: from the OS); dm_control is imported here,
    when a task is made, so that registering the ids needs none."""
    try:
        from dm_control import suite
    except ImportError as err:
        raise gym.error.DependencyNotInstalled(
            f"DeepMind Control tasks need dm_control ({err}): pip install 'keelrl[dmc]'.") from None
    return suite.load(domain, task, task_kwargs={"random": seed})


def anchor_id(domain: str, task: str) -> str:
    """The anchors' name of a suite task: 'ball_in_cup', 'catch' -> 'ball-in-cup-catch'."""
    return f"{domain}-{task}".replace("_", "-")


for _domain, _task in DMC_TASKS:
    # registered whether dm_control is installed or not: without it, making one says what to install
    for _env_id, _repeat in ((f"dm_control/{_domain}-{_task}-v0", 1),
                             (anchor_id(_domain, _task), ANCHOR_ACTION_REPEAT)):
        gym.register(_env_id, entry_point="keelrl.envs.dmc:DMCEnv",
                     kwargs={"domain": _domain, "task": _task, "action_repeat": _repeat})
