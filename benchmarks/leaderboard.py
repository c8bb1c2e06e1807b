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
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import difflib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

import gymnasium as gym
import tyro

import keelrl.envs  # noqa: F401  (registers keelrl's safety tasks, so their ids are found)
from keelrl.agents.harness.options import RunOptions, parse_command_line
from keelrl.agents.harness.seeds import SEEDS_FILE
from keelrl.agents.harness.stopping import STOPPED_CODES, signal_name
from keelrl.agents.registry import ALGORITHMS, agent_module
from keelrl.benchmarks.aggregate import (
    CONFIG_FILE,
    DatasetReferences,
    RunResult,
    dataset_references,
    read_run_figures,
)
from keelrl.benchmarks.report import run_machine
from keelrl.buffers.offline import minari_data_dir

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

GRIDS_DIR = Path(__file__).parent / "grids"
FAMILIES = ("online", "offline", "offline-to-online", "safe", "streaming", "rlvr")
CELL_FILE = "cell.json"
LOG_FILE = "log.txt"
MODEL_FILE = "model.pt"
CHECKPOINT_FILE = "checkpoint.pt"
RESERVED_FLAGS = {"seed", "runs-dir", "resume", "quiet"}
ATTEMPT_LINE = re.compile(r"^=== .+: (?:new|resume) run: python ", re.M)
"""the line log.txt gets as each agent process starts (`run_agent_process`)"""


@dataclasses.dataclass(frozen=True)
class AgentEntry:
    name: str
    """the entry's name in tables and directories"""
    module: str
    """keelrl.agents.<module>"""
    options: dict[str, Any]
    task_flag: str
    steps_flag: str
    tasks: tuple[str, ...] | None = None
    """the task ids this entry runs (None: every task of the grid)"""
    steps: int | None = None
    """this entry's budget (None: the task's)"""
    pretrained: str | None = None
    """the entry whose finished cell of the same task and seed this entry's cell fine-tunes (its run directory
    is passed as --pretrained; the cell waits until that one is done)"""


@dataclasses.dataclass(frozen=True)
class TaskEntry:
    id: str
    steps: int
    options: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Grid:
    name: str
    family: str
    seeds: tuple[int, ...]
    tasks: tuple[TaskEntry, ...]
    agents: tuple[AgentEntry, ...]
    options: dict[str, Any]
    description: str = ""


def _flag(name: str) -> str:
    return name.replace("_", "-")


def _did_you_mean(name: str, known: Sequence[str], cutoff: float = 0.6) -> str:
    """' Did you mean 'sac'?' for the names of `known` close to `name` (difflib's ratio at least `cutoff`), else ''."""
    close = difflib.get_close_matches(name, known, n=3, cutoff=cutoff)
    return f" Did you mean {', '.join(map(repr, close))}?" if close else ""


def check_agent_module(where: str, module: str) -> None:
    """Refuse a module that names no agent of keelrl.agents.registry, with the close names and every known one."""
    if module not in ALGORITHMS:
        raise ValueError(f"{where}: keelrl has no agent module {module!r}.{_did_you_mean(module, list(ALGORITHMS))} "
                         f"Its agents: {', '.join(ALGORITHMS)}.")


def _entry(where: str, entry: Any, key: str) -> dict[str, Any]:
    """A [[tasks]] or [[agents]] entry as a table: a string is its `key`; a table must give `key` as a string."""
    table = {key: entry} if isinstance(entry, str) else entry
    if not isinstance(table, dict) or not isinstance(table.get(key), str):
        raise ValueError(f"{where} has no {key}: write it as a table with {key} = \"...\", or as a string.")
    return table


def _check_keys(where: str, table: dict[str, Any], allowed: set[str]) -> None:
    unknown = set(table) - allowed
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(allowed)}.")


def _options(where: str, options: Any) -> dict[str, Any]:
    if not isinstance(options, dict):
        raise ValueError(f"{where}: options must be a table of flag = value, got {options!r}.")
    options = {_flag(name): value for name, value in options.items()}
    reserved = RESERVED_FLAGS & set(options)
    if reserved:
        raise ValueError(f"{where}: {sorted(reserved)} are set by the leaderboard for each cell; remove them.")
    return options


def grid_from_dict(spec: dict[str, Any], default_name: str) -> Grid:
    """Build and check a grid from a parsed TOML table (see the module docstring for its keys)."""
    _check_keys(f"grid {default_name}", spec, {"name", "family", "description", "seeds", "steps", "options",
                                               "task_flag", "steps_flag", "tasks", "agents"})
    name = spec.get("name", default_name)
    family = spec.get("family", "online")
    if family not in FAMILIES:
        raise ValueError(f"grid {name}: family {family!r} is not one of {FAMILIES}.")
    seeds = tuple(spec.get("seeds", (1, 2, 3)))
    if not seeds or not all(isinstance(seed, int) for seed in seeds):
        raise ValueError(f"grid {name}: seeds must be a non-empty list of integers, got {seeds!r}.")
    tasks = tuple(_task(name, number, task, spec.get("steps"))
                  for number, task in enumerate(spec.get("tasks", ()), start=1))
    task_flag, steps_flag = spec.get("task_flag", "env-id"), spec.get("steps_flag", "total-timesteps")
    agents = tuple(_agent(name, number, agent, task_flag, steps_flag)
                   for number, agent in enumerate(spec.get("agents", ()), start=1))
    if not tasks or not agents:
        raise ValueError(f"grid {name}: give at least one task and one agent.")
    task_ids = {task.id for task in tasks}
    for agent in agents:
        if agent.tasks is not None and not set(agent.tasks) <= task_ids:
            raise ValueError(f"grid {name}, agent {agent.name}: tasks {sorted(set(agent.tasks) - task_ids)} are not "
                             f"among the grid's tasks {sorted(task_ids)}.")
    labels = [agent.name for agent in agents]
    if len(set(labels)) != len(labels):
        raise ValueError(f"grid {name}: agent names must differ (got {labels}); give option sets their own name.")
    for agent in agents:
        _check_pretrained(name, agent, {entry.name: entry for entry in agents}, task_ids)
    return Grid(name, family, seeds, tasks, agents, _options(f"grid {name}", spec.get("options", {})),
                spec.get("description", ""))


def _check_pretrained(grid: str, agent: AgentEntry, entries: dict[str, AgentEntry], task_ids: set[str]) -> None:
    """An entry's `pretrained` must name another entry of the grid that starts from nothing and runs its tasks."""
    if agent.pretrained is None:
        return
    source = entries.get(agent.pretrained)
    where = f"grid {grid}, agent {agent.name}: pretrained = {agent.pretrained!r}"
    if source is None or source is agent:
        raise ValueError(f"{where} names no other agent entry of the grid ({sorted(entries)}).")
    if source.pretrained is not None:
        raise ValueError(f"{where} fine-tunes runs of its own ({source.pretrained!r}): start from an entry that does "
                         f"not.")
    missing = set(agent.tasks or task_ids) - set(source.tasks or task_ids)
    if missing:
        raise ValueError(f"{where} does not run the tasks {sorted(missing)}.")


def _task(grid: str, number: int, task: Any, default_steps: int | None) -> TaskEntry:
    task = _entry(f"grid {grid}: task {number} of [[tasks]]", task, "id")
    _check_keys(f"grid {grid}, task", task, {"id", "steps", "options"})
    steps = task.get("steps", default_steps)
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"grid {grid}, task {task.get('id')}: give a positive step budget (steps = ...), "
                         f"got {steps!r}.")
    return TaskEntry(task["id"], steps, _options(f"grid {grid}, task {task['id']}", task.get("options", {})))


def _agent(grid: str, number: int, agent: Any, task_flag: str, steps_flag: str) -> AgentEntry:
    agent = _entry(f"grid {grid}: agent {number} of [[agents]]", agent, "name")
    _check_keys(f"grid {grid}, agent", agent, {"name", "module", "options", "task_flag", "steps_flag", "tasks",
                                               "steps", "pretrained"})
    where = f"grid {grid}, agent {agent['name']}"
    check_agent_module(where, agent.get("module", agent["name"]))
    tasks = tuple(agent["tasks"]) if "tasks" in agent else None
    steps = agent.get("steps")
    if steps is not None and (not isinstance(steps, int) or steps < 1):
        raise ValueError(f"{where}: give a positive step budget (steps = ...), got {steps!r}.")
    options = _options(where, agent.get("options", {}))
    if "pretrained" in agent and "pretrained" in options:
        raise ValueError(f"{where}: the leaderboard sets --pretrained from `pretrained`; remove it from options.")
    return AgentEntry(agent["name"], agent.get("module", agent["name"]), options,
                      _flag(agent.get("task_flag", task_flag)), _flag(agent.get("steps_flag", steps_flag)), tasks,
                      steps, agent.get("pretrained"))


def load_grid(name_or_path: str) -> Grid:
    """A preset name (a file in benchmarks/grids/) or the path of a TOML grid file."""
    path = Path(name_or_path)
    if not path.is_file():
        path = GRIDS_DIR / f"{name_or_path}.toml"
    if not path.is_file():
        presets = sorted(p.stem for p in GRIDS_DIR.glob("*.toml"))
        raise FileNotFoundError(f"--grid {name_or_path}: no such file and no preset of that name; presets: {presets}.")
    try:
        spec = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"{path} is not valid TOML: {err}") from None
    try:
        return grid_from_dict(spec, path.stem)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None


def to_flags(options: dict[str, Any]) -> list[str]:
    """{'eval-freq': 500, 'normalize-obs': True, 'hidden-sizes': [64, 64]} -> tyro command-line flags."""
    flags = []
    for name, value in options.items():
        if isinstance(value, bool):
            flags.append(f"--{name}" if value else f"--no-{name}")
        elif isinstance(value, (list, tuple)):
            flags += [f"--{name}", *map(str, value)]
        else:
            flags += [f"--{name}", str(value)]
    return flags


@dataclasses.dataclass(frozen=True)
class Cell:
    """One run of the grid: an agent entry on a task with a seed, in its own directory."""

    grid: Grid
    agent: AgentEntry
    task: TaskEntry
    seed: int
    cell_dir: Path
    pretrained: Cell | None = None
    """the cell whose finished run this one fine-tunes (the entry's `pretrained`)"""

    @property
    def steps(self) -> int:
        return self.agent.steps or self.task.steps

    @property
    def options(self) -> dict[str, Any]:
        """The agent's options for a new run (flag name -> value), but --seed, --runs-dir and --pretrained: the
        grid's, the task's and the entry's, then the task and the budget."""
        task = {self.agent.task_flag: self.task.id} if self.agent.task_flag else {}
        return {**self.grid.options, **self.task.options, **self.agent.options, **task,
                self.agent.steps_flag: self.steps}

    @property
    def args(self) -> list[str]:
        """The agent's flags for a new run, but --runs-dir and --pretrained (also what cell.json records to spot a
        changed grid)."""
        return ["--seed", str(self.seed), *to_flags(self.options)]

    def waiting(self) -> bool:
        """Whether this cell must wait for the run it fine-tunes (not finished yet)."""
        return self.pretrained is not None and self.state()[0] == "new" and self.pretrained.state()[0] != "done"

    def run_dirs(self) -> list[Path]:
        if not self.cell_dir.is_dir():
            return []
        return sorted(d for d in self.cell_dir.iterdir() if (d / CONFIG_FILE).is_file())

    def state(self) -> tuple[str, Path | None]:
        """('done', run dir) if a run finished, ('resume', run dir) if one has a checkpoint, else ('new', None)."""
        run_dirs = self.run_dirs()
        for run_dir in run_dirs:
            if (run_dir / MODEL_FILE).is_file():
                return "done", run_dir
        resumable = [d for d in run_dirs if (d / CHECKPOINT_FILE).is_file()]
        if resumable:
            return "resume", max(resumable, key=lambda d: (d / CHECKPOINT_FILE).stat().st_mtime)
        return "new", None

    def seed_group(self) -> tuple[Path, ...]:
        """The run directories of the seed group whose run this cell resumes (its seeds.json, first seed first; ()
        for a run of one seed, or nothing to resume)."""
        state, run_dir = self.state()
        if state != "resume" or not (run_dir / SEEDS_FILE).is_file():
            return ()
        named = json.loads((run_dir / SEEDS_FILE).read_text())["runs"]
        return tuple((run_dir / relative).resolve() for relative in named)

    def command(self, track: bool = False, num_seeds: int = 1) -> list[str]:
        """The agent's command line for this cell's next attempt (a new run or --resume); with `track`, logged to
        W&B in a group named after the grid; with `num_seeds`, this cell's seed and the next ones in one process,
        each seed's run in its own cell directory (a resumed seed group resumes every seed)."""
        state, run_dir = self.state()
        module = ["-m", f"keelrl.agents.{self.agent.module}"]
        watch = ["--quiet", *(["--track", "--wandb-group", self.grid.name] if track else [])]
        if state == "resume":
            return [*module, "--resume", str(run_dir.resolve()), *watch]
        pretrained = [] if self.pretrained is None else ["--pretrained", str(self.pretrained.state()[1].resolve())]
        runs_dir = self.cell_dir.resolve() if num_seeds == 1 else self.cell_dir.resolve().parent / "seed{seed}"
        seeds = [] if num_seeds == 1 else ["--num-seeds", str(num_seeds)]
        return [*module, *self.args, *seeds, *pretrained, "--runs-dir", str(runs_dir), *watch]

    def record(self) -> dict[str, Any]:
        path = self.cell_dir / CELL_FILE
        if path.is_file():
            return json.loads(path.read_text())
        return {"agent": self.agent.module, "task": self.task.id, "seed": self.seed, "args": self.args, "attempts": []}

    def check_unchanged(self) -> None:
        """Refuse to mix runs made with other options into this cell."""
        recorded = self.record()["args"]
        if recorded != self.args:
            raise ValueError(
                f"{self.cell_dir} holds a run made with other options ({' '.join(recorded)}); the grid now asks for "
                f"{' '.join(self.args)}. Give another --runs-dir, or delete that directory to re-run it."
            )

    def prepare(self) -> None:
        """Make the cell directory with its record, and drop run directories that never reached a
        checkpoint (nothing to resume)."""
        self.cell_dir.mkdir(parents=True, exist_ok=True)
        if not (self.cell_dir / CELL_FILE).is_file():
            (self.cell_dir / CELL_FILE).write_text(json.dumps(self.record(), indent=2))
        if self.state()[0] == "new":
            for run_dir in self.run_dirs():
                shutil.rmtree(run_dir)

    def start_attempt(self, mode: str, started: dict[str, Any]) -> None:
        """Record an attempt as its process starts, its end unknown (returncode and wall_s None) until `end_attempt`:
        an attempt whose leaderboard is killed stays recorded, as one whose wall time is not measured."""
        record = self.record()
        record["attempts"].append({"mode": mode, **started, "returncode": None, "wall_s": None})
        (self.cell_dir / CELL_FILE).write_text(json.dumps(record, indent=2))

    def end_attempt(self, outcome: dict[str, Any]) -> None:
        """Complete the attempt now running (the last recorded: a cell runs one process at a time) with its outcome."""
        record = self.record()
        record["attempts"][-1].update(outcome)
        (self.cell_dir / CELL_FILE).write_text(json.dumps(record, indent=2))

    def unrecorded_attempts(self) -> int:
        """Attempts at this cell's run missing from cell.json (earlier leaderboards recorded an attempt only when its
        process returned, so one stopped with them is missing): those log.txt shows started beyond the recorded
        ones, or at least 1 where the first recorded attempt resumes a run that no recorded attempt started."""
        attempts = self.record()["attempts"]
        log = self.cell_dir / LOG_FILE
        started = len(ATTEMPT_LINE.findall(log.read_text())) if log.is_file() else 0
        first_resumes = bool(attempts) and attempts[0]["mode"] == "resume"
        return max(started - len(attempts), int(first_resumes))

    def wall_seconds(self) -> float:
        """This cell's run's share of the wall time of the agent processes that made it: each attempt's wall time
        since the last one that started the run afresh, over the seeds its process trained (S for a --batch-seeds
        process or a resumed seed group), so a run's steps/s is its process's steps of all seeds over its wall time. NaN where not measured: no attempt, one
        whose end was not recorded, or attempts not recorded at all (`unrecorded_attempts`)."""
        attempts = self.record()["attempts"]
        if not attempts or self.unrecorded_attempts():
            return float("nan")
        # a new attempt starts the run afresh (`prepare` removed what an attempt before it had left)
        attempts = attempts[max(i for i, a in enumerate(attempts) if a["mode"] == "new"):] \
            if any(a["mode"] == "new" for a in attempts) else attempts
        if any(a["wall_s"] is None for a in attempts):
            return float("nan")
        return float(sum(a["wall_s"] / a.get("seeds_in_process", 1) for a in attempts))

    def result(self, status: str | None = None, references: DatasetReferences | None = None) -> RunResult:
        """This cell's RunResult: its status and, for a run that exists, the figures of its logs (`references`: the
        reference returns an offline-to-online run from scratch is scored with)."""
        state, run_dir = self.state()
        attempts = self.record()["attempts"]
        if status is None:
            # a run stopped by SIGINT/SIGTERM wrote a checkpoint: unfinished (it resumes), not failed; so is one
            # whose end was never recorded (returncode None)
            last_code = attempts[-1]["returncode"] if attempts else None
            failed = last_code not in (None, 0, *STOPPED_CODES)
            status = "done" if state == "done" else "failed" if failed else "unfinished"
        result = RunResult(self.grid.family, self.agent.name, self.agent.module, self.task.id, self.seed,
                           self.steps, status, options=" ".join(self.args),
                           machine=attempts[-1].get("machine", "") if attempts else "")
        if run_dir is not None:
            read_run_figures(result, run_dir, references)
            result.wall_s = self.wall_seconds()
        return result

    def committed_result(self, committed: Sequence[RunResult]) -> RunResult | None:
        """The finished run a committed page holds for this cell, when this machine holds no run of it (else None).
        Refuses a row made for another budget or with other options (rows of tables that did not record the
        options yet are matched by agent entry, task, seed and budget)."""
        if self.run_dirs():
            return None
        key = (self.grid.family, self.agent.name, self.task.id, self.seed)
        row = next((r for r in committed if (r.family, r.label, r.task, r.seed) == key and r.status == "done"), None)
        if row is None:
            return None
        asked = " ".join(self.args)
        if row.budget != self.steps or row.options not in ("", asked):
            raise ValueError(
                f"The committed tables hold {self.agent.name} {self.task.id} seed {self.seed} made with other "
                f"options (budget {row.budget}, {row.options or 'options not recorded'}); the grid now asks for "
                f"budget {self.steps}, {asked}. Run without --from-committed, or give another --name."
            )
        return row


def refuse_mixed_budgets(cells: list[Cell]) -> None:
    """One page row (family, agent entry, task) averages its seeds and pools them into the entry's IQM: the grids
    written to one page must give it one budget."""
    budgets: dict[tuple[str, str, str], dict[int, str]] = {}
    for cell in cells:
        budgets.setdefault((cell.grid.family, cell.agent.name, cell.task.id), {})[cell.steps] = cell.grid.name
    for (_, entry, task), by_budget in budgets.items():
        if len(by_budget) > 1:
            named = ", ".join(f"{steps} ({grid})" for steps, grid in by_budget.items())
            raise ValueError(f"agent entry {entry!r} on {task} has more than one budget in these grids: {named}; "
                             f"one page row averages one budget: write a page per grid, or name the entries apart.")


def expand(grid: Grid, runs_dir: Path) -> list[Cell]:
    """Every cell of the grid, task by task, agent by agent (those that run the task), seed by seed; a fine-tuning
    cell knows the cell it starts from."""
    cells: dict[tuple[str, str, int], Cell] = {}
    for task in grid.tasks:
        for agent in (a for a in grid.agents if a.tasks is None or task.id in a.tasks):
            for seed in grid.seeds:
                cell_dir = runs_dir / grid.name / agent.name / task.id.replace("/", "_") / f"seed{seed}"
                cells[agent.name, task.id, seed] = Cell(grid, agent, task, seed, cell_dir)
    for (name, task_id, seed), cell in cells.items():
        if cell.agent.pretrained is not None:
            source = cells[cell.agent.pretrained, task_id, seed]
            cells[name, task_id, seed] = dataclasses.replace(cell, pretrained=source)
    return list(cells.values())


def agent_fields(module_name: str) -> tuple[set[str] | None, str]:
    """(the option names of an agent's config, '') or (None, why the agent cannot run here)."""
    try:
        module = agent_module(module_name)
    except ModuleNotFoundError as err:
        return None, f"keelrl.agents.{module_name} needs {err.name!r}, which is not installed ({err})"
    except ImportError as err:
        return None, f"keelrl.agents.{module_name} failed to import: {err}"
    configs = [obj for obj in vars(module).values()
               if isinstance(obj, type) and issubclass(obj, RunOptions) and obj.__module__ == module.__name__]
    if len(configs) != 1:
        return set(), ""  # no single config class to check options against: the agent's CLI will check them
    return {_flag(f.name) for f in dataclasses.fields(configs[0])}, ""


def check_agents(cells: list[Cell]) -> dict[str, str]:
    """Which agent modules cannot run here (module -> reason); raises on options an agent does not have."""
    unavailable: dict[str, str] = {}
    checked: dict[str, set[str] | None] = {}
    for cell in cells:
        module = cell.agent.module
        if module not in checked:
            checked[module], reason = agent_fields(module)
            if reason:
                unavailable[module] = reason
        fields = checked[module]
        if fields:
            given = {flag.lstrip("-").removeprefix("no-") for flag in cell.args if flag.startswith("--")}
            unknown = sorted(name for name in given if name not in fields)
            if unknown:
                raise ValueError(f"grid {cell.grid.name}, agent {cell.agent.name}: keelrl.agents.{module} has no "
                                 f"option(s) {['--' + u for u in unknown]} "
                                 f"(see python -m keelrl.agents.{module} --help).")
    return unavailable


def check_tasks(cells: list[Cell], datasets: bool) -> None:
    """Refuse a cell whose --env-id names no gymnasium environment (of the gymnasium backend) or, with `datasets`,
    whose --dataset the offline agents would not find; nothing is made or downloaded."""
    for cell in cells:
        where = f"grid {cell.grid.name}, agent {cell.agent.name}, task {cell.task.id}"
        options = cell.options
        if "env-id" in options and options.get("env-backend", "gymnasium") == "gymnasium":
            check_env_id(where, str(options["env-id"]))
        if "dataset" in options and datasets:
            check_dataset(where, str(options["dataset"]), options.get("data-path"))


def check_env_id(where: str, env_id: str) -> None:
    """Refuse an id gymnasium's registry does not hold (the env is not made), suggesting close ids."""
    try:
        gym.spec(env_id)
    except gym.error.Error:
        raise ValueError(f"{where}: unknown gymnasium environment id {env_id!r}."
                         f"{_did_you_mean(env_id, list(gym.registry))}") from None


def check_dataset(where: str, dataset: str, data_path: str | None) -> None:
    """Refuse a dataset the offline agents would not find: a D4RL-layout file that is not there, or a Minari id or
    directory that is not a dataset (as `load_dataset` looks it up), suggesting close ids of the datasets there."""
    path = Path(dataset)
    if path.suffix in (".hdf5", ".h5", ".npz"):
        if not path.is_file():
            raise FileNotFoundError(f"{where}: no dataset file at {path}.")
        return
    try:
        minari_data_dir(dataset, data_path)
    except FileNotFoundError as err:  # it suggests a close id, else says how to make the dataset
        raise FileNotFoundError(f"{where}: {err}") from None


def run_agent_process(command: list[str], log_path: str, mode: str,
                      running: set[subprocess.Popen] | None = None) -> dict[str, Any]:
    """Run `python <command>` with its output appended to log_path; its exit code, wall time and host. The process
    is in `running` while it runs (a local worker's, which stops it when the leaderboard is stopped).

    The same function runs in a local worker thread and inside a Ray task.
    """
    start_time, start = time.time(), time.perf_counter()
    with open(log_path, "a") as log:
        log.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} on {socket.gethostname()}: {mode} run: "
                  f"python {' '.join(command)}\n")
        log.flush()
        process = subprocess.Popen([sys.executable, *command], stdout=log, stderr=subprocess.STDOUT)
        if running is not None:
            running.add(process)
        try:
            returncode = process.wait()
        finally:
            if process.poll() is None:  # this task was cancelled: let the agent stop as on Ctrl-C
                process.send_signal(signal.SIGINT)
                process.wait()
            if running is not None:
                running.discard(process)
    usable_cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"returncode": returncode, "start_time": start_time, "wall_s": time.perf_counter() - start,
            "host": socket.gethostname(), "usable_cpus": usable_cpus, "worker_pid": os.getpid()}


Job = tuple[Cell, str, list[str]]  # (cell, "new" | "resume", command)


class LocalWorkers:
    """At most `workers` agent processes at once, each watched by a thread of this process."""

    def __init__(self, workers: int):
        self.capacity = workers
        self.running: dict[concurrent.futures.Future, Job] = {}
        self.processes: set[subprocess.Popen] = set()
        """the agent processes running now"""

    def __enter__(self) -> LocalWorkers:
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=self.capacity)
        return self

    def start(self, job: Job) -> None:
        cell, mode, command = job
        self.running[self.pool.submit(run_agent_process, command, str(cell.cell_dir / LOG_FILE), mode,
                                      self.processes)] = job

    def next_finished(self) -> tuple[Job, dict[str, Any]]:
        done, _ = concurrent.futures.wait(self.running, return_when=concurrent.futures.FIRST_COMPLETED)
        future = next(iter(done))
        return self.running.pop(future), future.result()

    def finish(self) -> list[tuple[Job, dict[str, Any]]]:
        """After a Ctrl-C or SIGTERM: every running job with its outcome, once its agent has checkpointed and
        stopped. The agents are sent SIGTERM (a Ctrl-C at a terminal reached them already, and they ignore the
        second signal; a signal sent to the leaderboard's process alone did not)."""
        signalled: set[subprocess.Popen] = set()
        while True:  # (an agent whose process was starting as the stop came is signalled once it is there)
            for process in list(self.processes):
                if process not in signalled and process.poll() is None:
                    process.send_signal(signal.SIGTERM)
                    signalled.add(process)
            done, pending = concurrent.futures.wait(self.running, timeout=0.5)
            if not pending:
                return [(self.running.pop(future), future.result()) for future in done]

    def __exit__(self, *_: Any) -> None:
        self.pool.shutdown(wait=True)  # on Ctrl-C the running agents got it too: wait for their checkpoints


class RayWorkers:
    """Agent processes as Ray tasks of one CPU each (agents use one torch thread); Ray queues what does not fit, so
    every job is started at once."""

    capacity = sys.maxsize

    def __init__(self, address: str, workers: int):
        try:
            import ray
        except ImportError:
            raise ValueError("--ray needs Ray: pip install 'keelrl[ray]' (or pip install ray).") from None
        self.ray, self.address, self.workers = ray, address, workers
        self.running: dict[Any, Job] = {}

    def __enter__(self) -> RayWorkers:
        self.started_here = not self.ray.is_initialized()
        handler = signal.getsignal(signal.SIGTERM)  # ray.init installs its own (sys.exit); the leaderboard's stays
        if self.started_here:
            if self.address == "local":
                self.ray.init(num_cpus=self.workers, include_dashboard=False, log_to_driver=False)
            else:
                try:
                    self.ray.init(address=self.address, log_to_driver=False)
                except ConnectionError as err:
                    raise ValueError(f"--ray {self.address}: no Ray cluster answers there ({str(err).splitlines()[0]}); "
                                     f"start one (ray start --head) or use --ray local.") from None
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, handler)
        self.remote_run = self.ray.remote(num_cpus=1)(run_agent_process)
        return self

    def start(self, job: Job) -> None:
        cell, mode, command = job
        self.running[self.remote_run.remote(command, str(cell.cell_dir.resolve() / LOG_FILE), mode)] = job

    def next_finished(self) -> tuple[Job, dict[str, Any]]:
        (ready,), _ = self.ray.wait(list(self.running), num_returns=1)
        return self.running.pop(ready), self.ray.get(ready)

    def finish(self) -> list[tuple[Job, dict[str, Any]]]:
        """After a Ctrl-C: nothing (leaving cancels the Ray tasks, whose outcomes are lost: their attempts stay
        recorded as started, their wall time not measured)."""
        return []

    def __exit__(self, *_: Any) -> None:
        for task in self.running:
            self.ray.cancel(task)
        if self.started_here:
            self.ray.shutdown()


def check_entries(entries: Sequence[str], cells: list[Cell]) -> None:
    """Refuse an --entries name that no agent entry of the grids has."""
    known = list(dict.fromkeys(cell.agent.name for cell in cells))
    for name in entries:
        if name not in known:
            raise ValueError(f"--entries {name}: the grids have no agent entry of that name.{_did_you_mean(name, known)} "
                             f"Their entries: {', '.join(known)}.")


def ready_first(pending: list[Cell]) -> list[Cell]:
    """The cells that can start now, fine-tuning cells (their runs to start from have finished) before the cells
    that start from nothing, each in grid order: a seed's offline-to-online chain completes as early as it can."""
    return sorted((cell for cell in pending if not cell.waiting()), key=lambda cell: cell.pretrained is None)


def run_grids(
    grids: list[Grid], runs_dir: Path, workers: int = 2, ray_address: str | None = None, dry_run: bool = False,
    log: Callable[[str], None] = print, invocation: str = "", track: bool = False,
    committed: Sequence[RunResult] = (), batch_seeds: bool = False, entries: Sequence[str] = (),
) -> list[RunResult]:
    """Run every unfinished cell of the grids; the RunResult of every cell, in grid order.

    `invocation` (the leaderboard's command line) is recorded with each attempt in cell.json. A cell with no run
    under runs_dir but a finished row in `committed` (a page's tables, see `Cell.committed_result`) is not run:
    its result is that row. With `batch_seeds`, the seeds of an entry's task run as one process where they can
    (`seed_batches`). With `entries`, only the cells of those agent entries run; every cell is still reported.
    """
    if workers < 1:
        raise ValueError(f"--workers must be at least 1, got {workers}.")
    cells = [cell for grid in grids for cell in expand(grid, runs_dir)]
    check_entries(entries, cells)
    unavailable = check_agents(cells)
    for module, reason in unavailable.items():
        log(f"unavailable: agent {module!r} ({reason}); its cells are skipped")
    runnable = [cell for cell in cells if cell.agent.module not in unavailable]
    for cell in runnable:
        cell.check_unchanged()
    taken = {cell.cell_dir: row for cell in runnable if (row := cell.committed_result(committed))}
    unfinished = [cell for cell in runnable if cell.state()[0] != "done" and cell.cell_dir not in taken]
    pending = [cell for cell in unfinished if not entries or cell.agent.name in entries]
    check_tasks(pending, datasets=not dry_run)  # a report may be written where the datasets are not
    done = len(runnable) - len(unfinished) - len(taken)
    resumes = sum(cell.state()[0] == "resume" for cell in pending)
    waiting = sum(cell.waiting() for cell in pending)
    log(f"{len(cells)} cells: {done} finished (skipped), {resumes} to resume, {len(pending) - resumes} to start"
        + (f" ({waiting} once the runs they fine-tune finish)" if waiting else "")
        + f", {len(cells) - len(runnable)} unavailable"
        + (f", {len(unfinished) - len(pending)} of other entries than --entries not run" if entries else "")
        + (f", {len(taken)} taken from the committed tables" if taken else "") + f"; runs under {runs_dir}")
    if dry_run:
        for batch in seed_batches([cell for cell in pending if not cell.waiting()], batch_seeds):
            log(f"{batch[0].state()[0]}: python {' '.join(batch[0].command(track, len(batch)))}")
        for cell in (cell for cell in pending if cell.waiting()):
            log(f"waits for {cell.pretrained.agent.name} {cell.task.id} seed {cell.seed}: {cell.agent.name}")
        return _results(cells, unavailable, taken)
    finished, total = 0, len(pending)
    batch_of: dict[Path, list[Cell]] = {}  # a process's first cell -> every cell it runs

    def on_done(job: Job, outcome: dict[str, Any]) -> None:
        nonlocal finished
        first = job[0]
        for cell in batch_of[first.cell_dir]:
            cell.end_attempt(outcome)
            finished += 1
            status = ("done" if cell.state()[0] == "done"
                      else f"stopped by {signal_name(outcome['returncode'] - 128)} with a checkpoint (the same "
                           f"command resumes it)" if outcome["returncode"] in STOPPED_CODES
                      else f"FAILED (exit {outcome['returncode']}, see {first.cell_dir / LOG_FILE})")
            log(f"[{finished}/{total}] {cell.agent.name} {cell.task.id} seed {cell.seed}: {status}, "
                f"{outcome['wall_s'] / 60:.1f} min")

    def not_done(cells: list[Cell]) -> list[Cell]:
        """The cells less those found done now (another process finished them), each said."""
        nonlocal finished
        still = []
        for cell in cells:
            if cell.state()[0] != "done":
                still.append(cell)
                continue
            finished += 1
            log(f"[{finished}/{total}] {cell.agent.name} {cell.task.id} seed {cell.seed}: found done (another "
                f"process finished it), not started")
        return still

    def start(batch: list[Cell]) -> None:
        """Start the agent process of `batch`, its attempt recorded in each of its cells as it starts."""
        batch_of[batch[0].cell_dir] = batch
        mode = batch[0].state()[0]
        started = {"start_time": time.time(), "leaderboard": invocation, "seeds_in_process": seeds_in_process(batch),
                   "machine": run_machine()}
        for cell in batch:
            cell.prepare()
            cell.start_attempt(mode, started)
        pool.start((batch[0], mode, batch[0].command(track, len(batch))))

    # a process starts whenever a worker is free and a cell can start (its run to fine-tune has finished); each
    # cell's state is read again right before, so a cell another process finished is never started
    pool = RayWorkers(ray_address, workers) if ray_address else LocalWorkers(workers)
    with pool if pending else contextlib.nullcontext():
        try:
            while pending or pool.running:
                pending = not_done(pending)
                for batch in seed_batches(ready_first(pending), batch_seeds)[:pool.capacity - len(pool.running)]:
                    start(batch)
                    pending = [cell for cell in pending if cell not in batch]
                if not pool.running:
                    break
                on_done(*pool.next_finished())
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: stop the agents, record the attempts with their wall time
            for job, outcome in pool.finish():
                on_done(job, outcome)
            raise
    for cell in pending:
        log(f"not run: {cell.agent.name} {cell.task.id} seed {cell.seed}, as {cell.pretrained.agent.name} seed "
            f"{cell.seed} did not finish")
    return _results(cells, unavailable, taken)


def seed_batches(cells: list[Cell], batch_seeds: bool) -> list[list[Cell]]:
    """The cells as processes, in the order of `cells`: the cells whose runs to resume are seeds of one group
    (seeds.json) as one process, with or without `batch_seeds` (`--resume` of any seed's run resumes them all); with
    `batch_seeds`, the new cells of one entry and task whose agent takes --num-seeds (SAC, TD3, PPO and their
    Lagrangian forms) as one process when their seeds follow one another; every other cell alone."""
    batches: dict[tuple[Any, ...], list[Cell]] = {}
    for cell in cells:
        batches.setdefault(_process_key(cell, batch_seeds), []).append(cell)
    processes = []
    for key, batch in batches.items():
        batch.sort(key=lambda cell: cell.seed)
        processes += [[cell] for cell in batch] if key[0] == "new" and not _one_new_group(batch) else [batch]
    return processes


def _process_key(cell: Cell, batch_seeds: bool) -> tuple[Any, ...]:
    """What the cells that run as one process share: their seed group's runs to resume, or (with `batch_seeds`) a
    new run's entry and task; else the cell's own directory."""
    group = cell.seed_group()
    if group:
        return ("resume", group)
    if batch_seeds and cell.state()[0] == "new" and cell.pretrained is None:
        return ("new", cell.grid.name, cell.agent.name, cell.task.id)
    return ("alone", cell.cell_dir)


def _one_new_group(cells: list[Cell]) -> bool:
    """Whether new cells (sorted by seed) can run as one --num-seeds process: several, seeds that follow one
    another, an agent that takes --num-seeds."""
    seeds = [cell.seed for cell in cells]
    fields, _ = agent_fields(cells[0].agent.module)
    return (len(cells) > 1 and fields is not None and "num-seeds" in fields
            and seeds == list(range(seeds[0], seeds[0] + len(seeds))))


def seeds_in_process(batch: list[Cell]) -> int:
    """How many seeds the process of these cells trains: all of the seed group it resumes, else one per cell."""
    return len(batch[0].seed_group()) or len(batch)


def pretraining_references(cells: list[Cell]) -> dict[tuple[str, str], DatasetReferences]:
    """By (grid, environment id): the reference returns of the grid's pre-training dataset in that environment (the
    dataset.json of its first pre-training run), what the grid's runs from scratch there are scored with."""
    sources = {(cell.grid.name, cell.pretrained.agent.name) for cell in cells if cell.pretrained is not None}
    references: dict[tuple[str, str], DatasetReferences] = {}
    for cell in cells:
        if (cell.grid.name, cell.agent.name) in sources:
            for found in filter(None, map(dataset_references, cell.run_dirs())):
                references.setdefault((cell.grid.name, found.env_id), found)
    return references


def _results(cells: list[Cell], unavailable: dict[str, str], taken: dict[Path, RunResult]) -> list[RunResult]:
    references = pretraining_references(cells)
    return [taken.get(cell.cell_dir) or cell.result("unavailable" if cell.agent.module in unavailable else None,
                                                    references.get((cell.grid.name, cell.task.id)))
            for cell in cells]


def runs_provenance(cells: list[Cell], invocation: str) -> list[str]:
    """Header lines saying which leaderboard commands made the runs: how many agent processes (one that trained
    several seeds counted once), on which hosts, with how many usable CPU cores."""
    processes: dict[float, dict[str, Any]] = {}  # a process's attempt is recorded alike in each cell it ran
    for cell in (cell for cell in cells if cell.cell_dir.is_dir()):
        for attempt in cell.record()["attempts"]:
            processes.setdefault(attempt["start_time"], attempt)
    lines = []
    for command in dict.fromkeys(a.get("leaderboard", "") for a in processes.values()):
        made = [a for a in processes.values() if a.get("leaderboard", "") == command]
        lines.append(f"Runs made by: {_processes_text(made)}"
                     + ("" if command == invocation else f", with `{command}`"))
    unrecorded = sum(cell.unrecorded_attempts() for cell in cells if cell.cell_dir.is_dir())
    if unrecorded:
        lines.append(f"Agent processes that cell.json does not record (stopped when leaderboards recorded an attempt "
                     f"only as its process returned): {unrecorded}; their runs' steps/s and wall time are not measured")
    return lines


def _processes_text(attempts: list[dict[str, Any]]) -> str:
    """'3 agent process(es) (1 of them training 3 seeds at once) on vm, each with 1 usable CPU core(s)'."""
    cpus = sorted({a.get("usable_cpus") for a in attempts} - {None})
    hosts = sorted({a["host"] for a in attempts if "host" in a})
    batched = [a["seeds_in_process"] for a in attempts if a.get("seeds_in_process", 1) > 1]
    unended = sum(a["wall_s"] is None for a in attempts)
    notes = ([f"{len(batched)} of them training {' or '.join(map(str, sorted(set(batched))))} seeds at once"]
             if batched else [])
    notes += [f"{unended} of them ended without a record, their runs' wall time not measured"] if unended else []
    return (f"{len(attempts)} agent process(es)" + (f" ({'; '.join(notes)})" if notes else "")
            + (f" on {', '.join(hosts)}" if hosts else "")
            + (f", each with {' or '.join(map(str, cpus))} usable CPU core(s)" if cpus else ""))


def _parse_value(text: str) -> Any:
    """'5000' -> 5000, 'true' -> True, '[64, 64]' -> [64, 64]; anything else stays a string."""
    try:
        return tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        return text


@dataclasses.dataclass
class Args:
    grid: tuple[str, ...] = ()
    """preset names (benchmarks/grids/*.toml) or TOML grid files; several grids make one leaderboard"""
    agents: tuple[str, ...] = ()
    """without --grid: agent modules (keelrl.agents.<name>) of a grid given by flags"""
    tasks: tuple[str, ...] = ()
    """without --grid: task ids (env ids, dataset ids, or RLVR task names with --option task-flag=task)"""
    seeds: tuple[int, ...] = (1, 2, 3)
    """without --grid: seeds of every agent × task"""
    steps: int = 50_000
    """without --grid: step budget of every cell"""
    family: str = "online"
    """without --grid: the table the results go in (online, offline, safe, streaming, rlvr)"""
    option: Annotated[tuple[str, ...], tyro.conf.UseAppendAction] = ()
    """without --grid: an agent flag every cell gets, as NAME=VALUE; repeat it for each flag (e.g. --option
    eval-freq=5000 --option batch-size=128)"""
    name: str | None = None
    """name of the leaderboard and its output files (default: the grid names joined by '+')"""
    workers: int = 2
    """cells run at once on this machine (with --ray local: the CPUs of the local Ray instance)"""
    ray: str | None = None
    """run cells as Ray tasks: 'local' starts Ray here, 'auto' or HOST:PORT joins a cluster (needs keelrl[ray])"""
    runs_dir: str = "runs/leaderboard"
    """parent of the cell directories (on a Ray cluster: a directory every node sees)"""
    out_dir: str = "benchmarks/results/leaderboard"
    """where the Markdown leaderboard, PNG curves and CSVs are written"""
    report_only: bool = False
    """run nothing: write the outputs from the runs already there"""
    from_committed: bool = False
    """neither run nor re-read a cell that this machine holds no run of but the page's committed tables do
    (<out-dir>/<name>_runs.csv and _curves.csv: runs of an earlier session or another machine); its row there is
    its result"""
    dry_run: bool = False
    """run nothing and write nothing: print each cell's state and command"""
    bootstrap_reps: int = 10_000
    """stratified-bootstrap resamples of the IQM confidence interval"""
    note: str = ""
    """a line for the Markdown header (e.g. how the machine was shared)"""
    track: bool = False
    """log every run to Weights & Biases (keelrl[wandb]), each grid in its own group"""
    batch_seeds: bool = False
    """run the seeds of an agent entry's task as one process (--num-seeds: SAC, TD3, PPO and their Lagrangian
    forms), one batched network for all of them, where the seeds follow one another; each seed's run still lands in
    its own cell directory"""
    entries: tuple[str, ...] = ()
    """run only the cells of these agent entries (e.g. sac), in grid order; the page still reports every cell"""


def grids_from_args(args: Args) -> list[Grid]:
    if args.grid:
        if args.agents or args.tasks:
            raise ValueError("Give either --grid or --agents/--tasks, not both.")
        return [load_grid(name) for name in args.grid]
    if not args.agents or not args.tasks:
        raise ValueError("Give a grid: --grid NAME_OR_FILE, or --agents and --tasks (with --seeds, --steps).")
    for module in args.agents:
        check_agent_module(f"--agents {module}", module)
    options = {}
    for option in args.option:
        name, sep, value = option.partition("=")
        if not sep:
            raise ValueError(f"--option {option!r}: write it as NAME=VALUE, e.g. eval-freq=5000.")
        options[name] = _parse_value(value)
    spec = {"family": args.family, "seeds": list(args.seeds), "steps": args.steps, "tasks": list(args.tasks),
            "agents": list(args.agents)}
    for key in ("task_flag", "steps_flag"):
        if _flag(key) in options:
            spec[key] = options.pop(_flag(key))
    spec["options"] = options
    return [grid_from_dict(spec, args.name or "custom")]


REPOSITORY = Path(__file__).resolve().parent.parent
ABSOLUTE_PATH = re.compile(r"(?<![\w/.~])(?:~|/)[\w.\-/~]*")


def shareable_path(path: str, option: str | None = None) -> str:
    """A local path as a committed page may show it: relative to the repository when inside it, else a
    placeholder named after its option (--runs-dir /scratch/x -> RUNS_DIR) or LOCAL_PATH."""
    resolved = Path(path).expanduser().resolve()
    if resolved.is_relative_to(REPOSITORY):
        return str(resolved.relative_to(REPOSITORY)) or "."
    return option.lstrip("-").replace("-", "_").upper() if option else "LOCAL_PATH"


def shareable_arguments(argv: list[str]) -> list[str]:
    """The leaderboard's arguments with every absolute path made shareable (see `shareable_path`)."""
    shared = []
    for i, arg in enumerate(argv):
        option, sep, value = arg.partition("=")
        if sep and option.startswith("--") and value.startswith(("/", "~")):
            shared.append(f"{option}={shareable_path(value, option)}")
        elif arg.startswith(("/", "~")):
            before = argv[i - 1] if i > 0 and argv[i - 1].startswith("--") else None
            shared.append(shareable_path(arg, before))
        else:
            shared.append(shareable_text(arg))  # e.g. the --note's text
    return shared


def shareable_text(text: str) -> str:
    """Free text (the --note) with every absolute path in it made shareable."""
    return ABSOLUTE_PATH.sub(lambda match: shareable_path(match.group(0)), text)


class StopAsInterrupt:
    """SIGTERM (what SLURM, Kubernetes and `timeout` send) handled as Ctrl-C is: the running cells are stopped with
    their checkpoints and the attempts recorded (without it, SIGTERM ended the leaderboard at once and left its
    agent processes running, orphaned). `received`: the signal that came (SIGINT if none, as Python's own
    KeyboardInterrupt)."""

    def __init__(self):
        self.received = signal.SIGINT
        self._stopping = False
        self._previous = signal.signal(signal.SIGTERM, self._interrupt) if (
            threading.current_thread() is threading.main_thread()) else None

    def _interrupt(self, signum: int, frame: Any) -> None:
        if self._stopping:  # a second SIGTERM while the cells stop: ignored, so their attempts are recorded
            return
        self.received, self._stopping = signum, True
        raise KeyboardInterrupt

    def restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


def main(argv: list[str] | None = None) -> int:
    import shlex

    args = parse_command_line(Args, args=argv)
    stop = StopAsInterrupt()
    try:
        grids = grids_from_args(args)
        refuse_mixed_budgets([cell for grid in grids for cell in expand(grid, Path(args.runs_dir))])
        name = args.name or "+".join(grid.name for grid in grids)
        argv = sys.argv[1:] if argv is None else argv
        invocation = f"python -m keelrl.benchmarks.leaderboard {shlex.join(shareable_arguments(argv))}"
        from keelrl.benchmarks.report import committed_provenance, read_runs_tables, write_report

        committed = read_runs_tables(Path(args.out_dir), name) if args.from_committed else []
        results = run_grids(grids, Path(args.runs_dir), args.workers, args.ray, args.dry_run or args.report_only,
                            invocation=invocation, track=args.track, committed=committed,
                            batch_seeds=args.batch_seeds, entries=args.entries)
        if args.dry_run:
            return 0
        engine = f"Ray ({args.ray})" if args.ray else "local processes"
        header = [f"Command: `{invocation}`"]
        header += [] if args.report_only else [f"Execution: {engine}, --workers {args.workers}"]
        header += runs_provenance([cell for grid in grids for cell in expand(grid, Path(args.runs_dir))], invocation)
        header += committed_provenance(results, committed, Path(args.out_dir), name)
        header += [f"Note: {shareable_text(args.note)}"] if args.note else []
        header += [grid.description for grid in grids if grid.description]
        for path in write_report(Path(args.out_dir), name, results, header, args.bootstrap_reps, Path(args.runs_dir)):
            print(f"wrote {path}")
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{signal_name(stop.received)}: stopped; run the same command again to resume the unfinished cells from "
              f"their last checkpoints", file=sys.stderr)
        return 128 + stop.received
    finally:
        stop.restore()
    unfinished = [r for r in results if r.status not in ("done", "unavailable")]
    if unfinished:
        print(f"{len(unfinished)} cell(s) not finished: " + ", ".join(f"{r.label} {r.task} seed {r.seed} ({r.status})"
                                                                      for r in unfinished), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
