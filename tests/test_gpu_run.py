"""The GPU run's scripts (benchmarks/gpu/) end to end on the CPU with --tiny: speed, evidence, the page."""

import csv
import dataclasses
import json
import statistics
import textwrap
import types

import pytest

from keelrl.benchmarks.gpu import evidence, page, page_learning, page_speed, speed
from keelrl.benchmarks.perf import rates

# Stand-ins for the reference scripts, which live outside the repository: CleanRL's writes charts/SPS points to
# TensorBoard (here at wall times of exactly 40 steps/s after the burn-in), LeanRL's prints its progress bar.
FAKE_CLEANRL = """
import sys
from torch.utils.tensorboard import SummaryWriter

writer = SummaryWriter("runs/fake")
for step in range(100, 400, 100):
    writer.add_scalar("charts/SPS", 1, step, walltime=1000.0 + step / 40)
writer.close()
"""
FAKE_LEANRL = """
import sys

assert "--measure-burnin" in sys.argv
print("\\r 55.0000 sps, global_step=200\\r 61.5000 sps, global_step=300", file=sys.stderr)
"""


def read(path):
    with path.open() as file:
        return list(csv.DictReader(file))


@pytest.fixture
def references(tmp_path):
    for name, text in (("cleanrl/sac_continuous_action.py", FAKE_CLEANRL),
                       ("leanrl/sac_continuous_action_torchcompile.py", FAKE_LEANRL)):
        (tmp_path / "ref" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "ref" / name).write_text(textwrap.dedent(text))
    (tmp_path / "commit.txt").write_text("abc1234\n")
    return tmp_path / "ref"


def test_window_rate_times_the_steps_after_the_burn_in():
    points = [(100, 10.0), (200, 11.0), (300, 11.5), (400, 12.0)]
    assert rates.window_rate(points, from_step=200) == pytest.approx(200 / 1.0)
    with pytest.raises(ValueError, match="fewer than two"):
        rates.window_rate(points, from_step=400)


def test_tiny_run_on_the_cpu_gives_the_speed_table_the_smoke_runs_and_the_learning_page(references, tmp_path):
    results = tmp_path / "results"
    speed.main(speed.Args(out=results, device="cpu", references=references, algos=("sac",), tiny=True,
                          smoke_agents=("sac",), seeds=0))
    rows = {row["setting"]: row for row in read(results / "speed.csv") if row["algo"] == "sac"}
    assert float(rows["eager"]["steps_per_s"]) > 0 and rows["eager"]["implementation"] == "keelrl"
    cleanrl = next(row for row in read(results / "speed.csv") if row["implementation"] == "cleanrl")
    assert float(cleanrl["steps_per_s"]) == pytest.approx(40.0)  # from step 150 (100 random + 50 burn-in) on
    assert float(rows["torch.compile"]["steps_per_s"]) == 61.5  # LeanRL's own last figure
    assert rows["--cudagraphs"]["note"] == "not measured: needs CUDA"
    [smoke] = read(results / "smoke.csv")
    assert (smoke["agent"], smoke["returncode"], smoke["steps"], smoke["error"]) == ("sac", "0", "160", "")
    environment = json.loads((results / "environment.json").read_text())
    assert environment["commit"] == "abc1234" and environment["tiny"]

    runs = tmp_path / "evidence"
    args = evidence.Args("run", runs_dir=runs, device="cpu", tiny=True, agents=("sac-scalar",),
                         commit_file=references.parent / "commit.txt")
    evidence.run(args)
    evidence.collect(dataclasses.replace(args, action="collect", out=results))
    learning = read(results / "learning.csv")
    assert sorted((int(row["seed"]), int(row["step"])) for row in learning) == \
        [(seed, step) for seed in (1, 2, 3) for step in (100, 200, 300)]
    assert all(row["normalized_score"] == "" and float(row["mean_return"]) > 0 for row in learning)
    progress = read(results / "progress.csv")
    assert [(row["agent"], row["state"], row["last_evaluation"], row["budget"]) for row in progress] == \
        [("sac-scalar", "done", "300", "300")] * 3
    assert all(float(row["steps_per_s"]) > 0 for row in progress)  # from the first evaluation (step 100) on
    mean_return = statistics.mean(float(row["mean_return"]) for row in learning if row["step"] == "300")

    leases = tmp_path / "leases.md"
    leases.write_text("**Speed table** (a lease of *this* run).\n")
    written = page.write_page(page.Args(results=(results,), out=tmp_path / "gpu.md", leases=leases))
    text = written.read_text()
    assert "A trial with --tiny" in text and "abc1234" in text
    summary = text.split("## Summary\n\n")[1].split("\n\n")[0].splitlines()
    keelrl = max((row for row in read(results / "speed.csv") if row["implementation"] == "keelrl"
                  and row["steps_per_s"]), key=lambda row: float(row["steps_per_s"]))
    best = float(keelrl["steps_per_s"])
    assert summary[0] == f"- SAC: keelrl's best ({keelrl['setting']}, {best:.1f} steps/s) is {best / 61.5:.2f}× " \
                         f"LeanRL's best, {best / 40.0:.2f}× CleanRL."
    assert summary[-3:-1] == ["- gpu-evidence-online (evaluation return, mean over seeds, highest first):",
                              f"  - at the 300-step budget: sac-scalar {mean_return:.1f}"]
    how = text.split("## How it was run\n\n")[1].split("## Speed")[0]
    assert how.rstrip().endswith("**Speed table** (a lease of *this* run).")  # the leases' file, as it is
    assert "| SAC | cleanrl | eager | 40.0 | 1.00× | 0.65× |" in text  # 40 / 61.5 = 0.65
    assert "### gpu-evidence-online: at step 300" in text
    assert "The learning cells ran on CPU (cpu)" in text and "at commit abc1234." in text
    assert (tmp_path / "gpu_curves.png").stat().st_size > 0


def test_evidence_with_batch_seeds_runs_an_entrys_seeds_as_one_process_and_collects_each(tmp_path):
    args = evidence.Args("run", runs_dir=tmp_path / "evidence", device="cpu", tiny=True, agents=("sac-scalar",),
                         batch_seeds=True, commit_file=tmp_path / "commit.txt")
    evidence.run(args)
    evidence.collect(dataclasses.replace(args, action="collect", out=tmp_path / "results"))
    learning = read(tmp_path / "results" / "learning.csv")
    assert sorted({int(row["seed"]) for row in learning}) == [1, 2, 3]
    run_dirs = sorted(tmp_path.glob("evidence/**/seeds.json"))  # a --num-seeds group's runs name each other
    assert len(run_dirs) == 3 and len(json.loads(run_dirs[0].read_text())["runs"]) == 3


def write_rows(path, rows):
    """A CSV table of `rows` (dicts of the same keys), as the leaderboard writes its tables."""
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def test_learning_table_compares_at_the_step_every_cell_reached():
    progress = [dict(grid="g", agent=agent, task="t", seed=seed, state="resume", last_step=last, last_evaluation=ev,
                     budget="100000", steps_per_s=rate) for agent, seed, last, ev, rate in
                [("cql", 1, "12000", "10000", "30.0"), ("cql", 2, "9000", "5000", "20.0"),
                 ("iql", 1, "16000", "15000", "")]]
    learning = [dict(grid="g", agent=agent, task="t", seed=seed, step=step, mean_return="0", normalized_score=score)
                for agent, seed, step, score in
                [("cql", 1, 5000, "40"), ("cql", 1, 10000, "50"), ("cql", 2, 5000, "30"), ("iql", 1, 5000, "44"),
                 ("iql", 1, 10000, "60")]]
    lines = page_learning.learning_section(learning, progress)
    assert lines[0] == "### g: at step 5,000 (the last evaluation every cell reached)"
    assert "| cql | 35.0 ± 5.0 | 2 | 12,000, 9,000 (100,000) | 25.0 | not reached |" in lines
    assert "| iql | 44.0 ± 0.0 | 1 | 16,000 (100,000) | not recorded | not reached |" in lines
    behaviour = page_learning.BEHAVIOUR_SCORE
    assert f"| behaviour policy (the dataset) | {behaviour} | | | | {behaviour} |" in lines
    assert page_learning.learning_summary(learning, progress) == [
        "- g (normalised score, mean over seeds, highest first):",
        "  - at step 5,000, the last every cell reached: iql 44.0, cql 35.0",
        "  - at the 100,000-step budget: not reached by cql, iql",
        f"  - the behaviour policy (the dataset): {page_learning.BEHAVIOUR_SCORE}"]


def test_learning_table_gives_the_entries_that_reached_the_budget_beside_the_cpu_leaderboards_figures(tmp_path):
    """SimbaV2 reached the budget on a later lease, SAC did not; the CPU leaderboard's SAC at that budget, task and
    name stands beside them, at the common step and the budget, its other entries and budgets do not; a second
    CPU leaderboard's SimbaV2 stands in the table from its first finished seed, in the summary once all are."""
    progress = [dict(grid="g", agent=agent, task="Hopper-v5", seed=seed, state=state, last_step=last,
                     last_evaluation=ev, budget="10000", steps_per_s="") for agent, seed, state, last, ev in
                [("sac", 1, "resume", "7200", "5000"), ("simbav2", 1, "done", "10000", "10000"),
                 ("simbav2", 2, "done", "10000", "10000")]]
    learning = [dict(grid="g", agent=agent, task="Hopper-v5", seed=seed, step=step, mean_return=value,
                     normalized_score="") for agent, seed, step, value in
                [("sac", 1, 5000, "300.0"), ("simbav2", 1, 5000, "400.0"), ("simbav2", 1, 10000, "900.0"),
                 ("simbav2", 2, 5000, "500.0"), ("simbav2", 2, 10000, "1100.0")]]
    cpu = [dict(family="online", label=label, task=task, budget=budget, seeds_done=done, seeds_planned="3",
                return_mean="2165.07", return_std="724.47") for label, task, budget, done in
           [("sac", "Hopper-v5", "10000", "3"), ("sac", "Hopper-v5", "50000", "3"), ("sac-c51", "Hopper-v5", "10000",
            "3"), ("sac", "Walker2d-v5", "10000", "3"), ("simbav2", "Hopper-v5", "10000", "0")]]
    curves = [dict(family="online", agent="sac", task="Hopper-v5", seed=seed, step=step, eval_return=value)
              for seed, step, value in [(1, 5000, "100.0"), (2, 5000, "200.0"), (3, 5000, "300.0"), (1, 10000, "9.0")]]
    simba = [dict(cpu[0], label="simbav2", seeds_done="1", return_mean="2900.0", return_std="0.0")]
    simba_curves = [dict(curves[0], agent="simbav2", step=10000, eval_return="2900.0")]
    (tmp_path / "leaderboard").mkdir()
    for name, rows in (("cpu_cells.csv", cpu), ("cpu_curves.csv", curves), ("simba_cells.csv", simba),
                       ("simba_curves.csv", simba_curves)):
        write_rows(tmp_path / "leaderboard" / name, rows)
    leaderboard = page_learning.cpu_leaderboard(tmp_path / "leaderboard" / "cpu_cells.csv", tmp_path / "gpu.md")
    assert leaderboard.page == "leaderboard/cpu.md"
    simba_leaderboard = page_learning.cpu_leaderboard(tmp_path / "leaderboard" / "simba_cells.csv",
                                                      tmp_path / "gpu.md")
    lines = page_learning.learning_section(learning, progress, (leaderboard, simba_leaderboard))
    assert lines[0] == "### g: at step 5,000 (the last evaluation every cell reached)"
    assert "| sac | 300.0 ± 0.0 | 1 | 7,200 (10,000) | not recorded | not reached |" in lines
    assert "| simbav2 | 450.0 ± 50.0 | 2 | 10,000, 10,000 (10,000) | not recorded | 1000.0 ± 100.0 |" in lines
    assert [line for line in lines if "on a CPU" in line] == [
        "| keelrl on a CPU (leaderboard/cpu.md), Hopper-v5: sac | 200.0 ± 81.6 | 3 | 10,000 (10,000) | | "
        "2165.1 ± 724.5 |",
        "| keelrl on a CPU (leaderboard/simba.md), Hopper-v5: simbav2 |  | 1 | 10,000 (10,000) | | 2900.0 ± 0.0 |"]
    nothing = page_learning.cpu_leaderboard(tmp_path / "none_cells.csv", tmp_path)
    assert page_learning.learning_section(learning, progress, (nothing,)) \
        == page_learning.learning_section(learning, progress)  # no CPU leaderboard there: no rows
    assert "| published, Hopper-v4 at 100k: SAC | | 10 | 100,000 | | 1103 |" in lines
    published = "  - published, Hopper-v4 at 100k steps: SimbaV2 (UTD 2) 2821.0, SAC 1103.0"
    summary = [
        "- g (evaluation return, mean over seeds, highest first):",
        "  - at step 5,000, the last every cell reached: simbav2 450.0, sac 300.0",
        "  - at the 10,000-step budget: simbav2 1000.0; not reached by sac",
        "  - keelrl on a CPU (leaderboard/cpu.md) at the 10,000-step budget: sac 2165.1", published]
    summary_of = page_learning.learning_summary
    assert summary_of(learning, progress, (leaderboard, simba_leaderboard)) == summary  # 1 of 3 seeds
    simba_leaderboard.cells[0]["seeds_done"] = "3"
    assert page_learning.learning_summary(learning, progress, (leaderboard, simba_leaderboard)) == [*summary[:-1],
        "  - keelrl on a CPU (leaderboard/simba.md) at the 10,000-step budget: simbav2 2900.0", published]
    finished = [row for row in progress if row["agent"] == "simbav2"]
    assert page_learning.learning_summary(learning, finished) == [
        "- g (evaluation return, mean over seeds, highest first):", "  - at the 10,000-step budget: simbav2 1000.0",
        published]
    behind = dict(finished[0], seed=3, state="resume", last_step="9000", last_evaluation="5000")
    assert page_learning.learning_summary(learning, [*finished, behind])[2] == \
        "  - at the 10,000-step budget: not reached by simbav2"  # a seed short of it: not the others' mean


def test_an_entry_that_got_further_stands_beside_the_cpu_leaderboards_entries_at_their_furthest_shared_step(tmp_path):
    """SimbaV2 got to 15k on the GPU (evaluations every 5k), SAC to 5k; the CPU's finished SAC, evaluated every 10k to
    20k, stands beside SimbaV2 at 10k, the furthest step both were evaluated at by every seed, and not once a seed of
    it is missing there."""
    progress = [dict(grid="g", agent=agent, task="Hopper-v5", seed=seed, state="resume", last_step=last,
                     last_evaluation=ev, budget="20000", steps_per_s="") for agent, seed, last, ev in
                [("sac", 1, "7000", "5000"), ("simbav2", 1, "16000", "15000"), ("simbav2", 2, "16000", "15000")]]
    learning = [dict(grid="g", agent=agent, task="Hopper-v5", seed=seed, step=step, mean_return=value,
                     normalized_score="") for agent, seed, step, value in
                [("sac", 1, 5000, "300.0"), *[("simbav2", seed, step, str(step / 10 + seed * 100)) for seed in (1, 2)
                                               for step in (5000, 10000, 15000)]]]
    curves = [dict(family="online", agent="sac", task="Hopper-v5", seed=str(seed), step=str(step),
                   eval_return=str(step / 100 + seed)) for seed in (1, 2) for step in (10000, 20000)]
    cells = [dict(family="online", label="sac", task="Hopper-v5", budget="20000", seeds_done="2", seeds_planned="2",
                  return_mean="201.5", return_std="0.5")]
    write_rows(tmp_path / "cpu_cells.csv", cells)
    write_rows(tmp_path / "cpu_curves.csv", curves)
    cpu = page_learning.cpu_leaderboard(tmp_path / "cpu_cells.csv", tmp_path / "gpu.md")
    lines = page_learning.learning_section(learning, progress, (cpu,))
    start = lines.index("### g: at step 10,000, the furthest at which entries of the GPU's and of the CPU's stand "
                        "side by side")
    assert lines[start + 4:start + 6] == ["| simbav2 | 1150.0 ± 50.0 | 2 | 1650.0 ± 50.0 (15,000) |",
                                          "| sac (on a CPU, cpu.md) | 101.5 ± 0.5 | 2 | 201.5 ± 0.5 (20,000) |"]
    assert "  - at step 10,000, the furthest at which entries of the GPU's and of the CPU's stand side by side: " \
           "simbav2 1150.0, sac (on a CPU, cpu.md) 101.5" in page_learning.learning_summary(learning, progress, (cpu,))
    cpu.curves.remove(curves[2])  # seed 2's evaluation at 10k: no step past 5k that both sides' seeds share
    assert page_learning.side_by_side(learning, progress, "g", (cpu,)) == (0, {})
    assert not any("side by side" in line for line in page_learning.learning_section(learning, progress, (cpu,)))
    assert not any("side by side" in line for line in page_learning.learning_section(learning, progress, ()))


def test_sync_counting_counts_the_sync_warnings_by_line_and_passes_the_others_on(monkeypatch, recwarn):
    import warnings

    from keelrl.benchmarks.gpu import syncs

    def agent_script(module, run_name, alter_sys):  # stands in for a keelrl agent on a GPU
        assert module == "keelrl.agents.sac" and run_name == "__main__"
        for _ in range(3):
            warnings.warn("called a synchronizing CUDA operation")
        warnings.warn("something else")
        raise SystemExit(0)

    monkeypatch.setattr(syncs.runpy, "run_module", agent_script)
    code, counts = syncs.run_counting("sac", ["--env-id", "Hopper-v5"])
    assert code == 0 and list(counts.values()) == [3]
    [where] = counts
    assert where.startswith("tests/test_gpu_run.py:")  # relative to the package
    assert [str(w.message) for w in recwarn] == ["something else"]


def test_only_times_the_named_settings_and_refuses_an_unknown_name(tmp_path):
    args = speed.Args(out=tmp_path, device="cuda", only=("keelrl:--cudagraphs",))
    chosen = [setting.name for setting in speed.SETTINGS if not speed.unavailable(args, "sac", setting)]
    assert chosen == ["--cudagraphs"]
    assert speed.unavailable(args, "sac", speed.SETTINGS[0]) == "not measured: not among --only"
    with pytest.raises(SystemExit, match="no setting named"):
        speed.main(speed.Args(out=tmp_path, only=("keelrl:cudagraphs",)))


def write_speed_folder(folder, commit: str, rows: list[tuple[str, str]]) -> None:
    folder.mkdir()
    (folder / "environment.json").write_text(json.dumps({"device": "NVIDIA H200", "commit": commit}))
    with (folder / "speed.csv").open("w", newline="") as file:
        writer = csv.DictWriter(file, speed.SPEED_FIELDS)
        writer.writeheader()
        for setting, rate in rows:
            writer.writerow(dict(algo="sac", implementation="keelrl", setting=setting, steps_per_s=rate,
                                 note="" if rate else "not measured: not among --only", command=""))


def test_speed_rows_of_two_leases_merge_and_other_commits_are_refused(tmp_path):
    write_speed_folder(tmp_path / "a", "abc1234", [("eager", "100.0"), ("--cudagraphs", ""), ("--compile", "120.0")])
    write_speed_folder(tmp_path / "b", "abc1234", [("eager", ""), ("--cudagraphs", "400.0"), ("--compile", "130.0")])
    rows = page_speed.merged_speed_rows((tmp_path / "a", tmp_path / "b"))
    assert [(row["setting"], row["steps_per_s"]) for row in rows] == [
        ("eager", "100.0"), ("--cudagraphs", "400.0"), ("--compile", "130.0")]
    write_speed_folder(tmp_path / "c", "def5678", [("eager", "90.0")])
    with pytest.raises(SystemExit, match="commit 'def5678'"):
        page.same_run((tmp_path / "a", tmp_path / "c"))


def test_settings_timed_in_turns_give_each_run_their_mean_and_keelrls_over_leanrls(tmp_path):
    """speed.py --repeats: the page lists each setting's runs in the order they ran, their mean, and keelrl's mean
    over LeanRL's, LeanRL's README figure beside; an unmeasured setting is left out."""
    environment = dict(device="NVIDIA H200", cpus=16, torch="2.11", commit="abc1234", env_id="HalfCheetah-v4",
                       learning_starts=1000, burn_in=300, timed_steps=2000, repeats=2)
    (tmp_path / "environment.json").write_text(json.dumps(environment))
    with (tmp_path / "speed.csv").open("w", newline="") as file:
        writer = csv.DictWriter(file, speed.SPEED_FIELDS)
        writer.writeheader()
        for repeat, leanrl, keelrl in ((1, "400.0", "500.0"), (2, "300.0", "550.0")):
            for implementation, setting, rate in (("leanrl", "torch.compile + CUDA graphs", leanrl),
                                                  ("keelrl", "--cudagraphs", keelrl), ("keelrl", "eager", "")):
                writer.writerow(dict(algo="td3", implementation=implementation, setting=setting, repeat=repeat,
                                     steps_per_s=rate, note="", command=""))
    lines = page_speed.turns_section(tmp_path)
    assert lines[-2:] == ["| TD3 | leanrl | torch.compile + CUDA graphs | 400.0, 300.0 | 350.0 | 1.00× | 936 |",
                          "| TD3 | keelrl | --cudagraphs | 500.0, 550.0 | 525.0 | 1.50× | 936 |"]
    assert page_speed.turns_headline(tmp_path) == [
        "- TD3 on HalfCheetah-v4 (LeanRL's own setting, NVIDIA H200): keelrl --cudagraphs 525.0 steps/s, LeanRL "
        "torch.compile + CUDA graphs 350.0, 1.50× (means of 2 runs each, taken in turns)."]


def write_evidence_folder(folder, device: str, entries: dict[tuple[str, str], tuple[int, str]]) -> None:
    """A collect's files: one seed-1 cell per (grid, agent), last evaluated at `step` with return `value`
    (entries[grid, agent] = step, value)."""
    folder.mkdir()
    (folder / "machine.json").write_text(json.dumps(dict(device=device, cpus=16, torch="2.11", commit="abc1234")))
    for name, fields, rows in (
            ("learning.csv", evidence.LEARNING_FIELDS,
             [dict(grid=grid, agent=agent, task="t", seed=1, step=step, mean_return=value, normalized_score="")
              for (grid, agent), (step, value) in entries.items()]),
            ("progress.csv", evidence.PROGRESS_FIELDS,
             [dict(grid=grid, agent=agent, task="t", seed=1, state="resume", last_step=step + 500,
                   last_evaluation=step, budget=100000) for (grid, agent), (step, _) in entries.items()])):
        with (folder / name).open("w", newline="") as file:
            writer = csv.DictWriter(file, fields)
            writer.writeheader()
            writer.writerows(rows)


def test_each_entry_comes_from_the_collect_whose_cells_of_it_got_furthest_and_names_its_machine(tmp_path):
    """A later lease ran two online entries: `simba` further than before, `scalar` less far (a short lease)."""
    write_evidence_folder(tmp_path / "a", "NVIDIA H100", {("online", "scalar"): (35000, "10.0"),
                                                          ("online", "simba"): (20000, "11.0"),
                                                          ("offline", "cql"): (5000, "20.0")})
    write_evidence_folder(tmp_path / "b", "NVIDIA H200", {("online", "scalar"): (10000, "5.0"),
                                                          ("online", "simba"): (100000, "30.0")})
    merged = page_learning.merged_learning((tmp_path / "a", tmp_path / "b"))
    assert [(row["grid"], row["agent"], row["mean_return"]) for row in merged.learning] == [
        ("online", "scalar", "10.0"), ("online", "simba", "30.0"), ("offline", "cql", "20.0")]
    assert [int(row["last_evaluation"]) for row in merged.progress] == [35000, 100000, 5000]
    assert page.learning_machines(merged.machines) == [
        "The cells of online (scalar) ran on NVIDIA H100 (16 CPU cores), torch 2.11, keelrl at commit abc1234.",
        "The cells of online (simba) ran on NVIDIA H200 (16 CPU cores), torch 2.11, keelrl at commit abc1234.",
        "The cells of offline ran on NVIDIA H100 (16 CPU cores), torch 2.11, keelrl at commit abc1234.", ""]
    assert page.learning_machines({("online", "simba"): merged.machines["online", "simba"]})[0].startswith(
        "The learning cells ran on NVIDIA H200")
    write_evidence_folder(tmp_path / "c", "NVIDIA H100", {("online", "scalar"): (35000, "12.0")})
    again = page_learning.merged_learning((tmp_path / "a", tmp_path / "b", tmp_path / "c"))
    assert again.learning[0]["mean_return"] == "12.0"  # as far as before: the later collect's


def test_cudagraphs_graphs_the_online_cells_alone_and_collect_reports_the_cells_that_ran(tmp_path):
    args = evidence.Args("run", runs_dir=tmp_path, device="cpu", cudagraphs=True, agents=("sac-simba", "cql"))
    commands = {cell.agent.name: cell.command() for cell in evidence.cells(args)}
    assert "--cudagraphs" in commands["sac-simba"] and "--cudagraphs" not in commands["cql"]
    assert ["--preset", "simba"] == commands["sac-simba"][commands["sac-simba"].index("--preset"):][:2]
    [started] = [cell for cell in evidence.cells(args) if cell.agent.name == "sac-simba" and cell.seed == 2]
    started.cell_dir.mkdir(parents=True)
    evidence.collect(dataclasses.replace(args, action="collect", out=tmp_path / "out"))
    assert [(row["agent"], row["seed"], row["state"]) for row in read(tmp_path / "out" / "progress.csv")] == [
        ("sac-simba", "2", "new")]


def test_precision_reaches_the_online_cells_alone_and_collect_and_page_name_it(tmp_path, monkeypatch):
    args = evidence.Args("start", runs_dir=tmp_path / "runs", device="cpu", cudagraphs=True, precision="tf32",
                         agents=("sac-simbav2", "cql"), commit_file=tmp_path / "commit.txt")
    commands = {cell.agent.name: cell.command() for cell in evidence.cells(args)}
    assert ["--precision", "tf32"] == commands["sac-simbav2"][commands["sac-simbav2"].index("--precision"):][:2]
    assert "--precision" not in commands["cql"]
    launched = []
    monkeypatch.setattr(evidence, "subprocess", types.SimpleNamespace(
        Popen=lambda command, **_: launched.append(command), STDOUT=None))
    evidence.start(args)
    [command] = launched
    assert ["--precision", "tf32"] == command[command.index("--precision"):][:2]  # `run` builds the same cells
    evidence.collect(dataclasses.replace(args, action="collect", out=tmp_path / "out"))
    machine = json.loads((tmp_path / "out" / "machine.json").read_text())
    assert machine["precision"] == "tf32"
    assert page.described(machine).endswith(
        "keelrl at commit unknown, float32 matrix products on TF32 tensor cores (--precision tf32)")
    evidence.collect(dataclasses.replace(args, action="collect", precision="fp32", out=tmp_path / "fp32"))
    assert "precision" not in json.loads((tmp_path / "fp32" / "machine.json").read_text())


def test_learning_table_lists_every_cell_before_any_common_evaluation():
    progress = [dict(grid="g", agent=agent, task="t", seed=1, state="resume", last_step=last, last_evaluation=ev,
                     budget="100000") for agent, last, ev in [("sac", "6000", "5000"), ("simbav2", "4000", "0")]]
    learning = [dict(grid="g", agent="sac", task="t", seed=1, step=5000, mean_return="17.0", normalized_score="")]
    lines = page_learning.learning_section(learning, progress)
    assert lines[0] == "### g: no step every cell evaluated (some had not reached their first evaluation)"
    assert "| sac | not measured | 0 | 6,000 (100,000) | not recorded | not reached |" in lines
    assert "| simbav2 | not measured | 0 | 4,000 (100,000) | not recorded | not reached |" in lines


def test_a_failed_cell_is_collected_as_failed_with_its_error_and_its_entry_can_be_retried(tmp_path):
    """--cudagraphs on the CPU fails at once, as a cell that dies on the GPU would: progress.csv once said 'new'
    (as for a cell still starting) and its error stayed in the cell's own log on the device."""
    args = evidence.Args("run", runs_dir=tmp_path / "evidence", device="cpu", tiny=True, agents=("sac-scalar",),
                         cudagraphs=True, commit_file=tmp_path / "commit.txt")
    evidence.run(args)
    evidence.collect(dataclasses.replace(args, action="collect", out=tmp_path / "results"))
    progress = read(tmp_path / "results" / "progress.csv")
    assert [(row["state"], row["seeds_in_process"]) for row in progress] == [("failed", "1")] * 3
    assert (tmp_path / "results" / "cell_logs.txt").read_text().count("needs --device cuda") == 3
    assert evidence.failed_entries(args) == ("sac-scalar",)


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_a_model_trained_on_a_gpu_loads_and_acts_on_the_cpu(algo, tmp_path):
    """Its config said device "cuda", so its sampling noise was drawn on CUDA after load(device="cpu"): stochastic
    actions failed with "Torch not compiled with CUDA enabled" (simulated here: the model file's config edited)."""
    import numpy as np
    import torch

    from keelrl.agents import sac, td3

    module, agent_cls = {"sac": (sac, sac.SAC), "td3": (td3, td3.TD3)}[algo]
    config_cls = {"sac": sac.SACConfig, "td3": td3.TD3Config}[algo]
    result = module.train(config_cls(env_id="InvertedPendulum-v5", total_timesteps=120, learning_starts=100,
                                     batch_size=8, hidden_sizes=(8,), eval_episodes=1, quiet=True,
                                     runs_dir=str(tmp_path)))
    model = torch.load(result.run_dir / "model.pt", weights_only=True)
    model["config"].update(device="cuda", cudagraphs=True)
    torch.save(model, tmp_path / "gpu_model.pt")
    agent = agent_cls.load(tmp_path / "gpu_model.pt", device="cpu")
    assert agent.config.device == "cpu" and agent.act(np.zeros((2, 4), np.float32)).shape == (2, 1)


EVIDENCE_ENTRIES = "sac-scalar, sac-simba, sac-simbav2, sac-hlgauss, cql, iql"


@pytest.mark.parametrize("action", ["start", "run", "collect"])
@pytest.mark.parametrize("given, expected", [
    (dict(agents=("sac-simba", "nosuch")),
     f"error: --agents: no entry named 'nosuch' in gpu-evidence-online or gpu-evidence-offline; the entries are "
     f"{EVIDENCE_ENTRIES}"),
    (dict(processes=-1), "error: --processes must be 0 (every cell's process at once) or more, got -1"),
])
def test_evidence_refuses_an_unknown_entry_or_a_negative_process_count_in_one_line(action, given, expected, tmp_path,
                                                                                  monkeypatch, capsys):
    """An unknown --agents name was dropped: `run` then died in a traceback about --workers (a flag it does not
    have), `collect` collected nothing and exited 0, `start` launched a `run` that failed in its log; --processes -1
    was never checked. Each is one line naming the bad value (and the known entries), exit code 2, nothing started
    or written."""
    launched = []
    monkeypatch.setattr(evidence, "subprocess", types.SimpleNamespace(
        Popen=lambda command, **_: launched.append(command), STDOUT=None))
    monkeypatch.setattr(evidence.leaderboard, "run_grids", lambda *args, **kwargs: launched.append(args))
    args = evidence.Args(action, runs_dir=tmp_path / "runs", out=tmp_path / "out", device="cpu", tiny=True,
                         commit_file=tmp_path / "commit.txt", **given)
    assert evidence.main(args) == 2
    assert capsys.readouterr().err == expected + "\n"
    assert launched == [] and not (tmp_path / "runs").exists() and not (tmp_path / "out").exists()


def test_the_evidence_command_line_refuses_an_unknown_entry_without_a_traceback(tmp_path):
    import subprocess
    import sys

    command = [sys.executable, "-m", "keelrl.benchmarks.gpu.evidence", "collect", "--agents", "nosuch",
               "--device", "cpu", "--runs-dir", str(tmp_path / "runs"), "--out", str(tmp_path / "out")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.splitlines() == [f"error: --agents: no entry named 'nosuch' in gpu-evidence-online or "
                                        f"gpu-evidence-offline; the entries are {EVIDENCE_ENTRIES}"]
    assert not (tmp_path / "out").exists()
