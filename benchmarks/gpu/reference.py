"""Run a CleanRL or LeanRL training script unchanged on gymnasium 1.x, without network, for speed comparisons.

    python -m keelrl.benchmarks.gpu.reference SCRIPT [SCRIPT_ARGS...]

The GPU speed measurements run CleanRL's `cleanrl/{sac,td3}_continuous_action.py` and LeanRL's
`leanrl/{sac,td3}_continuous_action_torchcompile.py` beside keelrl. Those scripts are written for gymnasium
0.29 and Weights & Biases; here gymnasium is 1.x and the GPU machine has no network. Before running SCRIPT as
`python SCRIPT SCRIPT_ARGS...` would (as `__main__`, its folder first on sys.path), this bridges:

- the vector API: `gymnasium.vector.SyncVectorEnv` becomes a subclass that resets a finished sub-environment
  in the same step (gymnasium 0.29's autoreset) and reports it in 0.29's layout: `infos["final_info"]`, an
  object array with the finished sub-environments' own info dicts at their indices (None elsewhere), and
  `infos["final_observation"]`, an object array with their last observations. The final observation is given
  on steps where some sub-environment was truncated, the only ones where these scripts read it: 0.29 also gave
  it on terminations, where LeanRL's TD3 assigns an empty selection of it into a tensor and fails. Without a
  finished sub-environment neither key is there; other info keys stay as gymnasium 1.x gives them, and so do
  RecordEpisodeStatistics' episode figures (scalars where 0.29 gave one-element arrays; all four scripts read
  both);
- `import wandb`: a stand-in module whose init/log/finish/watch do nothing (LeanRL calls wandb.init always).

Nothing else changes: the scripts print their own speed (CleanRL "SPS: N" lines on stdout, LeanRL "X sps" in
its progress bar on stderr). CleanRL's scripts import `cleanrl_utils` from the folder above theirs: put that
folder on PYTHONPATH.
"""

from __future__ import annotations

import importlib.machinery
import os
import runpy
import sys
import types

import gymnasium
import numpy as np

USAGE = "usage: python -m keelrl.benchmarks.gpu.reference SCRIPT [SCRIPT_ARGS...]"


def env_entry(batched: dict, index: int) -> dict:
    """Sub-environment `index`'s own info dict out of a gymnasium 1.x batched one (keys with a `_key` mask)."""
    entry = {}
    for key, value in batched.items():
        mask = batched.get(f"_{key}")
        if mask is not None and mask[index]:
            entry[key] = env_entry(value, index) if isinstance(value, dict) else value[index]
    return entry


def as_gym029(infos: dict, truncations: np.ndarray) -> dict:
    """Turn same-step autoreset infos (`final_obs`, `final_info`) into gymnasium 0.29's keys."""
    finished = infos.pop("_final_info")
    batched = infos.pop("final_info")
    final_info = np.full(len(finished), None, dtype=object)
    for index in np.flatnonzero(finished):
        final_info[index] = env_entry(batched, index)
    infos["final_info"], infos["_final_info"] = final_info, finished
    final_obs, final_obs_mask = infos.pop("final_obs"), infos.pop("_final_obs")
    if truncations.any():
        infos["final_observation"], infos["_final_observation"] = final_obs, final_obs_mask
    return infos


class Gym029SyncVectorEnv(gymnasium.vector.SyncVectorEnv):
    """gymnasium 1.x's SyncVectorEnv with gymnasium 0.29's autoreset and final-step infos."""

    def __init__(self, env_fns, copy: bool = True):
        super().__init__(env_fns, copy=copy, autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP)

    def step(self, actions):
        """Step every sub-environment, resetting the finished ones at once (their last step in 0.29's infos)."""
        observations, rewards, terminations, truncations, infos = super().step(actions)
        if "final_info" in infos:
            infos = as_gym029(infos, truncations)
        return observations, rewards, terminations, truncations, infos


def wandb_stand_in() -> types.ModuleType:
    """A `wandb` module whose calls do nothing: no account, no network."""
    module = types.ModuleType("wandb")
    module.__spec__ = importlib.machinery.ModuleSpec("wandb", None)  # for libraries probing find_spec("wandb")
    for name in ("init", "log", "finish", "watch"):
        setattr(module, name, lambda *args, **kwargs: None)
    return module


def run(script: str, script_args: list[str]) -> None:
    """Run `script` with `script_args` as its command line, with the gymnasium and wandb bridges in place."""
    if not os.path.isfile(script):
        sys.exit(f"{script}: no such file (give the path of a CleanRL or LeanRL script)\n{USAGE}")
    gymnasium.vector.SyncVectorEnv = Gym029SyncVectorEnv
    sys.modules["wandb"] = wandb_stand_in()
    sys.argv = [script, *script_args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        sys.exit(USAGE)
    run(sys.argv[1], sys.argv[2:])


if __name__ == "__main__":
    main()
