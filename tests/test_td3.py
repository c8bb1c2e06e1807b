"""TD3: exploration and smoothing noise, delayed actor and target updates, losses on a fixed batch, a tiny run."""

import csv

import numpy as np
import pytest
import torch

from keelrl.agents.common import run_cli
from keelrl.agents.td3 import TD3, TD3Config, train

OBS_DIM, ACTION_DIM = 5, 2  # as the fixed_batch fixture in conftest.py


def make_agent(**overrides) -> TD3:
    torch.manual_seed(0)
    return TD3(OBS_DIM, -np.ones(ACTION_DIM), np.ones(ACTION_DIM), TD3Config(hidden_sizes=(64, 64), **overrides))


def test_exploration_noise_has_the_configured_scale():
    agent = TD3(OBS_DIM, np.array([-2.0, -2.0]), np.array([2.0, 2.0]), TD3Config(hidden_sizes=(16,)))
    with torch.no_grad():
        agent.actor.net[-2].weight.zero_()  # mean action 0, so clipping at ±2 plays no part
        agent.actor.net[-2].bias.zero_()
    obs = np.zeros((20_000, OBS_DIM))
    noisy = agent.act(obs)
    assert np.allclose(agent.act(obs, deterministic=True), 0.0)
    assert noisy.std() == pytest.approx(0.1 * 2.0, rel=0.03)  # exploration_noise × action scale


def test_actor_and_targets_update_only_every_policy_frequency(fixed_batch):
    agent = make_agent()
    actor_before = [p.clone() for p in agent.actor.parameters()]
    target_before = [p.clone() for p in agent.critic_target.parameters()]
    first = agent.update(fixed_batch)
    assert "losses/actor_loss" not in first
    assert all(torch.equal(a, b) for a, b in zip(actor_before, agent.actor.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(target_before, agent.critic_target.parameters()))
    second = agent.update(fixed_batch)
    assert second["losses/actor_loss"].dim() == 0
    assert not all(torch.equal(a, b) for a, b in zip(actor_before, agent.actor.parameters()))
    for before, target, online in zip(target_before, agent.critic_target.parameters(), agent.critic.parameters()):
        torch.testing.assert_close(target, before + 0.005 * (online - before))


def test_critic_loss_falls_on_a_fixed_batch(fixed_batch):
    agent = make_agent()
    losses = [agent._update_critic(fixed_batch)["losses/qf_loss"].item() for _ in range(300)]
    assert losses[-1] < 0.2 * losses[0]


def test_actor_ascends_the_first_critic(fixed_batch):
    agent = make_agent()
    for _ in range(100):
        agent._update_critic(fixed_batch)
    losses = [agent._update_actor(fixed_batch.obs).item() for _ in range(100)]
    assert np.mean(losses[-10:]) < np.mean(losses[:10])


def test_target_smoothing_noise_is_clipped(fixed_batch, monkeypatch):
    agent = make_agent(policy_noise=10.0, noise_clip=0.5)
    seen = {}
    target_critic_forward = agent.critic_target.forward

    def spy(obs, actions):
        seen["actions"] = actions
        return target_critic_forward(obs, actions)

    monkeypatch.setattr(agent.critic_target, "forward", spy)
    agent._update_critic(fixed_batch)
    offset = seen["actions"] - agent.actor_target(fixed_batch.next_obs)
    assert offset.abs().max() <= 0.5 + 1e-6  # noise_clip × action scale 1
    assert offset.abs().max() > 0.45  # and the clip was reached with std 10


def test_tiny_run_writes_logs_and_loads(tmp_path):
    config = TD3Config(env_id="InvertedPendulum-v5", total_timesteps=500, learning_starts=200, batch_size=32,
                       hidden_sizes=(32, 32), eval_freq=250, eval_episodes=2, checkpoint_freq=250,
                       runs_dir=str(tmp_path), quiet=True)
    result = train(config)
    rows = list(csv.DictReader((result.run_dir / "eval.csv").open()))
    assert [int(r["global_step"]) for r in rows] == [250, 500]
    loaded = TD3.load(result.run_dir / "model.pt")
    obs = np.zeros((3, 4))
    np.testing.assert_array_equal(loaded.act(obs, deterministic=True).shape, (3, 1))
    assert torch.load(result.run_dir / "checkpoint.pt", weights_only=True)["agent"]["num_updates"] == 300


def test_bad_noise_option_is_refused(tmp_path, capsys):
    assert run_cli(train, TD3Config, args=["--policy-noise", "-1", "--runs-dir", str(tmp_path)]) == 2
    assert "--policy-noise must be non-negative" in capsys.readouterr().err
