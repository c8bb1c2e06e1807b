"""Robust IQL (Yang et al. 2023, "Towards Robust Offline RL under Diverse Data Corruption"): IQL with
RIQL's defaults. The update rule is agents/iql.py's; RIQL switches on its robust options.

Run:     python -m keelrl.agents.riql --dataset keelrl/hopper-medium-v0 --corruption dynamics --corruption-rate 0.3
Import:  from keelrl.agents.riql import RIQL, RIQLConfig, train, evaluate

What RIQL changes (defaults from the RIQL repository's TrainConfig, RIQL.py):
- 3M updates (3000 epochs of 1000), the actor's cosine schedule over all of them, evaluation every 10k;
- EDAC's critic initialisation (biases 0.1, output layer U(±3e-3));
- observation statistics over observations and next observations (a corrupted s' counts too);
- 5 critics, and V's target is their `quantile` (0.25) instead of their minimum;
- a Huber loss for Q (quadratic below |error| 1/σ², σ = 1) and targets clipped into [−100, 1000];
- a deterministic actor (its log-std clip would be −5 for a Gaussian one).
The paper tunes σ, the quantile and the ensemble per task and corruption (hopper, random dynamics:
σ 1, quantile 0.5, 5 critics; random observations: σ 0.1, quantile 0.25, 3 critics); pass them as options.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from keelrl.agents.common import TrainResult, run_cli
from keelrl.agents.iql import IQL, IQLConfig, validate
from keelrl.agents.offline_common import evaluate, train_offline

__all__ = ["RIQL", "RIQLConfig", "train", "evaluate"]


@dataclasses.dataclass
class RIQLConfig(IQLConfig):
    total_updates: int = 3_000_000
    """gradient updates (RIQL: 3000 epochs × 1000); the actor's cosine schedule runs over all of them"""
    eval_freq: int = 10_000
    """updates between evaluations (RIQL: every 10 epochs)"""
    deterministic_actor: bool = True
    """a deterministic actor trained by weighted squared error (RIQL's default)"""
    log_std_min: float = -5.0
    """lower clip of a Gaussian actor's log-std"""
    num_critics: int = 5
    """critics in the Q ensemble"""
    q_target: Literal["min", "quantile"] = "quantile"
    """how V's target combines the target critics: their `quantile`"""
    quantile: float = 0.25
    """quantile of the target critics"""
    q_loss: Literal["mse", "huber"] = "huber"
    """critic regression loss"""
    huber_sigma: float = 1.0
    """σ: the Huber loss is quadratic for |error| < 1/σ² and linear beyond"""
    target_clip: tuple[float, float] | None = (-100.0, 1000.0)
    """clip Q targets into [low, high]"""
    obs_stats_with_next: bool = True
    """fit the observation statistics to observations and next observations"""
    edac_critic_init: bool = True
    """EDAC's critic initialisation: every bias 0.1, the output layer's weights and bias U(±3e-3)"""


class RIQL(IQL):
    """IQL's networks and update rule under RIQL's name and defaults."""

    algo = "riql"
    config_cls = RIQLConfig


def train(config: RIQLConfig) -> TrainResult:
    """Train RIQL for `config.total_updates` gradient updates on `config.dataset`."""
    return train_offline(RIQL, config, validate)


if __name__ == "__main__":
    raise SystemExit(run_cli(train, RIQLConfig))
