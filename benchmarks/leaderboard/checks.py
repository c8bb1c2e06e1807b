"""Pre-flight checks, before any cell directory is made: the agents (installed here, with the options the grid
gives them), the gymnasium environment ids, the offline datasets, the --entries names."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import gymnasium as gym

import keelrl.envs  # noqa: F401  (registers keelrl's safety tasks, so their ids are found)
from keelrl.agents.harness.options import RunOptions
from keelrl.agents.registry import agent_module
from keelrl.benchmarks.leaderboard.cells import Cell
from keelrl.benchmarks.leaderboard.grids import _did_you_mean, _flag
from keelrl.buffers.offline import minari_data_dir


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



def check_entries(entries: Sequence[str], cells: list[Cell]) -> None:
    """Refuse an --entries name that no agent entry of the grids has."""
    known = list(dict.fromkeys(cell.agent.name for cell in cells))
    for name in entries:
        if name not in known:
            raise ValueError(f"--entries {name}: the grids have no agent entry of that name.{_did_you_mean(name, known)} "
                             f"Their entries: {', '.join(known)}.")

