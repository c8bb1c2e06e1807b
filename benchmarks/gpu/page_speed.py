"""The speed parts of the GPU page (benchmarks/gpu/page.py): speed.py's table merged over leases, its headline, the
smoke runs, and a table of settings timed in turns (speed.py --repeats) beside LeanRL's README."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

from keelrl.benchmarks.aggregate import read_csv_rows

LEANRL_OTHER_LEASE = {"sac": 531.1, "td3": 661.7}
"""LeanRL's best (torch.compile + CUDA graphs), steps/s, on the first H200 lease (keelrl at 344a81d): the same script
and speed.py settings on Hopper-v5 (its speed table is benchmarks/results/gpu.md of commit 92b3757; its files were not
kept), where the lease of the committed speed table ran it at 352.5 (SAC) and 635.5 (TD3)"""


LEANRL_README = {"sac": 725, "td3": 936}
"""LeanRL's README (REFERENCES.md, "GPU speed"): torch.compile + CUDA graphs on one H100 with HalfCheetah-v4, env
steps/s"""


def merged_speed_rows(folders: tuple[Path, ...]) -> list[dict]:
    """speed.csv rows of every folder, one per (algo, implementation, setting) in first-seen order: the latest
    measured row, else the latest row."""
    merged: dict[tuple[str, str, str], dict] = {}
    for folder in folders:
        for row in read_csv_rows(folder / "speed.csv"):
            key = row["algo"], row["implementation"], row["setting"]
            if row["steps_per_s"] or not merged.get(key, {}).get("steps_per_s"):
                merged[key] = row
    return list(merged.values())


def speed_section(rows: list[dict]) -> list[str]:
    """The speed table: each measured row over CleanRL's and over LeanRL's best."""
    lines = ["| agent | implementation | setting | env-steps/s | / CleanRL | / LeanRL's best | note |",
             "|---|---|---|---|---|---|---|"]
    for algo in dict.fromkeys(row["algo"] for row in rows):
        mine = [row for row in rows if row["algo"] == algo]
        rate, best = best_rates(mine)
        for row in mine:
            value = rate.get(id(row))
            ratios = [f"{value / base:.2f}×" if value and base else "" for base in (best["cleanrl"], best["leanrl"])]
            shown = f"{value:.1f}" if value else "not measured"
            lines.append(f"| {algo.upper()} | {row['implementation']} | {row['setting']} | {shown} | "
                         f"{' | '.join(ratios)} | {row['note']} |")
    return lines


def best_rates(rows: list[dict]) -> tuple[dict[int, float], dict[str, float | None]]:
    """One agent's speed rows: the steps/s of each measured row (by id) and each implementation's best."""
    rate = {id(row): float(row["steps_per_s"]) for row in rows if row["steps_per_s"]}
    best = {name: max((value for row in rows if row["implementation"] == name and (value := rate.get(id(row)))),
                      default=None) for name in ("cleanrl", "leanrl", "keelrl")}
    return rate, best


def speed_headline(rows: list[dict], timed_steps: int | None = None) -> list[str]:
    """Per agent: keelrl's best setting over LeanRL's best and over CleanRL's; with `timed_steps`, under it how far
    that goes: one run per setting, and LeanRL's best as another lease measured it and as its README reports it."""
    headline = []
    for algo in dict.fromkeys(row["algo"] for row in rows):
        mine = [row for row in rows if row["algo"] == algo]
        rate, best = best_rates(mine)
        if best["keelrl"]:
            setting = next(row["setting"] for row in mine
                           if row["implementation"] == "keelrl" and rate.get(id(row)) == best["keelrl"])
            versus = [f"{best['keelrl'] / best[name]:.2f}× {said}"
                      for name, said in (("leanrl", "LeanRL's best"), ("cleanrl", "CleanRL")) if best[name]]
            headline.append(f"- {algo.upper()}: keelrl's best ({setting}, {best['keelrl']:.1f} steps/s) is "
                            + (", ".join(versus) if versus else "not compared (no reference measured)") + ".")
            if timed_steps is not None and algo in LEANRL_OTHER_LEASE:
                headline.append(
                    f"  - one run of each setting ({timed_steps:,} timed steps). LeanRL's best ran at "
                    f"{LEANRL_OTHER_LEASE[algo]} steps/s on another H200 lease (keelrl at 344a81d), keelrl's best "
                    f"{best['keelrl'] / LEANRL_OTHER_LEASE[algo]:.2f}× that; LeanRL's README reports "
                    f"{LEANRL_README[algo]} on an H100 with HalfCheetah-v4.")
    return headline


def smoke_section(rows: list[dict]) -> list[str]:
    lines = ["| agent | exit code | loop steps | host synchronisations | per step | most at | error |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['agent']} | {row['returncode']} | {row['steps']} | {row['syncs']} | "
                     f"{row['syncs_per_step']} | {row['top_locations']} | {row['error']} |")
    return lines


def turns_rows(folder: Path) -> tuple[dict, list[dict]]:
    """environment.json and the measured speed.csv rows of a speed.py --repeats run (its settings timed in turns)."""
    environment = json.loads((folder / "environment.json").read_text())
    return environment, [row for row in read_csv_rows(folder / "speed.csv") if row["steps_per_s"]]


def turns_means(rows: list[dict]) -> dict[tuple[str, str, str], list[float]]:
    """Each (algo, implementation, setting)'s rates, run by run in the order they were timed."""
    rates: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for row in rows:
        rates[row["algo"], row["implementation"], row["setting"]].append(float(row["steps_per_s"]))
    return rates


def turns_headline(folder: Path) -> list[str]:
    """Per agent: keelrl's best mean over LeanRL's best mean, timed in turns on one machine."""
    environment, rows = turns_rows(folder)
    rates = turns_means(rows)
    lines = []
    for algo in dict.fromkeys(row["algo"] for row in rows):
        best = {name: max(((statistics.mean(values), setting) for (a, i, setting), values in rates.items()
                           if a == algo and i == name), default=None) for name in ("keelrl", "leanrl")}
        if best["keelrl"] and best["leanrl"]:
            (mine, setting), (theirs, their_setting) = best["keelrl"], best["leanrl"]
            lines.append(f"- {algo.upper()} on {environment['env_id']} (LeanRL's own setting, "
                         f"{environment['device']}): keelrl {setting} {mine:.1f} steps/s, LeanRL {their_setting} {theirs:.1f}, "
                         f"{mine / theirs:.2f}× (means of {environment['repeats']} runs each, taken in turns).")
    return lines


def turns_section(folder: Path) -> list[str]:
    """The settings of a speed.py --repeats run, each run's rate, their mean and keelrl's over LeanRL's (means),
    LeanRL's README figure beside them."""
    environment, rows = turns_rows(folder)
    rates = turns_means(rows)
    lines = [f"{environment['device']} ({environment['cpus']} CPU cores), torch {environment['torch']}, keelrl at "
             f"commit {environment['commit']}: {environment['learning_starts']:,} random steps, then one update per "
             f"step, the rate over {environment['timed_steps']:,} steps after {environment['burn_in']:,} burn-in "
             f"updates; every setting run once per repeat, the repeats one after another ({environment['repeats']}).",
             "", "| agent | implementation | setting | env-steps/s, run by run | mean | / LeanRL's mean | "
             "LeanRL's README (one H100) |", "|---|---|---|---|---|---|---|"]
    for algo in dict.fromkeys(row["algo"] for row in rows):
        leanrl = max((statistics.mean(values) for (a, i, _), values in rates.items() if a == algo and i == "leanrl"),
                     default=None)
        for (a, implementation, setting), values in rates.items():
            if a == algo:
                mean = statistics.mean(values)
                lines.append(f"| {algo.upper()} | {implementation} | {setting} | "
                             f"{', '.join(f'{value:.1f}' for value in values)} | {mean:.1f} | "
                             f"{f'{mean / leanrl:.2f}×' if leanrl else ''} | {LEANRL_README.get(algo, '')} |")
    return lines
