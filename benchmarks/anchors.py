"""keelrl's learning curves beside the published ones (benchmarks/anchors/published_curves.csv, its README).

For each task of a page that has anchors, at each step of `TABLE_STEPS` that the anchors record:
- every keelrl entry's finished seeds (their evaluation at that step) and every anchor algorithm's seeds;
- the verdict of each keelrl entry against each compared anchor (`COMPARED`) that has at least
  `MIN_VERDICT_SEEDS` seeds there: the bootstrap 95% interval of (keelrl mean − anchor mean), both sides' seeds
  resampled with replacement, each within its own side; "matches" if it holds 0, else "above" or "below". An anchor
  with fewer seeds is shown seed by seed, with no interval and no verdict;
- the interquartile mean of the normalised scores (reference_scores.SCORE_RANGES) over the tasks every side has,
  with its stratified-bootstrap 95% interval, keelrl's entries beside the anchors.

Tasks are matched by id, which fixes the environment version and the action repeat: keelrl's `Hopper-v4` meets the
anchors' `Hopper-v4`, a `Hopper-v5` run meets none (v5 changed rewards and contacts); keelrl's `cheetah-run` (action
repeat 2, as the anchors ran DMC: keelrl.envs.dmc) meets the anchors' `cheetah-run`, `dm_control/cheetah-run-v0`
(action repeat 1, another decision rate) none. Steps are the anchors': simulator steps, so a keelrl step on an id
with action repeat k counts k (keelrl's evaluation at its step 150k stands at the anchors' 300k).
"""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import gymnasium as gym
import numpy as np

import keelrl.envs  # noqa: F401  (registers the DMC ids, whose action repeat scales their steps)

from keelrl.benchmarks.aggregate import FINISHED, RunResult, iqm, run_outcome, steps_text, stratified_bootstrap_ci
from keelrl.benchmarks.reference_scores import normalized_score

ANCHORS_FILE = Path(__file__).parent / "anchors" / "published_curves.csv"
TABLE_STEPS = (100_000, 200_000, 300_000, 1_000_000)
"""the steps a page compares at (those within a row's budget)"""
MIN_VERDICT_SEEDS = 5
"""an anchor with fewer seeds at a step is drawn seed by seed, without an interval or a verdict"""
COMPARED = ("SAC", "SimbaV2", "MR.Q")
"""the anchors keelrl's SAC entries get a verdict against and that the plots draw: the published agent keelrl's SAC
is, and the two strongest at these budgets (the only ones with 10 seeds on DMC); the others stand in the tables"""
JUDGED_AGENTS = ("sac",)
"""the keelrl agents that have a published curve of their own in the file (TD3 and PPO have none: their entries
stand beside the anchors without a verdict)"""
CONFIDENCE = 0.95
BOOTSTRAP_SEED = 0


@dataclasses.dataclass(frozen=True)
class Anchor:
    """One published algorithm on one task: its per-seed returns by step."""

    algorithm: str
    updates_per_step: int
    task: str
    returns: dict[int, np.ndarray]
    """step -> the returns of every seed recorded there, (seeds,)"""

    def seeds_at(self, step: int) -> np.ndarray:
        return self.returns.get(step, np.empty(0))


def load_anchors(path: Path = ANCHORS_FILE) -> dict[str, list[Anchor]]:
    """The anchors of every task, by the anchors' task name, algorithms in the file's order."""
    table: dict[tuple[str, str], tuple[int, dict[int, list[float]]]] = {}
    with path.open() as f:
        for row in csv.DictReader(f):
            _, by_step = table.setdefault((row["task"], row["algorithm"]), (int(row["updates_per_step"]), {}))
            by_step.setdefault(int(row["step"]), []).append(float(row["return"]))
    anchors: dict[str, list[Anchor]] = {}
    for (task, algorithm), (updates, by_step) in table.items():
        returns = {step: np.asarray(values) for step, values in sorted(by_step.items())}
        anchors.setdefault(task, []).append(Anchor(algorithm, updates, task, returns))
    return anchors


def action_repeat(task_id: str) -> int:
    """The simulator steps of one keelrl step on this task: its registered `action_repeat` (DMC), else 1."""
    try:
        return int(gym.spec(task_id).kwargs.get("action_repeat", 1))
    except gym.error.Error:  # not registered here
        return 1


def seeds_at(runs: list[RunResult], step: int, repeat: int = 1) -> np.ndarray:
    """The finished runs' evaluation returns at the anchors' `step` (keelrl's step // repeat), of those that
    evaluated there, (seeds,)."""
    ours = step // repeat
    return np.asarray([dict(r.curve)[ours] for r in runs if run_outcome(r) == FINISHED and ours in dict(r.curve)])


def difference_interval(ours: np.ndarray, theirs: np.ndarray, reps: int,
                        seed: int = BOOTSTRAP_SEED) -> tuple[float, float, float]:
    """(mean(ours) − mean(theirs), and its bootstrap interval): each side's seeds resampled with replacement within
    that side, `reps` times; the percentile interval of the resampled differences."""
    rng = np.random.default_rng(seed)
    ours_means = ours[rng.integers(0, ours.size, size=(reps, ours.size))].mean(axis=1)  # (reps,)
    theirs_means = theirs[rng.integers(0, theirs.size, size=(reps, theirs.size))].mean(axis=1)  # (reps,)
    tail = 100.0 * (1.0 - CONFIDENCE) / 2.0
    low, high = np.percentile(ours_means - theirs_means, [tail, 100.0 - tail])
    return float(ours.mean() - theirs.mean()), float(low), float(high)


def verdict(low: float, high: float) -> str:
    return "matches" if low <= 0.0 <= high else "above" if low > 0.0 else "below"


@dataclasses.dataclass(frozen=True)
class Comparison:
    """A keelrl entry against one anchor on one task at one step."""

    entry: str
    anchor: str
    task: str
    step: int
    keelrl_seeds: int
    anchor_seeds: int
    difference: float
    low: float
    high: float
    verdict: str
    """matches, above, below, or why there is none"""


def compare(entry: str, ours: np.ndarray, anchor: Anchor, task: str, step: int, reps: int) -> Comparison:
    """The verdict of keelrl's seeds `ours` against the anchor at `step`, or why there is none."""
    theirs = anchor.seeds_at(step)
    nan = float("nan")
    if theirs.size < MIN_VERDICT_SEEDS:
        why = f"no verdict: {anchor.algorithm} has {theirs.size} seed(s) here"
        return Comparison(entry, anchor.algorithm, task, step, ours.size, theirs.size, nan, nan, nan, why)
    if ours.size < 2:
        why = f"no verdict: keelrl has {ours.size} finished seed(s) here"
        return Comparison(entry, anchor.algorithm, task, step, ours.size, theirs.size, nan, nan, nan, why)
    difference, low, high = difference_interval(ours, theirs, reps)
    return Comparison(entry, anchor.algorithm, task, step, ours.size, theirs.size, difference, low, high,
                      verdict(low, high))


@dataclasses.dataclass
class TaskAnchors:
    """One task of a page with its anchors, keelrl's runs on it by entry, and the steps compared."""

    task: str
    """keelrl's task id"""
    anchors: list[Anchor]
    runs: dict[str, list[RunResult]]
    steps: list[int]
    """the anchors' steps compared (simulator steps)"""
    repeat: int = 1
    """simulator steps per keelrl step (the task's action repeat)"""

    def seeds_at(self, entry: str, step: int) -> np.ndarray:
        """keelrl's finished seeds of an entry at the anchors' `step`."""
        return seeds_at(self.runs[entry], step, self.repeat)

    def finished(self) -> bool:
        """Whether keelrl has a finished run here (a task without one gets its table, not a plot)."""
        return any(run_outcome(r) == FINISHED for runs in self.runs.values() for r in runs)


def tasks_with_anchors(results: list[RunResult], anchors: dict[str, list[Anchor]]) -> list[TaskAnchors]:
    """The page's tasks that the anchors hold, in page order, each with the steps within its budgets that both the
    anchors and TABLE_STEPS have."""
    tasks = []
    for task in dict.fromkeys(r.task for r in results):
        if task not in anchors:
            continue
        runs: dict[str, list[RunResult]] = {}
        for result in (r for r in results if r.task == task):
            runs.setdefault(result.label, []).append(result)
        repeat = action_repeat(task)
        budget = max(r.budget for r in results if r.task == task) * repeat
        recorded = {step for anchor in anchors[task] for step in anchor.returns}
        steps = [step for step in TABLE_STEPS if step <= budget and step in recorded]
        ordered = sorted(anchors[task], key=lambda a: COMPARED.index(a.algorithm) if a.algorithm in COMPARED
                         else len(COMPARED))
        tasks.append(TaskAnchors(task, ordered, runs, steps, repeat))
    return tasks


def comparisons(tasks: list[TaskAnchors], reps: int) -> list[Comparison]:
    """Every keelrl entry against every compared anchor, per task and step."""
    return [compare(entry, task.seeds_at(entry, step), anchor, task.task, step, reps)
            for task in tasks for step in task.steps for entry, runs in task.runs.items()
            if runs[0].agent in JUDGED_AGENTS for anchor in task.anchors if anchor.algorithm in COMPARED]


def normalised_iqm(scores_by_task: list[np.ndarray], reps: int) -> tuple[float, float, float]:
    """(IQM, its stratified-bootstrap interval) of normalised scores grouped by task."""
    low, high = stratified_bootstrap_ci(scores_by_task, reps=reps, confidence=CONFIDENCE, seed=BOOTSTRAP_SEED)
    return iqm(np.concatenate(scores_by_task)), low, high


def suite(anchor_name: str) -> str:
    """The suite of an anchors' task: its IQM pools with the suite's other tasks only."""
    return "Gym MuJoCo v4" if anchor_name.endswith("-v4") else "DeepMind Control"


@dataclasses.dataclass(frozen=True)
class IQMRow:
    """The IQM of a keelrl entry or an anchor over the tasks of one suite of a page at one step."""

    suite: str
    name: str
    step: int
    tasks: int
    runs: int
    iqm: float
    low: float
    high: float


def iqm_rows(tasks: list[TaskAnchors], reps: int) -> list[IQMRow]:
    """Per suite and step, the IQM of every keelrl entry and every anchor that have seeds there on every task of the
    suite the page compares at that step (so the anchors pool the same tasks as keelrl's entries)."""
    rows = []
    for suite_name in dict.fromkeys(suite(task.anchors[0].task) for task in tasks):
        in_suite = [task for task in tasks if suite(task.anchors[0].task) == suite_name]
        for step in sorted({step for task in in_suite for step in task.steps}):
            at_step = [task for task in in_suite if step in task.steps]
            sides: dict[str, list[np.ndarray]] = {}
            for task in at_step:
                for entry in task.runs:
                    sides.setdefault(f"keelrl {entry}", []).append(_scores(task.task, task.seeds_at(entry, step)))
                for anchor in task.anchors:
                    sides.setdefault(anchor.algorithm, []).append(_scores(anchor.task, anchor.seeds_at(step)))
            for name, scores in sides.items():
                if len(scores) == len(at_step) and all(s.size for s in scores):
                    rows.append(IQMRow(suite_name, name, step, len(scores), sum(s.size for s in scores),
                                       *normalised_iqm(scores, reps)))
    return rows


def _scores(task: str, returns: np.ndarray) -> np.ndarray:
    return np.asarray([normalized_score(task, value) for value in returns])


def _returns_text(values: np.ndarray, per_seed_below: int = 0) -> str:
    """'2310.5 ± 342.8 (10)' (std ddof 0), or the seeds one by one where fewer than `per_seed_below`."""
    if values.size == 0:
        return "–"
    if values.size < per_seed_below:
        return ", ".join(f"{v:.0f}" for v in values) + f" (per seed, {values.size})"
    return f"{values.mean():.1f} ± {values.std():.1f} ({values.size})"


def _comparison_row(c: Comparison) -> str:
    if np.isnan(c.difference):
        return f"| {steps_text(c.step)} | {c.entry} | {c.anchor} | – | – | {c.verdict} |"
    return (f"| {steps_text(c.step)} | {c.entry} | {c.anchor} | {c.difference:+.1f} | [{c.low:+.1f}, {c.high:+.1f}] "
            f"| **{c.verdict}** |")


def task_slug(task: str) -> str:
    return task.replace("/", "_")


def summary_lines(found: list[Comparison], steps: list[int]) -> list[str]:
    """Per entry and compared anchor, at the page's furthest step: how many tasks match, lie above or below."""
    if not steps:
        return []
    last = max(steps)
    lines = []
    pairs = dict.fromkeys((c.entry, c.anchor) for c in found if c.step == last)
    for entry, anchor in pairs:
        at_last = [c for c in found if (c.entry, c.anchor, c.step) == (entry, anchor, last)]
        counts = {name: [c.task for c in at_last if c.verdict == name] for name in ("matches", "above", "below")}
        none = [c.task for c in at_last if c.verdict not in counts]
        text = "; ".join(f"{name} on {len(tasks)} ({', '.join(tasks)})" for name, tasks in counts.items() if tasks)
        lines.append(f"- keelrl {entry} against published {anchor} at {steps_text(last)}: "
                     + (text or "no verdict yet") + (f"; no verdict on {', '.join(none)}" if none else ""))
    return lines


def section(page: str, results: list[RunResult], reps: int, anchors: dict[str, list[Anchor]] | None = None
            ) -> tuple[list[str], list[TaskAnchors]]:
    """The page's section beside the anchors (no lines where no task has anchors), and the tasks it covers."""
    tasks = tasks_with_anchors(results, load_anchors() if anchors is None else anchors)
    if not tasks:
        return [], []
    found = comparisons(tasks, reps)
    lines = ["## Beside the published curves", "",
             "The anchors: per-seed evaluation returns of published agents from the SimbaV2 repository's baseline "
             "results (dojeon-ai/SimbaV2 at 14fafb2, Apache-2.0; benchmarks/anchors/README.md), on the same task and "
             "environment version at the same environment steps. The published SAC's own settings are not published "
             "with its curves; keelrl's SAC runs CleanRL's defaults. keelrl's figures are the finished seeds' "
             "evaluations (10 deterministic episodes) at each step; mean ± std with ddof 0, seeds in brackets. "
             f"Verdict: the bootstrap {CONFIDENCE:.0%} interval ({reps} resamples, each side's seeds resampled "
             "within that side) of keelrl's mean minus the anchor's: \"matches\" if it holds 0, else \"above\" or "
             f"\"below\"; an anchor with fewer than {MIN_VERDICT_SEEDS} seeds at a step is listed seed by seed, with "
             f"no verdict. Verdicts for keelrl's {', '.join(JUDGED_AGENTS).upper()} entries (the agents the file has a "
             f"published curve of) against {', '.join(COMPARED)}; the other entries and anchors stand in the tables "
             "without one."]
    summary = summary_lines(found, sorted({s for t in tasks for s in t.steps}))
    lines += ["", *summary] if summary else []
    for task in tasks:
        lines += _task_lines(page, task, [c for c in found if c.task == task.task])
    lines += _iqm_lines(iqm_rows(tasks, reps), reps)
    return lines, tasks


def _task_lines(page: str, task: TaskAnchors, found: list[Comparison]) -> list[str]:
    header = ["step", *[f"keelrl {entry}" for entry in task.runs],
              *[f"{a.algorithm} (UTD {a.updates_per_step})" for a in task.anchors]]
    lines = ["", f"### {task.task}", ""]
    if task.repeat != 1:
        lines += [f"Action repeat {task.repeat}, as the anchors ran it: steps are simulator steps, each keelrl step "
                  f"counts {task.repeat}.", ""]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for step in task.steps:
        row = [steps_text(step), *[_returns_text(task.seeds_at(entry, step)) for entry in task.runs],
               *[_returns_text(anchor.seeds_at(step), MIN_VERDICT_SEEDS) for anchor in task.anchors]]
        lines.append("| " + " | ".join(row) + " |")
    if found:
        lines += ["", "| step | keelrl entry | against | keelrl − anchor | 95% CI | verdict |",
                  "|---|---|---|---|---|---|", *[_comparison_row(c) for c in found]]
    if task.finished():
        lines += ["", f"![{task.task}: keelrl beside the published curves]({page}_anchors_{task_slug(task.task)}.png)"]
    return lines


def _iqm_lines(rows: list[IQMRow], reps: int) -> list[str]:
    if not rows:
        return []
    lines = ["", "### Aggregate", "",
             "Interquartile mean of the normalised score (reference_scores.SCORE_RANGES: 100 · (return − low) / "
             "(high − low)) over every seed of every task of a suite, with a stratified-bootstrap "
             f"{CONFIDENCE:.0%} interval ({reps} resamples, seeds redrawn within each task); an anchor is pooled over "
             "the same tasks as keelrl's entries and only where it has seeds on all of them.", "",
             "| suite | step | who | tasks | runs | IQM | 95% CI |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r.suite} | {steps_text(r.step)} | {r.name} | {r.tasks} | {r.runs} | {r.iqm:.1f} "
              f"| [{r.low:.1f}, {r.high:.1f}] |" for r in rows]
    return lines


def write_csv(path: Path, found: list[Comparison]) -> None:
    """The verdicts as a table, one row per entry, anchor, task and step."""
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[field.name for field in dataclasses.fields(Comparison)])
        writer.writeheader()
        writer.writerows(dataclasses.asdict(c) for c in found)


def plot_task(path: Path, task: TaskAnchors, reps: int = 2_000) -> None:
    """keelrl's entries solid, the compared anchors dashed, each a mean with its shaded bootstrap 95% interval;
    an anchor with fewer than MIN_VERDICT_SEEDS seeds as points, one per seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    budget = max(r.budget for runs in task.runs.values() for r in runs) * task.repeat
    colours = iter(f"C{i}" for i in range(len(COMPARED), 10))  # C0-C2 are the anchors' own
    for entry, runs in task.runs.items():
        curves = [dict(r.curve) for r in runs if run_outcome(r) == FINISHED and r.curve]
        if curves:
            steps = sorted(set.intersection(*(set(c) for c in curves)))
            _band(ax, [s * task.repeat for s in steps], [np.asarray([c[s] for c in curves]) for s in steps],
                  f"keelrl {entry} ({len(curves)})", "-", next(colours), reps)
    for anchor in (a for a in task.anchors if a.algorithm in COMPARED):
        steps = [s for s in anchor.returns if s <= budget]
        many = [s for s in steps if anchor.seeds_at(s).size >= MIN_VERDICT_SEEDS]
        colour = f"C{COMPARED.index(anchor.algorithm)}"
        if many:
            _band(ax, many, [anchor.seeds_at(s) for s in many], f"{anchor.algorithm} (published)", "--", colour, reps)
        few = [(s, v) for s in steps if anchor.seeds_at(s).size < MIN_VERDICT_SEEDS for v in anchor.seeds_at(s)]
        if few:
            ax.scatter(*zip(*few), marker="x", color=colour, label=f"{anchor.algorithm} (published, per seed)")
    ax.set_title(f"{task.task}: keelrl solid, published dashed (95% CI shaded)", fontsize=10)
    ax.set_xlabel("environment steps" if task.repeat == 1 else f"simulator steps (keelrl's steps × {task.repeat})")
    ax.set_ylabel("evaluation return")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _band(ax, steps: list[int], values: list[np.ndarray], label: str, style: str, colour: str, reps: int) -> None:
    """A mean line with its bootstrap interval shaded (per step, the seeds resampled with replacement)."""
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    means = np.asarray([v.mean() for v in values])
    tail = 100.0 * (1.0 - CONFIDENCE) / 2.0
    intervals = np.asarray([np.percentile(v[rng.integers(0, v.size, size=(reps, v.size))].mean(axis=1),
                                          [tail, 100.0 - tail]) for v in values])  # (steps, 2)
    ax.plot(steps, means, style, color=colour, label=label)
    ax.fill_between(steps, intervals[:, 0], intervals[:, 1], color=colour, alpha=0.2)
