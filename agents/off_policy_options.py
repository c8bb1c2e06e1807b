"""The options the online off-policy agents (sac.py, td3.py, and through them sac_lag.py, td3_lag.py) share, with
the same defaults and meaning: the environments, the replay buffer and its returns, the discount and target rate,
observation and reward scaling, the learning-rate schedule, device, precision, compilation and seeds. Config fields
only: each agent's config dataclass extends them with its own hyperparameters (learning rates, policy delay, noise,
entropy, its learning_starts, optimiser) and checks them all in its own `validate`."""

from __future__ import annotations

import dataclasses
from typing import Literal


@dataclasses.dataclass
class OffPolicyOptions:
    env_id: str = "Hopper-v5"
    """gymnasium (or envpool) environment id with a Box action space"""
    total_timesteps: int = 1_000_000
    """environment steps to train for"""
    num_envs: int = 1
    """parallel environments (`utd` gradient updates per environment step of each, so num_envs × utd per loop step)"""
    env_backend: Literal["gymnasium", "envpool"] = "gymnasium"
    """vector environment backend (envpool needs the envpool extra)"""
    buffer_size: int = 1_000_000
    """replay buffer capacity (transitions)"""
    gamma: float = 0.99
    """discount factor"""
    tau: float = 0.005
    """target network Polyak rate"""
    batch_size: int = 256
    """transitions per gradient update"""
    n_step: int = 1
    """n-step returns from the replay buffer"""
    utd: int = 1
    """gradient updates per environment step (update-to-data ratio)"""
    scale_rewards: bool = False
    """divide rewards by SimbaV2's running scale of the discounted return, so returns stay within ±G: the
    categorical support's edge nearer 0 (5 for a scalar critic)"""
    normalize_obs: bool = False
    """normalise observations by running mean/std, (obs − mean) / sqrt(var + 1e-8), updated on the observations
    acted on (saved with the model)"""
    obs_clip: float | None = 10.0
    """with --normalize-obs: clip normalised observations to ±obs_clip (None: no clipping, as SimBa and SimbaV2)"""
    final_lr_fraction: float = 1.0
    """learning rates decay linearly over the run to this fraction of their start (1: constant)"""
    preset: Literal["simba", "simbav2"] | None = None
    """the SimBa or SimbaV2 paper's settings in one flag; an explicit option that contradicts it is refused"""
    device: str = "cpu"
    """torch device for networks and replay buffer"""
    precision: Literal["fp32", "tf32", "bf16"] = "fp32"
    """'fp32'; 'tf32': during a run, CUDA multiplies float32 matrices on TensorFloat-32 tensor cores (Ampere on; JAX's
    default there); 'bf16': matrix products in bfloat16 under autocast (fast only where the CPU or GPU has native
    bf16). Weights, optimiser state, losses, TD targets, log-probabilities and target updates stay float32"""
    compile: bool = False
    """compile the loss computations with torch.compile (a C++ compiler is needed on CPU)"""
    cudagraphs: bool = False
    """with --device cuda: record each whole update (losses compiled as with --compile, backward passes, optimiser
    steps, target update; the Lagrangian agents' cost critic step too) once as a CUDA graph and replay it
    (networks/cuda_graphs.py)"""
    num_seeds: int = 1
    """train seeds seed, seed+1, …, seed+num_seeds−1 in this one process as one batched network, each in a run
    directory of its own as a run of that seed alone (--runs-dir may hold {seed}: each seed's is filled in)"""
