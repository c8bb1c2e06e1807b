"""Several seeds trained by one loop (--num-seeds S): seeds seed, seed+1, …, seed+S−1, each a `Run` of its own (its
directory, config.json with its seed, logs, evaluations, checkpoints and model.pt, laid out as a run of that seed
alone), stepped in lockstep, while the agent trains them as one batched network (keelrl.networks.seeds).

    runs = SeedRuns(config, "sac", validate, total="total_timesteps")        # one seed: a plain Run inside
    with runs:
        env = runs.group(lambda seed: make_vec_env(..., seed + runs.step))  # VecEnv, or SeedEnvs for S seeds
        agent = runs.agent(lambda: SAC(...))                                 # stacked along a seed axis for S
        buffer = runs.group(lambda seed: ReplayBuffer(..., seed=seed))      # ReplayBuffer, or SeedReplay
        runs.start(env_id, agent, play_evaluation=lambda agent, eval_seed: ..., numpy_rng=runs.numpy_rng(),
                   replay=buffer)

(PPO groups RolloutBuffers into SeedRollouts instead, and gives `start` what each seed's checkpoint keeps besides:
`state=lambda i: {...}`, with `runs.part(rollout, i)`, seed i's own rollout), then, still in the `with` block, the
loop of `Run` (steps, record_episodes, log, result). With one seed every call goes straight to the one `Run`, and
the objects are the single-seed ones: the run is the run it always was. `--resume` of any seed's directory resumes
all S (each directory's seeds.json names the others).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from keelrl.agents.harness.checkpoints import settle_checkpoints, write_atomically
from keelrl.agents.harness.loop import Lockstep, NonFinite, Run, Saved, TrainResult
from keelrl.agents.harness.options import evaluation_seed, given_options
from keelrl.agents.harness.run_directory import RunDirLock
from keelrl.agents.harness.saved_agent import SavedAgent
from keelrl.agents.harness.stopping import RunStopped
from keelrl.buffers import ReplayBuffer, RolloutBuffer, SeedReplay, SeedRollouts
from keelrl.envs import SeedEnvs, VecEnv
from keelrl.networks.seeds import slice_training_state, stack_seeds, stack_training_states

SEEDS_FILE = "seeds.json"
"""In each directory of a seed group: the group's directories (relative to it), first seed first."""


class SeedGenerators:
    """S numpy generators used as one: each draw (of `size`, or `permutation(n)`) is each seed's from its own,
    stacked (S, *size)."""

    def __init__(self, generators: list[np.random.Generator]):
        self.generators = generators

    def uniform(self, low: np.ndarray, high: np.ndarray, size: tuple[int, ...]) -> np.ndarray:
        return np.stack([rng.uniform(low, high, size) for rng in self.generators])

    def standard_normal(self, size: tuple[int, ...], dtype: type = np.float64) -> np.ndarray:
        return np.stack([rng.standard_normal(size, dtype=dtype) for rng in self.generators])

    def gumbel(self, size: tuple[int, ...]) -> np.ndarray:
        return np.stack([rng.gumbel(size=size) for rng in self.generators])

    def permutation(self, n: int) -> np.ndarray:
        """Each seed's own shuffle of range(n): (S, n)."""
        return np.stack([rng.permutation(n) for rng in self.generators])


class SeedView:
    """Seed i of a stacked agent as its `Run` sees it: its part of the training state, its model file (what a run
    of that seed alone saves: `SAC.load` and `python -m keelrl.evaluate` read it), and `single`, a copy of it alone
    brought up to date at each evaluation, that evaluations and videos play. The S views restore together: the
    group loads once every seed's checkpoint has come."""

    def __init__(self, group: SavedAgent, index: int, config: Any, restored: dict[int, dict]):
        self.group, self.index, self.config, self.restored = group, index, config, restored
        self.single: SavedAgent | None = None
        self.snapshot()

    def training_state(self) -> dict:
        return slice_training_state(self.group.training_state(), self.index)

    def load_training_state(self, state: dict) -> None:
        self.restored[self.index] = state
        if len(self.restored) == self.group.num_seeds:
            self.group.load_training_state(stack_training_states([self.restored[i] for i in sorted(self.restored)]))

    def model_file(self) -> dict[str, Any]:
        group_file = self.group.model_file()
        networks = {name: tensor[self.index].clone() for name, tensor in group_file["networks"].items()}
        return {**group_file, "config": dataclasses.asdict(self.config), "networks": networks}

    def save(self, path: str | os.PathLike) -> None:
        write_atomically(Path(path), self.model_file())

    def snapshot(self) -> SavedAgent:
        """Seed i's agent alone, as it is now: made from its model file once, then loaded with it, as
        `from_model_file` loads a new agent (remade each time, a SimbaV2 seed took 0.33 s on a CPU, most of it
        initialising the weights the load replaced)."""
        model = self.model_file()
        if self.single is None:
            self.single = type(self.group).from_model_file(model).to(next(self.group.parameters()).device.type)
        else:
            self.single.load_state_dict(model["networks"])
            self.single.num_updates = int(model["num_updates"])
        return self.single


class SeedRuns:
    """The runs of the seeds one loop trains (module docstring). `config`, `step` and `resumed` are the first
    seed's (the others' differ only in their seed)."""

    def __init__(self, config: Any, algo: str, validate: Callable[[Any], None], total: str):
        configs = seed_configs(config)
        resumed_dirs = [] if config.resume is None else [Path(seed_config.resume) for seed_config in configs]
        self._lock = RunDirLock(resumed_dirs)  # (a new group's directories, once made)
        try:
            settle_checkpoints(resumed_dirs)  # a group killed while it checkpointed resumes every seed from one step
            self._lockstep = Lockstep()  # a signal or the clock stops or checkpoints every seed at the same step
            self.runs = [Run(seed_config, algo, validate, total, lockstep=self._lockstep) for seed_config in configs]
            if len({run.step for run in self.runs}) > 1:
                steps = ", ".join(f"seed {run.config.seed} at step {run.step}" for run in self.runs)
                raise ValueError(f"--resume {config.resume}: the seeds of this group were checkpointed at different "
                                 f"steps ({steps}), and a group resumes every seed from one step.")
        except BaseException:
            self._lock.release()
            raise
        self.config, self.resumed = self.runs[0].config, self.runs[0].resumed
        self.seeds = [run.config.seed for run in self.runs]

    @property
    def step(self) -> int:
        """The environment steps each seed has taken (they move in lockstep)."""
        return self.runs[0].step

    @property
    def checkpoint(self) -> dict[str, Any] | None:
        """The checkpoint the first seed resumed from (None: a new run); the others' hold the same keys."""
        return self.runs[0].checkpoint

    def group(self, build: Callable[[int], Any]) -> Any:
        """`build(seed)` of each seed, as one: a VecEnv's become SeedEnvs, a ReplayBuffer's a SeedReplay, a
        RolloutBuffer's SeedRollouts; one seed: its object itself."""
        parts = [build(seed) for seed in self.seeds]
        if len(parts) == 1:
            return parts[0]
        if isinstance(parts[0], VecEnv):
            return SeedEnvs(parts)
        if isinstance(parts[0], ReplayBuffer):
            return SeedReplay(parts)
        if isinstance(parts[0], RolloutBuffer):
            return SeedRollouts(parts)
        raise TypeError(f"SeedRuns.group makes vector envs, replay buffers and rollouts, not "
                        f"{type(parts[0]).__name__}.")

    def part(self, group: Any, index: int) -> Any:
        """Seed `index`'s own env, replay buffer or rollout of what `group` made (one seed: the object itself)."""
        if len(self.seeds) == 1:
            return group
        return group.envs[index] if isinstance(group, SeedEnvs) else group.buffers[index]

    def agent(self, build: Callable[[], SavedAgent]) -> SavedAgent:
        """`build()` (one seed), or S agents built each as a run of its seed builds it, stacked into one."""
        if len(self.seeds) == 1:
            return build()
        return stack_seeds(build, self.seeds, self.config.device)

    def numpy_rng(self) -> np.random.Generator | SeedGenerators:
        """The loop's numpy generator, each seed's seeded with its seed (as `Run` seeds one)."""
        generators = [np.random.default_rng(seed) for seed in self.seeds]
        return generators[0] if len(generators) == 1 else SeedGenerators(generators)

    def start(self, name: str, agent: SavedAgent, play_evaluation: Callable[[SavedAgent, int], tuple], *,
              numpy_rng: np.random.Generator | SeedGenerators, replay: ReplayBuffer | SeedReplay | None = None,
              state: Callable[[int], dict[str, Saved]] | None = None,
              video: Callable[[SavedAgent, int], Any] | None = None) -> None:
        """`Run.start` of each seed: `play_evaluation(agent, eval_seed)` and `video(agent, eval_seed)` get that seed's
        agent alone and the seed of its first evaluation episode (`evaluation_seed`: seeds evaluate on disjoint
        episodes); `state(i)`: what seed i's checkpoint keeps besides (`Run.start`'s `state`; `part` gives each seed's
        own env or rollout); each seed's checkpoint also keeps its torch generator."""
        self._lockstep.stop_signals.__enter__()  # held from before the directories are made (`Run.start`)
        eval_seeds = [evaluation_seed(seed, self.config.eval_episodes) for seed in self.seeds]
        if len(self.runs) == 1:
            run, eval_seed = self.runs[0], eval_seeds[0]
            run.start(name, agent, play_evaluation, numpy_rng=numpy_rng, replay=replay,
                      state=None if state is None else state(0),
                      video=None if video is None else video(agent, eval_seed))
        else:
            restored: dict[int, dict] = {}
            for i, (run, eval_seed) in enumerate(zip(self.runs, eval_seeds)):
                view, generator = SeedView(agent, i, run.config, restored), agent.random.generators[i]
                saved = {"torch_generator": (generator.get_state, generator.set_state), **(state(i) if state else {})}
                run.start(name, view, numpy_rng=numpy_rng.generators[i],
                          play_evaluation=lambda view, eval_seed: play_evaluation(view.snapshot(), eval_seed),
                          replay=None if replay is None else replay.buffers[i], state=saved,
                          video=None if video is None else video(_Latest(view), eval_seed))
            write_seeds_files([run.dir for run in self.runs])
        if not self.resumed:  # a new group's directories, made just now
            for run in self.runs:
                self._lock.add(run.dir)

    def __enter__(self) -> SeedRuns:
        for run in self.runs:
            run.__enter__()
        return self

    def __exit__(self, *exc_info) -> None:
        raised = None
        for run in reversed(self.runs):  # every run closes its logs, even when one says what went non-finite
            try:
                run.__exit__(*exc_info)
            except NonFinite as err:  # the env's FloatingPointError, as each run words it: the first seed's is raised
                raised = err
        self._lockstep.stop_signals.__exit__()  # (a NonFinite used to skip these, leaving the handlers installed)
        self._lock.release()
        if raised is not None:
            raise raised from None

    def steps(self, per_iteration: int = 1) -> Iterator[int]:
        """`Run.steps` of every seed in lockstep; after a stop signal every seed checkpoints before the stop. The
        checkpoints the seeds wrote are put in place together, once all are written."""
        iterators = [run.steps(per_iteration) for run in self.runs]
        while True:
            stopped, steps = None, []
            for iterator in iterators:
                try:
                    steps.append(next(iterator, None))
                except RunStopped as err:
                    stopped = err
            for run in self.runs:
                run.commit_checkpoint()
            if stopped is not None:
                self.runs[0].say_stopped(f" (it resumes all {len(self.runs)} seeds)" if len(self.runs) > 1 else "")
                raise stopped
            if steps[0] is None:
                return
            yield steps[0]

    def record_episodes(self, info: dict[str, Any]) -> np.ndarray | list[np.ndarray]:
        """Each seed's episodes that ended at this step (SeedEnvs' info["seeds"]), and their costs: one seed's
        (`Run.record_episodes`), or one array per seed."""
        if len(self.runs) == 1:
            return self.runs[0].record_episodes(info)
        return [run.record_episodes(seed_info) for run, seed_info in zip(self.runs, info["seeds"])]

    def log(self, losses: dict[str, torch.Tensor | float]) -> None:
        """An update's losses: each seed's part (a seed group's tensors have the seed axis in front; a number, the
        same for every seed, as it is)."""
        if len(self.runs) == 1:
            self.runs[0].log(losses)
            return
        for i, run in enumerate(self.runs):
            run.log({name: value[i] if isinstance(value, torch.Tensor) else value for name, value in losses.items()})

    def result(self, lines: Callable[[Run], list[str]] = lambda run: []) -> TrainResult:
        """Each seed's `Run.result`, with the lines `lines(run)` makes of that seed's run (its final evaluation, say);
        the first seed's is returned, the others' are in `results`."""
        self.results = [run.result(*lines(run)) for run in self.runs]
        return self.results[0]


class _Latest:
    """The seed's agent alone as of its last evaluation (what a video films)."""

    def __init__(self, view: SeedView):
        self.view = view

    def __getattr__(self, name: str) -> Any:
        return getattr(self.view.single, name)


def seed_configs(config: Any) -> list[Any]:
    """Each seed's config: a new group's seeds seed … seed+S−1, their --runs-dir with {seed} filled in and progress
    shown for the first only; under --resume the group's directories named in seeds.json (a --seed given there is
    the first seed's, as when the group began, and checked against each directory's as seed, seed+1, ...)."""
    if config.resume is not None:
        seeds_file = Path(config.resume) / SEEDS_FILE
        if not seeds_file.is_file():
            return [config]
        run_dirs = [Path(config.resume) / relative for relative in json.loads(seeds_file.read_text())["runs"]]
        first_seed_given = "seed" in given_options(config)
        return [dataclasses.replace(config, resume=str(run_dir.resolve()), quiet=config.quiet or i > 0,
                                    seed=config.seed + i if first_seed_given else config.seed)
                for i, run_dir in enumerate(run_dirs)]
    return [dataclasses.replace(config, seed=config.seed + i, runs_dir=seed_runs_dir(config.runs_dir, config.seed + i),
                                quiet=config.quiet or i > 0) for i in range(max(config.num_seeds, 1))]


def seed_runs_dir(runs_dir: str, seed: int) -> str:
    """--runs-dir with {seed} filled in; any other {field} is refused in one line."""
    try:
        return runs_dir.format(seed=seed)
    except (KeyError, IndexError, ValueError):
        raise ValueError(f"--runs-dir {runs_dir}: the one field it may hold is {{seed}} (each seed's own directory); "
                         f"write other braces as {{{{ and }}}}.") from None


def write_seeds_files(run_dirs: list[Path]) -> None:
    for run_dir in run_dirs:
        relative = [os.path.relpath(other, run_dir) for other in run_dirs]
        (run_dir / SEEDS_FILE).write_text(json.dumps({"runs": relative}, indent=2))


def validate_seed_group(config: Any) -> None:
    """Refuse a --num-seeds no run can use, in one line."""
    if config.num_seeds < 1:
        raise ValueError(f"--num-seeds must be positive, got {config.num_seeds}.")
