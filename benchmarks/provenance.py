"""Provenance lines of a leaderboard page: what the runs ran on (`run_machine`, recorded in cell.json with each
attempt; `runs_made_on`), the machine, software and keelrl commit that wrote the page (`machine_description`), and
the runs taken from the committed tables (`committed_provenance`)."""

from __future__ import annotations

import os
import platform
import re
import subprocess
from pathlib import Path

from keelrl.benchmarks.aggregate import RunResult

REPO_ROOT = Path(__file__).resolve().parent.parent
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
"""the CPU flags under which bf16 products run natively (else torch emulates them)"""


def cpu_name() -> str:
    """The CPU's model name with the native bf16 flags it has: 'AMD EPYC (avx512_bf16)'."""
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    name = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")),
                platform.processor())
    flags = set(next((line.split(":", 1)[1].split() for line in cpuinfo if line.startswith("flags")), []))
    native = [flag for flag in BF16_FLAGS if flag in flags]
    return f"{name} ({', '.join(native) if native else 'no native bf16'})"


def software_versions() -> str:
    import gymnasium
    import mujoco
    import torch

    return (f"Python {platform.python_version()}, torch {torch.__version__}, gymnasium {gymnasium.__version__}, "
            f"mujoco {mujoco.__version__}")


def commit_text() -> str:
    """The short commit of the keelrl checkout this code runs from, marked when changed ('' outside git)."""
    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return ""
    return commit + (" (with uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no") else "")


def run_machine() -> str:
    """What an agent process of the leaderboard runs on, as cell.json records it with each attempt."""
    return f"{cpu_name()}; {software_versions()}; keelrl {commit_text() or 'commit unknown'}"


def machine_description() -> list[str]:
    """What wrote the page: CPU, cores this process may use, library versions, keelrl commit."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    lines = [f"Machine: {cpu_name()}, {os.cpu_count()} CPU cores ({usable} usable by the process that wrote this "
             f"page), {platform.system()} {platform.release()}",
             f"Software: {software_versions()}"]
    commit, _, changed = commit_text().partition(" ")
    return lines + ([f"keelrl commit: `{commit}`" + (f" {changed}" if changed else "")] if commit else [])


def git(*args: str) -> str:
    """The output of `git ARGS` in the keelrl checkout ('' outside git, or where git fails)."""
    try:
        return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def committed_provenance(results: list[RunResult], committed: list[RunResult], out_dir: Path, name: str) -> list[str]:
    """A header line naming the results taken from the committed tables, with the commit that last wrote them."""
    taken = [r for r in results if any(r is row for row in committed)]
    if not taken:
        return []
    seeds: dict[str, list[str]] = {}
    for r in taken:
        seeds.setdefault(f"{r.label} {r.task}", []).append(str(r.seed))
    commit = git("log", "-1", "--format=%h", "--", str((out_dir / f"{name}_runs.csv").resolve()))
    where = f"as committed in `{commit}`, whose page says how they were made" if commit else "never committed"
    return [f"Runs taken from the tables {name}_runs.csv and {name}_curves.csv ({where}): {len(taken)} — "
            + "; ".join(f"{cell} seed {', '.join(numbers)}" for cell, numbers in seeds.items())]


PRECISION = re.compile(r"--precision (\S+)")


def runs_made_on(results: list[RunResult]) -> list[str]:
    """Header lines: each agent entry's precision (its --precision, else fp32), and what the runs with a figure ran
    on (CPU, software, keelrl commit) with the entries and tasks made there."""
    precisions = {r.label: (m.group(1) if (m := PRECISION.search(r.options)) else "fp32") for r in results}
    lines = ["Precision: " + ", ".join(f"{label} {precision}" for label, precision in precisions.items())]
    made: dict[str, list[str]] = {}
    for r in (r for r in results if r.curve):
        cell = f"{r.label} {r.task}"
        if cell not in made.setdefault(r.machine, []):
            made[r.machine].append(cell)
    lines += [f"Runs made on {machine}: {', '.join(cells)}" if machine
              else f"Runs whose machine was not recorded (made before cell.json recorded it): {', '.join(cells)}"
              for machine, cells in made.items()]
    return lines
