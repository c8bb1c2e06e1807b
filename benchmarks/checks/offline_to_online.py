"""Offline-to-online results of a leaderboard grid: the pre-training's offline scores, then each fine-tuning entry's
evaluations early and late, and its curves with the first online steps drawn large (where fine-tuning without
offline data collapses, and what WSRL's warm-up prevents).

    python -m keelrl.benchmarks.checks.offline_to_online --grid cpu-evidence-wsrl \
        --curves benchmarks/results/wsrl_hopper.png > table.md

Reads the grid's cells under --runs-dir (the leaderboard's layout): the entries that fine-tune another entry's
runs (`pretrained = ...`) and the online entries beside them, every finished or unfinished run with an eval.csv.
Normalised scores use the pre-training dataset's reference returns (its dataset.json), for every entry alike.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from keelrl.agents.harness.logs import EPISODES_FILE, EVAL_FILE
from keelrl.agents.harness.options import parse_command_line
from keelrl.agents.harness.run_directory import DATASET_FILE
from keelrl.benchmarks.checks.summarize_runs import read_csv
from keelrl.benchmarks.leaderboard import Cell, Grid, expand, load_grid


@dataclasses.dataclass
class Args:
    grid: str = "cpu-evidence-wsrl"
    """the leaderboard grid (a preset name or a TOML file)"""
    runs_dir: Path = Path("runs/leaderboard")
    """the leaderboard's --runs-dir"""
    early: int = 10_000
    """online steps of the early window (its lowest evaluation is reported, and the zoomed panel shows it)"""
    late: int = 10_000
    """online steps before each run's last evaluation whose evaluations are averaged (steadier than the last alone)"""
    bin: int = 1_000
    """steps per bin of the zoomed panel's training returns"""
    curves: Path | None = None
    """draw the curves into this PNG"""


@dataclasses.dataclass
class Curves:
    """One run's evaluations and training episodes."""

    seed: int
    evals: list[tuple[int, float]]
    episodes: list[tuple[int, float]]


def read_curves(cell: Cell) -> Curves | None:
    """The cell's run's eval.csv and episodes.csv (None: no run with an evaluation yet)."""
    run_dirs = cell.run_dirs()
    run_dir = cell.state()[1] or (run_dirs[0] if run_dirs else None)
    if run_dir is None or not (run_dir / EVAL_FILE).is_file():
        return None
    evals = [(int(r["global_step"]), float(r["mean_return"])) for r in read_csv(run_dir / EVAL_FILE)]
    episodes_file = run_dir / EPISODES_FILE
    episodes = [(int(r["global_step"]), float(r["return"])) for r in read_csv(episodes_file)] \
        if episodes_file.is_file() else []
    return Curves(cell.seed, evals, episodes) if evals else None


def score(value: float, refs: tuple[float, float]) -> float:
    return 100.0 * (value - refs[0]) / (refs[1] - refs[0])


def at_step(curves: Curves, step: int) -> float:
    """The evaluation at `step` (NaN when the run has none there)."""
    return next((value for s, value in curves.evals if s == step), float("nan"))


def mean_std(values: list[float], refs: tuple[float, float] | None) -> str:
    values = [v for v in values if np.isfinite(v)]
    if not values:
        return "–"
    text = f"{np.mean(values):.1f} ± {np.std(values):.1f}"
    if refs is not None:
        scores = [score(v, refs) for v in values]
        text += f" ({np.mean(scores):.1f} ± {np.std(scores):.1f})"
    return text


def late_mean(curves: Curves, late: int) -> float:
    """The mean of the run's evaluations from `late` steps before its last one to the last one."""
    last_step = curves.evals[-1][0]
    return float(np.mean([value for step, value in curves.evals if step >= last_step - late]))


def online_table(groups: dict[str, list[Curves]], refs: tuple[float, float] | None, early: int,
                 late: int) -> list[str]:
    """Per fine-tuning or online entry: seeds, the evaluation at step 0, the lowest in the first `early` steps, at
    `early`, the last, and the mean of each run's evaluations over its last `late` steps; return (normalised score),
    mean ± std over seeds."""
    header = ["entry", "seeds", "online step 0", f"lowest in steps 0–{early // 1000}k", f"at {early // 1000}k",
              "last evaluation", f"mean over the last {late // 1000}k", "last step"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, runs in groups.items():
        lowest = [min(v for s, v in run.evals if s <= early) for run in runs]
        last_steps = sorted({run.evals[-1][0] for run in runs})
        lines.append("| " + " | ".join([
            name, str(len(runs)), mean_std([at_step(run, 0) for run in runs], refs), mean_std(lowest, refs),
            mean_std([at_step(run, early) for run in runs], refs), mean_std([run.evals[-1][1] for run in runs], refs),
            mean_std([late_mean(run, late) for run in runs], refs), ", ".join(map(str, last_steps))]) + " |")
    return lines


def binned(runs: list[Curves], bin_steps: int, end: int) -> tuple[np.ndarray, np.ndarray]:
    """Bin centres and the mean training return per bin over all runs' episodes ending in it (NaN: none)."""
    edges = np.arange(0, end + bin_steps, bin_steps)
    steps = np.array([s for run in runs for s, _ in run.episodes])
    returns = np.array([r for run in runs for _, r in run.episodes])
    means = [returns[(steps > lo) & (steps <= hi)].mean() if ((steps > lo) & (steps <= hi)).any() else np.nan
             for lo, hi in zip(edges[:-1], edges[1:])]
    return (edges[:-1] + edges[1:]) / 2, np.array(means)


def draw(groups: dict[str, list[Curves]], early: int, bin_steps: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (whole, zoom) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, runs in groups.items():
        steps = sorted({s for run in runs for s, _ in run.evals})
        values = np.array([[at_step(run, s) for s in steps] for run in runs])
        mean, std = np.nanmean(values, 0), np.nanstd(values, 0)
        line, = whole.plot(steps, mean, label=name)
        whole.fill_between(steps, mean - std, mean + std, alpha=0.2, color=line.get_color())
        inside = np.array(steps) <= early
        zoom.plot(np.array(steps)[inside], mean[inside], "o-", color=line.get_color(), label=f"{name}: evaluation")
        centres, train = binned(runs, bin_steps, early)
        zoom.plot(centres, train, ":", color=line.get_color(), label=f"{name}: training episodes")
    whole.set(xlabel="online environment steps", ylabel="evaluation return", title="mean over seeds, band ±1 std")
    zoom.set(xlabel="online environment steps", ylabel="return",
             title=f"first {early // 1000}k steps (training returns in {bin_steps}-step bins)")
    for ax in (whole, zoom):
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary(grid: Grid, runs_dir: Path, early: int, late: int, bin_steps: int, curves_png: Path | None) -> list[str]:
    """The page's lines: the pre-training's last evaluations, then the online table (and the curves' PNG)."""
    cells = expand(grid, runs_dir)
    sources = {cell.pretrained.agent.name for cell in cells if cell.pretrained is not None}
    refs: tuple[float, float] | None = None
    lines = [f"Pre-training ({', '.join(sorted(sources))}): last evaluation of each seed, return (normalised score)",
             ""]
    for cell in (c for c in cells if c.agent.name in sources):
        curves = read_curves(cell)
        if curves is None:
            lines.append(f"- seed {cell.seed}: no evaluation yet")
            continue
        run_dir = cell.state()[1] or cell.run_dirs()[0]
        ref_scores = json.loads((run_dir / DATASET_FILE).read_text())["ref_scores"]
        refs = None if ref_scores is None else (float(ref_scores[0]), float(ref_scores[1]))
        step, value = curves.evals[-1]
        lines.append(f"- seed {cell.seed}: {value:.1f}" + (f" ({score(value, refs):.1f})" if refs else "")
                     + f" at update {step}")
    groups: dict[str, list[Curves]] = {}
    for cell in (c for c in cells if c.agent.name not in sources):
        curves = read_curves(cell)
        if curves is not None:
            groups.setdefault(cell.agent.name, []).append(curves)
    if not groups:
        return lines + ["", "No online run has evaluated yet."]
    scored = "" if refs is None else (f" (normalised score with the dataset's references {refs[0]:.1f}, "
                                      f"{refs[1]:.1f})")
    lines += ["", f"Online: evaluation return{scored}, mean ± std over seeds (std with ddof 0)", ""]
    lines += online_table(groups, refs, early, late)
    if curves_png is not None:
        draw(groups, early, bin_steps, curves_png)
    return lines


if __name__ == "__main__":
    args = parse_command_line(Args)
    print("\n".join(summary(load_grid(args.grid), args.runs_dir, args.early, args.late, args.bin, args.curves)))
