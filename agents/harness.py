"""The run harness every agent's training loop stands on.

An agent file writes its own loop, CleanRL-style, and hands the run's plumbing to one `Run`:

    run = Run(config, "sac", validate, total="total_timesteps")   # resume, --extend-to, seeds, threads
    env, agent = ...                                               # fails here leave no run directory
    if run.resumed:
        with run.restoring():                                      # a damaged checkpoint: one line naming it
            agent.load_training_state(run.checkpoint["agent"])
    run.open(config.env_id)                                        # run directory, config.json, logs, progress
    with run:                                                      # closes logs and progress on any exit
        while not run.done:
            ...                                                    # act, step, store, update
            run.advance(steps)                                     # count, progress bar
            run.log(losses)                                        # losses and speed every log_freq
            run.periodic(evaluate, checkpoint)                     # every eval_freq / checkpoint_freq, not at the end
        returns, costs = run.finish(evaluate, checkpoint, agent.save)

`RunOptions` declares the options every run has once; each algorithm's config extends it with its
hyperparameters (and may give an option another default, e.g. a larger checkpoint interval).
`ALGORITHMS` names every agent module, and `agent_module` looks one up by name (the adversarial
corruption's `load_attacker` does; the leaderboard still imports modules by name itself).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from keelrl.agents.common import (
    BUFFER_FILE,
    CHECKPOINT_FILE,
    DEFAULT_THREADS,
    RunLogger,
    progress_bar,
    new_run_dir,
    restoring,
    save_checkpoint,
    save_config,
    seed_everything,
    set_threads,
    start_or_resume,
)
from keelrl.buffers import ReplayBuffer
from keelrl.buffers.corruption import Policy, QFunction, attack_model_algo

ALGORITHMS = ("sac", "td3", "sac_lag", "td3_lag", "cql", "iql", "riql", "stream_td", "stream_q", "stream_ac", "grpo")
"""Every agent, by the name its runs record and its module under keelrl.agents carries."""


def apply_preset(config: Any, presets: dict[str, dict[str, Any]]) -> Any:
    """The config with `config.preset`'s settings (None: unchanged). An option set to a third value (neither its
    default nor the preset's) contradicts the preset and is refused."""
    if config.preset is None:
        return config
    defaults = type(config)()
    for name, value in presets[config.preset].items():
        given = getattr(config, name)
        if given != value and given != getattr(defaults, name):
            raise ValueError(f"--preset {config.preset} sets --{name.replace('_', '-')} {value}, but "
                             f"--{name.replace('_', '-')} {given} was also given: drop one of them.")
    return dataclasses.replace(config, **presets[config.preset])


def agent_module(algo: str) -> ModuleType:
    """keelrl.agents.<algo>: its config class, `train` and agent class; an unknown name is refused."""
    if algo not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algo!r}; keelrl has {', '.join(ALGORITHMS)}.")
    return importlib.import_module(f"keelrl.agents.{algo}")


def load_attacker(path: str) -> tuple[QFunction, Policy]:
    """The critic and deterministic policy, on raw observations, of the keelrl offline agent (CQL, IQL or RIQL)
    saved at `path`: what --corruption-mode adversarial perturbs the dataset against."""
    algo = attack_model_algo(path)
    attacker = getattr(agent_module(algo), algo.upper()).load(path).requires_grad_(False)
    return attacker.attack_q, attacker.attack_policy


@dataclasses.dataclass
class RunOptions:
    """The options of every run (the loop's unit is environment steps, gradient updates or iterations)."""

    seed: int = 1
    """seed of python, numpy, torch and the envs"""
    eval_freq: int = 10_000
    """loop steps between evaluations (0: only at the end)"""
    eval_episodes: int = 10
    """episodes per evaluation (deterministic policy)"""
    checkpoint_freq: int = 50_000
    """loop steps between checkpoints (the last one is always written)"""
    log_freq: int = 1_000
    """loop steps between loss logs"""
    threads: int = DEFAULT_THREADS
    """torch CPU threads (1 is robust to other busy processes; 2 is faster on an idle 2-core machine)"""
    runs_dir: str = "runs"
    """parent directory of run directories"""
    resume: str | None = None
    """continue the run in this directory (its saved config is used)"""
    extend_to: int | None = None
    """with --resume: train the run on until this many loop steps, past the total it was started with (a finished
    run continues; schedules over the run stretch to the new end)"""
    quiet: bool = False
    """no progress bar"""


def validate_run_options(config: RunOptions, total: str) -> None:
    """Reject run option values no run can use, with the option's command-line name."""
    for name in ("eval_episodes", "checkpoint_freq", "log_freq", "threads", total):
        if getattr(config, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(config, name)}.")
    if config.eval_freq < 0:
        raise ValueError(f"--eval-freq must be non-negative, got {config.eval_freq}.")
    if config.extend_to is not None:
        if config.resume is None:
            raise ValueError("--extend-to trains a saved run further: give it with --resume RUN_DIR.")
        if config.extend_to < getattr(config, total):
            raise ValueError(f"--extend-to {config.extend_to} is below the run's --{total.replace('_', '-')} "
                             f"{getattr(config, total)}: a run cannot be shortened.")


class Run:
    """One training run: its resolved config, checkpoint, directory, logs, progress and timing.

    Constructing it validates the config, or under --resume loads the interrupted run's config (with
    `keep_from_command_line` taken from this command line) and checkpoint (which must hold
    `checkpoint_keys`), applies --extend-to, sets torch's threads and seeds python, numpy and torch.
    `step` counts the loop's unit (environment steps, updates, iterations) from the checkpoint on.
    """

    def __init__(self, config: RunOptions, algo: str, validate: Callable[[Any], None], total: str,
                 keep_from_command_line: tuple[str, ...] = ("quiet", "extend_to"),
                 checkpoint_keys: tuple[str, ...] = ("global_step", "agent", "rng")):
        config, self.dir, self.checkpoint = start_or_resume(config, algo, validate, keep_from_command_line,
                                                            checkpoint_keys)
        if config.extend_to is not None:  # the new end is saved, so a later plain --resume continues to it
            config = dataclasses.replace(config, **{total: config.extend_to}, extend_to=None)
            save_config(self.dir, algo, config)
        self.config, self.algo, self.total = config, algo, getattr(config, total)
        self.step = 0 if self.checkpoint is None else int(self.checkpoint["global_step"])
        self.start_step = self.step
        self.logger: RunLogger | None = None
        self._bar = None
        self._last_advance = 1
        self._busy = 0.0  # seconds spent evaluating and checkpointing, left out of the logged speed
        self._start_time = self._loop_end = float("nan")
        self._update_start: tuple[float, int] | None = None
        self.recent_return = float("nan")
        set_threads(config.threads)
        seed_everything(config.seed)

    @property
    def resumed(self) -> bool:
        return self.checkpoint is not None

    @property
    def done(self) -> bool:
        return self.step >= self.total

    def open(self, name: str, files: dict[str, str] | None = None) -> None:
        """Make a new run's directory runs_dir/{name}__{algo}__{seed}__{time} with config.json (and `files`:
        file name -> text), or reopen the resumed one; start the logs, the progress bar and the clock.
        On resume, call it after restoring the checkpoint: it cuts the logs back to the checkpoint's step."""
        if self.dir is None:
            self.dir = new_run_dir(self.config.runs_dir, name, self.algo, self.config.seed)
            save_config(self.dir, self.algo, self.config)
            for file_name, text in (files or {}).items():
                (self.dir / file_name).write_text(text)
        self.logger = RunLogger(self.dir, resume_step=self.step if self.resumed else None)
        self._bar = progress_bar(self.total, self.step, self.config.quiet)
        self._start_time = time.perf_counter()

    @contextlib.contextmanager
    def stepping_env(self, steps: int = 1) -> Iterator[None]:
        """Around an environment step that checks its output: a FloatingPointError (non-finite reward or
        observation) says at which global step training stopped and that the last checkpoint is kept."""
        try:
            yield
        except FloatingPointError as err:
            raise FloatingPointError(f"{err} (global step {self.step + steps}). Training stopped; the last checkpoint "
                                     f"in {self.dir} is kept (fix the environment, then --resume {self.dir}).") from None

    def restoring(self, file_name: str = CHECKPOINT_FILE):
        """Context for restoring state from a file of the run directory: a damaged or foreign file raises one
        ValueError naming it."""
        return restoring(self.dir / file_name)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self.logger is not None:
            self.logger.close()

    def speed(self) -> float:
        """Loop steps per second since `open`, evaluations and checkpoints left out."""
        elapsed = time.perf_counter() - self._start_time - self._busy
        return (self.step - self.start_step) / max(elapsed, 1e-9)

    def advance(self, steps: int = 1) -> None:
        """Count `steps` loop steps."""
        self.step += steps
        self._last_advance = steps
        self._bar.update(steps)

    def log(self, losses: dict[str, Any]) -> None:
        """Every `log_freq` loop steps: the latest losses and the speed (charts/SPS)."""
        if self.due(self.config.log_freq):
            sps = self.speed()
            self.logger.scalars({**losses, "charts/SPS": sps}, self.step)
            self._bar.set_postfix(ret=f"{self.recent_return:.1f}", sps=f"{sps:.0f}", refresh=False)

    def updates_began(self) -> None:
        """Mark the first step with gradient updates in this process (for `update_speed`); later calls do nothing."""
        if self._update_start is None:
            self._update_start = (time.perf_counter(), self.step)

    def due(self, freq: int) -> bool:
        """Whether the last `advance` crossed a multiple of `freq` (0: never)."""
        return bool(freq) and self.step % freq < self._last_advance

    def episode(self, episode_return: float, length: int, cost: float = 0.0) -> None:
        """Log a finished training episode at the current step."""
        self.recent_return = float(episode_return)
        self.logger.episode(self.step, self.recent_return, length, cost)
        self._bar.set_postfix(ret=f"{self.recent_return:.1f}", refresh=False)

    def vector_episodes(self, info: dict[str, Any]) -> np.ndarray:
        """Log the training episodes that ended at this vector-env step (info["episode"] of keelrl's vector
        envs) and return their costs ((0,) when none ended)."""
        if "_episode" not in info:
            return np.zeros(0)
        ended, episode = info["_episode"], info["episode"]
        for i in np.flatnonzero(ended):
            self.episode(episode["return"][i], int(episode["length"][i]), float(episode["cost"][i]))
        return episode["cost"][ended]

    def evaluation(self, returns: np.ndarray, costs: np.ndarray | None = None,
                   scalars: dict[str, float] | None = None) -> None:
        """Log an evaluation's episode returns (and costs, and any other scalars) at the current step."""
        self.logger.evaluation(self.step, returns, np.zeros_like(returns) if costs is None else costs)
        if scalars:
            self.logger.scalars(scalars, self.step)

    def restore_replay(self, buffer: ReplayBuffer) -> None:
        """The replay buffer saved with the checkpoint (one line naming the file if it is missing or damaged);
        the envs restart, so the interrupted episodes end where the checkpoint cut them."""
        if not (self.dir / BUFFER_FILE).is_file():
            raise FileNotFoundError(f"--resume {self.dir}: {BUFFER_FILE} is missing (it is written with every "
                                    f"checkpoint); the run cannot continue without its replay buffer.")
        with self.restoring(BUFFER_FILE):
            buffer.load(self.dir / BUFFER_FILE)
        buffer.end_episodes()

    def save_replay(self, buffer: ReplayBuffer) -> None:
        """The replay buffer, beside the checkpoint (write it with every checkpoint)."""
        buffer.save(self.dir / BUFFER_FILE)

    def save_checkpoint(self, **state: Any) -> None:
        """checkpoint.pt (atomically): the algorithm, the step and `state` (tensors and plain values)."""
        save_checkpoint(self.dir / CHECKPOINT_FILE, {"algo": self.algo, "global_step": self.step, **state})

    def periodic(self, evaluate: Callable[[], Any], checkpoint: Callable[[], None]) -> None:
        """Between loop steps: evaluate every `eval_freq` and checkpoint every `checkpoint_freq` steps, except
        after the last step (`finish` does both there)."""
        if self.done:
            return
        tick = time.perf_counter()
        if self.due(self.config.eval_freq):
            evaluate()
        if self.due(self.config.checkpoint_freq):
            checkpoint()
        self._busy += time.perf_counter() - tick

    def finish(self, evaluate: Callable[[], Any], checkpoint: Callable[[], None],
               save_model: Callable[[Path], None]) -> Any:
        """After the loop: the final evaluation (its result is returned), the last checkpoint and model.pt."""
        self._loop_end = time.perf_counter()
        result = evaluate()
        checkpoint()
        save_model(self.dir / "model.pt")
        return result

    def loop_speed(self) -> float:
        """Loop steps per second of this process's loop, evaluations and checkpoints in it included."""
        return (self.step - self.start_step) / max(self._loop_end - self._start_time, 1e-9)

    def update_speed(self) -> float:
        """Loop steps per second of this process's loop from the first step with updates on (NaN if none)."""
        if self._update_start is None:
            return float("nan")
        start_time, start_step = self._update_start
        return (self.step - start_step) / max(self._loop_end - start_time, 1e-9)

    def report(self, returns: np.ndarray, *lines: str) -> None:
        """Print the final evaluation, the caller's lines and where the run is."""
        print(f"final evaluation return over {len(returns)} episodes: {returns.mean():.1f} ± {returns.std():.1f}")
        for line in lines:
            print(line)
        print(f"run saved in {self.dir}; open the curves with: tensorboard --logdir {Path(self.config.runs_dir)}")
