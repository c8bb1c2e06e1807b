"""What every agent needs: run directory, logging, seeding, threads, checkpoints, evaluation, CLI."""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import json
import os
import random
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from keelrl.envs import make_vec_env

# Measured on the project's 2-core machine (benchmarks/results/threads.md), SAC update 256-256,
# batch 256: one thread takes 10-11 ms idle or beside a busy process; two threads take 6.2 ms idle
# but 24.5 ms when another process keeps the second core busy. One thread is the robust default;
# pass --threads 2 (or more on bigger machines) when the run has the machine to itself.
DEFAULT_THREADS = 1
CHECKPOINT_FILE = "checkpoint.pt"
BUFFER_FILE = "buffer.pt"
CONFIG_FILE = "config.json"


@dataclasses.dataclass
class TrainResult:
    """What `train` returns."""

    run_dir: Path
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
                         f"{', '.join(missing)}); it is damaged or comes from another program.")
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


def load_checkpoint(path: str | os.PathLike, algo: str) -> dict[str, Any]:
    """Load tensors and plain containers only (`weights_only=True`: nothing is unpickled)."""
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
    if state["algo"] != algo:
        raise ValueError(f"{path} is a {state['algo']!r} checkpoint, not {algo!r}: load it with that agent.")
    return state


class RunLogger:
    """TensorBoard scalars (CleanRL names) plus episodes.csv and eval.csv in the run directory.

    On resume from step S, rows and events after S (written before the interruption but not
    covered by the checkpoint) are dropped, so the logs have no gap and no duplicate.
    """

    EPISODE_FIELDS = ["global_step", "return", "length", "cost"]
    EVAL_FIELDS = ["global_step", "mean_return", "std_return", "mean_cost", "episodes"]

    def __init__(self, run_dir: Path, resume_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter

        self.run_dir = run_dir
        self.writer = SummaryWriter(str(run_dir), purge_step=resume_step)
        self._episodes = self._open_csv("episodes.csv", self.EPISODE_FIELDS, resume_step)
        self._evals = self._open_csv("eval.csv", self.EVAL_FIELDS, resume_step)

    def _open_csv(self, name: str, fields: list[str], resume_step: int | None):
        path = self.run_dir / name
        rows = []
        if resume_step is not None and path.exists():
            with path.open() as f:
                rows = [r for r in csv.DictReader(f) if int(r["global_step"]) <= resume_step]
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
    except KeyboardInterrupt:
        print("interrupted: continue from the last checkpoint with --resume RUN_DIR", file=sys.stderr)
        return 130
    return 0
