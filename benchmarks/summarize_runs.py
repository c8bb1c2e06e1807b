"""Summarise finished runs as a Markdown table: keelrl run directories and, beside them, CleanRL's.

    python -m keelrl.benchmarks.summarize_runs --keelrl runs/Hopper-v5__sac__* --cleanrl ../cleanrl/runs/Hopper-v5__*

For each run: the final evaluation return (keelrl's eval.csv; CleanRL does not evaluate) and the
mean return of the last `--last-episodes` training episodes (keelrl's episodes.csv; CleanRL's
`charts/episodic_return` TensorBoard scalar), then mean ± std over the runs of each group.
"""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import numpy as np
import tyro


@dataclasses.dataclass
class Args:
    keelrl: tuple[Path, ...] = ()
    """keelrl run directories (with eval.csv and episodes.csv)"""
    cleanrl: tuple[Path, ...] = ()
    """CleanRL run directories (with TensorBoard events)"""
    last_episodes: int = 10
    """training episodes averaged for the 'last training episodes' column"""


@dataclasses.dataclass
class RunSummary:
    name: str
    final_eval: float
    last_train: float
    last_step: int


def summarize_keelrl(run_dir: Path, last_episodes: int) -> RunSummary:
    with (run_dir / "eval.csv").open() as f:
        evals = list(csv.DictReader(f))
    with (run_dir / "episodes.csv").open() as f:
        episodes = list(csv.DictReader(f))
    last = [float(row["return"]) for row in episodes[-last_episodes:]]
    return RunSummary(run_dir.name, float(evals[-1]["mean_return"]), float(np.mean(last)),
                      int(evals[-1]["global_step"]))


def summarize_cleanrl(run_dir: Path, last_episodes: int) -> RunSummary:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    returns = events.Scalars("charts/episodic_return")
    last = [event.value for event in returns[-last_episodes:]]
    return RunSummary(run_dir.name, float("nan"), float(np.mean(last)), returns[-1].step)


def table(title: str, runs: list[RunSummary]) -> str:
    lines = [f"**{title}**", "", "| run | last step | final eval return | last training episodes |", "|---|---|---|---|"]
    for run in runs:
        lines.append(f"| {run.name} | {run.last_step} | {run.final_eval:.1f} | {run.last_train:.1f} |")
    evals = np.array([r.final_eval for r in runs])
    trains = np.array([r.last_train for r in runs])
    lines.append(f"| mean ± std ({len(runs)} runs) | | {evals.mean():.1f} ± {evals.std():.1f} | "
                 f"{trains.mean():.1f} ± {trains.std():.1f} |")
    return "\n".join(lines)


def main(args: Args) -> None:
    if args.keelrl:
        print(table("keelrl", [summarize_keelrl(d, args.last_episodes) for d in sorted(args.keelrl)]))
        print()
    if args.cleanrl:
        print(table("CleanRL", [summarize_cleanrl(d, args.last_episodes) for d in sorted(args.cleanrl)]))


if __name__ == "__main__":
    main(tyro.cli(Args))
