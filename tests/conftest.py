import gymnasium as gym
import numpy as np
import torch

torch.set_num_threads(1)


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
