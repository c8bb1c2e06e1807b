"""A run's directory, its config.json, and what --resume and --extend-to make of an earlier run's.

runs/{env_id}__{algo}__{seed}__{unix_time}/ holds config.json (the resolved config), the logs, checkpoint.pt
(+ buffer.pt for off-policy agents) and, once the run is finished, model.pt. `--resume RUN_DIR` continues it
with its saved config, taking from the new command line only how the run is watched and where it computes.
While a process trains in a run directory it holds run.lock there (`RunDirLock`), so a second process cannot
resume the run at the same time.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from keelrl.agents.harness.checkpoints import CHECKPOINT_FILE, MODEL_FILE, read_checkpoint, settle_checkpoints
from keelrl.agents.harness.options import RUNTIME_OPTIONS, WATCH_OPTIONS, given_options

try:
    import fcntl
except ImportError:  # Windows: run directories are not locked there
    fcntl = None

CONFIG_FILE = "config.json"
DATASET_FILE = "dataset.json"
"""an offline run's record of the dataset it learned from (its id, size, corruption and reference returns)"""
LOCK_FILE = "run.lock"
"""Locked while a process trains in the run directory; it names that process."""


def new_run_dir(root: str, env_id: str, algo: str, seed: int) -> Path:
    """runs/{env_id}__{algo}__{seed}__{unix_time}/ (a suffix is added if the name is taken)."""
    base = Path(root) / f"{env_id.replace('/', '_')}__{algo}__{seed}__{int(time.time())}"
    run_dir, n = base, 1
    while run_dir.exists():
        run_dir, n = Path(f"{base}_{n}"), n + 1
    try:
        run_dir.mkdir(parents=True)
    except OSError as err:
        raise ValueError(f"--runs-dir {root}: cannot make a run directory there ({err.strerror}): give a directory "
                         f"you can write to.") from None
    return run_dir


class RunDirLock:
    """An exclusive lock on run directories (a run's, or a seed group's), held from the moment a run starts or
    resumes until it ends, so that a second process resuming a run one still trains, or two processes resuming one
    at once, is refused in one line instead of both writing its checkpoints and logs. The operating system drops
    the lock when the process ends, by kill -9 too (flock on run.lock; none on Windows). A directory that is not a
    run's (no config.json) is skipped, and left as it was: resuming says what it lacks."""

    def __init__(self, run_dirs: list[Path]):
        self._files: list[Any] = []
        try:
            for run_dir in run_dirs:
                if (run_dir / CONFIG_FILE).is_file():
                    self.add(run_dir)
        except BaseException:
            self.release()
            raise

    def add(self, run_dir: Path) -> None:
        """Lock one more directory (a new run's, once it is made)."""
        if fcntl is None:
            return
        try:
            file = open(run_dir / LOCK_FILE, "a+")
        except OSError:  # a directory this process cannot write: resuming there fails on its own, in one line
            return
        self._files.append(_lock(file, run_dir))

    def release(self) -> None:
        for file in self._files:
            file.close()  # closing it drops the flock
        self._files = []


def _lock(file: Any, run_dir: Path) -> Any:
    """`file` (run_dir/run.lock, open) locked, naming this process; refused in one line if another process holds
    it."""
    try:
        fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        file.seek(0)
        holder = file.read().strip() or "another process"
        file.close()
        raise ValueError(f"{run_dir} is in use: {holder} trains in it now. Let that run end, or stop it (kill -TERM "
                         f"checkpoints it) and then resume it.") from None
    except OSError:  # a file system without locks (some network mounts): go on unlocked rather than not at all
        return file
    file.truncate(0)
    file.write(f"process {os.getpid()} on {socket.gethostname()} (since {time.strftime('%Y-%m-%d %H:%M:%S')})\n")
    file.flush()
    return file


def make_run_dir(config: Any, name: str, algo: str, lock: RunDirLock | None, files: dict[str, str]) -> Path:
    """A new run's directory runs_dir/{name}__{algo}__{seed}__{time}, locked at once with `lock` (None: a seed group
    locks its own), with config.json and `files` (file name -> text)."""
    run_dir = new_run_dir(config.runs_dir, name, algo, config.seed)
    if lock is not None:
        lock.add(run_dir)
    save_config(run_dir, algo, config)
    for file_name, text in files.items():
        (run_dir / file_name).write_text(text)
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
            f"--checkpoint-freq steps or --checkpoint-minutes, or when stopped by SIGTERM or Ctrl-C, so one killed "
            f"before then has nothing to resume: start it again)."
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


def refuse_other_options(config: Any, saved: Any, run_dir: Path, taken: tuple[str, ...]) -> None:
    """Refuse options given beside --resume (`given_options`) that would change the saved run (any but `taken`,
    which the new command line sets): the run continues with its own, and silently dropping them would mislead."""
    given_names = given_options(config)
    given = [field.name for field in dataclasses.fields(config) if field.name in given_names
             and field.name not in taken and getattr(config, field.name) != getattr(saved, field.name)]
    if given:
        options = ", ".join(f"--{name.replace('_', '-')} {getattr(config, name)} (the run's: {getattr(saved, name)})"
                            for name in given)
        raise ValueError(f"--resume {run_dir} continues the run with the options it was started with, and this "
                         f"command line gives others: {options}. Drop them (--extend-to N trains a run further; a "
                         f"new run takes new options).")


def start_or_resume(config: Any, algo: str, validate: Callable[[Any], None], total: str,
                    keep_from_command_line: tuple[str, ...], checkpoint_keys: tuple[str, ...],
                    ) -> tuple[Any, Path | None, dict[str, Any] | None]:
    """A new run's validated config (and no run directory or checkpoint yet). Under `--resume RUN_DIR`: the
    interrupted run's saved config, with the watch and runtime options and `keep_from_command_line` taken from
    this command line and --extend-to applied (the new `total` is saved, so a later plain --resume continues to
    it); its directory; and its checkpoint, which must hold `checkpoint_keys`. A finished run (with its model.pt)
    is refused unless extended."""
    if config.resume is None:
        validate(config)
        return config, None, None
    run_dir = Path(config.resume)
    if run_dir.is_dir():
        settle_checkpoints([run_dir])  # the checkpoint a kill kept from being put in place
    saved = load_run_config(run_dir, algo, type(config))
    names = (*WATCH_OPTIONS, *RUNTIME_OPTIONS, "extend_to", *keep_from_command_line)
    refuse_other_options(config, saved, run_dir, (*names, "resume"))
    overrides = {name: getattr(config, name) for name in names if hasattr(config, name)}
    saved = dataclasses.replace(saved, resume=str(run_dir), **overrides)
    validate(saved)
    checkpoint = read_checkpoint(run_dir / CHECKPOINT_FILE, algo)
    missing = [key for key in checkpoint_keys if key not in checkpoint]
    if missing:
        raise ValueError(f"{run_dir / CHECKPOINT_FILE} is not a checkpoint of a {algo} run (no "
                         f"{', '.join(missing)}); it is damaged, comes from another program or from an earlier keelrl "
                         f"version: start a new run.")
    if saved.extend_to is not None:
        saved = dataclasses.replace(saved, **{total: saved.extend_to}, extend_to=None)
        save_config(run_dir, algo, saved)
    if checkpoint["global_step"] >= getattr(saved, total) and (run_dir / MODEL_FILE).is_file():
        raise ValueError(f"--resume {run_dir}: the run is finished ({checkpoint['global_step']} of its "
                         f"{getattr(saved, total)} --{total.replace('_', '-')}); train it on with --resume {run_dir} "
                         f"--extend-to N.")
    return saved, run_dir, checkpoint
