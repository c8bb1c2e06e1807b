"""TD3: exploration and smoothing noise, delayed actor and target updates, losses on a fixed batch, a tiny run."""

import csv

import numpy as np
import pytest
import torch

from keelrl.agents.harness.options import run_cli
from keelrl.agents.td3 import TD3, TD3Config, train

from helpers import assert_critic_update_then_fit

OBS_DIM, ACTION_DIM = 5, 2  # as the fixed_batch fixture in conftest.py


def make_agent(**overrides) -> TD3:
    torch.manual_seed(0)
    return TD3(OBS_DIM, -np.ones(ACTION_DIM), np.ones(ACTION_DIM), TD3Config(hidden_sizes=(64, 64), **overrides))


def test_exploration_noise_has_the_configured_scale():
    agent = TD3(OBS_DIM, np.array([-2.0, -2.0]), np.array([2.0, 2.0]), TD3Config(hidden_sizes=(16,)))
    with torch.no_grad():
        agent.actor.net[-1].weight.zero_()  # mean action 0, so clipping at ±2 plays no part
        agent.actor.net[-1].bias.zero_()
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
    batch = fixed_batch
    # the first loss by hand: ã' = clip(μ'(s') + clip(0.2 ε, ±0.5), ±1) with ε the step's one normal draw
    # (same seed), y = r + 0.99 (1 − d) min_k Q'_k(s', ã'); logged: the critics' mean of their MSEs
    torch.manual_seed(21)
    noise = (0.2 * torch.randn(256, ACTION_DIM)).clamp(-0.5, 0.5)
    with torch.no_grad():
        next_actions = (agent.actor_target(batch.next_obs) + noise).clamp(-1.0, 1.0)
        next_q = agent.critic_target(batch.next_obs, next_actions).squeeze(-1).double()
        y = batch.rewards.double() + 0.99 * (1 - batch.terminated.double()) * next_q.min(dim=0).values
        q = agent.critic(batch.obs, batch.actions).squeeze(-1).double()
    assert (noise.abs() == 0.5).any()  # the clip is part of the check
    assert_critic_update_then_fit(agent, batch, 21, q, y)


def test_actor_ascends_the_first_critic(fixed_batch):
    agent = make_agent()
    for _ in range(100):
        agent.update_critic(fixed_batch)
    with torch.no_grad():  # −mean Q1(s, μ(s)), the first critic only
        q_all = agent.critic(fixed_batch.obs, agent.actor(fixed_batch.obs)).squeeze(-1).double()
    critic_before = [p.clone() for p in agent.critic.parameters()]
    first = agent.update_actor(fixed_batch.obs)["losses/actor_loss"].item()
    assert first == pytest.approx(-q_all[0].mean().item(), rel=1e-5)
    assert first != pytest.approx(-q_all.min(dim=0).values.mean().item(), rel=1e-3)  # not the twin minimum
    assert all(torch.equal(a, b) for a, b in zip(critic_before, agent.critic.parameters()))  # the critic stays
    losses = [first] + [agent.update_actor(fixed_batch.obs)["losses/actor_loss"].item() for _ in range(99)]
    assert np.mean(losses[-10:]) < np.mean(losses[:10])


def test_target_smoothing_noise_is_clipped(fixed_batch, monkeypatch):
    agent = make_agent(policy_noise=10.0, noise_clip=0.5)
    seen = {}
    target_critic_forward = agent.critic_target.forward

    def spy(obs, actions):
        seen["actions"] = actions
        return target_critic_forward(obs, actions)

    monkeypatch.setattr(agent.critic_target, "forward", spy)
    agent.update_critic(fixed_batch)
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
    # the evaluation rows: mean and population std of that evaluation's returns; the last one is the final
    assert float(rows[-1]["mean_return"]) == pytest.approx(result.final_eval_returns.mean(), rel=1e-12)
    assert float(rows[-1]["std_return"]) == pytest.approx(result.final_eval_returns.std(), abs=1e-12)
    assert [int(r["episodes"]) for r in rows] == [2, 2]
    # episodes.csv: InvertedPendulum-v5 pays 1 per step, 0 on the terminating one; one env ends episodes at
    # the running sum of their lengths
    episodes = list(csv.DictReader((result.run_dir / "episodes.csv").open()))
    lengths = [int(r["length"]) for r in episodes]
    assert len(episodes) > 5 and [float(r["return"]) for r in episodes] == [n - 1.0 for n in lengths]
    assert [int(r["global_step"]) for r in episodes] == np.cumsum(lengths).tolist()
    loaded = TD3.load(result.run_dir / "model.pt")
    obs = np.random.default_rng(0).normal(size=(3, 4))
    actions = loaded.act(obs, deterministic=True)
    assert actions.shape == (3, 1)
    # the saved actor by hand from model.pt's tensors: 3 tanh(W3 relu(W2 relu(W1 s + b1) + b2) + b3), the
    # action space of InvertedPendulum-v5 being [−3, 3]
    saved = torch.load(result.run_dir / "model.pt", weights_only=True)["networks"]
    h = torch.as_tensor(obs)
    for i in (0, 2, 4):
        h = h @ saved[f"actor.net.{i}.weight"].double().T + saved[f"actor.net.{i}.bias"].double()
        h = h.clamp_min(0.0) if i < 4 else torch.tanh(h)
    np.testing.assert_allclose(actions, 3.0 * h.numpy(), rtol=1e-5, atol=1e-6)
    assert torch.load(result.run_dir / "checkpoint.pt", weights_only=True)["agent"]["num_updates"] == 300


def test_bad_noise_option_is_refused(tmp_path, capsys):
    assert run_cli(train, TD3Config, args=["--policy-noise", "-1", "--runs-dir", str(tmp_path)]) == 2
    assert "--policy-noise must be non-negative" in capsys.readouterr().err
