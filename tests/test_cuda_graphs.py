"""--cudagraphs of SAC and TD3 (networks/cuda_graphs.py): a captured update reads its learning rate from a tensor the
schedule changes in place, and, where torch sees a CUDA GPU, updates replayed as CUDA graphs equal the same updates
run eagerly, in each branch (critic alone; critic, actor and α), through warm-up, capture and replays: SAC with its
MLP, SimBa, SimbaV2 and HL-Gauss critics, TD3, and a seed group (its generators registered with the graphs), also
as `--num-seeds --cudagraphs` trains it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from keelrl.agents import sac
from keelrl.agents.sac import PRESETS, SAC, SACConfig, resolve
from keelrl.agents.sac_lag import SACLag, SACLagConfig
from keelrl.agents.td3 import TD3, TD3Config
from keelrl.agents.td3_lag import TD3Lag, TD3LagConfig
from keelrl.buffers import Batch
from keelrl.networks import make_optimizer, scale_learning_rates
from keelrl.networks.cuda_graphs import GraphedUpdate, make_capturable
from keelrl.networks.seeds import stack_seeds
from test_seeds import TINY, recorded

OBS_DIM, ACTION_DIM, BATCH = 11, 3, 64
LOW, HIGH = -np.ones(ACTION_DIM, np.float32), np.ones(ACTION_DIM, np.float32)
UPDATES = 14
"""with an actor step every other update: 3 warm-up calls of each branch, the capture of each, then replays"""
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
# a learning-rate schedule, so that the captured rate must follow it, and an actor step every other update
COMMON = dict(policy_frequency=2, final_lr_fraction=0.5, total_timesteps=UPDATES, learning_starts=0, device="cuda")


def sac_with(**options) -> SAC:
    """SAC with `options` (a preset's fields) on the schedule of COMMON, as a new run resolves it."""
    return SAC(OBS_DIM, LOW, HIGH, resolve(SACConfig(**(options | COMMON))))


AGENTS = {
    "sac": lambda: sac_with(hidden_sizes=(64, 64)),
    "td3": lambda: TD3(OBS_DIM, LOW, HIGH, TD3Config(hidden_sizes=(64, 64), **COMMON)),
    # the networks and critics the GPU run's learning cells train: SimBa (AdamW, observation normalisation),
    # SimbaV2 (weights re-projected onto the sphere after each step, C51 critic on scaled rewards), HL-Gauss
    "sac-simba": lambda: sac_with(**PRESETS["simba"]),
    "sac-simbav2": lambda: sac_with(**PRESETS["simbav2"]),
    "sac-hlgauss": lambda: sac_with(hidden_sizes=(64, 64), critic_head="hlgauss", scale_rewards=True),
}


def test_make_capturable_makes_the_rate_a_tensor_the_schedule_scales_in_place():
    optimizer = make_optimizer([nn.Parameter(torch.zeros(3))], "adam", 1e-3)
    make_capturable(optimizer)
    group = optimizer.param_groups[0]
    rate = group["lr"]
    assert group["capturable"] and isinstance(rate, torch.Tensor) and rate.dim() == 0
    scale_learning_rates([optimizer], 0.25)
    assert group["lr"] is rate  # the tensor a graph was recorded with
    assert rate.item() == pytest.approx(2.5e-4)


def batches(seeds: int | None = None, costs: bool = False) -> list[Batch]:
    """UPDATES random batches on the GPU ((S, B, ...) for a seed group of `seeds`), with step costs if asked."""
    g = torch.Generator().manual_seed(0)
    lead = (BATCH,) if seeds is None else (seeds, BATCH)

    def one() -> Batch:
        return Batch(obs=torch.randn(*lead, OBS_DIM, generator=g),
                     actions=torch.rand(*lead, ACTION_DIM, generator=g) * 2 - 1,
                     rewards=torch.randn(*lead, generator=g), next_obs=torch.randn(*lead, OBS_DIM, generator=g),
                     terminated=(torch.rand(*lead, generator=g) < 0.1).float(), discounts=torch.full(lead, 0.99),
                     costs=(torch.rand(*lead, generator=g) < 0.3).float() if costs else None)

    return [Batch(*(None if field is None else field.cuda() for field in one())) for _ in range(UPDATES)]


def graphed(agent: nn.Module) -> nn.Module:
    """`agent` with its update replayed as CUDA graphs (its losses stay eager, so numbers can match exactly)."""
    agent._learn_step = GraphedUpdate(agent.learn_step, agent)
    return agent


def train(agent: nn.Module, data: list[Batch]) -> list[dict[str, torch.Tensor]]:
    torch.manual_seed(1)
    return [agent.update(batch) for batch in data]


def assert_same_training(eager: nn.Module, captured: nn.Module, data: list[Batch]) -> None:
    eager_losses, captured_losses = train(eager, data), train(captured, data)
    for step, (expected, got) in enumerate(zip(eager_losses, captured_losses)):
        assert got.keys() == expected.keys()
        for name in expected:
            torch.testing.assert_close(got[name], expected[name], atol=1e-5, rtol=1e-5,
                                       msg=f"{name} at update {step}")
    for name, value in eager.state_dict().items():
        torch.testing.assert_close(captured.state_dict()[name], value, atol=1e-5, rtol=1e-5, msg=name)
    assert len(captured._learn_step.graphs) == 2  # one per branch: with and without the actor step


@cuda
@pytest.mark.parametrize("name", list(AGENTS))
def test_updates_replayed_as_cuda_graphs_equal_eager_updates(name):
    torch.manual_seed(0)
    eager = AGENTS[name]().cuda()
    torch.manual_seed(0)
    captured = graphed(AGENTS[name]().cuda())
    assert_same_training(eager, captured, batches())
    rate = captured.optimizers["critic"].param_groups[0]["lr"]
    assert rate.device.type == "cuda" and rate.item() == pytest.approx(eager.optimizers["critic"].param_groups[0]["lr"])


@cuda
def test_a_seed_group_replayed_as_cuda_graphs_draws_each_seed_noise_as_eager():
    eager = stack_seeds(AGENTS["sac"], [1, 2], device="cuda").cuda()
    captured = graphed(stack_seeds(AGENTS["sac"], [1, 2], device="cuda").cuda())
    assert_same_training(eager, captured, batches(seeds=2))


@cuda
def test_cudagraphs_option_trains_as_eager_within_compiler_rounding():
    """--cudagraphs as a user sets it: losses compiled, the whole update captured."""
    torch.manual_seed(0)
    eager = AGENTS["sac"]().cuda()
    torch.manual_seed(0)
    captured = SAC(OBS_DIM, LOW, HIGH, dataclasses.replace(eager.config, cudagraphs=True)).cuda()
    data = batches()
    for expected, got in zip(train(eager, data), train(captured, data)):
        for name in expected:
            torch.testing.assert_close(got[name], expected[name], atol=1e-3, rtol=1e-3, msg=name)
    assert isinstance(captured._learn_step, GraphedUpdate) and len(captured._learn_step.graphs) == 2


@cuda
@pytest.mark.parametrize("options", [{}, dict(network="simbav2", critic_head="c51", num_bins=11, scale_rewards=True,
                                              normalize_obs=True, obs_clip=None, critic_hidden_dim=16,
                                              actor_hidden_dim=16)])
def test_a_seed_group_trained_with_cudagraphs_ends_as_the_compiled_group(options, tmp_path):
    """--num-seeds 2 --cudagraphs through the run harness: the group's update (each loss batched over the seeds with
    vmap and compiled, as --compile does) recorded and replayed, each seed's final networks as the --compile
    group's."""
    tiny = dict(env_id="InvertedPendulum-v5", total_timesteps=150, learning_starts=100, batch_size=16,
                hidden_sizes=(16, 16), eval_freq=0, eval_episodes=2, checkpoint_freq=150, device="cuda", quiet=True,
                seed=4, num_seeds=2, **options)

    def models(option: str) -> dict[int, SAC]:
        runs = tmp_path / option
        sac.train(SACConfig(**tiny, **{option: True}, runs_dir=str(runs)))
        return {json.loads((d / "config.json").read_text())["config"]["seed"]: SAC.load(d / "model.pt")
                for d in Path(runs).iterdir()}

    compiled, captured = models("compile"), models("cudagraphs")
    for seed in (4, 5):  # the same compiled kernels; capturable Adam rounds its step apart, over 50 updates
        for name, value in compiled[seed].state_dict().items():
            torch.testing.assert_close(captured[seed].state_dict()[name], value, atol=1e-4, rtol=1e-4, msg=name)


@cuda
def test_each_seed_of_ten_under_cudagraphs_updates_as_its_single_graphed_run(tmp_path, monkeypatch):
    """`--num-seeds 10 --cudagraphs`, the seed group the GPU run times against ten single-seed processes: the first
    and the last seed's losses over the first 50 updates equal their single `--cudagraphs` runs' within
    tests/test_seeds.py's tolerance, and a seed given its neighbour's noise would not (their losses differ)."""
    _, updates = recorded(monkeypatch, "sac")
    options = dict(TINY, device="cuda", cudagraphs=True)
    sac.train(SACConfig(**options, seed=1, num_seeds=10, runs_dir=str(tmp_path / "group")))
    group = list(updates)
    assert len(group) == 50 and group[-1]["losses/qf_loss"].shape == (10,)
    for i, seed in ((0, 1), (9, 10)):
        updates.clear()
        sac.train(SACConfig(**options, seed=seed, runs_dir=str(tmp_path / f"single{seed}")))
        for grouped, alone in zip(group, updates, strict=True):
            for name, value in alone.items():
                torch.testing.assert_close(grouped[name][i], value, rtol=1e-5, atol=1e-6, msg=name)
    assert not torch.allclose(group[-1]["losses/qf_loss"][0], group[-1]["losses/qf_loss"][9])


LAGRANGIAN = {
    "sac_lag": lambda: SACLag(OBS_DIM, LOW, HIGH, resolve(SACLagConfig(hidden_sizes=(64, 64), **COMMON))),
    "td3_lag": lambda: TD3Lag(OBS_DIM, LOW, HIGH, TD3LagConfig(hidden_sizes=(64, 64), **COMMON)),
}


@cuda
@pytest.mark.parametrize("name", list(LAGRANGIAN))
def test_lagrangian_updates_replayed_as_cuda_graphs_equal_eager_updates_and_read_the_current_lambda(name):
    """The cost critic's step is part of the graph (its optimiser made capturable with the others), and λ, which
    moves between updates, is read where the graph recorded it."""
    torch.manual_seed(0)
    eager = LAGRANGIAN[name]().cuda()
    torch.manual_seed(0)
    captured = graphed(LAGRANGIAN[name]().cuda())
    data = batches(costs=True)
    for agent in (eager, captured):
        agent.lagrange.value.fill_(0.5)
    first = train(eager, data[:10]), train(captured, data[:10])
    for agent in (eager, captured):  # as `observe` moves it between updates: in place
        agent.lagrange.value.fill_(2.0)
    second = train(eager, data[10:]), train(captured, data[10:])
    for expected, got in zip(first[0] + second[0], first[1] + second[1]):
        for name_ in expected:
            torch.testing.assert_close(got[name_], expected[name_], atol=1e-5, rtol=1e-5, msg=name_)
    for key, value in eager.state_dict().items():
        torch.testing.assert_close(captured.state_dict()[key], value, atol=1e-5, rtol=1e-5, msg=key)
    assert captured.optimizers["cost_critic"].param_groups[0]["capturable"]
