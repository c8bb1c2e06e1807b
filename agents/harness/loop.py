"""The loop contract: `Run` counts an agent's training loop and does, between its iterations, all that is not the
algorithm (the contract's ten-line example is in keelrl.agents.harness; agents/iql.py has it whole).

An agent's loop body acts, steps the env, stores and updates, as CleanRL's does, and calls `run.record_episodes`
(or `record_episode`) for finished episodes and `run.log` for an update's losses. Between iterations: the progress
bar or lines, the latest losses every `log_freq` steps, an evaluation every `eval_freq` (and a video with
--capture-video), a checkpoint every `checkpoint_freq` steps and every `checkpoint_minutes`, and after SIGTERM or
Ctrl-C a checkpoint and a stop (`RunStopped`: exit 128 + the signal). After the last iteration: the final
evaluation, the last checkpoint and model.pt. A non-finite value stops the run with one line saying what went
non-finite (the agent's actions, a loss, its weights, the environment) and which checkpoint is kept; no checkpoint
is ever written from weights that are not finite.
"""

from __future__ import annotations

import dataclasses
import math
import shlex
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from keelrl.agents.harness.checkpoints import (
    CHECKPOINT_FILE,
    MODEL_FILE,
    CheckpointClock,
    CheckpointPolicy,
    commit_checkpoint,
    crossed,
    non_finite_entry,
    read_replay,
    restore_rng_state,
    restoring,
    rng_state,
    write_checkpoint,
)
from keelrl.agents.harness.logs import Filming, Progress, RunLogger, Speeds, import_wandb, print_result, start_wandb
from keelrl.agents.harness.options import RunOptions, TorchSettings, evaluation_seed, seed_everything
from keelrl.agents.harness.run_directory import RunDirLock, make_run_dir, start_or_resume
from keelrl.agents.harness.stopping import RunStopped, StopSignals, signal_name
from keelrl.buffers import ReplayBuffer
from keelrl.envs.video import VideoSource

UNITS = {"total_timesteps": "step", "total_updates": "update", "iterations": "iteration"}
"""What one loop step of a run is, by the option that counts them (offline agents count updates, and have no
training episodes)."""
DIVERGED = "the agent diverged: see losses/* in TensorBoard; a new run with lower learning rates may not diverge"
Saved = tuple[Callable[[], Any], Callable[[Any], None]]
"""What a checkpoint keeps of one more thing besides the agent: (its state now, restore a saved state)."""


class NonFinite(FloatingPointError):
    """A NaN or inf stopped the run; the message says what went non-finite, where, and which checkpoint is kept."""


@dataclasses.dataclass
class TrainResult:
    """What `train` returns."""

    run_dir: Path
    config: Any
    """The run's resolved config (presets applied; under --resume, the saved run's)."""
    global_step: int
    final_eval_returns: np.ndarray
    """Undiscounted return of each final evaluation episode."""
    sps: float
    """Environment steps per second of the training loop (evaluations and checkpoints in it included)."""
    update_sps: float
    """Environment steps per second once updates began (NaN if they never did)."""
    final_eval_costs: np.ndarray | None = None
    """Undiscounted cost of each final evaluation episode (zeros on a task without cost; None if not measured)."""

    @property
    def final_eval_return(self) -> float:
        return float(np.mean(self.final_eval_returns))


@dataclasses.dataclass
class Lockstep:
    """What the runs of a seed group (harness/seeds.py) share so that they stop and checkpoint at the same steps:
    the stop signals and the checkpoint clock. Their checkpoints are put in place by the group, once every seed
    has written its own (`Run.commit_checkpoint`), so a kill mid-way leaves them all at one step."""

    stop_signals: StopSignals = dataclasses.field(default_factory=StopSignals)
    clock: CheckpointClock = dataclasses.field(default_factory=CheckpointClock)


class Run:
    """One training run: its resolved config, checkpoint, directory, logs, progress and timing (module docstring).

    Constructing it validates the config, or under --resume locks the run directory (`RunDirLock`: a run that
    another process trains is refused) and loads the interrupted run's config (with
    `keep_from_command_line`, the watch and the runtime options taken from this command line) and checkpoint
    (which must hold `checkpoint_keys`), applies --extend-to, sets torch's threads (and for an agent with
    --precision its float32 matrix-product precision, given back with the threads when the run ends) and seeds
    python, numpy and torch. `step` counts the loop's unit (environment steps, updates, iterations) from the
    checkpoint on.
    """

    def __init__(self, config: RunOptions, algo: str, validate: Callable[[Any], None], total: str,
                 keep_from_command_line: tuple[str, ...] = (),
                 checkpoint_keys: tuple[str, ...] = ("global_step", "agent", "rng"),
                 lockstep: Lockstep | None = None):
        resumed_dirs = [] if config.resume is None else [Path(config.resume)]
        self._lock = RunDirLock(resumed_dirs) if lockstep is None else None  # a seed group locks its own directories
        try:
            self.config, self.dir, self.checkpoint = start_or_resume(config, algo, validate, total,
                                                                     keep_from_command_line, checkpoint_keys)
        except BaseException:
            self._release_lock()
            raise
        self.algo, self.total, self.unit = algo, getattr(self.config, total), UNITS[total]
        self.step = 0 if self.checkpoint is None else int(self.checkpoint["global_step"])
        self.recent_return = self.recent_evaluation = float("nan")
        """the latest training return and evaluation (what progress shows)"""
        self.final_evaluation: tuple[np.ndarray, np.ndarray] | None = None
        """the final evaluation's returns and costs, once the loop has ended"""
        self.logger: RunLogger | None = None
        self.progress: Progress | None = None
        self._losses: dict[str, Any] = {}
        self._last_advance = 1
        self._speeds = Speeds(self.step)
        self._lockstep = lockstep  # a seed group's, which enters the stop signals itself and commits checkpoints
        self._stop_signals, clock = (StopSignals(), CheckpointClock()) if lockstep is None else (
            lockstep.stop_signals, lockstep.clock)
        self._checkpoints = CheckpointPolicy(self.config.checkpoint_freq, self.config.checkpoint_minutes, clock,
                                             self.step if self.resumed else None)
        self._uncommitted = False  # a seed group's checkpoint written and not yet in place
        self._wandb = None
        self._torch_settings = TorchSettings(self.config)  # given back at the end
        seed_everything(self.config.seed)

    @property
    def resumed(self) -> bool:
        return self.checkpoint is not None

    @property
    def done(self) -> bool:
        return self.step >= self.total

    def start(self, name: str, agent: Any, play_evaluation: Callable[[Any, int], tuple[np.ndarray, np.ndarray | None]],
              *, numpy_rng: np.random.Generator | None = None, replay: ReplayBuffer | None = None,
              state: dict[str, Saved] | None = None, reference_returns: tuple[float, float] | None = None,
              files: dict[str, str] | None = None, video: VideoSource | None = None) -> None:
        """Say what the run checkpoints and how it evaluates, restore it all when resuming (a damaged checkpoint:
        one line naming it), then make (or reopen) the run directory runs_dir/{name}__{algo}__{seed}__{time} with
        config.json and `files`, and start the logs, W&B (--track), the progress and the clock. Called inside the
        run's `with` block, whose end (a failure here included) releases what the run holds. From here on a stop
        signal is held (`StopSignals`): one that comes before the loop stops the run after its first step, with a
        checkpoint.

        agent: has `training_state()`, `load_training_state(state)` and `save(path)`.
        play_evaluation(agent, eval_seed): plays the agent's evaluation episodes, episode i seeded eval_seed + i
            (`evaluation_seed` of the run's seed); their returns and costs (None: no costs).
        numpy_rng: the loop's numpy generator (default: one seeded with the run's seed).
        replay: the replay buffer, saved as buffer.pt beside each checkpoint.
        state: name -> (its state now, restore a saved state), for anything else a checkpoint must keep.
        reference_returns: (random, expert) returns: evaluations also log the D4RL-normalised score.
        video: what --capture-video films after each evaluation (None: the agent has no env to film).
        """
        self._agent, self._play_evaluation, self._replay, self._state = agent, play_evaluation, replay, state or {}
        self._numpy_rng = np.random.default_rng(self.config.seed) if numpy_rng is None else numpy_rng
        if self._lockstep is None:  # held from before the run directory is made: a stop now checkpoints too
            self._stop_signals.__enter__()
        if self.resumed:
            self._restore()
        if self.config.track:
            import_wandb()  # a missing package is said before a run directory is made
        if self.config.capture_video and video is None:
            raise ValueError(f"--capture-video films an environment, and {self.algo} has none to film.")
        filming = Filming(video) if self.config.capture_video else None
        if self.dir is None:
            self.dir = make_run_dir(self.config, name, self.algo, self._lock, files or {})
        if self.config.track:
            self._wandb = start_wandb(self.config, self.algo, self.dir)  # before the TensorBoard writer it follows
        # a resumed run killed after its last checkpoint, before model.pt, is finished again
        self.logger = RunLogger(self.dir, self.step if self.resumed else None, refinish=self.resumed and self.done,
                                reference_returns=reference_returns, filming=filming)
        self.recent_evaluation = self.logger.last_evaluation  # a resumed run's progress shows it from the start
        self.progress = Progress(self.algo, self.unit, self.total, self.step, self.config.quiet,
                                 self.config.progress_seconds)
        self._speeds.start()
        self._checkpoints.clock.restart()

    def _release_lock(self) -> None:
        """Let another process (or a later call in this one) resume the run: at its end, or when it failed to
        begin."""
        if self._lock is not None:
            self._lock.release()

    def _restore(self) -> None:
        """The agent, the random states, the registered state and the replay buffer, from the checkpoint; the envs
        restart, so the interrupted episodes end where the checkpoint cut them."""
        with restoring(self.dir / CHECKPOINT_FILE):
            self._agent.load_training_state(self.checkpoint["agent"])
            restore_rng_state(self.checkpoint["rng"], self._numpy_rng)
            for name, (_, restore) in self._state.items():
                restore(self.checkpoint[name])
        if self._replay is not None:
            read_replay(self.dir, self.checkpoint, self._replay, self.unit)
            self._replay.end_episodes()

    def __enter__(self) -> Run:
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        if self._lockstep is None:
            self._stop_signals.__exit__()
        if self.logger is not None:  # (not when `start` failed)
            self.progress.close()
            self.logger.close()
        if self._wandb is not None:
            self._wandb.finish()
        self._release_lock()
        self._torch_settings.restore()
        if isinstance(exc, FloatingPointError) and not isinstance(exc, NonFinite):  # from the env or its wrappers
            raise NonFinite(f"{exc} (global step {self.step}). {self._kept()}") from None

    def steps(self, per_iteration: int = 1, stop_early: Callable[[], bool] | None = None) -> Iterator[int]:
        """The loop: yields the loop steps done before each iteration (CleanRL's `global_step`) until the total.
        Inside an iteration `step` already counts its `per_iteration` steps (what it logs is logged at its end).
        After each: progress, losses, evaluations, checkpoints, a stop after a signal; after the last, or once
        `stop_early()` is true: the final evaluation, the last checkpoint and model.pt."""
        while not self.done and not (stop_early is not None and stop_early()):
            global_step = self.step
            self.step += per_iteration
            self._last_advance = per_iteration
            yield global_step
            self.progress.advance(self.step, per_iteration, self.recent_return, self.recent_evaluation)
            if crossed(self.step, self.config.log_freq, self._last_advance):
                self._write_losses()
            if stop_early is None or not stop_early():
                self._between_iterations()
        self._finish()

    def record_episodes(self, info: dict[str, Any]) -> np.ndarray:
        """Log the training episodes that ended at this vector-env step (info["episode"] of keelrl's vector
        envs) and return their costs ((0,) when none ended)."""
        if "_episode" not in info:
            return np.zeros(0)
        ended, episode = info["_episode"], info["episode"]
        for i in np.flatnonzero(ended):
            self.record_episode(episode["return"][i], int(episode["length"][i]), float(episode["cost"][i]))
        return episode["cost"][ended]

    def record_episode(self, episode_return: float, length: int, cost: float = 0.0) -> None:
        """Log a finished training episode."""
        self.recent_return = float(episode_return)
        self.logger.episode(self.step, self.recent_return, length, cost)
        self.progress.show(ret=f"{self.recent_return:.1f}")

    def log(self, losses: dict[str, Any]) -> None:
        """The latest update's losses (written every `log_freq` steps); the first call marks when updates began."""
        self._speeds.updated(self.step)
        self._losses = losses

    def _write_losses(self) -> None:
        """The latest losses and the speed (charts/SPS); a loss (a name ending in _loss) that is not finite stops
        the run."""
        for name, value in self._losses.items():
            if name.endswith("_loss") and not math.isfinite(float(value)):
                raise NonFinite(f"{name} is {float(value)} at {self.unit} {self.step}: {DIVERGED}. {self._kept()}")
        sps = self._speeds.training(self.step)
        self.logger.scalars({**self._losses, "charts/SPS": sps}, self.step)
        self.progress.show(**({} if math.isnan(self.recent_return) else {"ret": f"{self.recent_return:.1f}"}),
                           sps=f"{sps:.0f}")

    def _between_iterations(self) -> None:
        """Evaluate every `eval_freq` steps; checkpoint every `checkpoint_freq` steps and `checkpoint_minutes`;
        after a stop signal, checkpoint and stop. Not after the last step (`_finish` is there)."""
        if self.done:
            return
        tick = time.perf_counter()
        if crossed(self.step, self.config.eval_freq, self._last_advance):
            self.evaluate_and_record()
        stopping = self._stop_signals.stopping_at(self.step)
        if self._checkpoints.due(self.step, self._last_advance, stopping):
            self._checkpoint()
        self._speeds.busy += time.perf_counter() - tick
        if stopping:
            if self._lockstep is None:  # (a seed group says it once for all its seeds)
                self.say_stopped()
            raise RunStopped(self._stop_signals.received)

    def say_stopped(self, of_what: str = "") -> None:
        """The line a run stopped by a signal ends with: where it stopped, and the command that continues it."""
        print(f"{signal_name(self._stop_signals.received)}: stopped at {self.unit} {self.step} of {self.total} with a "
              f"checkpoint; continue with: python -m keelrl.agents.{self.algo} --resume {shlex.quote(str(self.dir))}"
              f"{of_what}", file=sys.stderr, flush=True)

    def evaluate_and_record(self) -> tuple[np.ndarray, np.ndarray]:
        """Evaluate now (as between iterations, e.g. before the first), log the returns and costs (and the
        normalised score), film an episode with --capture-video; the returns and costs."""
        eval_seed = evaluation_seed(self.config.seed, self.config.eval_episodes)
        returns, costs = self._play_evaluation(self._agent, eval_seed)
        costs = np.zeros_like(returns) if costs is None else costs
        self.recent_evaluation = float(np.mean(returns))
        self.logger.evaluation(self.step, returns, costs)
        return returns, costs

    def _checkpoint(self) -> None:
        """checkpoint.pt (with buffer.pt): the step, the agent's training state, the random states and the registered
        state. Weights or optimiser state that are not finite are not saved: the checkpoint on disk stays good."""
        training_state = self._agent.training_state()
        bad = non_finite_entry(training_state)
        if bad is not None:
            raise NonFinite(f"The agent's {bad} is not finite (NaN or inf) at {self.unit} {self.step}: its networks "
                            f"diverged, so this state is not saved. {self._kept()} ({DIVERGED})")
        state = {"algo": self.algo, "global_step": self.step, "agent": training_state,
                 "rng": rng_state(self._numpy_rng), **{name: now() for name, (now, _) in self._state.items()}}
        write_checkpoint(self.dir, state, self._replay)
        if self._lockstep is None:
            commit_checkpoint(self.dir)
        self._uncommitted = self._lockstep is not None
        self._checkpoints.written(self.step)

    def commit_checkpoint(self) -> None:
        """A seed group's run: put the checkpoint written since the last call, if any, in place."""
        if self._uncommitted:
            commit_checkpoint(self.dir)
            self._uncommitted = False

    def _kept(self) -> str:
        """What a run stopped by a non-finite value keeps."""
        return self._checkpoints.kept(self.unit, self.dir)

    def _finish(self) -> None:
        """The final evaluation, the last checkpoint and model.pt; a stop signal that came meanwhile lets it finish."""
        self._speeds.end_loop()
        self.final_evaluation = self.evaluate_and_record()
        self._checkpoint()
        self._agent.save(self.dir / MODEL_FILE)
        if self._stop_signals.received is not None:
            print(f"{signal_name(self._stop_signals.received)} came after the last {self.unit}: the run finished "
                  f"first.", file=sys.stderr, flush=True)

    def result(self, *lines: str) -> TrainResult:
        """Print the final evaluation (and normalised score), the speeds, the caller's `lines` and where the run
        is; return what `train` returns."""
        returns, costs = self.final_evaluation
        speeds = self._speeds.summary(self.unit, self.step, self._last_advance)
        print_result(returns, self.logger.score(returns), (speeds, *lines), self.dir, self.config.runs_dir)
        return TrainResult(run_dir=self.dir, config=self.config, global_step=self.step, final_eval_returns=returns,
                           sps=self._speeds.loop(self.step), update_sps=self._speeds.updating(self.step),
                           final_eval_costs=costs)
