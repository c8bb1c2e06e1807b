"""Benchmark tools: the run-summary table (summarize_runs) and the update products (gemm_floor)."""

from pathlib import Path

import pytest
from torch.utils.flop_counter import FlopCounterMode

from keelrl.benchmarks.gemm_floor import UpdateProducts
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
