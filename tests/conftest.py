import signal

import gymnasium as gym
import numpy as np
import pytest
import torch

from keelrl.buffers import ReplayBuffer
from keelrl.envs import CostWrapper

torch.set_num_threads(1)
# A suite started in the background by a non-interactive shell (`make test &`, nohup, a CI job's `cmd &`) inherits
# SIGINT ignored, so Python installs no KeyboardInterrupt handler; the tests of Ctrl-C handling need Python's default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


class NanRewardEnv(gym.Env):
    """Rewards 0 until step `nan_step` of an episode, which returns a NaN reward."""

    observation_space = gym.spaces.Box(-1, 1, (2,))
    action_space = gym.spaces.Box(-1, 1, (1,))

    def __init__(self, nan_step: int):
        self.nan_step = nan_step

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        reward = float("nan") if self.t == self.nan_step else 0.0
        return np.zeros(2, np.float32), reward, False, False, {}


gym.register("keelrl_test/NanReward-v0", entry_point=NanRewardEnv, kwargs={"nan_step": 5})
gym.register("keelrl_test/NanRewardLate-v0", entry_point=NanRewardEnv, kwargs={"nan_step": 250}, max_episode_steps=300)


class ConstantEnv(gym.Env):
    """10-step episodes of zeros, truncated at the end; as keelrl_test/AlwaysCost-v0 every step costs 1 (through
    CostWrapper)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(3, np.float32), 0.0, False, self.t >= 10, {}


gym.register("keelrl_test/AlwaysCost-v0", entry_point=lambda: CostWrapper(ConstantEnv(), lambda a, o, i: 1.0))


OBS_DIM, ACTION_DIM = 5, 2


@pytest.fixture
def fixed_batch():
    """256 fixed transitions (obs 5, actions 2 in [-1, 1], reward = first obs entry, 10% terminal)."""
    rng = np.random.default_rng(0)
    size = 256
    buffer = ReplayBuffer(size, (OBS_DIM,), (ACTION_DIM,), seed=0)
    obs = rng.normal(size=(size, OBS_DIM))
    for i in range(size):
        buffer.add(obs[i : i + 1], rng.uniform(-1, 1, (1, ACTION_DIM)), obs[i : i + 1, 0],
                   rng.normal(size=(1, OBS_DIM)), [rng.random() < 0.1], [False])
    return buffer.sample(size)
