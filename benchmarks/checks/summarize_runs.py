"""Summarise finished runs as a Markdown table: keelrl run directories and, beside them, CleanRL's.

    python -m keelrl.benchmarks.checks.summarize_runs --keelrl runs/Hopper-v5__sac__* --cleanrl ../cleanrl/runs/Hopper-v5__*

For each run: the final evaluation return and episode cost (keelrl's eval.csv, cost 0 on a task
without one; CleanRL does not evaluate), and the mean return of the last
`--last-episodes` training episodes (keelrl's episodes.csv; CleanRL's `charts/episodic_return`
TensorBoard scalar), then mean ± std over the runs of each group.
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
    final_cost: float = float("nan")
    """mean episode cost of the final evaluation (0 on a task without cost; NaN for CleanRL)"""


def summarize_keelrl(run_dir: Path, last_episodes: int) -> RunSummary:
    with (run_dir / "eval.csv").open() as f:
        evals = list(csv.DictReader(f))
    with (run_dir / "episodes.csv").open() as f:
        episodes = list(csv.DictReader(f))
    last = [float(row["return"]) for row in episodes[-last_episodes:]]
    final = evals[-1]
    return RunSummary(run_dir.name, float(final["mean_return"]), float(np.mean(last)),
                      int(final["global_step"]), float(final["mean_cost"]))


def summarize_cleanrl(run_dir: Path, last_episodes: int) -> RunSummary:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    returns = events.Scalars("charts/episodic_return")
    last = [event.value for event in returns[-last_episodes:]]
    return RunSummary(run_dir.name, float("nan"), float(np.mean(last)), returns[-1].step)


def table(title: str, runs: list[RunSummary]) -> str:
    lines = [f"**{title}**", "",
             "| run | last step | final eval return | final eval cost | last training episodes |",
             "|---|---|---|---|---|"]
    for run in runs:
        lines.append(f"| {run.name} | {run.last_step} | {run.final_eval:.1f} | {run.final_cost:.1f} | "
                     f"{run.last_train:.1f} |")
    lines.append(f"| mean ± std ({len(runs)} runs) | | {mean_std([r.final_eval for r in runs])} | "
                 f"{mean_std([r.final_cost for r in runs])} | {mean_std([r.last_train for r in runs])} |")
    return "\n".join(lines)


def mean_std(values: list[float]) -> str:
    return f"{np.mean(values):.1f} ± {np.std(values):.1f}"


def main(args: Args) -> None:
    if args.keelrl:
        print(table("keelrl", [summarize_keelrl(d, args.last_episodes) for d in sorted(args.keelrl)]))
        print()
    if args.cleanrl:
        print(table("CleanRL", [summarize_cleanrl(d, args.last_episodes) for d in sorted(args.cleanrl)]))


if __name__ == "__main__":
    main(tyro.cli(Args))
