"""The matrix products of one SAC or TD3 update, alone: a floor under any eager implementation.

    python -m keelrl.benchmarks.gemm_floor --threads 1 2

An update of SAC or TD3 at UTD 1 multiplies the same matrices whatever the code around them: the
target actor and target critics forward, the critics forward and backward (weight and input
gradients), and, on actor steps, the actor forward, the critics forward, their input gradients and
the actor's backward. This runs exactly those products (Hopper sizes, batch 256, 256-256 networks,
both critics as one batched product) back to back into preallocated outputs, with nothing else:
no autograd, no optimiser, no activations, no environment. The time it takes is the least time per
update of an implementation that computes these products with this machine's BLAS in float32.
One-column outputs (the critics' Q) are multiply-sums, as keelrl computes them (a one-column
batched product is several times slower). The actor's products are averaged over the policy delay
(SAC: 2 actor steps every 2 updates; TD3: 1 every 2, through the first critic only).

Reports the median wall-clock time per update over repeats (run it on an otherwise idle machine),
beside the FLOP count and the arithmetic limit that `keelrl.benchmarks.speed` prints.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Callable

import torch
import tyro

from keelrl.benchmarks.speed import Args as SpeedArgs
from keelrl.benchmarks.speed import matmul_gflops, update_flops


@dataclasses.dataclass
class Args:
    algos: tuple[str, ...] = ("sac", "td3")
    """agents whose update products to time"""
    threads: tuple[int, ...] = (1,)
    """torch thread counts"""
    repeats: int = 15
    """measurements per setting (median reported)"""
    updates: int = 100
    """updates per measurement"""


class Products:
    """A list of matrix products with their operands and outputs allocated once."""

    def __init__(self, members: int, batch: int = 256):
        self.members, self.batch = members, batch
        self.calls: list[Callable[[], torch.Tensor]] = []
        self.flops = 0.0

    def count(self, k: int, n: int) -> None:
        self.flops += 2.0 * self.members * self.batch * k * n

    def forward(self, k: int, n: int) -> None:
        """Inputs [batch, k] times weights [k, n], every member."""
        self.count(k, n)
        x, w = torch.randn(self.members, self.batch, k), torch.randn(self.members, k, n)
        if n == 1:  # a one-column output as a multiply-sum
            self.calls.append(lambda: (x * w.transpose(1, 2)).sum(-1))
            return
        out = torch.empty(self.members, self.batch, n)
        self.calls.append(lambda: torch.bmm(x, w, out=out) if self.members > 1 else torch.mm(x[0], w[0], out=out[0]))

    def input_grad(self, k: int, n: int) -> None:
        """Output gradients [batch, n] times the weights' transpose [n, k]."""
        self.count(k, n)
        g, w = torch.randn(self.members, self.batch, n), torch.randn(self.members, k, n)
        out = torch.empty(self.members, self.batch, k)
        if n == 1:  # the gradient through a one-column output is an outer product
            self.calls.append(lambda: torch.mul(g, w.transpose(1, 2), out=out))
            return
        self.calls.append(lambda: torch.bmm(g, w.transpose(1, 2), out=out) if self.members > 1
                          else torch.mm(g[0], w[0].t(), out=out[0]))

    def weight_grad(self, k: int, n: int) -> None:
        """The inputs' transpose [k, batch] times the output gradients [batch, n]."""
        self.count(k, n)
        x, g = torch.randn(self.members, self.batch, k), torch.randn(self.members, self.batch, n)
        out = torch.empty(self.members, k, n)
        self.calls.append(lambda: torch.bmm(x.transpose(1, 2), g, out=out) if self.members > 1
                          else torch.mm(x[0].t(), g[0], out=out[0]))

    def network_forward(self, layers: list[tuple[int, int]]) -> None:
        for k, n in layers:
            self.forward(k, n)

    def network_backward(self, layers: list[tuple[int, int]], weights: bool) -> None:
        """Back-propagation from the output. A network whose weights train needs their gradients and
        the input gradients of every layer but the first; a frozen one (the critics in the actor
        step) needs the input gradients of every layer, down to the actions it was given."""
        for index, (k, n) in reversed(list(enumerate(layers))):
            if weights:
                self.weight_grad(k, n)
            if index > 0 or not weights:
                self.input_grad(k, n)

    def run(self) -> None:
        for call in self.calls:
            call()


def update_products(algo: str, obs: int = 11, act: int = 3, hidden: int = 256) -> list[Products]:
    """The products of `policy_frequency` (2) updates, as lists per network ensemble size."""
    actor_out = 2 * act if algo == "sac" else act  # SAC's actor outputs mean and log-std
    actor = [(obs, hidden), (hidden, hidden), (hidden, actor_out)]
    critic = [(obs + act, hidden), (hidden, hidden), (hidden, 1)]
    single, ensemble = Products(members=1), Products(members=2)
    actor_steps, actor_critics = (2, ensemble) if algo == "sac" else (1, single)  # TD3: Q1 only
    for _ in range(2):  # critic steps
        single.network_forward(actor)  # the next actions
        ensemble.network_forward(critic)  # target critics
        ensemble.network_forward(critic)
        ensemble.network_backward(critic, weights=True)
    for _ in range(actor_steps):
        single.network_forward(actor)
        actor_critics.network_forward(critic)
        actor_critics.network_backward(critic, weights=False)
        single.network_backward(actor, weights=True)
    return [single, ensemble]


def ms_per_update(algo: str, threads: int, args: Args) -> list[float]:
    torch.set_num_threads(threads)
    products = update_products(algo)
    for _ in range(20):
        for group in products:
            group.run()
    timings = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        for _ in range(args.updates // 2):
            for group in products:
                group.run()
        timings.append(1e3 * (time.perf_counter() - start) / (2 * (args.updates // 2)))
    return timings


def main(args: Args) -> None:
    print(f"torch {torch.__version__}; matrix products of one update, wall-clock ms, median of {args.repeats}")
    for threads in args.threads:
        rate = matmul_gflops(threads)
        for algo in args.algos:
            flops = update_flops(algo, SpeedArgs())
            timings = ms_per_update(algo, threads, args)
            print(f"  {threads} thread(s) {algo}: products {statistics.median(timings):.2f} ms "
                  f"(min {min(timings):.2f}); {flops / 1e9:.3f} GFLOP at {rate:.1f} GFLOP/s "
                  f"-> arithmetic limit {flops / rate / 1e6:.2f} ms")


if __name__ == "__main__":
    main(tyro.cli(Args))
