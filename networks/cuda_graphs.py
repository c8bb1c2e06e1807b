"""A whole update step (forward passes, backward passes, optimiser steps, Polyak averaging) recorded once as a CUDA
graph and replayed: one launch per update instead of hundreds, which is what a small network on a GPU waits for.
The recipe is PyTorch's whole-network capture (CUDA semantics, "CUDA Graphs"): warm-up calls on a side stream,
capturable optimisers, the inputs copied into the graph's own tensors before each replay.

What a captured step may do: GPU work of fixed shapes only. No host synchronisation (`.item()`, `float(tensor)`, a
CPU tensor read), no Python decision on a tensor's value, and state an agent keeps written in place, never replaced
by a new tensor (a graph reads and writes the memory it was recorded with). A decision made in Python (an actor
step every other update) is a `branch` argument: one graph per value it takes.
"""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

Outputs = dict[str, torch.Tensor]


def make_capturable(optimizer: torch.optim.Optimizer) -> None:
    """Ready `optimizer` for capture: `capturable` (its step counts stay on the GPU), and each learning rate a 0-d
    tensor on its parameters' device, which `scale_learning_rates` changes in place so that a replayed graph reads
    the current rate (a Python float would be recorded as a constant)."""
    for group in optimizer.param_groups:
        group["capturable"] = True
        group["lr"] = torch.as_tensor(group["lr"], dtype=torch.float32, device=group["params"][0].device)


class GraphedUpdate:
    """`step(batch, *branch)` of `agent` replayed as CUDA graphs, one per `branch`: its first `warmup_calls` calls
    run as they are (on a side stream, as capture requires: lazy initialisation, compilation, optimiser state), the
    next one records the graph and replays it, every later one copies the batch into the graph's input tensors and
    replays it. Every call is one real update; it returns copies of the step's outputs.

    On the first call the agent's optimisers (`agent.optimizers`, as the agent has them by then: a Lagrangian
    agent adds its cost critic's after its base builds this) become capturable (`make_capturable`); the generators
    of `agent.random` when it is a seed group's (networks/seeds.py) are registered with every graph, so that each
    replay draws fresh noise from each seed's generator."""

    def __init__(self, step: Callable[..., Outputs], agent: Any, warmup_calls: int = 3):
        self.step, self.agent, self.warmup_calls = step, agent, warmup_calls
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, NamedTuple, Outputs]] = {}
        self.calls: Counter[tuple] = Counter()

    def __call__(self, batch: NamedTuple, *branch: Any) -> Outputs:
        if not self.calls:
            for optimizer in self.agent.optimizers.values():
                make_capturable(optimizer)
        self.calls[branch] += 1
        if branch in self.graphs:
            graph, graph_batch, graph_outputs = self.graphs[branch]
            for graph_field, field in zip(graph_batch, batch):
                if graph_field is not None:
                    graph_field.copy_(field)
            graph.replay()
            return _copies(graph_outputs)
        if self.calls[branch] <= self.warmup_calls:
            return self._warm_up(batch, branch)
        return self._capture(batch, branch)

    def _warm_up(self, batch: NamedTuple, branch: tuple) -> Outputs:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            outputs = self.step(batch, *branch)
        torch.cuda.current_stream().wait_stream(side)
        return outputs

    def _capture(self, batch: NamedTuple, branch: tuple) -> Outputs:
        graph_batch = type(batch)(*(None if field is None else field.clone() for field in batch))
        graph = torch.cuda.CUDAGraph()
        for generator in getattr(self.agent.random, "generators", ()):
            graph.register_generator_state(generator)
        # an agent no longer used may still hold its graphs in a reference cycle (agent -> GraphedUpdate -> its
        # bound step): collected during this capture, its graph's release would invalidate the capture
        gc.collect()
        try:
            with torch.cuda.graph(graph):
                graph_outputs = self.step(graph_batch, *branch)
        except RuntimeError as error:
            raise RuntimeError(f"--cudagraphs: this update cannot be recorded as a CUDA graph ({error}). Something in "
                               f"it waits for the GPU (.item(), a CPU copy) or decides on a tensor's value; run "
                               f"without --cudagraphs (--compile alone still compiles the losses).") from error
        self.graphs[branch] = (graph, graph_batch, graph_outputs)
        graph.replay()  # recording does not run the step: this is the update of this call
        return _copies(graph_outputs)


def _copies(outputs: Outputs) -> Outputs:
    """The outputs' values now (the graph's own tensors are overwritten by its next replay)."""
    return {name: value.clone() for name, value in outputs.items()}
