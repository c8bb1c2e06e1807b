"""The results page of the GPU run: benchmarks/results/gpu.md and its curves, from the files the run brought back.

    python -m keelrl.benchmarks.gpu.page --results SPEED_RESULTS EVIDENCE_RESULTS --out benchmarks/results/gpu.md \
        [--leases benchmarks/results/gpu_leases.md]

Each --results folder holds what step 1 (benchmarks/gpu/speed.py: environment.json, speed.csv, smoke.csv,
seeds.md) or a collect of step 2 (benchmarks/gpu/evidence.py: learning.csv, progress.csv, machine.json) wrote; a
file in a later folder replaces the same file of an earlier one, but for two kinds of file that merge:
- speed.csv: a short lease may time some settings (speed.py --only) and the next lease of the same machine the
  others; a measured row is kept unless a later folder measured the same setting again. Folders of different
  commits or devices are refused: their figures do not belong in one table.
- learning.csv and progress.csv: per entry of a grid, the folder whose cells of that entry reached the furthest
  evaluation (the later one on ties) gives its rows, and its machine.json the machine the page names beside them
  (a lease may run some entries only, `evidence.py --agents`, and a short lease's may get less far than an earlier
  one's).
seeds.md is named by the machine of its own folder (machine.json or environment.json there). The page opens with
a summary (keelrl's best speed over LeanRL's and CleanRL's, each grid's entries ranked at the step every cell
reached), names the GPU, torch and the commit and what each lease ran (--leases), and gives the speed table, the
smoke runs, the seeds table, and the learning table at the last evaluation step every cell of a grid reached and
at the budget, beside the SimbaV2 repository's published Hopper-v4 figures (REFERENCES.md), keelrl's
own figures at the same budget from the CPU leaderboards (--cpu-cells) and the behaviour policy of the dataset; where
entries of an online grid got further than its others, a second table sets them beside the CPU leaderboards'
entries at the furthest step every seed of both was evaluated at. The curves go into a PNG beside the page, the CPU
leaderboards' dashed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
from collections import defaultdict
from pathlib import Path


from keelrl.agents.harness.options import parse_command_line
from keelrl.benchmarks.aggregate import read_csv_rows

PUBLISHED_HOPPER_100K = {"SimbaV2 (UTD 2)": 2821, "SAC": 1103}
"""Hopper-v4 mean return at 100k steps, 10 seeds: the SimbaV2 repository's results/baseline/*.csv (REFERENCES.md,
"Small-budget online figures"); v4 and their settings (SimbaV2 at UTD 2), not this run's Hopper-v5 (keelrl's
--preset simbav2 runs UTD 1, its repository's MuJoCo configuration)."""
PUBLISHED_NOTE = ("The published rows are the SimbaV2 repository's Hopper-v4 means at 100k steps over ten seeds, "
                  "SimbaV2 at UTD 2; keelrl's entries run Hopper-v5, and its sac-simbav2 (--preset simbav2) runs "
                  "UTD 1.")
LEANRL_OTHER_LEASE = {"sac": 531.1, "td3": 661.7}
"""LeanRL's best (torch.compile + CUDA graphs), steps/s, on the first H200 lease (keelrl at 344a81d): the same script
and speed.py settings on Hopper-v5 (its speed table is benchmarks/results/gpu.md of commit 92b3757; its files were not
kept), where the lease of the committed speed table ran it at 352.5 (SAC) and 635.5 (TD3)"""
LEANRL_README = {"sac": 725, "td3": 936}
"""LeanRL's README (REFERENCES.md, "GPU speed"): torch.compile + CUDA graphs on one H100 with HalfCheetah-v4, env
steps/s"""
MADE_BY = "This page was made by `"
"""how the page's line naming its command begins"""
BEHAVIOUR_SCORE = 34.3
"""keelrl/hopper-medium-v0's behaviour policy, normalised (benchmarks/results/offline.md)"""
COMMANDS = (
    "bash benchmarks/gpu/prepare.sh CLEANRL_CHECKOUT LEANRL_CHECKOUT      # on the CPU machine",
    "source .gpu/prefix.sh && { python -m keelrl.benchmarks.gpu.speed --out $OUT; "
    "python -m keelrl.benchmarks.gpu.evidence start; }",
    "source .gpu/prefix.sh && python -m keelrl.benchmarks.gpu.evidence collect --out $OUT --wait-minutes W",
)


@dataclasses.dataclass
class Args:
    results: tuple[Path, ...]
    """folders the GPU run brought back, earliest first"""
    out: Path = Path("benchmarks/results/gpu.md")
    """the page; its curves go beside it as <name>_curves.png"""
    leases: Path | None = None
    """a Markdown file that says what each lease ran and how it differed from the commands (e.g. --only, a shorter
    deadline), put under the commands as it is (benchmarks/results/gpu_leases.md)"""
    cpu_cells: tuple[Path, ...] = (Path("benchmarks/results/leaderboard/cpu-evidence_cells.csv"),
                                   Path("benchmarks/results/leaderboard/cpu-evidence-simba_cells.csv"))
    """CPU leaderboards' tables of cells (<name>_cells.csv, their curves beside them): their entries of an online
    grid's names, task and budget stand beside the GPU's at the grid's common step and at the budget (the same agent
    and settings on another machine); a missing file adds none"""


def read_files(folders: tuple[Path, ...]) -> dict[str, Path]:
    """Every result file by name, the latest folder's where several have it."""
    return {path.name: path for folder in folders for path in sorted(folder.iterdir()) if path.is_file()}


def same_run(folders: tuple[Path, ...]) -> dict:
    """The one environment.json the folders share in device and commit; SystemExit naming the first that differs."""
    environments = [(folder, json.loads((folder / "environment.json").read_text())) for folder in folders
                    if (folder / "environment.json").is_file()]
    if not environments:
        raise SystemExit("no environment.json in any --results folder (speed.py writes it)")
    first_folder, first = environments[0]
    for folder, environment in environments[1:]:
        for key in ("device", "commit"):
            if environment[key] != first[key]:
                raise SystemExit(f"{folder} is of {key} {environment[key]!r}, {first_folder} of {first[key]!r}: "
                                 "make one page per device and commit")
    return environments[-1][1]


def merged_speed_rows(folders: tuple[Path, ...]) -> list[dict]:
    """speed.csv rows of every folder, one per (algo, implementation, setting) in first-seen order: the latest
    measured row, else the latest row."""
    merged: dict[tuple[str, str, str], dict] = {}
    for folder in folders:
        for row in read_csv(folder / "speed.csv"):
            key = row["algo"], row["implementation"], row["setting"]
            if row["steps_per_s"] or not merged.get(key, {}).get("steps_per_s"):
                merged[key] = row
    return list(merged.values())


def read_csv(path: Path | None) -> list[dict]:
    """The rows of a result file ([] when the run brought none back)."""
    return read_csv_rows(path) if path is not None and path.is_file() else []


def speed_section(rows: list[dict]) -> list[str]:
    """The speed table: each measured row over CleanRL's and over LeanRL's best."""
    lines = ["| agent | implementation | setting | env-steps/s | / CleanRL | / LeanRL's best | note |",
             "|---|---|---|---|---|---|---|"]
    for algo in dict.fromkeys(row["algo"] for row in rows):
        mine = [row for row in rows if row["algo"] == algo]
        rate, best = best_rates(mine)
        for row in mine:
            value = rate.get(id(row))
            ratios = [f"{value / base:.2f}×" if value and base else "" for base in (best["cleanrl"], best["leanrl"])]
            shown = f"{value:.1f}" if value else "not measured"
            lines.append(f"| {algo.upper()} | {row['implementation']} | {row['setting']} | {shown} | "
                         f"{' | '.join(ratios)} | {row['note']} |")
    return lines


def best_rates(rows: list[dict]) -> tuple[dict[int, float], dict[str, float | None]]:
    """One agent's speed rows: the steps/s of each measured row (by id) and each implementation's best."""
    rate = {id(row): float(row["steps_per_s"]) for row in rows if row["steps_per_s"]}
    best = {name: max((value for row in rows if row["implementation"] == name and (value := rate.get(id(row)))),
                      default=None) for name in ("cleanrl", "leanrl", "keelrl")}
    return rate, best


def speed_headline(rows: list[dict], timed_steps: int | None = None) -> list[str]:
    """Per agent: keelrl's best setting over LeanRL's best and over CleanRL's; with `timed_steps`, under it how far
    that goes: one run per setting, and LeanRL's best as another lease measured it and as its README reports it."""
    headline = []
    for algo in dict.fromkeys(row["algo"] for row in rows):
        mine = [row for row in rows if row["algo"] == algo]
        rate, best = best_rates(mine)
        if best["keelrl"]:
            setting = next(row["setting"] for row in mine
                           if row["implementation"] == "keelrl" and rate.get(id(row)) == best["keelrl"])
            versus = [f"{best['keelrl'] / best[name]:.2f}× {said}"
                      for name, said in (("leanrl", "LeanRL's best"), ("cleanrl", "CleanRL")) if best[name]]
            headline.append(f"- {algo.upper()}: keelrl's best ({setting}, {best['keelrl']:.1f} steps/s) is "
                            + (", ".join(versus) if versus else "not compared (no reference measured)") + ".")
            if timed_steps is not None and algo in LEANRL_OTHER_LEASE:
                headline.append(
                    f"  - one run of each setting ({timed_steps:,} timed steps). LeanRL's best ran at "
                    f"{LEANRL_OTHER_LEASE[algo]} steps/s on another H200 lease (keelrl at 344a81d), keelrl's best "
                    f"{best['keelrl'] / LEANRL_OTHER_LEASE[algo]:.2f}× that; LeanRL's README reports "
                    f"{LEANRL_README[algo]} on an H100 with HalfCheetah-v4.")
    return headline


def smoke_section(rows: list[dict]) -> list[str]:
    lines = ["| agent | exit code | loop steps | host synchronisations | per step | most at | error |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['agent']} | {row['returncode']} | {row['steps']} | {row['syncs']} | "
                     f"{row['syncs_per_step']} | {row['top_locations']} | {row['error']} |")
    return lines


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
        for row in read_csv(folder / "progress.csv"):
            evaluated[row["grid"], row["agent"]].append(int(row["last_evaluation"]))
        for entry, steps in evaluated.items():
            if min(steps) >= chosen.get(entry, (-1, None))[0]:  # as far or further: the later folder's
                chosen[entry] = min(steps), folder

    def rows(name: str) -> list[dict]:
        return [row for entry, (_, folder) in chosen.items() for row in read_csv(folder / name)
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
                          cells=read_csv(cells_file), curves=read_csv(cells_file.with_name(f"{name}_curves.csv")))


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


def described(machine: dict) -> str:
    return f"{machine['device']} ({machine['cpus']} CPU cores), torch {machine['torch']}, keelrl at commit " \
           f"{machine['commit']}{shared_through(machine.get('mps'))}{with_precision(machine.get('precision'))}"


def with_precision(precision: str | None) -> str:
    """The online cells' --precision, where evidence.py was given one other than fp32 (machine.json's 'precision')."""
    if precision is None:
        return ""
    return ", float32 matrix products on TF32 tensor cores (--precision tf32)" if precision == "tf32" else \
        f", --precision {precision}"


def shared_through(mps: str | None) -> str:
    """How the cells shared the GPU where evidence.py's --mps was asked for (machine.json's 'mps'): nothing where it
    was not, as on the leases before it."""
    if mps is None:
        return ""
    return ", the cells' processes sharing the GPU through CUDA MPS" if mps == "on" else \
        f", the cells' processes taking turns on the GPU (MPS was asked for but is {mps})"


def learning_machines(machines: dict[tuple[str, str], dict | None]) -> list[str]:
    """Where each grid entry's cells ran (evidence.py's machine.json): leases other than the speed step's may run
    them, and the entries of one grid may come from different leases."""
    if len({json.dumps(machine, sort_keys=True) for machine in machines.values()}) == 1:
        machine = next(iter(machines.values()))
        return [f"The learning cells ran on {described(machine)}." if machine else
                "Machine and commit of the learning cells: not recorded.", ""]
    lines = []
    for grid in dict.fromkeys(grid for grid, _ in machines):
        agents_on: dict[str, list[str]] = defaultdict(list)  # machine.json as text -> the grid's entries run there
        for (entry_grid, agent), machine in machines.items():
            if entry_grid == grid:
                agents_on[json.dumps(machine, sort_keys=True)].append(agent)
        for said, agents in agents_on.items():
            whose = grid if len(agents_on) == 1 else f"{grid} ({', '.join(agents)})"
            machine = json.loads(said)
            lines.append(f"The cells of {whose} ran on {described(machine)}." if machine else
                         f"Machine and commit of the cells of {whose}: not recorded.")
    return lines + [""]


def seeds_machine(seeds_file: Path) -> list[str]:
    """The machine of seeds.md's own folder, where it names one."""
    for name in ("machine.json", "environment.json"):
        if (seeds_file.parent / name).is_file():
            return [f"Measured on {described(json.loads((seeds_file.parent / name).read_text()))}.", ""]
    return []


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


def command_of(args: Args) -> str:
    """The command that makes the page again, its paths as a committed page shows them (relative to the repository,
    or a placeholder)."""
    from keelrl.benchmarks.leaderboard import shareable_path

    words = ["python", "-m", "keelrl.benchmarks.gpu.page", "--results",
             *[shareable_path(str(folder), "--results") for folder in args.results],
             "--out", shareable_path(str(args.out), "--out")]
    words += ["--leases", shareable_path(str(args.leases), "--leases")] if args.leases else []
    if args.cpu_cells != Args.cpu_cells:
        words += ["--cpu-cells", *[shareable_path(str(cells), "--cpu-cells") for cells in args.cpu_cells]]
    return " ".join(words)


def write_page(args: Args) -> Path:
    files = read_files(args.results)
    environment = same_run(args.results)
    evidence = merged_learning(args.results)
    curves = args.out.with_name(f"{args.out.stem}_curves.png")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    trial = ["", "**A trial with --tiny: a check of the scripts, not evidence.**"] if environment["tiny"] else []
    speed_rows = merged_speed_rows(args.results)
    cpus = tuple(cpu_leaderboard(cells, args.out) for cells in args.cpu_cells)
    lines = ["# keelrl on a GPU: speed beside LeanRL and CleanRL, and learning on Hopper", *trial, "",
             f"{MADE_BY}{command_of(args)}` (benchmarks/gpu/page.py) from the files the leases brought back and "
             "the CPU leaderboards' tables, all committed; the part of \"How it was run\" that tells each lease is "
             "the leases file, written by hand. Every mean ± std is over seeds, the std with ddof 0 (the "
             "leaderboard's convention).", "",
             "## Summary", "", *speed_headline(speed_rows, environment["timed_steps"]),
             *learning_summary(evidence.learning, evidence.progress, cpus), "",
             *([PUBLISHED_NOTE, ""] if any(not row["normalized_score"] for row in evidence.learning) else []),
             "## How it was run", "",
             f"The speed step's machine: {environment['device']}, {environment['cpus']} CPU cores; torch "
             f"{environment['torch']} (CUDA {environment['cuda'] or 'none'}), Python {environment['python']}; "
             f"keelrl at commit {environment['commit']}. The commands (benchmarks/gpu/README.md):", "",
             *[f"    {command}" for command in COMMANDS], "",
             *([args.leases.read_text().strip(), ""] if args.leases else []),
             "## Speed: SAC and TD3 on " + environment["env_id"], "",
             f"One run at a time on the quiet GPU: {environment['learning_starts']:,} random steps, then one update "
             f"per step; the rate over the last {environment['timed_steps']:,} steps after {environment['burn_in']:,}"
             " burn-in update steps (compilation, CUDA-graph capture). Batch 256, 256-256 networks, one torch "
             "thread, seed 1 (benchmarks/gpu/speed.py). CleanRL's and LeanRL's scripts run as published on "
             "gymnasium 1.x through benchmarks/gpu/reference.py, but one line of LeanRL's SAC: its policy module "
             "keeps the action of get_action alone (tensordict 0.12 refuses the two outputs it leaves unnamed; "
             "benchmarks/gpu/prepare.sh).", "",
             *speed_section(speed_rows), "",
             f"## Every agent on the device ({environment['smoke_steps']} loop steps)", "",
             "Host synchronisations counted with CUDA's sync debug mode (benchmarks/gpu/syncs.py): one per "
             "environment step is the action going to the environment.", "",
             *smoke_section(read_csv(files.get("smoke.csv"))), "",
             "## Several seeds in one process (--num-seeds)", "",
             *(seeds_machine(files["seeds.md"]) + [files["seeds.md"].read_text().strip()] if "seeds.md" in files
               else ["not measured"]), "",
             "## Learning", ""]
    if evidence.learning:
        plot_curves(evidence.learning, evidence.progress, curves, cpus)
        lines += [*learning_machines(evidence.machines),
                  *learning_section(evidence.learning, evidence.progress, cpus),
                  f"![curves]({curves.name})"]
    else:
        lines.append("not measured")
    args.out.write_text("\n".join(lines) + "\n")
    return args.out


if __name__ == "__main__":
    print(f"wrote {write_page(parse_command_line(Args))}")
