import signal

import gymnasium as gym
import numpy as np
import pytest
import torch

from keelrl.buffers import ReplayBuffer
from keelrl.envs import CostWrapper

from helpers import CountingEnv

torch.set_num_threads(1)
# A suite started in the background by a non-interactive shell (`make test &`, nohup, a CI job's `cmd &`) inherits
# SIGINT ignored, so Python installs no KeyboardInterrupt handler; the tests of Ctrl-C handling need Python's default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def nan_reward_at(nan_step: int):
    """A CountingEnv reward: 0 until step `nan_step` of an episode, which pays NaN."""
    return lambda t, action: float("nan") if t == nan_step else 0.0


# episodes of zeros that never end (NanRewardLate: a 300-step time limit), with a NaN reward at step 5 (250)
gym.register("keelrl_test/NanReward-v0", entry_point=lambda: CountingEnv(2, reward=nan_reward_at(5)))
gym.register("keelrl_test/NanRewardLate-v0", entry_point=lambda: CountingEnv(2, reward=nan_reward_at(250)),
             max_episode_steps=300)
# 10-step episodes of zeros, truncated at the end, where every step costs 1 (through CostWrapper)
gym.register("keelrl_test/AlwaysCost-v0",
             entry_point=lambda: CostWrapper(CountingEnv(3, length=10), lambda a, o, i: 1.0))


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
