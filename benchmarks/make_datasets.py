"""Make D4RL-style offline datasets with keelrl's SAC and store them as Minari datasets.

Run:  python -m keelrl.benchmarks.make_datasets --env-id Hopper-v5                 # full D4RL scale (1M)
      python -m keelrl.benchmarks.make_datasets --env-id Hopper-v5 --quick         # a quick look (~3 minutes)
Load: keelrl.buffers.offline.load_dataset("keelrl/hopper-medium-v0")  (or --dataset of any offline agent)

The D4RL recipe (Fu et al. 2020), for one environment:
- `random`: `--steps` transitions of a uniform random policy;
- `medium`: SAC trained and stopped early, when its deterministic evaluation first reaches
  `--medium-return` (default: one third of D4RL's expert return for hopper, halfcheetah and walker2d);
  `--steps` transitions of that policy, actions sampled from it;
- `medium-replay`: the replay buffer of that medium run (every transition seen until it stopped; SAC trains in
  chunks of `--eval-every` steps, and its envs start new episodes at each chunk, so the episodes in progress there
  end as timeouts: D4RL's buffers have no such cuts);
- `expert`: the same SAC run continued to `--sac-steps`; `--steps` transitions of it;
- `medium-expert`: medium followed by expert.
`--quick` makes keelrl/{env}-{random,medium,medium-replay}-quick-v0 in a few minutes: SAC trains for only
10,000 environment steps and its policy then is "medium" whatever its return (a weak policy, not D4RL's
medium), 10,000 transitions each. Every dataset's Minari description says how its policy was made (SAC's
budget and evaluation return). Every dataset records `ref_min_score` (mean return of the random policy) and
`ref_max_score` (mean return of the deterministic expert) over `--ref-episodes` episodes; without an expert in the
run, D4RL's expert reference return is used. The references are measured once per `--work-dir` and kept for every
dataset made there later (an expert made later does not change them), so that all datasets of one environment and
version are scored alike; each dataset's description says which they are.

Resuming: everything lives in `--work-dir`. SAC trains in chunks of `--eval-every` steps with a
checkpoint after each, finished policies are kept (medium.pt, medium_buffer.pt, expert.pt) and a
Minari dataset that exists is not rewritten, so rerunning the same command continues where it stopped.
Instead of training, `--medium-model`, `--medium-buffer` and `--expert-model` take existing keelrl
SAC files (a run's model.pt and buffer.pt).

Before anything is made (the work directory included), the options are checked (keelrl.benchmarks.dataset_options:
the options and their checks).
"""

from __future__ import annotations

import csv
import json
import math
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from keelrl.agents.harness.checkpoints import BUFFER_FILE, CHECKPOINT_FILE, MODEL_FILE
from keelrl.agents.harness.logs import EVAL_FILE, progress_bar
from keelrl.agents.harness.options import parse_command_line
from keelrl.agents.harness.stopping import RunStopped
from keelrl.agents.sac import SAC, SACConfig
from keelrl.agents.sac import train as train_sac
from keelrl.benchmarks.dataset_options import MakeDatasetsConfig, validate, with_quick
from keelrl.buffers.offline import (
    D4RL_REF_SCORES,
    data_root,
    env_family,
    episode_returns,
    load_dataset,
    normalized_score,
    write_minari_dataset,
)
from keelrl.envs import make_vec_env, play_episodes

COLLECTION_SEED = {"random": 5000, "medium": 6000, "expert": 7000}
"""added to --seed for each collected dataset's envs: apart, so that medium-expert's halves start from different
initial states (medium's is the seed its datasets have always had)"""


def dataset_id(env_id: str, kind: str, version: int = 0, quick: bool = False) -> str:
    return f"keelrl/{env_family(env_id)}-{kind}{'-quick' if quick else ''}-v{version}"


def collect(env_id: str, policy: Callable[[np.ndarray], np.ndarray], steps: int, num_envs: int, seed: int,
            quiet: bool = True, desc: str = "collect") -> dict[str, np.ndarray]:
    """`steps` transitions of `policy` in the D4RL layout, each env's episodes contiguous.

    The last transition of each env's stream closes an episode cut by the end of collection: it is
    marked a timeout unless it is terminal.
    """
    env = make_vec_env(env_id, num_envs=num_envs, seed=seed)
    vector_steps = math.ceil(steps / num_envs)
    columns: dict[str, list[np.ndarray]] = {key: [] for key in ("observations", "actions", "rewards",
                                                                "next_observations", "terminals", "timeouts")}
    obs, _ = env.reset()
    bar = progress_bar(vector_steps * num_envs, 0, quiet)
    bar.set_description(desc)
    for _ in range(vector_steps):
        actions = policy(obs)
        next_obs, rewards, terminated, truncated, info = env.step(actions)
        for key, value in zip(columns, (obs, actions, rewards, info["final_obs"], terminated, truncated & ~terminated)):
            columns[key].append(np.asarray(value, dtype=np.float32))
        obs = next_obs
        bar.update(num_envs)
    bar.close()
    env.close()
    # (T, N, ...) -> env-major (N * T, ...): each env's transitions in order
    data = {key: np.stack(parts).swapaxes(0, 1).reshape(vector_steps * num_envs, *parts[0].shape[1:])
            for key, parts in columns.items()}
    stream_ends = np.arange(1, num_envs + 1) * vector_steps - 1
    data["timeouts"][stream_ends] = 1.0 - data["terminals"][stream_ends]
    data = {key: value[:steps] for key, value in data.items()}
    data["timeouts"][-1] = 1.0 - data["terminals"][-1]
    return data


def uniform_policy(env_id: str, seed: int) -> Callable[[np.ndarray], np.ndarray]:
    """Uniform random actions in the env's action box, for a batch of observations."""
    env = make_vec_env(env_id, 1, seed)
    low, high = env.single_action_space.low, env.single_action_space.high
    env.close()
    rng = np.random.default_rng(seed)

    def policy(obs: np.ndarray) -> np.ndarray:
        return rng.uniform(low, high, (len(obs), *low.shape)).astype(np.float32)

    return policy


def replay_buffer_dataset(buffer_path: str | Path) -> dict[str, np.ndarray]:
    """The transitions of a single-env keelrl SAC run's buffer.pt (see `check_medium_buffer` in dataset_options.py),
    oldest first, in the D4RL layout."""
    state = torch.load(buffer_path, map_location="cpu", weights_only=True)
    size, pos = len(state["rewards"]), int(state["pos"])
    order = np.roll(np.arange(size), -pos) if size == int(state["capacity"]) else np.arange(size)

    def column(name: str) -> np.ndarray:
        return state[name].numpy()[order].astype(np.float32)

    terminals = column("terminated")
    data = {"observations": column("obs"), "actions": column("actions"), "rewards": column("rewards"),
            "next_observations": column("next_obs"), "terminals": terminals,
            "timeouts": column("truncated") * (1.0 - terminals)}
    # an episode cut without a flag (the run stopped, or was resumed, mid-episode) is a time-limit end
    cut = np.append(np.any(data["next_observations"][:-1] != data["observations"][1:], axis=1), True)
    data["timeouts"] = np.maximum(data["timeouts"], cut * (1.0 - terminals)).astype(np.float32)
    return data


class DatasetMaker:
    """The phases of the recipe, each skipped when its output already exists."""

    def __init__(self, config: MakeDatasetsConfig):
        """Settle the medium return and the expert reference, refusing an env D4RL has no reference for where
        neither is given, before the work directory is made."""
        self.config = config
        self.data_path = data_root(config.data_path or None)
        self.work = Path(config.work_dir or Path("runs") / "make_datasets" / (config.env_id + "-quick" * config.quick))
        family = env_family(config.env_id)
        self.medium_return = float("inf") if config.quick else config.medium_return  # quick: SAC at sac_steps
        if self.medium_return is None:
            if family not in D4RL_REF_SCORES:
                raise ValueError(f"No D4RL expert return is known for {config.env_id}: give --medium-return.")
            self.medium_return = D4RL_REF_SCORES[family][1] / 3
        if not (self.has_expert() or family in D4RL_REF_SCORES or (self.work / "ref_scores.json").is_file()):
            raise ValueError(f"No expert is made here and D4RL has no reference for {config.env_id}: add expert "
                             f"to --datasets or give --expert-model.")
        self.work.mkdir(parents=True, exist_ok=True)

    def log(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    # --- SAC: one run, grown in chunks; medium is taken on the way, expert at the end
    def _sac_run(self) -> Path | None:
        runs = sorted((self.work / "sac").glob(f"*__sac__{self.config.seed}__*"))
        runs = [run for run in runs if (run / CHECKPOINT_FILE).is_file()]
        return runs[-1] if runs else None

    def _train_sac_to(self, total_steps: int) -> tuple[Path, float]:
        """Run (or continue) the SAC run until `total_steps`; its run directory and final evaluation return."""
        run_dir = self._sac_run()
        if run_dir is None:
            result = train_sac(SACConfig(
                env_id=self.config.env_id, seed=self.config.seed, total_timesteps=total_steps,
                learning_starts=self.config.learning_starts, eval_freq=0, checkpoint_freq=self.config.eval_every,
                runs_dir=str(self.work / "sac"), quiet=self.config.quiet))
        elif self._sac_step() >= total_steps and (run_dir / MODEL_FILE).is_file():  # there already: its last
            with (run_dir / EVAL_FILE).open() as f:                                  # evaluation stands
                return run_dir, float(list(csv.DictReader(f))[-1]["mean_return"])
        else:
            result = train_sac(SACConfig(resume=str(run_dir), extend_to=total_steps, quiet=self.config.quiet))
        return result.run_dir, result.final_eval_return

    def _sac_step(self) -> int:
        run_dir = self._sac_run()
        if run_dir is None:
            return 0
        return int(torch.load(run_dir / CHECKPOINT_FILE, map_location="cpu", weights_only=True)["global_step"])

    def medium_files(self) -> tuple[Path, Path | None]:
        if self.config.medium_model:
            buffer = Path(self.config.medium_buffer) if self.config.medium_buffer else None
            return Path(self.config.medium_model), buffer
        model, buffer = self.work / "medium.pt", self.work / "medium_buffer.pt"
        step = self._sac_step()
        while not model.is_file():
            step = min(self.config.sac_steps, (step // self.config.eval_every + 1) * self.config.eval_every)
            run_dir, eval_return = self._train_sac_to(step)
            goal = "--quick: medium is SAC at --sac-steps" if self.config.quick else f"medium at {self.medium_return:.1f}"
            self.log(f"SAC step {step}: evaluation return {eval_return:.1f} ({goal})")
            if eval_return >= self.medium_return or step >= self.config.sac_steps:
                shutil.copy(run_dir / BUFFER_FILE, buffer)
                shutil.copy(run_dir / MODEL_FILE, model)
                self._write_provenance("medium", step, eval_return)
        return model, buffer

    def _write_provenance(self, policy: str, step: int, eval_return: float) -> None:
        (self.work / f"{policy}.json").write_text(json.dumps({"sac_steps": step, "eval_return": eval_return}))

    def provenance(self, kind: str) -> str:
        """How the policy behind dataset `kind` was made, for its Minari description."""
        if kind == "random":
            return "uniform random actions"
        if kind == "medium-expert":
            return f"{self.provenance('medium')}, then {self.provenance('expert')}"
        policy = "expert" if kind == "expert" else "medium"
        given = self.config.expert_model if policy == "expert" else self.config.medium_model
        if given:
            return f"the keelrl SAC model given as --{policy}-model ({Path(given).name})"
        record = self.work / f"{policy}.json"
        if not record.is_file():  # a policy made before keelrl recorded how
            return f"keelrl SAC (CleanRL defaults, seed {self.config.seed}; budget and return not recorded)"
        made = json.loads(record.read_text())
        what = (f"keelrl SAC (CleanRL defaults, seed {self.config.seed}) after {made['sac_steps']} environment steps, "
                f"deterministic evaluation return {made['eval_return']:.1f} over 10 episodes")
        if kind == "medium-replay":
            return f"every transition in the replay buffer of the run of {what}"
        return f"{what}; actions sampled from it"

    def expert_file(self) -> Path:
        if self.config.expert_model:
            return Path(self.config.expert_model)
        model = self.work / "expert.pt"
        if not model.is_file():
            self.medium_files()  # the expert continues the medium run
            run_dir, eval_return = self._train_sac_to(self.config.sac_steps)
            self.log(f"SAC step {self.config.sac_steps}: expert evaluation return {eval_return:.1f}")
            shutil.copy(run_dir / MODEL_FILE, model)
            self._write_provenance("expert", self.config.sac_steps, eval_return)
        return model

    def has_expert(self) -> bool:
        return bool(self.config.expert_model) or "expert" in self.config.datasets \
            or "medium-expert" in self.config.datasets

    # --- reference scores and datasets
    def reference_scores(self) -> tuple[float, float, str]:
        """(random return, expert return, where the expert return comes from): measured on the first call in this
        work directory and kept (module docstring)."""
        path = self.work / "ref_scores.json"
        if path.is_file():
            refs = json.loads(path.read_text())
            if self.has_expert() and refs["ref_max_source"] != "expert":
                self.log(f"reference returns kept from the datasets made before in {self.work}: "
                         f"{refs['ref_max_source']} {refs['ref_max_score']:.1f}, not this run's expert, so that all "
                         f"score alike")
            return refs["ref_min_score"], refs["ref_max_score"], refs["ref_max_source"]
        config = self.config
        random_returns, _ = play_episodes(uniform_policy(config.env_id, config.seed), config.env_id,
                                            config.ref_episodes, config.seed + 20_000)
        ref_min = float(random_returns.mean())
        if self.has_expert():
            expert = SAC.load(self.expert_file())
            expert_returns, _ = play_episodes(lambda obs: expert.act(obs, deterministic=True), config.env_id,
                                                config.ref_episodes, config.seed + 30_000)
            ref_max, source = float(expert_returns.mean()), "expert"
        else:  # a D4RL environment (__init__ refused others)
            ref_max = D4RL_REF_SCORES[env_family(config.env_id)][1]
            source = "D4RL's expert reference return"
        path.write_text(json.dumps({"ref_min_score": ref_min, "ref_max_score": ref_max, "ref_max_source": source}))
        self.log(f"reference returns: random {ref_min:.1f}, {source} {ref_max:.1f}")
        return ref_min, ref_max, source

    def policy_data(self, kind: str) -> dict[str, np.ndarray]:
        config = self.config
        if kind == "random":
            policy = uniform_policy(config.env_id, config.seed)
        else:  # actions sampled from the policy, as in D4RL
            policy = SAC.load(self.medium_files()[0] if kind == "medium" else self.expert_file()).act
        return collect(config.env_id, policy, config.steps, config.num_envs, config.seed + COLLECTION_SEED[kind],
                       config.quiet, desc=kind)

    def data_for(self, kind: str) -> dict[str, np.ndarray]:
        if kind == "medium-replay":  # validate refused --medium-model without --medium-buffer
            return replay_buffer_dataset(self.medium_files()[1])
        if kind == "medium-expert":
            parts = [load_dataset(self.make(part), self.data_path) for part in ("medium", "expert")]
            return {key: np.concatenate([part[key] for part in parts]) for key in parts[0]}
        return self.policy_data(kind)

    def make(self, kind: str) -> str:
        """Write dataset `kind` unless it exists; its id."""
        identifier = dataset_id(self.config.env_id, kind, self.config.version, self.config.quick)
        if (self.data_path / identifier / "data" / "metadata.json").is_file():
            self.log(f"{identifier}: exists in {self.data_path}, kept")
            return identifier
        data = self.data_for(kind)
        ref_min, ref_max, source = self.reference_scores()
        write_minari_dataset(identifier, data, self.config.env_id, self.data_path, ref_min, ref_max,
                             description=f"D4RL-style {kind} dataset of {self.config.env_id} made by "
                                         f"keelrl.benchmarks.make_datasets{' --quick' * self.config.quick}; policy: "
                                         f"{self.provenance(kind)}; normalised-score references: random policy "
                                         f"{ref_min:.1f}, {source} {ref_max:.1f}",
                             algorithm_name=f"keelrl SAC ({kind})")
        returns = episode_returns(data)
        self.log(f"{identifier}: {len(data['rewards'])} transitions, {len(returns)} episodes, mean return "
                 f"{returns.mean():.1f} (normalised {normalized_score(returns.mean(), ref_min, ref_max):.1f}) "
                 f"-> {self.data_path / identifier}")
        return identifier


def make_datasets(config: MakeDatasetsConfig) -> list[str]:
    """Make the configured datasets; their Minari ids."""
    if config.quick:
        config = with_quick(config)
    validate(config)
    maker = DatasetMaker(config)
    return [maker.make(kind) for kind in config.datasets]


def main(args: list[str] | None = None) -> int:
    config = parse_command_line(MakeDatasetsConfig, args=args)
    try:
        for identifier in make_datasets(config):
            print(identifier)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except RunStopped as stop:  # SIGTERM or Ctrl-C while SAC trained: its checkpoint is written
        print("make_datasets stopped: run the same command again to continue where it stopped", file=sys.stderr)
        return stop.code
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
