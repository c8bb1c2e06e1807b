"""benchmarks/gpu/reference.py: a script written for gymnasium 0.29's vector API and wandb runs unchanged."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

# What CleanRL's and LeanRL's SAC/TD3 loops do with a vector env, on envs whose episodes end on known steps.
FAKE_SCRIPT = '''
import json
import sys

import gymnasium as gym
import numpy as np
import wandb


class Counter(gym.Env):
    """Observation: steps since reset; reward 1 a step; terminated after `terminate_at` steps if given."""

    observation_space = gym.spaces.Box(0.0, 100.0, (1,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self, terminate_at=None):
        self.terminate_at = terminate_at

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([self.t], np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([self.t], np.float32), 1.0, self.t == self.terminate_at, False, {}


gym.register("Counter-v0", entry_point=Counter, max_episode_steps=5)


def make_env(terminate_at):
    def thunk():
        return gym.wrappers.RecordEpisodeStatistics(gym.make("Counter-v0", terminate_at=terminate_at))

    return thunk


def rollout(terminate_ats, steps):
    envs = gym.vector.SyncVectorEnv([make_env(t) for t in terminate_ats])
    envs.single_observation_space.dtype = np.float32
    obs, _ = envs.reset(seed=1)
    seen = []
    for _ in range(steps):
        actions = np.array([envs.single_action_space.sample() for _ in range(envs.num_envs)])
        next_obs, rewards, terminations, truncations, infos = envs.step(actions)
        step = {"keys": sorted(infos), "next_obs": next_obs[:, 0].tolist()}
        if "final_info" in infos:
            step["episodes"] = [None if info is None else [float(info["episode"]["r"].reshape(())),
                                                           int(info["episode"]["l"])] for info in infos["final_info"]]
        real_next_obs = next_obs.copy()
        for idx, trunc in enumerate(truncations):
            if trunc:
                real_next_obs[idx] = infos["final_observation"][idx]
        step["real_next_obs"] = real_next_obs[:, 0].tolist()
        if "final_observation" in infos:
            truncated = np.asarray(list(infos["final_observation"][truncations]), dtype=np.float32)
            step["truncated_final_obs"] = truncated[:, 0].tolist()
        seen.append(step)
        obs = next_obs
    envs.close()
    return seen


wandb.init(project="fake", config={"seed": 1}, save_code=True)
seen = {"two_envs": rollout([3, None], 15), "one_env": rollout([None], 10), "argv": sys.argv,
        "wandb_file": getattr(wandb, "__file__", None)}
wandb.log({"speed": 1.0}, step=15)
wandb.finish()
with open(sys.argv[1], "w") as file:
    json.dump(seen, file)
'''

FINAL_KEYS = ["_final_info", "final_info"]
TRUNCATED_KEYS = ["_final_info", "_final_observation", "final_info", "final_observation"]


def run_reference(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "keelrl.benchmarks.gpu.reference", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=60)


def test_a_gymnasium_029_script_sees_029_final_steps_and_a_silent_wandb(tmp_path):
    script, out = tmp_path / "fake.py", tmp_path / "seen.json"
    script.write_text(FAKE_SCRIPT)
    result = run_reference(str(script), str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    seen = json.loads(out.read_text())
    assert seen["argv"] == [str(script), str(out)] and seen["wandb_file"] is None  # the stand-in, not the package
    # env 0 is terminated every 3 steps, env 1 truncated every 5 (max_episode_steps); reward 1 a step
    for k, step in enumerate(seen["two_envs"], start=1):
        ended = (k % 3 == 0, k % 5 == 0)
        assert step["next_obs"] == [0.0 if ended[0] else k % 3, 0.0 if ended[1] else k % 5]  # reset in the same step
        assert step["real_next_obs"] == [step["next_obs"][0], 5.0 if ended[1] else k % 5]
        assert step["keys"] == (TRUNCATED_KEYS if ended[1] else FINAL_KEYS if ended[0] else []), k
        if any(ended):
            assert step["episodes"] == [[3.0, 3] if ended[0] else None, [5.0, 5] if ended[1] else None]
        if ended[1]:
            assert step["truncated_final_obs"] == [5.0]
    # one env: final_info holds no None, as LeanRL's loops (which do not test for None) need
    ends = [step for step in seen["one_env"] if "final_info" in step["keys"]]
    assert [step["episodes"] for step in ends] == [[[5.0, 5]], [[5.0, 5]]]
    assert [step["truncated_final_obs"] for step in ends] == [[5.0], [5.0]]


def test_a_missing_script_is_one_clear_error(tmp_path):
    result = run_reference(str(tmp_path / "missing.py"), cwd=tmp_path)
    assert result.returncode == 1 and "missing.py: no such file" in result.stderr
    assert "Traceback" not in result.stderr
