"""Networks: the batched ensemble equals separate MLPs; the tanh-Gaussian log-prob is exact."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from keelrl.networks import (
    CriticEnsemble,
    DeterministicActor,
    EnsembleMLP,
    NumpyMLP,
    RewardScaler,
    RunningObsNorm,
    TanhGaussianActor,
    mlp,
)
from keelrl.networks.seeds import stack_seeds


def test_ensemble_members_equal_separate_mlps():
    torch.manual_seed(0)
    ensemble = EnsembleMLP(3, 5, (16, 8), 2)
    x = torch.randn(7, 5)
    out = ensemble(x)
    assert out.shape == (3, 7, 2)
    for k in range(3):
        single = mlp(5, (16, 8), 2)
        linears = [m for m in single if isinstance(m, nn.Linear)]
        for linear, layer in zip(linears, ensemble.layers):
            linear.weight.data = layer.weight.data[k].T.clone()
            linear.bias.data = layer.bias.data[k, 0].clone()
        torch.testing.assert_close(single(x), out[k])
    assert not torch.allclose(out[0], out[1])  # members are initialised independently


def test_layer_norm_ensemble_members_equal_separate_layer_norm_mlps():
    """--layer-norm: each member is Linear → LayerNorm (its own scale and bias) → ReLU per hidden layer, as
    mlp(layer_norm=True); member subsets given as index tensors (repeats allowed) pick those members."""
    torch.manual_seed(0)
    ensemble = EnsembleMLP(3, 5, (16, 8), 2, layer_norm=True)
    with torch.no_grad():
        for norm in ensemble.norms:
            norm.weight.normal_(1.0, 0.5)
            norm.bias.normal_(0.0, 0.5)
    x = torch.randn(7, 5)
    out = ensemble(x)
    for k in range(3):
        single = mlp(5, (16, 8), 2, layer_norm=True)
        linears = [m for m in single if isinstance(m, nn.Linear)]
        norms = [m for m in single if isinstance(m, nn.LayerNorm)]
        for linear, layer in zip(linears, ensemble.layers):
            linear.weight.data = layer.weight.data[k].T.clone()
            linear.bias.data = layer.bias.data[k, 0].clone()
        for norm, ensemble_norm in zip(norms, ensemble.norms):
            norm.weight.data = ensemble_norm.weight.data[k, 0].clone()
            norm.bias.data = ensemble_norm.bias.data[k, 0].clone()
        torch.testing.assert_close(single(x), out[k])
    torch.testing.assert_close(ensemble(x, torch.tensor([2, 0, 2])), out[[2, 0, 2]])


def member_by_hand(layers, k: int, x: torch.Tensor) -> torch.Tensor:
    """Member k of an EnsembleMLP from its definition, in float64: x W_k + b_k per layer, ReLU between."""
    h = x.double()
    for i, layer in enumerate(layers):
        h = h @ layer.weight[k].detach().double() + layer.bias[k, 0].detach().double()
        if i < len(layers) - 1:
            h = h.clamp_min(0.0)
    return h


def test_ensemble_takes_per_member_inputs():
    torch.manual_seed(0)
    ensemble = EnsembleMLP(2, 4, (8,), 1)
    x = torch.randn(2, 6, 4)
    out = ensemble(x)
    assert out.shape == (2, 6, 1)
    for k in range(2):  # member k sees its own rows x[k]
        torch.testing.assert_close(out[k].double(), member_by_hand(ensemble.layers, k, x[k]), rtol=1e-6, atol=1e-6)
    assert not torch.allclose(out[1].double(), member_by_hand(ensemble.layers, 1, x[0]))


def test_critic_ensemble_values_and_gradients():
    torch.manual_seed(0)
    critic = CriticEnsemble(obs_dim=5, action_dim=2, hidden_sizes=(32, 32), num_critics=2)
    obs, actions = torch.randn(9, 5), torch.randn(9, 2)
    q = critic(obs, actions)
    assert q.shape == (2, 9, 1)
    x = torch.cat([obs, actions], -1)  # Q(s, a) = MLP([s, a])
    for k in range(2):
        torch.testing.assert_close(q[k].double(), member_by_hand(critic.net.layers, k, x), rtol=1e-6, atol=1e-6)
    wide = CriticEnsemble(5, 2, (8,), num_critics=3, num_outputs=51)
    out = wide(obs[:4], actions[:4])
    assert out.shape == (3, 4, 51)
    torch.testing.assert_close(out[2].double(), member_by_hand(wide.net.layers, 2, x[:4]), rtol=1e-6, atol=1e-6)
    q.sum().backward()
    # d(Σ Q)/d(last bias of member k) = B = 9; d/d(last weight of member k) = Σ_b (last hidden features of b)
    last = critic.net.layers[-1]
    torch.testing.assert_close(last.bias.grad, torch.full((2, 1, 1), 9.0))
    for k in range(2):
        hidden = member_by_hand(critic.net.layers[:-1], k, x).clamp_min(0.0)  # ReLU of the last hidden layer
        torch.testing.assert_close(last.weight.grad[k, :, 0].double(), hidden.sum(0), rtol=1e-6, atol=1e-6)
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in critic.parameters())


def test_tanh_gaussian_log_prob_matches_change_of_variables():
    torch.manual_seed(0)
    low, high = np.array([-2.0, 0.0]), np.array([2.0, 1.0])
    actor = TanhGaussianActor(4, low, high, hidden_sizes=(16, 16))
    obs = torch.randn(1000, 4)
    actions, log_prob = actor.sample(obs)
    assert actions.shape == (1000, 2) and log_prob.shape == (1000,)
    assert (actions >= torch.tensor(low, dtype=torch.float32)).all()
    assert (actions <= torch.tensor(high, dtype=torch.float32)).all()
    # recompute: u = atanh((a - bias) / scale), log N(u) - log|da/du|
    mean, log_std = actor(obs)
    squashed = (actions - actor.action_bias) / actor.action_scale
    u = torch.atanh(squashed.clamp(-1 + 1e-6, 1 - 1e-6))
    normal = torch.distributions.Normal(mean, log_std.exp())
    expected = (normal.log_prob(u) - torch.log(actor.action_scale * (1 - squashed.pow(2)) + 1e-6)).sum(-1)
    interior = squashed.abs().max(-1).values < 0.99  # atanh amplifies rounding by 1/(1 − a²) < 100 here: 1e-5
    torch.testing.assert_close(log_prob[interior], expected[interior], rtol=1e-5, atol=1e-5)
    assert log_std.min() >= -5 and log_std.max() <= 2
    # the same in float64 from the definition, log N(u; μ, σ) − log(scale (1 − tanh²u) + 1e-6): inverting the
    # float32 actions amplifies their rounding by 1/(1 − a²) (< 100 inside |a| < 0.99), so 1e-5, not 1e-6
    a = ((actions.double() - actor.action_bias.double()) / actor.action_scale.double())
    inside = a.abs().max(-1).values < 0.99
    assert inside.sum() > 900
    u, mu, sigma = torch.atanh(a), mean.detach().double(), log_std.detach().double().exp()
    by_hand = (-0.5 * ((u - mu) / sigma) ** 2 - sigma.log() - 0.5 * math.log(2 * math.pi)
               - torch.log(actor.action_scale.double() * (1 - a**2) + 1e-6)).sum(-1)
    torch.testing.assert_close(log_prob.double()[inside], by_hand[inside], rtol=1e-5, atol=1e-5)


def test_deterministic_actions_within_bounds():
    torch.manual_seed(0)
    actor = DeterministicActor(3, np.array([-0.5]), np.array([1.5]), hidden_sizes=(8,))
    obs = torch.cat([100 * torch.randn(50, 3), torch.randn(50, 3)])  # saturated and unsaturated actions
    actions = actor(obs)
    assert actions.shape == (100, 1)
    assert actions.min() >= -0.5 and actions.max() <= 1.5
    # a = tanh(W2 relu(W1 s + b1) + b2) · (1.5 − (−0.5)) / 2 + (1.5 + (−0.5)) / 2, by hand in float64
    first, last = (m for m in actor.net if isinstance(m, nn.Linear))
    hidden = (obs.double() @ first.weight.detach().double().T + first.bias.detach().double()).clamp_min(0.0)
    by_hand = torch.tanh(hidden @ last.weight.detach().double().T + last.bias.detach().double()) * 1.0 + 0.5
    torch.testing.assert_close(actions.detach().double(), by_hand, rtol=1e-6, atol=1e-6)
    gaussian = TanhGaussianActor(3, np.array([-0.5]), np.array([1.5]), hidden_sizes=(8,))
    mode = gaussian.act(torch.zeros(1, 3), deterministic=True)
    mean, _ = gaussian(torch.zeros(1, 3))
    torch.testing.assert_close(mode, torch.tanh(mean) + 0.5)


def test_unbounded_action_space_is_rejected():
    with pytest.raises(ValueError, match="bounded"):
        TanhGaussianActor(3, np.array([-math.inf]), np.array([math.inf]))


def test_running_obs_norm_matches_numpy_on_a_stream():
    rng = np.random.default_rng(0)
    stream = [rng.normal(-2.0, 3.0, (int(n), 6)) for n in rng.integers(1, 16, 40)]
    norm = RunningObsNorm(6)
    for batch in stream:
        norm.update(torch.as_tensor(batch, dtype=torch.float32))
    everything = np.concatenate(stream).astype(np.float32).astype(np.float64)
    np.testing.assert_allclose(norm.mean.numpy(), everything.mean(0), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(norm.var.numpy(), everything.var(0), rtol=1e-9)
    assert norm.count.item() == len(everything)
    x = torch.as_tensor(everything[:5], dtype=torch.float32)
    expected = (everything[:5] - everything.mean(0)) / np.sqrt(everything.var(0) + 1e-8)
    np.testing.assert_allclose(norm(x).numpy(), expected, rtol=1e-6, atol=1e-6)
    assert norm(torch.full((1, 6), 1e6)).max() == 10.0  # clipped


def test_running_obs_norm_merges_alike_in_torch_and_in_numpy_one_seed_or_a_group():
    """The merge a GPU runs (`update_on_device`: torch ops, a seed group's seeds at once), run here on the CPU, keeps
    the statistics the numpy merge keeps (single rows and batches), each seed of a group its own: numpy's moments
    of everything that seed saw."""
    rng = np.random.default_rng(1)
    stream = [rng.normal(-2.0, 3.0, (3, int(n), 4)) for n in rng.integers(1, 6, 30)]  # 3 seeds, batches of 1-5
    group_in_numpy, group_in_torch = (stack_seeds(lambda: RunningObsNorm(4), [0, 1, 2]) for _ in range(2))
    single_in_numpy, single_in_torch = RunningObsNorm(4), RunningObsNorm(4)
    for batch in stream:
        group_in_numpy.update(batch)
        group_in_torch.update_on_device(batch)
        single_in_numpy.update(batch[1])
        single_in_torch.update_on_device(batch[1])
    for name in ("mean", "var", "count"):
        torch.testing.assert_close(getattr(group_in_torch, name), getattr(group_in_numpy, name), rtol=1e-12, atol=0)
        torch.testing.assert_close(getattr(single_in_torch, name), getattr(single_in_numpy, name), rtol=1e-12,
                                   atol=0)
    for seed in range(3):
        seen = np.concatenate([batch[seed] for batch in stream])
        np.testing.assert_allclose(group_in_torch.mean[seed].numpy(), seen.mean(0), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(group_in_torch.var[seed].numpy(), seen.var(0), rtol=1e-12)
        assert group_in_torch.count[seed].item() == len(seen)
    torch.testing.assert_close(single_in_torch.mean, group_in_torch.mean[1], rtol=1e-12, atol=0)


# a small array with an outlier (row 3) and a constant column (std 0), by hand below
SMALL_OBS = np.array([[1.0, 2.0, 7.0], [3.0, -2.0, 7.0], [5.0, 0.0, 7.0], [400.0, 1.0, 7.0]])


def test_simba_convention_divides_by_sqrt_var_plus_eps_without_clipping():
    """SimBa/SimbaV2 (scale_rl/agents/wrappers/normalization.py): (x − mean) / sqrt(var + 1e-8), no clip."""
    norm = RunningObsNorm(3, clip=None, eps=1e-8, eps_on="var")
    for row in SMALL_OBS:  # streamed one observation at a time, as while acting
        norm.update(torch.as_tensor(row[None]))
    mean = SMALL_OBS.mean(0)  # [102.25, 0.25, 7]
    var = ((SMALL_OBS - mean) ** 2).mean(0)  # population variance
    expected = (SMALL_OBS - mean) / np.sqrt(var + 1e-8)
    out = norm(torch.as_tensor(SMALL_OBS, dtype=torch.float32)).numpy()
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)
    # column 0 by hand: deviations −101.25, −99.25, −97.25, 297.75; var = 29553.6875
    assert out[3, 0] == pytest.approx(297.75 / math.sqrt(29553.6875 + 1e-8), rel=1e-6)
    far = norm(torch.tensor([[102.25 + 40 * math.sqrt(var[0]), 0.25, 7.0]]))
    assert far[0, 0].item() == pytest.approx(40.0, rel=1e-6)  # not clipped at 10
    assert far[0, 2].item() == 0.0  # constant column: (7 − 7) / sqrt(0 + 1e-8)


def test_corl_riql_convention_adds_eps_to_the_std_without_clipping():
    """CORL and RIQL: compute_mean_std(states, eps=1e-3) gives std(0) + 1e-3; (x − mean) / that, no clip."""
    norm = RunningObsNorm(3, clip=None, eps=1e-3, eps_on="std")
    norm.update(torch.as_tensor(SMALL_OBS))  # fitted once on the whole dataset
    mean, std = SMALL_OBS.mean(0), SMALL_OBS.std(0)
    expected = (SMALL_OBS - mean) / (std + 1e-3)
    x = np.array([[0.0, 1.0, 7.5]])
    out = norm(torch.as_tensor(x, dtype=torch.float32)).numpy()
    np.testing.assert_allclose(out, (x - mean) / (std + 1e-3), rtol=1e-6)
    assert out[0, 2] == pytest.approx(500.0, rel=1e-6)  # (7.5 − 7) / (0 + 1e-3): the eps is not under a sqrt
    np.testing.assert_allclose(norm(torch.as_tensor(SMALL_OBS, dtype=torch.float32)).numpy(), expected,
                               rtol=1e-6, atol=1e-6)


def test_normaliser_clips_only_when_asked():
    norm = RunningObsNorm(3, clip=2.5)
    norm.update(torch.as_tensor(SMALL_OBS))
    out = norm(torch.as_tensor([[1e6, -1e6, 7.0]]))
    assert out.tolist() == [[2.5, -2.5, 0.0]]
    with pytest.raises(ValueError, match="eps_on"):
        RunningObsNorm(3, eps_on="variance")
    with pytest.raises(ValueError, match="clip must be positive"):
        RunningObsNorm(3, clip=0.0)


@pytest.mark.parametrize("algo", ["cql", "iql", "riql"])
def test_offline_agents_normalise_as_corl_and_riql(algo):
    """CQL and IQL fit (s − mean) / (std + 1e-3) on the dataset's observations (CORL cql.py/iql.py
    compute_mean_std(dataset["observations"], eps=1e-3)); RIQL on observations and next observations
    together (RIQL.py:626). Nothing is clipped."""
    from keelrl.agents.cql import CQL, CQLConfig
    from keelrl.agents.iql import IQL, IQLConfig
    from keelrl.agents.riql import RIQL, RIQLConfig

    agent_cls, config_cls = {"cql": (CQL, CQLConfig), "iql": (IQL, IQLConfig), "riql": (RIQL, RIQLConfig)}[algo]
    agent = agent_cls(3, -np.ones(1), np.ones(1), config_cls(hidden_sizes=(8, 8)))
    next_obs = SMALL_OBS[::-1] * 2.0
    agent.fit_normalizer({"observations": SMALL_OBS, "next_observations": next_obs})
    fitted = np.concatenate([SMALL_OBS, next_obs]) if algo == "riql" else SMALL_OBS
    x = np.array([[0.0, 1.0, 7.5], [2000.0, -3.0, 7.0]])
    expected = (x - fitted.mean(0)) / (fitted.std(0) + 1e-3)
    np.testing.assert_allclose(agent.obs_norm(torch.as_tensor(x, dtype=torch.float32)).numpy(), expected,
                               rtol=1e-6, atol=1e-6)


def test_ensemble_evaluates_a_subset_of_members():
    torch.manual_seed(0)
    critic = CriticEnsemble(obs_dim=5, action_dim=2, hidden_sizes=(16,), num_critics=3)
    obs, actions = torch.randn(4, 5), torch.randn(4, 2)
    x = torch.cat([obs, actions], -1)
    by_hand = torch.stack([member_by_hand(critic.net.layers, k, x) for k in range(3)])  # (3, 4, 1)
    first = critic(obs, actions, members=slice(0, 1))
    assert first.shape == (1, 4, 1)
    torch.testing.assert_close(first.double(), by_hand[:1], rtol=1e-6, atol=1e-6)
    last_two = critic(obs, actions, members=slice(1, 3))
    assert last_two.shape == (2, 4, 1)
    torch.testing.assert_close(last_two.double(), by_hand[1:], rtol=1e-6, atol=1e-6)
    # and with more than one output (the batched-matmul path)
    wide = CriticEnsemble(obs_dim=5, action_dim=2, hidden_sizes=(16,), num_critics=3, num_outputs=4)
    torch.testing.assert_close(wide(obs, actions, members=slice(2, 3))[0].double(),
                               member_by_hand(wide.net.layers, 2, x), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("activation", [nn.Tanh, nn.ReLU])
def test_numpy_mlp_is_the_modules_forward_pass_as_it_was_copied(activation):
    torch.manual_seed(0)
    net = mlp(5, (16, 16), 3, activation)
    copy = NumpyMLP(net)
    x = torch.randn(7, 5)
    np.testing.assert_allclose(copy(x.numpy()), net(x).detach().numpy(), rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        net[0].weight.add_(1.0)  # a later update does not reach the copy
    assert not np.allclose(copy(x.numpy()), net(x).detach().numpy(), atol=1e-3)
    with pytest.raises(TypeError, match="NumpyMLP copies Linear, Tanh and ReLU layers, not LayerNorm"):
        NumpyMLP(nn.Sequential(nn.Linear(5, 4), nn.LayerNorm(4)))


@pytest.mark.parametrize("eps_on, clip", [("var", 10.0), ("var", None), ("std", 1.0)])
def test_standardize_is_forward_for_numpy_batches(eps_on, clip):
    norm = RunningObsNorm(4, clip=clip, eps=1e-3, eps_on=eps_on)
    rng = np.random.default_rng(0)
    norm.update(rng.normal(2.0, 0.1, (50, 4)))  # small spread: far observations are clipped when asked
    obs = rng.normal(2.0, 1.0, (8, 4))
    standardized = norm.standardize(obs)
    assert standardized.dtype == np.float32
    np.testing.assert_allclose(standardized, norm(torch.as_tensor(obs)).numpy(), rtol=1e-6, atol=1e-6)
    assert (np.abs(standardized).max() == clip) if clip is not None else np.abs(standardized).max() > 1.0


def test_reward_scaler_scale_is_forward_for_numpy_batches():
    scaler = RewardScaler(0.99, num_envs=2, v_max=5.0)
    rng = np.random.default_rng(0)
    for t in range(30):
        scaler.update(rng.normal(1.0, 2.0, 2), np.array([t == 10, False]))
    rewards = rng.normal(0.0, 3.0, 2)
    np.testing.assert_allclose(scaler.scale(rewards), scaler(torch.as_tensor(rewards)).numpy(), rtol=1e-12)
