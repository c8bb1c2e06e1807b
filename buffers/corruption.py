"""Data corruption of offline datasets, as in RIQL's benchmark (Yang et al. 2023).

A fraction `rate` of the transitions (exactly round(rate · N), chosen without replacement; RIQL's
code draws each transition with probability `rate`) has one field corrupted:

- `obs` (observations): random s + U(−range, range) · std(s); adversarial s + δ · std(s), δ minimising
  Q(s + δ std, a);
- `act` (actions): random a + U(−range, range) · std(a); adversarial a + δ · std(a), δ minimising
  Q(s, a + δ std);
- `reward` (rewards): random U(−range, range) · 30 (replacing the reward); adversarial −range · r;
- `dynamics` (next_observations): random s' + U(−range, range) · std(s'); adversarial s' + δ · std(s'),
  δ minimising Q(s' + δ std, π(s' + δ std)).

std is the per-dimension standard deviation of the field over the whole dataset. The adversarial δ
starts at U(−range, range) · std, as RIQL's attack.py starts it (`sample_para`, though the perturbation is then
δ · std: a dimension of large std starts at the bound, one of small std near zero), and takes `attack_steps`
signed-gradient steps of size step_size · range down the mean Q-value of a given critic, clipped back into
[−range, range] after each step (RIQL takes one step of a freshly made Adam each time, which moves every entry
by its learning rate: the same step).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import numpy as np
import torch

CorruptionKind = Literal["obs", "act", "reward", "dynamics"]
CORRUPTED_FIELD = {"obs": "observations", "act": "actions", "reward": "rewards", "dynamics": "next_observations"}
RANDOM_REWARD_SCALE = 30.0

QFunction = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (obs (B, d), actions (B, a)) -> Q (B,)
Policy = Callable[[torch.Tensor], torch.Tensor]  # obs (B, d) -> actions (B, a), differentiable


def corrupt_dataset(
    data: dict[str, np.ndarray],
    kind: CorruptionKind,
    rate: float,
    corruption_range: float,
    mode: Literal["random", "adversarial"] = "random",
    seed: int = 0,
    q_function: QFunction | None = None,
    policy: Policy | None = None,
    attack_steps: int = 100,
    step_size: float = 0.01,
    chunk_size: int = 10_000,
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """A copy of `data` with one field corrupted, and the sorted indices of the corrupted transitions.

    Adversarial obs/act corruption needs `q_function`; adversarial dynamics needs `policy` too.
    """
    if kind not in CORRUPTED_FIELD:
        raise ValueError(f"Unknown corruption {kind!r}: choose one of {', '.join(CORRUPTED_FIELD)}.")
    if mode not in ("random", "adversarial"):
        raise ValueError(f"Unknown corruption mode {mode!r}: choose random or adversarial.")
    if not 0.0 <= rate <= 1.0 or corruption_range <= 0:
        raise ValueError(f"--corruption-rate must lie in [0, 1] and --corruption-range be positive, "
                         f"got {rate} and {corruption_range}.")
    field = CORRUPTED_FIELD[kind]
    rng = np.random.default_rng(seed)
    num_rows = len(data[field])
    indices = np.sort(rng.choice(num_rows, size=int(round(rate * num_rows)), replace=False))
    original = data[field][indices]
    if kind == "reward":
        corrupted = (rng.uniform(-corruption_range, corruption_range, original.shape) * RANDOM_REWARD_SCALE
                     if mode == "random" else -corruption_range * original)
    else:
        std = data[field].std(axis=0, keepdims=True)  # (1, dim)
        if mode == "random":
            corrupted = original + rng.uniform(-corruption_range, corruption_range, original.shape) * std
        else:
            corrupted = _adversarial(data, kind, indices, std, corruption_range, rng, q_function, policy,
                                     attack_steps, step_size, chunk_size)
    out = {key: value.copy() for key, value in data.items()}
    out[field][indices] = corrupted.astype(out[field].dtype)
    return out, indices


def _adversarial(data, kind, indices, std, corruption_range, rng, q_function, policy, attack_steps, step_size,
                 chunk_size) -> np.ndarray:
    """Perturbations δ · std of the chosen rows that minimise the critic's mean Q-value."""
    if q_function is None or (kind == "dynamics" and policy is None):
        needs = "a critic and a policy" if kind == "dynamics" else "a critic"
        raise ValueError(f"Adversarial {kind} corruption needs {needs} to attack: pass --attack-model, a keelrl "
                         f"offline agent's model.pt trained on the clean dataset.")
    std_t = torch.as_tensor(std, dtype=torch.float32)
    field = CORRUPTED_FIELD[kind]
    generator = torch.Generator().manual_seed(int(rng.integers(2**31)))
    chunks = []
    for start in range(0, len(indices), chunk_size):
        rows = indices[start:start + chunk_size]
        obs = torch.as_tensor(data["observations"][rows], dtype=torch.float32)
        actions = torch.as_tensor(data["actions"][rows], dtype=torch.float32)
        target = torch.as_tensor(data[field][rows], dtype=torch.float32)

        def mean_q(perturbed: torch.Tensor) -> torch.Tensor:
            if kind == "obs":
                return q_function(perturbed, actions).mean()
            if kind == "act":
                return q_function(obs, perturbed).mean()
            return q_function(perturbed, policy(perturbed)).mean()

        delta = (torch.rand(target.shape, generator=generator) * 2 - 1) * corruption_range * std_t  # RIQL's start
        for _ in range(attack_steps):
            delta.requires_grad_(True)
            (grad,) = torch.autograd.grad(mean_q(target + delta * std_t), delta)
            delta = (delta - step_size * corruption_range * grad.sign()).clamp(-corruption_range, corruption_range)
            delta = delta.detach()
        chunks.append((target + delta * std_t).numpy())
    return np.concatenate(chunks) if chunks else data[field][indices]
