"""Summarise finished runs as a Markdown table: keelrl run directories and, beside them, CleanRL's.

    python -m keelrl.benchmarks.checks.summarize_runs --keelrl runs/Hopper-v5__sac__* \
        --cleanrl ../cleanrl/runs/Hopper-v5__* --curves hopper.png
    python -m keelrl.benchmarks.checks.summarize_runs --keelrl bf16/*/ --keelrl-label "keelrl bf16" \
        --variant fp32/*/ --variant-label "keelrl fp32" --windows --bin 50000

For each run: the final evaluation return and episode cost (keelrl's eval.csv, cost 0 on a task
without one; CleanRL's eval.csv where the scratch copy wrote one, else none: CleanRL's scripts do not
evaluate), the mean return of the last `--last-episodes` training episodes (keelrl's episodes.csv;
CleanRL's `charts/episodic_return` TensorBoard scalar), and steps/s (keelrl: the last `charts/SPS`,
evaluations and checkpoints left out; CleanRL: its summary.json where the scratch copy wrote one, else its
last `charts/SPS`), then mean ± std over the runs of each group. `--variant` adds a second group of keelrl runs
(the same task in another setting: precision, seed batching). `--windows` prints each run's mean training return
per `--bin`-step window; `--curves` draws the training episodes' returns of every group (mean over runs of
`--bin`-step bins). With CleanRL's runs beside keelrl's, each keelrl group's last training episodes are set
against CleanRL's: the difference of the means with the leaderboard's bootstrap interval and verdict
(benchmarks/anchors.py), and how many (keelrl run, CleanRL run) pairs keelrl's run ends higher in, with the
chance of a count as far from half the pairs, either way, if the two groups' runs were alike (over every split of
the pooled runs, or 100,000 random ones).
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
import json
import math
import sys
from pathlib import Path

import numpy as np

from keelrl.agents.harness.logs import EPISODES_FILE, EVAL_FILE
from keelrl.agents.harness.options import parse_command_line
from keelrl.benchmarks.anchors import BOOTSTRAP_SEED, CONFIDENCE, difference_interval, verdict


CLEANRL = "CleanRL"
"""the --cleanrl group's name in the tables and curves"""
MAX_SPLITS = 100_000
"""splits of the pooled runs counted exactly, or drawn at random beyond (against_cleanrl)"""


@dataclasses.dataclass
class Args:
    keelrl: tuple[Path, ...] = ()
    """keelrl run directories (with eval.csv and episodes.csv)"""
    keelrl_label: str = "keelrl"
    """the --keelrl group's name in the tables and curves"""
    variant: tuple[Path, ...] = ()
    """a second group of keelrl run directories: the same task in another setting"""
    variant_label: str = "keelrl variant"
    """the --variant group's name in the tables and curves"""
    cleanrl: tuple[Path, ...] = ()
    """CleanRL run directories (with TensorBoard events)"""
    last_episodes: int = 10
    """training episodes averaged for the 'last training episodes' column (CleanRL's published tables average
    each run's last 100: pass 100 to set runs beside them)"""
    curves: Path | None = None
    """draw the training returns of every group into this PNG"""
    bin: int = 20_000
    """steps per bin of the curves and windows"""
    windows: bool = False
    """also print each run's mean training return in each --bin-step window"""
    bootstrap_reps: int = 10_000
    """resamples of the bootstrap interval of the difference against CleanRL"""


@dataclasses.dataclass
class RunSummary:
    name: str
    final_eval: float
    last_train: float
    last_step: int
    final_cost: float = float("nan")
    """mean episode cost of the final evaluation (0 on a task without cost; NaN for CleanRL)"""
    sps: float = float("nan")
    episodes: list[tuple[int, float]] = dataclasses.field(default_factory=list)
    """(global step, return) of every training episode"""


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def scalars(run_dir: Path, tag: str) -> list:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    return events.Scalars(tag) if tag in events.Tags()["scalars"] else []


def check_run_dir(run_dir: Path, group: str) -> None:
    """ValueError, in one line, for a --keelrl/--cleanrl path that is not a directory."""
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"--{group} {run_dir}: a file, not a run directory")
    if not run_dir.exists():
        matched = "a glob that matched nothing is passed on as written" if "*" in str(run_dir) else "no such directory"
        raise ValueError(f"--{group} {run_dir}: not a run directory ({matched})")


def summarize_keelrl(run_dir: Path, last_episodes: int, group: str = "keelrl") -> RunSummary:
    """One keelrl run; `group`: the option that named it (keelrl or variant), for the error message."""
    check_run_dir(run_dir, group)
    if not (run_dir / EVAL_FILE).is_file() or not (run_dir / EPISODES_FILE).is_file():
        raise ValueError(f"--{group} {run_dir}: no eval.csv and episodes.csv there (not a keelrl run directory)")
    evaluations = read_csv(run_dir / EVAL_FILE)
    if not evaluations:
        raise ValueError(f"--{group} {run_dir}: no evaluation in its eval.csv yet (a run still before its first "
                         "evaluation)")
    final = evaluations[-1]
    episodes = [(int(row["global_step"]), float(row["return"])) for row in read_csv(run_dir / EPISODES_FILE)]
    speeds = scalars(run_dir, "charts/SPS")
    last_train = float(np.mean([r for _, r in episodes[-last_episodes:]])) if episodes else float("nan")  # offline
    return RunSummary(run_dir.name, float(final["mean_return"]), last_train, int(final["global_step"]),
                      float(final["mean_cost"]), speeds[-1].value if speeds else float("nan"), episodes)


def summarize_cleanrl(run_dir: Path, last_episodes: int) -> RunSummary:
    check_run_dir(run_dir, "cleanrl")
    episodes = [(event.step, event.value) for event in scalars(run_dir, "charts/episodic_return")]
    if not episodes:
        raise ValueError(f"--cleanrl {run_dir}: no charts/episodic_return in TensorBoard events there (not a "
                         "CleanRL run directory, or one before its first episode ended)")
    evaluations = read_csv(run_dir / EVAL_FILE) if (run_dir / EVAL_FILE).is_file() else []
    final_eval = float(evaluations[-1]["mean_return"]) if evaluations else float("nan")
    if (run_dir / "summary.json").is_file():
        sps = json.loads((run_dir / "summary.json").read_text())["sps"]
    else:
        speeds = scalars(run_dir, "charts/SPS")
        sps = speeds[-1].value if speeds else float("nan")
    return RunSummary(run_dir.name, final_eval, float(np.mean([r for _, r in episodes[-last_episodes:]])),
                      episodes[-1][0], sps=sps, episodes=episodes)


def table(title: str, runs: list[RunSummary]) -> str:
    lines = [f"**{title}**", "",
             "| run | last step | final eval return | final eval cost | last training episodes | steps/s |",
             "|---|---|---|---|---|---|"]
    for run in runs:
        lines.append(f"| {run.name} | {run.last_step} | {run.final_eval:.1f} | {run.final_cost:.1f} | "
                     f"{run.last_train:.1f} | {run.sps:.0f} |")
    lines.append(f"| mean ± std (ddof 0, {len(runs)} runs) | | {mean_std([r.final_eval for r in runs])} | "
                 f"{mean_std([r.final_cost for r in runs])} | {mean_std([r.last_train for r in runs])} | "
                 f"{mean_std([r.sps for r in runs], 0)} |")
    return "\n".join(lines)


def against_cleanrl(groups: dict[str, list[RunSummary]], last_episodes: int, reps: int) -> str:
    """Each keelrl group's mean of its runs' last training episodes against CleanRL's group: the difference of the
    means and its bootstrap interval and verdict, the (keelrl run, CleanRL run) pairs in which keelrl's ends higher
    (a tie counts half), and the chance of a count as far from half of them, either way, were both groups' runs
    alike."""
    theirs = np.array([run.last_train for run in groups[CLEANRL]])
    lines = [f"**against CleanRL: mean of the last {last_episodes} training episodes**", "",
             f"| group | runs | difference of means | bootstrap {CONFIDENCE:.0%} interval | verdict | pairs where "
             "keelrl ends higher | chance of a count as far from half, runs alike |", "|---|---|---|---|---|---|---|"]
    for name, runs in groups.items():
        if name == CLEANRL:
            continue
        ours = np.array([run.last_train for run in runs])
        difference, low, high = difference_interval(ours, theirs, reps)
        higher = pairs_higher(ours, theirs)
        lines.append(f"| {name} | {ours.size} and {theirs.size} | {difference:+.1f} | [{low:+.1f}, {high:+.1f}] | "
                     f"{verdict(low, high)} | {higher:g} of {ours.size * theirs.size} | "
                     f"{chance_of_as_uneven_pairs(ours, theirs):.3f} |")
    return "\n".join(lines)


def pairs_higher(ours: np.ndarray, theirs: np.ndarray) -> float:
    """Pairs (one of ours, one of theirs) where ours is higher, a tie counting half (the Mann-Whitney U)."""
    return float((ours[:, None] > theirs[None, :]).sum() + 0.5 * (ours[:, None] == theirs[None, :]).sum())


def chance_of_as_uneven_pairs(ours: np.ndarray, theirs: np.ndarray) -> float:
    """The share of the ways to split the pooled runs into groups of these sizes whose higher-pair count is at least
    as far from half the pairs as ours (two-sided): every split counted where there are at most MAX_SPLITS (924
    for 6 and 6), else MAX_SPLITS drawn at random."""
    pooled, half = np.concatenate([ours, theirs]), ours.size * theirs.size / 2
    distance = abs(pairs_higher(ours, theirs) - half)
    splits = math.comb(pooled.size, ours.size)
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    chosen_sets = itertools.combinations(range(pooled.size), ours.size) if splits <= MAX_SPLITS else \
        (rng.choice(pooled.size, ours.size, replace=False) for _ in range(MAX_SPLITS))
    masks = (split_mask(pooled.size, chosen) for chosen in chosen_sets)
    as_uneven = sum(abs(pairs_higher(pooled[mask], pooled[~mask]) - half) >= distance for mask in masks)
    return as_uneven / min(splits, MAX_SPLITS)


def split_mask(size: int, chosen: tuple[int, ...] | np.ndarray) -> np.ndarray:
    """(size,) True at the `chosen` indices."""
    mask = np.zeros(size, bool)
    mask[list(chosen)] = True
    return mask


def mean_std(values: list[float], digits: int = 1) -> str:
    return f"{np.mean(values):.{digits}f} ± {np.std(values):.{digits}f}"


def returns_per_bin(runs: list[RunSummary], bin_steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Bin ends (steps) (W,), and each run's mean return of the training episodes ending in each bin (R, W) (NaN
    where none ends there)."""
    last = max(step for run in runs for step, _ in run.episodes)
    ends = np.arange(bin_steps, last + bin_steps, bin_steps)
    per_run = np.full((len(runs), len(ends)), np.nan)
    for i, run in enumerate(runs):
        steps, returns = np.array(run.episodes).T
        which = np.minimum((steps - 1) // bin_steps, len(ends) - 1).astype(int)
        for b in np.unique(which):
            per_run[i, b] = returns[which == b].mean()
    return ends, per_run


def binned_returns(runs: list[RunSummary], bin_steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bin ends (steps), and the mean and std over runs of each run's mean training return in the bin."""
    ends, per_run = returns_per_bin(runs, bin_steps)
    return ends, np.nanmean(per_run, 0), np.nanstd(per_run, 0)


def windows_table(groups: dict[str, list[RunSummary]], bin_steps: int) -> str:
    """Each run's mean training return in each `bin_steps` window, a row per run, every group's on one grid."""
    runs = [run for group in groups.values() for run in group]
    ends, per_run = returns_per_bin(runs, bin_steps)
    names = [f"{_steps(end - bin_steps)}–{_steps(end)}" for end in ends]
    lines = [f"**mean training return per {_steps(bin_steps)}-step window**", "",
             "| group | run | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    groups_of_runs = [name for name, group in groups.items() for _ in group]
    for group, run, row in zip(groups_of_runs, runs, per_run):
        lines.append(f"| {group} | {run.name} | " + " | ".join(f"{value:.0f}" for value in row) + " |")
    return "\n".join(lines)


def _steps(count: int) -> str:
    return f"{count // 1000}k" if count % 1000 == 0 and count else str(count)


def draw_curves(groups: dict[str, list[RunSummary]], bin_steps: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, runs in groups.items():
        ends, mean, std = binned_returns(runs, bin_steps)
        ax.plot(ends, mean, label=f"{name} ({len(runs)} runs)")
        ax.fill_between(ends, mean - std, mean + std, alpha=0.2)
    ax.set_xlabel("environment steps")
    ax.set_ylabel(f"training episode return (mean of {bin_steps // 1000}k-step bins)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    args = parse_command_line(Args, args=argv)
    if not args.keelrl and not args.cleanrl and not args.variant:
        print("error: no runs to summarise: give --keelrl, --variant and/or --cleanrl run directories",
              file=sys.stderr)
        return 2
    try:
        summarize(args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def summarize(args: Args) -> None:
    groups = {}
    if args.keelrl:
        groups[args.keelrl_label] = [summarize_keelrl(d, args.last_episodes) for d in sorted(args.keelrl)]
    if args.variant:
        groups[args.variant_label] = [summarize_keelrl(d, args.last_episodes, "variant")
                                      for d in sorted(args.variant)]
    if args.cleanrl:
        groups[CLEANRL] = [summarize_cleanrl(d, args.last_episodes) for d in sorted(args.cleanrl)]
    untrained = [run.name for runs in groups.values() for run in runs if not run.episodes]
    for option, wanted, verb in (("--curves", args.curves is not None, "draw"), ("--windows", args.windows, "average")):
        if wanted and untrained:  # an offline run, or one before its first episode ended
            raise ValueError(f"{option}: no training episodes to {verb} in {', '.join(untrained)}")
    print("\n\n".join(table(name, runs) for name, runs in groups.items()))
    if CLEANRL in groups and len(groups) > 1:
        print("\n" + against_cleanrl(groups, args.last_episodes, args.bootstrap_reps))
    if args.windows:
        print("\n" + windows_table(groups, args.bin))
    if args.curves is not None:
        draw_curves(groups, args.bin, args.curves)


if __name__ == "__main__":
    raise SystemExit(main())
