"""The results of benchmarks/checks/rlvr_trl.py: a section of benchmarks/results/rlvr.md and a PNG per task.

    python -m keelrl.benchmarks.checks.rlvr_trl page [--results benchmarks/results/rlvr_trl] [--output ...]

Made from the committed CSVs of the runs alone (`{task}_{side}_seed{seed}_run.csv` and `..._evals.csv`, side base,
keelrl or trl) and the TRL runs' GRPOConfig JSON; the other sections of the Markdown file stay as they are. Per
task: the untrained model's held-out greedy accuracy and pass@k; per side and seed the figures after the last
iteration, tokens/s, peak RSS and where the time goes; per side the mean ± sample standard deviation over seeds and
the keelrl / TRL ratios of the means; whether both sides trained on the same prompt tokens; where each side's time
goes; the issue's goals, met or missed; the known differences; the TRL GRPOConfig; commands, machine, commit. The
PNG: held-out greedy accuracy against the iteration and against the training minute, each seed thin, the mean over
seeds thick.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np

from keelrl.benchmarks.aggregate import read_csv_rows
from keelrl.benchmarks.checks.rlvr_learning import write_section
from keelrl.benchmarks.checks.rlvr_trl_settings import KNOWN_DIFFERENCES, RESULTS, Settings
from keelrl.benchmarks.checks.rlvr_trl_record import run_file

SECTION = "keelrl GRPO beside TRL's GRPOTrainer (SmolLM2-135M-Instruct)"
SIDES = {"keelrl": "keelrl", "trl": "TRL"}
COLORS = {"keelrl": "C0", "trl": "C1"}
FIGURES = {"greedy_accuracy": 2, "pass_at_1": 2, "pass_at_k": 2, "tokens_per_second": 1, "peak_rss_mb": 0,
           "seconds_per_iteration": 2, "generation_per_iteration": 2, "update_per_iteration": 2,
           "cpu_per_iteration": 2}
"""what is averaged over a side's seeds (the ratios are of these means), with the decimals the page gives it"""
START = (0.2, 0.7)
"""the untrained model's held-out greedy accuracy at which the issue's gain goal applies"""
RATIOS = ("tokens_per_second", "peak_rss_mb", "seconds_per_iteration", "generation_per_iteration",
          "update_per_iteration", "cpu_per_iteration")


@dataclasses.dataclass
class PageArgs:
    results: str = RESULTS
    """folder of the runs' CSVs (and the PNGs written beside them)"""
    output: str = "benchmarks/results/rlvr.md"
    """Markdown file whose section is replaced"""


def read_runs(results: Path) -> list[dict]:
    """Every run in the folder and its subfolders (the validation runs that chose settings): its run CSV's row
    (numbers as floats), its figures after the last iteration and per iteration, and its evaluations."""
    runs = []
    for path in sorted(results.rglob("*_run.csv")):
        run = {name: number(value) for name, value in read_csv_rows(path)[0].items()}
        run["evals"] = [{name: float(value) for name, value in row.items()}
                        for row in read_csv_rows(path.with_name(path.name.replace("_run.csv", "_evals.csv")))]
        iterations = max(run["iterations_done"], 1)
        run.update({name: run["evals"][-1][name] for name in ("greedy_accuracy", "pass_at_1", "pass_at_k")},
                   seconds_per_iteration=run["training_seconds"] / iterations,
                   generation_per_iteration=run["generation_seconds"] / iterations,
                   update_per_iteration=run["update_seconds"] / iterations,
                   cpu_per_iteration=run["training_cpu_seconds"] / iterations)
        runs.append(run)
    return runs


def number(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text


def summarize(runs: list[dict]) -> dict[str, tuple[float, float | None]]:
    """Each of FIGURES: (mean over the runs, sample standard deviation; None for one run)."""
    return {name: (float(np.mean([r[name] for r in runs])),
                   float(np.std([r[name] for r in runs], ddof=1)) if len(runs) > 1 else None) for name in FIGURES}


def ratios(keelrl: dict, trl: dict) -> dict[str, float]:
    """keelrl's mean over TRL's, for each of RATIOS."""
    return {name: keelrl[name][0] / trl[name][0] for name in RATIOS}


def mean_text(value: tuple[float, float | None], digits: int) -> str:
    mean, sd = value
    return f"{mean:,.{digits}f}" + ("" if sd is None else f" ± {sd:,.{digits}f}")


def settings_text(run: dict) -> str:
    lr = f"lr {run['learning_rate']:g} " + ("decayed linearly to 0" if run["anneal_lr"] == "True" else "constant")
    return (f"task {run['task']} (size {run['task_size']:g}, values up to {run['max_value']:g}) as chat prompts, "
            f"{run['model']}, {run['num_prompts']:g} prompts × {run['group_size']:g} completions per iteration, at "
            f"most {run['max_new_tokens']:g} new tokens, temperature {run['temperature']:g}; AdamW {lr}, weight decay "
            f"{run['weight_decay']:g}, gradient clip {run['max_grad_norm']:g}; loss {run['loss_type']} (clip "
            f"{run['clip_low']:g}/{run['clip_high']:g}, β {run['beta']:g}, advantages "
            + ("divided by the group std" if run["scale_std"] == "True" else "not divided by the group std")
            + f"); N = {run['iterations']:g} iterations; held-out: {run['eval_prompts']:g} prompts, greedy and "
            f"{run['eval_samples']:g} samples each, " + (f"every {run['eval_freq']:g} iterations" if run["eval_freq"]
                                                         else "before the first iteration and after the last")
            + f"; {run['threads']:g} torch thread(s), {run['precision']}")


def differing_settings(runs: list[dict]) -> list[str]:
    """Settings (other than the seed) whose value is not the same in every run."""
    names = [field.name for field in dataclasses.fields(Settings) if field.name != "seed"]
    return [name for name in names if len({str(run[name]) for run in runs}) > 1]


def prompt_check(keelrl: list[dict], trl: list[dict]) -> str:
    digests = {int(run["seed"]): run["prompts_sha"] for run in keelrl}
    same = [int(r["seed"]) for r in trl if digests.get(int(r["seed"])) == r["prompts_sha"]]
    other = [int(r["seed"]) for r in trl if int(r["seed"]) in digests and int(r["seed"]) not in same]
    text = f"Same prompt tokens in the same order on both sides (digests of every iteration's prompts): seeds {same}"
    return text + (f"; DIFFERENT for seeds {other}." if other else ".")


def run_table(runs: list[dict], k: int) -> list[str]:
    lines = [f"| side | seed | iterations | greedy at 0 | greedy at N | pass@1 | pass@{k} | training min | tokens/s "
             f"| peak RSS MB | s / iteration | generation s / it | update s / it | generation share | CPU s / it |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in runs:
        share = r["generation_seconds"] / r["training_seconds"] if r["training_seconds"] else 0.0
        lines.append(f"| {SIDES[r['side']]} | {r['seed']:g} | {r['iterations_done']:g} | "
                     f"{r['evals'][0]['greedy_accuracy']:.2f} | {r['greedy_accuracy']:.2f} | {r['pass_at_1']:.2f} | "
                     f"{r['pass_at_k']:.2f} | {r['training_seconds'] / 60:.1f} | {r['tokens_per_second']:.1f} | "
                     f"{r['peak_rss_mb']:,.0f} | {r['seconds_per_iteration']:.2f} | "
                     f"{r['generation_per_iteration']:.2f} | {r['update_per_iteration']:.2f} | {share:.0%} | "
                     f"{r['cpu_per_iteration']:.2f} |")
    return lines


def goal_lines(by_side: dict[str, list[dict]], summaries: dict) -> list[str]:
    """The issue's three goals on the held-out runs, each "met", "missed" or "not measured": keelrl's gain in greedy
    accuracy over the untrained model (which must start within START) against the spread (max − min) of keelrl's
    seeds; keelrl's mean against the range of TRL's seeds; keelrl's tokens/s against TRL's."""
    keelrl = [r["greedy_accuracy"] for r in by_side["keelrl"]]
    trl = [r["greedy_accuracy"] for r in by_side["trl"]]
    lines = []
    if keelrl and by_side["base"]:
        start, mean, spread = by_side["base"][0]["greedy_accuracy"], summaries["keelrl"]["greedy_accuracy"][0], \
            max(keelrl) - min(keelrl)
        met = START[0] <= start <= START[1] and mean - start > spread
        lines.append(f"keelrl above the untrained model by more than its seeds' spread: greedy {start:.2f} → "
                     f"{mean:.2f} (mean of {len(keelrl)}), a gain of {mean - start:.2f} against a spread (max − min) "
                     f"of {spread:.2f}; the untrained model starts at {start:.2f} (the goal asks for "
                     f"[{START[0]:.2f}, {START[1]:.2f}]): **{'met' if met else 'missed'}**.")
    else:
        lines.append("keelrl above the untrained model by more than its seeds' spread: not measured.")
    if keelrl and trl:
        mean, low, high = summaries["keelrl"]["greedy_accuracy"][0], min(trl), max(trl)
        where = "below" if mean < low else "within" if mean <= high else "above"
        lines.append(f"keelrl's greedy accuracy at N within or above TRL's seeds: {mean:.2f} against TRL's "
                     f"[{low:.2f}, {high:.2f}], {where}: **{'missed' if where == 'below' else 'met'}**.")
        ratio = ratios(summaries["keelrl"], summaries["trl"])["tokens_per_second"]
        lines.append(f"keelrl's tokens/s at least TRL's: {ratio:.2f}×: **{'met' if ratio >= 1 else 'missed'}**.")
    else:
        lines += ["keelrl's greedy accuracy at N within or above TRL's seeds: not measured.",
                  "keelrl's tokens/s at least TRL's: not measured."]
    return ["Goals:", "", *(f"- {line}" for line in lines)]


def budget_line(trained: list[dict], validation: list[dict]) -> str:
    """The core-hours the runs' iterations took (one core each), held-out and validation runs apart."""
    hours = [sum(r["training_seconds"] for r in runs) / 3600 for runs in (trained, validation)]
    return (f"Budget: the iterations of the {len(trained)} held-out runs took {hours[0]:.1f} core-hours in all, those "
            f"of the {len(validation)} validation runs {hours[1]:.1f} (one core each; loading the model and the "
            "evaluations come on top); N was chosen so that both sides' runs fit about 6 core-hours.")


def time_lines(summaries: dict) -> list[str]:
    """Where each side's iteration goes: the generation share of the mean iteration, the update the rest."""
    shares = {side: s["generation_per_iteration"][0] / s["seconds_per_iteration"][0] for side, s in summaries.items()}
    return [f"Where the time goes: generation (sampling and scoring) takes {shares['keelrl']:.0%} of keelrl's mean "
            f"iteration and {shares['trl']:.0%} of TRL's; the update (the loss's forward and backward passes over all "
            "P × G completions, and the AdamW step) the rest. Both decoders are equally fast on a fixed batch "
            "(Rollout speed, above), but a batch decodes until its longest completion ends, so a side's generation "
            "time per iteration follows the longest completions its policy happens to write (keelrl's GRPO logs them "
            "as charts/max_length, TRL as completions/max_length)."]


def split_of(run: dict) -> str:
    """The split a run's evaluations read (runs written before --eval-split read the held-out one)."""
    return run.get("eval_split", "heldout")


def validation_table(runs: list[dict]) -> list[str]:
    """The runs on the validation split that chose the settings, best greedy accuracy at N first."""
    if not runs:
        return []
    k = int(runs[0]["pass_k"])
    lines = ["Settings chosen on the validation split (never on the held-out one): keelrl runs, each scored on "
             f"{runs[0]['eval_prompts']:g} validation prompts; the other settings as below unless listed.", "",
             f"| learning rate | side | seed | iterations | greedy at 0 | greedy at N | pass@1 | pass@{k} |",
             "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(runs, key=lambda r: (-r["greedy_accuracy"], -r["pass_at_1"])):
        lines.append(f"| {r['learning_rate']:g} | {SIDES[r['side']]} | {r['seed']:g} | {r['iterations_done']:g} | "
                     f"{r['evals'][0]['greedy_accuracy']:.2f} | {r['greedy_accuracy']:.2f} | {r['pass_at_1']:.2f} | "
                     f"{r['pass_at_k']:.2f} |")
    if differing := [name for name in differing_settings(runs) if name != "learning_rate"]:
        lines += ["", f"The validation runs differ in: {', '.join(differing)}."]
    return lines + [""]


def task_section(task: str, runs: list[dict], results: Path, figure_link: str) -> str:
    validation = [r for r in runs if split_of(r) == "validation"]
    runs = [r for r in runs if split_of(r) == "heldout"]
    by_side = {side: sorted((r for r in runs if r["side"] == side), key=lambda r: r["seed"])
               for side in ("base", "keelrl", "trl")}
    first = (by_side["keelrl"] or by_side["trl"] or by_side["base"])[0]
    k = int(first["pass_k"])
    lines = [f"### {task}", "", *validation_table(validation), f"Settings (both sides): {settings_text(first)}.", ""]
    if differing := differing_settings(runs):
        lines += [f"**The runs do not share these settings: {', '.join(differing)}.**", ""]
    for base in by_side["base"]:
        lines += [f"Untrained model (held-out, {base['eval_prompts']:g} prompts): greedy accuracy "
                  f"{base['greedy_accuracy']:.2f}, pass@1 {base['pass_at_1']:.2f}, pass@{k} {base['pass_at_k']:.2f}.",
                  ""]
    trained = by_side["keelrl"] + by_side["trl"]
    if trained:
        lines += run_table(trained, k) + ["", f"| side | seeds | greedy at N | pass@1 | pass@{k} | tokens/s | "
                                          f"peak RSS MB | s / iteration | generation s / it | update s / it | "
                                          f"CPU s / it |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    summaries = {side: summarize(by_side[side]) for side in SIDES if by_side[side]}
    for side, s in summaries.items():
        lines.append(f"| {SIDES[side]} | {len(by_side[side])} | "
                     + " | ".join(mean_text(s[name], digits) for name, digits in FIGURES.items()) + " |")
    if len(summaries) == 2:
        r = ratios(summaries["keelrl"], summaries["trl"])
        lines += ["", f"keelrl / TRL (ratios of the means): tokens/s {r['tokens_per_second']:.2f}×, peak RSS "
                      f"{r['peak_rss_mb']:.2f}×, seconds per iteration {r['seconds_per_iteration']:.2f}× (generation "
                      f"{r['generation_per_iteration']:.2f}×, update {r['update_per_iteration']:.2f}×), CPU seconds "
                      f"per iteration {r['cpu_per_iteration']:.2f}×.",
                  "", prompt_check(by_side["keelrl"], by_side["trl"]), "", *time_lines(summaries)]
    if trained:
        lines += ["", budget_line(trained, validation), "", *goal_lines(by_side, summaries),
                  "", f"![held-out greedy accuracy per iteration and per training minute]({figure_link})"]
    if by_side["trl"]:
        kwargs = json.loads(run_file(str(results), task, "trl", int(by_side["trl"][0]["seed"]),
                                     "grpo_config.json").read_text())
        lines += ["", "TRL's GRPOConfig (keyword arguments besides output_dir; the seed is each run's):", "",
                  "```json", json.dumps(kwargs, indent=1), "```"]
    return "\n".join(lines)


def provenance(runs: list[dict]) -> list[str]:
    lines = []
    for side in ("base", "keelrl", "trl"):
        commands = sorted({r["command"] for r in runs if r["side"] == side})
        if commands:
            python = " with the scratch venv's python" if side == "trl" else ""
            lines.append(f"- {side}{python}: " + "; ".join(f"`{c}`" for c in commands))
    machines = sorted({r["machine"] for r in runs})
    software = sorted({f"torch {r['torch']}, transformers {r['transformers']}"
                       + (f", trl {r['trl']}" if r["trl"] else "") for r in runs})
    commits = sorted({r["commit"] for r in runs})
    return ["Commands (each with --runs-dir outside the repository):", *lines, "",
            f"Machine: {'; '.join(machines)}. Software: {'; '.join(software)}. Commit: {'; '.join(commits)}."]


def plot(runs: list[dict], path: Path, task: str) -> None:
    """Held-out greedy accuracy against the iteration and the training minute: each seed thin, the mean thick."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for side, label in SIDES.items():
        seeds = [r["evals"] for r in runs if r["side"] == side]
        if not seeds:
            continue
        points = min(len(evals) for evals in seeds)
        for ax, x in zip(axes, ("iteration", "minutes")):
            for evals in seeds:
                ax.plot([e[x] for e in evals], [e["greedy_accuracy"] for e in evals], color=COLORS[side], alpha=0.3,
                        lw=1)
            mean_x = np.mean([[e[x] for e in evals[:points]] for evals in seeds], axis=0)
            mean_y = np.mean([[e["greedy_accuracy"] for e in evals[:points]] for evals in seeds], axis=0)
            ax.plot(mean_x, mean_y, color=COLORS[side], lw=2.5, label=f"{label} (mean of {len(seeds)})")
    for base in (r for r in runs if r["side"] == "base"):
        for ax in axes:
            ax.axhline(base["greedy_accuracy"], color="gray", ls="--", lw=1, label="untrained")
    axes[0].set(xlabel="iteration", ylabel="held-out greedy accuracy", title=f"{task}: per iteration",
                ylim=(-0.02, 1.02))
    axes[1].set(xlabel="training minutes (evaluations left out)", title=f"{task}: per wall-clock minute")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_page(args: PageArgs) -> None:
    """The section of args.output and a PNG per task in args.results, from the CSVs in args.results."""
    results = Path(args.results)
    runs = read_runs(results)
    if not runs:
        raise FileNotFoundError(f"{results}: no *_run.csv files; run the keelrl, trl and base steps first.")
    sections = []
    for task in sorted({r["task"] for r in runs}):
        task_runs = [r for r in runs if r["task"] == task]
        figure = results / f"{task}_curves.png"
        heldout = [r for r in task_runs if split_of(r) == "heldout"]
        if any(r["side"] != "base" for r in heldout):
            plot(heldout, figure, task)
        sections.append(task_section(task, task_runs, results, os.path.relpath(figure, Path(args.output).parent)))
    text = "\n\n".join([
        "Written by `python -m keelrl.benchmarks.checks.rlvr_trl page` from the CSVs in "
        f"{os.path.relpath(results, Path(args.output).parent)}/ (and nothing else). One iteration on either side: P "
        "prompts × G sampled completions scored by keelrl's verifier, then one AdamW step on all of them. Training "
        "time counts whole iterations, evaluations left out; generation is sampling plus scoring, the update the "
        "rest of an iteration; CPU seconds are the process's over the same spans (they tell the cost where other "
        "work shares the core); peak RSS is the process's peak during the iterations. Means are over seeds, ± the "
        "sample standard deviation (ddof 1).",
        *sections,
        "Known differences (the settings match; these do not):\n\n" + "\n".join(f"- {d}" for d in KNOWN_DIFFERENCES),
        "\n".join(provenance(runs)),
    ])
    write_section(args.output, SECTION, text)
    print(f"wrote the section {SECTION!r} of {args.output}")
