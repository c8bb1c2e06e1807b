"""What a run of benchmarks/checks/rlvr_trl.py measures (`Clock`) and the CSV files it writes (`write_record`).

Training time counts whole iterations, each from its start to the start of the next iteration or of an evaluation
(`Clock`). Peak RSS is the process's peak over those iterations: the peak is reset (Linux's
/proc/self/clear_refs) where the clock starts and read where it stops; the whole process's peak (model loading and
evaluations included) is kept beside it.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import os
import resource
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch

from keelrl.benchmarks.checks.rlvr_learning import commit_of, machine_description
from keelrl.benchmarks.checks.rlvr_trl_settings import RunArgs, Settings
from keelrl.envs.rlvr_tasks import make_task

T = TypeVar("T")


def reset_peak_rss() -> None:
    """Make the process's peak RSS its current RSS (Linux: VmHWM, which getrusage reports)."""
    Path("/proc/self/clear_refs").write_text("5")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def now() -> np.ndarray:
    """(wall seconds, this process's CPU seconds): CPU seconds tell what a run costs where others share its core."""
    return np.array([time.perf_counter(), time.process_time()])


class Clock:
    """Wall and CPU seconds, generated tokens and peak RSS of a run's whole iterations, its evaluations left out.

    It runs from an iteration's start until an evaluation starts (the next iteration's start restarts it), so an
    iteration ends where the next one or an evaluation begins, and what follows an evaluation before the next
    iteration (keelrl: a checkpoint; TRL: its logging) is not counted.
    """

    def __init__(self):
        self.training, self.generation = np.zeros(2), np.zeros(2)  # (wall, CPU) seconds
        self.tokens = self.iterations = 0
        self.peak_rss = self.process_peak_rss = 0.0
        self.prompts = hashlib.sha256()
        self._since: np.ndarray | None = None  # when it last started running (None: paused)

    def iteration_begins(self) -> None:
        if self._since is None:
            self._resume()
        self.iterations += 1

    def generating(self, sample: Callable[[], T]) -> T:
        """sample() (sampling or scoring), its time counted as generation."""
        start = now()
        result = sample()
        self.generation += now() - start
        return result

    def generated(self, tokens: int, prompt_rows: list[list[int]]) -> None:
        """A batch of `tokens` generated tokens from prompts of these token ids (a list per row, in row order)."""
        self.tokens += tokens
        self.prompts.update(str(prompt_rows).encode())

    def evaluation(self, evaluate: Callable[[], dict], k: int) -> tuple[dict, dict]:
        """`evaluate()` (heldout_metrics' dict), its time and memory left out; and its row of the evaluations CSV."""
        self._pause()
        metrics = evaluate()
        return metrics, {"iteration": self.iterations, "minutes": float(self.training[0]) / 60,
                         "greedy_accuracy": metrics["greedy_accuracy"], "pass_at_1": metrics["pass@1"],
                         "pass_at_k": metrics[f"pass@{k}"]}

    def _pause(self) -> None:
        if self._since is not None:
            self.training += now() - self._since
            self.peak_rss = max(self.peak_rss, peak_rss_mb())
            self._since = None

    def _resume(self) -> None:
        self.process_peak_rss = max(self.process_peak_rss, peak_rss_mb())
        reset_peak_rss()
        self._since = now()

    def summary(self) -> dict:
        self._pause()
        self.process_peak_rss = max(self.process_peak_rss, peak_rss_mb())
        (wall, cpu), (generation, generation_cpu) = self.training.tolist(), self.generation.tolist()
        return {"iterations_done": self.iterations, "generated_tokens": self.tokens,
                "training_seconds": wall, "generation_seconds": generation, "update_seconds": wall - generation,
                "training_cpu_seconds": cpu, "generation_cpu_seconds": generation_cpu,
                "tokens_per_second": self.tokens / wall if wall else 0.0,
                "peak_rss_mb": self.peak_rss, "process_peak_rss_mb": self.process_peak_rss,
                "prompts_sha": self.prompts.hexdigest()[:16] if self.iterations else ""}


def versions() -> dict[str, str]:
    """torch's, transformers' and (where it is installed: the TRL side) trl's versions."""
    installed = {}
    for name in ("torch", "transformers", "trl"):
        try:
            installed[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed[name] = ""
    return installed


def run_file(out: str, task: str, side: str, seed: int, kind: str) -> Path:
    """The file of a run's `kind` ('evals.csv', 'run.csv', 'grpo_config.json') in the results folder."""
    return Path(out) / f"{task}_{side}_seed{seed}_{kind}"


def write_csv(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def write_run(out: str, run: dict, evaluations: list[dict]) -> None:
    """A run's evaluations CSV (a row per evaluation) and its one-row run CSV, named by task, side and seed."""
    write_csv(run_file(out, run["task"], run["side"], run["seed"], "evals.csv"), evaluations)
    write_csv(run_file(out, run["task"], run["side"], run["seed"], "run.csv"), [run])


def command_of(side: str, args: RunArgs) -> str:
    """The command that makes a run's figures: CPU pinning, the side, the settings not at their defaults."""
    affinity = sorted(os.sched_getaffinity(0))
    pin = f"taskset -c {','.join(map(str, affinity))} " if len(affinity) < (os.cpu_count() or 0) else ""
    options = []
    for field in dataclasses.fields(Settings):
        value, default = getattr(args, field.name), field.default
        flag = field.name.replace("_", "-")
        if isinstance(value, bool) and value != default:
            options.append(f"--{flag}" if value else f"--no-{flag}")
        elif value != default:
            options.append(f"--{flag} {value:g}" if isinstance(value, float) else f"--{flag} {value}")
    return " ".join([f"{pin}python -m keelrl.benchmarks.checks.rlvr_trl {side}", *options])


def write_record(args: RunArgs, side: str, clock: Clock, evaluations: list[dict]) -> None:
    """The run's evaluations CSV and its one-row run CSV (settings, measurements, provenance)."""
    settings = {field.name: getattr(args, field.name) for field in dataclasses.fields(Settings)}
    # a split is the plain prompts' (a chat prompt keeps its plain prompt's), so plain problems count it
    evaluated = make_task(args.task, args.task_size, args.max_value).problems(args.eval_split, args.eval_episodes, 0)
    measured = clock.summary()
    run = {"side": side, **settings, **measured, "eval_prompts": len(evaluated), **versions(),
           "threads_used": torch.get_num_threads(), "machine": machine_description(),
           "commit": commit_of(args.commit_note), "command": command_of(side, args)}
    write_run(args.out, run, evaluations)
    print(f"{side} seed {args.seed}: {evaluations[-1]} | {measured}")
