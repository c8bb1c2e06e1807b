"""Benchmark tools: the run-summary table (summarize_runs) and the update products (gemm_floor)."""

from pathlib import Path

import pytest

from keelrl.benchmarks.gemm_floor import update_products
from keelrl.benchmarks.speed import Args as SpeedArgs
from keelrl.benchmarks.speed import update_flops
from keelrl.benchmarks.summarize_runs import summarize_keelrl, table


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
    assert lines[4] == "| a | 2000 | 300.0 | 12.0 | 15.0 |"
    assert lines[-1] == "| mean ± std (2 runs) | | 200.0 ± 100.0 | 26.0 ± 14.0 | 10.0 ± 5.0 |"


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_the_timed_products_are_the_products_the_flop_count_counts(algo):
    products = update_products(algo)
    per_update = sum(group.flops for group in products) / 2  # the list holds two updates
    assert per_update == pytest.approx(update_flops(algo, SpeedArgs()), rel=1e-12)
    for group in products:
        group.run()  # every product runs on its preallocated operands
