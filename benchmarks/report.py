"""Leaderboard outputs: a Markdown page (one table per task family, keelrl beside published figures
with their source and budget), learning-curve PNGs and CSVs of every number."""

from __future__ import annotations

import csv
import dataclasses
import re
import textwrap
import time
from pathlib import Path

import numpy as np

from keelrl.benchmarks import anchors
from keelrl.benchmarks.aggregate import (
    CLEAN,
    FINISHED,
    LAST_EPISODES_BEFORE,
    NO_FINAL_EVAL,
    AgentIQM,
    CellSummary,
    RunResult,
    iqm_by_agent,
    read_csv_rows,
    run_outcome,
    score_origin,
    shared_window,
    steps_text,
    summarize_cells,
)
from keelrl.benchmarks.provenance import machine_description, runs_made_on
from keelrl.benchmarks.reference_scores import (
    CLEANRL_METRIC,
    LAST_EPISODES,
    PublishedScore,
    no_range_reason,
    published_for,
    score_range,
)
from keelrl.envs import VELOCITY_TASKS

BUDGET_UNITS = {"offline": "gradient updates", "rlvr": "iterations",
                "offline-to-online": "gradient updates (offline pre-training) or environment steps (fine-tuning)"}
# other families: environment steps
RETURN_NAMES = {"rlvr": "final held-out greedy reward"}  # other families: the evaluation return
ENV_VERSION = re.compile(r"-v(\d+)$")
"""the version at the end of an environment id ("Hopper-v4" -> "4")"""


def _pm(mean: float, std: float, digits: int = 1) -> str:
    if not np.isfinite(mean):
        return "–"
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def _rate(per_second: float) -> str:
    if not np.isfinite(per_second):
        return "–"
    return f"{per_second:.1f}" if per_second < 10 else f"{per_second:.0f}"


@dataclasses.dataclass
class _Sources:
    """Numbered list of the published sources cited in one table."""

    entries: list[str] = dataclasses.field(default_factory=list)

    def cite(self, published: PublishedScore) -> int:
        seeds = f"{published.seeds} seeds" if published.seeds else "number of seeds not stated"
        text = (f"{published.source}: {published.published_agent} on {published.published_task}, "
                f"{published.budget}, {seeds}, {published.metric}")
        if text not in self.entries:
            self.entries.append(text)
        return self.entries.index(text) + 1


def _published_cell(cell: CellSummary, sources: _Sources) -> tuple[str, str]:
    """(published figure with its citation, its budget against keelrl's) for one table row."""
    figures = published_for(cell.family, cell.agent, cell.task)
    if not figures:
        return "no published figure", ""
    values, budgets = [], []
    for published in figures:
        value = f"{published.mean:.1f}" + (f" ± {published.std:.1f}" if published.std is not None else "")
        if published.cost is not None:
            value += f" / cost {published.cost:.1f}"
        values.append(f"{value} [{sources.cite(published)}]")
        published_env, our_env = compared_envs(published, cell)
        if cell.data != CLEAN:  # every published figure keelrl holds was measured on clean data
            budgets.append(f"{published.budget} on clean data vs keelrl {steps_text(cell.budget)} on {cell.data}: "
                           "**not comparable**")
        elif published.budget_steps == cell.budget and other_env_version(published_env, our_env):
            budgets.append(f"{published.budget} on {published.published_task} vs keelrl {steps_text(cell.budget)} on "
                           f"{cell.task}: **not comparable** (other env version: {published_env} vs {our_env})")
        elif published.budget_steps == cell.budget:
            budgets.append(f"{published.budget}: same budget" + _spread_text(published, cell))
        else:
            budgets.append(f"{published.budget} vs keelrl {steps_text(cell.budget)}: **not comparable**")
    return "<br>".join(values), "<br>".join(budgets)


def _spread_text(published: PublishedScore, cell: CellSummary) -> str:
    """For a figure of CleanRL's metric with a std: where keelrl's mean of the same metric (its runs' last training
    episodes) lies against the published spread, mean ± std."""
    if published.metric != CLEANRL_METRIC or published.std is None or not np.isfinite(cell.last_train_mean):
        return ""
    if cell.last_train_episodes != LAST_EPISODES:
        return (f"; not set against its spread: CleanRL's figure averages each run's last {LAST_EPISODES} training "
                f"episodes, keelrl's ({_window_text(cell.last_train_episodes)}) does not")
    low, high = published.mean - published.std, published.mean + published.std
    where = "within" if low <= cell.last_train_mean <= high else "above" if cell.last_train_mean > high else "below"
    return (f"; keelrl's last {LAST_EPISODES} training episodes ({cell.last_train_mean:.1f}) **{where}** its spread "
            f"[{low:.1f}, {high:.1f}]")


def _window_text(window: int) -> str:
    """'last 10' ('windows differ' for 0: see CellSummary.last_train_episodes)."""
    return f"last {window}" if window else "windows differ"


def compared_envs(published: PublishedScore, cell: CellSummary) -> tuple[str, str]:
    """The environments whose versions a published figure and a row are compared on: each task's own, or the one it
    is built on (a safety task's MuJoCo env)."""
    ours = VELOCITY_TASKS[cell.task][0] if cell.task in VELOCITY_TASKS else cell.task
    return published.base_env or published.published_task, ours


def other_env_version(published_task: str, task: str) -> bool:
    """Whether a published figure's environment is another version of the cell's ("Hopper-v4" beside "Hopper-v5");
    False where either id names no version (a D4RL dataset "hopper-medium-v2 (D4RL)", an Atari game)."""
    published, ours = ENV_VERSION.search(published_task), ENV_VERSION.search(task)
    return published is not None and ours is not None and published.group(1) != ours.group(1)


def _speed_cells(cell: CellSummary) -> list[str]:
    """The steps/s and wall min/run cells: means over the finished runs whose wall time was measured, "not measured"
    where none was, and how many were where only some were."""
    if cell.seeds_done == 0:
        return ["–", "–"]
    if cell.runs_timed == 0:
        return ["not measured", "not measured"]
    measured = "" if cell.runs_timed == cell.seeds_done else f" ({cell.runs_timed} of {cell.seeds_done} runs measured)"
    return [_rate(cell.sps_mean) + measured, f"{cell.wall_s_mean / 60:.1f}" + measured]


def _count_text(done: int, planned: int, not_finished: str) -> str:
    """'3/3', or '2/3 (1 failed)': finished runs of those planned, and what became of the others."""
    return f"{done}/{planned}" + (f" ({not_finished})" if not_finished else "")


def _iqm_row(entry: AgentIQM) -> str:
    runs = f"{entry.runs} of {entry.runs_planned}" + (f" ({entry.not_finished})" if entry.not_finished else "")
    if entry.no_iqm:
        return f"| {entry.label} | {entry.no_iqm} | – | {runs} | {entry.tasks} |"
    return f"| {entry.label} | {entry.iqm:.1f} | [{entry.ci_low:.1f}, {entry.ci_high:.1f}] | {runs} | {entry.tasks} |"


def family_table(family: str, cells: list[CellSummary], iqms: list[AgentIQM], results: list[RunResult]) -> list[str]:
    """The Markdown section of one family: per-cell table, IQM table, curves, runs not finished."""
    sources = _Sources()
    safe = family == "safe"
    normalised = any(np.isfinite(c.score_mean) for c in cells)
    header = ["agent", "task", "budget", "seeds finished", RETURN_NAMES.get(family, "final eval return")]
    header += ["final eval cost"] if safe else []
    header += ["normalised score"] if normalised else []
    # the column's window: its cells' where they share one, else CleanRL's (a cell of another says so by its figure)
    window = shared_window([cell.last_train_episodes for cell in cells if cell.seeds_done], differing=LAST_EPISODES)
    header += [f"last {window} training episodes", "steps/s", "wall min/run", "published", "published budget"]
    unit = BUDGET_UNITS.get(family, "environment steps")
    lines = [f"## {family}", "", f"Budget in {unit}; steps/s counts the same unit. \"seeds finished\": runs done "
             "with a final evaluation, of those the grid plans; the means are over those runs only.", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for cell in cells:
        if cell.seeds_done == 0:  # nothing to average: say what happened instead of a blank
            result = "**failed**" if cell.seeds_failed else "**missing**"
        else:
            result = _pm(cell.return_mean, cell.return_std)
        row = [cell.label, cell.task, steps_text(cell.budget),
               _count_text(cell.seeds_done, cell.seeds_planned, cell.not_finished), result]
        row += [_pm(cell.cost_mean, cell.cost_std)] if safe else []
        if normalised:
            no_range = np.isnan(cell.score_mean) and score_origin(family, cell.task) is None
            row += ["no declared range" if no_range else _pm(cell.score_mean, cell.score_std)]
        last_train = _pm(cell.last_train_mean, cell.last_train_std)
        if cell.seeds_done and cell.last_train_episodes != window:
            last_train += f" ({_window_text(cell.last_train_episodes)})"
        row += [last_train, *_speed_cells(cell), *_published_cell(cell, sources)]
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "Published sources:" if sources.entries else "No published figure matches these agents and tasks."]
    lines += [f"{i}. {entry}" for i, entry in enumerate(sources.entries, 1)]
    tasks = list(dict.fromkeys(c.task for c in cells))
    ranges = {score_range(task) for task in tasks} - {None}
    undeclared = [task for task in tasks if score_origin(family, task) is None]
    if safe:
        lines += ["", "Cost: mean episode cost of the final evaluation (the Lagrangian agents' default limit is 25, "
                  "OmniSafe's; see each run's config.json for the limit it used)."]
    if family == "offline":
        references = sorted({r.score_references for r in results if r.family == family and r.score_references})
        lines += ["", "Normalised score: the offline agent's own (D4RL formula with its dataset's reference returns, "
                  "logged as eval/normalized_score"
                  + (f": {'; '.join(references)}" if references else "") + "). keelrl's datasets are made here with "
                  "the D4RL recipe, not the D4RL v2 files: published D4RL scores are on other data."]
    elif family == "offline-to-online":
        lines += ["", dataset_scores_text(results)]
    if ranges and family not in ("offline", "offline-to-online"):
        lines += ["", "Normalised score = 100 · (return − low) / (high − low); "
                  + "; ".join(f"{r.task}: low {r.low:g}, high {r.high:g} ({r.source})" for r in sorted(ranges, key=str))
                  + ". An agent that reports its own normalised score in eval.csv (a normalized_score column) is taken "
                    "at its word, in the table above and in the IQM."]
    if undeclared:
        by_reason: dict[str, list[str]] = {}
        for task in undeclared:
            by_reason.setdefault(no_range_reason(task), []).append(task)
        lines += ["", "No declared score range (no normalised score, and no IQM for the agents that run them): "
                  + "; ".join(f"{', '.join(tasks)}: {reason}" for reason, tasks in by_reason.items()) + "."]
    if iqms:
        lines += ["", "Interquartile mean (IQM) of the normalised score over each agent's finished runs, tasks × "
                  "seeds pooled (rliable's IQM), with a stratified-bootstrap 95% confidence interval (runs resampled "
                  "within each task). Raw returns are never pooled across tasks: an agent with a task that has no "
                  "declared score range, or no finished run, gets no IQM.", "",
                  "| agent | IQM (normalised score) | 95% CI | runs covered | tasks |", "|---|---|---|---|---|"]
        lines += [_iqm_row(entry) for entry in iqms]
    not_done = [r for r in results if run_outcome(r) != FINISHED]
    if not_done:
        lines += ["", "Runs not finished (left out of the means and the IQM):"]
        lines += [f"- {r.label} {r.task} seed {r.seed}: "
                  + ("done, but no final evaluation (eval.csv has no row)" if run_outcome(r) == NO_FINAL_EVAL
                     else r.status)
                  for r in not_done]
    return lines


def dataset_scores_text(results: list[RunResult]) -> str:
    """How an offline-to-online table is normalised: the pre-training dataset's reference returns, which, and the
    entries scored with each (and those left without a score)."""
    entries: dict[str, list[str]] = {}
    for result in (r for r in results if run_outcome(r) == FINISHED):
        entries.setdefault(result.score_references, [])
        if result.label not in entries[result.score_references]:
            entries[result.score_references].append(result.label)
    unscored = entries.pop("", [])
    return ("Normalised score = 100 · (return − low) / (high − low) with the reference returns of the grid's "
            "pre-training dataset (from its dataset.json: low = ref_min_score, a random policy's return; high = "
            "ref_max_score, the expert's), for every run alike, in the table and in the IQM, as "
            "benchmarks/checks/offline_to_online.py scores them: "
            + "; ".join(f"{references} ({', '.join(labels)})" for references, labels in entries.items())
            + ". A run from scratch has no dataset of its own: it is scored with the references of the grid's "
              "pre-training dataset in its environment."
            + (f" No normalised score (no pre-training dataset with reference returns in its environment): "
               f"{', '.join(unscored)}." if unscored else ""))


def write_markdown(path: Path, title: str, header: list[str], results: list[RunResult], reps: int
                   ) -> list[anchors.TaskAnchors]:
    """The page; the tasks it sets beside the published curves (their plots are the caller's)."""
    cells = summarize_cells(results)
    iqms = iqm_by_agent(results, reps=reps)
    lines = [f"# keelrl leaderboard: {title}", "", *[f"- {line}" for line in header], "",
             "How to read it: \"final eval return\" is the mean over seeds (± std, ddof 0) of each run's last "
             "evaluation (the mean return of the agent's deterministic evaluation episodes after its last step); "
             "\"last N training episodes\" is the mean return of a run's last N training episodes (all of them where "
             f"it has fewer). CleanRL's published tables average each run's last {LAST_EPISODES} (openrlbenchmark's "
             "rlops.py), so a keelrl figure is set against their spread only where it averages as many; runs "
             f"summarised before keelrl's tables did are shown over their last {LAST_EPISODES_BEFORE}. steps/s = the "
             "run's steps / its share of the wall time of the agent processes that made it (start-up, evaluations "
             "and checkpoints included): a process that trained S seeds at once (--batch-seeds) gives each run 1/S "
             "of its wall time, so a batched run's steps/s is its process's steps of all seeds over its wall time and "
             "\"wall min/run\" is that wall time / S, the figures to set beside runs made one per process on the same "
             "cores. steps/s and wall min/run are means over the finished runs whose wall time was measured (\"not "
             "measured\": an attempt at the run ended without a record of its wall time). Published figures stand "
             "beside keelrl's with their budget: a figure measured at another budget or environment version is not "
             "comparable.", ""]
    for family in dict.fromkeys(r.family for r in results):
        lines += family_table(family, [c for c in cells if c.family == family], [a for a in iqms if a.family == family],
                              [r for r in results if r.family == family])
        if any(r.curve for r in results if r.family == family):
            lines += ["", f"![{family} learning curves]({path.stem}_{family}.png)"]
        lines.append("")
    beside, tasks = anchors.section(path.stem, [r for r in results if r.family == "online"], reps)
    path.write_text("\n".join([*lines, *beside, ""] if beside else lines))
    return tasks


def plot_curves(path: Path, family: str, results: list[RunResult]) -> None:
    """Evaluation return vs steps, one panel per task, mean over seeds with a ±1 std band per agent entry."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(r.task for r in results if r.curve))  # a task no run has evaluated yet gets no panel
    cols = min(3, len(tasks))
    rows = (len(tasks) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    for ax, task in zip(axes.flat, tasks):
        for label in dict.fromkeys(r.label for r in results if r.task == task):
            runs = [r for r in results if r.task == task and r.label == label and r.curve]
            # the finished runs, as the table averages (a failed one would cut every curve at its last step); while
            # none has finished (a page of runs in progress), those evaluated so far
            curves = [dict(r.curve) for r in [r for r in runs if run_outcome(r) == FINISHED] or runs]
            if not curves:
                continue
            steps = sorted(set.intersection(*(set(c) for c in curves)))
            values = np.array([[c[s] for s in steps] for c in curves])  # (seeds, evaluations)
            mean, std = values.mean(axis=0), values.std(axis=0)
            ax.plot(steps, mean, label=f"{label} ({len(curves)} seeds)")
            ax.fill_between(steps, mean - std, mean + std, alpha=0.25)
        ax.set_title(task)
        ax.set_xlabel("\n".join(textwrap.wrap(BUDGET_UNITS.get(family, "environment steps"), 45)))
        ax.set_ylabel("held-out greedy reward" if family == "rlvr" else "evaluation return")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(tasks):]:
        ax.set_visible(False)
    fig.suptitle(f"keelrl {family}: mean over seeds, band ±1 std")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _write_rows(path: Path, rows: list[dict]) -> None:
    if not rows:
        return
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def write_csvs(out_dir: Path, name: str, results: list[RunResult], reps: int, runs_dir: Path | None = None) -> None:
    """{name}_runs.csv (every run), _cells.csv (mean ± std per cell), _iqm.csv, _curves.csv (every evaluation).

    Run directories are written relative to `runs_dir` (the leaderboard's --runs-dir), so that no
    committed table holds a path of the machine the runs were made on.
    """
    runs = [{**{k: v for k, v in dataclasses.asdict(r).items() if k != "curve"}, "sps": r.sps,
             "run_dir": _relative_run_dir(r.run_dir, runs_dir)} for r in results]
    _write_rows(out_dir / f"{name}_runs.csv", runs)
    _write_rows(out_dir / f"{name}_cells.csv", [dataclasses.asdict(c) for c in summarize_cells(results)])
    _write_rows(out_dir / f"{name}_iqm.csv", [dataclasses.asdict(a) for a in iqm_by_agent(results, reps=reps)])
    _write_rows(out_dir / f"{name}_curves.csv", [
        {"family": r.family, "agent": r.label, "task": r.task, "seed": r.seed, "step": step, "eval_return": value}
        for r in results for step, value in r.curve])


def read_runs_tables(out_dir: Path, name: str) -> list[RunResult]:
    """The runs of a page written by `write_csvs`, back from {name}_runs.csv with their curves from _curves.csv
    (none when the page has no tables)."""
    curves: dict[tuple[str, str, str, int], list[tuple[int, float]]] = {}
    for row in read_csv_rows(out_dir / f"{name}_curves.csv"):  # not written when no run has an evaluation
        key = (row["family"], row["agent"], row["task"], int(row["seed"]))
        curves.setdefault(key, []).append((int(row["step"]), float(row["eval_return"])))
    return [RunResult(
        row["family"], row["label"], row["agent"], row["task"], int(row["seed"]), int(row["budget"]), row["status"],
        data=row.get("data", CLEAN), options=row.get("options", ""), run_dir=row["run_dir"], steps=int(row["steps"]),
        final_return=float(row["final_return"]), final_cost=float(row["final_cost"]), score=float(row["score"]),
        score_references=row.get("score_references", ""),
        last_train_return=float(row["last_train_return"]),
        last_train_episodes=int(row.get("last_train_episodes", LAST_EPISODES_BEFORE)),
        wall_s=float(row["wall_s"]), machine=row.get("machine", ""),
        curve=curves.get((row["family"], row["label"], row["task"], int(row["seed"])), []),
    ) for row in read_csv_rows(out_dir / f"{name}_runs.csv")]


def _relative_run_dir(run_dir: str, runs_dir: Path | None) -> str:
    if not run_dir or runs_dir is None:
        return run_dir
    path, root = Path(run_dir).resolve(), Path(runs_dir).resolve()
    return str(path.relative_to(root)) if path.is_relative_to(root) else run_dir


def write_report(out_dir: Path, name: str, results: list[RunResult], header: list[str], reps: int,
                 runs_dir: Path | None = None) -> list[Path]:
    """Markdown, PNGs and CSVs of the results under out_dir; the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    header = [*header, *runs_made_on(results), *machine_description(),
              f"Generated: {time.strftime('%Y-%m-%d %H:%M %Z')}"]
    beside = write_markdown(out_dir / f"{name}.md", name, header, results, reps)
    write_csvs(out_dir, name, results, reps, runs_dir)
    verdicts = anchors.comparisons(beside, reps)
    if verdicts:
        anchors.write_csv(out_dir / f"{name}_anchors.csv", verdicts)
    for task in (task for task in beside if task.finished()):
        anchors.plot_task(out_dir / f"{name}_anchors_{anchors.task_slug(task.task)}.png", task)
    for family in dict.fromkeys(r.family for r in results):
        family_results = [r for r in results if r.family == family]
        if any(r.curve for r in family_results):
            plot_curves(out_dir / f"{name}_{family}.png", family, family_results)
    return sorted(out_dir.glob(f"{name}*"))
