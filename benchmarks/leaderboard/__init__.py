"""Benchmark leaderboard: run agent × task × seed grids, then publish tables, curves and CSVs.

    python -m keelrl.benchmarks.leaderboard --grid online-small                 # a preset (benchmarks/grids/)
    python -m keelrl.benchmarks.leaderboard --grid my_grid.toml --workers 4     # your own grid file
    python -m keelrl.benchmarks.leaderboard --agents sac td3 --tasks Hopper-v5 --seeds 1 2 3 --steps 50000
    python -m keelrl.benchmarks.leaderboard --grid online-full --ray auto       # on a Ray cluster

Each cell (one agent entry, one task, one seed) runs as its own process,
`python -m keelrl.agents.<module> --env-id TASK --seed SEED --total-timesteps STEPS --runs-dir CELL_DIR`,
at most `--workers` at once on this machine, or as Ray tasks with `--ray ADDRESS` (`local` starts a
Ray instance here with `--workers` CPUs). Every cell has its own directory,
RUNS_DIR/<grid>/<agent entry>/<task>/seed<seed>/, holding the agent's run directory, `log.txt`
(the agent's output, every attempt) and `cell.json` (its options and the timed attempts). Running
the same command again skips finished cells (model.pt written), resumes interrupted ones from their
last checkpoint with the agent's `--resume` (the cells of one seed group, made by one `--batch-seeds`
process, with one process: `--resume` of any seed resumes them all), and starts the rest: a grid killed
halfway loses only the steps since each run's last checkpoint (`--checkpoint-freq`). cell.json records
each attempt as its process starts and again, with its wall time, as it ends. Where the run directories are not
at hand (another machine, an earlier session), `--from-committed` takes the cells that the page's
committed tables (<out-dir>/<name>_runs.csv and _curves.csv) hold as finished from those tables, and
runs only the rest.

Agents are found by module name: a grid may name any agent of keelrl.agents.registry, and a name it does not
hold is refused; an agent whose optional dependency is not installed here is reported as unavailable and its cells
are skipped. Before any cell directory is made, the gymnasium environment ids (--env-id) and the offline datasets
(--dataset, looked up as the offline agents look them up) of the cells to run are checked.
With Ray on several machines, RUNS_DIR must be a directory every node sees (a shared filesystem).

Grid files (TOML) — see benchmarks/grids/online-small.toml:

    name = "online-small"            # default: the file name
    family = "online"                # online | offline | safe | streaming | rlvr (one table each)
    findings = "my-grid-findings.md" # a page written by hand beside the grid's page, linked from it when there
    seeds = [1, 2, 3]
    steps = 20000                    # budget of every task unless the task sets its own
    options = { eval-freq = 2500 }   # flags every cell gets
    task_flag = "env-id"             # flag that names the task (rlvr: "task")
    steps_flag = "total-timesteps"   # flag that sets the budget (rlvr: "iterations")
    [[tasks]]
    id = "Hopper-v5"
    options = { learning-starts = 5000 }
    [[agents]]
    name = "sac-simba"               # the entry's name in the tables
    module = "sac"                   # keelrl.agents.<module> (default: name)
    options = { preset = "simba" }   # flags of this entry (agent options win over task options)
    tasks = ["Hopper-v5"]            # only these of the grid's tasks (default: all)
    steps = 100000                   # this entry's budget (default: the task's)

An entry may start from another entry's finished runs (offline-to-online fine-tuning, see
benchmarks/grids/cpu-evidence-wsrl.toml): `pretrained = "cql-wsrl"` gives each of its cells the run directory of
that entry's cell with the same task and seed as --pretrained, and runs it once that cell is done: a cell starts
whenever a worker is free, cells whose runs to start from have finished before cells that start from nothing, so
each seed's chain ends as early as it can; `task_flag = ""` passes no task flag (the run it starts from names the
task).

The package, one module per job (each imports only those above it):

    grids.py       Grid, AgentEntry, TaskEntry: grid files (GRIDS_DIR) and their checks, `to_flags`
    cells.py       Cell and its state on disk (cell.json, log.txt, the run directory), `expand`
    checks.py      pre-flight checks: agents and their options, environment ids, datasets, --entries, budgets
    workers.py     LocalWorkers and RayWorkers around `run_agent_process`
    schedule.py    `run_grids`: which cells start when, seed batching (`seed_batches`), `ready_first`, results
    provenance.py  `runs_provenance` (how the runs were made) and `shareable_*` (no absolute path on a page)
    cli.py         `Args`, `main`, `StopAsInterrupt`; __main__.py runs `main`
"""

from keelrl.agents.harness.checkpoints import CHECKPOINT_FILE, MODEL_FILE
from keelrl.agents.harness.run_directory import CONFIG_FILE
from keelrl.benchmarks.leaderboard.cells import ATTEMPT_LINE, CELL_FILE, LOG_FILE, Cell, expand
from keelrl.benchmarks.leaderboard.checks import (
    agent_fields,
    check_agents,
    check_dataset,
    check_entries,
    check_env_id,
    check_tasks,
    refuse_mixed_budgets,
)
from keelrl.benchmarks.leaderboard.cli import Args, StopAsInterrupt, grids_from_args, main
from keelrl.benchmarks.leaderboard.grids import (
    FAMILIES,
    GRIDS_DIR,
    RESERVED_FLAGS,
    AgentEntry,
    Grid,
    TaskEntry,
    check_agent_module,
    grid_from_dict,
    load_grid,
    to_flags,
)
from keelrl.benchmarks.leaderboard.provenance import (
    ABSOLUTE_PATH,
    REPOSITORY,
    runs_provenance,
    shareable_arguments,
    shareable_path,
    shareable_text,
)
from keelrl.benchmarks.leaderboard.schedule import (
    pretraining_references,
    ready_first,
    run_grids,
    seed_batches,
    seeds_in_process,
)
from keelrl.benchmarks.leaderboard.workers import Job, LocalWorkers, RayWorkers, run_agent_process

__all__ = [
    "ABSOLUTE_PATH", "ATTEMPT_LINE", "CELL_FILE", "CHECKPOINT_FILE", "CONFIG_FILE", "FAMILIES", "GRIDS_DIR", "LOG_FILE",
    "MODEL_FILE", "REPOSITORY", "RESERVED_FLAGS", "AgentEntry", "Args", "Cell", "Grid", "Job", "LocalWorkers",
    "RayWorkers", "StopAsInterrupt", "TaskEntry", "agent_fields", "check_agent_module", "check_agents",
    "check_dataset", "check_entries", "check_env_id", "check_tasks", "expand", "grid_from_dict", "grids_from_args",
    "load_grid", "main", "pretraining_references", "ready_first", "refuse_mixed_budgets", "run_agent_process",
    "run_grids", "runs_provenance", "seed_batches", "seeds_in_process", "shareable_arguments", "shareable_path",
    "shareable_text", "to_flags",
]
