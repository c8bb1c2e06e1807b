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
from collections import defaultdict
from pathlib import Path

from keelrl.agents.harness.options import parse_command_line
from keelrl.benchmarks.aggregate import read_csv_rows
from keelrl.benchmarks.gpu.page_learning import (PUBLISHED_NOTE, cpu_leaderboard, learning_section, learning_summary,
                                                 merged_learning, plot_curves)
from keelrl.benchmarks.gpu.page_speed import (merged_speed_rows, smoke_section, speed_headline, speed_section,
                                              turns_headline, turns_section)

MADE_BY = "This page was made by `"
"""how the page's line naming its command begins"""
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
    turns: Path | None = None
    """a folder of a lease of its own that timed settings in turns (speed.py --repeats, e.g. on LeanRL's own setting,
    HalfCheetah-v4), with its CUDA tests (cuda_tests.txt) and seeds table (seeds.md): a section of its own, named by
    its environment.json (its commit may differ from the --results folders')"""
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


def command_of(args: Args) -> str:
    """The command that makes the page again, its paths as a committed page shows them (relative to the repository,
    or a placeholder)."""
    from keelrl.benchmarks.leaderboard import shareable_path

    words = ["python", "-m", "keelrl.benchmarks.gpu.page", "--results",
             *[shareable_path(str(folder), "--results") for folder in args.results],
             "--out", shareable_path(str(args.out), "--out")]
    words += ["--leases", shareable_path(str(args.leases), "--leases")] if args.leases else []
    words += ["--turns", shareable_path(str(args.turns), "--turns")] if args.turns else []
    if args.cpu_cells != Args.cpu_cells:
        words += ["--cpu-cells", *[shareable_path(str(cells), "--cpu-cells") for cells in args.cpu_cells]]
    return " ".join(words)


def turns_part(folder: Path) -> list[str]:
    """The section of a lease that timed settings in turns: its table, its CUDA tests' last line, its seeds table."""
    environment = json.loads((folder / "environment.json").read_text())
    tests = (folder / "cuda_tests.txt").read_text().strip().splitlines()[-1:] if (folder / "cuda_tests.txt").is_file() \
        else ["not run"]
    seeds = [(folder / "seeds.md").read_text().strip()] if (folder / "seeds.md").is_file() else ["not measured"]
    return [f"## Speed beside LeanRL on its own setting: {environment['env_id']}, settings in turns", "",
            *turns_section(folder), "", f"The CUDA tests of that lease (cuda_tests.txt): {tests[0]}", "",
            "Several seeds in one process on that lease (benchmarks/perf/seeds_speed.py):", "", *seeds, ""]


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
             "## Summary", "", *(turns_headline(args.turns) if args.turns else []),
             *speed_headline(speed_rows, environment["timed_steps"]),
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
             *(turns_part(args.turns) if args.turns else []),
             f"## Every agent on the device ({environment['smoke_steps']} loop steps)", "",
             "Host synchronisations counted with CUDA's sync debug mode (benchmarks/gpu/syncs.py): one per "
             "environment step is the action going to the environment.", "",
             *smoke_section(read_csv_rows(files["smoke.csv"]) if "smoke.csv" in files else []), "",
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
