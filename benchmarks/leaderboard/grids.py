"""Grids: agent entries × tasks × seeds, read from TOML grid files (benchmarks/grids/) or built from flags, and
checked before anything runs (see the package docstring for a grid file's keys)."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from keelrl.agents.registry import ALGORITHMS

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

GRIDS_DIR = Path(__file__).resolve().parent.parent / "grids"
FAMILIES = ("online", "offline", "offline-to-online", "safe", "streaming", "rlvr")
RESERVED_FLAGS = {"seed", "runs-dir", "resume", "quiet"}


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
    findings: str = ""
    """a page written by hand beside the grid's page (a file name in its --out-dir): what was checked where an
    entry misses its published figure; the grid's page links it when it is there"""


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
    _check_keys(f"grid {default_name}", spec, {"name", "family", "description", "findings", "seeds", "steps",
                                               "options", "task_flag", "steps_flag", "tasks", "agents"})
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
    findings = spec.get("findings", "")
    if not isinstance(findings, str) or Path(findings).name != findings:
        raise ValueError(f"grid {name}: findings must be a file name in the page's folder (--out-dir), got "
                         f"{findings!r}.")
    return Grid(name, family, seeds, tasks, agents, _options(f"grid {name}", spec.get("options", {})),
                spec.get("description", ""), findings)


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

