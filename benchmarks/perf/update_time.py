"""CPU time of one update (or one act) of SAC, TD3, CQL, IQL or RIQL, in fp32 or bf16, robust to other processes on the
machine.

    python -m keelrl.benchmarks.perf.update_time --algos sac td3 --hidden 256 8
    python -m keelrl.benchmarks.perf.update_time --algos sac cql iql riql --hidden 256 --precisions fp32 bf16
    python -m keelrl.benchmarks.perf.update_time --compile
    python -m keelrl.benchmarks.perf.update_time --algos sac --hidden 256 --num-seeds 3     # a --num-seeds group
    python -m keelrl.benchmarks.perf.update_time --algos sac --networks mlp/scalar simba/scalar simbav2/c51 --hidden 256
    python -m keelrl.benchmarks.perf.update_time --algos sac --hidden 256 --num-seeds 3 --act --compile  # a group acts
    python -m keelrl.benchmarks.perf.update_time --algos sac --preset simbav2 --flops    # GFLOP of one update instead

Times updates on random Hopper-sized batches (batch 256) with one torch thread, by the process's
CPU time rather than wall-clock time: another busy process then slows the figure far less (it
still shares caches), so before/after comparisons stay meaningful on a shared machine. With
`--hidden 8` the arithmetic nearly vanishes and what remains is the per-update overhead
(Python, dispatch, autograd, optimiser bookkeeping). `--networks` times other network / value-head
pairs at their own default sizes (`--hidden` then applies to the mlp only); `--preset` times an agent
with every option of that paper's setting. One update is one gradient step: a run with `--utd N`
does N of them per environment step. `--precisions fp32 bf16` times each setting both ways (bf16: matrix
products in bfloat16 under autocast, see networks/training.matmul_precision). CQL, IQL and RIQL are timed
at their configs' defaults with `--hidden`-wide networks (`--networks` and `--preset` are SAC/TD3's).
`--act` times the act of a training step instead (one env's observation per seed, exploration noise drawn): the
host time a loop spends choosing each action. Reports the median over repeats. `--flops` counts the floating-point
operations of one eager update (or act) instead, with torch's FLOP counter (matrix products and the like; the
elementwise work around them is not counted): the arithmetic a GPU must do per call, whatever its speed.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from keelrl.agents import cql, iql, riql, sac, td3
from keelrl.agents.harness.options import apply_preset, parse_command_line
from keelrl.buffers import Batch, ReplayBuffer
from keelrl.networks.builders import with_default_support
from keelrl.networks.seeds import stack_seeds

AGENTS = {"sac": (sac.SAC, sac.SACConfig, sac.PRESETS), "td3": (td3.TD3, td3.TD3Config, td3.PRESETS),
          "cql": (cql.CQL, cql.CQLConfig, None), "iql": (iql.IQL, iql.IQLConfig, None),
          "riql": (riql.RIQL, riql.RIQLConfig, None)}
"""agent class, config class and presets (None: an offline agent, timed at its defaults)"""


@dataclasses.dataclass
class Args:
    algos: tuple[str, ...] = ("sac", "td3")
    """agents to time"""
    hidden: tuple[int, ...] = (256, 8)
    """hidden widths of the 2-layer networks to time (8: overhead only)"""
    networks: tuple[str, ...] = ("mlp/scalar",)
    """network/critic-head pairs to time (network: mlp, simba, simbav2; head: scalar, c51, hlgauss)"""
    preset: str | None = None
    """time an agent built with this preset (simba, simbav2) instead of --networks"""
    compile: bool = False
    """time the --compile update"""
    num_seeds: int = 1
    """time one update of a group of this many seeds (SAC, TD3: --num-seeds), each on its own batch"""
    act: bool = False
    """time one act of a training step instead of an update: one env's observation per seed, noise drawn"""
    precisions: tuple[str, ...] = ("fp32",)
    """precisions to time each setting in (fp32, bf16)"""
    flops: bool = False
    """count the GFLOP of one eager call (torch.utils.flop_counter) instead of timing it"""
    warmup: int = 20
    """untimed updates before the measurements (and compilation)"""
    updates: int = 150
    """updates per measurement"""
    repeats: int = 5
    """measurements per setting (median reported)"""
    obs_dim: int = 11
    """observation size (Hopper)"""
    action_dim: int = 3
    """action size (Hopper)"""


def filled_buffer(obs_dim: int, action_dim: int, transitions: int = 1_000) -> ReplayBuffer:
    """A replay buffer of random transitions with the given sizes."""
    buffer = ReplayBuffer(10_000, (obs_dim,), (action_dim,))
    rng = np.random.default_rng(0)
    for _ in range(transitions):
        obs = rng.normal(size=(1, obs_dim))
        buffer.add(obs, rng.uniform(-1, 1, (1, action_dim)), [1.0], obs, [False], [False])
    return buffer


def timed_settings(args: Args, algo: str) -> list[tuple[str, dict]]:
    """(label, config fields) of every setting of `algo` to time."""
    if AGENTS[algo][2] is None:  # offline: its own networks, at --hidden widths
        return [(f"mlp {hidden}-{hidden}", {"hidden_sizes": (hidden, hidden)}) for hidden in args.hidden]
    compile_option = {"compile": True} if args.compile else {}
    if args.preset is not None:
        return [(f"preset {args.preset}", {"preset": args.preset, **compile_option})]
    settings = []
    for network_and_head in args.networks:
        network, critic_head = network_and_head.split("/")
        options = {"network": network, "critic_head": critic_head, **compile_option}
        if critic_head != "scalar":
            options.update(v_min=-10.0, v_max=10.0)
        if network != "mlp":  # SimBa/SimbaV2 networks have their own widths
            settings.append((network_and_head, options))
            continue
        for hidden in args.hidden:
            settings.append((f"{network_and_head} {hidden}-{hidden}", {**options, "hidden_sizes": (hidden, hidden)}))
    return settings


def prepared_call(algo: str, options: dict, args: Args) -> Callable[[], object]:
    """One update (one act with --act) of `algo` built with `options`, on a fresh random batch at each call."""
    agent_cls, config_cls, presets = AGENTS[algo]
    config = config_cls(**options)
    if presets is not None:
        config = apply_preset(config, presets)
        config = with_default_support(config, config.scale_rewards)
    def build() -> torch.nn.Module:
        return agent_cls(args.obs_dim, -np.ones(args.action_dim), np.ones(args.action_dim), config)

    torch.manual_seed(0)
    agent = build() if args.num_seeds == 1 else stack_seeds(build, list(range(args.num_seeds)))
    buffer = filled_buffer(args.obs_dim, args.action_dim)

    def batch() -> Batch:  # a group's: each seed's own, stacked (S, 256, ...)
        if args.num_seeds == 1:
            return buffer.sample(256)
        samples = [buffer.sample(256) for _ in range(args.num_seeds)]
        return Batch(*(None if fields[0] is None else torch.stack(fields) for fields in zip(*samples)))

    obs = np.random.default_rng(0).normal(size=(*([args.num_seeds] if args.num_seeds > 1 else []), 1, args.obs_dim))
    return (lambda: agent.act(obs)) if args.act else (lambda: agent.update(batch()))


def cpu_ms_per_call(call: Callable[[], object], args: Args) -> list[float]:
    """CPU ms per call, one figure per repeat."""
    for _ in range(args.warmup):  # (and compilation)
        call()
    timings = []
    for _ in range(args.repeats):
        start = time.process_time()
        for _ in range(args.updates):
            call()
        timings.append(1e3 * (time.process_time() - start) / args.updates)
    return timings


def gflops_per_call(call: Callable[[], object]) -> float:
    """GFLOP of one call, counted after a first one (which makes the optimisers' state)."""
    call()
    with FlopCounterMode(display=False) as counter:
        call()
    return counter.get_total_flops() / 1e9


def main(args: Args) -> None:
    if args.flops and args.compile:
        raise SystemExit("--flops counts an eager call: drop --compile (compilation changes no arithmetic's count)")
    torch.set_num_threads(1)
    measured = "GFLOP per eager call" if args.flops else f"CPU ms per call (median of {args.repeats})"
    print(f"torch {torch.__version__}, 1 thread, " + ("act of one env's observation" if args.act else
                                                        "update of batch 256") + f", {measured}"
          f"{', --compile' if args.compile else ''}{f', --num-seeds {args.num_seeds}' if args.num_seeds > 1 else ''}")
    for algo in args.algos:
        for label, options in timed_settings(args, algo):
            for precision in args.precisions:
                call = prepared_call(algo, {**options, "precision": precision}, args)
                if args.flops:
                    print(f"  {algo} {label} {precision}: {gflops_per_call(call):8.2f} GFLOP", flush=True)
                    continue
                timings = cpu_ms_per_call(call, args)
                print(f"  {algo} {label} {precision}: {statistics.median(timings):8.2f} ms "
                      f"(min {min(timings):.2f}, max {max(timings):.2f})", flush=True)


if __name__ == "__main__":
    main(parse_command_line(Args))
