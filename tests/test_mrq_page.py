"""benchmarks/checks/mrq_page.py: from tables written as the leaderboard writes them, each seed is set against the
published MR.Q's range (1 or 2 seeds) or judged by the bootstrap verdict (3 or more), an unfinished seed is "not
reached" where it did not get to, the same files make the same page, and the committed mrq.md is what the writer
makes of the committed tables today."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from keelrl.benchmarks.aggregate import RunResult
from keelrl.benchmarks.anchors import Anchor, load_anchors
from keelrl.benchmarks.checks.mrq_page import PageArgs, build_page, write_page
from keelrl.benchmarks.report import write_csvs

REPO = Path(__file__).resolve().parent.parent
PUBLISHED = np.linspace(1000.0, 3000.0, 10)
"""the fake published MR.Q's 10 seeds at 50k and 100k: range [1000, 3000], mean 2000"""
OPTIONS = "--seed {} --eval-freq 10000 --eval-episodes 10 --precision bf16 --total-timesteps 100000"


def fake_anchors() -> dict[str, list[Anchor]]:
    sac = np.linspace(200.0, 1200.0, 10)
    return {"Hopper-v4": [Anchor("SAC", 1, "Hopper-v4", {50_000: sac, 100_000: sac}),
                          Anchor("MR.Q", 1, "Hopper-v4", {50_000: PUBLISHED, 100_000: PUBLISHED,
                                                          150_000: PUBLISHED})]}


def run(agent: str, seed: int, values: list[float], budget: int = 100_000) -> RunResult:
    """A run with an evaluation every 10k steps (values in order); done when it got to its budget."""
    curve = [(10_000 * (i + 1), v) for i, v in enumerate(values)]
    done = bool(curve) and curve[-1][0] == budget
    return RunResult("online", agent, agent, "Hopper-v4", seed, budget, "done" if done else "unfinished",
                     options=OPTIONS.format(seed), run_dir=f"{agent}/seed{seed}" if curve else "",
                     steps=curve[-1][0] if curve else 0, final_return=curve[-1][1] if curve else float("nan"),
                     wall_s=36_000.0 if done else float("nan"), machine="fake CPU; keelrl 0000000" if curve else "",
                     curve=curve)


def results_folder(tmp_path: Path, mrq_values: list[list[float]]) -> str:
    """mrq-hopper_* tables with one MR.Q run per list (3 planned: the missing ones not started) and online-full_*
    with 3 SAC seeds to 300k."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    mrq = [run("mrq", seed, values) for seed, values in zip((1, 2, 3), [*mrq_values, [], [], []])]
    write_csvs(tmp_path, "mrq-hopper", mrq, reps=10)
    write_csvs(tmp_path, "online-full", [run("sac", seed, [500.0 + seed] * 30, 300_000) for seed in (1, 2, 3)],
               reps=10)
    return str(tmp_path)


def verdict_line(page: str, step: str) -> str:
    section = page.split(f"## At {step} steps")[1]
    return next(line for line in section.splitlines() if line.startswith("keelrl MR.Q against"))


def test_one_unfinished_seed_is_set_against_the_published_range_and_not_reached_past_where_it_got(tmp_path):
    page = build_page(results_folder(tmp_path, [[10.0, 20.0, 30.0, 40.0, 100.0]]), fake_anchors())
    assert verdict_line(page, "50k") == ("keelrl MR.Q against the published MR.Q: seed 1: 100.0 below the published "
                                         "range [1000.0, 3000.0].")
    assert "| keelrl MR.Q | 0 of 3 | 1: not reached, 2: not reached, 3: not reached | – | – |" in page
    assert "| keelrl MR.Q | 1 of 3 | 1: 100.0, 2: not reached, 3: not reached | 100.0 (1 seed) |" in page
    assert verdict_line(page, "100k").endswith("no finished seed yet (none has reached 100k).")
    assert "Goal (matches the published MR.Q at 100k): cannot be judged yet, no seed has reached 100k." in page
    assert "seed 1 unfinished, last evaluation at 50k; seed 2 not started; seed 3 not started" in page
    assert "## At 150k" not in page  # past the budget
    assert "| published MR.Q | 10 | – | 2000.0 ± 638.3 | 1000.0–3000.0 |" in page
    assert "| 50k | 100.0 | – | – | 100.0 (1 seed) | 501.0 | 502.0 | 503.0 | 502.0 ± 0.8 |" in page
    assert "so an upper bound of the cost): not measured." in page


@pytest.mark.parametrize("value, where", [(2500.0, "within"), (3500.0, "above")])
def test_one_finished_seed_lies_within_or_outside_the_range_and_the_goal_says_so(tmp_path, value, where):
    page = build_page(results_folder(tmp_path, [[100.0] * 9 + [value]]), fake_anchors())
    assert verdict_line(page, "100k").endswith(f"seed 1: {value:.1f} {where} the published range [1000.0, 3000.0].")
    goal = next(line for line in page.splitlines() if line.startswith("Goal"))
    assert goal.endswith("holds for the 1 seed(s) there, 2 of 3 planned still to come." if where == "within"
                         else "missed (seeds [1] outside); compared with the reference below.")
    assert "seed 1: 2.78 steps/s, 10.0 h" in page


def test_three_seeds_get_the_bootstrap_verdict(tmp_path):
    at_mean = build_page(results_folder(tmp_path / "a", [[100.0] * 9 + [v] for v in (1900.0, 2000.0, 2100.0)]),
                         fake_anchors())
    assert verdict_line(at_mean, "100k").startswith("keelrl MR.Q against the published MR.Q: **matches** "
                                                    "(keelrl − published +0.0, bootstrap 95% CI [")
    assert "Goal (matches the published MR.Q at 100k): holds." in at_mean
    low = build_page(results_folder(tmp_path / "b", [[100.0] * 10 for _ in range(3)]), fake_anchors())
    assert "**below** (keelrl − published -1900.0" in verdict_line(low, "100k")
    assert "Goal (matches the published MR.Q at 100k): missed (below); compared with the reference below." in low


def test_the_same_files_make_the_same_page(tmp_path):
    results = results_folder(tmp_path / "runs", [[100.0] * 9 + [v] for v in (1500.0, 2200.0, 2600.0)])
    output = tmp_path / "page" / "mrq.md"
    output.parent.mkdir()
    write_page(PageArgs(results=results, output=str(output)), fake_anchors())
    first = output.read_text()
    write_page(PageArgs(results=results, output=str(output)), fake_anchors())
    assert output.read_text() == first
    assert (output.parent / "mrq_hopper.png").stat().st_size > 0
    assert "\n![Hopper-v4: keelrl MR.Q seeds, keelrl SAC's mean, the published seeds](mrq_hopper.png)\n" in first
    assert first.split("\n## Compared with the reference, line by line\n")[1].count("\n- ") == 6
    assert "Budget:" not in first  # every planned seed ran


def test_the_committed_page_is_what_the_writer_makes_of_the_committed_tables(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    made = build_page(PageArgs().results, load_anchors(), tmp_path / "mrq_hopper.png")
    assert made == (REPO / PageArgs().output).read_text(), (
        "benchmarks/results/mrq.md is not what its tables make: python -m keelrl.benchmarks.checks.mrq_page")
