"""Step 2 of the GPU run: the learning cells of gpu-evidence-online and -offline, all at once, and what they reached.

    python -m keelrl.benchmarks.gpu.evidence start --runs-dir /tmp/evidence      # returns at once; runs detached
    python -m keelrl.benchmarks.gpu.evidence collect --runs-dir /tmp/evidence --out RESULTS --wait-minutes 9
    python -m keelrl.benchmarks.gpu.evidence start --runs-dir R --tiny --device cpu   # here: 300 steps per cell
    python -m keelrl.benchmarks.gpu.evidence start --agents sac-scalar sac-simba --cudagraphs   # some cells, graphed
    python -m keelrl.benchmarks.gpu.evidence start --cudagraphs --batch-seeds   # each entry's seeds in one process
    python -m keelrl.benchmarks.gpu.evidence start --cudagraphs --retry-failed  # entries whose cells all failed, again
    python -m keelrl.benchmarks.gpu.evidence start --cudagraphs --batch-seeds --mps   # the processes share the GPU
    python -m keelrl.benchmarks.gpu.evidence start --agents sac-simbav2 sac-simba --mps --serial-without-mps ...
        # without MPS, one process after another in that order
    python -m keelrl.benchmarks.gpu.evidence start --cudagraphs --precision tf32   # float32 products on TF32 cores

`start` launches `run` in its own session (setsid), so the cells outlive the command that started them while the
machine is held; `run` is the leaderboard of both grids with one worker per cell (or --processes). `collect` waits the
given minutes (returning early once every cell has started and finished), writing into RESULTS what the cells have
so far at every poll (so a collect cut short leaves what it had): learning.csv (every evaluation: agent, task, seed,
step, mean return, normalised score where the task has reference returns), progress.csv (each cell's last logged
step, last evaluated step, state, failed included, the seeds its process trains, and its steps per second of
wall-clock time since its first evaluation), machine.json (the device, the commit, which may differ from the speed
step's, whether the cells share the GPU through MPS, and the online cells' --precision where it is not fp32), the
last lines of the leaderboard's log (which starts with the command of every `start`) and cell_logs.txt (the end of
each failed cell's own log: its error). Collect again later for more; the cells keep running meanwhile.
An --agents name that is no entry of the grids, or a negative --processes, is refused in one line (exit code 2) before
anything starts or is written.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Literal

import tyro

from keelrl.agents.harness.options import parse_command_line
from keelrl.benchmarks import leaderboard
from keelrl.benchmarks.aggregate import read_csv_rows
from keelrl.benchmarks.gpu import mps
from keelrl.benchmarks.gpu.speed import machine, write_csv
from keelrl.benchmarks.perf.rates import tensorboard_points, window_rate
from keelrl.buffers import normalized_score

GRIDS = ("gpu-evidence-online", "gpu-evidence-offline")
TINY_STEPS, TINY_EVAL_FREQ, TINY_LEARNING_STARTS = 300, 100, 100
LEARNING_FIELDS = ("grid", "agent", "task", "seed", "step", "mean_return", "normalized_score")
PROGRESS_FIELDS = ("grid", "agent", "task", "seed", "state", "last_step", "last_evaluation", "budget",
                   "seeds_in_process", "steps_per_s")
LOG_NAME, MACHINE_NAME, CELL_LOGS_NAME = "leaderboard.log", "machine.json", "cell_logs.txt"
MPS_RECORD = "mps.json"
POLL_SECONDS = 30
"""collect: how often it looks at the cells and rewrites its files (each look reads every cell's logs)"""


@dataclasses.dataclass
class Args:
    action: tyro.conf.Positional[Literal["start", "run", "collect"]]
    """start: launch `run` detached; run: the leaderboard in this process; collect: wait, then write the results"""
    runs_dir: Path = Path("/tmp/keelrl-gpu-evidence")
    """where the cells' runs go (and the leaderboard's log)"""
    out: Path | None = None
    """collect: folder the results are written into"""
    wait_minutes: float = 0.0
    """collect: minutes to wait first (less if every cell finishes)"""
    device: str = "cuda"
    tiny: bool = False
    """300 steps per cell (online: updates from step 100), evaluations every 100: to try the step here"""
    datasets: Path = Path(".gpu/minari")
    """MINARI_DATASETS_PATH of the offline cells"""
    agents: tuple[str, ...] = ()
    """only these entries of the grids (default: every one), in this order: the order their processes start in where
    they do not all start at once (--serial-without-mps)"""
    cudagraphs: bool = False
    """the online (SAC) cells with --cudagraphs: each update replayed as one CUDA graph, losses compiled, several
    times eager's steps/s (benchmarks/results/gpu.md); CUDA only"""
    precision: Literal["fp32", "tf32", "bf16"] = "fp32"
    """the online (SAC) cells' --precision: tf32 multiplies float32 matrices on TF32 tensor cores, as JAX, in which
    the SimBa and SimbaV2 repositories are written, does there by default (collect records it in machine.json: give
    collect the flags start had)"""
    batch_seeds: bool = False
    """the seeds of each online entry as one --num-seeds process (the leaderboard's --batch-seeds): with
    --cudagraphs, one graph replays the update of every seed, each loss batched over the seeds and compiled"""
    retry_failed: bool = False
    """start: only the entries whose every started cell failed (a seed group dies together), one process per seed
    (no --batch-seeds); entries with a cell still running are left alone, so no run gets a second process. With
    --mps, where no started cell is still running (so quitting ends none), MPS is told to quit first: the retried
    cells take turns on the GPU, MPS no longer a suspect of their failure"""
    mps: bool = False
    """start: run the cells as clients of CUDA's Multi-Process Service (benchmarks/gpu/mps.py), so that their kernels
    share the GPU side by side instead of taking turns; if it cannot start, the cells go on without it, and
    machine.json says which"""
    serial_without_mps: bool = False
    """start, with --mps: where MPS is off, the entries' processes run one after another in the order of --agents,
    each alone on the GPU, instead of all at once taking turns (four seed groups taking turns ran about 40 loop
    steps/s each on an H200 where one SAC process alone ran 470.8): the first entries reach the budget within a
    lease, the last may not start"""
    processes: int = 0
    """start, run: at most this many cell processes at once (0: every cell's at once)"""
    commit_file: Path = Path(".gpu/commit.txt")
    """collect: where prepare.sh recorded the commit the cells run"""


def grids(args: Args) -> list[leaderboard.Grid]:
    """Both grids (their --agents entries) on `--device`; with --tiny, every budget TINY_STEPS, evaluations every
    TINY_EVAL_FREQ and the online cells' updates from TINY_LEARNING_STARTS. A name in --agents that is no entry of
    either grid is refused (ValueError naming it and the entries)."""
    options, online = {"device": args.device}, {"cudagraphs": True} if args.cudagraphs else {}
    if args.precision != "fp32":
        online |= {"precision": args.precision}
    if args.tiny:
        options |= {"eval-freq": TINY_EVAL_FREQ, "checkpoint-freq": TINY_STEPS, "eval-episodes": 2}
        online |= {"learning-starts": TINY_LEARNING_STARTS}  # updates begin within the tiny budget
    loaded = [leaderboard.load_grid(name) for name in GRIDS]
    entries = [agent.name for grid in loaded for agent in grid.agents]
    if unknown := [name for name in args.agents if name not in entries]:
        named = ", ".join(repr(name) for name in unknown)
        raise ValueError(f"--agents: no entry named {named} in {' or '.join(GRIDS)}; the entries are "
                         f"{', '.join(entries)}")
    chosen = []
    for grid in loaded:
        agents = grid.agents if not args.agents else tuple(agent for name in args.agents for agent in grid.agents
                                                            if agent.name == name)
        tasks = tuple(dataclasses.replace(task, steps=TINY_STEPS) if args.tiny else task for task in grid.tasks)
        grid_options = grid.options | options | (online if grid.family == "online" else {})
        if agents:
            chosen.append(dataclasses.replace(grid, agents=agents, tasks=tasks, options=grid_options))
    return chosen


def cells(args: Args) -> list[leaderboard.Cell]:
    return [cell for grid in grids(args) for cell in leaderboard.expand(grid, args.runs_dir)]


def started_cells(args: Args) -> list[leaderboard.Cell]:
    """The cells `run` has started (a lease may run some entries only)."""
    return [cell for cell in cells(args) if cell.cell_dir.is_dir()]


def failed_entries(args: Args) -> tuple[str, ...]:
    """The entries among the cells `run` started whose every started cell failed."""
    started = started_cells(args)
    entries = dict.fromkeys(cell.agent.name for cell in started)
    return tuple(name for name in entries
                 if all(cell.result().status == "failed" for cell in started if cell.agent.name == name))


def start(args: Args) -> None:
    """Launch `run` with the same arguments in a new session, its output into runs_dir/leaderboard.log (after the
    command line itself)."""
    if args.retry_failed:
        entries = failed_entries(args)
        if not entries:
            print("no entry whose cells all failed: nothing started")
            return
        if args.mps and not any(cell.result().status == "unfinished" for cell in started_cells(args)):
            why = "quit before a retry, every cell started under it having ended (failed or done)"
            print(f"MPS: {mps.quit_daemon(args.runs_dir / MPS_RECORD, why)['mps']}")
        args = dataclasses.replace(args, agents=entries, batch_seeds=False, retry_failed=False)
    args.runs_dir.mkdir(parents=True, exist_ok=True)
    if args.mps:
        sharing = mps.start(args.runs_dir / MPS_RECORD)["mps"]
        print(f"MPS: {sharing}")
        if args.serial_without_mps and sharing != mps.ON:
            args = dataclasses.replace(args, processes=1)
            print(f"the entries' processes run one after another: {', '.join(args.agents) or 'in grid order'}")
    command = [sys.executable, "-m", "keelrl.benchmarks.gpu.evidence", "run", "--runs-dir", str(args.runs_dir),
               "--device", args.device, "--datasets", str(args.datasets.resolve()), *(["--tiny"] if args.tiny else []),
               *(["--agents", *args.agents] if args.agents else []), *(["--cudagraphs"] if args.cudagraphs else []),
               *(["--batch-seeds"] if args.batch_seeds else []), "--precision", args.precision,
               *(["--processes", str(args.processes)] if args.processes else [])]
    with (args.runs_dir / LOG_NAME).open("a") as log:
        log.write(f"$ {shlex.join(command[1:])}\n")
        log.flush()
        subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    print(f"started: {' '.join(command[1:])}; log in {args.runs_dir / LOG_NAME}")


def run(args: Args) -> None:
    os.environ["MINARI_DATASETS_PATH"] = str(args.datasets.resolve())
    leaderboard.run_grids(grids(args), args.runs_dir, workers=args.processes or len(cells(args)),
                          batch_seeds=args.batch_seeds)


def evaluations(cell: leaderboard.Cell) -> list[dict]:
    """Every evaluation the cell's run has written so far (its eval.csv), normalised where dataset.json gives the
    reference returns."""
    rows = []
    for path in sorted(cell.cell_dir.glob("*/eval.csv")):
        references = path.parent / "dataset.json"
        scores = json.loads(references.read_text())["ref_scores"] if references.is_file() else None
        for row in read_csv_rows(path):
            mean = float(row["mean_return"])
            rows.append(dict(step=int(row["global_step"]), mean_return=f"{mean:.1f}",
                             normalized_score="" if scores is None else f"{normalized_score(mean, *scores):.1f}"))
    return rows


def collect(args: Args) -> None:
    """Wait up to --wait-minutes for the cells, writing learning.csv, progress.csv, the logs' tails and machine.json
    at every poll; return early once every cell of --agents has started and ended. Only the cells `run` has started
    count (looked for again at every poll: a cell queued behind others starts later, --serial-without-mps): a lease
    that ran some entries reports those alone."""
    deadline = time.monotonic() + 60 * args.wait_minutes
    device = machine(args.device, args.commit_file) | mps.recorded(args.runs_dir / MPS_RECORD)
    if args.precision != "fp32":
        device |= {"precision": args.precision}
    while True:
        started = started_cells(args)
        progress = write_results(args, started, device)
        queued = len(cells(args)) - len(started)
        if time.monotonic() >= deadline or not queued and all(row["state"] in ("done", "failed") for row in progress):
            break
        time.sleep(POLL_SECONDS)
    reached = min((row["last_evaluation"] for row in progress), default=0)
    print(f"collected {len(started)} cells; every cell evaluated at step {reached}; "
          f"{sum(row['state'] == 'failed' for row in progress)} failed; {queued} not started")


def rate_since_first_evaluation(cell: leaderboard.Cell, logged: list[tuple[int, float]]) -> str:
    """The cell's steps per second of wall-clock time from its first evaluation step on (the online cells' updates
    have begun by then; a grid without --eval-freq: from its first logged step), its evaluations and checkpoints
    included: what a lease's minutes buy. Empty before two points have been logged from that step on."""
    try:
        return f"{window_rate(logged, from_step=int(cell.grid.options.get('eval-freq', 0))):.1f}"
    except (ValueError, ZeroDivisionError):
        return ""


def write_results(args: Args, every: list[leaderboard.Cell], device: dict) -> list[dict]:
    """The files `collect` writes, as the cells are now (`device`: machine.json's contents); their progress rows."""
    learning, progress, failed_logs = [], [], []
    for cell in every:
        where = dict(grid=cell.grid.name, agent=cell.agent.name, task=cell.task.id, seed=cell.seed)
        points = evaluations(cell)
        learning += [where | point for point in points]
        logged = tensorboard_points(cell.cell_dir, tag=None)
        status, attempts = cell.result().status, cell.record()["attempts"]
        state = status if status in ("done", "failed") else cell.state()[0]
        progress.append(where | dict(state=state, last_step=logged[-1][0] if logged else 0,
                                     last_evaluation=points[-1]["step"] if points else 0, budget=cell.steps,
                                     seeds_in_process=attempts[-1].get("seeds_in_process", 1) if attempts else "",
                                     steps_per_s=rate_since_first_evaluation(cell, logged)))
        log = cell.cell_dir / leaderboard.LOG_FILE
        if state == "failed" and log.is_file():
            failed_logs.append(f"== {cell.cell_dir}\n" + "".join(log.read_text().splitlines(keepends=True)[-40:]))
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "learning.csv", LEARNING_FIELDS, learning)
    write_csv(args.out / "progress.csv", PROGRESS_FIELDS, progress)
    (args.out / MACHINE_NAME).write_text(json.dumps(device, indent=2))
    log = args.runs_dir / LOG_NAME
    (args.out / LOG_NAME).write_text("".join(log.read_text().splitlines(keepends=True)[-200:]) if log.is_file()
                                     else "")
    (args.out / CELL_LOGS_NAME).write_text("\n".join(failed_logs))
    return progress


def validate(args: Args) -> None:
    """Refuse, before anything starts or is written, an --agents name no grid has and a negative --processes."""
    if args.processes < 0:
        raise ValueError(f"--processes must be 0 (every cell's process at once) or more, got {args.processes}")
    grids(args)  # refuses an unknown entry


def main(args: Args) -> int:
    """Do `args.action`; 2 after a one-line refusal of a bad --agents name or --processes count, else 0."""
    if args.action == "collect" and args.out is None:
        raise SystemExit("collect writes its files into --out: give it (on the GPU machine: --out $OUT)")
    if args.serial_without_mps and not args.mps:
        raise SystemExit("--serial-without-mps says what to do when MPS is off: it goes with --mps (for one process "
                         "at a time in any case, give --processes 1)")
    try:
        validate(args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    {"start": start, "run": run, "collect": collect}[args.action](args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(parse_command_line(Args)))
