"""The small steps every update is made of: optimisers, one optimiser step, Polyak averaging, and
freezing a network for a step."""

from __future__ import annotations

import contextlib
import functools
import shutil
import warnings
from collections.abc import Callable, Iterator
from typing import Literal

import torch
from torch import nn

from keelrl.networks.seeds import SeedMapped


def make_optimizer(params: list[nn.Parameter], kind: Literal["adam", "adamw"], lr: float,
                   weight_decay: float = 0.0, eps: float = 1e-8) -> torch.optim.Optimizer:
    """Adam or AdamW (decoupled weight decay), fused: all of a group's parameters in one kernel (the same
    arithmetic as the per-parameter loop, a few percent faster per SAC update on CPU)."""
    optimizer_cls = torch.optim.AdamW if kind == "adamw" else torch.optim.Adam
    optimizer = optimizer_cls(params, lr=lr, weight_decay=weight_decay, eps=eps, fused=True)
    for group in optimizer.param_groups:
        group["initial_lr"] = lr  # what a learning-rate schedule scales
    return optimizer


def scale_learning_rates(optimizers: list[torch.optim.Optimizer], factor: float) -> None:
    """Set every group's learning rate to `factor` times the rate it started with (in place where the rate is a
    tensor, as a captured update's is: networks/cuda_graphs.py)."""
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(group["initial_lr"] * factor)
            else:
                group["lr"] = group["initial_lr"] * factor


def optimizer_step(optimizer: torch.optim.Optimizer, loss: torch.Tensor, network: nn.Module) -> None:
    """Backpropagate `loss` (a scalar, or one per seed) and step `optimizer`; a SimbaV2 network then re-projects its
    weights onto the sphere."""
    optimizer.zero_grad(set_to_none=True)
    loss.sum().backward()  # a seed group's per-seed losses (S,): each seed's sum steps only its own weights
    optimizer.step()
    if hasattr(network, "project_weights"):
        network.project_weights()


@torch.no_grad()
def clip_gradient_norm(params: list[nn.Parameter], max_norm: float, seed_axis: bool = False) -> None:
    """Scale the gradients of `params` down to a global norm of at most `max_norm` (torch's clip_grad_norm_); with
    `seed_axis`, a seed group's (leading seed axis, networks/seeds.py): each seed's by its own global norm."""
    if not seed_axis:
        nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
        return
    grads = [param.grad for param in params if param.grad is not None]
    norms = torch.stack([torch.linalg.vector_norm(grad.flatten(1), dim=1) for grad in grads])  # (P, S)
    scale = (max_norm / (torch.linalg.vector_norm(norms, dim=0) + 1e-6)).clamp(max=1.0)  # (S,)
    for grad in grads:
        grad.mul_(scale.view(-1, *[1] * (grad.dim() - 1)))


@torch.no_grad()
def soft_update(target: list[torch.Tensor], online: list[torch.Tensor], tau: float) -> None:
    """Polyak averaging θ' ← θ' + τ(θ − θ'), every tensor at once."""
    torch._foreach_lerp_(target, online, tau)


def loss_function(loss_fn: Callable, precision: str, device: str, compile: bool = False,
                  seeds_of: nn.Module | None = None) -> Callable:
    """`loss_fn` as an update calls it: under `precision` in an autocast region of its own (`matmul_precision`),
    so each call casts the weights as they are at that moment and the backward pass and optimiser step that
    follow run outside autocast, and through torch.compile when asked. Only loss computations are compiled
    (forward, and with it the backward graph); the optimiser steps run eagerly. (--cudagraphs captures the whole
    update around them: networks/cuda_graphs.py.) With fp32 or tf32 (a setting of the whole run,
    `set_float32_matmuls`) and no compilation it is `loss_fn` itself. With `seeds_of` (the agent, which may hold
    several seeds: networks/seeds.py), a seed group calls it once per seed in one batched pass, compiled as one when
    asked."""
    single = loss_fn
    if precision == "bf16":
        single = _under_precision(single, precision, device)
    if compile:
        single = torch.compile(single)
    if seeds_of is None:
        return single
    return SeedMapped(loss_fn, seeds_of, single, context=lambda: matmul_precision(precision, device), compile=compile)


def _under_precision(loss_fn: Callable, precision: str, device: str) -> Callable:
    @functools.wraps(loss_fn)
    def loss_under_precision(*args):
        with matmul_precision(precision, device):
            return loss_fn(*args)

    return loss_under_precision


def check_device(device: str, compile: bool, cudagraphs: bool) -> None:
    """Refuse a device, --compile or --cudagraphs this machine cannot run, with what to do instead."""
    try:
        where = torch.device(device)
    except RuntimeError:
        raise ValueError(f"--device {device!r} is not a torch device: use cpu, or cuda (cuda:N for the N-th "
                         f"GPU).") from None
    if where.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {device}: keelrl runs on cpu or cuda, not {where.type}.")
    if where.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: torch sees no CUDA GPU on this machine; use --device cpu.")
    if where.type == "cuda" and where.index is not None and where.index >= torch.cuda.device_count():
        raise ValueError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA GPU(s), numbered "
                         f"from 0.")
    if cudagraphs and where.type != "cuda":
        raise ValueError("--cudagraphs captures the update in CUDA graphs, which needs --device cuda (and a GPU); "
                         "on CPU use --compile alone.")
    if compile and device == "cpu" and not any(map(shutil.which, ("g++", "c++", "clang++"))):
        raise ValueError("--compile on CPU needs a C++ compiler for torch.compile's generated kernels: install "
                         "g++ (e.g. apt install g++) or drop --compile.")


@contextlib.contextmanager
def frozen(network: nn.Module) -> Iterator[None]:
    """No parameter gradients for `network` inside (e.g. the critic while the actor steps through it); each
    parameter that had them gets them back on the way out, also when the step raises (a target network inside
    `network` stays without: a compiled seed group's losses would recompile on the changed flags)."""
    trained = [parameter for parameter in network.parameters() if parameter.requires_grad]
    for parameter in trained:
        parameter.requires_grad_(False)
    try:
        yield
    finally:
        for parameter in trained:
            parameter.requires_grad_(True)


def pack_training_state(module: nn.Module, optimizers: dict[str, torch.optim.Optimizer], num_updates: int) -> dict:
    """A module's weights (buffers included), its optimisers' states and its update count: everything to
    continue training it (tensors and plain values only)."""
    return {"networks": module.state_dict(),
            "optimizers": {name: optimizer.state_dict() for name, optimizer in optimizers.items()},
            "num_updates": num_updates}


def unpack_training_state(module: nn.Module, optimizers: dict[str, torch.optim.Optimizer], state: dict) -> int:
    """Restore what `pack_training_state` packed into `module` and `optimizers`; returns the update count."""
    module.load_state_dict(state["networks"])
    for name, optimizer in optimizers.items():
        optimizer.load_state_dict(state["optimizers"][name])
    return state["num_updates"]


PRECISIONS = ("fp32", "tf32", "bf16")
FLOAT32_MATMULS = {"fp32": "highest", "tf32": "high", "bf16": "highest"}
"""torch's float32 matrix-product precision during a run of each --precision: "high" lets CUDA multiply float32
matrices on TensorFloat-32 tensor cores (inputs rounded to 10 mantissa bits, products accumulated in float32), forward
and backward; bf16's products under autocast are bfloat16 whatever it says"""
_warned_emulated_bf16 = False
_warned_no_tf32 = False


def native_bf16(device: str) -> bool:
    """Whether `device` multiplies bfloat16 matrices in hardware (CPU: avx512_bf16 or amx_bf16; CUDA: Ampere on)."""
    if torch.device(device).type == "cuda":
        # (a bare is_bf16_supported() also says True on older cards, where bf16 is emulated)
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            flags = next((line.split() for line in cpuinfo if line.startswith("flags")), [])
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def native_tf32(device: str) -> bool:
    """Whether `device` has TensorFloat-32 tensor cores (NVIDIA GPUs from Ampere, compute capability 8.0, on)."""
    return (torch.device(device).type == "cuda" and torch.cuda.is_available()
            and torch.cuda.get_device_capability(torch.device(device)) >= (8, 0))


def check_precision(precision: str, device: str) -> None:
    """Refuse an unknown --precision; say once per process when bf16 will be emulated, and so slow, and when tf32
    has no tensor cores to run on, and so is fp32."""
    global _warned_emulated_bf16, _warned_no_tf32
    if precision not in PRECISIONS:
        raise ValueError(f"--precision must be one of {', '.join(PRECISIONS)}, got {precision!r}.")
    if precision == "tf32" and not native_tf32(device) and not _warned_no_tf32:
        _warned_no_tf32 = True
        warnings.warn(f"--precision tf32: TensorFloat-32 tensor cores are NVIDIA GPUs' from Ampere (compute "
                      f"capability 8.0) on; on this {torch.device(device).type.upper()} float32 matrix products stay "
                      f"full float32, as with --precision fp32.", stacklevel=2)
    if precision == "bf16" and not native_bf16(device) and not _warned_emulated_bf16:
        _warned_emulated_bf16 = True
        kind = torch.device(device).type
        lacks = "compute capability below 8.0" if kind == "cuda" else "no avx512_bf16 or amx_bf16"
        warnings.warn(f"--precision bf16: this {kind.upper()} has no native bfloat16 matrix products ({lacks}), so "
                      f"torch emulates them: the run will be much slower than with fp32.", stacklevel=2)


def matmul_precision(precision: str, device: str) -> contextlib.AbstractContextManager:
    """Inside it, matrix products (linear, matmul, bmm, baddbmm) run in bfloat16 under `torch.autocast` when
    `precision` is "bf16"; with "fp32" or "tf32" nothing changes (tf32 is the whole run's: `set_float32_matmuls`).
    keelrl's networks cast what they return to float32, so losses, TD targets, log-probabilities, entropies and α/λ
    stay float32, and weights and optimiser state are float32 throughout. Open it around forward passes only, never
    around an optimiser step: autocast keeps the bfloat16 copies of the weights it cast until its region closes, so
    a forward pass after a step inside the same region would use the weights from before that step."""
    if precision != "bf16":
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)


def set_float32_matmuls(precision: str) -> str:
    """Set torch's process-wide float32 matrix-product precision for a run of `precision` (FLOAT32_MATMULS: TF32
    tensor cores for tf32, full float32 otherwise, whatever the caller had set); returns the setting it replaced,
    for the run to give back when it ends."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(FLOAT32_MATMULS[precision])
    return before
