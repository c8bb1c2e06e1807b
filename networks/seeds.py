"""Several seeds of one agent trained as one: S agents stacked along a leading seed axis, their losses computed in one
batched pass (torch.func.vmap over the stacked weights), each seed drawing its noise from its own generator.

Adam and Polyak averaging act element by element, so stacked parameters stepped on the sum of the S per-seed losses
are S independent optimisers; what must stay per seed (α, the observation statistics) is stacked with the rest. An
agent opts in by drawing its noise from `self.random` (a `GlobalRandom` alone, a `SeedRandom` in a group), passing
that noise into its loss functions, and calling them through `SeedMapped`. For seed i to train exactly as a run of
that seed alone, `stack_seeds` builds each agent under its seed's random state and hands each seed a generator that
continues from where that run's global generator would be.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, vmap

from keelrl.networks.critics import random_members


class GlobalRandom:
    """A single run's noise: torch's global generator (what `Run` seeds)."""

    num_seeds = 1

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)

    def normal(self, *shape: int) -> torch.Tensor:
        """Standard normal noise of `shape`."""
        return torch.randn(shape, device=self.device)

    def members(self, num_critics: int, size: int | None) -> torch.Tensor | slice:
        """REDQ's random subset of critics (`random_members`)."""
        return random_members(num_critics, size, self.device)


class SeedRandom(GlobalRandom):
    """The noise of S seeds: each seed's part (leading axis) from its own generator."""

    def __init__(self, generators: list[torch.Generator], device: torch.device | str = "cpu"):
        super().__init__(device)
        self.generators = generators
        self.num_seeds = len(generators)

    def normal(self, *shape: int) -> torch.Tensor:
        """(S, *shape)."""
        return torch.stack([torch.randn(shape, generator=g, device=self.device) for g in self.generators])

    def members(self, num_critics: int, size: int | None) -> torch.Tensor | slice:
        """(S, size) member indices, or every member."""
        if size is None:
            return slice(None)
        return torch.stack([torch.randint(num_critics, (size,), generator=g, device=self.device)
                            for g in self.generators])


def stack_seeds(build: Callable[[], nn.Module], seeds: list[int], device: torch.device | str = "cpu") -> nn.Module:
    """One agent holding S = len(seeds) agents: each built by `build()` right after `torch.manual_seed(seed)`, as a
    run of that seed alone builds it; the first one returned with every parameter and buffer replaced, in place
    (the same Parameter objects, so optimisers and lists made in `build` stay valid), by the stack of all S
    (leading seed axis), `num_seeds` set and `random` a `SeedRandom` whose generator i continues from the state
    seed i's build left torch's generator in."""
    agents, generators = [], []
    for seed in seeds:
        torch.manual_seed(seed)
        agents.append(build())
        generator = torch.Generator(device=device)  # where the global generator of `device` now stands
        cuda = torch.device(device).type == "cuda"
        generator.set_state(torch.cuda.get_rng_state(device) if cuda else torch.get_rng_state())
        generators.append(generator)
    group = agents[0]
    others = [dict((*agent.named_parameters(), *agent.named_buffers())) for agent in agents[1:]]
    with torch.no_grad():
        for name, tensor in (*group.named_parameters(), *group.named_buffers()):
            tensor.data = torch.stack([tensor, *(state[name] for state in others)])
    group.num_seeds, group.random = len(seeds), SeedRandom(generators, device)
    return group


class _Method(nn.Module):
    """`module.name(*args)` as a module's forward, for functional_call."""

    def __init__(self, module: nn.Module, name: str):
        super().__init__()
        self.module, self.name = module, name

    def forward(self, *args: Any) -> Any:
        return getattr(self.module, self.name)(*args)


_COMPILED_CALLS = itertools.count()
"""numbers the compiled batched calls (their code objects' names)"""


class SeedMapped:
    """A bound method of a module inside an agent: for a single run `single` (the method, possibly compiled or under
    autocast), for a seed group the method once per seed in one batched pass, inside `context()`: vmap over the
    module's stacked parameters and buffers and over the leading seed axis of every tensor argument (None arguments
    and fields stay None), through torch.compile with `compile`; outputs gain the seed axis."""

    def __init__(self, method: Callable, owner: Any, single: Callable | None = None,
                 context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
                 compile: bool = False):
        self.method, self.owner, self.single, self.context = method, owner, single or method, context
        self.compile = compile
        functools.update_wrapper(self, method)

    def __call__(self, *args: Any) -> Any:
        if self.owner.num_seeds == 1:
            return self.single(*args)
        with self.context():
            return self._batched(*args)

    @functools.cached_property
    def _batched(self) -> Callable:
        module = self.method.__self__
        wrapper = _Method(module, self.method.__name__)

        def one_seed(state: dict[str, torch.Tensor], *args: Any) -> Any:
            return functional_call(wrapper, state, args, strict=False)

        def call(*args: Any) -> Any:
            state = {f"module.{name}": tensor for name, tensor in (*module.named_parameters(),
                                                                   *module.named_buffers())}
            in_dims = (0, *(_seed_dims(arg) for arg in args))
            return vmap(one_seed, in_dims=in_dims)(state, *args)

        if not self.compile:
            return call
        # torch.compile keeps its graphs, and counts recompilations against its limit (8), per code object: each
        # method of each agent gets its own, or a few agents in one process would exhaust it and run eager
        name = f"{type(module).__name__}_{self.method.__name__}_over_seeds_{next(_COMPILED_CALLS)}"
        return torch.compile(types.FunctionType(call.__code__.replace(co_name=name, co_qualname=name),
                                                call.__globals__, name, call.__defaults__, call.__closure__))


def _seed_dims(arg: Any) -> Any:
    """vmap's in_dims for an argument: 0 for a tensor, None for None or a number, field by field for a tuple or a
    dict."""
    if isinstance(arg, torch.Tensor):
        return 0
    if isinstance(arg, dict):
        return {name: _seed_dims(value) for name, value in arg.items()}
    if isinstance(arg, tuple):
        return type(arg)(*(_seed_dims(field) for field in arg)) if hasattr(arg, "_fields") else \
            tuple(_seed_dims(field) for field in arg)
    return None


def seed_rows(tensor: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows `index` (k,) of `tensor` (N, ...): (k, ...); a seed group's, index (S, k) of (S, N, ...): each seed's
    own rows, (S, k, ...)."""
    if index.dim() == 1:
        return tensor[index]
    return tensor[torch.arange(len(index), device=index.device)[:, None], index]


def slice_training_state(state: dict[str, Any], seed_index: int) -> dict[str, Any]:
    """Seed `seed_index`'s part of a group's training state (`pack_training_state`'s layout): what a run of that
    seed alone would have saved. Every network tensor and optimiser moment has the seed axis in front; an
    optimiser's step count is shared."""
    return {"networks": {name: tensor[seed_index].clone() for name, tensor in state["networks"].items()},
            "optimizers": {name: {"param_groups": optimizer["param_groups"],
                                  "state": {index: {key: value if key == "step" else value[seed_index].clone()
                                                    for key, value in moments.items()}
                                            for index, moments in optimizer["state"].items()}}
                           for name, optimizer in state["optimizers"].items()},
            "num_updates": state["num_updates"]}


def stack_training_states(states: list[dict[str, Any]]) -> dict[str, Any]:
    """The group's training state from its seeds' (the inverse of `slice_training_state`)."""
    first = states[0]
    return {"networks": {name: torch.stack([s["networks"][name] for s in states]) for name in first["networks"]},
            "optimizers": {name: {"param_groups": optimizer["param_groups"],
                                  "state": {index: {key: value if key == "step" else
                                                    torch.stack([s["optimizers"][name]["state"][index][key]
                                                                 for s in states])
                                                    for key, value in moments.items()}
                                            for index, moments in optimizer["state"].items()}}
                           for name, optimizer in first["optimizers"].items()},
            "num_updates": first["num_updates"]}
