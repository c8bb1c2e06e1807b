"""The run harness every agent's training loop stands on.

An agent file writes its own loop, CleanRL-style, and hands the run's plumbing to one `Run`:

    run = Run(config, "sac", validate, total="total_timesteps")   # resume, --extend-to, seeds, threads
    env, agent = ...                                               # fails here leave no run directory
    if run.resumed:
        run.restore(agent, action_rng)                             # a damaged checkpoint: one line naming it
    run.open(config.env_id)                                        # run directory, config.json, logs, progress
    with run:                                                      # holds SIGTERM/SIGINT; closes logs on any exit
        while not run.done:
            ...                                                    # act, step (in run.stepping_env), store, update
            run.advance(steps)                                     # count, progress bar
            run.log(losses)                                        # losses and speed every log_freq
            run.periodic(evaluate, checkpoint)                     # by steps and minutes; on a signal: checkpoint, stop
        returns, costs = run.finish(evaluate, checkpoint, agent.save)

`RunOptions` declares the options every run has once; each algorithm's config extends it with its
hyperparameters (and may give an option another default or meaning, e.g. GRPO's evaluation counts prompts).
The module also holds what runs share below `Run`: the run directory and config.json, atomic checkpoints
read with `weights_only=True`, the TensorBoard/CSV logger, evaluation episodes on a vector env and the CLI
entry point that turns a user's mistake into one line and exit code 2. `ALGORITHMS` names every agent
module, and `agent_module` is the one lookup by name (the leaderboard and the adversarial corruption's
`load_attacker` use it).
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import importlib
import json
import math
import os
import random
import re
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

from keelrl.agents.stopping import RunStopped, StopSignals, signal_name
from keelrl.buffers import ReplayBuffer
from keelrl.buffers.corruption import Policy, QFunction, attack_model_algo
from keelrl.envs import make_vec_env
from keelrl.envs.video import VideoSource, VideoUnavailable, film_episode, offscreen_gl_backend, write_mp4

# Measured on the project's 2-core machine (benchmarks/results/threads.md), SAC update 256-256,
# batch 256: one thread takes 10-11 ms idle or beside a busy process; two threads take 6.2 ms idle
# but 24.5 ms when another process keeps the second core busy. One thread is the robust default;
# pass --threads 2 (or more on bigger machines) when the run has the machine to itself.
DEFAULT_THREADS = 1
CHECKPOINT_FILE = "checkpoint.pt"
BUFFER_FILE = "buffer.pt"
NEXT_BUFFER_FILE = "buffer.next.pt"
"""the replay buffer of the checkpoint being written, until that checkpoint is in place"""
CONFIG_FILE = "config.json"
MODEL_FILE = "model.pt"


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


def set_threads(threads: int) -> None:
    """Set torch's intra-op threads (see DEFAULT_THREADS for why the default is what it is)."""
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}.")
    torch.set_num_threads(threads)


def seed_everything(seed: int) -> None:
    """One seed for python, numpy and torch; envs are seeded by make_vec_env."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state(numpy_rng: np.random.Generator) -> dict[str, Any]:
    """Every random state a run uses, in a form `torch.load(weights_only=True)` accepts."""
    return {
        "python": random.getstate(),
        "numpy_rng": numpy_rng.bit_generator.state,
        "torch": torch.get_rng_state(),
    }


def restore_rng_state(state: dict[str, Any], numpy_rng: np.random.Generator) -> None:
    random.setstate(state["python"])
    numpy_rng.bit_generator.state = state["numpy_rng"]
    torch.set_rng_state(state["torch"])


def new_run_dir(root: str, env_id: str, algo: str, seed: int) -> Path:
    """runs/{env_id}__{algo}__{seed}__{unix_time}/ (a suffix is added if the name is taken)."""
    base = Path(root) / f"{env_id.replace('/', '_')}__{algo}__{seed}__{int(time.time())}"
    run_dir, n = base, 1
    while run_dir.exists():
        run_dir, n = Path(f"{base}_{n}"), n + 1
    run_dir.mkdir(parents=True)
    return run_dir


def save_config(run_dir: Path, algo: str, config: Any) -> None:
    payload = {"algo": algo, "config": dataclasses.asdict(config)}
    (run_dir / CONFIG_FILE).write_text(json.dumps(payload, indent=2, default=str))


def load_run_config(run_dir: str | os.PathLike, algo: str, config_cls: type) -> Any:
    """The config of an earlier run, checking the directory is a run of this algorithm."""
    run_dir = Path(run_dir)
    config_path, checkpoint_path = run_dir / CONFIG_FILE, run_dir / CHECKPOINT_FILE
    if not run_dir.is_dir():
        raise FileNotFoundError(f"--resume {run_dir}: no such directory.")
    if not config_path.is_file() or not checkpoint_path.is_file():
        raise ValueError(
            f"--resume {run_dir}: not a keelrl run directory with a checkpoint "
            f"(expected {CONFIG_FILE} and {CHECKPOINT_FILE}; a run writes its first checkpoint after "
            f"checkpoint_freq steps)."
        )
    try:
        payload = json.loads(config_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"--resume {run_dir}: {config_path} is damaged, not JSON ({err}).") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("config"), dict):
        raise ValueError(f"--resume {run_dir}: {config_path} is not a keelrl run config "
                         f'(expected {{"algo": ..., "config": {{...}}}}).')
    if payload.get("algo") != algo:
        raise ValueError(
            f"--resume {run_dir}: that run is {payload.get('algo')!r}, not {algo!r}; "
            f"resume it with keelrl.agents.{payload.get('algo')}."
        )
    fields = {f.name for f in dataclasses.fields(config_cls)}
    # JSON turned the configs' tuples (hidden sizes, ...) into lists
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in payload["config"].items() if k in fields}
    wrong = _wrongly_typed_fields(config_cls, values)
    if wrong:
        raise ValueError(f"--resume {run_dir}: {config_path} holds values of the wrong type for "
                         f"{', '.join(wrong)}; it is damaged or was edited by hand.")
    return config_cls(**values)


def _wrongly_typed_fields(config_cls: type, values: dict[str, Any]) -> list[str]:
    """Names of the fields whose value is not of the type of the field's default (None always passes)."""
    wrong = []
    for field in dataclasses.fields(config_cls):
        value, default = values.get(field.name), field.default
        if value is None or default is None or default is dataclasses.MISSING:
            continue
        if isinstance(default, bool) or not isinstance(default, (int, float)):
            fits = isinstance(value, type(default))
        else:  # an int fits a float field; a bool fits neither
            fits = isinstance(value, int if isinstance(default, int) else (int, float)) and not isinstance(value, bool)
        if not fits:
            wrong.append(field.name)
    return wrong


def start_or_resume(
    config: Any, algo: str, validate: Callable[[Any], None], keep_from_command_line: tuple[str, ...] = ("quiet",),
    checkpoint_keys: tuple[str, ...] = ("global_step", "agent", "rng"),
) -> tuple[Any, Path | None, dict[str, Any] | None]:
    """A new run's validated config (and no run directory or checkpoint yet); under `--resume RUN_DIR`,
    the interrupted run's saved config, with the options in `keep_from_command_line` taken from this
    command line, its directory and its checkpoint (which must hold `checkpoint_keys`)."""
    if config.resume is None:
        validate(config)
        return config, None, None
    run_dir = Path(config.resume)
    saved = load_run_config(run_dir, algo, type(config))
    overrides = {name: getattr(config, name) for name in keep_from_command_line}
    saved = dataclasses.replace(saved, resume=str(run_dir), **overrides)
    validate(saved)
    checkpoint = load_checkpoint(run_dir / CHECKPOINT_FILE, algo)
    missing = [key for key in checkpoint_keys if key not in checkpoint]
    if missing:
        raise ValueError(f"{run_dir / CHECKPOINT_FILE} is not a checkpoint of a {algo} run (no "
                         f"{', '.join(missing)}); it is damaged, comes from another program or from an earlier keelrl "
                         f"version: start a new run.")
    return saved, run_dir, checkpoint


@contextlib.contextmanager
def restoring(path: Path) -> Iterator[None]:
    """Restore a run's state from the file at `path`; what a damaged file, or one from another run or
    program, raises on the way becomes one ValueError naming it."""
    try:
        yield
    except FileNotFoundError:
        raise
    except Exception as err:  # torch, numpy and the state dicts raise many types for a foreign file
        raise ValueError(f"{path} does not fit this run ({_one_line(err)}); it is damaged or comes "
                         f"from another run or program: start a new run.") from None


def _one_line(err: Exception, limit: int = 160) -> str:
    """An exception as 'Type: first line of its message', cut at `limit` characters."""
    lines = str(err).strip().splitlines()
    text = f"{type(err).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write atomically, so a run killed mid-write keeps its previous checkpoint."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: str | os.PathLike, algo: str | None) -> dict[str, Any]:
    """Load tensors and plain containers only (`weights_only=True`: nothing is unpickled); `algo`: the algorithm
    it must belong to (None: any)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"No checkpoint at {path}.")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for a corrupt or foreign file
        raise ValueError(f"{path} is not a readable keelrl checkpoint: it is damaged, truncated or not written by "
                         f"keelrl ({_one_line(err)}).") from None
    if not isinstance(state, dict) or "algo" not in state:
        raise ValueError(f"{path} is not a keelrl checkpoint (no 'algo' entry).")
    if algo is not None and state["algo"] != algo:
        raise ValueError(f"{path} is a {state['algo']!r} checkpoint, not {algo!r}: load it with that agent.")
    return state


class RunLogger:
    """TensorBoard scalars (CleanRL names) plus episodes.csv and eval.csv in the run directory.

    On resume from step S, rows and events after S (written before the interruption but not
    covered by the checkpoint) are dropped, so the logs have no gap and no duplicate. Resuming a run
    whose checkpoint is its last (killed before model.pt was written) finishes it again: its final
    evaluation, at S, is dropped too (`refinish`), since it is made again.
    """

    EPISODE_FIELDS = ["global_step", "return", "length", "cost"]
    EVAL_FIELDS = ["global_step", "mean_return", "std_return", "mean_cost", "episodes"]

    def __init__(self, run_dir: Path, resume_step: int | None = None, refinish: bool = False):
        from torch.utils.tensorboard import SummaryWriter

        self.run_dir = run_dir
        # TensorBoard drops the earlier events at or after purge_step: those after S, or from S on when refinishing
        purge_step = None if resume_step is None else resume_step + (0 if refinish else 1)
        self.writer = SummaryWriter(str(run_dir), purge_step=purge_step)
        self._episodes = self._open_csv("episodes.csv", self.EPISODE_FIELDS, resume_step)
        self._evals = self._open_csv("eval.csv", self.EVAL_FIELDS, None if purge_step is None else purge_step - 1)

    def _open_csv(self, name: str, fields: list[str], last_step: int | None):
        """The CSV rewritten with its rows up to `last_step` (a new file when None), open for more rows."""
        path = self.run_dir / name
        rows = []
        if last_step is not None and path.exists():
            with path.open() as f:
                rows = [r for r in csv.DictReader(f) if int(r["global_step"]) <= last_step]
        handle = path.open("w", newline="")
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
        handle.flush()
        return handle, writer

    def scalars(self, values: dict[str, float], step: int) -> None:
        for name, value in values.items():
            self.writer.add_scalar(name, float(value), step)

    def episode(self, step: int, episode_return: float, length: int, cost: float) -> None:
        handle, writer = self._episodes
        writer.writerow({"global_step": step, "return": episode_return, "length": length, "cost": cost})
        handle.flush()
        self.scalars(
            {"charts/episodic_return": episode_return, "charts/episodic_length": length, "charts/episodic_cost": cost},
            step,
        )

    def evaluation(self, step: int, returns: np.ndarray, costs: np.ndarray) -> None:
        handle, writer = self._evals
        writer.writerow({
            "global_step": step,
            "mean_return": float(returns.mean()),
            "std_return": float(returns.std()),
            "mean_cost": float(costs.mean()),
            "episodes": len(returns),
        })
        handle.flush()
        self.scalars({"eval/episodic_return": returns.mean(), "eval/episodic_cost": costs.mean()}, step)

    def close(self) -> None:
        self.writer.close()
        for handle, _ in (self._episodes, self._evals):
            handle.close()


def progress_bar(total: int, initial: int, quiet: bool):
    """A tqdm bar that turns itself off under --quiet or when stderr is not a terminal."""
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True,
                disable=quiet or not sys.stderr.isatty(), smoothing=0.05)


def evaluate_policy(
    policy: Callable[[np.ndarray], np.ndarray],
    env_id: str,
    episodes: int,
    seed: int,
    env_kwargs: dict[str, Any] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Run `episodes` episodes in parallel (one per sub-env) and return their returns and costs.

    `policy` maps a batch of raw observations (episodes, *obs_shape) to
    a batch of actions. Sub-env i is seeded with seed + i.
    """
    env = make_vec_env(env_id, num_envs=episodes, seed=seed, env_kwargs=env_kwargs)
    returns = np.full(episodes, np.nan)
    costs = np.zeros(episodes)
    finished = np.zeros(episodes, bool)
    obs, _ = env.reset()
    while not finished.all():
        obs, _, _, _, info = env.step(policy(obs))
        if "_episode" in info:
            first = info["_episode"] & ~finished
            returns[first] = info["episode"]["return"][first]
            costs[first] = info["episode"]["cost"][first]
            finished |= first
    env.close()
    return returns, costs


def run_cli(train: Callable[[Any], Any], config_cls: type, args: list[str] | None = None) -> int:
    """Parse `config_cls` from the command line and train; a user error prints one line, exit code 2."""
    import tyro

    config = tyro.cli(config_cls, args=args)
    try:
        train(config)
    except (ValueError, FileNotFoundError, FloatingPointError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except RunStopped as stop:  # SIGTERM or Ctrl-C while training: checkpointed, and said how to resume
        return stop.code
    except KeyboardInterrupt:  # Ctrl-C before or after the training loop, where no checkpoint is written
        print("interrupted outside the training loop: continue from the run's last checkpoint, if it has one, with "
              "--resume RUN_DIR", file=sys.stderr)
        return 130
    return 0


ALGORITHMS = {"sac": "SAC", "td3": "TD3", "sac_lag": "SACLag", "td3_lag": "TD3Lag", "cql": "CQL", "iql": "IQL",
              "riql": "RIQL", "stream_td": "StreamTD", "stream_q": "StreamQ", "stream_ac": "StreamAC", "grpo": "GRPO"}
"""Every agent: the name its runs record and its module under keelrl.agents carries -> its agent class."""


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


def agent_class(algo: str) -> type:
    """The agent class of keelrl.agents.<algo> (its `load` reads that algorithm's model.pt)."""
    return getattr(agent_module(algo), ALGORITHMS[algo])


def load_attacker(path: str) -> tuple[QFunction, Policy]:
    """The critic and deterministic policy, on raw observations, of the keelrl offline agent (CQL, IQL or RIQL)
    saved at `path`: what --corruption-mode adversarial perturbs the dataset against."""
    attacker = agent_class(attack_model_algo(path)).load(path).requires_grad_(False)
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
    """loop steps between checkpoints (the last one is always written, and one on SIGTERM or Ctrl-C)"""
    checkpoint_minutes: float = 10.0
    """also checkpoint when this many minutes have passed since the last checkpoint (0: only by steps), so a
    SIGKILL or a power cut loses at most this much work"""
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
    """no progress bar, and no progress lines"""
    progress_seconds: float = 30.0
    """when stdout is not a terminal (a log file, nohup, CI, a cluster job): seconds between plain progress lines"""
    capture_video: bool = False
    """film the first episode of every evaluation: RUN_DIR/videos/*.mp4 and videos.csv (return, cost, length), a
    frame in TensorBoard (needs keelrl[video]; MuJoCo renders offscreen through EGL, else OSMesa)"""
    track: bool = False
    """log the run to Weights & Biases: config and every TensorBoard scalar (needs keelrl[wandb]; WANDB_MODE=offline
    keeps it on this machine)"""
    wandb_project: str = "keelrl"
    """W&B project (with --track)"""
    wandb_entity: str | None = None
    """W&B entity, a user or team (with --track; default: your own)"""
    wandb_group: str | None = None
    """W&B group (with --track; the leaderboard gives each grid its own)"""


WATCH_OPTIONS = ("quiet", "progress_seconds", "capture_video", "track", "wandb_project", "wandb_entity", "wandb_group")
"""How a run is watched: under --resume these come from the new command line, not the saved config."""
RUNTIME_OPTIONS = ("threads", "device")
"""Where a run computes, which does not change its algorithm: under --resume these come from the new command line
too (`device` for the agents that have it)."""


def require_positive_counts(config: Any, *names: str) -> None:
    """Refuse a count option (steps, sizes, frequencies) below 1, naming it as on the command line."""
    for name in names:
        if getattr(config, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(config, name)}.")


def require_non_negative(config: Any, *names: str) -> None:
    """Refuse an option below 0 (or NaN), naming it as on the command line."""
    for name in names:
        if not getattr(config, name) >= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be non-negative, got {getattr(config, name)}.")


def validate_run_options(config: RunOptions, total: str) -> None:
    """Reject run option values no run can use, with the option's command-line name."""
    require_positive_counts(config, "eval_episodes", "checkpoint_freq", "log_freq", "threads", total)
    require_non_negative(config, "eval_freq", "progress_seconds", "checkpoint_minutes")
    if config.extend_to is not None:
        if config.resume is None:
            raise ValueError("--extend-to trains a saved run further: give it with --resume RUN_DIR.")
        if config.extend_to < getattr(config, total):
            raise ValueError(f"--extend-to {config.extend_to} is below the run's --{total.replace('_', '-')} "
                             f"{getattr(config, total)}: a run cannot be shortened.")


def import_wandb() -> ModuleType:
    try:
        import wandb
    except ImportError:
        raise ValueError("--track logs to Weights & Biases, which is not installed: pip install 'keelrl[wandb]'.") \
            from None
    return wandb


def start_wandb(config: RunOptions, algo: str, run_dir: Path) -> Any:
    """A W&B run following the TensorBoard logs of `run_dir`, with the config; a resumed run continues its W&B run."""
    return import_wandb().init(project=config.wandb_project, entity=config.wandb_entity, group=config.wandb_group,
                      name=run_dir.name, id=re.sub(r"[^\w-]", "-", run_dir.name)[:64], resume="allow",
                      config={"algo": algo, **dataclasses.asdict(config)}, dir=str(run_dir), sync_tensorboard=True)


UNITS = {"total_timesteps": "step", "total_updates": "update", "iterations": "iteration"}
"""What one loop step of a run is, by the option that counts them (offline agents count updates, and have no
training episodes)."""
DIVERGED = "see losses/* in TensorBoard; a new run with lower learning rates may not diverge"
"""What to do about an agent whose networks went non-finite."""


def non_finite_entry(state: Any, path: str = "") -> str | None:
    """The path ('networks/critic.0.weight') of the first floating-point tensor in `state` (nested dicts and
    lists) holding a NaN or inf, or None when all are finite."""
    if isinstance(state, torch.Tensor):
        return path if state.is_floating_point() and not bool(torch.isfinite(state).all()) else None
    items = state.items() if isinstance(state, dict) else enumerate(state) if isinstance(state, (list, tuple)) else ()
    for key, value in items:
        found = non_finite_entry(value, f"{path}/{key}" if path else str(key))
        if found is not None:
            return found
    return None


def duration(seconds: float) -> str:
    """H:MM:SS with as many hours as it takes (never wrapping at a day): 24 h 6 min 8 s is '24:06:08'."""
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}"


def _shown(value: float) -> str:
    """A logged figure for a progress line: '–' while nothing is known yet."""
    return "–" if math.isnan(value) else f"{value:.1f}"


class Run:
    """One training run: its resolved config, checkpoint, directory, logs, progress and timing.

    Constructing it validates the config, or under --resume loads the interrupted run's config (with
    `keep_from_command_line`, the watch and the runtime options taken from this command line) and checkpoint
    (which must hold `checkpoint_keys`), applies --extend-to, sets torch's threads and seeds python, numpy and
    torch. `step` counts the loop's unit (environment steps, updates, iterations) from the checkpoint on.
    Inside `with run:`, SIGTERM and SIGINT stop the run at the next `periodic` with a checkpoint (agents/stopping.py).
    """

    def __init__(self, config: RunOptions, algo: str, validate: Callable[[Any], None], total: str,
                 keep_from_command_line: tuple[str, ...] = (),
                 checkpoint_keys: tuple[str, ...] = ("global_step", "agent", "rng")):
        runtime = tuple(name for name in RUNTIME_OPTIONS if hasattr(config, name))
        config, self.dir, self.checkpoint = start_or_resume(
            config, algo, validate, (*WATCH_OPTIONS, *runtime, "extend_to", *keep_from_command_line), checkpoint_keys)
        if config.extend_to is not None:  # the new end is saved, so a later plain --resume continues to it
            config = dataclasses.replace(config, **{total: config.extend_to}, extend_to=None)
            save_config(self.dir, algo, config)
        self.config, self.algo, self.total = config, algo, getattr(config, total)
        self.unit = UNITS[total]
        self.step = 0 if self.checkpoint is None else int(self.checkpoint["global_step"])
        if self.done and (self.dir / MODEL_FILE).is_file():  # (a run stopped before model.pt is finished again)
            raise ValueError(f"--resume {self.dir}: the run is finished ({self.step} of its {self.total} "
                             f"--{total.replace('_', '-')}); train it on with --resume {self.dir} --extend-to N.")
        self.start_step = self.step
        self._checkpoint_step = self.step if self.resumed else None  # of the checkpoint on disk
        self._checkpoint_time = float("nan")  # when the last checkpoint was written (from `open` on)
        self._stop_signals = StopSignals()
        self.logger: RunLogger | None = None
        self._bar = None
        self._last_advance = 1
        self._busy = 0.0  # seconds spent evaluating and checkpointing, left out of the logged speed
        self._start_time = self._loop_end = float("nan")
        self._update_start: tuple[float, int] | None = None
        self.recent_return = float("nan")
        self.recent_evaluation = float("nan")
        # plain lines wherever the bar (on stderr) does not reach a terminal beside stdout
        self._plain_progress = not config.quiet and not (sys.stdout.isatty() and sys.stderr.isatty())
        self._last_line = (float("-inf"), 0)  # (time, step) of the last plain progress line
        self._video: VideoSource | None = None
        self._wandb = None
        set_threads(config.threads)
        seed_everything(config.seed)

    @property
    def resumed(self) -> bool:
        return self.checkpoint is not None

    @property
    def done(self) -> bool:
        return self.step >= self.total

    def open(self, name: str, files: dict[str, str] | None = None, video: VideoSource | None = None) -> None:
        """Make a new run's directory runs_dir/{name}__{algo}__{seed}__{time} with config.json (and `files`:
        file name -> text), or reopen the resumed one; start the logs (and W&B with --track), the progress bar
        and the clock. `video`: what --capture-video films after each evaluation (None: the agent has no env).
        On resume, call it after restoring the checkpoint: it cuts the logs back to the checkpoint's step."""
        if self.config.track:
            import_wandb()  # a missing package is said before a run directory is made
        if self.config.capture_video:
            if video is None:
                raise ValueError(f"--capture-video films an environment, and {self.algo} has none to film.")
            self._video = self._video_or_none(video)
        if self.dir is None:
            self.dir = new_run_dir(self.config.runs_dir, name, self.algo, self.config.seed)
            save_config(self.dir, self.algo, self.config)
            for file_name, text in (files or {}).items():
                (self.dir / file_name).write_text(text)
        if self.config.track:
            self._wandb = start_wandb(self.config, self.algo, self.dir)  # before the TensorBoard writer it follows
        if self.resumed and self.done:  # killed after its last checkpoint, before model.pt: finished again
            self.logger = RunLogger(self.dir, resume_step=self.step, refinish=True)
        else:
            self.logger = RunLogger(self.dir, resume_step=self.step if self.resumed else None)
        self._bar = progress_bar(self.total, self.step, self.config.quiet)
        self._start_time = self._checkpoint_time = time.perf_counter()

    @contextlib.contextmanager
    def stepping_env(self, actions: np.ndarray, steps: int = 1) -> Iterator[None]:
        """Around an environment step of `steps` loop steps: `actions` that are not finite stop the run before the
        environment sees them (the agent diverged), and a FloatingPointError from the environment (a non-finite
        reward or observation) says at which step training stopped; both say which checkpoint is kept."""
        if not np.isfinite(actions).all():
            raise FloatingPointError(f"The agent's actions are not finite (NaN or inf) at {self.unit} "
                                     f"{self.step + steps}: its networks diverged, not the environment. "
                                     + self._training_stopped(DIVERGED))
        try:
            yield
        except FloatingPointError as err:
            raise FloatingPointError(f"{err} (global step {self.step + steps}). "
                                     + self._training_stopped("fix the environment")) from None

    def _training_stopped(self, advice: str) -> str:
        """What a run stopped by a non-finite value keeps, and what to do."""
        if self._checkpoint_step is None:
            return f"Training stopped before its first checkpoint ({advice})."
        return (f"Training stopped; the checkpoint of {self.unit} {self._checkpoint_step} in {self.dir} is kept "
                f"({advice}; --resume {self.dir} continues from it).")

    def restoring(self, file_name: str = CHECKPOINT_FILE):
        """Context for restoring state from a file of the run directory: a damaged or foreign file raises one
        ValueError naming it."""
        return restoring(self.dir / file_name)

    def __enter__(self) -> Run:
        self._stop_signals.__enter__()
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        self._stop_signals.__exit__()
        if self._bar is not None:
            self._bar.close()
        if self.logger is not None:
            self.logger.close()
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None

    def _video_or_none(self, video: VideoSource) -> VideoSource | None:
        """`video` if this machine can render it offscreen, else None and one line saying what to install."""
        try:
            offscreen_gl_backend()
        except VideoUnavailable as err:
            print(f"--capture-video: {err}; training goes on without video.", file=sys.stderr)
            return None
        return video

    def _film(self) -> None:
        """Film an episode of the current policy (after an evaluation): videos/step{N}.mp4, a row of
        videos/videos.csv and a frame in TensorBoard. A failure says why once and turns filming off."""
        try:
            episode = film_episode(self._video)
            path = self.dir / "videos" / f"step{self.step:09d}.mp4"
            write_mp4(path, episode.frames, episode.fps)
        except Exception as err:  # VideoUnavailable, or one of the many types rendering raises without GL
            print(f"--capture-video: no video ({_one_line(err)}); training goes on without video.", file=sys.stderr)
            self._video = None
            return
        index = path.parent / "videos.csv"
        new_index = not index.is_file()
        with index.open("a") as f:
            if new_index:
                f.write("global_step,file,return,cost,length\n")
            f.write(f"{self.step},{path.name},{episode.episode_return},{episode.cost},{len(episode.frames)}\n")
        self.logger.writer.add_image("eval/video_frame", episode.frames[len(episode.frames) // 2], self.step,
                                     dataformats="HWC")

    def speed(self) -> float:
        """Loop steps per second since `open`, evaluations and checkpoints left out."""
        elapsed = time.perf_counter() - self._start_time - self._busy
        return (self.step - self.start_step) / max(elapsed, 1e-9)

    def advance(self, steps: int = 1) -> None:
        """Count `steps` loop steps."""
        self.step += steps
        self._last_advance = steps
        self._bar.update(steps)
        if self._plain_progress and time.perf_counter() - self._last_line[0] >= self.config.progress_seconds:
            self._print_progress()

    def _print_progress(self) -> None:
        """One plain line (for logs, where the progress bar shows nothing): steps, speed since the last line,
        the latest training return (not for offline agents, which have no training episodes) and evaluation
        ("–" until there is one), time left at that speed."""
        now, (last_time, last_step) = time.perf_counter(), self._last_line
        sps = self.speed() if last_time == float("-inf") else (self.step - last_step) / max(now - last_time, 1e-9)
        self._last_line = (now, self.step)
        fields = [f"[{self.algo}] {self.unit} {self.step}/{self.total} ({100 * self.step / self.total:.0f}%)",
                  f"{sps:.1f} {self.unit}s/s"]
        if self.unit != "update":
            fields.append(f"last return {_shown(self.recent_return)}")
        fields.append(f"last evaluation {_shown(self.recent_evaluation)}")
        fields.append(f"ETA {duration((self.total - self.step) / sps) if sps > 0 else '?'}")
        print(" | ".join(fields), flush=True)

    def log(self, losses: dict[str, Any]) -> None:
        """Every `log_freq` loop steps: the latest losses and the speed (charts/SPS). A loss that is not finite
        stops the run (FloatingPointError): the agent diverged."""
        if self.due(self.config.log_freq):
            for name, value in losses.items():
                if name.startswith("losses/") and not math.isfinite(float(value)):
                    raise FloatingPointError(f"{name} is {float(value)} at {self.unit} {self.step}: the agent "
                                             f"diverged. " + self._training_stopped(DIVERGED))
            sps = self.speed()
            self.logger.scalars({**losses, "charts/SPS": sps}, self.step)
            shown = {} if np.isnan(self.recent_return) else {"ret": f"{self.recent_return:.1f}"}  # none offline
            self._bar.set_postfix(**shown, sps=f"{sps:.0f}", refresh=False)

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
        self.recent_evaluation = float(np.mean(returns))
        self.logger.evaluation(self.step, returns, np.zeros_like(returns) if costs is None else costs)
        if scalars:
            self.logger.scalars(scalars, self.step)

    def save_checkpoint(self, agent: Any, numpy_rng: np.random.Generator, replay: ReplayBuffer | None = None,
                        **state: Any) -> None:
        """checkpoint.pt (atomically): the algorithm, the step, `agent.training_state()`, the random states (python,
        `numpy_rng`, torch) and any other `state` (tensors and plain values); with `replay`, the replay buffer
        as buffer.pt beside it.

        The two are one pair, stamped alike: the buffer is written to buffer.next.pt, then the checkpoint with
        the stamp replaces checkpoint.pt, then the buffer replaces buffer.pt, so a kill at any moment leaves a
        checkpoint whose buffer is on disk. Weights or optimiser state that are not finite are not saved (the
        agent diverged: FloatingPointError), so the checkpoint on disk stays the last good one."""
        training_state = agent.training_state()
        bad = non_finite_entry(training_state)
        if bad is not None:
            raise FloatingPointError(f"The agent's {bad} is not finite (NaN or inf) at {self.unit} {self.step}: its "
                                     f"networks diverged, so this state is not saved. "
                                     + self._training_stopped(DIVERGED))
        stamp = {"global_step": self.step, "id": uuid.uuid4().hex}
        if replay is not None:
            save_checkpoint(self.dir / NEXT_BUFFER_FILE, {**replay.state_dict(), "stamp": stamp})
        save_checkpoint(self.dir / CHECKPOINT_FILE, {"algo": self.algo, "global_step": self.step, "stamp": stamp,
                                                     "agent": training_state, "rng": rng_state(numpy_rng), **state})
        if replay is not None:
            os.replace(self.dir / NEXT_BUFFER_FILE, self.dir / BUFFER_FILE)
        self._checkpoint_step, self._checkpoint_time = self.step, time.perf_counter()

    def restore(self, agent: Any, numpy_rng: np.random.Generator, replay: ReplayBuffer | None = None) -> None:
        """What `save_checkpoint` saved of `agent`, the random states (and the replay buffer), from the resumed
        run's checkpoint. The envs restart, so the interrupted episodes end where the checkpoint cut them."""
        with self.restoring():
            agent.load_training_state(self.checkpoint["agent"])
            restore_rng_state(self.checkpoint["rng"], numpy_rng)
        if replay is not None:
            self._restore_replay(replay)
            replay.end_episodes()

    def _restore_replay(self, buffer: ReplayBuffer) -> None:
        """Load the buffer saved with the checkpoint: buffer.pt, or buffer.next.pt when the save that wrote the
        checkpoint was cut before its last rename (which is finished here). A buffer with another stamp is
        refused in one line: it was not written with this checkpoint."""
        stamp, found = self.checkpoint.get("stamp"), {}
        for name in (BUFFER_FILE, NEXT_BUFFER_FILE):
            if not (self.dir / name).is_file():
                continue
            with self.restoring(name):
                state = torch.load(self.dir / name, map_location="cpu", weights_only=True)
                found[name] = state.get("stamp")
                if found[name] == stamp:
                    buffer.load_state_dict(state)
            if found[name] == stamp:
                if name == NEXT_BUFFER_FILE:
                    os.replace(self.dir / NEXT_BUFFER_FILE, self.dir / BUFFER_FILE)
                return
        if not found:
            raise FileNotFoundError(f"--resume {self.dir}: {BUFFER_FILE} is missing (it is written with every "
                                    f"checkpoint); the run cannot continue without its replay buffer.")
        saved_at = (found.get(BUFFER_FILE) or {}).get("global_step", "an unknown step")
        raise ValueError(f"--resume {self.dir}: {BUFFER_FILE} (saved at {self.unit} {saved_at}) was not written with "
                         f"{CHECKPOINT_FILE} (saved at {self.unit} {self.step}); the run cannot go on with a replay "
                         f"buffer that does not match its checkpoint: put back the pair saved together, or start a new "
                         f"run.")

    def periodic(self, evaluate: Callable[[], Any], checkpoint: Callable[[], None]) -> None:
        """Between loop steps: evaluate every `eval_freq` steps; checkpoint every `checkpoint_freq` steps and when
        `checkpoint_minutes` have passed since the last checkpoint; after a stop signal, checkpoint and stop
        (`RunStopped`: exit code 128 + the signal number). Not after the last step (`finish` is there)."""
        if self.done:
            return
        tick = time.perf_counter()
        if self.due(self.config.eval_freq):
            evaluate()
            if self._video is not None:
                self._film()
        stopping = self._stop_signals.received is not None
        if self.due(self.config.checkpoint_freq) or self._checkpoint_overdue() or stopping:
            checkpoint()
        self._busy += time.perf_counter() - tick
        if stopping:
            print(f"{signal_name(self._stop_signals.received)}: stopped at {self.unit} {self.step} of {self.total} "
                  f"with a checkpoint; continue with: python -m keelrl.agents.{self.algo} --resume {self.dir}",
                  file=sys.stderr, flush=True)
            raise RunStopped(self._stop_signals.received)

    def _checkpoint_overdue(self) -> bool:
        minutes = self.config.checkpoint_minutes
        return minutes > 0 and time.perf_counter() - self._checkpoint_time >= 60 * minutes

    def finish(self, evaluate: Callable[[], Any], checkpoint: Callable[[], None],
               save_model: Callable[[Path], None]) -> Any:
        """After the loop: the final evaluation (its result is returned), the last checkpoint and model.pt. A stop
        signal that comes meanwhile lets the run finish."""
        self._loop_end = time.perf_counter()
        result = evaluate()
        if self._video is not None:
            self._film()
        checkpoint()
        save_model(self.dir / MODEL_FILE)
        if self._stop_signals.received is not None:
            print(f"{signal_name(self._stop_signals.received)} came after the last {self.unit}: the run finished "
                  f"first.", file=sys.stderr, flush=True)
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

    def result(self, returns: np.ndarray, costs: np.ndarray | None = None) -> TrainResult:
        """What `train` returns: the run directory, resolved config, step, final evaluation and speeds."""
        return TrainResult(run_dir=self.dir, config=self.config, global_step=self.step, final_eval_returns=returns,
                           sps=self.loop_speed(), update_sps=self.update_speed(), final_eval_costs=costs)

    def report(self, returns: np.ndarray, *lines: str) -> None:
        """Print the final evaluation, the caller's lines and where the run is."""
        print(f"final evaluation return over {len(returns)} episodes: {returns.mean():.1f} ± {returns.std():.1f}")
        for line in lines:
            print(line)
        print(f"run saved in {self.dir}; open the curves with: tensorboard --logdir {Path(self.config.runs_dir)}")
