"""Leaderboard: statistics against hand computations, grid files, and tiny grids run for real
(2 local workers, a second invocation that does nothing, a grid killed mid-run and resumed, Ray)."""

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from keelrl.benchmarks import leaderboard
from keelrl.benchmarks.aggregate import RunResult, iqm, iqm_by_agent, read_run_figures, stratified_bootstrap_ci
from keelrl.benchmarks.checks import offline_to_online
from keelrl.benchmarks.make_datasets import collect
from keelrl.benchmarks.reference_scores import (NO_RANGE_REASONS, normalized_score, published_for, score_range,
                                               task_key)
from keelrl.benchmarks.report import write_markdown, write_report

# A tiny SAC/TD3 cell: 200 random-action steps (no updates), an evaluation of 2 episodes every 100 steps.
TINY = {"learning-starts": 200, "hidden-sizes": [16, 16], "batch-size": 16, "eval-freq": 100, "eval-episodes": 2,
        "checkpoint-freq": 100}
TASK = "InvertedPendulum-v5"


def tiny_grid(name, agents, seeds=(1, 2), steps=200, options=TINY):
    return leaderboard.grid_from_dict(
        {"name": name, "family": "online", "seeds": list(seeds), "steps": steps, "options": dict(options),
         "tasks": [TASK], "agents": list(agents)}, name)


def eval_rows(run_dir):
    with open(Path(run_dir) / "eval.csv") as f:
        return list(csv.DictReader(f))


def test_iqm_drops_a_quarter_at_each_end():
    # 8 scores sorted: 1 2 3 4 5 7 9 100 -> drop 2 each side -> mean(3, 4, 5, 7) = 4.75
    assert iqm(np.array([[1, 9], [3, 4], [100, 2], [5, 7]])) == pytest.approx(4.75)
    # 10 scores: floor(10/4) = 2 dropped each side -> mean(3..8) = 5.5
    assert iqm(np.arange(1, 11)) == pytest.approx(5.5)
    assert iqm(np.array([3.0, 1.0, 2.0])) == pytest.approx(2.0)  # n < 4: nothing dropped


def test_stratified_bootstrap_ci_matches_the_exact_resampling_distribution():
    # Task A runs (0, 10), task B runs (100, 200). A stratified resample redraws 2 runs within each
    # task, and the IQM of the 4 pooled scores is (max of A's draws + min of B's draws) / 2:
    #   50 w.p. 3/16, 55 w.p. 9/16, 100 w.p. 1/16, 105 w.p. 3/16 (cumulative 18.75%, 75%, 81.25%, 100%).
    # Its 2.5% and 97.5% percentiles are 50 and 105; its 35% and 65% percentiles are both 55.
    # (Resampling the pooled runs instead would often draw three or four of A's: low end near 10.)
    scores_by_task = [np.array([0.0, 10.0]), np.array([100.0, 200.0])]
    assert stratified_bootstrap_ci(scores_by_task, reps=20_000, seed=1) == (50.0, 105.0)
    assert stratified_bootstrap_ci(scores_by_task, reps=20_000, confidence=0.3, seed=1) == (55.0, 55.0)
    # Unequal runs per task: A = (7) is kept in every resample; 3 scores, nothing trimmed, so the IQM
    # is the mean of (7, 1, 1) = 3 w.p. 1/4, (7, 1, 3) = 11/3 w.p. 1/2, (7, 3, 3) = 13/3 w.p. 1/4.
    low, high = stratified_bootstrap_ci([np.array([7.0]), np.array([1.0, 3.0])], reps=4_000, seed=0)
    assert (low, high) == (3.0, pytest.approx(13 / 3))


def test_reference_scores_and_task_keys():
    assert task_key("Hopper-v5") == task_key("Hopper-v4") == "hopper"
    assert task_key("keelrl/SafeHopperVelocity-v1") == "safehoppervelocity"
    assert task_key("keelrl/hopper-medium-v0") == "hopper-medium"
    assert normalized_score("Hopper-v5", 3234.3) == pytest.approx(100.0)
    assert normalized_score("hopper-medium-v0", -20.272305) == pytest.approx(0.0)
    assert normalized_score("InvertedPendulum-v5", 500.0) == pytest.approx(50.0)
    assert normalized_score("CartPole-v1", 500.0) == pytest.approx(100.0)
    assert np.isnan(normalized_score("keelrl/SafeHopperVelocity-v1", 500.0))
    (cleanrl,) = published_for("online", "sac", "Hopper-v5")
    assert (cleanrl.mean, cleanrl.std, cleanrl.budget_steps, cleanrl.published_task) == (2310.46, 342.82, 1_000_000,
                                                                                         "Hopper-v4")
    (saclag,) = published_for("safe", "sac_lag", "keelrl/SafeHopperVelocity-v1")
    assert (saclag.mean, saclag.cost) == (963.49, 20.23)


def finished_run(tmp_path, label, task, seed, final_return, status="done", family="online"):
    """A cell's RunResult read from an eval.csv with one evaluation (final_return None: an empty eval.csv)."""
    run_dir = tmp_path / label / task.replace("/", "_") / f"seed{seed}"
    run_dir.mkdir(parents=True)
    rows = "" if final_return is None else f"15000,{final_return},0.0,0.0,10\n"
    (run_dir / "eval.csv").write_text("global_step,mean_return,std_return,mean_cost,episodes\n" + rows)
    return read_run_figures(RunResult(family, label, label, task, seed, 15000, status), run_dir)


def page_of(tmp_path, results, name="page"):
    write_markdown(tmp_path / f"{name}.md", name, [], results, reps=500)
    return (tmp_path / f"{name}.md").read_text()


def test_no_iqm_pools_raw_returns_across_tasks(tmp_path):
    # InvertedPendulum-v5 (range 0..1000): returns 100, 500, 900 -> scores 10, 50, 90. Swimmer-v5 has no
    # declared range. The old code pooled the six raw returns 30 40 50 100 500 900 and reported their IQM,
    # mean(40, 50, 100, 500) = 172.5, as a "raw return" IQM. Now there is no IQM, and the page says why.
    results = [finished_run(tmp_path / "a", "sac", "InvertedPendulum-v5", seed, ret)
               for seed, ret in enumerate((100.0, 500.0, 900.0), 1)]
    results += [finished_run(tmp_path / "a", "sac", "Swimmer-v5", seed, ret)
                for seed, ret in enumerate((30.0, 40.0, 50.0), 1)]
    (entry,) = iqm_by_agent(results, reps=500)
    assert np.isnan(entry.iqm) and np.isnan(entry.ci_low) and np.isnan(entry.ci_high)
    assert (entry.runs, entry.runs_planned, entry.tasks) == (0, 6, 2)
    assert entry.no_iqm == "no IQM: Swimmer-v5 has no declared score range"
    page = page_of(tmp_path, results)
    assert "| sac | no IQM: Swimmer-v5 has no declared score range | – | 0 of 6 | 2 |" in page
    assert "| sac | Swimmer-v5 | 15k | 3/3 | 40.0 ± 8.2 | no declared range |" in page
    assert "172.5" not in page and "raw return" not in page

    # With CartPole-v1 (range 0..500) in its place: returns 50, 250, 500 -> scores 10, 50, 100; the six
    # scores 10 10 50 50 90 100 lose one at each end: IQM = mean(10, 50, 50, 90) = 50. (The old code had
    # no CartPole range and gave the raw-return IQM mean(100, 250, 500, 500) = 337.5.)
    results = results[:3] + [finished_run(tmp_path / "b", "sac", "CartPole-v1", seed, ret)
                             for seed, ret in enumerate((50.0, 250.0, 500.0), 1)]
    (entry,) = iqm_by_agent(results, reps=500)
    assert entry.iqm == pytest.approx(50.0)
    assert entry.ci_low <= 50.0 <= entry.ci_high
    assert (entry.runs, entry.runs_planned, entry.tasks, entry.no_iqm) == (6, 6, 2, "")
    assert f"| sac | 50.0 | [{entry.ci_low:.1f}, {entry.ci_high:.1f}] | 6 of 6 | 2 |" in page_of(tmp_path, results)

    # Offline: a finished run whose agent logged no normalised score (a dataset without reference returns)
    # leaves the agent without an IQM too (the old code fell back to the raw returns' IQM, 950).
    offline = [RunResult("offline", "iql", "iql", "keelrl/hopper-medium-v0", 1, 1000, "done", final_return=1000.0,
                         score=30.0),
               RunResult("offline", "iql", "iql", "keelrl/hopper-medium-v0", 2, 1000, "done", final_return=900.0)]
    (entry,) = iqm_by_agent(offline, reps=500)
    assert np.isnan(entry.iqm)
    assert entry.no_iqm == "no IQM: 1 of the 2 finished runs on keelrl/hopper-medium-v0 have no normalised score"


def test_failed_and_missing_runs_are_shown_and_counted(tmp_path):
    # sac: InvertedPendulum-v5 returns 200, 400, 1000 (scores 20, 40, 100); CartPole-v1 returns 100, 250
    # (scores 20, 50) and seed 3 failed. IQM over the 5 finished runs: 20 20 40 50 100, one dropped at
    # each end: mean(20, 40, 50) = 110/3.
    results = [finished_run(tmp_path, "sac", "InvertedPendulum-v5", seed, ret)
               for seed, ret in enumerate((200.0, 400.0, 1000.0), 1)]
    results += [finished_run(tmp_path, "sac", "CartPole-v1", 1, 100.0),
                finished_run(tmp_path, "sac", "CartPole-v1", 2, 250.0),
                RunResult("online", "sac", "sac", "CartPole-v1", 3, 15000, "failed")]
    # td3: every InvertedPendulum-v5 run failed; on CartPole-v1 seed 1 is done but never evaluated (the old
    # code counted it as a finished seed and dropped its NaN from the mean), seed 2 is unfinished.
    results += [RunResult("online", "td3", "td3", "InvertedPendulum-v5", seed, 15000, "failed") for seed in (1, 2, 3)]
    results += [finished_run(tmp_path, "td3", "CartPole-v1", 1, None),
                RunResult("online", "td3", "td3", "CartPole-v1", 2, 15000, "unfinished"),
                finished_run(tmp_path, "td3", "CartPole-v1", 3, 500.0)]
    sac, td3 = iqm_by_agent(results, reps=500)
    assert sac.iqm == pytest.approx(110 / 3)
    assert (sac.runs, sac.runs_planned, sac.not_finished, sac.no_iqm) == (5, 6, "1 failed", "")
    assert np.isnan(td3.iqm) and td3.no_iqm == "no IQM: InvertedPendulum-v5 has no finished run"
    assert (td3.runs, td3.runs_planned, td3.not_finished) == (0, 6, "3 failed, 1 no final evaluation, 1 unfinished")

    page = page_of(tmp_path, results)
    assert "| sac | CartPole-v1 | 15k | 2/3 (1 failed) | 175.0 ± 75.0 | 35.0 ± 15.0 |" in page
    assert "| td3 | InvertedPendulum-v5 | 15k | 0/3 (3 failed) | **failed** | – |" in page
    assert ("| td3 | CartPole-v1 | 15k | 1/3 (1 no final evaluation, 1 unfinished) | 500.0 ± 0.0 | 100.0 ± 0.0 |"
            in page)
    assert f"| sac | 36.7 | [{sac.ci_low:.1f}, {sac.ci_high:.1f}] | 5 of 6 (1 failed) | 2 |" in page
    assert ("| td3 | no IQM: InvertedPendulum-v5 has no finished run | – | 0 of 6 (3 failed, 1 no final evaluation, "
            "1 unfinished) | 2 |") in page
    assert "- sac CartPole-v1 seed 3: failed" in page
    assert "- td3 CartPole-v1 seed 1: done, but no final evaluation (eval.csv has no row)" in page
    assert "- td3 CartPole-v1 seed 2: unfinished" in page
    # a cell with runs that never started (no failure) reads "missing"
    unstarted = [RunResult("online", "sac", "sac", "Hopper-v5", seed, 15000, "unfinished") for seed in (1, 2)]
    page = page_of(tmp_path, unstarted, "unstarted")
    assert "| sac | Hopper-v5 | 15k | 0/2 (2 unfinished) | **missing** | – |" in page


def test_a_published_figure_on_clean_data_is_not_comparable_beside_a_corrupted_run(tmp_path):
    # Two IQL entries on hopper-medium at the budget CORL published (1M updates): one on clean data, one whose
    # config.json says it learned from 30% randomly corrupted next observations.
    runs = []
    for label, corruption in (("iql", None), ("iql-dynamics30", "dynamics")):
        run_dir = tmp_path / label
        run_dir.mkdir()
        (run_dir / "eval.csv").write_text("global_step,mean_return,std_return,mean_cost,episodes\n"
                                          "1000000,1500.0,0.0,0.0,10\n")
        config = {"corruption": corruption, "corruption_rate": 0.3, "corruption_mode": "random"}
        (run_dir / "config.json").write_text(json.dumps({"algo": "iql", "config": config}))
        result = RunResult("offline", label, "iql", "keelrl/hopper-medium-v0", 1, 1_000_000, "done")
        runs.append(read_run_figures(result, run_dir))
    assert [r.data for r in runs] == ["clean", "30% random dynamics corruption"]
    page = page_of(tmp_path, runs)
    clean_row, corrupted_row = (next(line for line in page.splitlines() if line.startswith(f"| {label} |"))
                                for label in ("iql", "iql-dynamics30"))
    assert clean_row.endswith("| 67.5 ± 3.8 [1] | 1M gradient updates: same budget |")
    assert corrupted_row.endswith("| 67.5 ± 3.8 [1] | 1M gradient updates on clean data vs keelrl 1M on 30% random "
                                  "dynamics corruption: **not comparable** |")


def test_every_shipped_grid_task_has_a_score_range_or_its_agents_get_no_iqm(tmp_path):
    checked = []  # (grid, its results, its IQM entries by agent name, its page)
    undeclared = set()
    for path in sorted(leaderboard.GRIDS_DIR.glob("*.toml")):
        grid = leaderboard.load_grid(path.stem)
        results = []
        for i, cell in enumerate(leaderboard.expand(grid, tmp_path)):
            result = RunResult(grid.family, cell.agent.name, cell.agent.module, cell.task.id, cell.seed,
                               cell.task.steps, "done", steps=cell.task.steps, final_return=100.0 + i)
            # the score read_run_figures gives: an offline agent logs its own (its dataset's references),
            # the other families use the task's declared range
            result.score = 40.0 + i if grid.family == "offline" else normalized_score(cell.task.id, 100.0 + i)
            results.append(result)
        undeclared |= {task.id for task in grid.tasks if grid.family != "offline" and score_range(task.id) is None}
        entries = {entry.label: entry for entry in iqm_by_agent(results, reps=200)}
        checked.append((grid, results, entries, page_of(tmp_path, results, grid.name)))
    # the only shipped tasks without a range: the velocity-constrained ones (a return-only score would ignore the
    # cost), each with its reason written down, as Pusher's (nobody publishes its random / reference returns)
    assert undeclared == {"keelrl/SafeHopperVelocity-v1", "keelrl/SafeHalfCheetahVelocity-v1",
                          "keelrl/SafeWalker2dVelocity-v1", "keelrl/SafeAntVelocity-v1"}
    assert all(task_key(task) in NO_RANGE_REASONS for task in [*undeclared, "Pusher-v5"])
    agents = [(grid, agent, [task.id for task in grid.tasks if agent.tasks is None or task.id in agent.tasks],
               results, entries[agent.name], page)
              for grid, results, entries, page in checked for agent in grid.agents]
    for grid, agent, tasks, results, entry, _ in agents:
        if any(task in undeclared for task in tasks):  # no aggregate at all
            assert np.isnan(entry.iqm), (grid.name, agent.name)
        else:  # an IQM of the normalised scores of every run
            scores = np.array([r.score for r in results if r.label == agent.name])
            assert entry.iqm == pytest.approx(iqm(scores)), (grid.name, agent.name)
            assert all(score_range(task).source for task in tasks if grid.family != "offline")
    for grid, agent, tasks, _, entry, page in agents:  # and the page says so
        assert "raw return" not in page
        no_range = [task for task in tasks if task in undeclared]
        if no_range:
            (row,) = [line for line in page.splitlines() if line.startswith(f"| {agent.name} | no IQM: ")]
            assert all(f"{task} has no declared score range" in row for task in no_range), row
        else:
            assert f"| {agent.name} | {entry.iqm:.1f} | [" in page


def test_grid_files_are_checked(tmp_path):
    with pytest.raises(ValueError, match="unknown key"):
        leaderboard.grid_from_dict({"tasks": [TASK], "agents": ["sac"], "steps": 10, "sedes": [1]}, "g")
    with pytest.raises(ValueError, match="set by the leaderboard"):
        leaderboard.grid_from_dict({"tasks": [TASK], "agents": ["sac"], "steps": 10, "options": {"seed": 3}}, "g")
    with pytest.raises(ValueError, match="positive step budget"):
        leaderboard.grid_from_dict({"tasks": [TASK], "agents": ["sac"]}, "g")
    with pytest.raises(FileNotFoundError, match="online-small"):
        leaderboard.load_grid("no-such-grid")
    with pytest.raises(ValueError, match="has no option"):
        leaderboard.run_grids([tiny_grid("g", ["sac"], options={"learning-rate-typo": 1})], tmp_path,
                              log=lambda _: None)
    grid = tiny_grid("g", ["sac"], options={"normalize-obs": True, "hidden-sizes": [8, 8], "eval-freq": 50})
    assert leaderboard.expand(grid, tmp_path)[0].args == [
        "--seed", "1", "--normalize-obs", "--hidden-sizes", "8", "8", "--eval-freq", "50", "--env-id", TASK,
        "--total-timesteps", "200"]


def test_a_fine_tuning_entry_waits_for_and_starts_from_the_run_of_its_seed(tmp_path):
    """`pretrained`: each WSRL cell runs once the CQL cell of its seed has finished, before cells that start from
    nothing (one worker: CQL 1, WSRL 1, CQL 2, WSRL 2), and is given that run's directory; cell.json records their
    options without it; a second invocation runs nothing."""
    rng = np.random.default_rng(0)
    data = collect(TASK, lambda obs: rng.uniform(-3, 3, (len(obs), 1)), 300, 2, seed=0)
    np.savez(tmp_path / "pendulum.npz", **data)
    spec = {"name": "o2o", "family": "offline-to-online", "seeds": [1, 2], "steps": 20, "task_flag": "dataset",
            "steps_flag": "total-updates", "options": {"eval-freq": 0, "eval-episodes": 1},
            "tasks": [str(tmp_path / "pendulum.npz")],
            "agents": [{"name": "cql-tiny", "module": "cql", "options": {"env-id": TASK, "hidden-sizes": [8, 8],
                                                                        "batch-size": 16}},
                       {"name": "wsrl-tiny", "module": "wsrl", "pretrained": "cql-tiny", "task_flag": "",
                        "steps_flag": "total-timesteps", "steps": 40,
                        "options": {"warmup-steps": 20, "batch-size": 16, "utd": 2, "buffer-size": 100}}]}
    grid = leaderboard.grid_from_dict(spec, "o2o")
    messages = []
    leaderboard.run_grids([grid], tmp_path / "runs", dry_run=True, log=messages.append)
    assert "0 to resume, 4 to start (2 once the runs they fine-tune finish)" in messages[0]
    assert messages[-1].startswith("waits for cql-tiny") and messages[-1].endswith("seed 2: wsrl-tiny")
    results = leaderboard.run_grids([grid], tmp_path / "runs", workers=1, log=messages.append)
    assert [(r.label, r.seed, r.status, r.budget) for r in results] == [
        ("cql-tiny", 1, "done", 20), ("cql-tiny", 2, "done", 20), ("wsrl-tiny", 1, "done", 40),
        ("wsrl-tiny", 2, "done", 40)]
    cells = leaderboard.expand(grid, tmp_path / "runs")
    (cql_1, cql_2, wsrl_1, wsrl_2) = [cell.record()["attempts"] for cell in cells]
    assert [len(attempts) for attempts in (cql_1, cql_2, wsrl_1, wsrl_2)] == [1, 1, 1, 1]
    starts = [attempts[0]["start_time"] for attempts in (cql_1, wsrl_1, cql_2, wsrl_2)]
    assert starts == sorted(starts)  # seed 1's fine-tuning went before seed 2's pre-training
    assert wsrl_1[0]["start_time"] >= cql_1[0]["start_time"] + cql_1[0]["wall_s"]
    for cql_cell, wsrl_cell, cql_result, wsrl_result in zip(cells[:2], cells[2:], results[:2], results[2:]):
        assert wsrl_cell.pretrained == cql_cell
        assert "--pretrained" not in wsrl_cell.record()["args"] and "--dataset" not in wsrl_cell.record()["args"]
        config = json.loads((Path(wsrl_result.run_dir) / "config.json").read_text())["config"]
        assert Path(config["pretrained"]) == Path(cql_result.run_dir).resolve() and config["seed"] == cql_cell.seed
    messages.clear()
    leaderboard.run_grids([grid], tmp_path / "runs", log=messages.append)
    assert "4 cells: 4 finished (skipped), 0 to resume, 0 to start" in messages[0]
    # the results page's summary: the pre-training's last evaluations, the online runs' early and last ones
    lines = offline_to_online.summary(grid, tmp_path / "runs", early=20, late=40, bin_steps=10,
                                      curves_png=tmp_path / "o2o.png")
    cql_last = [eval_rows(r.run_dir)[-1] for r in results[:2]]
    assert lines[2:4] == [f"- seed {seed}: {float(row['mean_return']):.1f} at update 20"
                          for seed, row in zip((1, 2), cql_last)]
    wsrl_evals = [[float(row["mean_return"]) for row in eval_rows(r.run_dir)] for r in results[2:]]
    assert [len(evals) for evals in wsrl_evals] == [2, 2]  # the pre-trained policy at step 0, then the last
    (row,) = [line for line in lines if line.startswith("| wsrl-tiny |")]
    first, last = np.array([e[0] for e in wsrl_evals]), np.array([e[-1] for e in wsrl_evals])
    both = (first + last) / 2  # the last 40 steps hold both evaluations of each run
    assert row == (f"| wsrl-tiny | 2 | {first.mean():.1f} ± {first.std():.1f} | {first.mean():.1f} ± "
                   f"{first.std():.1f} | – | {last.mean():.1f} ± {last.std():.1f} | {both.mean():.1f} ± "
                   f"{both.std():.1f} | 40 |")
    assert (tmp_path / "o2o.png").stat().st_size > 10_000
    for entry, match in [({"pretrained": "nobody"}, "names no other agent entry"),
                         ({"pretrained": "wsrl-tiny"}, "names no other agent entry")]:
        bad = {**spec, "agents": [spec["agents"][0], {**spec["agents"][1], **entry}]}
        with pytest.raises(ValueError, match=match):
            leaderboard.grid_from_dict(bad, "bad")
    chained = {**spec, "agents": [*spec["agents"], {"name": "again", "module": "wsrl", "pretrained": "wsrl-tiny"}]}
    with pytest.raises(ValueError, match="fine-tunes runs of its own"):
        leaderboard.grid_from_dict(chained, "bad")


def test_batch_seeds_runs_an_entrys_seeds_as_one_process_into_their_own_cells(tmp_path):
    messages = []
    apart = tiny_grid("apart", ["sac"], seeds=(1, 3), options={**TINY, "eval-freq": 0})
    leaderboard.run_grids([apart], tmp_path / "runs", dry_run=True, batch_seeds=True, log=messages.append)
    commands = [m for m in messages if m.startswith("new: ")]
    assert len(commands) == 2 and not any("--num-seeds" in c for c in commands)  # seeds 1 and 3: one process each
    grid = tiny_grid("batched", ["sac"], seeds=(1, 2), options={**TINY, "eval-freq": 0})
    messages.clear()
    leaderboard.run_grids([grid], tmp_path / "runs", dry_run=True, batch_seeds=True, log=messages.append)
    (command,) = [m for m in messages if m.startswith("new: ")]
    assert "--seed 1 " in command and "--num-seeds 2" in command and command.endswith("seed{seed} --quiet")
    results = leaderboard.run_grids([grid], tmp_path / "runs", batch_seeds=True, log=messages.append)
    assert [(r.seed, r.status) for r in results] == [(1, "done"), (2, "done")]
    cells = leaderboard.expand(grid, tmp_path / "runs")
    attempts = [cell.record()["attempts"] for cell in cells]
    assert [len(a) for a in attempts] == [1, 1] and attempts[0] == attempts[1]  # one process, recorded in both
    assert attempts[0][0]["seeds_in_process"] == 2
    for cell in cells:
        (run_dir,) = cell.run_dirs()
        assert json.loads((run_dir / "config.json").read_text())["config"]["seed"] == cell.seed
    messages.clear()
    leaderboard.run_grids([grid], tmp_path / "runs", batch_seeds=True, log=messages.append)
    assert "2 cells: 2 finished (skipped)" in messages[0]
    # each run's share of the process: its wall time over the 2 seeds it trained
    assert [r.wall_s for r in results] == [pytest.approx(attempts[0][0]["wall_s"] / 2)] * 2

    # the group stopped after its last checkpoint (model.pt not written): rerun without --batch-seeds, two workers,
    # it resumes as one process (two `--resume`s of one group each resumed both seeds at once)
    for cell in cells:
        (cell.state()[1] / leaderboard.MODEL_FILE).unlink()
    results = leaderboard.run_grids([grid], tmp_path / "runs", workers=2, log=messages.append)
    assert [(r.seed, r.status) for r in results] == [(1, "done"), (2, "done")]
    resumed = [cell.record()["attempts"][1:] for cell in cells]
    assert resumed[0] == resumed[1] and [(a["mode"], a["returncode"]) for a in resumed[0]] == [("resume", 0)]
    assert resumed[0][0]["seeds_in_process"] == 2 and [len(cell.run_dirs()) for cell in cells] == [1, 1]


def test_every_preset_grid_loads_and_names_only_options_its_agents_have(tmp_path):
    presets = sorted(leaderboard.GRIDS_DIR.glob("*.toml"))
    families = {leaderboard.load_grid(path.stem).family for path in presets}
    assert families == set(leaderboard.FAMILIES)
    for path in presets:
        cells = leaderboard.expand(leaderboard.load_grid(path.stem), tmp_path)
        leaderboard.check_agents(cells)  # raises on an option an available agent does not have


def test_grid_runs_with_two_workers_then_a_second_invocation_does_nothing(tmp_path):
    messages = []
    grid = tiny_grid("two-workers", ["sac", "td3"], seeds=(1,))
    results = leaderboard.run_grids([grid], tmp_path / "runs", workers=2, log=messages.append)

    assert [r.status for r in results] == ["done", "done"]
    cells = leaderboard.expand(grid, tmp_path / "runs")
    attempts = [cell.record()["attempts"] for cell in cells[:2]]
    assert all(len(a) == 1 and a[0]["mode"] == "new" and a[0]["returncode"] == 0 for a in attempts)
    spans = sorted((a[0]["start_time"], a[0]["start_time"] + a[0]["wall_s"]) for a in attempts)
    assert spans[1][0] < spans[0][1]  # two cells ran at the same time
    for result in results[:2]:
        last = eval_rows(result.run_dir)[-1]
        assert result.steps == int(last["global_step"]) == 200
        assert result.final_return == pytest.approx(float(last["mean_return"]))
        assert result.score == pytest.approx(result.final_return / 10.0)  # InvertedPendulum: 100 · R / 1000
        # the learning curve is the run's evaluations, as eval.csv has them (at 100 and 200 steps)
        assert result.curve == [(int(row["global_step"]), float(row["mean_return"])) for row in eval_rows(result.run_dir)]
        assert [step for step, _ in result.curve] == [100, 200] and result.curve[-1][1] == result.final_return
        # steps per second of the cell's one attempt: 200 steps over its wall time
        assert result.wall_s == attempts[results.index(result)][0]["wall_s"] > 0
        assert result.sps == pytest.approx(200 / result.wall_s, rel=1e-12)

    written = write_report(tmp_path / "out", "two-workers", results, ["Command: test"], reps=500,
                           runs_dir=tmp_path / "runs")
    assert {p.name for p in written} == {"two-workers.md", "two-workers_runs.csv", "two-workers_cells.csv",
                                        "two-workers_iqm.csv", "two-workers_curves.csv", "two-workers_online.png"}
    markdown = (tmp_path / "out" / "two-workers.md").read_text()
    assert "| sac | InvertedPendulum-v5 | 200 | 1/1 |" in markdown
    assert "1M env steps vs keelrl 200: **not comparable**" in markdown
    with open(tmp_path / "out" / "two-workers_runs.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 and float(rows[0]["final_return"]) == pytest.approx(results[0].final_return)
    # run directories relative to --runs-dir: no path of this machine in a committed table
    assert rows[0]["run_dir"] == str(Path(results[0].run_dir).relative_to(tmp_path / "runs"))
    assert rows[0]["run_dir"].startswith(f"{grid.name}/sac/InvertedPendulum-v5/seed1/")
    with open(tmp_path / "out" / "two-workers_curves.csv") as f:
        curves = list(csv.DictReader(f))
    assert len(curves) == 2 * 2  # 2 runs, 2 evaluations each, as their eval.csv has them
    assert [(row["agent"], int(row["step"]), float(row["eval_return"])) for row in curves] == [
        (agent, int(row["global_step"]), pytest.approx(float(row["mean_return"]), rel=1e-12))
        for agent, result in zip(("sac", "td3"), results[:2]) for row in eval_rows(result.run_dir)]
    # one run per agent: its IQM is its own normalised score, 100 · R / 1000 on InvertedPendulum-v5
    with open(tmp_path / "out" / "two-workers_iqm.csv") as f:
        iqm_rows = {row["label"]: row for row in csv.DictReader(f)}
    for agent, result in zip(("sac", "td3"), results[:2]):
        assert float(iqm_rows[agent]["iqm"]) == pytest.approx(result.final_return / 10.0, rel=1e-12)
        assert (int(iqm_rows[agent]["runs"]), int(iqm_rows[agent]["runs_planned"])) == (1, 1)
    with open(tmp_path / "out" / "two-workers_runs.csv") as f:
        assert [float(row["sps"]) for row in csv.DictReader(f)][:2] == [pytest.approx(r.sps) for r in results[:2]]

    messages.clear()
    again = leaderboard.run_grids([grid], tmp_path / "runs", workers=2, log=messages.append)
    assert "2 cells: 2 finished (skipped), 0 to resume, 0 to start, 0 unavailable" in messages[-1]
    assert [cell.record()["attempts"] for cell in cells[:2]] == attempts
    assert [r.final_return for r in again[:2]] == [r.final_return for r in results[:2]]


def test_a_grid_killed_mid_run_is_resumed_from_the_checkpoint(tmp_path):
    options = {**TINY, "learning-starts": 100, "eval-freq": 150}
    grid_file = tmp_path / "killed.toml"
    grid_file.write_text(
        'name = "killed"\nseeds = [1]\nsteps = 300\ntasks = ["InvertedPendulum-v5"]\nagents = ["sac"]\n'
        f"options = {json.dumps(options).replace(':', ' =')}\n"
    )
    runs = tmp_path / "runs"
    command = [sys.executable, "-m", "keelrl.benchmarks.leaderboard", "--grid", str(grid_file), "--workers", "1",
               "--runs-dir", str(runs), "--out-dir", str(tmp_path / "out")]
    first = subprocess.Popen(command, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cell = leaderboard.expand(leaderboard.load_grid(str(grid_file)), runs)[0]
    deadline = time.monotonic() + 60
    while cell.state()[0] != "resume" and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(first.pid, signal.SIGKILL)  # the leaderboard and its agent process die at once
    first.wait()
    state, run_dir = cell.state()
    assert state == "resume", "no checkpoint was written within 60 s"
    with open(run_dir / "episodes.csv") as f:
        before = list(csv.DictReader(f))

    (result,) = leaderboard.run_grids([cell.grid], runs, workers=1, log=lambda _: None)
    assert result.status == "done" and result.run_dir == str(run_dir)  # the same run directory, continued
    # the killed attempt is recorded as it started, its end never: the run's wall time is not measured (the resumed
    # attempt's alone would overstate its speed)
    attempts = cell.record()["attempts"]
    assert [(a["mode"], a["returncode"], a["wall_s"] is None) for a in attempts] == [("new", None, True),
                                                                                     ("resume", 0, False)]
    assert np.isnan(result.wall_s) and np.isnan(result.sps)
    log = (cell.cell_dir / "log.txt").read_text()
    assert f"resume run: python -m keelrl.agents.sac --resume {run_dir.resolve()}" in log
    assert int(eval_rows(run_dir)[-1]["global_step"]) == 300
    with open(run_dir / "episodes.csv") as f:
        after = list(csv.DictReader(f))
    steps = [int(row["global_step"]) for row in after]
    assert steps == sorted(set(steps))  # no duplicate, no step twice
    kept = [row for row in before if int(row["global_step"]) <= 100]
    assert after[: len(kept)] == kept  # what the checkpoint covered is unchanged


def test_sigterm_to_the_leaderboard_stops_its_agents_with_their_checkpoints(tmp_path):
    """SIGTERM to the leaderboard's process alone (what a scheduler sends) ended it at once, silently, and left its
    agent process training, orphaned; running the grid again then resumed a run that was still training."""
    grid_file = tmp_path / "terminated.toml"
    grid_file.write_text('name = "terminated"\nseeds = [1]\nsteps = 100000\ntasks = ["InvertedPendulum-v5"]\n'
                         'agents = ["sac"]\noptions = ' + json.dumps(TINY).replace(":", " =") + "\n")
    runs = tmp_path / "runs"
    command = [sys.executable, "-m", "keelrl.benchmarks.leaderboard", "--grid", str(grid_file), "--workers", "1",
               "--runs-dir", str(runs), "--out-dir", str(tmp_path / "out")]
    leader = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    cell = leaderboard.expand(leaderboard.load_grid(str(grid_file)), runs)[0]
    deadline = time.monotonic() + 60
    while not list(runs.glob("**/episodes.csv")) and time.monotonic() < deadline:  # the agent trains
        time.sleep(0.05)
    leader.send_signal(signal.SIGTERM)
    assert leader.wait(timeout=60) == 128 + signal.SIGTERM
    assert "SIGTERM: stopped; run the same command again to resume the unfinished cells" in leader.stderr.read()
    state, run_dir = cell.state()
    assert state == "resume"  # the agent checkpointed as it stopped
    (attempt,) = cell.record()["attempts"]
    assert attempt["returncode"] == 128 + signal.SIGTERM and attempt["wall_s"] > 0
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(runs) not in ps  # no agent process left behind


def test_a_cell_stopped_by_a_signal_is_unfinished_and_one_that_crashed_is_failed(tmp_path):
    grid_file = tmp_path / "stopped.toml"
    grid_file.write_text('name = "stopped"\nseeds = [1]\nsteps = 300\ntasks = ["InvertedPendulum-v5"]\n'
                         'agents = ["sac"]\n')
    cell = leaderboard.expand(leaderboard.load_grid(str(grid_file)), tmp_path / "runs")[0]
    cell.prepare()
    for returncode, status in ((None, "unfinished"), (128 + signal.SIGINT, "unfinished"),
                               (128 + signal.SIGTERM, "unfinished"), (1, "failed")):
        cell.start_attempt("new", {"start_time": 1.0})
        if returncode is not None:  # None: the attempt's end was never recorded
            cell.end_attempt({"returncode": returncode, "wall_s": 1.0})
        assert cell.result().status == status, returncode


def test_a_grid_runs_on_a_local_ray_instance(tmp_path):
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'keelrl[ray]' to run this test")
    options = [arg for name, value in TINY.items() for arg in ("--option", f"{name}={json.dumps(value)}")]
    argv = ["--agents", "sac", "--tasks", TASK, "--seeds", "1", "2", "--steps", "200", *options,
            "--name", "ray-grid", "--ray", "local", "--workers", "2", "--runs-dir", str(tmp_path / "runs"),
            "--out-dir", str(tmp_path / "out"), "--bootstrap-reps", "200"]
    assert leaderboard.main(argv) == 0
    assert not ray.is_initialized()  # the local instance it started is shut down
    finals = []
    for cell in leaderboard.expand(tiny_grid("ray-grid", ["sac"]), tmp_path / "runs"):
        (attempt,) = cell.record()["attempts"]
        assert attempt["returncode"] == 0 and attempt["worker_pid"] != os.getpid()  # ran inside a Ray worker
        state, run_dir = cell.state()
        assert state == "done"
        last = eval_rows(run_dir)[-1]
        assert int(last["global_step"]) == 200
        finals.append(float(last["mean_return"]))
    page = (tmp_path / "out" / "ray-grid.md").read_text()
    assert "Execution: Ray (local), --workers 2" in page
    # the cell's figures: mean ± std (ddof 0) of the two seeds' final returns, and of their scores R / 10
    returns, scores = np.array(finals), np.array(finals) / 10.0
    assert (f"| sac | InvertedPendulum-v5 | 200 | 2/2 | {returns.mean():.1f} ± {returns.std():.1f} | "
            f"{scores.mean():.1f} ± {scores.std():.1f} |") in page


def test_the_page_records_no_local_path(tmp_path):
    """Commands and notes on a committed page name paths relative to the repository, or by placeholders."""
    argv = ["--agents", "sac", "--tasks", TASK, "--seeds", "1", "--steps", "200", "--report-only", "--name", "paths",
            "--runs-dir", str(tmp_path / "runs"), f"--out-dir={tmp_path / 'out'}", "--bootstrap-reps", "10",
            "--note", f"datasets in {tmp_path}/data, grids in {leaderboard.REPOSITORY}/benchmarks/grids, 1/2 done"]
    assert leaderboard.main(argv) == 1  # the one cell has not run
    page = (tmp_path / "out" / "paths.md").read_text()
    assert str(tmp_path) not in page and str(leaderboard.REPOSITORY) not in page
    assert "--runs-dir RUNS_DIR --out-dir=OUT_DIR" in page
    assert page.count("datasets in LOCAL_PATH, grids in benchmarks/grids, 1/2 done") == 2  # the command and the note


def test_the_page_links_the_grids_findings_when_they_are_beside_it(tmp_path):
    """`findings`: the grid's page links the hand-written page it names once that page is in --out-dir, and only
    then (a link from a page written elsewhere would lead nowhere); a path instead of a file name is refused."""
    grid_file = tmp_path / "found.toml"
    grid_file.write_text(f'findings = "found-findings.md"\nseeds = [1]\nsteps = 200\ntasks = ["{TASK}"]\n'
                         f'agents = ["sac"]\n')
    argv = ["--grid", str(grid_file), "--report-only", "--runs-dir", str(tmp_path / "runs"),
            "--out-dir", str(tmp_path / "out"), "--bootstrap-reps", "10"]
    link = "[found-findings.md](found-findings.md)"
    assert leaderboard.main(argv) == 1  # the one cell has not run
    assert link not in (tmp_path / "out" / "found.md").read_text()
    (tmp_path / "out" / "found-findings.md").write_text("# what was checked\n")
    assert leaderboard.main(argv) == 1
    assert f"- Findings (written by hand: what was checked where an entry misses its published figure): {link}\n" in (
        tmp_path / "out" / "found.md").read_text()
    with pytest.raises(ValueError, match="file name in the page's folder"):
        leaderboard.grid_from_dict({"tasks": [TASK], "agents": ["sac"], "steps": 10, "findings": "../x.md"}, "g")


def test_runs_of_the_committed_tables_are_taken_not_run_again(tmp_path):
    """--from-committed: a cell this machine holds no run of is taken from the page's tables (an earlier session's
    or another machine's runs), figures and curve unchanged; a row made with other options is refused."""
    options = [arg for name, value in TINY.items() for arg in ("--option", f"{name}={json.dumps(value)}")]
    common = ["--agents", "sac", "--tasks", TASK, "--steps", "200", "--name", "page", "--workers", "1",
              "--out-dir", str(tmp_path / "out"), "--bootstrap-reps", "10"]
    assert leaderboard.main([*common, *options, "--seeds", "1", "--runs-dir", str(tmp_path / "earlier")]) == 0
    with open(tmp_path / "out" / "page_runs.csv") as f:
        (earlier,) = list(csv.DictReader(f))
    assert earlier["options"].startswith("--seed 1 --learning-starts 200")
    earlier_curve = (tmp_path / "out" / "page_curves.csv").read_text().splitlines()[1:]

    here = tmp_path / "here"  # a fresh machine: seed 1 only in the committed tables, seed 2 nowhere
    argv = [*common, *options, "--seeds", "1", "2", "--runs-dir", str(here), "--from-committed"]
    assert leaderboard.main(argv) == 0
    assert not (here / "page" / "sac" / TASK / "seed1").exists()  # not run again
    assert (here / "page" / "sac" / TASK / "seed2" / "cell.json").is_file()
    with open(tmp_path / "out" / "page_runs.csv") as f:
        rows = list(csv.DictReader(f))
    assert [row["seed"] for row in rows] == ["1", "2"] and rows[0] == earlier
    curves = (tmp_path / "out" / "page_curves.csv").read_text().splitlines()[1:]
    assert curves[:2] == earlier_curve and len(curves) == 4  # seed 1's evaluations as committed, then seed 2's
    page = (tmp_path / "out" / "page.md").read_text()
    assert f"Runs taken from the tables page_runs.csv and page_curves.csv (never committed): 1 — sac {TASK} seed 1" in page
    finals = [float(row["final_return"]) for row in rows]
    assert f"| sac | {TASK} | 200 | 2/2 | {np.mean(finals):.1f} ± {np.std(finals):.1f} |" in page

    changed = [arg.replace("batch-size=16", "batch-size=32") for arg in options]
    fresh = ["--runs-dir", str(tmp_path / "fresh"), "--from-committed", "--dry-run"]
    assert leaderboard.main([*common, *changed, "--seeds", "1", *fresh]) == 2  # refused, nothing run
    assert not (tmp_path / "fresh").exists()


def test_curves_get_one_panel_per_task_some_run_has_evaluated(tmp_path):
    """A task whose runs have not evaluated yet (a partial page) gets no empty panel: each panel is 500 px wide."""
    from PIL import Image

    from keelrl.benchmarks.report import plot_curves

    def result(task: str, seed: int, curve: list[tuple[int, float]]) -> RunResult:
        return RunResult("offline-to-online", "entry", "wsrl", task, seed, 100, "unfinished", curve=curve)

    evaluated = [result("keelrl/hopper-medium-v0", seed, [(0, 1.0), (50, 2.0)]) for seed in (1, 2)]
    plot_curves(tmp_path / "partial.png", "offline-to-online", [*evaluated, result("Hopper-v5", 1, [])])
    plot_curves(tmp_path / "both.png", "offline-to-online", [*evaluated, result("Hopper-v5", 1, [(0, 1.0)])])
    assert Image.open(tmp_path / "partial.png").width == 500 and Image.open(tmp_path / "both.png").width == 1000


def write_run(cell, final_return=100.0, steps=200, done=True, dataset=None):
    """A run directory in `cell` as an agent leaves it: config.json, eval.csv (its last evaluation `final_return` at
    `steps`), checkpoint.pt, and model.pt when `done`; `dataset`: its dataset.json."""
    cell.prepare()
    run_dir = cell.cell_dir / f"run{cell.seed}"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps({"algo": cell.agent.module, "config": {"seed": cell.seed}}))
    (run_dir / "eval.csv").write_text("global_step,mean_return,std_return,mean_cost,episodes\n"
                                      f"{steps},{final_return},0.0,0.0,2\n")
    (run_dir / leaderboard.CHECKPOINT_FILE).write_bytes(b"")
    if done:
        (run_dir / leaderboard.MODEL_FILE).write_bytes(b"")
    if dataset is not None:
        (run_dir / "dataset.json").write_text(json.dumps(dataset))
    return run_dir


def recorded_attempt(cells, mode, wall_s, returncode=0, start_time=1.0, seeds=1):
    """One agent process's attempt, recorded in each of `cells` as the leaderboard records it."""
    for cell in cells:
        cell.start_attempt(mode, {"start_time": start_time, "leaderboard": "python -m keelrl.benchmarks.leaderboard",
                                  "seeds_in_process": seeds})
        cell.end_attempt({"returncode": returncode, "start_time": start_time, "wall_s": wall_s, "host": "vm",
                          "usable_cpus": 1})


def finishing_agent(calls):
    """A stand-in for run_agent_process that records each command and, for a --resume, finishes every run of the
    seed group it resumes (model.pt), as the agent would; 30 s of wall time."""
    def run(command, log_path, mode, running=None):
        calls.append(command)
        if "--resume" in command:
            run_dir = Path(command[command.index("--resume") + 1])
            for relative in json.loads((run_dir / "seeds.json").read_text())["runs"]:
                (run_dir / relative / leaderboard.MODEL_FILE).write_bytes(b"")
        return {"returncode": 0, "start_time": time.time(), "wall_s": 30.0, "host": "vm", "usable_cpus": 1}
    return run


@pytest.mark.parametrize("workers", [1, 3])
def test_a_stopped_seed_group_resumes_as_one_process_and_a_cell_found_done_is_never_started(tmp_path, monkeypatch,
                                                                                          workers):
    """Seeds 1-3 trained as one --batch-seeds process (60 s) and stopped: rerun without --batch-seeds, the cells
    resume as one process (each `--resume` resumes the whole group: three of them collided, and with one worker
    seeds 2 and 3, finished by seed 1's resume, were started again as new runs)."""
    grid = tiny_grid("group", ["sac"], seeds=(1, 2, 3))
    cells = leaderboard.expand(grid, tmp_path / "runs")
    run_dirs = [write_run(cell, done=False) for cell in cells]
    for run_dir in run_dirs:
        (run_dir / "seeds.json").write_text(json.dumps({"runs": [os.path.relpath(d, run_dir) for d in run_dirs]}))
    recorded_attempt(cells, "new", wall_s=60.0, returncode=130, seeds=3)
    calls = []
    monkeypatch.setattr(leaderboard.workers, "run_agent_process", finishing_agent(calls))
    messages = []
    leaderboard.run_grids([grid], tmp_path / "runs", dry_run=True, log=messages.append)
    assert [m for m in messages if m.startswith("resume: ")] == [
        f"resume: python -m keelrl.agents.sac --resume {run_dirs[0].resolve()} --quiet"]
    results = leaderboard.run_grids([grid], tmp_path / "runs", workers=workers, log=messages.append)
    assert calls == [["-m", "keelrl.agents.sac", "--resume", str(run_dirs[0].resolve()), "--quiet"]]
    assert [r.status for r in results] == ["done"] * 3
    assert [cell.run_dirs() for cell in cells] == [[run_dir] for run_dir in run_dirs]  # no new run started
    for cell, result in zip(cells, results):
        assert [(a["mode"], a["seeds_in_process"]) for a in cell.record()["attempts"]] == [("new", 3), ("resume", 3)]
        assert result.wall_s == pytest.approx((60.0 + 30.0) / 3)  # its share of both processes

    # a cell found done right before it would start (another process finished it) is not started
    grid = tiny_grid("apart", ["sac"], seeds=(1, 2))
    first, second = leaderboard.expand(grid, tmp_path / "runs")
    for cell in (first, second):
        write_run(cell, done=False)
        recorded_attempt([cell], "new", wall_s=10.0, returncode=130, start_time=float(cell.seed))

    def finishes_both(command, log_path, mode, running=None):
        calls.append(command)
        for cell in (first, second):
            (cell.state()[1] / leaderboard.MODEL_FILE).write_bytes(b"")
        return {"returncode": 0, "start_time": time.time(), "wall_s": 5.0, "host": "vm", "usable_cpus": 1}

    calls.clear()
    monkeypatch.setattr(leaderboard.workers, "run_agent_process", finishes_both)
    messages.clear()
    results = leaderboard.run_grids([grid], tmp_path / "runs", workers=1, log=messages.append)
    assert len(calls) == 1 and [r.status for r in results] == ["done", "done"]
    assert "[2/2] sac InvertedPendulum-v5 seed 2: found done (another process finished it), not started" in messages
    assert len(second.record()["attempts"]) == 1 and second.run_dirs() == [second.cell_dir / "run2"]


def test_an_attempt_stopped_by_ctrl_c_is_recorded_and_a_run_with_an_unrecorded_attempt_is_not_measured(
        tmp_path, monkeypatch):
    """An attempt ended by Ctrl-C reaches cell.json with its wall time (it was recorded only when its process
    returned normally, so a run's steps/s counted its resumed attempt alone: 185 steps/s against 55 real)."""
    import threading

    grid = tiny_grid("stopped", ["sac"], seeds=(1,))
    (cell,) = leaderboard.expand(grid, tmp_path / "runs")

    def stopped_by_ctrl_c(command, log_path, mode, running=None):
        time.sleep(0.2)  # the agent runs
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)  # the user's Ctrl-C reaches the leaderboard
        time.sleep(0.2)  # ... and the agent, which checkpoints and stops
        return {"returncode": 128 + signal.SIGINT, "start_time": 7.0, "wall_s": 12.5, "host": "vm", "usable_cpus": 1}

    monkeypatch.setattr(leaderboard.workers, "run_agent_process", stopped_by_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        leaderboard.run_grids([grid], tmp_path / "runs", workers=1, log=lambda _: None)
    (attempt,) = cell.record()["attempts"]
    assert (attempt["mode"], attempt["returncode"], attempt["wall_s"], attempt["start_time"]) == ("new", 130, 12.5, 7.0)

    # runs whose wall time is not measured: the first recorded attempt resumes the run (seed 1); log.txt shows an
    # attempt more than cell.json records (seed 2); an attempt whose end was never recorded (seed 3); seed 4 measured
    grid = tiny_grid("measured", ["sac"], seeds=(1, 2, 3, 4))
    cells = leaderboard.expand(grid, tmp_path / "runs")
    for cell in cells:
        write_run(cell, steps=200)
    recorded_attempt(cells[:1], "resume", wall_s=2.0)
    recorded_attempt(cells[1:], "new", wall_s=4.0, returncode=130)
    cells[2].start_attempt("resume", {"start_time": 2.0})  # its leaderboard was killed: this attempt never ended
    recorded_attempt(cells[1:], "resume", wall_s=6.0, start_time=3.0)
    (cells[1].cell_dir / "log.txt").write_text("".join(f"=== 2026-01-01 00:00:0{i} on vm: {mode} run: python -m x\n"
                                                       for i, mode in enumerate(("new", "resume", "resume"))))
    results = leaderboard.run_grids([grid], tmp_path / "runs", dry_run=True, log=lambda _: None)
    assert [cell.unrecorded_attempts() for cell in cells] == [1, 1, 0, 0]
    assert np.isnan([r.wall_s for r in results[:3]]).all() and np.isnan([r.sps for r in results[:3]]).all()
    assert results[3].wall_s == 10.0 and results[3].sps == 20.0
    page = page_of(tmp_path, results)
    assert "| 20 (1 of 4 runs measured) | 0.2 (1 of 4 runs measured) |" in page
    assert "| not measured | not measured |" in page_of(tmp_path, results[:3], "none")


def test_a_batched_process_counts_once_and_gives_each_seed_its_share_of_the_wall_time(tmp_path):
    """cpu-evidence-seeds: one process trained seeds 1-3 (50k steps each) in 2107 s. It was counted as 3 processes
    and its whole wall time charged to each seed (24 steps/s, 35.1 min/run beside 69 steps/s for one process per
    seed); it is one process at 3 × 50k / 2107 s = 71 steps/s, 2107 / 3 s per run."""
    grid = tiny_grid("batched", ["sac"], seeds=(1, 2, 3), steps=50_000)
    cells = leaderboard.expand(grid, tmp_path / "runs")
    for cell in cells:
        write_run(cell, steps=50_000)
    recorded_attempt(cells, "new", wall_s=2107.35, seeds=3)
    results = leaderboard.run_grids([grid], tmp_path / "runs", dry_run=True, log=lambda _: None)
    assert [r.wall_s for r in results] == [pytest.approx(2107.35 / 3)] * 3
    assert [r.sps for r in results] == [pytest.approx(3 * 50_000 / 2107.35)] * 3
    assert leaderboard.runs_provenance(cells, "python -m keelrl.benchmarks.leaderboard") == [
        "Runs made by: 1 agent process(es) (1 of them training 3 seeds at once) on vm, each with 1 usable CPU core(s)"]
    assert "| 71 | 11.7 |" in page_of(tmp_path, results)


def test_an_offline_to_online_run_from_scratch_is_scored_with_the_pretraining_datasets_references(tmp_path):
    """SAC from scratch beside CQL pre-training and WSRL fine-tuning on keelrl/hopper-medium-v0 (references 17.5 /
    3234.3): it was scored with D4RL's Hopper range (-20.27 / 3234.3), the only one the page stated, while the page
    said scores the agents log are not in the IQM, which pooled them."""
    spec = {"name": "o2o", "family": "offline-to-online", "seeds": [1], "steps": 100, "task_flag": "dataset",
            "steps_flag": "total-updates", "tasks": ["keelrl/hopper-medium-v0", "Hopper-v5"],
            "agents": [{"name": "cql-pre", "module": "cql", "tasks": ["keelrl/hopper-medium-v0"]},
                       {"name": "wsrl", "module": "wsrl", "pretrained": "cql-pre", "task_flag": "",
                        "steps_flag": "total-timesteps", "tasks": ["keelrl/hopper-medium-v0"]},
                       {"name": "sac-scratch", "module": "sac", "task_flag": "env-id", "steps_flag": "total-timesteps",
                        "tasks": ["Hopper-v5"]}]}
    grid = leaderboard.grid_from_dict(spec, "o2o")
    dataset = {"source": "keelrl/hopper-medium-v0", "env_id": "Hopper-v5", "ref_scores": [17.5, 3234.3]}
    cql, wsrl, sac = leaderboard.expand(grid, tmp_path / "runs")
    write_run(cql, final_return=3000.0, dataset=dataset)
    write_run(wsrl, final_return=3234.3, dataset=dataset)
    write_run(sac, final_return=821.7)  # a run from scratch: no dataset.json
    results = leaderboard.run_grids([grid], tmp_path / "runs", dry_run=True, log=lambda _: None)
    scores = [100 * (value - 17.5) / (3234.3 - 17.5) for value in (3000.0, 3234.3, 821.7)]
    assert [r.score for r in results] == [pytest.approx(score) for score in scores]
    assert {r.score_references for r in results} == {"keelrl/hopper-medium-v0: low 17.5, high 3234.3"}
    assert [entry.iqm for entry in iqm_by_agent(results, reps=100)] == [pytest.approx(score) for score in scores]
    page = page_of(tmp_path, results)
    assert "| sac-scratch | Hopper-v5 | 100 | 1/1 | 821.7 ± 0.0 | 25.0 ± 0.0 |" in page
    assert ("in the table and in the IQM, as benchmarks/checks/offline_to_online.py scores them: "
            "keelrl/hopper-medium-v0: low 17.5, high 3234.3 (cql-pre, wsrl, sac-scratch).") in page
    assert "-20.2723" not in page and "not in the IQM" not in page


def test_a_published_figure_on_another_env_version_is_not_comparable_at_the_same_budget(tmp_path):
    """keelrl's PPO on Hopper-v5 beside CleanRL's on Hopper-v4, both 1M steps: "same budget" alone read as
    comparable."""
    results = [RunResult("online", label, "ppo", task, 1, 1_000_000, "done", steps=1_000_000, final_return=3000.0,
                         score=normalized_score(task, 3000.0)) for label, task in (("v5", "Hopper-v5"),
                                                                                   ("v4", "Hopper-v4"))]
    page = page_of(tmp_path, results)
    v5_row, v4_row = (next(line for line in page.splitlines() if line.startswith(f"| {label} |"))
                      for label in ("v5", "v4"))
    assert v5_row.endswith("| 2382.9 ± 271.7 [1] | 1M env steps on Hopper-v4 vs keelrl 1M on Hopper-v5: "
                           "**not comparable** (other env version: Hopper-v4 vs Hopper-v5) |")
    assert v4_row.endswith("| 2382.9 ± 271.7 [1] | 1M env steps: same budget |")


def test_omnisafes_figures_are_on_another_env_version_than_keelrls_safety_tasks(tmp_path):
    """Safety-Gymnasium's SafetyHopperVelocity-v1 is built on Hopper-v4, keelrl's SafeHopperVelocity-v1 on
    Hopper-v5: both ids end in -v1, and the page called OmniSafe's SAC-Lag figure "same budget"."""
    task = "keelrl/SafeHopperVelocity-v1"
    results = [RunResult("safe", "sac-lag", "sac_lag", task, 1, 1_000_000, "done", steps=1_000_000,
                         final_return=900.0, final_cost=20.0)]
    row = next(line for line in page_of(tmp_path, results).splitlines() if line.startswith("| sac-lag |"))
    assert row.endswith("| 963.5 / cost 20.2 [1] | 1e6 env steps on SafetyHopperVelocity-v1 vs keelrl 1M on "
                        f"{task}: **not comparable** (other env version: Hopper-v4 vs Hopper-v5) |"), row


def test_an_attempt_whose_run_was_started_afresh_is_not_charged_to_it(tmp_path):
    """A first attempt failed before its first checkpoint (900 s); the cell started its run anew and finished it in
    100 s. The run took 100 s (10,000 steps: 100 steps/s); both attempts were once summed (10 steps/s)."""
    grid = tiny_grid("restarted", ["sac"], seeds=(1,), steps=10_000)
    (cell,) = leaderboard.expand(grid, tmp_path / "runs")
    write_run(cell, steps=10_000)
    recorded_attempt([cell], "new", wall_s=900.0, returncode=1)
    recorded_attempt([cell], "new", wall_s=100.0)
    (result,) = leaderboard.run_grids([grid], tmp_path / "runs", dry_run=True, log=lambda _: None)
    assert result.wall_s == pytest.approx(100.0) and result.sps == pytest.approx(100.0)
    recorded_attempt([cell], "resume", wall_s=50.0)  # a resume adds its time to the run it goes on with
    (result,) = leaderboard.run_grids([grid], tmp_path / "runs", dry_run=True, log=lambda _: None)
    assert result.wall_s == pytest.approx(150.0)


def test_grids_that_give_one_entry_two_budgets_are_refused_before_anything_runs(tmp_path, capsys):
    """`--grid online-small online-full` once averaged 15k-step and 1M-step runs of the same entry into one row
    (showing the first budget) and one IQM."""
    grids = [tmp_path / "small.toml", tmp_path / "full.toml"]
    for path, steps in zip(grids, (15_000, 1_000_000)):
        path.write_text(f'name = "{path.stem}"\nfamily = "online"\nseeds = [1]\nsteps = {steps}\n'
                        f'tasks = ["{TASK}"]\nagents = ["sac"]\n')
    assert leaderboard.main(["--grid", *map(str, grids), "--runs-dir", str(tmp_path / "runs"), "--dry-run"]) == 2
    assert capsys.readouterr().err == (
        f"error: agent entry 'sac' on {TASK} has more than one budget in these grids: 15000 (small), 1000000 (full); "
        f"one page row averages one budget: write a page per grid, or name the entries apart.\n")
    assert not (tmp_path / "runs").exists()


def test_curves_average_the_finished_runs_as_the_table_does(tmp_path, monkeypatch):
    """Two finished runs to 10k and one that failed at 2.5k: the curve is the finished runs' (it was the three's,
    cut at 2.5k); a page of runs that have not finished yet still draws theirs."""
    from keelrl.benchmarks import report

    drawn = []
    monkeypatch.setattr("matplotlib.axes.Axes.plot", lambda ax, steps, mean, label: drawn.append((list(steps),
                                                                                                  list(mean), label)))
    monkeypatch.setattr("matplotlib.axes.Axes.fill_between", lambda *args, **kwargs: None)

    def result(seed, status, curve):
        return RunResult("online", "sac", "sac", TASK, seed, 10_000, status, final_return=curve[-1][1], curve=curve)

    finished = [result(seed, "done", [(2500, 250.0), (10_000, 1000.0)]) for seed in (1, 2)]
    report.plot_curves(tmp_path / "a.png", "online", [*finished, result(3, "failed", [(2500, -5.0)])])
    assert drawn == [([2500, 10_000], [250.0, 1000.0], "sac (2 seeds)")]
    drawn.clear()
    report.plot_curves(tmp_path / "b.png", "online", [result(3, "unfinished", [(2500, -5.0)])])
    assert drawn == [([2500], [-5.0], "sac (1 seeds)")]


def test_an_offline_page_states_the_reference_returns_its_scores_use(tmp_path):
    """The offline page said its scores use "its dataset's reference returns" and never which: a dataset without
    its own gets D4RL's (buffers/offline.py reference_scores)."""
    spec = {"name": "off", "family": "offline", "seeds": [1], "steps": 100, "task_flag": "dataset",
            "steps_flag": "total-updates", "tasks": ["keelrl/hopper-medium-v0"], "agents": ["cql"]}
    grid = leaderboard.grid_from_dict(spec, "off")
    (cell,) = leaderboard.expand(grid, tmp_path / "runs")
    write_run(cell, final_return=1000.0,
              dataset={"source": "keelrl/hopper-medium-v0", "env_id": "Hopper-v5", "ref_scores": [17.5, 3234.3]})
    results = leaderboard.run_grids([grid], tmp_path / "runs", dry_run=True, log=lambda _: None)
    assert "logged as eval/normalized_score: keelrl/hopper-medium-v0: low 17.5, high 3234.3)" in page_of(tmp_path,
                                                                                                         results)


ONLINE_FULL_ARGS = ["--seed", "{seed}", "--eval-freq", "10000", "--eval-episodes", "10", "--checkpoint-freq", "50000",
                    "--precision", "bf16", "--env-id", "Hopper-v4", "--total-timesteps", "300000"]


def test_cells_laid_out_by_an_earlier_leaderboard_are_still_read_and_resumed(tmp_path):
    """A seed group as the leaderboard of commit bf10c32 left it under RUNS_DIR while it trained (online-full's SAC
    on Hopper-v4, seeds 1-3 in one --batch-seeds process, stopped before its end was recorded), written here file by
    file with the literal names and columns: the package reads its state, figures and provenance as then, and
    resumes the whole group with one process."""
    runs = tmp_path / "runs"
    invocation = ("python -m keelrl.benchmarks.leaderboard --grid online-full --workers 1 --batch-seeds --runs-dir "
                  "RUNS_DIR --out-dir OUT_DIR --entries sac")
    machine = "AMD EPYC (avx512_bf16); Python 3.11.7, torch 2.13.0+cpu, gymnasium 1.4.0, mujoco 3.17.0; keelrl bf10c32"
    seed_dirs = {seed: runs / "online-full" / "sac" / "Hopper-v4" / f"seed{seed}" for seed in (1, 2, 3)}
    run_dirs = {seed: seed_dirs[seed] / f"Hopper-v4__sac__{seed}__179583685{8 + (seed > 1)}" for seed in (1, 2, 3)}
    for seed, run_dir in run_dirs.items():
        run_dir.mkdir(parents=True)
        args = [arg.format(seed=seed) for arg in ONLINE_FULL_ARGS]
        (seed_dirs[seed] / "cell.json").write_text(json.dumps({
            "agent": "sac", "task": "Hopper-v4", "seed": seed, "args": args,
            "attempts": [{"mode": "new", "start_time": 1795836855.0933726, "leaderboard": invocation,
                          "seeds_in_process": 3, "returncode": None, "wall_s": None, "machine": machine}]},
            indent=2))
        if seed == 1:  # the process's output goes to its first cell's log
            (seed_dirs[seed] / "log.txt").write_text(
                "=== 2026-11-28 03:34:15 on vm: new run: python -m keelrl.agents.sac " + " ".join(args)
                + f" --num-seeds 3 --runs-dir {runs}/online-full/sac/Hopper-v4/seed{{seed}} --quiet\n"
                "warning (DeprecationWarning): WARN: The environment Hopper-v4 is out of date.\n")
        (run_dir / "config.json").write_text(json.dumps({"algo": "sac", "config": {"seed": seed,
                                                                                   "runs_dir": str(seed_dirs[seed])}}))
        (run_dir / "eval.csv").write_text("global_step,mean_return,std_return,mean_cost,episodes\n"
                                          f"10000,265.9,2.6,0.0,10\n20000,{230.0 + seed},17.8,0.0,10\n")
        (run_dir / "episodes.csv").write_text("global_step,return,length,cost\n13,10.1,13,0.0\n34,24.5,21,0.0\n")
        (run_dir / "checkpoint.pt").write_bytes(b"")
        (run_dir / "buffer.pt").write_bytes(b"")
        (run_dir / "run.lock").write_text("")
        (run_dir / "seeds.json").write_text(json.dumps(  # each run names the group's runs, itself as "."
            {"runs": ["." if other == seed else f"../../seed{other}/{run_dirs[other].name}" for other in (1, 2, 3)]},
            indent=2))

    grid = leaderboard.grid_from_dict({
        "name": "online-full", "family": "online", "seeds": [1, 2, 3], "steps": 300000, "tasks": ["Hopper-v4"],
        "agents": ["sac"], "options": {"eval-freq": 10000, "eval-episodes": 10, "checkpoint-freq": 50000,
                                       "precision": "bf16"}}, "online-full")
    cells = leaderboard.expand(grid, runs)
    assert [cell.cell_dir for cell in cells] == list(seed_dirs.values())
    assert [cell.state() for cell in cells] == [("resume", run_dirs[seed]) for seed in (1, 2, 3)]
    for cell in cells:
        cell.check_unchanged()  # the recorded options are what the grid asks for
        assert cell.unrecorded_attempts() == 0 and np.isnan(cell.wall_seconds())
    assert cells[0].seed_group() == tuple(run_dirs[seed].resolve() for seed in (1, 2, 3))
    result = cells[0].result()
    assert (result.status, result.label, result.task, result.budget, result.machine) == (
        "unfinished", "sac", "Hopper-v4", 300000, machine)
    assert result.curve == [(10000, 265.9), (20000, 231.0)] and result.options == " ".join(cells[0].args)
    assert leaderboard.runs_provenance(cells, invocation) == [
        "Runs made by: 1 agent process(es) (1 of them training 3 seeds at once; 1 of them ended without a record, "
        "their runs' wall time not measured)"]

    messages = []
    leaderboard.run_grids([grid], runs, dry_run=True, log=messages.append)
    assert messages[1:] == [f"resume: python -m keelrl.agents.sac --resume {run_dirs[1].resolve()} --quiet"]
    (run_dirs[1] / "model.pt").write_bytes(b"")  # seed 1 finished
    assert cells[0].state() == ("done", run_dirs[1]) and cells[0].result().status == "done"
