"""PPO-Lag: the cost advantage and the Lagrangian surrogate by hand, λ stepped once per rollout on the costs of
the episodes that ended in it (OmniSafe's Adam rule written out, beside torch.optim.Adam), and a task without
costs refused in one line."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from keelrl.agents import ppo_lag
from keelrl.agents.harness.options import run_cli
from keelrl.agents.lagrange import AdamMultiplier
from keelrl.agents.ppo_lag import PPOLag, PPOLagConfig
from keelrl.buffers.rollout import RolloutBuffer
from test_ppo import gae_by_hand

OBS_DIM, STEPS, ENVS = 3, 6, 2
SETTINGS = dict(hidden_sizes=(8, 8), num_envs=ENVS, num_steps=STEPS, num_minibatches=1, update_epochs=1,
                learning_rate=1e-3, ent_coef=0.0, normalize_obs=False, normalize_reward=False)


def test_cost_advantages_are_centred_and_the_surrogate_weighs_them_by_lambda():
    torch.manual_seed(0)
    agent = PPOLag(OBS_DIM, gym.spaces.Box(-1.0, 1.0, (2,)), PPOLagConfig(**SETTINGS))
    g = torch.Generator().manual_seed(1)
    rollout = RolloutBuffer(STEPS, ENVS, (OBS_DIM,), (2,), store_cost=True)
    for t in range(STEPS):
        rollout.add(obs=torch.randn(ENVS, OBS_DIM, generator=g).numpy(),
                    actions=torch.rand(ENVS, 2, generator=g).numpy(),
                    log_probs=torch.randn(ENVS, generator=g).numpy(), values=torch.randn(ENVS, generator=g).numpy(),
                    rewards=torch.randn(ENVS, generator=g).numpy(),
                    costs=(torch.rand(ENVS, generator=g) < 0.5).float().numpy(),
                    cost_values=torch.rand(ENVS, generator=g).numpy(), dones=np.array([t == 3, False]))
    next_values = {"rewards": torch.randn(ENVS, generator=g).numpy(), "costs": torch.rand(ENVS, generator=g).numpy()}
    batch = agent.batch(rollout, next_values)
    data = {name: torch.from_numpy(value).double() for name, value in rollout.data.items()}
    next_cost_values = torch.from_numpy(next_values["costs"]).double()
    cost_advantages, cost_returns = gae_by_hand(data["costs"], data["cost_values"], data["dones"], next_cost_values,
                                                0.99, 0.95)
    expected = (cost_advantages - cost_advantages.mean()).flatten()  # centred on the rollout, not scaled
    torch.testing.assert_close(batch["cost_advantages"].double(), expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(batch["cost_returns"].double(), cost_returns.flatten(), rtol=1e-5, atol=1e-6)
    agent.lagrange.value.fill_(0.5)
    reward_advantages = batch["advantages"].double()
    normalised = (reward_advantages - reward_advantages.mean()) / (reward_advantages.std() + 1e-8)
    torch.testing.assert_close(agent.surrogate_advantages(batch).double(), (normalised - 0.5 * expected) / 1.5,
                               rtol=1e-5, atol=1e-6)


def test_the_adam_multiplier_is_omnisafes_adam_step_on_minus_lambda_times_the_violation():
    multiplier = AdamMultiplier(cost_limit=25.0, lr=0.035, init=0.001)
    lam = torch.nn.Parameter(torch.tensor(0.001, dtype=torch.float64))
    optimizer = torch.optim.Adam([lam], lr=0.035)
    for episode_cost in [100.0, 80.0, 10.0, 30.0, 0.0, 0.0, 0.0, 0.0, 0.0, 200.0]:
        multiplier.update(episode_cost)
        optimizer.zero_grad()
        (-lam * (episode_cost - 25.0)).backward()
        optimizer.step()
        lam.data.clamp_(min=0.0)
        assert multiplier.value.item() == pytest.approx(lam.item(), abs=1e-6)
    assert multiplier.value.item() > 0.0 and multiplier.steps.item() == 10


def test_lambda_steps_once_per_rollout_on_the_costs_of_its_finished_episodes(tmp_path):
    """Every step costs 1 and episodes last 10 steps, so each rollout of 20 steps ends 2 episodes of cost 10:
    λ takes one Adam step per rollout on 10 − 3 (3 rollouts: 3 steps), from λ 0.001."""
    config = PPOLagConfig(env_id="keelrl_test/AlwaysCost-v0", total_timesteps=60, num_envs=1, num_steps=20,
                          num_minibatches=1, update_epochs=1, hidden_sizes=(8, 8), cost_limit=3.0, eval_freq=0,
                          eval_episodes=2, runs_dir=str(tmp_path), quiet=True)
    result = ppo_lag.train(config)
    by_hand = AdamMultiplier(3.0, 0.035, 0.001)
    for _ in range(3):
        by_hand.update(10.0)
    agent = PPOLag.load(result.run_dir / "model.pt")
    assert agent.lagrange_multiplier.item() == pytest.approx(by_hand.value.item(), abs=1e-7)
    assert agent.lagrange.steps.item() == 3
    np.testing.assert_array_equal(result.final_eval_costs, [10.0, 10.0])


def test_a_task_without_costs_is_refused_in_one_line(capsys):
    assert run_cli(ppo_lag.train, PPOLagConfig, args=["--env-id", "InvertedPendulum-v5"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and "cost" in err, err
    # envpool has no cost tasks: said as such, not as "envpool has no environment 'keelrl/...'"
    assert run_cli(ppo_lag.train, PPOLagConfig, args=["--env-backend", "envpool"]) == 2
    assert "use --env-backend gymnasium" in capsys.readouterr().err


def test_the_cost_value_loss_is_plain_squared_error_however_far_the_value_moved():
    """OmniSafe regresses V_c by mse_loss: unlike PPO's clipped value loss (which would stop a value 0.2 away from
    the rollout's), the cost value is pulled towards returns of tens at once."""
    torch.manual_seed(0)
    agent = PPOLag(OBS_DIM, gym.spaces.Box(-1.0, 1.0, (2,)), PPOLagConfig(**SETTINGS, clip_vloss=True))
    obs = torch.randn(5, OBS_DIM)
    minibatch = {"obs": obs, "actions": torch.zeros(5, 2), "log_probs": torch.zeros(5), "advantages": torch.randn(5),
                 "values": torch.zeros(5), "returns": torch.zeros(5), "cost_advantages": torch.zeros(5),
                 "cost_values": agent.cost_value(obs).detach() - 5.0, "cost_returns": torch.full((5,), 40.0)}
    _, stats = agent.loss(minibatch)
    expected = 0.5 * (agent.cost_value(obs).double() - 40.0).pow(2).mean()
    torch.testing.assert_close(stats["cost_value_loss"].double(), expected)
    stats["cost_value_loss"].backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in agent.cost_critic.parameters() if p.dim() > 1)


def test_the_cost_value_gradient_is_clipped_apart_from_the_policys():
    """OmniSafe clips each network's gradient by itself: with λ = 0 the policy and value take the same steps
    whether the episode costs are small or a thousand times larger (clipped together, the cost value's large
    gradient scaled the policy's steps down)."""
    def updated(cost_scale: float) -> PPOLag:
        torch.manual_seed(0)
        agent = PPOLag(OBS_DIM, gym.spaces.Box(-1.0, 1.0, (2,)), PPOLagConfig(**SETTINGS))
        agent.lagrange.value.fill_(0.0)
        g = torch.Generator().manual_seed(1)
        rollout = RolloutBuffer(STEPS, ENVS, (OBS_DIM,), (2,), store_cost=True)
        for t in range(STEPS):
            rollout.add(obs=torch.randn(ENVS, OBS_DIM, generator=g).numpy(),
                        actions=torch.rand(ENVS, 2, generator=g).numpy(),
                        log_probs=torch.randn(ENVS, generator=g).numpy(),
                        values=torch.randn(ENVS, generator=g).numpy(), rewards=torch.randn(ENVS, generator=g).numpy(),
                        costs=cost_scale * (torch.rand(ENVS, generator=g) < 0.5).float().numpy(),
                        cost_values=torch.zeros(ENVS).numpy(), dones=np.array([t == 3, False]))
        agent.update(rollout, {"rewards": np.zeros(ENVS), "costs": np.zeros(ENVS)})
        return agent

    small, large = updated(1.0), updated(1000.0)
    for (name, value), other in zip(small.named_parameters(), large.parameters(), strict=True):
        if name.startswith("cost_critic"):
            assert not torch.equal(value, other), name
        else:
            torch.testing.assert_close(value, other, rtol=0, atol=0, msg=name)
