"""The published curves beside keelrl's: the anchor file read as it is, verdicts from the bootstrap interval of the
difference of means, the IQM over the same tasks on both sides, and the page that shows them."""

import csv
import dataclasses
from pathlib import Path

import numpy as np
import pytest

from keelrl.benchmarks import anchors, leaderboard
from keelrl.benchmarks.aggregate import CellSummary, RunResult, iqm, read_run_figures, summarize_cells
from keelrl.benchmarks.reference_scores import normalized_score, published_for, score_range
from keelrl.benchmarks.report import (_spread_text, family_table, read_runs_tables, runs_made_on, write_csvs,
                                     write_report)


def anchor_rows(algorithm, task, step):
    with anchors.ANCHORS_FILE.open() as f:
        return [float(r["return"]) for r in csv.DictReader(f)
                if (r["algorithm"], r["task"], int(r["step"])) == (algorithm, task, step)]


def run(label, task, seed, by_step, agent=None, budget=300_000, status="done"):
    curve = sorted(by_step.items())
    return RunResult("online", label, agent or label, task, seed, budget, status, steps=curve[-1][0],
                     final_return=curve[-1][1], curve=curve, options="--precision bf16")


def test_the_anchor_file_is_read_as_written_seeds_counted_per_algorithm_and_task():
    loaded = anchors.load_anchors()
    sac = {a.algorithm: a for a in loaded["Hopper-v4"]}["SAC"]
    assert np.array_equal(sac.seeds_at(300_000), anchor_rows("SAC", "Hopper-v4", 300_000))
    assert sac.seeds_at(300_000).size == 10
    walker_walk = {a.algorithm: a for a in loaded["walker-walk"]}
    assert walker_walk["SAC"].seeds_at(300_000).size == 2  # DMC's SAC: few seeds, every 100k only
    assert walker_walk["SAC"].seeds_at(150_000).size == 0
    assert walker_walk["SimbaV2"].seeds_at(300_000).size == 10
    assert {a.updates_per_step for a in loaded["Hopper-v4"] if a.algorithm in ("DroQ", "REDQ")} == {20}


def test_tasks_meet_anchors_of_the_same_version_and_action_repeat_only_in_simulator_steps():
    steps = range(10_000, 300_001, 10_000)
    results = [run("sac", task, 1, {s: float(s) for s in steps})
               for task in ("Hopper-v4", "Hopper-v5", "InvertedPendulum-v4", "dm_control/cheetah-run-v0")]
    results += [run("sac", "cheetah-run", 1, {s: float(s) for s in range(10_000, 150_001, 10_000)}, budget=150_000)]
    found = anchors.tasks_with_anchors(results, anchors.load_anchors())
    # v5 changed rewards and contacts; dm_control/...-v0 decides at every control step, the anchors every second one
    assert [(t.task, t.repeat, t.steps) for t in found] == [("Hopper-v4", 1, [100_000, 200_000, 300_000]),
                                                           ("cheetah-run", 2, [100_000, 200_000, 300_000])]
    assert found[1].seeds_at("sac", 300_000).tolist() == [150_000.0]  # keelrl's step 150k is 300k simulator steps
    assert found[0].seeds_at("sac", 300_000).tolist() == [300_000.0]
    # DMC tasks are normalised on [0, 1000] under both ids, and DMC's hopper-hop never takes Gym Hopper's range
    assert normalized_score("dm_control/hopper-hop-v0", 250.0) == normalized_score("hopper-hop", 250.0) == 25.0
    assert normalized_score("dm_control/ball_in_cup-catch-v0", 500.0) == 50.0
    assert score_range("Hopper-v4").task == "hopper"


def test_the_verdict_interval_is_the_bootstrap_of_the_difference_of_means():
    rng = np.random.default_rng(1)
    ours, theirs = rng.normal(0.0, 1.0, 400), rng.normal(0.0, 1.0, 400)
    difference, low, high = anchors.difference_interval(ours, theirs, reps=20_000)
    assert difference == pytest.approx(ours.mean() - theirs.mean())
    # the percentile interval of a bootstrapped difference of two means: about ±1.96·sqrt(σ²/n + σ²/m)
    half_width = 1.96 * np.sqrt(ours.var() / ours.size + theirs.var() / theirs.size)
    assert (high - low) / 2 == pytest.approx(half_width, rel=0.05)
    assert anchors.verdict(low, high) == "matches"
    assert anchors.verdict(*anchors.difference_interval(ours + 1.0, theirs, reps=2_000)[1:]) == "above"
    assert anchors.verdict(*anchors.difference_interval(ours - 1.0, theirs, reps=2_000)[1:]) == "below"
    # constant sides: the interval is the difference itself
    assert anchors.difference_interval(np.full(3, 5.0), np.full(5, 3.0), reps=100) == (2.0, 2.0, 2.0)


def test_an_anchor_with_few_seeds_or_a_single_keelrl_seed_gets_no_verdict():
    few = anchors.Anchor("SAC", 1, "walker-walk", {300_000: np.array([900.0, 950.0])})
    found = anchors.compare("sac", np.array([1.0, 2.0, 3.0]), few, "walker-walk", 300_000, reps=100)
    assert found.verdict == "no verdict: SAC has 2 seed(s) here" and np.isnan(found.difference)
    many = anchors.Anchor("SAC", 1, "Hopper-v4", {300_000: np.arange(10.0)})
    found = anchors.compare("sac", np.array([1.0]), many, "Hopper-v4", 300_000, reps=100)
    assert found.verdict == "no verdict: keelrl has 1 finished seed(s) here"


def fake_results():
    """SAC and TD3 on Hopper-v4 (SAC's 300k returns well above the published SAC's), SAC on DMC cheetah-run, SAC on
    Hopper-v5 (no anchor of its version), and an unfinished SAC seed that must not count."""
    steps = range(10_000, 300_001, 10_000)
    results = [run("sac", "Hopper-v4", seed, {s: 5000.0 + seed for s in steps}) for seed in (1, 2, 3)]
    results += [run("td3", "Hopper-v4", seed, {s: 1000.0 + seed for s in steps}) for seed in (1, 2, 3)]
    results += [run("sac", "Hopper-v4", 4, {s: -1e6 for s in range(10_000, 100_001, 10_000)}, status="unfinished")]
    results += [run("sac", "cheetah-run", seed, {s: 300.0 + seed for s in range(10_000, 150_001, 10_000)},
                    budget=150_000) for seed in (1, 2)]
    results += [run("sac", "Hopper-v5", 1, {s: 100.0 for s in steps})]
    return results


def test_the_page_sets_keelrl_beside_the_anchors_with_verdicts_for_sac_only(tmp_path):
    lines, tasks = anchors.section("page", fake_results(), reps=2_000)
    assert [t.task for t in tasks] == ["Hopper-v4", "cheetah-run"]
    assert tasks[0].steps == [100_000, 200_000, 300_000]
    text = "\n".join(lines)
    published = np.asarray(anchor_rows("SAC", "Hopper-v4", 300_000))
    row = next(line for line in lines if line.startswith("| 300k | 5002.0 ± 0.8 (3) | 1002.0 ± 0.8 (3) | "))
    assert row.split(" | ")[3] == f"{published.mean():.1f} ± {published.std():.1f} (10)"  # the SAC anchor, ddof 0
    assert f"| 300k | sac | SAC | {5002.0 - published.mean():+.1f} |" in text and "| **above** |" in text
    assert "| td3 |" not in text  # TD3 has no published curve: no verdict
    assert "- keelrl sac against published SAC at 300k: above on 1 (Hopper-v4); no verdict on " \
           "cheetah-run" in text
    cheetah = np.asarray(anchor_rows("SAC", "cheetah-run", 300_000))
    assert ", ".join(f"{v:.0f}" for v in cheetah) + f" (per seed, {cheetah.size})" in text
    assert "Hopper-v5" not in text


def test_the_aggregate_pools_the_same_tasks_on_both_sides():
    rows = anchors.iqm_rows(anchors.section("page", fake_results(), reps=500)[1], reps=500)
    by = {(r.suite, r.name, r.step): r for r in rows}
    sac = by["Gym MuJoCo v4", "SAC", 300_000]
    hand = [normalized_score("Hopper-v4", v) for v in anchor_rows("SAC", "Hopper-v4", 300_000)]
    assert (sac.tasks, sac.runs) == (1, 10) and sac.iqm == pytest.approx(iqm(np.asarray(hand)))
    ours = by["DeepMind Control", "keelrl sac", 300_000]
    assert ours.runs == 2 and ours.iqm == pytest.approx(np.mean([30.1, 30.2]))
    assert ("Gym MuJoCo v4", "BRO", 300_000) in by and ("DeepMind Control", "DroQ", 300_000) not in by


def test_the_report_draws_each_task_writes_the_verdicts_and_names_precision_and_machine(tmp_path):
    results = fake_results()
    for r in results:
        r.machine = "AMD EPYC (avx512_bf16); mujoco 3.17.0; keelrl abc1234"
    paths = {p.name for p in write_report(tmp_path, "page", results, ["Command: test"], reps=200)}
    assert {"page_anchors.csv", "page_anchors_Hopper-v4.png", "page_anchors_cheetah-run.png"} <= paths
    with (tmp_path / "page_anchors.csv").open() as f:
        verdicts = list(csv.DictReader(f))
    assert {(v["entry"], v["task"]) for v in verdicts} == {("sac", "Hopper-v4"), ("sac", "cheetah-run")}
    page = (tmp_path / "page.md").read_text()
    assert "- Precision: sac bf16, td3 bf16" in page
    assert "- Runs made on AMD EPYC (avx512_bf16); mujoco 3.17.0; keelrl abc1234: sac Hopper-v4, td3 Hopper-v4" in page
    assert runs_made_on([run("ppo", "Hopper-v4", 1, {10: 1.0})])[1] == ("Runs whose machine was not recorded (made before "
                                                                     "cell.json recorded it): ppo Hopper-v4")


def test_ppo_is_set_against_the_spread_of_cleanrls_last_episodes():
    (published,) = published_for("online", "ppo", "Hopper-v4")
    cell = CellSummary("online", "ppo", "ppo", "Hopper-v4", 1_000_000, 3, 3, 0, "", *[float("nan")] * 6,
                       2400.0, 10.0, float("nan"), float("nan"))
    assert "**within** its spread [2111.1, 2654.6]" in _spread_text(published, cell)
    cell.last_train_mean = 2000.0
    assert "**below**" in _spread_text(published, cell)


def test_a_run_is_set_against_cleanrls_spread_on_its_last_100_episodes_and_an_older_table_is_not(tmp_path):
    """CleanRL's tables average each run's last 100 training episodes (openrlbenchmark's window): so does the
    leaderboard; a table written before it did (no last_train_episodes column: its last 10) is read back as such
    and not set against the spread."""
    run_dir = tmp_path / "seed1"
    run_dir.mkdir()
    (run_dir / "eval.csv").write_text("global_step,mean_return,std_return,mean_cost,episodes\n1000000,3000.0,0,0,10\n")
    # 150 episodes returning 2000, 2010, ..., 3490: the last 100 average 2995.0, the last 10 3445.0
    episodes = "".join(f"{i * 1000},{2000 + 10 * i},1000\n" for i in range(150))
    (run_dir / "episodes.csv").write_text("global_step,return,length\n" + episodes)
    result = read_run_figures(RunResult("online", "ppo", "ppo", "Hopper-v4", 1, 1_000_000, "done"), run_dir)
    assert (result.last_train_return, result.last_train_episodes) == (2995.0, 100)
    (published,) = published_for("online", "ppo", "Hopper-v4")
    (cell,) = summarize_cells([result])
    assert "keelrl's last 100 training episodes (2995.0) **above** its spread [2111.1, 2654.6]" in _spread_text(
        published, cell)

    write_csvs(tmp_path, "page", [result], reps=10)
    table = tmp_path / "page_runs.csv"
    with table.open() as f:
        rows = list(csv.DictReader(f))
    assert rows[0]["last_train_episodes"] == "100"
    for row in rows:  # as the tables were before: no window column, the figure over the last 10
        del row["last_train_episodes"]
        row["last_train_return"] = "3445.0"
    with table.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (older,) = read_runs_tables(tmp_path, "page")
    assert (older.last_train_return, older.last_train_episodes) == (3445.0, 10)
    (cell,) = summarize_cells([older])
    assert _spread_text(published, cell) == ("; not set against its spread: CleanRL's figure averages each run's last "
                                             "100 training episodes, keelrl's (last 10) does not")
    mixed = summarize_cells([result, dataclasses.replace(older, seed=2)])
    assert mixed[0].last_train_episodes == 0 and "(windows differ)" in _spread_text(published, mixed[0])
    # the column is named by the window its cells share (else CleanRL's); a cell of another says so beside its figure
    assert "| last 10 training episodes |" in "\n".join(family_table("online", [cell], [], [older]))
    walker = dataclasses.replace(result, task="Walker2d-v4")
    table = "\n".join(family_table("online", summarize_cells([older, walker]), [], [older, walker]))
    assert "| last 100 training episodes |" in table and "| 3445.0 ± 0.0 (last 10) |" in table
    assert "| 2995.0 ± 0.0 |" in table


def test_entries_runs_only_the_named_entries_cells_and_refuses_an_unknown_one(tmp_path):
    grid = leaderboard.grid_from_dict({"name": "g", "seeds": [1], "steps": 200, "tasks": ["InvertedPendulum-v5"],
                                       "agents": ["sac", "td3"]}, "g")
    messages = []
    leaderboard.run_grids([grid], tmp_path, dry_run=True, entries=["td3"], log=messages.append)
    assert "1 to start" in messages[0] and "1 of other entries than --entries not run" in messages[0]
    assert [m.split()[3] for m in messages[1:]] == ["keelrl.agents.td3"]
    with pytest.raises(ValueError, match="no agent entry of that name. Did you mean 'td3'"):
        leaderboard.run_grids([grid], tmp_path, dry_run=True, entries=["td33"], log=messages.append)
    assert Path(tmp_path).is_dir() and not list(Path(tmp_path).iterdir())
