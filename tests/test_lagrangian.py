"""Lagrangian agents: the multipliers (gradient and PID), the cost critic, the rescaled actor loss,
and short SAC-Lag / TD3-Lag runs that store costs and move λ."""

import csv

import gymnasium as gym
import numpy as np
import pytest
import torch

from keelrl.agents import sac, sac_lag, td3_lag
from keelrl.agents.lagrange import GradientMultiplier, LagrangeOptions, PIDMultiplier, build_multiplier
from keelrl.agents.lagrange import lagrangian_actor_loss
from keelrl.agents.sac_lag import SACLag, SACLagConfig
from keelrl.agents.td3_lag import TD3Lag, TD3LagConfig
from keelrl.envs import CostWrapper
from keelrl.networks.seeds import stack_seeds

from helpers import CountingEnv, first_action

OBS_DIM, ACTION_DIM = 5, 2  # as the fixed_batch fixture in conftest.py


def track_env() -> gym.Env:
    """20 steps along a track: the action is the speed and the reward; obs = the fraction of time left.
    With the cost speed > 0.5, going flat out earns 20 at a cost of 20; a limit of 5 forces it slower."""
    env = CountingEnv(1, length=20, observe=lambda t: 1 - t / 20, reward=first_action, low=0.0)
    return CostWrapper(env, lambda a, o, i: float(a[0] > 0.5))


def ragged_env() -> gym.Env:
    """Episodes of 3 to 5 steps (drawn at reset), so that with two envs episodes end alone or together;
    the cost (through CostWrapper) is 1 for a positive action."""
    env = CountingEnv(2, length=lambda rng: rng.integers(3, 6), observe=lambda t: t / 5, reward=first_action)
    return CostWrapper(env, lambda a, o, i: float(a[0] > 0))


gym.register("keelrl_test/Track-v0", entry_point=track_env)
gym.register("keelrl_test/RaggedCost-v0", entry_point=ragged_env)


@pytest.fixture
def cost_batch(fixed_batch):
    """The fixed batch with a cost of 1 where the second observation entry is positive."""
    return fixed_batch._replace(costs=(fixed_batch.obs[:, 1] > 0).float())


def make_sac_lag(**overrides) -> SACLag:
    torch.manual_seed(0)
    config = SACLagConfig(hidden_sizes=(64, 64), **overrides)
    return SACLag(OBS_DIM, -np.ones(ACTION_DIM), np.ones(ACTION_DIM), config)


def test_gradient_multiplier_rises_above_the_limit_falls_below_and_stays_non_negative():
    lam = GradientMultiplier(cost_limit=25.0, lr=0.01, init=0.5)
    lam.update(75.0)  # 0.5 + 0.01 × 50
    assert lam.value.item() == pytest.approx(1.0)
    lam.update(15.0)  # 1.0 − 0.01 × 10
    assert lam.value.item() == pytest.approx(0.9)
    lam.update(0.0)  # 0.9 − 0.25
    assert lam.value.item() == pytest.approx(0.65)
    for _ in range(10):
        lam.update(0.0)
    assert lam.value.item() == 0.0  # projected onto λ >= 0
    zero_limit = GradientMultiplier(cost_limit=0.0, lr=0.01, init=0.0)
    zero_limit.update(0.0)
    assert zero_limit.value.item() == 0.0  # a zero limit is met by a zero cost
    zero_limit.update(3.0)
    assert zero_limit.value.item() == pytest.approx(0.03)


def test_pid_multiplier_terms_by_hand():
    pid = PIDMultiplier(cost_limit=25.0, kp=0.1, ki=0.01, kd=0.05, init=0.0)
    pid.update(45.0)  # e 20: I 0.2; λ = 2 + 0.2 (no previous cost: no derivative)
    assert pid.value.item() == pytest.approx(2.2) and pid.integral.item() == pytest.approx(0.2)
    pid.update(65.0)  # e 40: I 0.6; rise 20: λ = 4 + 0.6 + 1
    assert pid.value.item() == pytest.approx(5.6)
    pid.update(35.0)  # e 10: I 0.7; falling cost: no derivative; λ = 1 + 0.7
    assert pid.value.item() == pytest.approx(1.7)
    pid.update(0.0)  # e −25: I 0.45; λ = max(0, −2.5 + 0.45) = 0
    assert pid.value.item() == 0.0 and pid.integral.item() == pytest.approx(0.45)
    for _ in range(30):
        pid.update(0.0)
    assert pid.integral.item() == 0.0  # the integral is clamped at 0 too


def test_pid_with_only_an_integral_term_is_the_gradient_multiplier():
    pid = PIDMultiplier(cost_limit=25.0, kp=0.0, ki=0.002, kd=0.0, init=0.3)
    gradient = GradientMultiplier(cost_limit=25.0, lr=0.002, init=0.3)
    for cost in [100.0, 60.0, 0.0, 10.0, 300.0, 0.0]:
        pid.update(cost)
        gradient.update(cost)
        assert pid.value.item() == pytest.approx(gradient.value.item())


def test_warmup_and_episode_costs_reach_the_multiplier():
    agent = make_sac_lag(lambda_lr=0.01, lambda_warmup=1000)
    agent.lagrange.observe(np.array([125.0]), global_step=1000)
    assert agent.lagrange_multiplier.item() == 0.0  # still warming up
    agent.lagrange.observe(np.array([125.0, 25.0]), global_step=1001)  # mean 75: 0.01 × 50
    assert agent.lagrange_multiplier.item() == pytest.approx(0.5)
    assert make_sac_lag(multiplier="pid").lagrange.__class__ is PIDMultiplier


@pytest.mark.parametrize("multiplier", ["gradient", "pid", "adam"])
def test_a_seed_groups_multipliers_each_step_on_their_own_seeds_episodes(multiplier):
    """Stacked for --num-seeds: each seed's λ (and PID integral, previous cost, Adam moments and step count) moves
    as a single multiplier given that seed's batches of episode costs, and not at all at a step where none of its
    episodes ended."""
    options = LagrangeOptions(multiplier=multiplier, cost_limit=5.0, lambda_lr=0.1, lambda_warmup=10)
    rng = np.random.default_rng(0)
    # per step, each of 2 seeds: the costs of its episodes that ended (often none)
    steps = [[rng.uniform(0, 12, rng.integers(0, 3)) for _ in range(2)] for _ in range(40)]
    group = stack_seeds(lambda: build_multiplier(options), [1, 2])
    singles = [build_multiplier(options) for _ in range(2)]
    for step, costs in enumerate(steps):
        group.observe(costs, global_step=step)
        for single, seed_costs in zip(singles, costs):
            if len(seed_costs):
                single.observe(seed_costs, global_step=step)
    for k, single in enumerate(singles):
        for name, tensor in single.state_dict().items():
            torch.testing.assert_close(group.state_dict()[name][k], tensor, msg=name)
    assert group.value[0] != group.value[1] and group.value.max() > 0


def test_lagrangian_actor_loss_is_rescaled_by_one_plus_lambda():
    reward_loss = torch.tensor([1.0, -2.0, 4.0])
    cost_q = torch.tensor([0.5, 3.0, 0.0])
    lam = torch.tensor(3.0)
    expected = ((1.0 + 1.5) + (-2.0 + 9.0) + (4.0 + 0.0)) / 3 / 4
    assert lagrangian_actor_loss(reward_loss, cost_q, lam).item() == pytest.approx(expected)
    assert lagrangian_actor_loss(reward_loss, cost_q, torch.tensor(0.0)).item() == pytest.approx(1.0)


def test_sac_lag_actor_loss_equals_a_hand_computation(cost_batch):
    agent = make_sac_lag(autotune=False, alpha=0.1)
    agent.lagrange.value.fill_(2.0)
    obs = cost_batch.obs
    torch.manual_seed(7)
    with torch.no_grad():
        actions, log_prob = agent.actor.sample(obs)
        q_min = agent.critic(obs, actions).squeeze(-1).min(dim=0).values
        cost_q = agent.cost.critic(obs, actions).squeeze(-1).mean(dim=0)
    expected = (0.1 * log_prob - q_min + 2.0 * cost_q).mean() / 3.0
    torch.manual_seed(7)
    loss = agent.update_actor_and_alpha(obs)["losses/actor_loss"]
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)


def test_td3_lag_actor_loss_equals_a_hand_computation(cost_batch):
    torch.manual_seed(0)
    agent = TD3Lag(OBS_DIM, -np.ones(ACTION_DIM), np.ones(ACTION_DIM), TD3LagConfig(hidden_sizes=(64, 64)))
    agent.lagrange.value.fill_(0.5)
    obs = cost_batch.obs
    with torch.no_grad():
        actions = agent.actor(obs)
        q1 = agent.critic(obs, actions)[0].squeeze(-1)
        cost_q = agent.cost.critic(obs, actions).squeeze(-1).mean(dim=0)
    expected = (-q1 + 0.5 * cost_q).mean() / 1.5
    assert agent.update_actor(obs)["losses/actor_loss"].item() == pytest.approx(expected.item(), rel=1e-5)


@pytest.mark.parametrize("agent_cls, config_cls", [(SACLag, SACLagConfig), (TD3Lag, TD3LagConfig)])
def test_cost_critic_loss_falls_on_a_fixed_batch(agent_cls, config_cls, cost_batch):
    torch.manual_seed(0)
    agent = agent_cls(OBS_DIM, -np.ones(ACTION_DIM), np.ones(ACTION_DIM), config_cls(hidden_sizes=(64, 64)))
    # the first cost loss by hand: y = c + 0.99 (1 − d) mean_k Q_c,target,k(s', a'), a' the agent's target
    # action for s' (SAC: a draw of π(·|s'); TD3: the smoothed target action), drawn second in the update
    # (after the reward critic's own) and reproduced here from the same seed; logged: the critics' mean MSE
    batch = cost_batch
    torch.manual_seed(9)
    with torch.no_grad():
        if agent_cls is SACLag:
            agent.actor.sample(batch.next_obs)
            next_actions, _ = agent.actor.sample(batch.next_obs)
        else:
            agent.smoothed_target_actions(batch.next_obs)
            next_actions = agent.smoothed_target_actions(batch.next_obs)
        next_cost = agent.cost.target(batch.next_obs, next_actions).squeeze(-1).double().mean(0)
        y = batch.costs.double() + 0.99 * (1 - batch.terminated.double()) * next_cost
        cost_q = agent.cost.critic(batch.obs, batch.actions).squeeze(-1).double()  # (2, B)
    torch.manual_seed(9)
    first = agent.update(cost_batch)
    assert {"losses/cost_qf_loss", "losses/cost_qf_values", "losses/lagrange_multiplier", "losses/qf_loss"} <= set(first)
    assert first["losses/cost_qf_loss"].item() == pytest.approx(((cost_q - y) ** 2).mean(1).mean().item(), rel=1e-5)
    assert first["losses/cost_qf_values"].item() == pytest.approx(cost_q.mean().item(), rel=1e-5, abs=1e-7)
    assert first["losses/lagrange_multiplier"].item() == 0.0  # no episode has ended: λ is still λ_init
    losses = [agent.update(cost_batch)["losses/cost_qf_loss"].item() for _ in range(200)]
    assert losses[-1] < 0.3 * first["losses/cost_qf_loss"].item()
    target_moved = any(not torch.equal(a, b) for a, b in zip(agent.cost.target.parameters(),
                                                               agent.cost.critic.parameters()))
    assert target_moved  # the target follows by Polyak averaging, not by copying
    # one more cost step by hand: θ_c' ← θ_c' + 0.005 (θ_c − θ_c'), θ_c right after the step
    target_before = [p.detach().double().clone() for p in agent.cost.target.parameters()]
    agent.cost.step(*agent.cost.loss(cost_batch, next_actions))
    for before, target, online in zip(target_before, agent.cost.target.parameters(),
                                      agent.cost.critic.parameters()):
        torch.testing.assert_close(target.double(), before + 0.005 * (online.detach().double() - before),
                                   rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("module, agent_cls, config_cls",
                         [(sac_lag, SACLag, SACLagConfig), (td3_lag, TD3Lag, TD3LagConfig)])
def test_short_run_stores_costs_and_moves_lambda(module, agent_cls, config_cls, tmp_path, capsys):
    config = config_cls(env_id="keelrl_test/AlwaysCost-v0", total_timesteps=300, learning_starts=100, batch_size=16,
                        hidden_sizes=(16, 16), eval_freq=0, eval_episodes=2, cost_limit=4.0, lambda_lr=0.01,
                        runs_dir=str(tmp_path), quiet=True)
    result = module.train(config)
    np.testing.assert_array_equal(result.final_eval_costs, [10.0, 10.0])
    assert "final evaluation cost over 2 episodes: 10.0 ± 0.0 (cost limit 4: NOT met)" in capsys.readouterr().out
    with open(result.run_dir / "episodes.csv") as f:
        assert [float(row["cost"]) for row in csv.DictReader(f)] == [10.0] * 30
    agent = agent_cls.load(result.run_dir / "model.pt")
    assert agent.lagrange_multiplier.item() == pytest.approx(30 * 0.01 * (10.0 - 4.0))  # saved with the model
    buffer = torch.load(result.run_dir / "buffer.pt", weights_only=True)
    assert torch.equal(buffer["costs"], torch.ones(300))


@pytest.mark.parametrize("multiplier", ["gradient", "pid"])
def test_lambda_steps_once_per_batch_of_finished_episodes_and_never_on_other_updates(multiplier, tmp_path,
                                                                                     monkeypatch):
    """The documented schedule (agents/lagrange.py): λ changes only where training episodes end, once per
    vector-env step at which any ended, on the mean cost of those episodes; never on a gradient update;
    and not for batches ending at global_step <= lambda_warmup. Checked against episodes.csv by hand."""
    events = []  # ("update", λ before, λ after) and ("episodes", global_step, costs, λ before, λ after)

    class RecordingSACLag(SACLag):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            observe = self.lagrange.observe

            def recording_observe(episode_costs, global_step):  # called at every step: a batch where any ended
                before = self.lagrange_multiplier.item()
                observe(episode_costs, global_step)
                if len(episode_costs):
                    events.append(("episodes", global_step, list(episode_costs), before,
                                   self.lagrange_multiplier.item()))

            self.lagrange.observe = recording_observe

        def update(self, batch):
            before = self.lagrange_multiplier.item()
            losses = super().update(batch)
            events.append(("update", before, self.lagrange_multiplier.item()))
            return losses

    lr, limit, warmup, init = 0.01, 1.5, 30, 0.2
    kp, ki, kd = 0.1, 0.02, 0.05
    config = SACLagConfig(env_id="keelrl_test/RaggedCost-v0", num_envs=2, total_timesteps=160, learning_starts=60,
                          batch_size=16, hidden_sizes=(16, 16), eval_freq=0, eval_episodes=1, cost_limit=limit,
                          multiplier=multiplier, lambda_lr=lr, lambda_init=init, lambda_warmup=warmup,
                          pid_kp=kp, pid_ki=ki, pid_kd=kd, runs_dir=str(tmp_path), quiet=True)
    monkeypatch.setattr(sac_lag, "SACLag", RecordingSACLag)  # the agent sac_lag.train builds
    result = sac_lag.train(config)

    # the batches, by hand from episodes.csv: the episodes that ended at the same global step
    with open(result.run_dir / "episodes.csv") as f:
        rows = [(int(row["global_step"]), float(row["cost"])) for row in csv.DictReader(f)]
    batches = {}
    for step, cost in rows:
        batches.setdefault(step, []).append(cost)
    sizes = [len(costs) for costs in batches.values()]
    assert 1 in sizes and 2 in sizes  # episodes ended alone and together
    lam, integral, previous, expected = init, init, None, []
    for step, costs in batches.items():
        if step > warmup:
            error = sum(costs) / len(costs) - limit
            if multiplier == "gradient":
                lam = max(0.0, lam + lr * error)
            else:
                integral = max(0.0, integral + ki * error)
                rise = 0.0 if previous is None else max(0.0, sum(costs) / len(costs) - previous)
                lam = max(0.0, kp * error + integral + kd * rise)
                previous = sum(costs) / len(costs)
        expected.append(lam)

    batch_events = [e for e in events if e[0] == "episodes"]
    assert [(step, costs) for _, step, costs, _, _ in batch_events] == list(batches.items())
    np.testing.assert_allclose([after for *_, after in batch_events], expected, rtol=2e-6)  # λ is float32, stepped ~20 times
    assert all(after == before for _, step, _, before, after in batch_events if step <= warmup)
    assert any(step <= warmup for step in batches) and any(warmup < step <= 60 for step in batches)
    assert len({round(value, 7) for value in expected}) > 5  # λ did move, many times
    # λ never moves on a gradient update, and holds from one batch to the next across all updates
    updates = [e for e in events if e[0] == "update"]
    assert len(updates) == (160 - 60) // 2 * 2  # each vector step past learning_starts: num_envs × utd updates
    assert len(updates) > len(batch_events)
    assert all(before == after for _, before, after in updates)
    lam_now = events[0][-2]  # λ before anything happened: lambda_init, in float32
    assert lam_now == pytest.approx(init)
    for event in events:
        if event[0] == "episodes":
            assert event[3] == lam_now
            lam_now = event[4]
        else:
            assert event[1] == lam_now
    assert SACLag.load(result.run_dir / "model.pt").lagrange_multiplier.item() == pytest.approx(expected[-1], rel=1e-5)


def test_sac_lag_keeps_the_cost_under_the_limit_where_sac_does_not(tmp_path):
    """A learning check in seconds: on the track, SAC runs flat out (cost 20 per episode); SAC-Lag's λ
    rises while its episodes cost more than 5, and its final deterministic policy stays under 5."""
    common = dict(env_id="keelrl_test/Track-v0", learning_starts=200, batch_size=64, hidden_sizes=(32, 32),
                  eval_freq=0, eval_episodes=5, runs_dir=str(tmp_path), quiet=True)
    constrained = sac_lag.train(SACLagConfig(**common, total_timesteps=2000, cost_limit=5.0, lambda_lr=0.01))
    with open(constrained.run_dir / "episodes.csv") as f:
        train_costs = [float(row["cost"]) for row in csv.DictReader(f)]
    assert max(train_costs) > 5.0  # the constraint was active: some training episodes broke it
    assert constrained.final_eval_costs.mean() <= 5.0
    assert constrained.final_eval_return > 2.5  # it still moves forward (standing still earns 0)
    unconstrained = sac.train(sac.SACConfig(**common, total_timesteps=1500))
    assert unconstrained.final_eval_costs.mean() == 20.0 and unconstrained.final_eval_return > 12.0


@pytest.mark.parametrize("train, config_cls", [(sac_lag.train, SACLagConfig), (td3_lag.train, TD3LagConfig)])
def test_a_pid_run_checkpoints_before_its_first_episode_ends(train, config_cls, tmp_path):
    """HalfCheetah's first episode ends at step 1000: a checkpoint at 100 comes before the PID multiplier has seen
    any cost (its 'no previous cost yet' was a NaN, which the checkpoint took for diverged weights: exit 2)."""
    result = train(config_cls(env_id="keelrl/SafeHalfCheetahVelocity-v1", multiplier="pid", total_timesteps=200,
                              learning_starts=100, batch_size=16, hidden_sizes=(16, 16), checkpoint_freq=100,
                              eval_freq=0, eval_episodes=1, quiet=True, runs_dir=str(tmp_path)))
    saved = torch.load(result.run_dir / "checkpoint.pt", weights_only=True)
    assert saved["global_step"] == 200
    assert saved["agent"]["networks"]["lagrange.calls"].item() == 0  # no episode has ended
