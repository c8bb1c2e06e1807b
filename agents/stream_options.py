"""The options the stream agents (stream_td.py, stream_q.py, stream_ac.py) share, and their checks: stream-x's
defaults for ObGD (networks/streaming.py) and the stream env's wrappers (envs/streaming_wrappers.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

from keelrl.agents.harness.options import validate_run_options


@dataclasses.dataclass
class StreamOptions:
    gamma: float = 0.99
    """discount factor"""
    lam: float = 0.8
    """trace decay λ: eligibility traces decay by γλ per step"""
    lr: float = 1.0
    """ObGD learning rate (the step size before the overshooting bound)"""
    kappa_value: float = 2.0
    """ObGD bound κ of the value (or action-value) network"""
    sparsity: float = 0.9
    """fraction of each weight row's inputs zeroed at initialisation"""
    adaptive: bool = False
    """adaptive ObGD: trace coordinates divided by the root of a running mean of (δe)²"""
    beta2: float = 0.999
    """decay of adaptive ObGD's running mean of (δe)²"""
    normalize_obs: bool = True
    """standardise observations by running Welford mean and variance"""
    scale_rewards: bool = True
    """divide rewards by the running std of a discounted-return trace"""
    time_feature: bool = True
    """append the fraction of the time limit still ahead to the observation"""


def validate_stream_options(config: Any) -> None:
    """Reject option values no stream run can use in a stream agent's config (its run options, these, its hidden
    sizes), with the options' command-line names."""
    validate_run_options(config, "total_timesteps")
    for name in ("gamma", "lam"):
        if not 0.0 <= getattr(config, name) <= 1.0:
            raise ValueError(f"--{name} must lie in [0, 1], got {getattr(config, name)}.")
    if not 0.0 <= config.beta2 < 1.0:  # adaptive ObGD's bias correction divides by 1 − β₂ⁿ
        raise ValueError(f"--beta2 must lie in [0, 1), got {config.beta2}.")
    if config.lr <= 0 or config.kappa_value <= 0:
        raise ValueError(f"--lr and --kappa-value must be positive, got {config.lr} and {config.kappa_value}.")
    if not 0.0 <= config.sparsity < 1.0:
        raise ValueError(f"--sparsity must lie in [0, 1), got {config.sparsity}.")
    if not config.hidden_sizes or min(config.hidden_sizes) < 1:
        raise ValueError(f"--hidden-sizes needs positive widths, got {config.hidden_sizes}.")
