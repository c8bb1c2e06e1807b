"""Safety tasks: registration, gymnasium's env checker, cost against velocity step by step, CostWrapper,
costs through the vector env and replay buffer, and clear errors for bad input."""

import math
import re
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from keelrl.agents.harness.options import run_cli
from keelrl.agents.sac_lag import SACLagConfig, train
from keelrl.buffers import ReplayBuffer
from keelrl.envs import VELOCITY_TASKS, CostWrapper, make_vec_env


class LineEnv(gym.Env):
    """A point on a line: obs = position, action = velocity, 20-step episodes."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float64)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position, self.t = np.zeros(1), 0
        return self.position.copy(), {}

    def step(self, action):
        self.position = self.position + action
        self.t += 1
        return self.position.copy(), float(action[0]), False, self.t >= 20, {"speed": abs(float(action[0])), "t": self.t}


def nan_at_step_5(action, next_obs, info):
    return math.nan if info["t"] == 5 else 0.0


gym.register("keelrl_test/LineSpeedCost-v0",
             entry_point=lambda: CostWrapper(LineEnv(), lambda action, next_obs, info: float(info["speed"] > 0.5)))
gym.register("keelrl_test/LineNanCost-v0", entry_point=lambda: CostWrapper(LineEnv(), nan_at_step_5))


# The warnings gymnasium's check_env gives for every velocity task (gymnasium 1.x; the messages start with
# a colour code and "WARN: "). The first is about the task being a wrapper stack (the task's TimeLimit over
# keelrl's CostWrapper over gym.make's OrderEnforcing and PassiveEnvChecker); the other two about the observation
# space of gymnasium's own v5 MuJoCo env, whose bounds are ±inf.
KNOWN_CHECK_ENV_WARNINGS = (
    r".*The environment \(<TimeLimit<CostWrapper<OrderEnforcing<PassiveEnvChecker<\w+Env<keelrl/Safe\w+Velocity-v1>>>>>>\)"
    r" is different from the unwrapped version",
    r".*A Box observation space minimum value is -infinity\. This is probably too low\.",
    r".*A Box observation space maximum value is infinity\. This is probably too high\.",
)


@pytest.mark.parametrize("task_id", list(VELOCITY_TASKS))
def test_gymnasium_env_checker_passes_with_no_warning_but_the_known_ones(task_id):
    """check_env's warnings are errors, but for the three known ones above, which must each come exactly once
    (so this test also fails when gymnasium stops giving them, and the list must be revised)."""
    env = gym.make(task_id)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("error")
            for pattern in KNOWN_CHECK_ENV_WARNINGS:
                warnings.filterwarnings("always", message=pattern)
            check_env(env, skip_render_check=True)
    finally:
        env.close()
    messages = [str(w.message) for w in caught]
    assert [[bool(re.match(p, m)) for p in KNOWN_CHECK_ENV_WARNINGS] for m in messages] == [
        [True, False, False], [False, True, False], [False, False, True]], messages


@pytest.mark.parametrize("task_id", list(VELOCITY_TASKS))
def test_cost_follows_the_velocity_step_by_step(task_id):
    """Scripted actions, with the robot pushed to 3× its threshold at step 10: cost == (speed > threshold),
    the speed recomputed from the positions in info."""
    base_id, threshold, planar = VELOCITY_TASKS[task_id]
    env = gym.make(task_id)
    assert type(env.unwrapped).__name__ == base_id.removesuffix("-v5") + "Env"  # the v5 env itself
    assert env.spec.max_episode_steps == 1000
    env.reset(seed=0)
    robot, action_dim = env.unwrapped, env.action_space.shape[0]
    position = None
    costs = []
    for t in range(40):
        if t == 10:
            qvel = robot.data.qvel.copy()
            qvel[0] = 3 * threshold
            robot.set_state(robot.data.qpos.copy(), qvel)
        action = 0.2 * np.sin(0.3 * t + np.arange(action_dim)) * env.action_space.high
        _, _, terminated, truncated, info = env.step(action.astype(np.float32))
        new_position = np.array([info["x_position"], info.get("y_position", 0.0)])
        if position is not None:
            velocity = (new_position - position) / robot.dt
            speed = np.hypot(*velocity) if planar else velocity[0]
            assert abs(speed - threshold) > 1e-6  # no step sits on the threshold
            assert info["cost"] == float(speed > threshold), (t, speed, info["cost"])
        position = new_position
        costs.append(info["cost"])
        if terminated or truncated:
            break
    assert costs[:10] == [0.0] * 10 and costs[10] == 1.0  # both sides of the threshold were exercised
    env.close()


def test_threshold_can_be_overridden():
    env = gym.make("keelrl/SafeHalfCheetahVelocity-v1", velocity_threshold=-100.0)
    env.reset(seed=0)
    assert env.step(env.action_space.sample())[-1]["cost"] == 1.0


@pytest.mark.parametrize("limit", [None, 1200, 7])
def test_the_time_limit_is_the_tasks_own_and_can_be_set(limit):
    """HalfCheetah never falls: its episodes end at the limit, 1000 steps as its v5 env's unless max_episode_steps
    says otherwise, longer ones too (an inner v5 limit once cut them at 1000 while the spec said 1200)."""
    env = gym.make("keelrl/SafeHalfCheetahVelocity-v1", **({} if limit is None else {"max_episode_steps": limit}))
    env.reset(seed=0)
    env.action_space.seed(0)
    steps, truncated = 0, False
    while not truncated:
        *_, terminated, truncated, _ = env.step(env.action_space.sample())
        steps += 1
        assert not terminated
    assert steps == env.spec.max_episode_steps == (limit or 1000)
    env.close()


def test_cost_wrapper_and_vector_env_carry_costs():
    env = make_vec_env("keelrl_test/LineSpeedCost-v0", num_envs=2, seed=0)
    buffer = ReplayBuffer(100, (1,), (1,), num_envs=2, store_cost=True)
    obs, _ = env.reset()
    actions = np.array([[0.9], [0.1]], np.float32)  # sub-env 0 is fast (cost 1), sub-env 1 slow (cost 0)
    for _ in range(20):
        next_obs, rewards, terminated, truncated, info = env.step(actions)
        np.testing.assert_array_equal(info["cost"], [1.0, 0.0])
        buffer.add(obs, actions, rewards, info["final_obs"], terminated, truncated, info["cost"])
        obs = next_obs
    np.testing.assert_array_equal(info["episode"]["cost"], [20.0, 0.0])
    np.testing.assert_array_equal(buffer.costs[:40].reshape(20, 2), np.tile([1.0, 0.0], (20, 1)))
    np.testing.assert_allclose(buffer.rewards[:40].numpy(), np.tile([0.9, 0.1], 20), rtol=1e-7)  # reward = action
    # positions by hand: sub-env e is at (t + 1) · action_e after step t; the last one truncates at 20 steps
    np.testing.assert_allclose(buffer.next_obs[:40, 0].numpy().reshape(20, 2),
                               np.arange(1, 21)[:, None] * np.array([0.9, 0.1], np.float32), rtol=1e-6)
    np.testing.assert_array_equal(buffer.truncated[:40].numpy().reshape(20, 2)[:, 0], [False] * 19 + [True])
    batch = buffer.sample(64)
    assert batch.costs.shape == (64,)
    # each sampled cost belongs to its own transition: 1 for the fast sub-env's action 0.9, 0 for 0.1
    np.testing.assert_array_equal(batch.costs.numpy(), (batch.actions[:, 0] > 0.5).float().numpy())
    assert 0 < batch.costs.sum() < 64


def test_nan_cost_from_a_user_cost_function_is_one_clear_error():
    env = CostWrapper(LineEnv(), lambda action, next_obs, info: float("nan"))
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"cost function <lambda> returned nan at step 1 .*finite number"):
        env.step(np.zeros(1, np.float32))
    with pytest.raises(ValueError, match="cost_fn must be callable"):
        CostWrapper(LineEnv(), 1.0)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--cost-limit", "-1"], "--cost-limit must be a non-negative number"),
        (["--cost-limit", "nan"], "--cost-limit must be a non-negative number"),
        (["--lambda-lr", "-0.1"], "--lambda-lr must be non-negative"),
        (["--env-id", "Hopper-v5"], r"SAC-Lag needs a task that reports a per-step cost in info\['cost'\].*CostWrapper"),
        (["--env-id", "keelrl/SafeHoperVelocity-v1"], "Unknown gymnasium environment id"),
        (["--env-backend", "envpool"], "cannot run keelrl's Python safety tasks: use --env-backend gymnasium"),
        (["--env-id", "keelrl_test/LineNanCost-v0", "--learning-starts", "10"], r"returned nan at step 5"),
    ],
)
def test_bad_input_is_one_clear_line_and_exit_code_2(args, message, tmp_path, capsys):
    common = ["--env-id", "keelrl/SafeSwimmerVelocity-v1", "--total-timesteps", "40", "--batch-size", "8",
              "--hidden-sizes", "8", "--runs-dir", str(tmp_path), "--quiet"]
    code = run_cli(train, SACLagConfig, args=[*common, *args])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: ") and "Traceback" not in err and err.count("\n") == 1
    assert re.search(message, err), err
