"""RLVR learning check: a 2-layer GPT-2 learns single-digit a+b with GRPO on one CPU thread in 3 minutes.

    taskset -c 0 python -m keelrl.benchmarks.checks.rlvr_learning --runs-dir /tmp/rlvr_runs --commit-note "..."

For each seed, with the entropy bonus (GRPOConfig's default 0.02) and without it (0), trains GRPO on
`add` (a+b, digits 0-9; 20% of the 100 problems held out by prompt hash) with a wall-clock limit of
`max_minutes` for the whole run: a format-only warm-up on random answers (so accuracy starts near
chance), then RL. Reports held-out greedy accuracy after the warm-up and at the end, the minutes at
which an evaluation first reached the threshold, pass@1 / pass@4 at the end, iterations done, and the
CPU seconds the run got (less than its wall time when other processes share the core). The table goes
to benchmarks/results/rlvr.md (its learning section is replaced), with the command (pinning and the options
that change figures; --runs-dir is left out), the machine and the commit (`git rev-parse HEAD` plus
--commit-note, e.g. to say the tree had uncommitted changes).
"""

from __future__ import annotations

import dataclasses
import os
import platform
import re
import subprocess
import time
from pathlib import Path

import torch

from keelrl.agents.grpo import GRPOConfig, train
from keelrl.agents.harness.options import parse_command_line
from keelrl.envs.rlvr_tasks import make_task


@dataclasses.dataclass
class Args:
    seeds: tuple[int, ...] = (1, 2, 3)
    """training seeds"""
    ent_coefs: tuple[float, ...] = (0.02, 0.0)
    """entropy bonus coefficients to compare (each run with every seed)"""
    max_minutes: float = 3.0
    """wall-clock budget of each run, warm-up included"""
    threshold: float = 0.6
    """held-out greedy accuracy to reach"""
    eval_every: int = 25
    """iterations between held-out evaluations"""
    runs_dir: str = "runs/rlvr_learning"
    """parent directory of the run directories"""
    output: str = "benchmarks/results/rlvr.md"
    """Markdown file whose learning section is replaced"""
    commit_note: str = ""
    """written after the commit hash (e.g. 'with uncommitted fixes of ...' when the tree was not clean)"""


FIGURE_OPTIONS = ("seeds", "ent_coefs", "max_minutes", "threshold", "eval_every")
"""Args that change the table (the command written to the results names those not at their default)"""


def command_of(args: Args) -> str:
    """The command line that reproduces the figures: CPU pinning and the non-default options that matter."""
    affinity = sorted(os.sched_getaffinity(0))
    pin = f"taskset -c {','.join(map(str, affinity))} " if len(affinity) < (os.cpu_count() or 0) else ""
    defaults, options = Args(), []
    for name in FIGURE_OPTIONS:
        value = getattr(args, name)
        if value != getattr(defaults, name):
            words = " ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in
                             (value if isinstance(value, tuple) else (value,)))
            options.append(f"--{name.replace('_', '-')} {words}")
    return " ".join([f"{pin}python -m keelrl.benchmarks.checks.rlvr_learning", *options])


def commit_of(note: str) -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        head = "unknown (not a git checkout)"
    return f"{head} {note}".strip()


def machine_description() -> str:
    """CPU (with family/model and whether it has AVX-512: "AMD EPYC" alone names several generations, whose
    different kernels round differently, so the same seed takes a different path), cores, torch, transformers."""
    cpu = platform.processor() or platform.machine()
    try:
        fields = {}
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
        avx512 = "AVX-512" if "avx512f" in fields.get("flags", "").split() else "no AVX-512"
        cpu = f"{fields['model name']} (family {fields['cpu family']} model {fields['model']}, {avx512})"
    except (OSError, KeyError):
        pass
    import transformers

    return (f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__}, transformers {transformers.__version__}, "
            f"{platform.system()}")


def write_section(path: str, title: str, text: str) -> None:
    """Replace (or append) the `## title` section of a Markdown file, keeping the other sections."""
    path = Path(path)
    document = path.read_text() if path.exists() else "# RLVR (GRPO on a tiny GPT-2)\n"
    section = f"## {title}\n\n{text.strip()}\n"
    pattern = re.compile(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(document):
        document = pattern.sub(lambda _: section + "\n", document).rstrip() + "\n"
    else:
        document = document.rstrip() + "\n\n" + section
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(document)


def run(seed: int, ent_coef: float, args: Args) -> dict:
    config = GRPOConfig(seed=seed, ent_coef=ent_coef, max_minutes=args.max_minutes, eval_freq=args.eval_every,
                        threads=1, quiet=True, runs_dir=args.runs_dir)
    cpu_start, wall_start = time.process_time(), time.perf_counter()
    result = train(config)
    reached = [h for h in result.history if h["greedy_accuracy"] >= args.threshold]
    return {
        "seed": seed, "ent_coef": ent_coef, "start": result.history[0]["greedy_accuracy"],
        "final": result.metrics["greedy_accuracy"], "best": max(h["greedy_accuracy"] for h in result.history),
        "reached": reached[0]["minutes"] if reached else None,
        "reached_iteration": reached[0]["iteration"] if reached else None, "pass@1": result.metrics["pass@1"],
        "pass@4": result.metrics["pass@4"], "iterations": result.global_step,
        "wall": time.perf_counter() - wall_start, "cpu": time.process_time() - cpu_start,
    }


def weighting_of(c: GRPOConfig) -> str:
    if c.sample_weighting == "grpo":
        return "GRPO sample weighting (group-relative advantages, every sample weighted 1)"
    if c.sample_weighting == "w-reinforce":
        return f"W-REINFORCE sample weighting (correct ×{c.positive_weight:g}, incorrect ×1)"
    return f"{c.sample_weighting.upper()} sample weighting"


def main(args: Args) -> None:
    commit = commit_of(args.commit_note)  # at the start: the code the runs use
    rows = []
    for ent_coef in args.ent_coefs:
        for seed in args.seeds:
            rows.append(run(seed, ent_coef, args))
            print(rows[-1])
    c = GRPOConfig()
    heldout = len(make_task(c.task, c.task_size, c.max_value, c.heldout_fraction).problems("heldout", 100, seed=0))
    budget = (f"within {args.max_minutes:g} minutes of wall clock, warm-up included" if args.max_minutes
              else f"within {c.iterations} iterations")
    lines = [
        f"Held-out greedy accuracy on single-digit a+b ({args.threshold:g} {budget}), GRPOConfig defaults apart "
        f"from the entropy bonus: {c.n_layer}-layer "
        f"{c.n_embd}-wide GPT-2 with a character vocabulary, {c.warmup_steps} warm-up steps on random answers, "
        f"{c.num_prompts} prompts × {c.group_size} completions, AdamW lr {c.learning_rate:g} annealed to 0 over "
        f"{c.iterations} iterations (weight decay {c.weight_decay:g}), {c.update_epochs} epochs × "
        f"{c.num_minibatches} minibatches, clip {c.clip_low}/{c.clip_high}, k3 KL β {c.beta:g}, {weighting_of(c)}, "
        f"{c.loss_aggregation}, 1 thread. Held-out: the {heldout} of the 100 prompts that "
        f"the hash split keeps out of training (the same for every seed); evaluated every {args.eval_every} "
        f"iterations. A run stops at {c.iterations} iterations"
        + (f" or {args.max_minutes:g} minutes." if args.max_minutes else " (no wall-clock limit)."),
        "",
        f"Machine: {machine_description()}; CPU affinity {sorted(os.sched_getaffinity(0))}. "
        f"Command: `{command_of(args)}` (with --runs-dir outside the repository; the run directory does not affect "
        f"the figures). Commit: {commit}. \"first ≥ bar\" is the wall-clock minute of the first evaluation at or "
        f"above the bar; \"final\" is the evaluation when the run stops.",
        "",
        "| entropy bonus | seed | after warm-up | final | best | first ≥ bar (min) | first ≥ bar (iteration) | pass@1 "
        "| pass@4 | iterations | wall s | CPU s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        reached = "—" if r["reached"] is None else f"{r['reached']:.2f}"
        reached_iteration = "—" if r["reached_iteration"] is None else str(r["reached_iteration"])
        lines.append(f"| {r['ent_coef']:g} | {r['seed']} | {r['start']:.2f} | {r['final']:.2f} | {r['best']:.2f} | "
                     f"{reached} | {reached_iteration} | {r['pass@1']:.2f} | {r['pass@4']:.2f} | {r['iterations']} | {r['wall']:.0f} | "
                     f"{r['cpu']:.0f} |")
    for ent_coef in args.ent_coefs:
        hits = sum(r["reached"] is not None for r in rows if r["ent_coef"] == ent_coef)
        lines.append(f"\nEntropy bonus {ent_coef:g}: {hits} of {len(args.seeds)} seeds reached {args.threshold} "
                     f"{budget}.")
    text = "\n".join(lines)
    print(text)
    write_section(args.output, "Learning check", text)


if __name__ == "__main__":
    main(parse_command_line(Args))
