"""keelrl.networks: MLPs, batched ensembles, actors and critics, SimBa/SimbaV2 encoders, value heads."""

from keelrl.networks.actors import DeterministicActor, TanhGaussianActor
from keelrl.networks.critics import CriticEnsemble, random_members
from keelrl.networks.builders import NetworkOptions, build_actor, build_critic, build_head, validate_network_options
from keelrl.networks.heads import C51Head, CategoricalHead, HLGaussHead, ScalarHead, ValueHead, td_target
from keelrl.networks.mlp import EnsembleLinear, EnsembleMLP, NumpyMLP, mlp, orthogonal_init_
from keelrl.networks.normalization import RewardScaler, RunningObsNorm
from keelrl.networks.simba import SimbaActor, SimbaCritic, SimbaDeterministicActor, SimbaEncoder
from keelrl.networks.simbav2 import (
    SimbaV2Actor,
    SimbaV2Critic,
    SimbaV2DeterministicActor,
    SimbaV2Encoder,
)
from keelrl.networks.streaming import ObGD, StreamMLP, sparse_init_
from keelrl.networks.training import (
    check_device,
    check_precision,
    clip_gradient_norm,
    frozen,
    loss_function,
    make_optimizer,
    matmul_precision,
    optimizer_step,
    pack_training_state,
    scale_learning_rates,
    set_float32_matmuls,
    soft_update,
    unpack_training_state,
)
from keelrl.networks.transfers import to_device

__all__ = ["mlp", "orthogonal_init_", "NumpyMLP", "EnsembleLinear", "EnsembleMLP", "CriticEnsemble", "random_members", "TanhGaussianActor", "DeterministicActor",
           "RunningObsNorm",
           "ValueHead", "ScalarHead", "CategoricalHead", "C51Head", "HLGaussHead",
           "SimbaEncoder", "SimbaCritic", "SimbaActor", "SimbaDeterministicActor",
           "SimbaV2Encoder", "SimbaV2Critic", "SimbaV2Actor", "SimbaV2DeterministicActor", "RewardScaler",
           "ObGD", "StreamMLP", "sparse_init_", "td_target",
           "NetworkOptions", "build_actor", "build_critic", "build_head", "validate_network_options",
           "check_device", "clip_gradient_norm", "loss_function", "make_optimizer", "optimizer_step", "scale_learning_rates", "soft_update", "frozen",
           "pack_training_state", "unpack_training_state", "check_precision", "matmul_precision",
           "set_float32_matmuls", "to_device"]
