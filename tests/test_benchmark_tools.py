"""Benchmark tools: the run-summary table (summarize_runs), the bf16-against-fp32 gradients of a finished run
(bf16_gradients), the update products (gemm_floor) and the FLOP count of an agent's update (update_time --flops)."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from keelrl.benchmarks.perf.gemm_floor import UpdateProducts
from keelrl.benchmarks.perf.speed import Args as SpeedArgs
from keelrl.benchmarks.perf.speed import update_flops
from keelrl.benchmarks.perf import update_time
from keelrl.agents import sac, td3
from keelrl.benchmarks.checks import bf16_gradients, summarize_runs
from keelrl.buffers import ReplayBuffer
from keelrl.benchmarks.checks.summarize_runs import binned_returns, summarize_keelrl, table


def write_run(run_dir: Path, final_return: float, final_cost: float, train_returns: list[float]) -> Path:
    run_dir.mkdir()
    (run_dir / "eval.csv").write_text(
        "global_step,mean_return,std_return,mean_cost,episodes\n"
        f"1000,0.0,0.0,99.0,10\n2000,{final_return},1.0,{final_cost},10\n")
    rows = "".join(f"{100 * (i + 1)},{r},10,0.0\n" for i, r in enumerate(train_returns))
    (run_dir / "episodes.csv").write_text("global_step,return,length,cost\n" + rows)
    return run_dir


def test_final_evaluation_cost_and_last_training_episodes(tmp_path):
    first = summarize_keelrl(write_run(tmp_path / "a", 300.0, 12.0, [0.0, 10.0, 20.0]), last_episodes=2)
    second = summarize_keelrl(write_run(tmp_path / "b", 100.0, 40.0, [5.0]), last_episodes=2)
    assert (first.final_eval, first.final_cost, first.last_train, first.last_step) == (300.0, 12.0, 15.0, 2000)
    assert (second.final_eval, second.final_cost, second.last_train) == (100.0, 40.0, 5.0)
    lines = table("keelrl", [first, second]).splitlines()
    assert lines[4] == "| a | 2000 | 300.0 | 12.0 | 15.0 | nan |"  # no TensorBoard events: no speed
    assert lines[-1] == "| mean ± std (ddof 0, 2 runs) | | 200.0 ± 100.0 | 26.0 ± 14.0 | 10.0 ± 5.0 | nan ± nan |"


def test_training_return_curves_average_each_run_per_bin_then_across_runs(tmp_path):
    first = summarize_keelrl(write_run(tmp_path / "a", 0.0, 0.0, [10.0, 20.0, 30.0, 40.0]), last_episodes=2)
    second = summarize_keelrl(write_run(tmp_path / "b", 0.0, 0.0, [50.0]), last_episodes=2)
    ends, mean, std = binned_returns([first, second], bin_steps=200)  # episodes end at steps 100, 200, 300, 400
    assert ends.tolist() == [200, 400]
    assert mean.tolist() == [(15.0 + 50.0) / 2, 35.0] and std.tolist() == [17.5, 0.0]


@pytest.mark.parametrize("group, path, expected", [
    ("cleanrl", "runs/Hopper-v5__*", "runs/Hopper-v5__*: not a run directory (a glob that matched nothing is "
                                      "passed on as written)"),
    ("keelrl", "runs/missing", "runs/missing: not a run directory (no such directory)"),
    ("keelrl", "empty", "empty: no eval.csv and episodes.csv there (not a keelrl run directory)"),
    ("keelrl", "unevaluated", "unevaluated: no evaluation in its eval.csv yet"),
    ("keelrl", "notes.txt", "notes.txt: a file, not a run directory"),
    ("variant", "empty", "empty: no eval.csv and episodes.csv there (not a keelrl run directory)"),
    ("cleanrl", "empty", "empty: no charts/episodic_return in TensorBoard events there"),
])
def test_summarize_runs_refuses_a_path_that_is_not_a_run_in_one_line_before_printing_a_table(group, path, expected,
                                                                                          tmp_path, capsys,
                                                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("empty").mkdir()
    Path("notes.txt").write_text("")
    write_run(tmp_path / "good", 300.0, 0.0, [1.0])
    write_run(tmp_path / "unevaluated", 0.0, 0.0, [1.0])
    Path("unevaluated/eval.csv").write_text("global_step,mean_return,std_return,mean_cost,episodes\n")
    assert summarize_runs.main(["--keelrl", "good", f"--{group}", path]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and err.startswith(f"error: --{group} {expected}"), err


def test_summarize_runs_curves_of_runs_without_training_episodes_are_refused_before_the_table(tmp_path, capsys):
    offline = write_run(tmp_path / "cql", 50.0, 0.0, [])  # an offline run: evaluations, no training episodes
    assert summarize_runs.main(["--keelrl", str(offline)]) == 0  # the table alone is fine
    assert "| cql | 2000 | 50.0 | 0.0 | nan | nan |" in capsys.readouterr().out
    assert summarize_runs.main(["--keelrl", str(offline), "--curves", str(tmp_path / "c.png")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == "error: --curves: no training episodes to draw in cql\n"


def test_summarize_runs_without_runs_says_what_to_give(capsys):
    assert summarize_runs.main([]) == 2
    assert capsys.readouterr().err == ("error: no runs to summarise: give --keelrl, --variant and/or --cleanrl run "
                                       "directories\n")


def test_summarize_runs_sets_a_variant_group_beside_keelrl_and_prints_each_runs_windows(tmp_path, capsys):
    bf16 = write_run(tmp_path / "bf16", 100.0, 0.0, [10.0, 20.0, 30.0, 40.0])  # episodes end at steps 100 ... 400
    fp32 = write_run(tmp_path / "fp32", 200.0, 0.0, [50.0, 70.0])  # at 100 and 200
    assert summarize_runs.main(["--keelrl", str(bf16), "--keelrl-label", "keelrl bf16", "--variant", str(fp32),
                                "--variant-label", "keelrl fp32", "--windows", "--bin", "200",
                                "--last-episodes", "2"]) == 0
    out = capsys.readouterr().out
    assert "**keelrl bf16**" in out and "**keelrl fp32**" in out
    assert "| fp32 | 2000 | 200.0 | 0.0 | 60.0 | nan |" in out
    assert out.splitlines()[-4:] == ["| group | run | 0–200 | 200–400 |", "|---|---|---|---|",
                                     "| keelrl bf16 | bf16 | 15 | 35 |", "| keelrl fp32 | fp32 | 60 | nan |"]
    assert "**mean training return per 200-step window**" in out


def finished(last_train: list[float]) -> list[summarize_runs.RunSummary]:
    return [summarize_runs.RunSummary(f"run{i}", float("nan"), value, 300_000) for i, value in enumerate(last_train)]


def test_keelrl_groups_are_set_against_cleanrl_by_difference_interval_pair_count_and_its_exact_chance():
    groups = {"keelrl": finished([3.0, 4.0, 5.0]), "keelrl fp32": finished([1.0, 2.0, 1.0]),
              "CleanRL": finished([0.0, 1.0, 2.0])}
    lines = summarize_runs.against_cleanrl(groups, last_episodes=10, reps=2000).splitlines()
    assert lines[0] == "**against CleanRL: mean of the last 10 training episodes**"
    # every keelrl run above every CleanRL run: 9 of 9 pairs, which 1 split of the C(6, 3) = 20 gives, and 0 of 9
    # another: 2 of 20 as uneven
    assert lines[4].startswith("| keelrl | 3 and 3 | +3.0 | [+")
    assert lines[4].endswith("| above | 9 of 9 | 0.100 |")
    # 1 against 0, 1 (a tie, half) and 2; 2 against 0, 1, 2 (a tie); 1 again: 1.5 + 2.5 + 1.5 = 5.5 of 9
    assert lines[5].startswith("| keelrl fp32 | 3 and 3 | +0.3 | [") and "| matches | 5.5 of 9 |" in lines[5]
    assert summarize_runs.pairs_higher(np.array([1.0, 2.0]), np.array([3.0, 4.0])) == 0.0
    # 0 of 4 pairs: 1 split of C(4, 2) = 6 gives it and 1 gives 4 of 4; 3 of 4 is as far from half as 1 of 4
    assert summarize_runs.chance_of_as_uneven_pairs(np.array([1.0, 2.0]), np.array([3.0, 4.0])) == 2 / 6
    assert summarize_runs.chance_of_as_uneven_pairs(np.array([1.0, 4.0]), np.array([2.0, 3.0])) == 1.0


def test_beyond_max_splits_the_chance_is_drawn_from_random_splits(monkeypatch):
    ours, theirs = np.arange(8.0) + 2.5, np.arange(8.0)  # C(16, 8) = 12,870 splits
    exact = summarize_runs.chance_of_as_uneven_pairs(ours, theirs)
    monkeypatch.setattr(summarize_runs, "MAX_SPLITS", 3000)
    drawn = summarize_runs.chance_of_as_uneven_pairs(ours, theirs)
    assert 0.05 < exact < 0.3 and drawn != exact and abs(drawn - exact) < 0.03


@pytest.mark.parametrize("algo, one_column_products", [("sac", 20), ("td3", 14)])
def test_the_timed_products_are_the_products_the_flop_count_counts(algo, one_column_products):
    products = UpdateProducts(algo)
    expected = update_flops(algo, SpeedArgs())
    assert products.flops_per_update() == pytest.approx(expected, rel=1e-12)
    with FlopCounterMode(display=False) as counter:
        products.run()  # two updates
    # the critics' one-column products (forward, and input gradient) run as multiply-sums, which the
    # counter does not see: per 2 updates SAC has 2 critic steps x 3 + 2 actor steps x 2 of them on
    # 2 critics, TD3 2 x 3 on 2 critics + 1 actor step x 2 on Q1
    one_column_flops = one_column_products * 2 * 256 * 256
    assert counter.get_total_flops() + one_column_flops == pytest.approx(2 * expected, rel=1e-12)


def test_declared_score_ranges_and_their_sources():
    import gymnasium as gym

    from keelrl.benchmarks.reference_scores import no_range_reason, score_range, score_source

    expected = {  # task: (low, high, where the source says the numbers come from)
        "Hopper-v5": (-20.272305, 3234.3, "d4rl/infos.py of Farama-Foundation/D4RL"),
        "HalfCheetah-v5": (-280.178953, 12135.0, "d4rl/infos.py of Farama-Foundation/D4RL"),
        "Walker2d-v5": (1.629008, 4592.3, "d4rl/infos.py of Farama-Foundation/D4RL"),
        "Ant-v5": (-70.288, 3942.0, "scale_rl/envs/mujoco.py of dojeon-ai/SimbaV2"),
        "Humanoid-v5": (120.423, 5165.0, "scale_rl/envs/mujoco.py of dojeon-ai/SimbaV2"),
        "InvertedPendulum-v5": (0.0, 1000.0, "max_episode_steps"),
        "CartPole-v1": (0.0, 500.0, "max_episode_steps"),
        **{task: (0.0, 1.0, "keelrl.envs.rlvr_tasks") for task in ("add", "chain", "sort", "countdown")},
    }
    for task, (low, high, cited) in expected.items():
        bounds = score_range(task)
        assert (bounds.low, bounds.high) == (low, high) and cited in bounds.source, task
        assert score_source("online", task).startswith(f"low {low:g}, high {high:g} (")
    # the bounds taken from the envs themselves: their time limits, +1 reward per step
    assert gym.spec("CartPole-v1").max_episode_steps == 500
    assert gym.spec("InvertedPendulum-v5").max_episode_steps == 1000
    for task in ("keelrl/SafeHopperVelocity-v1", "keelrl/SafeAntVelocity-v1"):
        assert score_range(task) is None and score_source("safe", task) is None
        assert "ignores the cost limit" in no_range_reason(task)
    assert score_range("Swimmer-v5") is None and "no sourced" in no_range_reason("Swimmer-v5")
    assert "ref_min_score" in score_source("offline", "keelrl/hopper-medium-v0")  # the dataset's own references


def test_the_seeds_speed_script_runs_both_ways_and_writes_its_table(tmp_path):
    from keelrl.benchmarks.perf import seeds_speed

    args = seeds_speed.Args(sizes=(2,), env_id="InvertedPendulum-v5", total_timesteps=150, learning_starts=100,
                            hidden=8, cores="0", out=tmp_path / "seeds.md")
    lines = seeds_speed.main(args)
    row = lines[-1].strip("| ").split(" | ")
    one, many, together_one, together_many = (float(cell) for cell in row[1:5])
    assert row[0] == "2" and together_one == pytest.approx(2 * one, abs=0.11)
    assert together_many == pytest.approx(2 * many, abs=0.11) and one > 0 and many > 0
    assert (tmp_path / "seeds.md").read_text().splitlines()[-1] == lines[-1]
    graphed = seeds_speed.command(seeds_speed.Args(device="cuda", cudagraphs=True), 1, 10, "runs")
    assert graphed[:3] == [sys.executable, "-m", "keelrl.agents.sac"] and "--cudagraphs" in graphed
    assert graphed[graphed.index("--num-seeds") + 1] == "10" and "taskset" not in graphed
    on_policy = seeds_speed.command(seeds_speed.Args(algo="ppo"), 1, 3, "runs")
    assert on_policy[:5] == ["taskset", "-c", "0", sys.executable, "-m"] and on_policy[5] == "keelrl.agents.ppo"
    assert on_policy[on_policy.index("--hidden-sizes") + 1:][:2] == ["64", "64"]  # PPO's own width
    assert "--learning-starts" not in on_policy and "--precision" not in on_policy
    with pytest.raises(SystemExit, match="ppo trains in fp32 without CUDA graphs"):
        seeds_speed.main(seeds_speed.Args(algo="ppo", precision="bf16"))


def test_the_seeds_speed_script_times_after_its_burn_in_from_each_runs_sps_points(tmp_path):
    """--burn-in (compilation and graph capture out of the window): the rate between the run's first charts/SPS
    point at learning-starts + burn-in and its last, whatever the updates before took; without it the run's own
    'while updating' rate."""
    from torch.utils.tensorboard import SummaryWriter

    from keelrl.benchmarks.perf import seeds_speed

    writer = SummaryWriter(str(tmp_path / "1" / "run"))
    for step, seconds in ((100, 0.0), (200, 10.0), (300, 11.0), (400, 12.0)):  # 10 s of compilation, then 100/s
        writer.add_scalar("charts/SPS", 1.0, step, walltime=seconds)
    writer.close()
    args = seeds_speed.Args(learning_starts=100, burn_in=100)
    assert seeds_speed.timed_rate(args, "", tmp_path / "1") == pytest.approx(100.0)
    assert seeds_speed.timed_rate(seeds_speed.Args(), "400 steps: 7.5 overall, 18.2 while updating", tmp_path) == 18.2
    logged = seeds_speed.command(args, 1, 10, "runs")
    assert logged[logged.index("--log-freq") + 1] == "100"
    assert "--log-freq" not in seeds_speed.command(seeds_speed.Args(), 1, 10, "runs")


@pytest.mark.parametrize("when", ["as its run starts", "while its run trains"])
def test_the_seeds_speed_script_stopped_by_sigterm_stops_its_runs_first(when, tmp_path):
    import os
    import signal
    import subprocess
    import time

    script = subprocess.Popen([sys.executable, "-m", "keelrl.benchmarks.perf.seeds_speed", "--sizes", "2", "--env-id",
                               "InvertedPendulum-v5", "--total-timesteps", "10000000", "--hidden", "8"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    children = Path(f"/proc/{script.pid}/task/{script.pid}/children")
    deadline = time.monotonic() + 60
    while not children.read_text().split() and time.monotonic() < deadline:
        time.sleep(0.1)
    run_pid = int(children.read_text().split()[0])
    if when == "while its run trains":  # its updates begin at step 500
        time.sleep(5)
    script.send_signal(signal.SIGTERM)
    assert script.wait(timeout=60) == 128 + signal.SIGTERM
    with pytest.raises(ProcessLookupError):  # the run was stopped and waited for, not left running
        os.kill(run_pid, 0)
    assert "Traceback" not in script.stderr.read()


def test_update_time_counts_the_flops_of_an_agents_update_as_the_analytic_count_and_a_group_as_its_seeds(capsys):
    """SAC's actor steps twice every second update: two updates average to the analytic per-update count, which
    leaves out the few products of the entropy terms; a seed group of three multiplies three seeds' matrices."""
    args = update_time.Args(flops=True)
    call = update_time.prepared_call("sac", {"hidden_sizes": (256, 256), "precision": "fp32"}, args)
    actor_twice = update_time.gflops_per_call(call)  # the second update
    with FlopCounterMode(display=False) as third:
        call()
    assert (actor_twice + third.get_total_flops() / 1e9) / 2 == pytest.approx(update_flops("sac", SpeedArgs()) / 1e9,
                                                                              rel=0.01)

    def printed_gflop(num_seeds: int) -> float:  # main's last line: "  sac mlp/scalar 256-256 fp32:     0.81 GFLOP"
        update_time.main(update_time.Args(algos=("sac",), hidden=(256,), flops=True, num_seeds=num_seeds))
        return float(capsys.readouterr().out.splitlines()[-1].split(":")[1].split()[0])

    assert printed_gflop(3) == pytest.approx(3 * printed_gflop(1), rel=0.02)
    with pytest.raises(SystemExit, match="drop --compile"):
        update_time.main(update_time.Args(flops=True, compile=True))


def finished_run(run_dir: Path, algo: str) -> Path:
    """A small run directory as a finished SAC or TD3 run leaves it: config.json, model.pt and buffer.pt (40 random
    transitions of a 11-dimensional task with 3 actions)."""
    agent_cls, config_cls = {"sac": (sac.SAC, sac.SACConfig), "td3": (td3.TD3, td3.TD3Config)}[algo]
    run_dir.mkdir()
    torch.manual_seed(0)
    agent_cls(11, -np.ones(3, np.float32), np.ones(3, np.float32),
              config_cls(hidden_sizes=(64, 64), batch_size=32)).save(run_dir / "model.pt")
    buffer = ReplayBuffer(64, (11,), (3,))
    rng = np.random.default_rng(0)
    for _ in range(40):
        buffer.add(rng.normal(size=(1, 11)), rng.uniform(-1, 1, (1, 3)), rng.normal(size=1), rng.normal(size=(1, 11)),
                   rng.random(1) < 0.1, np.zeros(1, bool))
    torch.save(buffer.state_dict(), run_dir / "buffer.pt")
    (run_dir / "config.json").write_text(json.dumps({"algo": algo}))
    return run_dir


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_bf16_gradients_compares_one_batch_in_two_precisions_and_one_precision_on_two_batches(algo, tmp_path):
    agent, buffer = bf16_gradients.load_run(finished_run(tmp_path / "run", algo))
    assert agent.algo == algo and buffer.size == 40
    same = bf16_gradients.agreement(agent, buffer, batches=2, precisions=("fp32", "fp32"))
    assert same["critic grad cos bf16/fp32"] == pytest.approx(1.0, abs=1e-6)
    assert same["actor grad cos bf16/fp32"] == pytest.approx(1.0, abs=1e-6)
    assert same["mean abs(Q bf16 − Q fp32)"] == 0.0 and same["mean abs(Q)"] > 0.0
    assert same["critic grad cos, 2 batches"] < 0.99 and same["actor grad cos, 2 batches"] < 0.99
    mixed = bf16_gradients.agreement(agent, buffer, batches=2)
    assert 0.9 < mixed["critic grad cos bf16/fp32"] < 1.0 and 0.9 < mixed["actor grad cos bf16/fp32"] < 1.0
    assert mixed["mean abs(Q bf16 − Q fp32)"] > 0.0
    assert mixed["critic grad cos, 2 batches"] == same["critic grad cos, 2 batches"]  # fp32 both times, same draws


def test_bf16_gradients_refuses_a_run_that_is_not_a_finished_sac_or_td3_run_in_one_line(tmp_path, capsys):
    run_dir = finished_run(tmp_path / "run", "td3")
    (run_dir / "model.pt").unlink()
    assert bf16_gradients.main(["--runs", str(run_dir)]) == 2
    assert capsys.readouterr().err == (f"error: {run_dir}: not a finished sac or td3 run (algo 'td3'; model.pt is "
                                       f"written when a run finishes)\n")
