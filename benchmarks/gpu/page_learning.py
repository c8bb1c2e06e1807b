"""The learning parts of the GPU page (benchmarks/gpu/page.py): evidence.py's cells merged over leases, their tables
at the step every cell reached and at the budget, beside the published Hopper figures and keelrl's CPU leaderboards,
and their curves."""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
from collections import defaultdict
from pathlib import Path

from keelrl.benchmarks.aggregate import read_csv_rows

PUBLISHED_HOPPER_100K = {"SimbaV2 (UTD 2)": 2821, "SAC": 1103}
"""Hopper-v4 mean return at 100k steps, 10 seeds: the SimbaV2 repository's results/baseline/*.csv (REFERENCES.md,
"Small-budget online figures"); v4 and their settings (SimbaV2 at UTD 2), not this run's Hopper-v5 (keelrl's
--preset simbav2 runs UTD 1, its repository's MuJoCo configuration)."""


PUBLISHED_NOTE = ("The published rows are the SimbaV2 repository's Hopper-v4 means at 100k steps over ten seeds, "
                  "SimbaV2 at UTD 2; keelrl's entries run Hopper-v5, and its sac-simbav2 (--preset simbav2) runs "
                  "UTD 1.")


BEHAVIOUR_SCORE = 34.3
"""keelrl/hopper-medium-v0's behaviour policy, normalised (benchmarks/results/offline.md)"""


@dataclasses.dataclass
class Learning:
    """The evaluations and cell progress of every grid entry, each entry from the folder whose cells of it got
    furthest, and the machine (evidence.py's machine.json) of each entry's folder."""
    learning: list[dict]
    progress: list[dict]
    machines: dict[tuple[str, str], dict | None]  # (grid, agent) -> machine.json, None where the folder has none


def merged_learning(folders: tuple[Path, ...]) -> Learning:
    chosen: dict[tuple[str, str], tuple[int, Path]] = {}  # (grid, agent) -> (evaluated by every cell, folder)
    for folder in folders:
        evaluated: dict[tuple[str, str], list[int]] = defaultdict(list)
        for row in read_csv_rows(folder / "progress.csv"):
            evaluated[row["grid"], row["agent"]].append(int(row["last_evaluation"]))
        for entry, steps in evaluated.items():
            if min(steps) >= chosen.get(entry, (-1, None))[0]:  # as far or further: the later folder's
                chosen[entry] = min(steps), folder

    def rows(name: str) -> list[dict]:
        return [row for entry, (_, folder) in chosen.items() for row in read_csv_rows(folder / name)
                if (row["grid"], row["agent"]) == entry]

    return Learning(learning=rows("learning.csv"), progress=rows("progress.csv"),
                    machines={entry: json.loads((folder / "machine.json").read_text())
                              if (folder / "machine.json").is_file() else None
                              for entry, (_, folder) in chosen.items()})


def seeds_of(rows: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """Evaluations grouped by (grid, agent), then (seed) in step order."""
    grouped: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for row in rows:
        grouped[row["grid"], row["agent"]].append(row)
    return grouped


def common_step(progress: list[dict], grid: str) -> int:
    """The last evaluation step every cell of `grid` reached."""
    return min((int(row["last_evaluation"]) for row in progress if row["grid"] == grid), default=0)


@dataclasses.dataclass
class CPULeaderboard:
    """A CPU leaderboard's tables (benchmarks/leaderboard/: <name>_cells.csv and <name>_curves.csv) and its page."""
    page: str  # the page's path, relative to the GPU page
    cells: list[dict]
    curves: list[dict]


def cpu_leaderboard(cells_file: Path, gpu_page: Path) -> CPULeaderboard:
    """The tables of the CPU leaderboard whose cells table is `cells_file` (none where it is missing)."""
    name = cells_file.name.removesuffix("_cells.csv")
    return CPULeaderboard(page=os.path.relpath(cells_file.with_name(f"{name}.md"), gpu_page.parent),
                          cells=read_csv_rows(cells_file),
                          curves=read_csv_rows(cells_file.with_name(f"{name}_curves.csv")))


def learning_section(learning: list[dict], progress: list[dict], cpus: tuple[CPULeaderboard, ...] = ()) -> list[str]:
    """Per grid: each agent's mean ± std over seeds at the step every cell reached and at the budget (where every
    seed of the entry reached it), and the steps each seed reached; the published figures, keelrl's figures of the
    same entries from the CPU leaderboards (`cpus`) and the behaviour policy beside them."""
    lines = []
    for grid in dict.fromkeys(row["grid"] for row in progress):
        step = common_step(progress, grid)
        offline = any(row["normalized_score"] for row in learning if row["grid"] == grid)
        measure = "normalised score" if offline else "evaluation return"
        heading = (f"at step {step:,} (the last evaluation every cell reached)" if step else
                   "no step every cell evaluated (some had not reached their first evaluation)")
        lines += [f"### {grid}: {heading}", "",
                  f"| agent | {measure}, mean ± std over seeds | seeds | steps each seed reached (budget) | "
                  "steps/s per seed | at the budget |",
                  "|---|---|---|---|---|---|"]
        for agent in dict.fromkeys(row["agent"] for row in progress if row["grid"] == grid):
            cells = [row for row in progress if row["grid"] == grid and row["agent"] == agent]
            reached, budget = [f"{int(row['last_step']):,}" for row in cells], int(cells[0]["budget"])
            at_step, at_budget = (evaluated(learning, grid, agent, when, offline) for when in (step, budget))
            lines.append(f"| {agent} | {mean_spread(at_step) or 'not measured'} | {len(at_step)} | "
                         f"{', '.join(reached)} ({budget:,}) | {rate(cells)} | "
                         f"{mean_spread(at_budget) if len(at_budget) == len(cells) else 'not reached'} |")
        if offline:
            lines.append(f"| behaviour policy (the dataset) | {BEHAVIOUR_SCORE} | | | | {BEHAVIOUR_SCORE} |")
        else:
            lines += [f"| published, Hopper-v4 at 100k: {name} | | 10 | 100,000 | | {value} |"
                      for name, value in PUBLISHED_HOPPER_100K.items()]
            lines += [line for cpu in cpus for line in cpu_lines(cpu, [row for row in progress
                                                                         if row["grid"] == grid], step)]
            lines += ["", PUBLISHED_NOTE]
        lines += ["", *side_by_side_section(learning, progress, grid, cpus)]
    return lines


def shared_steps(values_at: dict[int, list[float]], seeds: int) -> list[int]:
    """The steps (ascending) at which all `seeds` seeds of an entry were evaluated."""
    return sorted(step for step, values in values_at.items() if len(values) == seeds)


def gpu_values(learning: list[dict], progress: list[dict], grid: str) -> dict[str, tuple[int, dict[int, list[float]]]]:
    """Each online grid entry's seeds (its cells) and its seeds' returns by step."""
    entries: dict[str, tuple[int, dict[int, list[float]]]] = {}
    for agent in dict.fromkeys(row["agent"] for row in progress if row["grid"] == grid):
        values_at: dict[int, list[float]] = defaultdict(list)
        for row in learning:
            if row["grid"] == grid and row["agent"] == agent:
                values_at[int(row["step"])].append(float(row["mean_return"]))
        entries[agent] = sum(row["grid"] == grid and row["agent"] == agent for row in progress), values_at
    return entries


def cpu_values(cpu: CPULeaderboard, grid_progress: list[dict]) -> dict[str, tuple[int, dict[int, list[float]]]]:
    """The CPU leaderboard's entries of an online grid every planned seed of which finished (`cpu_entries`): their
    seeds and their seeds' returns by step, by label."""
    entries: dict[str, tuple[int, dict[int, list[float]]]] = {}
    for row in cpu_entries(cpu, grid_progress):
        if row["seeds_done"] == row["seeds_planned"]:
            values_at: dict[int, list[float]] = defaultdict(list)
            for point in cpu.curves:
                if point["family"] == "online" and point["agent"] == row["label"] and point["task"] == row["task"]:
                    values_at[int(point["step"])].append(float(point["eval_return"]))
            entries[row["label"]] = int(row["seeds_planned"]), values_at
    return entries


def side_by_side(learning: list[dict], progress: list[dict], grid: str, cpus: tuple[CPULeaderboard, ...]) \
        -> tuple[int, dict[str, tuple[int, dict[int, list[float]]]]]:
    """The furthest step past the grid's common step at which every seed of some of the GPU's entries and of some
    finished CPU leaderboard entries was evaluated, and those entries (0 and none where there is no such step): an
    entry that got further on the GPU than the grid's others, beside keelrl's other entries at equal steps."""
    gpu = gpu_values(learning, progress, grid)
    cpu = {f"{label} (on a CPU, {leaderboard.page})": entry for leaderboard in cpus
           for label, entry in cpu_values(leaderboard, [row for row in progress if row["grid"] == grid]).items()}
    steps = sorted({step for _, values_at in [*gpu.values(), *cpu.values()] for step in values_at}, reverse=True)
    for step in (step for step in steps if step > common_step(progress, grid)):
        there = [{name: entry for name, entry in side.items() if step in shared_steps(entry[1], entry[0])}
                 for side in (gpu, cpu)]
        if all(there):
            return step, there[0] | there[1]
    return 0, {}


def side_by_side_section(learning: list[dict], progress: list[dict], grid: str,
                         cpus: tuple[CPULeaderboard, ...]) -> list[str]:
    """A table of the entries `side_by_side` finds, at its step and at the last step every seed of each reached."""
    step, entries = side_by_side(learning, progress, grid, cpus)
    if not step:
        return []
    lines = [f"### {grid}: at step {step:,}, the furthest at which entries of the GPU's and of the CPU's stand side "
             "by side", "", "| agent | evaluation return, mean ± std over seeds | seeds | "
             "at the last step every seed reached (step) |", "|---|---|---|---|"]
    for name, (seeds, values_at) in entries.items():
        last = shared_steps(values_at, seeds)[-1]
        lines.append(f"| {name} | {mean_spread(values_at[step])} | {seeds} | "
                     f"{mean_spread(values_at[last])} ({last:,}) |")
    return lines + [""]


def evaluated(learning: list[dict], grid: str, agent: str, step: int, offline: bool) -> list[float]:
    """Each seed's evaluation of a grid entry at `step`: the normalised score offline, the return online."""
    return [float(row["normalized_score" if offline else "mean_return"]) for row in learning
            if row["grid"] == grid and row["agent"] == agent and int(row["step"]) == step]


def learning_summary(learning: list[dict], progress: list[dict], cpus: tuple[CPULeaderboard, ...] = ()) -> list[str]:
    """Per grid: each entry's mean over seeds, highest first, at the step every cell reached and at the budget (the
    entries every seed of which reached it, and those that did not); online, the CPU leaderboards' entries at the
    budget every planned seed of which finished (`cpus`), offline the behaviour policy."""
    lines = []
    for grid in dict.fromkeys(row["grid"] for row in progress):
        cells = [row for row in progress if row["grid"] == grid]
        step, budget = common_step(progress, grid), int(cells[0]["budget"])
        offline = any(row["normalized_score"] for row in learning if row["grid"] == grid)
        at_step, at_budget, short = {}, {}, []  # short: the entries some seed of which did not reach the budget
        for agent in dict.fromkeys(row["agent"] for row in cells):
            if values := evaluated(learning, grid, agent, step, offline):
                at_step[agent] = statistics.mean(values)
            values = evaluated(learning, grid, agent, budget, offline)
            if len(values) < sum(row["agent"] == agent for row in cells):
                short.append(agent)
            else:
                at_budget[agent] = statistics.mean(values)
        lines.append(f"- {grid} ({'normalised score' if offline else 'evaluation return'}, mean over seeds, "
                     "highest first):")
        if step < budget:
            lines.append(f"  - at step {step:,}, the last every cell reached: {ranked(at_step) or 'none'}"
                         if step else "  - no step every cell evaluated")
        reached = [ranked(at_budget)] if at_budget else []
        lines.append(f"  - at the {budget:,}-step budget: "
                     + "; ".join(reached + ([f"not reached by {', '.join(short)}"] if short else [])))
        if offline:
            lines.append(f"  - the behaviour policy (the dataset): {BEHAVIOUR_SCORE}")
            continue
        for cpu in cpus:
            if finished := {row["label"]: float(row["return_mean"]) for row in cpu_entries(cpu, cells)
                            if int(row["budget"]) == budget and row["seeds_done"] == row["seeds_planned"]}:
                lines.append(f"  - keelrl on a CPU ({cpu.page}) at the {budget:,}-step budget: {ranked(finished)}")
        if (far := side_by_side(learning, progress, grid, cpus))[0]:
            lines.append(f"  - at step {far[0]:,}, the furthest at which entries of the GPU's and of the CPU's stand "
                         "side by side: " + ranked({name: statistics.mean(values_at[far[0]])
                                                    for name, (_, values_at) in far[1].items()}))
        lines.append(f"  - published, Hopper-v4 at 100k steps: {ranked(PUBLISHED_HOPPER_100K)}")
    return lines


def ranked(means: dict[str, float]) -> str:
    """'name mean, ...', highest first."""
    return ", ".join(f"{name} {mean:.1f}" for name, mean in sorted(means.items(), key=lambda item: -item[1]))


def cpu_entries(cpu: CPULeaderboard, grid_progress: list[dict]) -> list[dict]:
    """The CPU leaderboard's cells of an online grid's names, tasks and budgets that finished a seed."""
    entries, tasks = {row["agent"] for row in grid_progress}, {row["task"] for row in grid_progress}
    budgets = {int(row["budget"]) for row in grid_progress}
    return [row for row in cpu.cells if row["family"] == "online" and row["label"] in entries
            and row["task"] in tasks and int(row["budget"]) in budgets and int(row["seeds_done"])]


def cpu_lines(cpu: CPULeaderboard, grid_progress: list[dict], step: int) -> list[str]:
    """The CPU leaderboard's entries of an online grid (`cpu_entries`) as rows of the grid's table: their return at
    `step` (the grid's common step, where every seed of the entry was evaluated there) and at the budget."""
    lines = []
    for row in cpu_entries(cpu, grid_progress):
        at_step = [float(point["eval_return"]) for point in cpu.curves if point["family"] == "online"
                   and point["agent"] == row["label"] and point["task"] == row["task"] and int(point["step"]) == step]
        shown = mean_spread(at_step) if len(at_step) == int(row["seeds_done"]) else ""
        lines.append(f"| keelrl on a CPU ({cpu.page}), {row['task']}: {row['label']} | {shown} | {row['seeds_done']} | "
                     f"{int(row['budget']):,} ({int(row['budget']):,}) | | "
                     f"{float(row['return_mean']):.1f} ± {float(row['return_std']):.1f} |")
    return lines


def mean_spread(values: list[float]) -> str:
    """'mean ± std' (ddof 0, as the leaderboard's pages) of `values`; '' for none."""
    return f"{statistics.mean(values):.1f} ± {statistics.pstdev(values):.1f}" if values else ""


def rate(cells: list[dict]) -> str:
    """The mean over an entry's cells of progress.csv's steps_per_s (each seed's steps per second of wall-clock time
    since its first evaluation); 'not recorded' for collects older than that column or cells without two points."""
    rates = [float(row["steps_per_s"]) for row in cells if row.get("steps_per_s")]
    return f"{statistics.mean(rates):.1f}" if rates else "not recorded"


def plot_curves(learning: list[dict], progress: list[dict], path: Path, cpus: tuple[CPULeaderboard, ...] = ()) -> None:
    """One panel per grid: each agent's mean over seeds at every step all its seeds evaluated; online, dashed, the
    CPU leaderboards' finished entries of the grid's names (`cpu_values`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid_names = list(dict.fromkeys(row["grid"] for row in learning))
    figure, axes = plt.subplots(1, max(len(grid_names), 1), figsize=(6 * max(len(grid_names), 1), 4), squeeze=False)
    for axis, grid in zip(axes[0], grid_names):
        offline = any(row["normalized_score"] for row in learning if row["grid"] == grid)
        key = "normalized_score" if offline else "mean_return"
        for (row_grid, agent), rows in seeds_of(learning).items():
            if row_grid == grid:
                by_step: dict[int, list[float]] = defaultdict(list)
                for row in rows:
                    by_step[int(row["step"])].append(float(row[key]))
                seeds = max(len(values) for values in by_step.values())
                steps = shared_steps(by_step, seeds)
                axis.plot(steps, [statistics.mean(by_step[step]) for step in steps], marker="o", label=agent)
        if offline:
            axis.axhline(BEHAVIOUR_SCORE, color="gray", linestyle="--", label="behaviour policy")
        else:
            grid_progress = [row for row in progress if row["grid"] == grid]
            for cpu in cpus:
                for label, (seeds, by_step) in cpu_values(cpu, grid_progress).items():
                    steps = shared_steps(by_step, seeds)
                    axis.plot(steps, [statistics.mean(by_step[step]) for step in steps], linestyle="--",
                              label=f"{label} (on a CPU)")
        axis.set(title=grid, xlabel="gradient updates" if offline else "environment steps",
                 ylabel="normalised score" if offline else "evaluation return")
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
