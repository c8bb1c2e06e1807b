"""The scheduler: which cells run, in which order, as which processes (`seed_batches`), and their results."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from keelrl.agents.harness.stopping import STOPPED_CODES, signal_name
from keelrl.benchmarks.aggregate import DatasetReferences, RunResult, dataset_references
from keelrl.benchmarks.leaderboard.cells import LOG_FILE, Cell, expand
from keelrl.benchmarks.leaderboard.checks import agent_fields, check_agents, check_entries, check_tasks
from keelrl.benchmarks.leaderboard.grids import Grid
from keelrl.benchmarks.leaderboard.workers import Job, LocalWorkers, RayWorkers
from keelrl.benchmarks.provenance import run_machine


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

