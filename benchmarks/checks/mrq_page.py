"""benchmarks/results/mrq.md and mrq_hopper.png: keelrl's MR.Q on Hopper-v4 beside the published MR.Q's seeds and
keelrl's own SAC at the same steps (issue 61).

    python -m keelrl.benchmarks.checks.mrq_page [--results benchmarks/results/leaderboard] \
        [--output benchmarks/results/mrq.md]

Reads committed files only: the leaderboard tables mrq-hopper_runs.csv and _curves.csv (keelrl's MR.Q: every
seed's evaluation every 10k steps, a seed still running up to where it got, and the runs' provenance),
online-full_runs.csv and _curves.csv (keelrl's SAC on Hopper-v4) and the published per-seed curves
(benchmarks/anchors/published_curves.csv through keelrl.benchmarks.anchors). At each step where the published MR.Q
has seeds within the budget: with 3 or more keelrl seeds there, anchors.compare's bootstrap verdict; with 1 or 2,
whether each seed lies within the published seeds' range. Writes the page with no date, so the same files make
the same page.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np

from keelrl.agents.harness.options import parse_command_line
from keelrl.agents.mrq import MRQConfig
from keelrl.benchmarks.aggregate import FINISHED, RunResult, run_outcome, steps_text
from keelrl.benchmarks.anchors import Anchor, compare, load_anchors
from keelrl.benchmarks.leaderboard.cli import Args as LeaderboardArgs
from keelrl.benchmarks.report import read_runs_tables

TASK = "Hopper-v4"
GRID, SAC_GRID = "mrq-hopper", "online-full"
UPDATE_MS = {"fp32": 312, "bf16": 179}
"""one MR.Q update on one core of an AMD EPYC with avx512_bf16, from the message of commit COST_COMMIT"""
COST_COMMIT = "42f807d"
BUDGET_HOURS = 12
"""the core-hours issue 61 gives the Hopper-v4 seeds"""
MIN_BOOTSTRAP_SEEDS = 3
REPS = LeaderboardArgs.bootstrap_reps
"""bootstrap resamples of the verdict: the leaderboard's"""
CELLS_COMMAND = ("taskset -c 1 python -m keelrl.benchmarks.leaderboard --grid mrq-hopper --workers 1 --runs-dir RUNS "
                 "--from-committed")
PAGE_COMMAND = "python -m keelrl.benchmarks.checks.mrq_page"
REFERENCE_CHECK = (
    "The reference is facebookresearch/MRQ at 8a44a7d (CC BY-NC 4.0: read for facts, run only from a scratch "
    "folder, none of it in keelrl). Its own encoder, value and policy classes were loaded with seed 1's weights at "
    "73.5k steps and fed that run's own replay batch in fp32: zs, zsa, the policy and the model's outputs are "
    "identical, Q within 2e-5 (of about 47), the encoder loss's gradients within 2.8e-6 (relative; 38 of the 256 "
    "five-step windows cross a termination), the 3-step reward sums identical, the TD target within 3e-5, the "
    "critic's gradient within 4e-6, the policy's identical, the LAP priorities within 1e-5. Every hyperparameter "
    "of the paper's table matches. What differs:")
REFERENCE_DIFFERENCES = (
    "Precision: the cells run bf16 autocast (the grid's fixed precision), the reference fp32. On the same checkpoint "
    "bf16 moves Q by 0.12 on average (up to 5, of about 63) and leaves the critic's, policy's and encoder's "
    "gradients at cosine 0.98-0.998 of fp32's, where two fp32 minibatches are at 0.25 (critic) and -0.5 to 0.27 "
    "(policy): small beside minibatch noise, but a systematic effect is not ruled out without an fp32 run.",
    "The LAP priorities of the code the results were published with (98e95b6, whose commit holds results/): its "
    "critic-and-policy step returns the Q of the policy's action after the critic's step, so a row's priority is "
    "max_i |Q_i(s, π(s)) − y|, not the TD error of the stored action; b1f387e (2025-01-29) renamed the policy's Q "
    "so that the priority is the TD error, as in the paper and in keelrl. So the published curves sampled their "
    "replay by another priority than keelrl's and the reference's HEAD; which way that moves Hopper is not measured.",
    "The n-step return at a termination: keelrl sums the rewards up to and including the terminal one (as the "
    "commit that published the results, 98e95b6, did); the reference's HEAD drops the terminal reward, and both of "
    "its versions add the next episode's first reward × γ² through a padding row. At most 3 transitions of each "
    "terminated episode.",
    "Sampling: the reference never samples the last 5 rows of the running episode or a window that meets a "
    "truncation; keelrl samples every row and masks (3 truncations in seed 1's run).",
    "The reward scale's mean |r| counts one zero-reward padding row per episode in the reference (1.3% smaller "
    "here); its random phase, counted in rows, ends after about 9.55k environment steps, keelrl's after 10k.",
    "Evaluation every 10k steps on fresh environments (the reference: every 5k on one environment); the runs were "
    "stopped by SIGTERM and resumed, which ends the running episodes as truncations. Neither changes an update.",
)


@dataclasses.dataclass
class PageArgs:
    results: str = "benchmarks/results/leaderboard"
    """folder of the leaderboard's committed tables"""
    output: str = "benchmarks/results/mrq.md"
    """the page (mrq_hopper.png is written beside it)"""


def runs_of(results: Path, name: str, agent: str) -> list[RunResult]:
    return sorted((r for r in read_runs_tables(results, name) if r.agent == agent and r.task == TASK),
                  key=lambda r: r.seed)


def option(run: RunResult, name: str) -> str:
    words = run.options.split()
    return words[words.index(f"--{name}") + 1]


def at(run: RunResult, step: int) -> float | None:
    return dict(run.curve).get(step)


def reached(runs: list[RunResult], step: int) -> np.ndarray:
    return np.asarray([at(r, step) for r in runs if at(r, step) is not None])


def num(value: float | None, missing: str = "–") -> str:
    return missing if value is None else f"{value:.1f}"


def spread(values: np.ndarray) -> str:
    """mean ± std (ddof 0) of two or more seeds, one seed's value with its count, '–' for none."""
    if values.size < 2:
        return f"{values[0]:.1f} (1 seed)" if values.size else "–"
    return f"{values.mean():.1f} ± {values.std():.1f}"


def state(run: RunResult) -> str:
    if run_outcome(run) == FINISHED:
        return f"seed {run.seed} finished at {steps_text(run.steps)}"
    if not run.curve:
        return f"seed {run.seed} not started"
    return f"seed {run.seed} unfinished, last evaluation at {steps_text(run.curve[-1][0])}"


def header(mrq: list[RunResult], sac: list[RunResult], results: str) -> list[str]:
    first = mrq[0]
    machines = sorted({r.machine for r in mrq if r.machine}) or ["not recorded"]
    sac_machines = sorted({r.machine for r in sac if r.machine})
    return ["# MR.Q on Hopper-v4: first learning evidence", "",
            "MR.Q (Fujimoto et al., \"Towards General-Purpose Model-Free Reinforcement Learning\", ICLR 2025): "
            "model-free TD learning on state and state-action embeddings trained by a model's losses (agents/mrq.py).",
            "", f"- Grid: benchmarks/grids/{GRID}.toml: {TASK}, {steps_text(first.budget)} environment steps, "
            f"{len(mrq)} seeds planned, {option(first, 'precision')}, evaluation every "
            f"{steps_text(int(option(first, 'eval-freq')))} steps ({option(first, 'eval-episodes')} episodes).",
            f"- Cells: `{CELLS_COMMAND}`", f"- This page: `{PAGE_COMMAND}`, from {results}/{GRID}_runs.csv and "
            f"_curves.csv, {results}/{SAC_GRID}_runs.csv and _curves.csv, benchmarks/anchors/published_curves.csv.",
            f"- keelrl MR.Q runs made on: {'; '.join(machines)}.", f"- Seeds: {'; '.join(state(r) for r in mrq)}.",
            f"- keelrl SAC ({SAC_GRID}'s {TASK} cells, CleanRL's defaults, {option(sac[0], 'precision')}, "
            f"{len(sac)} seeds to {steps_text(sac[0].budget)}): {'; '.join(sac_machines)}.",
            "- Published: per-seed curves from the SimbaV2 repository's baseline results "
            "(benchmarks/anchors/README.md). Mean ± std with ddof 0 throughout."]


def cost(mrq: list[RunResult]) -> list[str]:
    updates = mrq[0].budget - MRQConfig.learning_starts
    hours = {p: updates * ms / 1000 / 3600 for p, ms in UPDATE_MS.items()}
    finished = [r for r in mrq if run_outcome(r) == FINISHED and np.isfinite(r.sps)]
    measured = [f"seed {r.seed}: {r.sps:.2f} steps/s, {r.wall_s / 3600:.1f} h" for r in finished]
    lines = ["## Cost", "", f"One update takes {UPDATE_MS['fp32']} ms in fp32 and {UPDATE_MS['bf16']} ms in bf16 on "
              f"one core of an AMD EPYC with avx512_bf16 (the figure is the message of commit {COST_COMMIT}; "
              "benchmarks/perf/update_time.py does not time MR.Q). One update per step after the "
              f"{steps_text(MRQConfig.learning_starts)} random steps: about {hours['fp32']:.1f} h in fp32 and "
              f"{hours['bf16']:.1f} h in bf16 of updates per {steps_text(mrq[0].budget)} {TASK} steps.",
              "", "Measured (finished runs, steps over wall time summed over the sessions that ran them, on a core "
              "shared at nice 19 with other runs in some of them, so an upper bound of the cost): "
              + ("; ".join(measured) or "not measured") + "."]
    if any(not r.curve for r in mrq):
        spent = sum(r.wall_s for r in finished) / 3600
        lines += ["", f"Budget: the finished seeds took {spent:.1f} of the {BUDGET_HOURS} core-hours the issue "
                  f"gives; the seeds not started are left out, as another (about {hours['bf16']:.1f} h in bf16) would "
                  "pass them."]
    return lines


def side(value: float, theirs: np.ndarray) -> str:
    """Where a seed lies against the published seeds: within their range, below or above it."""
    return "within" if theirs.min() <= value <= theirs.max() else "below" if value < theirs.min() else "above"


def range_verdict(value: float, theirs: np.ndarray) -> str:
    return f"{value:.1f} {side(value, theirs)} the published range [{theirs.min():.1f}, {theirs.max():.1f}]"


def verdict(mrq: list[RunResult], anchor: Anchor, step: int) -> str:
    """keelrl's seeds at `step` against the published MR.Q's: the bootstrap verdict, or per seed its range."""
    ours = reached(mrq, step)
    if ours.size >= MIN_BOOTSTRAP_SEEDS:
        c = compare("mrq", ours, anchor, TASK, step, REPS)
        if np.isnan(c.difference):
            return c.verdict
        return (f"**{c.verdict}** (keelrl − published {c.difference:+.1f}, bootstrap 95% CI [{c.low:+.1f}, "
                f"{c.high:+.1f}], {REPS} resamples, {ours.size} vs {c.anchor_seeds} seeds)")
    if ours.size:
        return "; ".join(f"seed {r.seed}: {range_verdict(at(r, step), anchor.seeds_at(step))}" for r in mrq
                         if at(r, step) is not None)
    return f"no finished seed yet (none has reached {steps_text(step)})"


def published_row(name: str, values: np.ndarray) -> str:
    return f"| published {name} | {values.size} | – | {spread(values)} | {values.min():.1f}–{values.max():.1f} |"


def keelrl_row(name: str, runs: list[RunResult], step: int) -> str:
    values = reached(runs, step)
    seeds = ", ".join(f"{r.seed}: {num(at(r, step), 'not reached')}" for r in runs)
    span = f"{values.min():.1f}–{values.max():.1f}" if values.size else "–"
    return f"| keelrl {name} | {values.size} of {len(runs)} | {seeds} | {spread(values)} | {span} |"


def step_section(step: int, mrq: list[RunResult], sac: list[RunResult], published: dict[str, Anchor]) -> list[str]:
    return [f"## At {steps_text(step)} steps", "", "| who | seeds | per seed | mean ± std | min–max |",
            "|---|---|---|---|---|", keelrl_row("MR.Q", mrq, step),
            published_row("MR.Q", published["MR.Q"].seeds_at(step)), keelrl_row("SAC", sac, step),
            published_row("SAC", published["SAC"].seeds_at(step)), "",
            f"keelrl MR.Q against the published MR.Q: {verdict(mrq, published['MR.Q'], step)}."]


def curve_table(mrq: list[RunResult], sac: list[RunResult], steps: list[int]) -> list[str]:
    names = [f"MR.Q seed {r.seed}" for r in mrq] + ["MR.Q mean ± std"] + [f"SAC seed {r.seed}" for r in sac]
    lines = ["## Every evaluation", "", "| step | " + " | ".join(names) + " | SAC mean ± std |",
             "|---|" + "---|" * (len(names) + 1)]
    for step in steps:
        cells = [num(at(r, step)) for r in mrq] + [spread(reached(mrq, step))] + [num(at(r, step)) for r in sac]
        lines.append(f"| {steps_text(step)} | " + " | ".join(cells) + f" | {spread(reached(sac, step))} |")
    return lines


def goal(mrq: list[RunResult], anchor: Anchor, step: int) -> str:
    """Whether keelrl's MR.Q matches the published MR.Q at the budget (or every seed lies within its range)."""
    ours, where = reached(mrq, step), steps_text(step)
    if not ours.size:
        return f"Goal (matches the published MR.Q at {where}): cannot be judged yet, no seed has reached {where}."
    if ours.size >= MIN_BOOTSTRAP_SEEDS:
        c = compare("mrq", ours, anchor, TASK, step, REPS)
        judged = "cannot be judged, " + c.verdict if np.isnan(c.difference) else "holds." if c.verdict == "matches" \
            else f"missed ({c.verdict}); compared with the reference below."
        return f"Goal (matches the published MR.Q at {where}): {judged}"
    out = [r.seed for r in mrq if at(r, step) is not None and side(at(r, step), anchor.seeds_at(step)) != "within"]
    if out:
        return (f"Goal (every seed within the published MR.Q's range at {where}): missed (seeds {out} outside); "
                "compared with the reference below.")
    return (f"Goal (every seed within the published MR.Q's range at {where}): holds for the {ours.size} seed(s) "
            f"there, {len(mrq) - ours.size} of {len(mrq)} planned still to come.")


def plot(path: Path, mrq: list[RunResult], sac: list[RunResult], published: dict[str, Anchor], steps: list[int],
         budget: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for r in mrq:
        if r.curve:
            ax.plot(*zip(*r.curve), color="C0", lw=1, alpha=0.7, label=f"keelrl MR.Q seed {r.seed}")
    sac_steps = [s for s in sorted({s for r in sac for s, _ in r.curve}) if s <= budget]
    ax.plot(sac_steps, [reached(sac, s).mean() for s in sac_steps], color="C1", lw=2, label="keelrl SAC (mean)")
    for name, colour, shift in (("MR.Q", "C0", -1000), ("SAC", "C1", 1000)):
        for step in steps:
            seeds = published[name].seeds_at(step)
            ax.scatter(np.full(seeds.size, step + shift), seeds, marker="x", color=colour, alpha=0.5)
            ax.scatter([step + shift], [seeds.mean()], marker="o", s=60, color=colour, edgecolor="black",
                       label=f"published {name} (seeds ×, mean ●)" if step == steps[0] else None)
    ax.set(xlabel="environment steps", ylabel="evaluation return", title=f"{TASK}: keelrl MR.Q beside published")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def build_page(results: str, anchors: dict[str, list[Anchor]], figure: Path | None = None) -> str:
    """The page's text from the tables in `results` and the anchors; the PNG at `figure` when given."""
    mrq, sac = runs_of(Path(results), GRID, "mrq"), runs_of(Path(results), SAC_GRID, "sac")
    if not mrq or not sac:
        raise FileNotFoundError(f"{results}: no {GRID} MR.Q or {SAC_GRID} SAC {TASK} runs in the tables")
    published = {a.algorithm: a for a in anchors[TASK]}
    budget = mrq[0].budget
    steps = [s for s in published["MR.Q"].returns if s <= budget]
    lines = header(mrq, sac, results) + ["", *cost(mrq)]
    for step in steps:
        lines += ["", *step_section(step, mrq, sac, published)]
    every = int(option(mrq[0], "eval-freq"))
    evaluations = list(range(every, budget + 1, every))
    lines += ["", goal(mrq, published["MR.Q"], budget), "", *curve_table(mrq, sac, evaluations)]
    if figure is not None:
        plot(figure, mrq, sac, published, steps, budget)
        lines += ["", f"![{TASK}: keelrl MR.Q seeds, keelrl SAC's mean, the published seeds]({figure.name})"]
    lines += ["", "## Compared with the reference, line by line", "", REFERENCE_CHECK, "",
              *(f"- {d}" for d in REFERENCE_DIFFERENCES)]
    return "\n".join(lines) + "\n"


def write_page(args: PageArgs, anchors: dict[str, list[Anchor]] | None = None) -> None:
    output = Path(args.output)
    figure = output.with_name("mrq_hopper.png")
    output.write_text(build_page(args.results, load_anchors() if anchors is None else anchors, figure))
    print(f"wrote {output} and {figure}")


if __name__ == "__main__":
    write_page(parse_command_line(PageArgs, sys.argv[1:]))
