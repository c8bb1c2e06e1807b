"""Where torch sees a CUDA GPU: what an environment step sends to the GPU never waits for it. A replay add (one
buffer, and a seed group's, all seeds in one copy), the observations an agent acts on, and the observation and
reward statistics folded in at every step go through pinned memory with non-blocking copies
(networks/transfers.py: to_device), so torch's sync debug mode, which raises at any call that synchronises the host
with the GPU, lets them through; and what lands on the GPU equals what a CPU run keeps. PPO's rollouts do not
touch the GPU at all."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from keelrl.agents.ppo import PPO, PPOConfig
from keelrl.buffers import ReplayBuffer, SeedReplay
from keelrl.networks import RewardScaler, RunningObsNorm, to_device
from keelrl.networks.seeds import stack_seeds

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def steps(num_seeds: int, count: int) -> list[tuple[np.ndarray, ...]]:
    """`count` vector steps of 2 envs for `num_seeds` seeds: obs (S, 2, 3), actions (S, 2, 2), rewards, next obs,
    terminated, truncated, costs (S, 2)."""
    rng = np.random.default_rng(0)
    return [(rng.normal(size=(num_seeds, 2, 3)), rng.normal(size=(num_seeds, 2, 2)).astype(np.float32),
             rng.normal(size=(num_seeds, 2)), rng.normal(size=(num_seeds, 2, 3)), rng.random((num_seeds, 2)) < 0.5,
             rng.random((num_seeds, 2)) < 0.5, rng.random((num_seeds, 2))) for _ in range(count)]


def test_a_replay_add_and_an_observation_going_to_the_gpu_do_not_wait_for_it():
    single = ReplayBuffer(16, (3,), (2,), num_envs=2, device="cuda", store_cost=True)
    group = SeedReplay([ReplayBuffer(16, (3,), (2,), num_envs=2, device="cuda", store_cost=True, seed=s)
                        for s in range(3)])
    on_cpu = [ReplayBuffer(16, (3,), (2,), num_envs=2, store_cost=True, seed=s) for s in range(3)]
    recorded = steps(3, 5)
    busy = torch.randn(2048, 2048, device="cuda")
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step in recorded:
            busy = busy @ busy / 2048  # queued GPU work a synchronising copy would wait for
            single.add(*(field[0] for field in step))
            group.add(*step)
            obs = to_device(step[0], torch.device("cuda"))
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.testing.assert_close(obs.cpu(), torch.as_tensor(recorded[-1][0], dtype=torch.float32))
    for step in recorded:
        for i, buffer in enumerate(on_cpu):
            buffer.add(*(field[i] for field in step))
    for buffer, expected in zip([single, *group.buffers], [on_cpu[0], *on_cpu], strict=True):
        for name in ReplayBuffer.FIELDS:
            torch.testing.assert_close(getattr(buffer, name).cpu(), getattr(expected, name), rtol=0, atol=0)


def test_observation_and_reward_statistics_on_the_gpu_take_a_step_without_waiting_for_it():
    """What SAC's SimBa/SimbaV2 presets (and --scale-rewards) fold in at every environment step: the observation
    statistics and SimbaV2's reward scaling, of one run and of a seed group (all seeds in one merge), updated from
    host arrays without a synchronisation, to the values a CPU run keeps."""
    def made() -> list[nn.Module]:
        return [RunningObsNorm(3), stack_seeds(lambda: RunningObsNorm(3), [0, 1, 2]),
                RewardScaler(0.99, 2), stack_seeds(lambda: RewardScaler(0.99, 2), [0, 1, 2])]

    on_gpu, on_cpu = [module.to("cuda") for module in made()], made()
    recorded = steps(3, 6)
    busy = torch.randn(2048, 2048, device="cuda")
    torch.cuda.set_sync_debug_mode("error")
    try:
        for obs, _, rewards, _, terminated, truncated, _ in recorded:
            busy = busy @ busy / 2048  # queued GPU work a synchronising copy would wait for
            fold_in(on_gpu, obs, rewards, terminated | truncated)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    for obs, _, rewards, _, terminated, truncated, _ in recorded:
        fold_in(on_cpu, obs, rewards, terminated | truncated)
    for gpu_module, cpu_module in zip(on_gpu, on_cpu, strict=True):
        for (name, gpu_tensor), cpu_tensor in zip(gpu_module.state_dict().items(), cpu_module.state_dict().values(),
                                                  strict=True):
            torch.testing.assert_close(gpu_tensor.cpu(), cpu_tensor, rtol=1e-12, atol=1e-12, msg=name)


def fold_in(modules: list[nn.Module], obs: np.ndarray, rewards: np.ndarray, dones: np.ndarray) -> None:
    """One step of seed 0 into the single run's statistics, of every seed into the groups'."""
    single_obs, group_obs, single_rewards, group_rewards = modules
    single_obs.update(obs[0])
    group_obs.update(obs)
    single_rewards.update(rewards[0], dones[0])
    group_rewards.update(rewards, dones)


def test_ppo_acts_through_a_rollout_on_the_host_whatever_its_device():
    """PPO's networks on the GPU, its statistics on the host (`statistics_on_host`, as `train` leaves them): a
    rollout step (statistics folded in, numpy policy, rewards scaled) never touches the GPU."""
    space = gym.spaces.Box(-np.ones(2, np.float32), np.ones(2, np.float32))
    agent = PPO(3, space, PPOConfig(env_id="Pendulum-v1", num_envs=2, normalize_reward=True)).to("cuda")
    agent.statistics_on_host()
    assert agent.critic[0].weight.is_cuda and agent.obs_norm.mean.device.type == "cpu"
    assert agent.reward_scaler.returns.device.type == "cpu"
    policy = agent.rollout_policy()  # the networks copied to numpy, once per rollout
    torch.cuda.set_sync_debug_mode("error")
    try:
        for obs, _, rewards, _, terminated, truncated, _ in steps(1, 4):
            policy.explore(agent.observe(obs[0]))
            agent.scale_rewards(rewards[0], terminated[0] | truncated[0])
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert agent.obs_norm.count.item() == 8
