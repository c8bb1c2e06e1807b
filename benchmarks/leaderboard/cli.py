"""The leaderboard's command line: `Args`, `main` and `StopAsInterrupt` (python -m keelrl.benchmarks.leaderboard)."""

from __future__ import annotations

import dataclasses
import signal
import sys
import threading
from pathlib import Path
from typing import Annotated, Any

import tyro

from keelrl.agents.harness.options import parse_command_line
from keelrl.agents.harness.stopping import signal_name
from keelrl.benchmarks.leaderboard.cells import expand
from keelrl.benchmarks.leaderboard.checks import refuse_mixed_budgets
from keelrl.benchmarks.leaderboard.grids import Grid, _flag, check_agent_module, grid_from_dict, load_grid, tomllib
from keelrl.benchmarks.leaderboard.provenance import runs_provenance, shareable_arguments, shareable_text
from keelrl.benchmarks.leaderboard.schedule import run_grids


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
        from keelrl.benchmarks.provenance import committed_provenance
        from keelrl.benchmarks.report import read_runs_tables, write_report

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
        header += [f"Findings (written by hand: what was checked where an entry misses its published figure): "
                   f"[{grid.findings}]({grid.findings})" for grid in grids
                   if grid.findings and (Path(args.out_dir) / grid.findings).is_file()]
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
