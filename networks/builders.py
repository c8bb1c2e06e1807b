"""Actors, critic ensembles and value heads of the configured architecture, for SAC, TD3 and their
Lagrangian forms, and the SimBa presets' discount: plain MLPs (CleanRL), SimBa (residual, LayerNorm) or SimbaV2 (hyperspherical), and a
scalar or categorical (C51, HL-Gauss) critic output. `NetworkOptions` holds the options that choose them."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import numpy as np
from torch import nn

from keelrl.networks.actors import DeterministicActor, TanhGaussianActor
from keelrl.networks.critics import CriticEnsemble
from keelrl.networks.heads import C51Head, CategoricalHead, HLGaussHead, ScalarHead, ValueHead
from keelrl.networks.normalization import RewardScaler
from keelrl.networks.simba import SimbaActor, SimbaCritic, SimbaDeterministicActor
from keelrl.networks.simbav2 import SimbaV2Actor, SimbaV2Critic, SimbaV2DeterministicActor


@dataclasses.dataclass
class NetworkOptions:
    """Which actor, critic and critic output an online agent builds."""

    hidden_sizes: tuple[int, ...] = (256, 256)
    """hidden layer sizes of actor and critics (--network mlp)"""
    num_critics: int = 2
    """critics in the ensemble; targets take the one with the smallest value (of --critic-subset-size of them)"""
    critic_subset_size: int | None = None
    """REDQ-style targets (WSRL's critic_subsample_size): the TD target takes the minimum over this many critics
    drawn at random, with replacement, at each update, instead of over all of them (None: all)"""
    layer_norm: bool = False
    """LayerNorm after each hidden layer's Linear, before its activation, in the MLP actor and critics (WSRL's
    networks; --network mlp)"""
    network: Literal["mlp", "simba", "simbav2"] = "mlp"
    """actor and critic architecture: plain MLPs, SimBa (residual, LayerNorm) or SimbaV2 (hyperspherical)"""
    actor_hidden_dim: int = 128
    """SimBa/SimbaV2 actor width"""
    actor_num_blocks: int = 1
    """SimBa/SimbaV2 actor residual blocks"""
    critic_hidden_dim: int = 512
    """SimBa/SimbaV2 critic width"""
    critic_num_blocks: int = 2
    """SimBa/SimbaV2 critic residual blocks"""
    critic_head: Literal["scalar", "c51", "hlgauss"] = "scalar"
    """critic output: a scalar (MSE), or a categorical distribution trained by cross-entropy against the C51
    projection of the target distribution or the HL-Gauss histogram of the scalar target"""
    v_min: float | None = None
    """lowest value of a categorical critic's support (with --scale-rewards: -5 by default)"""
    v_max: float | None = None
    """highest value of a categorical critic's support (with --scale-rewards: 5 by default)"""
    num_bins: int = 101
    """bins (atoms) of a categorical critic"""


def with_default_support(options: Any, scale_rewards: bool) -> Any:
    """A categorical critic on scaled rewards gets the support [−5, 5] the reward scaling fits returns into,
    unless --v-min/--v-max are given."""
    if not scale_rewards or options.critic_head == "scalar":
        return options
    return dataclasses.replace(options, v_min=-5.0 if options.v_min is None else options.v_min,
                               v_max=5.0 if options.v_max is None else options.v_max)


def episode_length_discount(max_episode_steps: int, action_repeat: int = 1) -> float:
    """SimBa's and SimbaV2's discount heuristic (taken from TD-MPC2): with the effective episode length
    L = max_episode_steps / action_repeat, γ = (L/5 − 1) / (L/5) clipped to [0.95, 0.995]
    (SonyResearch/simba configs/base.yaml:16-17, dojeon-ai/SimbaV2 configs/online_rl.yaml:19-20).
    MuJoCo's 1000-step episodes without action repeat give 0.995."""
    horizon = max_episode_steps / action_repeat / 5
    return max(min((horizon - 1) / horizon, 0.995), 0.95)


MUJOCO_DISCOUNT = episode_length_discount(1000)
"""The SimBa presets' discount: the heuristic on MuJoCo's 1000-step episodes (configs/env/mujoco.yaml:13,15 of SimbaV2)."""


def validate_network_options(options: NetworkOptions) -> None:
    if options.num_critics < 2:
        raise ValueError("Clipped double-Q takes the minimum over at least 2 critics: --num-critics must be >= 2.")
    subset = options.critic_subset_size
    if subset is not None and not 1 <= subset <= options.num_critics:
        raise ValueError(f"--critic-subset-size must lie in [1, --num-critics {options.num_critics}], got {subset}.")
    if options.layer_norm and options.network != "mlp":
        raise ValueError(f"--layer-norm adds LayerNorm to the MLP networks; --network {options.network} has its "
                         f"own normalisation: drop --layer-norm.")
    if options.critic_head != "scalar":
        if options.v_min is None or options.v_max is None:
            raise ValueError(f"--critic-head {options.critic_head} needs a support: give --v-min and --v-max (the "
                             f"range of returns), or --scale-rewards, which fits returns into [-5, 5].")
        CategoricalHead.check_range(options.v_min, options.v_max, options.num_bins)


def validate_scaled_support(options: NetworkOptions, scale_rewards: bool) -> None:
    """--scale-rewards bounds the scaled returns by ±G_max, a categorical critic's support's edge nearer 0
    (`build_reward_scaler`): the support must hold 0 inside."""
    if scale_rewards and options.critic_head != "scalar" and not options.v_min < 0.0 < options.v_max:
        raise ValueError(f"--scale-rewards keeps returns within ±G, the support's edge nearer 0, so --v-min and "
                         f"--v-max must lie on either side of 0, got [{options.v_min}, {options.v_max}].")


def build_reward_scaler(options: NetworkOptions, gamma: float, num_envs: int) -> RewardScaler:
    """SimbaV2's reward scaling with its returns bounded by ±G_max: a categorical critic's support's edge nearer 0,
    so that no scaled return falls outside the support (SimbaV2 sets both from one value, normalized_g_max 5 and
    the support [−5, 5]), or SimbaV2's 5 for a scalar critic."""
    g_max = 5.0 if options.critic_head == "scalar" else min(-options.v_min, options.v_max)
    return RewardScaler(gamma, num_envs, v_max=g_max)


def build_head(options: NetworkOptions) -> ValueHead:
    if options.critic_head == "c51":
        return C51Head(options.v_min, options.v_max, options.num_bins)
    if options.critic_head == "hlgauss":
        return HLGaussHead(options.v_min, options.v_max, options.num_bins)
    return ScalarHead()


def build_critic(options: NetworkOptions, obs_dim: int, action_dim: int, num_outputs: int) -> nn.Module:
    """The critic ensemble: (obs (B, obs_dim), actions (B, action_dim)) -> outputs (E, B, num_outputs)."""
    if options.network == "simba":
        return SimbaCritic(obs_dim, action_dim, options.critic_hidden_dim, options.critic_num_blocks,
                           options.num_critics, num_outputs)
    if options.network == "simbav2":
        return SimbaV2Critic(obs_dim, action_dim, options.critic_hidden_dim, options.critic_num_blocks,
                             options.num_critics, num_outputs)
    return CriticEnsemble(obs_dim, action_dim, options.hidden_sizes, options.num_critics, num_outputs,
                          options.layer_norm)


def build_actor(options: NetworkOptions, obs_dim: int, low: np.ndarray, high: np.ndarray,
                stochastic: bool) -> nn.Module:
    """A tanh-Gaussian (SAC) or deterministic (TD3) actor of the configured architecture."""
    if options.network == "mlp":
        actor_cls = TanhGaussianActor if stochastic else DeterministicActor
        return actor_cls(obs_dim, low, high, options.hidden_sizes, layer_norm=options.layer_norm)
    simba = {("simba", True): SimbaActor, ("simba", False): SimbaDeterministicActor,
             ("simbav2", True): SimbaV2Actor, ("simbav2", False): SimbaV2DeterministicActor}
    return simba[options.network, stochastic](obs_dim, low, high, options.actor_hidden_dim, options.actor_num_blocks)
