"""Run one keelrl agent and count the host synchronisations CUDA's sync debug mode reports, by source line.

    python -m keelrl.benchmarks.gpu.syncs --report REPORT.json --steps N -- sac --env-id Hopper-v5 --device cuda ...

A synchronisation (`.item()`, `.cpu()`, a data-dependent shape, …) stalls the host until the GPU has caught up;
one per environment step is what acting costs (the action goes to the environment), more per step is a loss the
profile would flag. With `torch.cuda.set_sync_debug_mode("warn")` every one raises a warning at the Python line
that caused it; this counts them and writes REPORT.json: the agent, its exit code, the loop steps it was given,
the synchronisations, their number per step and the three lines with the most. On the CPU nothing is counted.
"""

from __future__ import annotations

import collections
import json
import runpy
import sys
import warnings
from pathlib import Path

import torch

KEELRL = Path(__file__).resolve().parents[2]

SMOKE_TASKS = {
    "sac": ("--env-id", "Hopper-v5"),
    "td3": ("--env-id", "Hopper-v5"),
    "sac_lag": ("--env-id", "keelrl/SafeHopperVelocity-v1"),
    "td3_lag": ("--env-id", "keelrl/SafeHopperVelocity-v1"),
    "ppo": ("--env-id", "Hopper-v5", "--num-envs", "4", "--num-steps", "32"),
    "ppo_lag": ("--env-id", "keelrl/SafeHopperVelocity-v1", "--num-envs", "4", "--num-steps", "32"),
    "cql": ("--dataset", "keelrl/hopper-medium-v0"),
    "iql": ("--dataset", "keelrl/hopper-medium-v0"),
    "riql": ("--dataset", "keelrl/hopper-medium-v0"),
    "wsrl": ("--warmup-steps", "50"),
    "grpo": ("--task", "add", "--num-prompts", "8"),
}
"""Every agent with a --device option and the task of its smoke run (the stream agents learn on the CPU only);
WSRL fine-tunes the CQL smoke run (its --pretrained comes from the caller)."""
BUDGET_FLAGS = {"cql": "--total-updates", "iql": "--total-updates", "riql": "--total-updates",
                "grpo": "--iterations"}
LEARNING_STARTS = {"sac", "td3", "sac_lag", "td3_lag"}
GRPO_ITERATIONS = 3
"""GRPO's smoke run: iterations of 8 prompts × 4 completions (the others take the caller's step count)"""


def smoke_command(agent: str, steps: int, device: str, runs_dir: Path, report: Path, *extra: str) -> list[str]:
    """The command of `agent`'s smoke run: `steps` loop steps on `device` (GRPO: GRPO_ITERATIONS), updates from
    the middle on where the agent starts with random steps, a final evaluation of one episode (GRPO: 8 prompts)."""
    steps = GRPO_ITERATIONS if agent == "grpo" else steps
    budget = [BUDGET_FLAGS.get(agent, "--total-timesteps"), str(steps)]
    starts = ["--learning-starts", str(steps // 2)] if agent in LEARNING_STARTS else []
    evaluation = ["--eval-episodes", "8" if agent == "grpo" else "1"]
    return [sys.executable, "-m", "keelrl.benchmarks.gpu.syncs", "--report", str(report), "--steps", str(steps),
            "--", agent, *SMOKE_TASKS[agent], *budget, *starts, *evaluation, "--eval-freq", "0", "--device", device,
            "--runs-dir", str(runs_dir), "--quiet", *extra]


def location(filename: str, lineno: int) -> str:
    """file:line, relative to the keelrl package when inside it."""
    path = Path(filename)
    return f"{path.relative_to(KEELRL) if path.is_relative_to(KEELRL) else path.name}:{lineno}"


def run_counting(agent: str, argv: list[str]) -> tuple[int, collections.Counter]:
    """Run keelrl.agents.<agent> as a script with `argv`; (its exit code, synchronisations by source line)."""
    counts: collections.Counter = collections.Counter()
    show = warnings.showwarning

    def count(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" in str(message):
            counts[location(filename, lineno)] += 1
        else:
            show(message, category, filename, lineno, file, line)

    warnings.showwarning = count
    warnings.filterwarnings("always", message=".*synchroniz.*")
    if torch.cuda.is_available():
        torch.cuda.set_sync_debug_mode("warn")
    sys.argv = [f"keelrl.agents.{agent}", *argv]
    try:
        runpy.run_module(f"keelrl.agents.{agent}", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else 1
    finally:
        if torch.cuda.is_available():
            torch.cuda.set_sync_debug_mode(0)
        warnings.showwarning = show
    return code, counts


def main(argv: list[str]) -> int:
    split = argv.index("--")
    options, (agent, *agent_argv) = dict(zip(argv[:split:2], argv[1:split:2])), argv[split + 1:]
    steps = int(options["--steps"])
    code, counts = 1, collections.Counter()
    try:
        code, counts = run_counting(agent, agent_argv)
    finally:
        total = sum(counts.values())
        report = dict(agent=agent, returncode=code, steps=steps, syncs=total, syncs_per_step=f"{total / steps:.2f}",
                      top_locations="; ".join(f"{where} ×{n}" for where, n in counts.most_common(3)), error="")
        Path(options["--report"]).write_text(json.dumps(report))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
