"""CQL, IQL and RIQL: update rules on a fixed batch, save/load, the offline loop end to end with
corruption, resume, and clear errors for bad input."""

import json
import math

import numpy as np
import pytest
import torch

from keelrl.agents.harness.options import run_cli
from keelrl.agents.cql import CQL, CQLConfig
from keelrl.agents.cql import train as train_cql
from keelrl.agents.iql import IQL, IQLConfig, load_attacker
from keelrl.agents.iql import train as train_iql
from keelrl.agents.riql import RIQL, RIQLConfig
from keelrl.agents.riql import train as train_riql
from keelrl.benchmarks.make_datasets import collect
from keelrl.buffers.offline import DatasetBuffer

OBS_DIM, ACTION_DIM = 5, 2  # as the fixed_batch fixture in conftest.py
AGENTS = {"cql": (CQL, CQLConfig), "iql": (IQL, IQLConfig), "riql": (RIQL, RIQLConfig)}


def make_agent(algo: str, **overrides):
    torch.manual_seed(0)
    agent_cls, config_cls = AGENTS[algo]
    config = config_cls(hidden_sizes=(64, 64), **overrides)
    return agent_cls(OBS_DIM, -np.ones(ACTION_DIM), np.ones(ACTION_DIM), config)


def iql_first_losses_by_hand(agent, batch) -> dict[str, float]:
    """IQL's (and RIQL's) losses of one update from the networks as they are, in float64:
    V: expectile τ of A = Q̂(s, a) − V(s), Q̂ the target critics' min (IQL) or 0.25-quantile (RIQL);
    Q: MSE (IQL) or Huber with β = 1 (RIQL) against r + γ(1 − d) V(s'), V before its step;
    actor: mean of min(exp(3 A), 100) × (−log N(a; μ(s), 1) (IQL) or ‖μ(s) − a‖² (RIQL))."""
    riql = isinstance(agent, RIQL)
    with torch.no_grad():
        q_target = agent.critic_target(batch.obs, batch.actions)[..., 0].double().numpy()  # (E, B)
        q = agent.critic(batch.obs, batch.actions)[..., 0].double().numpy()
        v, next_v = (agent.value(x)[:, 0].double().numpy() for x in (batch.obs, batch.next_obs))
        mean = (agent.actor if riql else agent.actor.mean_net)(batch.obs).double().numpy()
    target_q = np.quantile(q_target, 0.25, axis=0) if riql else q_target.min(0)
    advantage = target_q - v
    value_loss = (np.abs(0.7 - (advantage < 0)) * advantage**2).mean()
    y = batch.rewards.double().numpy() + 0.99 * (1 - batch.terminated.double().numpy()) * next_v
    error = np.abs(q - y)
    q_loss = (np.where(error < 1.0, 0.5 * error**2, error - 0.5) if riql else error**2).mean()
    actions = batch.actions.double().numpy()
    regression = (((mean - actions) ** 2).sum(-1) if riql
                  else (0.5 * (actions - mean) ** 2 + 0.5 * math.log(2 * math.pi)).sum(-1))  # log σ = 0 at init
    actor_loss = (np.minimum(np.exp(3.0 * advantage), 100.0) * regression).mean()
    return {"losses/vf_loss": value_loss, "losses/qf_loss": q_loss, "losses/actor_loss": actor_loss,
            "losses/qf_values": q.mean(), "losses/advantage": advantage.mean()}


def cql_first_losses_by_hand(agent, batch, seed: int) -> dict[str, float]:
    """CQL's losses of one update, in float64, with the update's random draws reproduced from `seed` in the
    order the update makes them: a ~ π(·|s) for the actor loss, a' ~ π(·|s') for the target, then the
    proposals: N uniform actions, N from π(·|s), N from π(·|s') per state.
    actor: mean(α log π(a|s) − min_k Q_k(s, a)); TD: critics' mean of MSE against r + γ(1 − d) min_k Q'_k(s', a');
    gap: critics' mean of mean_b [log Σ_j exp(Q(s, a_j) − log p(a_j)) − Q(s, a_data)] (importance sampled)."""
    n, size = agent.config.cql_n_actions, batch.obs.shape[0]
    actor, critic = agent.actor, agent.critic
    with torch.no_grad():
        torch.manual_seed(seed)
        actions, log_prob = actor.sample(batch.obs)
        q_pi = critic(batch.obs, actions)[..., 0].double().numpy().min(0)
        next_actions, _ = actor.sample(batch.next_obs)
        next_q = agent.critic_target(batch.next_obs, next_actions)[..., 0].double().numpy().min(0)
        uniform = torch.rand(n * size, 2) * 2 - 1
        current, current_log_prob = actor.sample(batch.obs.repeat(n, 1))
        following, following_log_prob = actor.sample(batch.next_obs.repeat(n, 1))
        q_data = critic(batch.obs, batch.actions)[..., 0].double().numpy()  # (E, B)
        proposals = torch.cat([uniform, current, following])
        q_proposals = critic(batch.obs.repeat(3 * n, 1), proposals)[..., 0].double().numpy().reshape(2, 3 * n, size)
    log_density = np.concatenate([np.full((n, size), -math.log(4.0)),  # uniform on [−1, 1]²
                                  current_log_prob.double().numpy().reshape(n, size),
                                  following_log_prob.double().numpy().reshape(n, size)])
    corrected = q_proposals - log_density
    peak = corrected.max(1, keepdims=True)
    soft_max = peak[:, 0] + np.log(np.exp(corrected - peak).sum(1))  # (E, B), temperature 1
    y = batch.rewards.double().numpy() + 0.99 * (1 - batch.terminated.double().numpy()) * next_q
    return {"losses/actor_loss": (1.0 * log_prob.double().numpy() - q_pi).mean(),
            "losses/qf_loss": ((q_data - y) ** 2).mean(1).mean(),
            "losses/cql_gap": (soft_max - q_data).mean(1).mean(),
            "losses/qf_values": q_data.mean(),
            "losses/alpha_loss": -(0.0 * (log_prob.double().numpy() - 2.0)).mean()}  # log α = log 1 = 0


@pytest.mark.parametrize("algo", ["cql", "iql", "riql"])
def test_update_runs_and_critic_loss_falls_on_a_fixed_batch(algo, fixed_batch):
    options = {"cql_n_actions": 4} if algo == "cql" else {}
    agent = make_agent(algo, normalize_obs=False, **options)
    target_before = [p.clone() for p in agent.critic_target.parameters()]
    if algo == "cql":
        assert (agent.config.cql_alpha, agent.config.cql_temp, agent.config.backup_entropy) == (10.0, 1.0, False)
        assert agent.config.cql_importance_sample and agent.alpha.item() == 1.0
        expected = cql_first_losses_by_hand(agent, fixed_batch, seed=5)
        torch.manual_seed(5)
    else:
        assert (agent.config.expectile, agent.config.beta, agent.config.exp_adv_max) == (0.7, 3.0, 100.0)
        expected = iql_first_losses_by_hand(agent, fixed_batch)
    losses = [agent.update(fixed_batch)]
    for name, value in expected.items():  # float32 network passes against float64 sums: 1e-5
        assert losses[0][name].item() == pytest.approx(value, rel=1e-5, abs=1e-6), name
    losses += [agent.update(fixed_batch) for _ in range(149)]
    expected = {"losses/qf_loss", "losses/actor_loss", "losses/qf_values"}
    assert expected <= set(losses[0]) and all(v.dim() == 0 and torch.isfinite(v) for v in losses[-1].values())
    assert agent.num_updates == 150
    qf = [step["losses/qf_loss"].item() for step in losses]
    assert np.mean(qf[-10:]) < 0.3 * np.mean(qf[:10])
    assert all(not torch.equal(a, b) for a, b in zip(target_before, agent.critic_target.parameters()))


def test_riql_defaults_and_quantile_target():
    agent = make_agent("riql")
    assert agent.critic.num_critics == 5 and agent.config.q_loss == "huber" and agent.config.deterministic_actor
    q_all = torch.arange(10.0).view(5, 2)  # 5 critics, 2 transitions: values 0 2 4 6 8 and 1 3 5 7 9
    # the 0.25-quantile, linearly interpolated: position 0.25 · (5 − 1) = 1, the second smallest
    torch.testing.assert_close(agent.value_target(q_all), torch.tensor([2.0, 3.0]), rtol=0, atol=0)
    torch.testing.assert_close(agent.value_target(q_all.flip(0)), torch.tensor([2.0, 3.0]), rtol=0, atol=0)
    # between order statistics: (0.3 · 4 = 1.2) of 0 10 20 30 40 is 10 + 0.2 · 10 = 12
    spread = torch.tensor([[40.0], [0.0], [30.0], [10.0], [20.0]])
    quantile_03 = make_agent("riql", quantile=0.3).value_target(spread)
    torch.testing.assert_close(quantile_03, torch.tensor([12.0]), rtol=1e-6, atol=0)
    iql_target = make_agent("riql", q_target="min").value_target  # IQL's: the minimum
    torch.testing.assert_close(iql_target(q_all[:2]), q_all[0])
    torch.testing.assert_close(iql_target(q_all[:2].flip(0)), torch.tensor([0.0, 1.0]))


def test_riql_schedule_runs_over_its_3m_updates_and_critics_start_as_edac():
    """RIQL's repository: 3000 epochs × 1000 updates with the actor's cosine over all of them, and EDAC's
    critic initialisation (biases 0.1, output layer U(±3e-3), hidden weights U(±1/√out_features))."""
    agent = make_agent("riql", normalize_obs=False)
    assert agent.config.total_updates == 3_000_000
    layers = agent.critic.net.layers
    for layer in layers:
        assert torch.all(layer.bias == 0.1) if layer is not layers[-1] else layer.bias.abs().max() <= 3e-3
    assert layers[-1].weight.abs().max() <= 3e-3 and layers[-1].weight.abs().max() > 1e-3
    first = layers[0].weight  # (E, OBS_DIM + ACTION_DIM, 64): bound 1/√64, not nn.Linear's 1/√7
    assert first.abs().max() <= 1 / 8 and first.abs().max() > 0.1
    torch.testing.assert_close(agent.critic_target.net.layers[0].bias, layers[0].bias)
    assert not torch.all(make_agent("iql").critic.net.layers[0].bias == 0.1)  # IQL keeps nn.Linear's initialisation


def test_riql_actor_learning_rate_is_halfway_down_its_cosine_at_1_5m_updates(fixed_batch):
    agent = make_agent("riql", normalize_obs=False)
    agent.num_updates = 1_500_000
    agent.update(fixed_batch)
    assert agent.optimizers["actor"].param_groups[0]["lr"] == pytest.approx(3e-4 * 0.5, rel=1e-6)


def test_cql_actor_is_corls_tanh_gaussian_policy():
    """CORL's TanhGaussianPolicy: log-std = m·raw + c (m = 1, c = −1 learnable), clamped into [−20, 2];
    output layer Xavier-uniform with gain 0.01 and zero bias; log-density of the tanh-squashed Gaussian."""
    agent = make_agent("cql", normalize_obs=False)
    actor = agent.actor
    output = actor.net[-1]
    fan_in, fan_out = output.weight.shape[1], output.weight.shape[0]
    assert output.weight.abs().max() <= 1e-2 * np.sqrt(6 / (fan_in + fan_out)) and torch.all(output.bias == 0)
    obs = torch.randn(64, OBS_DIM, generator=torch.Generator().manual_seed(0))
    mean, log_std = actor(obs)
    torch.testing.assert_close(log_std, torch.full_like(log_std, -1.0), atol=0.05, rtol=0)  # a new policy: std ≈ e^−1
    with torch.no_grad():  # log-std = 1 · raw − 1, raw the second half of the network's output
        raw = actor.net(obs)[:, ACTION_DIM:]
    torch.testing.assert_close(log_std, raw - 1.0, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(mean, actor.net(obs)[:, :ACTION_DIM], rtol=0, atol=0)
    with torch.no_grad():
        actor.log_std_multiplier.fill_(100.0)
    assert actor(obs)[1].min() >= -20.0 and actor(obs)[1].max() <= 2.0
    assert {"log_std_multiplier", "log_std_offset"} <= {name for name, _ in actor.named_parameters()}
    # the log-density against torch's own tanh-transformed Normal
    with torch.no_grad():
        actor.log_std_multiplier.fill_(1.0)
    torch.manual_seed(3)
    actions, log_prob = actor.sample(obs)
    mean, log_std = actor(obs)
    dist = torch.distributions.TransformedDistribution(torch.distributions.Normal(mean, log_std.exp()),
                                                       torch.distributions.transforms.TanhTransform())
    # torch inverts the float32 actions by atanh, which amplifies their rounding by 1/(1 − a²): 1e-5
    assert actions.abs().max() < 0.99
    torch.testing.assert_close(log_prob, dist.log_prob(actions.clamp(-1 + 1e-6, 1 - 1e-6)).sum(-1), atol=1e-5, rtol=1e-5)
    # and from the definition in float64, with the sample's one normal draw ε reproduced by the seed:
    # u = μ + σε, a = tanh(u), log π = Σ log N(ε) − log σ − log(1 − tanh²u)
    torch.manual_seed(3)
    noise = torch.randn(64, ACTION_DIM).double()
    mu, log_sigma = mean.detach().double(), log_std.detach().double()
    u = mu + log_sigma.exp() * noise
    torch.testing.assert_close(actions.detach().double(), torch.tanh(u), rtol=1e-6, atol=1e-7)
    by_hand = (-0.5 * noise**2 - log_sigma - 0.5 * math.log(2 * math.pi) - torch.log(1 - torch.tanh(u) ** 2)).sum(-1)
    torch.testing.assert_close(log_prob.detach().double(), by_hand, rtol=1e-6, atol=2e-6)
    torch.testing.assert_close(actor.act(obs, deterministic=True), torch.tanh(mean))


def test_cql_penalty_lowers_unseen_actions(fixed_batch):
    """The conservative term widens the margin of dataset actions' Q over random actions' Q."""
    random_actions = torch.rand(fixed_batch.actions.shape, generator=torch.Generator().manual_seed(1)) * 2 - 1
    margins = {}
    for cql_alpha in (0.0, 5.0):
        agent = make_agent("cql", normalize_obs=False, cql_alpha=cql_alpha, cql_n_actions=4)
        for _ in range(150):
            agent.update(fixed_batch)
        with torch.no_grad():
            margins[cql_alpha] = (agent.q_value(fixed_batch.obs, fixed_batch.actions)
                                  - agent.q_value(fixed_batch.obs, random_actions)).mean().item()
    assert margins[5.0] > margins[0.0] + 0.05


@pytest.mark.parametrize("algo", ["cql", "iql", "riql"])
def test_save_and_load_keep_policy_and_observation_statistics(algo, tmp_path, fixed_batch):
    agent = make_agent(algo)
    agent.fit_normalizer({"observations": fixed_batch.obs.numpy() * 3 + 1, "next_observations": fixed_batch.obs.numpy()})
    agent.update(fixed_batch)
    agent.save(tmp_path / "model.pt")
    loaded = AGENTS[algo][0].load(tmp_path / "model.pt")
    torch.testing.assert_close(loaded.obs_norm.mean, agent.obs_norm.mean)
    # the statistics are those of the data fitted: observations (CQL, IQL), with next observations (RIQL)
    fitted = fixed_batch.obs.double().numpy() * 3 + 1
    if algo == "riql":
        fitted = np.concatenate([fitted, fixed_batch.obs.double().numpy()])
    np.testing.assert_allclose(loaded.obs_norm.mean.double().numpy(), fitted.mean(0), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(loaded.obs_norm.var.double().numpy(), fitted.var(0), rtol=1e-6)
    obs = np.random.default_rng(0).normal(size=(4, OBS_DIM))
    np.testing.assert_array_equal(loaded.act(obs, deterministic=True), agent.act(obs, deterministic=True))


@pytest.fixture(scope="module")
def pendulum_npz(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "pendulum.npz"
    rng = np.random.default_rng(0)
    data = collect("InvertedPendulum-v5", lambda obs: rng.uniform(-3, 3, (len(obs), 1)), 600, 2, seed=0)
    np.savez(path, **data)
    return path


def tiny(config_cls, path, tmp_path, **overrides):
    settings = dict(dataset=str(path), env_id="InvertedPendulum-v5", total_updates=120, batch_size=32,
                    hidden_sizes=(32, 32), eval_freq=60, eval_episodes=2, checkpoint_freq=60, log_freq=30,
                    runs_dir=str(tmp_path), quiet=True)
    return config_cls(**{**settings, **overrides})


def test_train_end_to_end_with_corruption(pendulum_npz, tmp_path):
    result = train_riql(tiny(RIQLConfig, pendulum_npz, tmp_path, corruption="dynamics", corruption_rate=0.3))
    assert result.global_step == 120 and len(result.final_eval_returns) == 2
    final_row = (result.run_dir / "eval.csv").read_text().strip().splitlines()[-1].split(",")
    assert float(final_row[1]) == pytest.approx(result.final_eval_returns.mean(), rel=1e-12)
    assert float(final_row[2]) == pytest.approx(result.final_eval_returns.std(), abs=1e-12)
    summary = json.loads((result.run_dir / "dataset.json").read_text())
    assert summary["corruption"]["corrupted_transitions"] == 180 and summary["transitions"] == 600
    assert summary["ref_scores"] is None  # InvertedPendulum has no D4RL reference
    eval_rows = (result.run_dir / "eval.csv").read_text().strip().splitlines()
    assert [row.split(",")[0] for row in eval_rows[1:]] == ["60", "120"]
    agent = RIQL.load(result.run_dir / "model.pt")
    assert agent.obs_norm.count.item() == 1200  # observations and next observations
    # the trained critic can drive an adversarial attack on the same data
    attacked = train_cql(tiny(CQLConfig, pendulum_npz, tmp_path, total_updates=30, eval_freq=0, corruption="act",
                              corruption_mode="adversarial", attack_model=str(result.run_dir / "model.pt")))
    assert json.loads((attacked.run_dir / "dataset.json").read_text())["corruption"]["mode"] == "adversarial"


def test_cal_ql_trains_on_the_datasets_monte_carlo_returns(pendulum_npz, tmp_path, monkeypatch):
    """--cal-ql: the data gains each row's discounted return-to-go (episodes as the dataset ends them), every
    batch carries it, and the critic logs how many policy Q-values it bounded."""
    gamma, batches, logged = 0.9, [], []
    sample, update = DatasetBuffer.sample, CQL.update
    monkeypatch.setattr(DatasetBuffer, "sample", lambda self, size: batches.append(sample(self, size)) or batches[-1])
    monkeypatch.setattr(CQL, "update", lambda self, batch: logged.append(update(self, batch)) or logged[-1])
    train_cql(tiny(CQLConfig, pendulum_npz, tmp_path, cal_ql=True, gamma=gamma, total_updates=30, eval_freq=0))
    data = dict(np.load(pendulum_npz))
    ends = (data["terminals"] > 0) | (data["timeouts"] > 0)
    ends[-1] = True
    expected, following = np.zeros(len(ends)), 0.0
    for t in range(len(ends) - 1, -1, -1):
        following = data["rewards"][t] + (0.0 if ends[t] else gamma * following)
        expected[t] = following
    rows = {tuple(row): i for i, row in enumerate(np.concatenate([data["observations"], data["actions"]], 1))}
    for batch in batches:
        index = [rows[tuple(row)] for row in torch.cat([batch.obs, batch.actions], 1).numpy()]
        np.testing.assert_allclose(batch.mc_returns.numpy(), expected[index], rtol=1e-5)
    assert len(batches) == 30 and expected.max() > 5  # InvertedPendulum: +1 a step, so returns-to-go above 1
    # a fresh critic's Q-values (near 0) lie below these returns-to-go (up to 10): most are bounded at first
    rates = [losses["losses/calql_bound_rate"].item() for losses in logged]
    assert len(rates) == 30 and rates[0] > 0.5 and all(0.0 <= rate <= 1.0 for rate in rates)
    agent = CQL(4, np.array([-3.0]), np.array([3.0]), CQLConfig(cal_ql=True, hidden_sizes=(8,)))
    with pytest.raises(ValueError, match="--cal-ql bounds Q-values by the dataset's Monte-Carlo returns"):
        update(agent, batches[0]._replace(mc_returns=None))


def test_resume_after_an_interruption_reaches_the_same_weights(pendulum_npz, tmp_path, monkeypatch):
    straight = train_iql(tiny(IQLConfig, pendulum_npz, tmp_path / "a"))
    sample, calls = DatasetBuffer.sample, []

    def interrupted_sample(self, batch_size):
        calls.append(1)
        if len(calls) == 90:  # after the checkpoint at update 60
            raise KeyboardInterrupt
        return sample(self, batch_size)

    monkeypatch.setattr(DatasetBuffer, "sample", interrupted_sample)
    with pytest.raises(KeyboardInterrupt):
        train_iql(tiny(IQLConfig, pendulum_npz, tmp_path / "b"))
    monkeypatch.undo()
    (run_dir,) = (tmp_path / "b").iterdir()
    resumed = train_iql(IQLConfig(resume=str(run_dir), quiet=True))
    assert resumed.global_step == 120
    eval_steps = [row.split(",")[0] for row in (run_dir / "eval.csv").read_text().strip().splitlines()[1:]]
    assert eval_steps == ["60", "120"]
    straight_params = IQL.load(straight.run_dir / "model.pt").parameters()
    for a, b in zip(straight_params, IQL.load(run_dir / "model.pt").parameters()):
        torch.testing.assert_close(a, b)


def test_cli_errors_exit_2_with_one_line(pendulum_npz, tmp_path, capsys):
    assert run_cli(train_iql, IQLConfig, ["--dataset", "keelrl/hopper-medium-v0", "--data-path", str(tmp_path)]) == 2
    assert "make_datasets --env-id Hopper-v5 --datasets medium" in capsys.readouterr().err
    assert run_cli(train_iql, IQLConfig, ["--dataset", str(pendulum_npz), "--env-id", "Hopper-v5"]) == 2
    assert "evaluate in the environment the data came from" in capsys.readouterr().err
    assert run_cli(train_iql, IQLConfig, ["--dataset", str(pendulum_npz)]) == 2
    assert "give --env-id" in capsys.readouterr().err
    args = ["--dataset", str(pendulum_npz), "--corruption", "obs", "--corruption-mode", "adversarial"]
    assert run_cli(train_cql, CQLConfig, args) == 2
    assert "--attack-model" in capsys.readouterr().err
    # learning rates were not checked: torch's "Invalid learning rate: -1.0", naming no option
    for train, config_cls, option in ((train_cql, CQLConfig, "--qf-lr"), (train_iql, IQLConfig, "--vf-lr")):
        args = ["--dataset", str(pendulum_npz), "--env-id", "InvertedPendulum-v5", option, "-1", "--runs-dir",
                str(tmp_path / "refused")]
        assert run_cli(train, config_cls, args) == 2
        assert capsys.readouterr().err == f"error: {option} must be positive, got -1.0.\n"
    assert not (tmp_path / "refused").exists()


def test_the_adversarial_attacker_is_an_iql_family_agent(pendulum_npz, tmp_path, capsys):
    """--attack-model takes a saved IQL or RIQL agent (its critic and deterministic policy, rebuilt as IQL's
    networks); another agent's model is refused in one line."""
    cql_run = train_cql(tiny(CQLConfig, pendulum_npz, tmp_path / "cql", total_updates=10, eval_freq=0))
    iql_run = train_iql(tiny(IQLConfig, pendulum_npz, tmp_path / "iql", total_updates=10, eval_freq=0))
    q_function, policy = load_attacker(str(iql_run.run_dir / "model.pt"))
    agent, obs = IQL.load(iql_run.run_dir / "model.pt"), torch.randn(5, 4)
    actions = policy(obs)
    torch.testing.assert_close(actions, agent.attack_policy(obs))
    torch.testing.assert_close(q_function(obs, actions), agent.attack_q(obs, actions))
    args = ["--dataset", str(pendulum_npz), "--corruption", "act", "--corruption-mode", "adversarial",
            "--attack-model", str(cql_run.run_dir / "model.pt"), "--runs-dir", str(tmp_path / "attacked")]
    capsys.readouterr()
    assert run_cli(train_iql, IQLConfig, args) == 2
    err = capsys.readouterr().err
    assert err == (f"error: --attack-model {cql_run.run_dir / 'model.pt'} is a 'cql' model; adversarial corruption "
                   f"attacks the critic of an IQL or RIQL agent trained on the clean dataset "
                   f"(python -m keelrl.agents.iql).\n")
