"""Update-phase speed of keelrl SAC/TD3 beside CleanRL's scripts, and the arithmetic limit of this machine.

    python -m keelrl.benchmarks.perf.speed --cleanrl ../cleanrl --threads 1 2 --repeats 3

Each measurement is a fresh process training on `--env-id` for `--total-timesteps` steps, the first
`--learning-starts` of them random; the figure is environment steps per second after learning
starts (one gradient update per step), read from each program's own output. keelrl and CleanRL
runs alternate (A B A B …) so drifts in machine load hit both. CleanRL's scripts come from a
checkout outside this repository (`--cleanrl`). CleanRL's scripts (fe8d8a0) are written for gymnasium 0.29;
on gymnasium 1.x, copy them and adapt three places in each copy, then point `--cleanrl-sac`/`--cleanrl-td3` at
the copies:
- make the vector env with `autoreset_mode=gym.vector.AutoresetMode.SAME_STEP`;
- read episode returns from `infos["final_info"]["episode"]` (masked by its `"_episode"`);
- read final observations from `infos["final_obs"]`.

The arithmetic limit is the matmul FLOPs one update needs (every linear layer's forward pass and
the backward passes the algorithm needs, counted for 256-sized MLPs at the batch size) divided by
the float32 matmul rate measured here at the same thread count.
"""

from __future__ import annotations

import dataclasses
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from keelrl.agents.harness.options import parse_command_line


@dataclasses.dataclass
class Args:
    algos: tuple[str, ...] = ("sac", "td3")
    """agents to measure"""
    env_id: str = "Hopper-v5"
    """environment"""
    total_timesteps: int = 6_000
    """steps per run"""
    learning_starts: int = 1_000
    """random steps before updates begin"""
    threads: tuple[int, ...] = (1,)
    """torch threads (both implementations run with the same count)"""
    repeats: int = 3
    """alternating pairs per algorithm and thread count"""
    cleanrl: Path | None = None
    """a CleanRL checkout to run beside keelrl (outside this repository)"""
    cleanrl_sac: str = "cleanrl/sac_continuous_action.py"
    """CleanRL's SAC script, relative to --cleanrl"""
    cleanrl_td3: str = "cleanrl/td3_continuous_action.py"
    """CleanRL's TD3 script, relative to --cleanrl"""
    keelrl_args: tuple[str, ...] = ()
    """extra options for the keelrl agents (e.g. --compile)"""
    precisions: tuple[str, ...] = ("fp32",)
    """keelrl precisions to run (fp32, bf16: --precision); each is paired with the same CleanRL run"""
    obs_dim: int = 11
    """observation size used for the FLOP count (Hopper)"""
    action_dim: int = 3
    """action size used for the FLOP count (Hopper)"""
    batch_size: int = 256
    """batch size (both implementations use it; also in the FLOP count)"""
    hidden: int = 256
    """hidden width of the 2-layer MLPs (both implementations; also in the FLOP count)"""


def mlp_flops(batch: int, sizes: list[int]) -> tuple[float, float]:
    """(forward FLOPs, FLOPs of the first layer's forward) of an MLP with the given layer sizes."""
    layers = [2 * batch * fan_in * fan_out for fan_in, fan_out in zip(sizes[:-1], sizes[1:])]
    return float(sum(layers)), float(layers[0])


def update_flops(algo: str, args: Args, num_critics: int = 2, policy_frequency: int = 2) -> float:
    """Matmul FLOPs of one update (per environment step at UTD 1), averaged over the policy delay.

    Backward passes cost one forward for the weight gradients plus one for the input gradients,
    except that no layer computes gradients it does not need: the critic step needs no input
    gradient at its first layer; the actor step needs no critic weight gradients.
    """
    b, h, obs, act = args.batch_size, args.hidden, args.obs_dim, args.action_dim
    actor_out = 2 * act if algo == "sac" else act  # SAC's mean and log-std heads
    actor, actor_first = mlp_flops(b, [obs, h, h, actor_out])
    one_critic, critic_first = mlp_flops(b, [obs + act, h, h, 1])
    critic, critic_first = num_critics * one_critic, num_critics * critic_first
    critic_step = actor + critic + critic + critic + (critic - critic_first)  # target; forward; weight and input grads
    if algo == "sac":  # policy_frequency actor steps every policy_frequency updates: one per update
        actor_step = actor + critic + critic + actor + (actor - actor_first)
        return critic_step + actor_step
    # TD3: one actor step through the first critic only, every policy_frequency updates
    actor_step = actor + one_critic + one_critic + actor + (actor - actor_first)
    return critic_step + actor_step / policy_frequency


def matmul_gflops(threads: int, size: int = 256, repeats: int = 2000, dtype: torch.dtype = torch.float32) -> float:
    """(size × size) @ (size × size) rate in `dtype` with `threads` torch threads, median of 5 timings."""
    torch.set_num_threads(threads)
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    for _ in range(100):
        a @ b
    rates = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeats):
            a @ b
        rates.append(2 * size**3 * repeats / (time.perf_counter() - start) / 1e9)
    return statistics.median(rates)


def keelrl_update_sps(algo: str, threads: int, seed: int, args: Args, precision: str = "fp32") -> float:
    with tempfile.TemporaryDirectory() as runs:
        command = [sys.executable, "-m", f"keelrl.agents.{algo}", "--env-id", args.env_id,
                   "--total-timesteps", str(args.total_timesteps), "--learning-starts", str(args.learning_starts),
                   "--seed", str(seed), "--threads", str(threads), "--eval-freq", "0", "--eval-episodes", "1",
                   "--checkpoint-freq", str(args.total_timesteps), "--batch-size", str(args.batch_size),
                   "--hidden-sizes", str(args.hidden), str(args.hidden), "--runs-dir", runs, "--quiet",
                   "--precision", precision, *args.keelrl_args]
        out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return float(re.search(r"([\d.]+) while updating", out).group(1))


def cleanrl_update_sps(algo: str, threads: int, seed: int, args: Args) -> float:
    """From CleanRL's 'SPS: N' lines (steps since start / seconds since start, every 100 steps)."""
    script = args.cleanrl_sac if algo == "sac" else args.cleanrl_td3
    command = [sys.executable, script, "--env-id", args.env_id, "--total-timesteps", str(args.total_timesteps),
               "--learning-starts", str(args.learning_starts), "--seed", str(seed), "--no-cuda",
               "--batch-size", str(args.batch_size)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(args.cleanrl)}
    with tempfile.TemporaryDirectory() as workdir:  # CleanRL writes runs/ into its working directory
        for name in ("cleanrl", "cleanrl_utils"):
            os.symlink(args.cleanrl / name, Path(workdir) / name)
        out = subprocess.run(command, capture_output=True, text=True, check=True, cwd=workdir, env=env).stdout
    reports = [int(x) for x in re.findall(r"^SPS: (\d+)", out, re.MULTILINE)]
    # SPS lines are printed at steps learning_starts+100, +200, …; elapsed time at step s is s / SPS
    first_step = (args.learning_starts // 100 + 1) * 100
    steps = [first_step + 100 * i for i in range(len(reports))]
    return (steps[-1] - steps[0]) / (steps[-1] / reports[-1] - steps[0] / reports[0])


def main(args: Args) -> None:
    print(f"{args.env_id}, {args.total_timesteps} steps ({args.learning_starts} random), batch {args.batch_size}, "
          f"2x{args.hidden} MLPs, torch {torch.__version__}, {os.cpu_count()} CPUs")
    for threads in args.threads:
        rate = matmul_gflops(threads)
        bf16_rate = matmul_gflops(threads, repeats=20, dtype=torch.bfloat16) if "bf16" in args.precisions else None
        print(f"\n{threads} thread(s): float32 256x256 matmul rate {rate:.1f} GFLOP/s"
              + ("" if bf16_rate is None else f", bfloat16 {bf16_rate:.1f} GFLOP/s (arithmetic limits below: float32)"))
        for algo in args.algos:
            flops = update_flops(algo, args)
            limit_ms = flops / (rate * 1e9) * 1e3
            print(f"  {algo}: {flops / 1e9:.3f} GFLOP per update -> arithmetic limit {limit_ms:.2f} ms "
                  f"({1e3 / limit_ms:.0f} update-phase steps/s)")
            results: dict[str, list[float]] = {**{f"keelrl {p}": [] for p in args.precisions}, "cleanrl": []}
            for repeat in range(args.repeats):  # alternating: keelrl in each precision, then CleanRL
                for precision in args.precisions:
                    results[f"keelrl {precision}"].append(keelrl_update_sps(algo, threads, repeat + 1, args, precision))
                if args.cleanrl is not None:
                    results["cleanrl"].append(cleanrl_update_sps(algo, threads, repeat + 1, args))
            for name, values in results.items():
                if values:
                    median = statistics.median(values)
                    print(f"    {name:<12} update-phase steps/s median {median:7.1f} (min {min(values):.1f}, "
                          f"max {max(values):.1f}); {1e3 / median:.2f} ms per step; "
                          f"{100 * limit_ms * median / 1e3:.0f}% of the arithmetic limit")
            for precision in args.precisions if results["cleanrl"] else ():
                ratios = [k / c for k, c in zip(results[f"keelrl {precision}"], results["cleanrl"])]
                print(f"    keelrl {precision} / CleanRL per pair: median {statistics.median(ratios):.2f}x "
                      f"(min {min(ratios):.2f}, max {max(ratios):.2f})")


if __name__ == "__main__":
    main(parse_command_line(Args))
