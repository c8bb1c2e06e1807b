"""What a page says of how its runs were made (`runs_provenance`), and local paths made shareable: a committed
page never shows an absolute path of the machine it ran on (`shareable_*`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from keelrl.benchmarks.leaderboard.cells import Cell


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



REPOSITORY = Path(__file__).resolve().parent.parent.parent
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

