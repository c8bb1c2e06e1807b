"""DeepMind Control tasks as gymnasium envs (keelrl.envs.dmc): the suite's own episodes, bit for bit, behind every
keelrl env path (gymnasium's checker, make_vec_env's same-step autoreset, an agent's run)."""

import csv
import math
import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from keelrl.envs import make_vec_env
from keelrl.envs.dmc import ANCHOR_ACTION_REPEAT, DMC_TASKS, anchor_id, task_spec
from keelrl.envs.video import VideoUnavailable, offscreen_gl_backend

try:
    from dm_control import suite
except ImportError:
    suite = None
needs_dm_control = pytest.mark.skipif(suite is None, reason="dm_control is not installed: pip install 'keelrl[dmc]'")
# id, action repeat, agent steps in an episode (the suite's 1000 control steps)
CHEETAH = [("dm_control/cheetah-run-v0", 1, 1000), ("cheetah-run", 2, 500)]


def suite_observation(timestep) -> np.ndarray:
    """The suite's observation dict as keelrl flattens it, computed another way: float64 concatenated, then float32."""
    return np.concatenate([np.atleast_1d(value).ravel() for value in timestep.observation.values()]).astype(np.float32)


def random_actions(steps: int, size: int) -> np.ndarray:
    return np.random.default_rng(0).uniform(-1, 1, (steps, size)).astype(np.float32)


def suite_steps(suite_env, action: np.ndarray, repeat: int):
    """`repeat` control steps of the suite's env by hand: the last time step and the summed reward."""
    reward = 0.0
    for _ in range(repeat):
        timestep = suite_env.step(action)
        reward += timestep.reward
        if timestep.last():
            break
    return timestep, reward


def check_env_quietly(env: gym.Env, **kwargs) -> None:
    """gymnasium's env checker, without its warning about the unbounded observations (which every MuJoCo env has)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Box observation space (minimum|maximum) value is")
        check_env(env, **kwargs)


def test_every_suite_task_is_registered_under_both_names():
    if suite is not None:
        assert DMC_TASKS == suite.ALL_TASKS  # the written-out list follows the installed suite
    ids = {anchor_id(domain, task) for domain, task in DMC_TASKS}
    assert len(ids) == len(DMC_TASKS) and {"cheetah-run", "ball-in-cup-catch", "cartpole-swingup-sparse"} <= ids
    for domain, task in DMC_TASKS:
        for env_id, repeat in ((f"dm_control/{domain}-{task}-v0", 1), (anchor_id(domain, task), ANCHOR_ACTION_REPEAT)):
            spec = gym.spec(env_id)
            assert spec.kwargs == {"domain": domain, "task": task, "action_repeat": repeat}
            assert spec.max_episode_steps is None  # the suite's own time limit ends an episode


def test_without_dm_control_making_a_task_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "dm_control", None)  # as if it were not installed
    task_spec.cache_clear()  # a task another test made would not load the suite again
    with pytest.raises(ValueError, match=r"^cheetah-run needs a package .*pip install 'keelrl\[dmc\]'"):
        make_vec_env("cheetah-run")


@needs_dm_control
@pytest.mark.parametrize("env_id", ["cheetah-run", "dm_control/fish-swim-v0"])
def test_gymnasium_env_checker_passes(env_id):
    env = gym.make(env_id)
    check_env_quietly(env.unwrapped, skip_render_check=True)  # rendering: the last test, where a backend loads
    env.close()


@needs_dm_control
@pytest.mark.parametrize("env_id, repeat, length", CHEETAH)
def test_episodes_are_the_suites_bit_for_bit_and_end_by_truncation(env_id, repeat, length):
    env = gym.make(env_id)
    suite_env = suite.load("cheetah", "run", task_kwargs={"random": 3})
    obs, _ = env.reset(seed=3)
    first = suite_observation(suite_env.reset())
    assert obs.dtype == np.float32 and np.array_equal(obs, first)
    for step, action in enumerate(random_actions(length, 6)):
        obs, reward, terminated, truncated, _ = env.step(action)
        timestep, suite_reward = suite_steps(suite_env, action, repeat)
        assert np.array_equal(obs, suite_observation(timestep)) and reward == suite_reward
        assert not terminated and truncated == (step == length - 1)
    assert timestep.last() and timestep.discount == 1.0  # the suite's time limit, after 1000 control steps
    with pytest.raises(ValueError, match="call reset"):  # the suite would begin a new episode without saying so
        env.step(action)
    # reset() without a seed goes on drawing from the same random state, as the suite's reset; a seed starts over
    assert np.array_equal(env.reset()[0], suite_observation(suite_env.reset()))
    assert np.array_equal(env.reset(seed=3)[0], first)
    env.close()


@needs_dm_control
def test_actions_are_clipped_to_their_bounds_and_a_zero_discount_terminates(monkeypatch):
    env = gym.make("fish-swim")  # a task with a scalar observation ('upright')
    suite_env = suite.load("fish", "swim", task_kwargs={"random": 0})
    env.reset(seed=0)
    suite_env.reset()
    obs = env.step(np.full(5, 3.0, np.float32))[0]
    assert obs.shape == env.observation_space.shape == (24,)
    assert np.array_equal(obs, suite_observation(suite_steps(suite_env, np.ones(5), ANCHOR_ACTION_REPEAT)[0]))
    monkeypatch.setattr(env.unwrapped.suite_env.task, "get_termination", lambda physics: 0.0)
    _, _, terminated, truncated, _ = env.step(np.zeros(5, np.float32))
    assert terminated and not truncated
    env.close()


@needs_dm_control
@pytest.mark.parametrize("env_id, repeat, length", CHEETAH)
def test_vector_env_resets_on_the_same_step_with_the_true_final_observation(env_id, repeat, length):
    env = make_vec_env(env_id, num_envs=1, seed=5)
    suite_env = suite.load("cheetah", "run", task_kwargs={"random": 5})
    suite_env.reset()
    env.reset()
    for action in random_actions(length, 6):
        next_obs, reward, terminated, truncated, info = env.step(action[None])
        timestep, suite_reward = suite_steps(suite_env, action, repeat)
        assert reward[0] == suite_reward
    assert truncated[0] and not terminated[0] and info["episode"]["length"][0] == length
    assert np.array_equal(info["final_obs"][0], suite_observation(timestep))
    assert np.array_equal(next_obs[0], suite_observation(suite_env.reset()))  # the next episode, the same step
    assert env.episode_state() is None  # not saved: a resumed run starts new episodes
    env.close()


@needs_dm_control
def test_sac_trains_and_evaluates_on_a_dmc_task(tmp_path):
    from keelrl.agents.sac import SACConfig, train

    result = train(SACConfig(env_id="cheetah-run", total_timesteps=300, learning_starts=100, batch_size=32,
                             hidden_sizes=(32, 32), buffer_size=1000, eval_freq=150, eval_episodes=1,
                             checkpoint_freq=300, log_freq=100, runs_dir=str(tmp_path), quiet=True))
    with open(result.run_dir / "eval.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(row["global_step"]) for row in rows] == [150, 300]
    assert all(math.isfinite(float(row["mean_return"])) for row in rows)


@needs_dm_control
def test_renders_rgb_frames_through_the_backend_chosen_after_dm_control_was_imported():
    try:
        offscreen_gl_backend()  # what --capture-video does, after the run's envs were made
    except VideoUnavailable as err:
        pytest.skip(f"no offscreen rendering on this machine: {err}")
    check_env_quietly(gym.make("cheetah-run").unwrapped)  # with its check of rendering
    env = gym.make("cheetah-run", render_mode="rgb_array")
    env.reset(seed=0)
    frame = env.render()
    assert frame.shape == (240, 320, 3) and frame.dtype == np.uint8 and frame.std() > 0
    assert env.metadata["render_fps"] == 50  # 100 control steps a second, two per agent step
    env.close()
