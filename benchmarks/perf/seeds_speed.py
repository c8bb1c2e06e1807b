"""Several seeds in one process (--num-seeds) against the same seeds as separate processes, on the same cores.

    python -m keelrl.benchmarks.perf.seeds_speed --sizes 1 2 4 10 --cores 0            # CPU: all on core 0
    python -m keelrl.benchmarks.perf.seeds_speed --sizes 1 2 4 10 --device cuda         # one GPU
    python -m keelrl.benchmarks.perf.seeds_speed --sizes 10 --device cuda --cudagraphs --burn-in 1000  # one graph
    python -m keelrl.benchmarks.perf.seeds_speed --algo ppo --sizes 1 3 --total-timesteps 10240 --cores 0

For each S: one process training S seeds of the agent (SAC, TD3, PPO) as one batched network, then S single-seed
processes at once; every process pinned to `--cores` (CPU) with one torch thread, or sharing the GPU. Each trains
`--total-timesteps` steps of `--env-id`, the first `--learning-starts` random (PPO: the first rollout, 2048 steps on
Box actions, before its first update); the figure is environment steps per second from the first update on, read
from each run's own output ("while updating"), or with `--burn-in` from that many updates later on, read from the
charts/SPS points each run writes to TensorBoard (the window of benchmarks/perf/rates.py); with `--repeats`, the two
ways take turns and the median of each is shown. Per seed: each seed's steps/s (the batched process moves all its
seeds at its loop's rate; separate processes, their mean). Together: the sum over seeds, what a seed table costs.
`--out` writes the table as Markdown.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from keelrl.agents.harness.options import parse_command_line
from keelrl.benchmarks.perf.rates import tensorboard_points, window_rate



@dataclasses.dataclass
class Args:
    sizes: tuple[int, ...] = (1, 2, 4, 10)
    """numbers of seeds S to measure"""
    algo: Literal["sac", "td3", "ppo"] = "sac"
    """the agent (each trains with its defaults but for the options here)"""
    env_id: str = "Hopper-v5"
    total_timesteps: int = 1_500
    """environment steps per run"""
    learning_starts: int = 500
    """random steps before updates (not timed; SAC and TD3)"""
    hidden: int | None = None
    """hidden width of the 2-layer networks (default: 256 for SAC and TD3, 64 for PPO: their own defaults)"""
    device: str = "cpu"
    cores: str = "0"
    """CPU cores every process is pinned to (taskset -c), on CPU"""
    precision: str = "fp32"
    """fp32 or bf16 (SAC and TD3)"""
    cudagraphs: bool = False
    """with --device cuda: every process replays its whole update as a CUDA graph, the batched one a single graph
    for all S seeds (their compilation and capture fall inside the timed steps unless --burn-in passes them)"""
    burn_in: int = 0
    """updates before the timing starts (SAC and TD3): with --cudagraphs, the compilation and graph capture, which
    over the default 1,000 updates take most of the time (a lease of 2026-11-28); 0: time from the first update"""
    repeats: int = 1
    """measurements of each S, one process and S processes taking turns; the table shows their medians"""
    out: Path | None = None
    """write the Markdown table here"""


ON_POLICY = ("ppo",)
"""agents that update once per rollout: no random steps, no precision or CUDA graph options"""


def command(args: Args, seed: int, num_seeds: int, runs_dir: str) -> list[str]:
    pin = ["taskset", "-c", args.cores] if args.device == "cpu" else []
    hidden = str(args.hidden or (64 if args.algo in ON_POLICY else 256))
    common = [*pin, sys.executable, "-m", f"keelrl.agents.{args.algo}", "--env-id", args.env_id, "--seed", str(seed),
              "--num-seeds", str(num_seeds), "--total-timesteps", str(args.total_timesteps), "--eval-freq", "0",
              "--eval-episodes", "1", "--checkpoint-freq", str(args.total_timesteps), "--checkpoint-minutes", "0",
              "--hidden-sizes", hidden, hidden, "--device", args.device, "--threads", "1", "--runs-dir", runs_dir,
              "--quiet", *(["--log-freq", "100"] if args.burn_in else [])]
    if args.algo in ON_POLICY:
        return common
    return [*common, "--learning-starts", str(args.learning_starts), "--precision", args.precision,
            *(["--cudagraphs"] if args.cudagraphs else [])]


def timed_rate(args: Args, output: str, run_dir: Path) -> float:
    """A run's steps/s: from its first update (its output's 'while updating'), or with --burn-in over its charts/SPS
    points from step learning-starts + burn-in on (`run_dir`: the run's --runs-dir)."""
    if not args.burn_in:
        return update_rates(output)[0]
    return window_rate(tensorboard_points(run_dir), args.learning_starts + args.burn_in)


def update_rates(output: str) -> list[float]:
    """Every run's steps/s after learning starts, in the order the process printed them."""
    return [float(rate) for rate in re.findall(r"([\d.]+) while updating", output)]


STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


@contextlib.contextmanager
def stop_signals_held() -> Iterator[None]:
    """SIGTERM and Ctrl-C held back while a run starts (they arrive on leaving): a stop between the fork and
    Popen's return would leave a run nobody knows of."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def release_stop_signals() -> None:
    """In the started run, before it executes: the signals the parent held are the run's to receive."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def run_at_once(commands: list[list[str]], logs: Path) -> list[str]:
    """Run the commands at once and return each one's stdout; RuntimeError naming the first that failed. When this
    process is stopped meanwhile (Ctrl-C, or SIGTERM, which this module's `__main__` turns into SystemExit), the
    runs still going are sent SIGTERM and waited for, not left behind."""
    outputs = [logs / f"{i}.out" for i in range(len(commands))]
    errors = [logs / f"{i}.err" for i in range(len(commands))]
    processes = []
    try:
        for command_line, output, error in zip(commands, outputs, errors):
            with output.open("w") as stdout, error.open("w") as stderr, stop_signals_held():
                processes.append(subprocess.Popen(command_line, stdout=stdout, stderr=stderr, text=True,
                                                  preexec_fn=release_stop_signals))
        for process in processes:
            process.wait()
    finally:
        for process in processes:
            if process.poll() is None:
                process.terminate()
        for process in processes:
            process.wait()
    for process, error in zip(processes, errors):
        if process.returncode != 0:
            raise RuntimeError(f"a run failed (exit {process.returncode}): {shlex.join(process.args)}\n"
                               + "\n".join(error.read_text().strip().splitlines()[-5:]))
    return [output.read_text() for output in outputs]


def batched(args: Args, num_seeds: int) -> float:
    """Each seed's steps/s in one process training `num_seeds` seeds."""
    with tempfile.TemporaryDirectory() as runs:
        output, = run_at_once([command(args, 1, num_seeds, runs + "/{seed}")], Path(runs))
        assert len(update_rates(output)) == num_seeds, output  # one loop: every seed prints the same rate
        return timed_rate(args, output, Path(runs) / "1")  # seed 1's run directory


def separate(args: Args, num_seeds: int) -> list[float]:
    """Each of `num_seeds` single-seed processes' steps/s, all running at once."""
    with tempfile.TemporaryDirectory() as runs:
        outputs = run_at_once([command(args, seed, 1, f"{runs}/{seed}") for seed in range(1, num_seeds + 1)],
                              Path(runs))
        return [timed_rate(args, output, Path(runs) / str(seed)) for seed, output in enumerate(outputs, 1)]


def main(args: Args) -> list[str]:
    if args.algo in ON_POLICY and (args.precision != "fp32" or args.cudagraphs):
        raise SystemExit(f"error: {args.algo} trains in fp32 without CUDA graphs: drop --precision and --cudagraphs.")
    where = f"cores {args.cores}, one torch thread each" if args.device == "cpu" else args.device
    hidden = command(args, 1, 1, "")[command(args, 1, 1, "").index("--hidden-sizes") + 1]
    untimed = "the first rollout" if args.algo in ON_POLICY else f"{args.learning_starts} random steps"
    lines = [f"{args.algo.upper()} on {args.env_id}, {hidden}-{hidden} networks, {args.precision}"
             f"{', --cudagraphs' if args.cudagraphs else ''}, {args.total_timesteps} steps per run timed from "
             f"{f'update {args.burn_in + 1:,} on' if args.burn_in else 'the first update'} (after {untimed}), every "
             f"process on {where}.", "",
             "| seeds S | per seed, one process | per seed, S processes | together, one process | "
             "together, S processes | one process / S processes |", "|---|---|---|---|---|---|"]
    for size in args.sizes:
        # (each seed's steps/s in one process, the mean of S single-seed processes'), measured in turns
        measured = [(batched(args, size), statistics.mean(separate(args, size))) for _ in range(args.repeats)]
        one, many = (statistics.median(rates) for rates in zip(*measured))
        lines.append(f"| {size} | {one:.1f} | {many:.1f} | {one * size:.1f} | {many * size:.1f} | {one / many:.2f}× |")
        print(lines[-1], flush=True)
    if args.out is not None:
        args.out.write_text("\n".join(lines) + "\n")
    return lines


def exit_on_sigterm(signum: int, frame) -> None:
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    print("\n".join(main(parse_command_line(Args))))
