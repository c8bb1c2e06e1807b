"""keelrl.envs: vector environments (gymnasium | envpool) with one autoreset semantics, and wrappers."""

from keelrl.envs.normalize import ObsNormalizer, RewardNormalizer, RunningMeanStd
from keelrl.envs.vec_env import VecEnv, make_vec_env

__all__ = ["make_vec_env", "VecEnv", "ObsNormalizer", "RewardNormalizer", "RunningMeanStd"]
