"""keelrl.envs: vector environments (gymnasium | envpool) with one autoreset semantics, wrappers, the safety tasks
and the DeepMind Control tasks (importing keelrl.envs registers keelrl/Safe*Velocity-v1, dm_control/{domain}-{task}-v0
and the anchors' short DMC names such as cheetah-run: see keelrl.envs.dmc)."""

from keelrl.envs.dmc import DMCEnv
from keelrl.envs.normalize import ObsNormalizer, RewardNormalizer, RunningStats
from keelrl.envs.safety import VELOCITY_TASKS, CostWrapper
from keelrl.envs.streaming_wrappers import load_stream_env_state, make_stream_env, stream_env_state
from keelrl.envs.vec_env import SeedEnvs, VecEnv, make_vec_env, play_episodes, require_box_actions

__all__ = ["make_vec_env", "SeedEnvs", "play_episodes", "require_box_actions", "VecEnv", "ObsNormalizer", "RewardNormalizer", "RunningStats",
           "CostWrapper", "VELOCITY_TASKS", "DMCEnv", "make_stream_env", "stream_env_state", "load_stream_env_state"]
