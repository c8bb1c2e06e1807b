"""A cell (one agent entry on one task with one seed) and its state on disk: RUNS_DIR/<grid>/<agent entry>/<task>/
seed<seed>/ holds the agent's run directory, log.txt (the agent's output, every attempt) and cell.json (its options
and the timed attempts)."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from keelrl.agents.harness.checkpoints import CHECKPOINT_FILE, MODEL_FILE
from keelrl.agents.harness.run_directory import CONFIG_FILE
from keelrl.agents.harness.seeds import SEEDS_FILE
from keelrl.agents.harness.stopping import STOPPED_CODES
from keelrl.benchmarks.aggregate import DatasetReferences, RunResult, read_run_figures
from keelrl.benchmarks.leaderboard.grids import AgentEntry, Grid, TaskEntry, to_flags

CELL_FILE = "cell.json"
LOG_FILE = "log.txt"
ATTEMPT_LINE = re.compile(r"^=== .+: (?:new|resume) run: python ", re.M)
"""the line log.txt gets as each agent process starts (`run_agent_process`)"""


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

