"""Leaderboard statistics: figures of one run from its CSV logs, mean ± std over seeds, and the
interquartile mean (IQM) with a stratified-bootstrap confidence interval across tasks and seeds.

IQM (Agarwal et al. 2021, "Deep RL at the edge of the statistical precipice", as rliable computes it):
pool every run's *normalised score* over the tasks, drop the lowest and the highest quarter
(floor(n/4) scores each side, as scipy's `trim_mean(x, 0.25)` and rliable do) and average the rest.
Its confidence interval comes from a stratified bootstrap: each resample redraws the runs of every
task with replacement, within that task, so each task keeps its weight; the interval is the
percentile interval of the resampled IQMs.

Raw returns are never pooled across tasks (their scales differ by orders of magnitude): an agent
entry gets an IQM only when every one of its tasks has a declared score range (reference_scores;
offline-to-online: the pre-training dataset's reference returns, see `score_origin`) and at least
one finished run, and every finished run has a normalised score. Otherwise it gets none, with the
reason ("no IQM: Swimmer-v5 has no declared score range"). A run counts as finished when it is done
and has a final evaluation; the others (failed, unfinished, unavailable, done without an evaluation)
are counted and shown, never averaged in.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import numpy as np

from keelrl.agents.harness.logs import EPISODES_FILE, EVAL_FILE
from keelrl.agents.harness.run_directory import CONFIG_FILE, DATASET_FILE
from keelrl.benchmarks.reference_scores import LAST_EPISODES, normalized_score, score_source

LAST_EPISODES_BEFORE = 10
"""the window of the tables written before they had a `last_train_episodes` column"""
NORMALIZED_COLUMNS = ("normalized_score", "normalised_score")
OFFLINE_SCORE_TAG = "eval/normalized_score"
CLEAN = "clean"
FINISHED = "finished"
NO_FINAL_EVAL = "no final evaluation"
DATASET_SCORE_SOURCE = ("the reference returns of the grid's pre-training dataset (ref_min_score: a random policy's "
                        "return, ref_max_score: the expert's, from its dataset.json), for every run alike")
NOT_FINISHED = ("failed", NO_FINAL_EVAL, "unfinished", "unavailable")
"""the outcomes of a run that is not finished, in the order the tables list them"""


@dataclasses.dataclass
class RunResult:
    """One cell of the grid (agent × task × seed) and the figures read from its run directory."""

    family: str
    label: str
    """the agent entry's name in the grid (an agent module with one option set)"""
    agent: str
    """the agent module (keelrl.agents.<agent>)"""
    task: str
    seed: int
    budget: int
    """the step budget the grid gave (environment steps, or the agent's own unit)"""
    status: str
    """done, unfinished (interrupted or still to run), failed or unavailable"""
    data: str = CLEAN
    """what the agent learned from when its data was corrupted on purpose, e.g. '30% random dynamics corruption'
    (from the run's config.json); "clean" otherwise"""
    options: str = ""
    """the agent flags the leaderboard gave the cell, but --runs-dir ('' where not recorded); a committed row is
    only taken for a cell asking for the same"""
    run_dir: str = ""
    steps: int = 0
    """step of the last evaluation"""
    final_return: float = float("nan")
    """mean return of the last evaluation (deterministic policy)"""
    final_cost: float = float("nan")
    """mean episode cost of the last evaluation"""
    score: float = float("nan")
    """normalised final return: offline-to-online: 100·(R − low)/(high − low) with the pre-training dataset's
    reference returns, for every run alike (`score_references`); else eval.csv's own column if it has one; offline:
    the agent's logged eval/normalized_score (its dataset's references); else with the task's range"""
    score_references: str = ""
    """offline-to-online: the dataset and the reference returns its score uses ('' where it has none, and in the
    other families)"""
    last_train_return: float = float("nan")
    """mean return of the run's last `last_train_episodes` training episodes (all of them where it has fewer)"""
    last_train_episodes: int = LAST_EPISODES
    """the window of last_train_return: LAST_EPISODES, CleanRL's; LAST_EPISODES_BEFORE in older tables"""
    wall_s: float = float("nan")
    """the run's share of the wall-clock seconds of the agent processes that made it (start-up and evaluations
    included): a process that trained S seeds at once gives each 1/S of its wall time; NaN where not measured"""
    machine: str = ""
    """what its agent process ran on: CPU, software versions, keelrl commit (cell.json; '' where not recorded)"""
    curve: list[tuple[int, float]] = dataclasses.field(default_factory=list)
    """(step, mean evaluation return) of every evaluation"""

    @property
    def sps(self) -> float:
        """Environment steps per second of wall time (NaN when the wall time is unknown)."""
        return self.steps / self.wall_s if self.wall_s > 0 else float("nan")


def steps_text(steps: int | None) -> str:
    """15000 -> '15k', 1000000 -> '1M'."""
    if steps is None:
        return "not stated"
    for unit, size in (("M", 1_000_000), ("k", 1_000)):
        if steps >= size:
            return f"{steps / size:g}{unit}"
    return str(steps)


def read_csv_rows(path: Path) -> list[dict[str, str]]:
    """The rows of a CSV file, by column name ([] when there is no such file)."""
    if not path.is_file():
        return []
    with path.open() as f:
        return list(csv.DictReader(f))


@dataclasses.dataclass(frozen=True)
class DatasetReferences:
    """The reference returns of an offline dataset (a random policy's and the expert's), as a run's dataset.json
    records them."""

    dataset: str
    env_id: str
    """the environment the dataset's policies act in"""
    low: float
    high: float

    def score(self, value: float) -> float:
        return 100.0 * (value - self.low) / (self.high - self.low)

    def text(self) -> str:
        return f"{self.dataset}: low {self.low:g}, high {self.high:g}"


def dataset_references(run_dir: Path) -> DatasetReferences | None:
    """The reference returns of the dataset a run learned from (run_dir/dataset.json; None: no such file, or a
    dataset without references)."""
    path = run_dir / DATASET_FILE
    if not path.is_file():
        return None
    summary = json.loads(path.read_text())
    if summary.get("ref_scores") is None:
        return None
    low, high = summary["ref_scores"]
    return DatasetReferences(summary["source"], summary["env_id"], float(low), float(high))


def read_run_figures(result: RunResult, run_dir: Path, references: DatasetReferences | None = None) -> RunResult:
    """Fill `result`'s figures from run_dir/eval.csv and episodes.csv, its data condition from config.json.

    An offline-to-online run is scored with the reference returns of its dataset (its dataset.json), or, for a run
    from scratch, with `references` (the grid's pre-training dataset in its environment); without either it has no
    normalised score."""
    evals = read_csv_rows(run_dir / EVAL_FILE)
    episodes = read_csv_rows(run_dir / EPISODES_FILE)
    result.run_dir = str(run_dir)
    result.data = data_condition(run_dir / CONFIG_FILE)
    result.curve = [(int(row["global_step"]), float(row["mean_return"])) for row in evals]
    if episodes:
        result.last_train_return = float(np.mean([float(row["return"]) for row in episodes[-LAST_EPISODES:]]))
    if not evals:
        return result
    last = evals[-1]
    result.steps = int(last["global_step"])
    result.final_return = float(last["mean_return"])
    result.final_cost = float(last.get("mean_cost") or "nan")
    own_column = next((name for name in NORMALIZED_COLUMNS if last.get(name)), None)
    if result.family == "offline-to-online":  # every run alike, with the pre-training dataset's references
        references = dataset_references(run_dir) or references
        if references is not None:
            result.score = references.score(result.final_return)
            result.score_references = references.text()
    elif own_column:
        result.score = float(last[own_column])
    elif result.family == "offline":  # offline agents normalise with their dataset's own reference returns
        result.score = last_scalar(run_dir, OFFLINE_SCORE_TAG)
        dataset = dataset_references(run_dir)
        result.score_references = "" if dataset is None else dataset.text()
    else:
        result.score = normalized_score(result.task, result.final_return)
    return result


def data_condition(config_path: Path) -> str:
    """'30% random dynamics corruption' for a run of an offline agent trained on corrupted data, else 'clean'."""
    if not config_path.is_file():
        return CLEAN
    config = json.loads(config_path.read_text()).get("config", {})
    if not config.get("corruption"):
        return CLEAN
    return f"{config['corruption_rate']:.0%} {config['corruption_mode']} {config['corruption']} corruption"


def last_scalar(run_dir: Path, tag: str) -> float:
    """The last value of a TensorBoard scalar in run_dir (NaN if the run never logged it)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    if tag not in events.Tags()["scalars"]:
        return float("nan")
    return float(events.Scalars(tag)[-1].value)


def score_origin(family: str, task: str) -> str | None:
    """Where the normalised scores of a family's runs on a task come from (None: they have none, and their agent
    gets no IQM): an offline-to-online grid scores every run with its pre-training dataset's reference returns; the
    other families as `score_source` says."""
    if family == "offline-to-online":
        return DATASET_SCORE_SOURCE
    return score_source(family, task)


def iqm(scores: np.ndarray) -> float:
    """Interquartile mean of all scores pooled (floor(n/4) dropped at each end)."""
    ordered = np.sort(np.asarray(scores, dtype=np.float64).ravel())
    cut = ordered.size // 4
    return float(ordered[cut: ordered.size - cut].mean())


def stratified_bootstrap_ci(
    scores_by_task: list[np.ndarray], reps: int = 10_000, confidence: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Percentile interval of the IQM over `reps` stratified resamples (runs redrawn within each task)."""
    rng = np.random.default_rng(seed)
    resampled = []
    for task_scores in scores_by_task:
        task_scores = np.asarray(task_scores, dtype=np.float64)
        picks = rng.integers(0, task_scores.size, size=(reps, task_scores.size))
        resampled.append(task_scores[picks])  # (reps, runs of this task)
    pooled = np.sort(np.concatenate(resampled, axis=1), axis=1)  # (reps, all runs)
    cut = pooled.shape[1] // 4
    iqms = pooled[:, cut: pooled.shape[1] - cut].mean(axis=1)  # (reps,)
    tail = 100.0 * (1.0 - confidence) / 2.0
    low, high = np.percentile(iqms, [tail, 100.0 - tail])
    return float(low), float(high)


def run_outcome(result: RunResult) -> str:
    """'finished' (done, with a final evaluation), 'no final evaluation' (done, but eval.csv has no row),
    or the run's status (failed, unfinished, unavailable)."""
    if result.status == "done":
        return FINISHED if np.isfinite(result.final_return) else NO_FINAL_EVAL
    return result.status


def outcome_counts(runs: list[RunResult]) -> str:
    """The runs that are not finished, counted by outcome: '1 failed, 2 unfinished' ('' when all finished)."""
    outcomes = [run_outcome(r) for r in runs]
    kinds = [*NOT_FINISHED, *sorted(set(outcomes) - {FINISHED, *NOT_FINISHED})]
    return ", ".join(f"{outcomes.count(kind)} {kind}" for kind in kinds if kind in outcomes)


def _mean_std(values: list[float]) -> tuple[float, float]:
    finite = np.asarray([v for v in values if np.isfinite(v)], dtype=np.float64)
    if finite.size == 0:
        return float("nan"), float("nan")
    return float(finite.mean()), float(finite.std())


@dataclasses.dataclass
class CellSummary:
    """One agent entry on one task: mean ± std over its finished seeds (std with ddof 0)."""

    family: str
    label: str
    agent: str
    task: str
    budget: int
    seeds_done: int
    """finished runs (done, with a final evaluation): the means are over these"""
    seeds_planned: int
    seeds_failed: int
    """runs whose agent process failed"""
    not_finished: str
    """the other runs by outcome, e.g. '1 failed, 1 no final evaluation' ('' when every run finished)"""
    return_mean: float
    return_std: float
    cost_mean: float
    cost_std: float
    score_mean: float
    score_std: float
    last_train_mean: float
    last_train_std: float
    sps_mean: float
    """mean steps/s of the finished runs whose wall time was measured"""
    wall_s_mean: float
    """mean wall time of the finished runs whose wall time was measured"""
    data: str = CLEAN
    """the data condition of its runs that have started ("clean" or a corruption, see RunResult.data)"""
    runs_timed: int = 0
    """finished runs whose wall time was measured (steps/s and wall time are their means)"""
    last_train_episodes: int = LAST_EPISODES
    """the window of its finished runs' last_train_return (0 where they differ)"""


def summarize_cells(results: list[RunResult]) -> list[CellSummary]:
    """Group runs by (family, label, task) in grid order and average the finished ones."""
    groups: dict[tuple[str, str, str], list[RunResult]] = {}
    for result in results:
        groups.setdefault((result.family, result.label, result.task), []).append(result)
    summaries = []
    for (family, label, task), runs in groups.items():
        done = [r for r in runs if run_outcome(r) == FINISHED]
        pairs = [_mean_std([getattr(r, name) for r in done])
                 for name in ("final_return", "final_cost", "score", "last_train_return")]
        summaries.append(CellSummary(
            family, label, runs[0].agent, task, runs[0].budget, len(done), len(runs),
            sum(r.status == "failed" for r in runs), outcome_counts(runs),
            *pairs[0], *pairs[1], *pairs[2], *pairs[3],
            _mean_std([r.sps for r in done])[0], _mean_std([r.wall_s for r in done])[0],
            next((r.data for r in runs if r.data != CLEAN), CLEAN),
            runs_timed=sum(bool(np.isfinite(r.wall_s)) for r in done),
            last_train_episodes=shared_window([r.last_train_episodes for r in done], differing=0),
        ))
    return summaries


def shared_window(windows: list[int], differing: int) -> int:
    """The last_train_return window these share (LAST_EPISODES where there are none), else `differing`."""
    distinct = set(windows) or {LAST_EPISODES}
    return distinct.pop() if len(distinct) == 1 else differing


@dataclasses.dataclass
class AgentIQM:
    """IQM of one agent entry's normalised scores over its finished runs of every task, with its bootstrap
    interval; or none (NaN), with the reason in `no_iqm`."""

    family: str
    label: str
    iqm: float
    """IQM of the normalised scores (NaN when there is none)"""
    ci_low: float
    ci_high: float
    runs: int
    """finished runs the IQM covers (0 when there is none)"""
    runs_planned: int
    """runs of this agent entry in the grid"""
    not_finished: str
    """the other runs by outcome, e.g. '1 failed' ('' when every run finished)"""
    tasks: int
    no_iqm: str = ""
    """why there is no IQM, e.g. 'no IQM: Ant-v5 has no declared score range' ('' when there is one)"""


def iqm_by_agent(results: list[RunResult], reps: int = 10_000, seed: int = 0) -> list[AgentIQM]:
    """Per (family, agent entry): IQM and stratified-bootstrap 95% CI of the normalised score across tasks
    and seeds, or the reason there is none. Never an aggregate of raw returns."""
    groups: dict[tuple[str, str], dict[str, list[RunResult]]] = {}
    for result in results:
        groups.setdefault((result.family, result.label), {}).setdefault(result.task, []).append(result)
    table = []
    for (family, label), by_task in groups.items():
        runs = [r for task_runs in by_task.values() for r in task_runs]
        finished = {task: [r for r in task_runs if run_outcome(r) == FINISHED] for task, task_runs in by_task.items()}
        reasons = []
        for task, task_runs in finished.items():
            if score_origin(family, task) is None:
                reasons.append(f"{task} has no declared score range")
            elif not task_runs:
                reasons.append(f"{task} has no finished run")
            else:
                unscored = sum(not np.isfinite(r.score) for r in task_runs)
                if unscored:
                    reasons.append(f"{unscored} of the {len(task_runs)} finished runs on {task} have no normalised "
                                   "score")
        entry = AgentIQM(family, label, float("nan"), float("nan"), float("nan"), 0, len(runs), outcome_counts(runs),
                         len(by_task))
        if reasons:
            entry.no_iqm = "no IQM: " + "; ".join(reasons)
        else:
            scores_by_task = [np.array([r.score for r in task_runs], dtype=np.float64)
                              for task_runs in finished.values()]
            entry.iqm = iqm(np.concatenate(scores_by_task))
            entry.ci_low, entry.ci_high = stratified_bootstrap_ci(scores_by_task, reps=reps, seed=seed)
            entry.runs = sum(len(scores) for scores in scores_by_task)
        table.append(entry)
    return table
