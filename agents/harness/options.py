"""The options every run has, their checks, presets, and the command line that runs an agent.

`RunOptions` declares them once; each agent's config dataclass extends it with the algorithm's hyperparameters
(and may give an option another default or meaning, e.g. GRPO's evaluation counts prompts). `parse_command_line`
parses any config dataclass (an agent's, a benchmark script's) from the command line; `run_cli` parses an
agent's config from the command line and turns a user's mistake into one line and exit code 2; while it trains,
`given_options` knows which options that command line named, so that one given at its default value beside a
--preset or --resume that sets another is refused like any other, not silently replaced.
"""

from __future__ import annotations

import contextvars
import dataclasses
import random
import re
import sys
import typing
import warnings
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import torch

from keelrl.agents.harness.stopping import RunStopped
from keelrl.networks.training import set_float32_matmuls

# Measured on the project's 2-core machine (benchmarks/results/threads.md), SAC update 256-256,
# batch 256: one thread takes 10-11 ms idle or beside a busy process; two threads take 6.2 ms idle
# but 24.5 ms when another process keeps the second core busy. One thread is the robust default;
# pass --threads 2 (or more on bigger machines) when the run has the machine to itself.
DEFAULT_THREADS = 1


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
    """when stdout or stderr is not a terminal (a log file, nohup, CI, a cluster job): seconds between plain
    progress lines"""
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


def require_positive(config: Any, *names: str) -> None:
    """Refuse a rate or scale option not above 0 (or NaN, which no comparison refuses), naming it as on the
    command line."""
    for name in names:
        if not getattr(config, name) > 0:
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(config, name)}.")


def require_positive_widths(config: Any) -> None:
    """Refuse a hidden layer of no width (torch would fail deep inside the network's construction)."""
    if any(width < 1 for width in config.hidden_sizes):
        raise ValueError(f"--hidden-sizes needs positive widths, got {' '.join(map(str, config.hidden_sizes))}.")


def warn_without_updates(config: Any, first: str, total: str = "total_timesteps") -> None:
    """Say when a run's first update would come at or after its last step: it ends untrained (random actions only,
    which a smoke run may want, a real one hardly)."""
    if getattr(config, first) >= getattr(config, total):
        flag, total_flag = first.replace("_", "-"), total.replace("_", "-")
        warnings.warn(f"--{flag} {getattr(config, first)} is not below --{total_flag} {getattr(config, total)}: the "
                      f"run will end before its first update, untrained; lower --{flag} or raise --{total_flag}.",
                      stacklevel=2)


def refuse_unknown_choices(config: Any) -> None:
    """Refuse a value outside an option's choices (a `Literal` field): the command line refuses it already, a config
    built in Python met a KeyError or worse deep in the run."""
    hints = typing.get_type_hints(type(config))
    for field in dataclasses.fields(config):
        choices = _literal_choices(hints[field.name])
        value = getattr(config, field.name)
        if choices and value not in choices:
            raise ValueError(f"--{field.name.replace('_', '-')} must be one of {', '.join(map(str, choices))}, got "
                             f"{value!r}.")


def _literal_choices(hint: Any) -> tuple[Any, ...]:
    """The values a `Literal[...]` hint allows, None included for `Literal[...] | None`; () for any other hint."""
    if typing.get_origin(hint) is Literal:
        return typing.get_args(hint)
    arms = typing.get_args(hint)  # a union's
    if arms and all(typing.get_origin(arm) is Literal or arm is type(None) for arm in arms):
        return tuple(value for arm in arms for value in (typing.get_args(arm) if arm is not type(None) else (None,)))
    return ()


def validate_run_options(config: RunOptions, total: str) -> None:
    """Reject run option values no run can use, with the option's command-line name."""
    refuse_unknown_choices(config)
    require_positive_counts(config, "eval_episodes", "checkpoint_freq", "log_freq", "threads", total)
    if not 0 <= config.seed < 2**32:  # numpy's and the envs' seeds
        raise ValueError(f"--seed must lie in [0, 2**32 - 1], got {config.seed}.")
    require_non_negative(config, "eval_freq", "progress_seconds", "checkpoint_minutes")
    if config.extend_to is not None:
        if config.resume is None:
            raise ValueError("--extend-to trains a saved run further: give it with --resume RUN_DIR.")
        if config.extend_to < getattr(config, total):
            raise ValueError(f"--extend-to {config.extend_to} is below the run's --{total.replace('_', '-')} "
                             f"{getattr(config, total)}: a run cannot be shortened.")


_NAMED_ON_COMMAND_LINE: contextvars.ContextVar[frozenset[str] | None] = contextvars.ContextVar(
    "keelrl_named_on_command_line", default=None)
"""The config fields the command line of the run that `run_cli` trains now names (None: no such run)."""


def named_options(args: list[str], config_cls: type) -> frozenset[str]:
    """The fields of `config_cls` that a command line names: `--actor-lr 1e-4`, `--actor-lr=1e-4`, `--actor_lr`,
    and a flag's `--capture-video` and `--no-capture-video`."""
    fields = {field.name for field in dataclasses.fields(config_cls)}
    named = set()
    for arg in args:
        if arg.startswith("--"):
            name = arg[2:].split("=", 1)[0].replace("-", "_")
            if name not in fields and name.startswith("no_"):
                name = name[3:]
            if name in fields:
                named.add(name)
    return frozenset(named)


def given_options(config: Any) -> set[str]:
    """The options of `config` its user gave. Under `run_cli`: those its command line named, at whatever value, its
    default too. A config built in Python: those that differ from their defaults (one set to its default cannot be
    told from one left alone there)."""
    named = _NAMED_ON_COMMAND_LINE.get()
    if named is not None:
        return {field.name for field in dataclasses.fields(config) if field.name in named}
    return {field.name for field in dataclasses.fields(config) if getattr(config, field.name) != _default(field)}


def _default(field: dataclasses.Field) -> Any:
    """A config field's default (MISSING for a field without one, which a config always has given)."""
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def apply_preset(config: Any, presets: dict[str, dict[str, Any]]) -> Any:
    """The config with `config.preset`'s settings (None: unchanged). An option also given (`given_options`) at
    another value than the preset's contradicts it and is refused."""
    if config.preset is None:
        return config
    given = given_options(config)
    for name, value in presets[config.preset].items():
        if name in given and getattr(config, name) != value:
            raise ValueError(f"--preset {config.preset} sets --{name.replace('_', '-')} {value}, but "
                             f"--{name.replace('_', '-')} {getattr(config, name)} was also given: drop one of them.")
    return dataclasses.replace(config, **presets[config.preset])


class TorchSettings:
    """What a run sets of torch's process-wide settings, given back at its end (`restore`) so that a caller's own
    stay: the intra-op threads (see DEFAULT_THREADS for why the default is what it is) and, for an agent with
    --precision, the float32 matrix-product precision (tf32 runs CUDA's on tensor cores, forward and backward)."""

    def __init__(self, config: Any):
        self._threads = torch.get_num_threads()
        if config.threads < 1:
            raise ValueError(f"threads must be at least 1, got {config.threads}.")
        torch.set_num_threads(config.threads)
        self._float32_matmuls = None if not hasattr(config, "precision") else set_float32_matmuls(config.precision)

    def restore(self) -> None:
        torch.set_num_threads(self._threads)
        if self._float32_matmuls is not None:
            torch.set_float32_matmul_precision(self._float32_matmuls)


def seed_everything(seed: int) -> None:
    """One seed for python, numpy and torch; envs are seeded by make_vec_env."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def evaluation_seed(run_seed: int, episodes: int) -> int:
    """The seed of a run's first evaluation episode; episode i is seeded this + i. Runs of different seeds evaluate
    on disjoint episodes: seed s takes [10_000 + s * episodes, 10_000 + (s + 1) * episodes)."""
    return 10_000 + run_seed * episodes


def parse_command_line(config_cls: type, args: list[str] | None = None) -> Any:
    """`config_cls` from the command line (`args`, default sys.argv[1:]) by tyro, whose --help shows each field's
    docstring as running text."""
    import tyro
    from tyro import _strings

    # tyro 1.0 joins a docstring's lines before it dedents them (tyro/_docstrings.py, get_field_docstring), so
    # each indented continuation line of a multi-line field docstring started a new line in --help
    tyro_join, _strings.remove_single_line_breaks = _strings.remove_single_line_breaks, help_paragraphs
    try:
        return tyro.cli(config_cls, args=args)
    finally:
        _strings.remove_single_line_breaks = tyro_join


def help_paragraphs(text: str) -> str:
    """A docstring as --help prints it: each paragraph's lines stripped and joined by spaces; blank lines still
    part paragraphs, and a line that starts a bullet ("- ", "* ") starts a new line."""
    paragraphs = []
    for paragraph in re.split(r"\n[ \t]*\n", text.strip()):
        lines = [line.strip() for line in paragraph.split("\n")]
        paragraphs.append(lines[0] + "".join(("\n" if line.startswith(("- ", "* ")) else " ") + line
                                             for line in lines[1:]))
    return "\n\n".join(paragraphs)


def run_cli(train: Callable[[Any], Any], config_cls: type, args: list[str] | None = None) -> int:
    """Parse `config_cls` from the command line and train; a user error prints one line, exit code 2; a run
    stopped by SIGTERM or Ctrl-C (with its checkpoint written) gives 128 + the signal number."""
    config = parse_command_line(config_cls, args)
    named = _NAMED_ON_COMMAND_LINE.set(named_options(sys.argv[1:] if args is None else args, config_cls))
    python_format, warnings.formatwarning = warnings.formatwarning, one_line_warning
    try:
        train(config)
    except (ValueError, OSError, FloatingPointError) as err:  # OSError: a file keelrl cannot read or write
        print(f"error: {err}", file=sys.stderr)
        return 2
    except RunStopped as stop:  # the run said how to resume it
        return stop.code
    except KeyboardInterrupt:  # Ctrl-C before or after the training loop, where no checkpoint is written
        print("interrupted outside the training loop: continue from the run's last checkpoint, if it has one, with "
              "--resume RUN_DIR", file=sys.stderr)
        return 130
    finally:
        _NAMED_ON_COMMAND_LINE.reset(named)
        warnings.formatwarning = python_format
    return 0


def one_line_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                     line: str | None = None) -> str:
    """A warning as `run_cli` prints it: one line, as its errors are (Python's format adds the file, the line
    number and the code line)."""
    kind = "" if category is UserWarning else f" ({category.__name__})"
    return f"warning{kind}: {message}\n"
