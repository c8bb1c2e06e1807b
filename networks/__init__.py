"""keelrl.networks: MLPs, batched ensembles, actors and critics."""

from keelrl.networks.actors import DeterministicActor, TanhGaussianActor
from keelrl.networks.critics import CriticEnsemble
from keelrl.networks.mlp import EnsembleLinear, EnsembleMLP, mlp
from keelrl.networks.normalization import RunningObsNorm

__all__ = ["mlp", "EnsembleLinear", "EnsembleMLP", "CriticEnsemble", "TanhGaussianActor", "DeterministicActor",
           "RunningObsNorm"]
