"""The matrix products of one SAC or TD3 update, alone: a floor under any eager implementation.

    python -m keelrl.benchmarks.perf.gemm_floor --threads 1 2

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
beside the FLOP count and the arithmetic limit that `keelrl.benchmarks.perf.speed` prints.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import torch

from keelrl.agents.harness.options import parse_command_line
from keelrl.benchmarks.perf.speed import Args as SpeedArgs
from keelrl.benchmarks.perf.speed import matmul_gflops, update_flops


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


class Network:
    """One MLP (or ensemble of `members` MLPs) reduced to its matrix products: weights, the input of
    every layer, the gradient of every layer's output and the weight gradients are allocated once
    and shared by all its products, so operands stay as cache-resident as in a real update."""

    def __init__(self, layers: list[tuple[int, int]], members: int, batch: int = 256,
                 weights: list[torch.Tensor] | None = None):
        self.layers, self.members = layers, members
        self.weights = weights or [torch.randn(members, k, n) / k**0.5 for k, n in layers]
        self.inputs = [torch.randn(members, batch, k) for k, _ in layers]  # input of layer l
        self.outputs = torch.empty(members, batch, layers[-1][1])
        self.output_grads = [torch.randn(members, batch, n) for _, n in layers]  # d loss / d output of layer l
        self.input_grad = torch.empty(members, batch, layers[0][0])
        self.weight_grads = [torch.empty(members, k, n) for k, n in layers]

    def first_member(self) -> Network:
        """The first member alone, sharing its weights (TD3's actor loss uses Q1 only)."""
        return Network(self.layers, 1, self.inputs[0].shape[1], [w[:1] for w in self.weights])

    def layer_flops(self) -> list[float]:
        """FLOPs of one product per layer (forward, input gradient and weight gradient cost the same)."""
        return [2.0 * self.members * self.inputs[0].shape[1] * k * n for k, n in self.layers]

    def forward_backward_flops(self, trains: bool) -> float:
        flops = self.layer_flops()
        backward = sum(flops) + sum(flops[1:]) if trains else sum(flops)
        return sum(flops) + backward

    @staticmethod
    def product(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
        torch.bmm(a, b, out=out) if a.shape[0] > 1 else torch.mm(a[0], b[0], out=out[0])

    def forward(self) -> None:
        for index, weight in enumerate(self.weights):
            x = self.inputs[index]
            if index + 1 == len(self.weights) and weight.shape[2] == 1:  # a one-column output as a multiply-sum
                torch.sum(x * weight.transpose(1, 2), dim=-1, keepdim=True, out=self.outputs)
            else:
                self.product(x, weight, self.inputs[index + 1] if index + 1 < len(self.weights) else self.outputs)

    def backward(self, trains: bool) -> None:
        """Back-propagation from the output. A network that trains needs its weight gradients and the
        input gradients of every layer but the first; a frozen one (the critics in the actor step)
        needs the input gradients of every layer, down to the actions it was given."""
        for index in reversed(range(len(self.weights))):
            weight, grad = self.weights[index], self.output_grads[index]
            if trains:
                self.product(self.inputs[index].transpose(1, 2), grad, self.weight_grads[index])
            if index > 0 or not trains:
                below = self.output_grads[index - 1] if index > 0 else self.input_grad
                if weight.shape[2] == 1:  # through a one-column output: an outer product
                    torch.mul(grad, weight.transpose(1, 2), out=below)
                else:
                    self.product(grad, weight.transpose(1, 2), below)


class UpdateProducts:
    """The matrix products of `policy_frequency` (2) SAC or TD3 updates, in the order they happen."""

    def __init__(self, algo: str, obs: int = 11, act: int = 3, hidden: int = 256):
        actor_out = 2 * act if algo == "sac" else act  # SAC's actor outputs mean and log-std
        actor_layers = [(obs, hidden), (hidden, hidden), (hidden, actor_out)]
        critic_layers = [(obs + act, hidden), (hidden, hidden), (hidden, 1)]
        self.actor, self.target_actor = Network(actor_layers, 1), Network(actor_layers, 1)
        self.critics, self.target_critics = Network(critic_layers, 2), Network(critic_layers, 2)
        # SAC: an actor step per update, through both critics; TD3: one per 2 updates, through Q1
        self.actor_steps, self.actor_critics = (2, self.critics) if algo == "sac" else (1, self.critics.first_member())
        self.next_actor = self.actor if algo == "sac" else self.target_actor  # SAC samples a' from its actor

    def flops_per_update(self) -> float:
        critic_step = (sum(self.next_actor.layer_flops()) + sum(self.target_critics.layer_flops())
                       + self.critics.forward_backward_flops(trains=True))
        actor_step = self.actor.forward_backward_flops(trains=True) + self.actor_critics.forward_backward_flops(trains=False)
        return (2 * critic_step + self.actor_steps * actor_step) / 2

    def run(self) -> None:
        for _ in range(2):  # critic steps
            self.next_actor.forward()
            self.target_critics.forward()
            self.critics.forward()
            self.critics.backward(trains=True)
        for _ in range(self.actor_steps):
            self.actor.forward()
            self.actor_critics.forward()
            self.actor_critics.backward(trains=False)
            self.actor.backward(trains=True)


def ms_per_update(algo: str, threads: int, args: Args) -> list[float]:
    torch.set_num_threads(threads)
    products = UpdateProducts(algo)
    for _ in range(20):
        products.run()
    timings = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        for _ in range(args.updates // 2):
            products.run()
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
    main(parse_command_line(Args))
