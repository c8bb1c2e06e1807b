"""benchmarks/checks/rlvr_trl*.py without trl or a model: both sides' configs say the same, keelrl's prompt order is
the env's, the clock leaves evaluations out, and the page's means and ratios come from the CSVs."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from keelrl.agents.grpo import validate
from keelrl.benchmarks.checks import rlvr_trl_record
from keelrl.benchmarks.checks.rlvr_trl_page import (FIGURES, PageArgs, SECTION, goal_lines, ratios, read_runs,
                                                     summarize, write_page)
from keelrl.benchmarks.checks.rlvr_trl_record import Clock, run_file, write_record
from keelrl.benchmarks.checks.rlvr_trl_settings import (
    AGGREGATIONS,
    RunArgs,
    Settings,
    keelrl_config,
    keelrl_train_problems,
    trl_kwargs,
)
from keelrl.envs.rlvr_tasks import make_task
from keelrl.envs.token_env import GroupTokenEnv
from keelrl.networks.char_lm import CharTokenizer

OTHER = Settings(task_size=3, max_value=7, num_prompts=3, group_size=5, max_new_tokens=17, learning_rate=3e-6,
                 anneal_lr=False, weight_decay=0.01, max_grad_norm=0.5, beta=0.02, clip_low=0.1, clip_high=0.3,
                 loss_type="grpo", scale_std=False, temperature=0.7, iterations=7, eval_split="validation", seed=4)
"""settings away from every default, so that a side that ignored one would show"""


@pytest.mark.parametrize("settings", [Settings(), OTHER])
def test_both_sides_get_the_same_values(settings):
    keelrl, trl = keelrl_config(settings), trl_kwargs(settings)
    validate(keelrl)
    rows = settings.num_prompts * settings.group_size
    assert trl["num_generations"] == keelrl.group_size == settings.group_size
    assert trl["per_device_train_batch_size"] == trl["generation_batch_size"] == keelrl.num_prompts * keelrl.group_size
    assert rows == trl["generation_batch_size"]
    assert (keelrl.update_epochs, keelrl.num_minibatches, trl["gradient_accumulation_steps"], trl["num_iterations"]) \
        == (1, 1, 1, 1)
    assert trl["max_steps"] == keelrl.iterations == settings.iterations
    assert trl["max_completion_length"] == keelrl.max_new_tokens == settings.max_new_tokens
    assert trl["temperature"] == keelrl.temperature == settings.temperature
    assert (trl["top_p"], trl["top_k"], trl["min_p"], trl["repetition_penalty"]) == (1.0, 0, None, 1.0)
    assert trl["learning_rate"] == keelrl.learning_rate == settings.learning_rate
    assert (trl["lr_scheduler_type"] == "linear") == keelrl.anneal_lr == settings.anneal_lr
    assert trl["warmup_steps"] == keelrl.warmup_steps == 0
    assert trl["weight_decay"] == keelrl.weight_decay == settings.weight_decay
    assert trl["max_grad_norm"] == keelrl.max_grad_norm == settings.max_grad_norm
    assert trl["beta"] == keelrl.beta == settings.beta
    assert trl["use_bias_correction_kl"] is False  # keelrl's k3 term is not weighted by the ratio
    assert trl["epsilon"] == keelrl.clip_low == settings.clip_low
    assert trl["epsilon_high"] == keelrl.clip_high == settings.clip_high
    assert trl["loss_type"] == settings.loss_type and keelrl.loss_aggregation == AGGREGATIONS[settings.loss_type]
    assert keelrl.loss_type is None  # keelrl's presets set more than the aggregation (dapo: dynamic sampling)
    assert (trl["scale_rewards"] == "group") == keelrl.scale_std == settings.scale_std and keelrl.std_eps == 1e-4
    assert trl["importance_sampling_level"] == keelrl.importance_level == "token"
    assert trl["entropy_coef"] == keelrl.ent_coef == 0.0
    assert trl["top_entropy_quantile"] == keelrl.top_entropy_fraction == 1.0
    assert keelrl.sample_weighting == "grpo" and not keelrl.filter_zero_std and not trl["mask_truncated_completions"]
    assert trl["bf16"] is False and trl["fp16"] is False and keelrl.precision == settings.precision == "fp32"
    assert trl["activation_checkpointing"] is False and trl["disable_dropout"] is True
    assert trl["seed"] == keelrl.seed == settings.seed
    assert keelrl.eval_split == settings.eval_split  # (the TRL side's evaluations read args.eval_split themselves)
    assert trl["shuffle_dataset"] is False  # TRL takes keelrl's prompt order
    assert keelrl.prompt_format == "chat" and keelrl.model == settings.model


@pytest.mark.parametrize("loss_type, aggregation", [("grpo", "sequence-mean"), ("dapo", "token-mean"),
                                                    ("bnpo", "token-mean"), ("dr_grpo", "constant")])
def test_loss_types_map_to_keelrl_aggregations(loss_type, aggregation):
    assert keelrl_config(Settings(loss_type=loss_type)).loss_aggregation == aggregation


def test_train_problems_are_the_env_draws_after_the_first():
    settings = Settings(num_prompts=3, group_size=2, iterations=4, seed=7)
    task = make_task("add", 2, 20)
    env = GroupTokenEnv(task, CharTokenizer(), settings.num_prompts, settings.group_size, 4, 32, "train", settings.seed)
    draws = [env.reset()[1]["problems"][:: settings.group_size] for _ in range(settings.iterations + 1)]
    assert keelrl_train_problems(task, settings) == [p for batch in draws[1:] for p in batch]


def test_clock_leaves_evaluations_out(monkeypatch):
    wall = iter([0.0, 10.0, 12.0, 20.0, 30.0, 31.0, 34.0, 35.0])
    monkeypatch.setattr(rlvr_trl_record, "now", lambda: np.array([next(wall), 0.0]))
    clock = Clock()
    metrics = {"greedy_accuracy": 0.5, "pass@1": 0.4, "pass@4": 0.6}
    _, before = clock.evaluation(lambda: metrics, 4)  # before the first iteration: not counted
    clock.iteration_begins()  # starts at 0
    clock.generating(lambda: clock.generated(7, [[1, 2]]))  # 10 -> 12
    _, middle = clock.evaluation(lambda: metrics, 4)  # pauses at 20
    clock.iteration_begins()  # restarts at 30
    clock.generating(lambda: clock.generated(5, [[3]]))  # 31 -> 34
    _, last = clock.evaluation(lambda: metrics, 4)  # pauses at 35 for good
    clock.evaluation(lambda: metrics, 4)  # (a paused clock stays paused)
    summary = clock.summary()
    assert (before["iteration"], before["minutes"], middle["iteration"], last["iteration"]) == (0, 0.0, 1, 2)
    assert middle["minutes"] == pytest.approx(20 / 60) and last["minutes"] == pytest.approx(25 / 60)
    assert summary["training_seconds"] == 25.0 and summary["generation_seconds"] == 5.0
    assert summary["update_seconds"] == 20.0 and summary["generated_tokens"] == 12
    assert summary["tokens_per_second"] == pytest.approx(12 / 25) and last["pass_at_k"] == 0.6


class Measured:
    """A clock's summary, given."""

    def __init__(self, **figures):
        self.figures = figures

    def summary(self) -> dict:
        return self.figures


def synthetic_run(out, side, seed, tokens_per_second, peak, final, training_seconds=100.0, generation=60.0,
                  prompts="", **settings):
    args = RunArgs(seed=seed, iterations=10, eval_freq=5, eval_episodes=4, out=str(out), **settings)
    measured = Measured(iterations_done=10, generated_tokens=int(tokens_per_second * training_seconds),
                        training_seconds=training_seconds, generation_seconds=generation,
                        update_seconds=training_seconds - generation, training_cpu_seconds=training_seconds,
                        generation_cpu_seconds=generation, tokens_per_second=tokens_per_second,
                        peak_rss_mb=peak, process_peak_rss_mb=peak + 500, prompts_sha=prompts or f"digest{seed}")
    evaluations = [{"iteration": i, "minutes": i * training_seconds / 600, "greedy_accuracy": final * i / 10,
                    "pass_at_1": final * i / 10, "pass_at_k": min(1.0, final * i / 5)} for i in (0, 5, 10)]
    write_record(args, side, measured, evaluations)
    if side == "trl":
        run_file(str(out), "add", "trl", seed, "grpo_config.json").write_text(json.dumps(trl_kwargs(args)))


def test_page_means_and_ratios_come_from_the_csvs(tmp_path):
    base = RunArgs(seed=1, iterations=10, eval_freq=5, eval_episodes=4, out=str(tmp_path))
    untrained = dict.fromkeys(("iterations_done", "generated_tokens", "training_seconds", "generation_seconds",
                               "update_seconds", "training_cpu_seconds", "generation_cpu_seconds",
                               "tokens_per_second", "peak_rss_mb"), 0)
    write_record(base, "base", Measured(**untrained, process_peak_rss_mb=900.0, prompts_sha=""),
                 [{"iteration": 0, "minutes": 0.0, "greedy_accuracy": 0.25, "pass_at_1": 0.2, "pass_at_k": 0.5}])
    synthetic_run(tmp_path, "keelrl", 1, 100.0, 1000.0, 0.5)
    synthetic_run(tmp_path, "keelrl", 2, 120.0, 1200.0, 0.7, generation=40.0)
    synthetic_run(tmp_path, "trl", 1, 50.0, 2000.0, 0.5, training_seconds=200.0)
    synthetic_run(tmp_path, "trl", 2, 60.0, 2000.0, 0.3, training_seconds=200.0, prompts="other")
    for lr, final in ((1e-6, 0.2), (1e-5, 0.9)):  # the runs that chose the learning rate, in subfolders
        synthetic_run(tmp_path / "validation" / f"lr{lr:g}", "keelrl", 1, 10.0, 1.0, final, eval_split="validation",
                      learning_rate=lr)
    runs = [r for r in read_runs(tmp_path) if r["eval_split"] == "heldout"]
    keelrl = summarize([r for r in runs if r["side"] == "keelrl"])
    trl = summarize([r for r in runs if r["side"] == "trl"])
    assert keelrl["tokens_per_second"] == pytest.approx((110.0, np.std([100, 120], ddof=1)))
    assert keelrl["greedy_accuracy"][0] == pytest.approx(0.6) and trl["greedy_accuracy"][0] == pytest.approx(0.4)
    assert keelrl["generation_per_iteration"][0] == pytest.approx(5.0)  # (6 + 4) / 2 seconds
    assert trl["seconds_per_iteration"] == (20.0, 0.0)
    r = ratios(keelrl, trl)
    assert r["tokens_per_second"] == pytest.approx(2.0) and r["peak_rss_mb"] == pytest.approx(0.55)
    assert r["seconds_per_iteration"] == pytest.approx(0.5)

    output = tmp_path / "rlvr.md"
    output.write_text("# RLVR\n\n## Learning check\n\nkept as it is\n")
    write_page(PageArgs(results=str(tmp_path), output=str(output)))
    page = output.read_text()
    assert "## Learning check\n\nkept as it is\n" in page and f"## {SECTION}" in page
    assert "Untrained model (held-out, 4 prompts): greedy accuracy 0.25, pass@1 0.20, pass@4 0.50." in page
    assert "| keelrl | 2 | 0.60 ± 0.14 |" in page and "| TRL | 2 | 0.40 ± 0.14 |" in page
    assert "110.0 ± 14.1" in page and "1,100 ± 141" in page
    assert ("keelrl / TRL (ratios of the means): tokens/s 2.00×, peak RSS 0.55×, seconds per iteration 0.50× "
            "(generation 0.83×, update 0.36×), CPU seconds per iteration 0.50×.") in page
    assert "do not share" not in page  # (the validation runs' learning rates are not the held-out runs' settings)
    assert ("| learning rate | side | seed | iterations | greedy at 0 | greedy at N | pass@1 | pass@4 |\n"
            "|---:|---|---:|---:|---:|---:|---:|---:|\n"
            "| 1e-05 | keelrl | 1 | 10 | 0.00 | 0.90 | 0.90 | 1.00 |\n"
            "| 1e-06 | keelrl | 1 | 10 | 0.00 | 0.20 | 0.20 | 0.40 |\n") in page
    assert "(digests of every iteration's prompts): seeds [1]; DIFFERENT for seeds [2]." in page
    assert "generation (sampling and scoring) takes 50% of keelrl's mean iteration and 30% of TRL's" in page
    assert "the iterations of the 4 held-out runs took 0.2 core-hours in all, those of the 2 validation runs 0.1" \
        in page
    assert ("- keelrl above the untrained model by more than its seeds' spread: greedy 0.25 → 0.60 (mean of 2), a "
            "gain of 0.35 against a spread (max − min) of 0.20; the untrained model starts at 0.25 (the goal asks "
            "for [0.20, 0.70]): **met**.") in page
    assert ("- keelrl's greedy accuracy at N within or above TRL's seeds: 0.60 against TRL's [0.30, 0.50], above: "
            "**met**.\n- keelrl's tokens/s at least TRL's: 2.00×: **met**.") in page
    assert '"num_generations": 8' in page and (tmp_path / "add_curves.png").is_file()
    assert str(tmp_path) not in page  # no local path on a results page


def test_goals_say_missed_and_not_measured():
    keelrl = [{**dict.fromkeys(FIGURES, 1.0), "greedy_accuracy": a, "tokens_per_second": 9.0} for a in (0.5, 0.9)]
    trl = [{**dict.fromkeys(FIGURES, 1.0), "greedy_accuracy": a, "tokens_per_second": 10.0} for a in (0.8, 0.85)]
    summaries = {"keelrl": summarize(keelrl), "trl": summarize(trl)}
    lines = goal_lines({"base": [{"greedy_accuracy": 0.3}], "keelrl": keelrl, "trl": trl}, summaries)
    assert lines[2].endswith("a gain of 0.40 against a spread (max − min) of 0.40; the untrained model starts at "
                             "0.30 (the goal asks for [0.20, 0.70]): **missed**.")  # a gain equal to the spread
    assert lines[3].endswith("0.70 against TRL's [0.80, 0.85], below: **missed**.")
    assert lines[4].endswith("0.90×: **missed**.")
    high_start = goal_lines({"base": [{"greedy_accuracy": 0.1}], "keelrl": keelrl[1:], "trl": []}, summaries)
    assert high_start[2].endswith("starts at 0.10 (the goal asks for [0.20, 0.70]): **missed**.")  # outside START
    assert high_start[3:] == ["- keelrl's greedy accuracy at N within or above TRL's seeds: not measured.",
                              "- keelrl's tokens/s at least TRL's: not measured."]


def test_settings_fields_are_all_recorded(tmp_path):
    synthetic_run(tmp_path, "keelrl", 1, 100.0, 1000.0, 0.5)
    run = read_runs(tmp_path)[0]
    assert all(field.name in run for field in dataclasses.fields(Settings))
    assert run["command"].endswith("python -m keelrl.benchmarks.checks.rlvr_trl keelrl --iterations 10 --eval-freq 5 "
                                   "--eval-episodes 4")
