"""SimBa and SimbaV2: ensembles equal separate members, the block structure, unit-norm weights, reward scaling."""

import io
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from keelrl.networks import (
    C51Head,
    DeterministicActor,
    RewardScaler,
    RunningObsNorm,
    SimbaActor,
    SimbaCritic,
    SimbaDeterministicActor,
    SimbaEncoder,
    SimbaV2Actor,
    SimbaV2Critic,
    SimbaV2DeterministicActor,
    SimbaV2Encoder,
    TanhGaussianActor,
)
from keelrl.networks.mlp import EnsembleLinear
from keelrl.networks.seeds import stack_seeds
from keelrl.networks.mlp import EnsembleLayerNorm
from keelrl.networks.simbav2 import HyperLinear, HyperPredictor

OBS_DIM, ACTION_DIM = 5, 2
LOW, HIGH = np.array([-1.0, 0.0]), np.array([1.0, 2.0])


def unit_row_error(module: nn.Module) -> float:
    """Largest |‖row‖ − 1| over every HyperLinear weight row in `module`."""
    weights = [m.weight for m in module.modules() if isinstance(m, HyperLinear)]
    return max((torch.linalg.vector_norm(w, dim=-1) - 1).abs().max().item() for w in weights)


def test_obs_normaliser_statistics_match_numpy_on_a_stream():
    """SimBa normalises observations with the agent's RunningObsNorm, updated batch by batch while acting."""
    rng = np.random.default_rng(0)
    stream = [rng.normal(3.0, [1.0, 5.0, 0.1], size=(n, 3)) for n in (1, 4, 4, 7, 1, 16)]
    norm = RunningObsNorm(3)
    for batch in stream:
        norm.update(torch.as_tensor(batch))
    seen = np.concatenate(stream)
    np.testing.assert_allclose(norm.mean.numpy(), seen.mean(0), rtol=1e-12)
    np.testing.assert_allclose(norm.var.numpy(), seen.var(0), rtol=1e-10)
    obs = torch.as_tensor(seen[:3], dtype=torch.float32)
    expected = (seen[:3] - seen.mean(0)) / np.sqrt(seen.var(0) + 1e-8)
    np.testing.assert_allclose(norm(obs).numpy(), expected, rtol=1e-6, atol=1e-6)


def copy_simba_member(single: nn.Module, ensemble: nn.Module, k: int) -> None:
    """Load member k of a SimBa ensemble into the same network built without members."""
    with torch.no_grad():
        for s, e in zip(single.modules(), ensemble.modules()):
            if isinstance(e, EnsembleLinear):
                s.weight.copy_(e.weight[k].T)  # (in, out) -> nn.Linear's (out, in)
                s.bias.copy_(e.bias[k, 0])
            elif isinstance(e, EnsembleLayerNorm):
                s.weight.copy_(e.weight[k, 0])
                s.bias.copy_(e.bias[k, 0])


def simba_critic_member(critic: SimbaCritic, k: int) -> nn.ModuleDict:
    """Member k of a SimBa critic ensemble (4 outputs) as a network built without members."""
    single = nn.ModuleDict({"encoder": SimbaEncoder(OBS_DIM + ACTION_DIM, 16, 2), "output": nn.Linear(16, 4)})
    copy_simba_member(single, critic, k)
    return single


def simbav2_critic_member(critic: SimbaV2Critic, k: int) -> nn.ModuleDict:
    """Member k of a SimbaV2 critic ensemble (11 outputs) as a network built without members."""
    params = dict(critic.named_parameters())
    single = nn.ModuleDict({"encoder": SimbaV2Encoder(OBS_DIM + ACTION_DIM, 16, 2), "output": HyperPredictor(16, 11)})
    with torch.no_grad():
        for name, p in single.named_parameters():
            p.copy_(params[name][k].reshape(p.shape))  # (E, out, in) / (E, 1, d) -> member k
    return single


@pytest.mark.parametrize("critic_cls, num_critics, num_outputs, member", [
    (SimbaCritic, 3, 4, simba_critic_member), (SimbaV2Critic, 2, 11, simbav2_critic_member)], ids=["simba", "simbav2"])
def test_critic_members_equal_separate_networks(critic_cls, num_critics, num_outputs, member):
    torch.manual_seed(0)
    critic = critic_cls(OBS_DIM, ACTION_DIM, hidden_dim=16, num_blocks=2, num_critics=num_critics,
                        num_outputs=num_outputs)
    obs, actions = torch.randn(6, OBS_DIM), torch.randn(6, ACTION_DIM)
    out = critic(obs, actions)
    assert out.shape == (num_critics, 6, num_outputs)
    for k in range(num_critics):
        single = member(critic, k)
        torch.testing.assert_close(single["output"](single["encoder"](torch.cat([obs, actions], -1))), out[k])
    assert not torch.allclose(out[0], out[1])  # members are initialised independently


def test_simba_encoder_structure():
    torch.manual_seed(0)
    encoder = SimbaEncoder(OBS_DIM, 32, num_blocks=2)
    embed, *blocks, final_norm = encoder.net
    # orthogonal embedding (columns orthonormal for in < d), zero biases
    torch.testing.assert_close(embed.weight.T @ embed.weight, torch.eye(OBS_DIM), atol=1e-5, rtol=0)
    assert not embed.bias.any()
    x = torch.randn(8, OBS_DIM)
    features = encoder(x)
    torch.testing.assert_close(features.mean(-1), torch.zeros(8), atol=1e-5, rtol=0)  # final LayerNorm
    with torch.no_grad():
        for block in blocks:
            block.mlp[-1].weight.zero_()  # each block's residual branch now adds nothing
    torch.testing.assert_close(encoder(x), final_norm(embed(x)))
    ln, up, _, down = blocks[0].mlp
    h = torch.randn(8, 32)
    torch.testing.assert_close(blocks[0](h), h + down(F.relu(up(ln(h)))))
    assert up.out_features == 4 * 32


def simba_member_by_hand(encoder: SimbaEncoder, k: int, x: torch.Tensor) -> torch.Tensor:
    """Member k of a SimBa ensemble encoder from the definition, in float64:
    h = x W + b; per block h ← h + W₂ relu(W₁ LN(h) + b₁) + b₂; then LN(h), LN(h) = γ (h − mean) / sqrt(var + 1e-5) + β."""

    def ln(h, norm):
        mean, var = h.mean(-1, keepdim=True), h.var(-1, unbiased=False, keepdim=True)
        return norm.weight[k, 0].double() * (h - mean) / torch.sqrt(var + 1e-5) + norm.bias[k, 0].double()

    def lin(h, layer):
        return h @ layer.weight[k].double() + layer.bias[k, 0].double()

    embed, *blocks, final_norm = encoder.net
    with torch.no_grad():
        h = lin(x.double(), embed)
        for block in blocks:
            norm, up, _, down = block.mlp
            h = h + lin(lin(ln(h, norm), up).clamp_min(0.0), down)
        return ln(h, final_norm)


def test_simba_ensemble_takes_per_member_inputs():
    torch.manual_seed(0)
    encoder = SimbaEncoder(OBS_DIM, 8, num_blocks=1, num_members=2)
    with torch.no_grad():  # non-trivial LayerNorm affines, different per member
        for module in encoder.modules():
            if isinstance(module, EnsembleLayerNorm):
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.5, 0.5)
    x = torch.randn(2, 4, OBS_DIM)
    out = encoder(x)
    assert out.shape == (2, 4, 8)
    for k in range(2):  # member k sees its own rows x[k]; LayerNorm of O(1) features: 1e-5 (a network pass)
        torch.testing.assert_close(out[k].double(), simba_member_by_hand(encoder, k, x[k]), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(out[1].double(), simba_member_by_hand(encoder, 1, x[0]), atol=1e-3)
    # a shared input (B, in) goes to every member
    torch.testing.assert_close(encoder(x[0])[1].double(), simba_member_by_hand(encoder, 1, x[0]), rtol=1e-5, atol=1e-5)


def test_simbav2_initialisation_follows_the_reference():
    critic = SimbaV2Critic(OBS_DIM, ACTION_DIM, hidden_dim=16, num_blocks=3, num_critics=2, num_outputs=11)
    assert unit_row_error(critic) < 1e-5
    assert [name for name, _ in critic.named_parameters() if "bias" in name] == ["output.bias"]
    embedding, block = critic.encoder.net[0], critic.encoder.net[1]

    def effective(scaler):
        return (scaler.scaler * scaler.forward_multiplier).detach()

    torch.testing.assert_close(effective(embedding.scaler), torch.full((2, 1, 16), math.sqrt(2 / 16)))
    torch.testing.assert_close(effective(block.up_scaler), torch.full((2, 1, 64), math.sqrt(2 / 64)))
    torch.testing.assert_close(effective(block.alpha), torch.full((2, 1, 16), 1 / 4))  # 1 / (blocks + 1)
    torch.testing.assert_close(block.alpha.scaler.detach(), torch.full((2, 1, 16), 1 / math.sqrt(16)))
    torch.testing.assert_close(effective(critic.output.net[1]), torch.ones(2, 1, 16))


def test_simbav2_embedding_appends_the_shift_and_keeps_features_on_the_sphere():
    torch.manual_seed(0)
    encoder = SimbaV2Encoder(OBS_DIM, 16, num_blocks=2)
    embedding = encoder.net[0]
    x = torch.randn(4, OBS_DIM)
    shifted = torch.cat([x, torch.full((4, 1), 3.0)], -1)
    shifted = shifted / shifted.norm(dim=-1, keepdim=True)
    hidden = (shifted @ embedding.linear.weight.T) * math.sqrt(2 / 16)
    torch.testing.assert_close(embedding(x), hidden / hidden.norm(dim=-1, keepdim=True))
    assert not torch.allclose(embedding(x), embedding(2 * x))  # the shift keeps the input's magnitude
    torch.testing.assert_close(encoder(x).norm(dim=-1), torch.ones(4))


def test_simbav2_weight_rows_are_unit_after_a_training_update():
    torch.manual_seed(0)
    head = C51Head(-5.0, 5.0, 21)
    critic = SimbaV2Critic(OBS_DIM, ACTION_DIM, hidden_dim=32, num_blocks=1, num_outputs=head.num_outputs)
    optimizer = torch.optim.Adam(critic.parameters(), lr=1e-2)
    obs, actions = torch.randn(64, OBS_DIM), torch.rand(64, ACTION_DIM)
    target = obs.sum(-1).clamp(-4.5, 4.5)  # a toy regression onto two-hot targets
    losses = []
    for _ in range(30):
        loss = head.loss(critic(obs, actions), target).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        assert unit_row_error(critic) > 1e-3  # the Adam step moved rows off the sphere
        scalers = [p.clone() for name, p in critic.named_parameters() if "scaler" in name or "bias" in name]
        weights = [m.weight.detach().double().clone() for m in critic.modules() if isinstance(m, HyperLinear)]
        critic.project_weights()
        assert unit_row_error(critic) < 1e-5
        # each row keeps its direction: w ← w / ‖w‖₂
        for before, module in zip(weights, (m for m in critic.modules() if isinstance(m, HyperLinear))):
            torch.testing.assert_close(module.weight.detach().double(), before / before.norm(dim=-1, keepdim=True),
                                       rtol=1e-6, atol=1e-7)
        after = [p for name, p in critic.named_parameters() if "scaler" in name or "bias" in name]
        assert all(torch.equal(a, b) for a, b in zip(scalers, after))  # only HyperLinear weights are projected
        losses.append(loss.item())
    assert losses[-1] < 0.6 * losses[0]


@pytest.mark.parametrize(
    "actor_cls, parent",
    [
        (SimbaActor, TanhGaussianActor),
        (SimbaV2Actor, TanhGaussianActor),
        (SimbaDeterministicActor, DeterministicActor),
        (SimbaV2DeterministicActor, DeterministicActor),
    ],
)
def test_actors_swap_in_for_mlp_actors(actor_cls, parent):
    torch.manual_seed(0)
    actor = actor_cls(OBS_DIM, LOW, HIGH, hidden_dim=16)
    assert isinstance(actor, parent)
    obs = torch.randn(32, OBS_DIM)
    scale, bias = torch.tensor([1.0, 1.0]), torch.tensor([0.0, 1.0])  # LOW (−1, 0), HIGH (1, 2)
    torch.testing.assert_close(actor.action_scale, scale, rtol=0, atol=0)
    torch.testing.assert_close(actor.action_bias, bias, rtol=0, atol=0)
    if parent is TanhGaussianActor:
        torch.manual_seed(1)
        actions, log_prob = actor.sample(obs)
        assert log_prob.shape == (32,) and torch.isfinite(log_prob).all()
        mean, log_std = actor(obs)
        assert (log_std >= actor.log_std_min).all() and (log_std <= actor.log_std_max).all()
        assert (actor.log_std_min, actor.log_std_max) == (-10.0, 2.0)  # the references' range
        with torch.no_grad():  # log-std = min + (max − min)(tanh(raw) + 1) / 2 on the trunk's raw output
            raw = actor.log_std(actor.trunk(obs))
        torch.testing.assert_close(log_std, -10.0 + 6.0 * (torch.tanh(raw) + 1), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(actor.act(obs, deterministic=True), torch.tanh(mean) * actor.action_scale + actor.action_bias)
        # the reparameterised sample by hand, in float64: ε ~ N(0, 1) (the one draw of `sample`, reproduced by
        # the seed), u = μ + σε, a = tanh(u) · scale + bias, log π = Σ log N(ε) − log σ − log(scale (1 − tanh²u) + 1e-6)
        torch.manual_seed(1)
        noise = torch.randn(32, ACTION_DIM).double()
        mu, sigma = mean.detach().double(), log_std.detach().double().exp()
        squashed = torch.tanh(mu + sigma * noise)
        torch.testing.assert_close(actions.detach().double(), squashed * scale.double() + bias.double(),
                                   rtol=1e-6, atol=1e-6)
        by_hand = (-0.5 * noise**2 - sigma.log() - 0.5 * math.log(2 * math.pi)
                   - torch.log(scale.double() * (1 - squashed**2) + 1e-6)).sum(-1)
        # float32 log(1 − tanh²u) loses digits as |tanh u| → 1 (by 1/(1 − tanh²u) < 100 inside 0.99): 1e-5
        inside = squashed.abs().max(-1).values < 0.99
        assert inside.sum() >= 16
        torch.testing.assert_close(log_prob.detach().double()[inside], by_hand[inside], rtol=1e-5, atol=1e-5)
        loss = log_prob.mean() - actions.sum()
    else:
        actions = actor(obs)
        with torch.no_grad():  # a = tanh(trunk and output layer) · scale + bias
            pre_tanh = actor.net(obs)
        torch.testing.assert_close(actions, torch.tanh(pre_tanh) * scale + bias, rtol=1e-6, atol=1e-6)
        loss = actions.sum()
    assert actions.shape == (32, ACTION_DIM)
    assert (actions >= torch.tensor(LOW, dtype=torch.float32)).all() and (actions <= torch.tensor(HIGH, dtype=torch.float32)).all()
    loss.backward()
    assert all(p.grad is not None for p in actor.parameters())
    if hasattr(actor, "project_weights"):
        torch.optim.Adam(actor.parameters(), lr=1e-2).step()
        actor.project_weights()
        assert unit_row_error(actor) < 1e-5


def test_simba_critic_feeds_value_heads():
    torch.manual_seed(0)
    head = C51Head(-5.0, 5.0, 11)  # atoms −5, −4, …, 5
    critic = SimbaCritic(OBS_DIM, ACTION_DIM, hidden_dim=8, num_blocks=1, num_outputs=head.num_outputs)
    logits = critic(torch.randn(4, OBS_DIM), torch.randn(4, ACTION_DIM))
    assert logits.shape == (2, 4, 11)
    probs = F.softmax(logits.detach().double(), -1)
    atoms = torch.arange(-5.0, 6.0, dtype=torch.float64)
    torch.testing.assert_close(head.value(logits).detach().double(), probs @ atoms, rtol=1e-6, atol=1e-6)
    # a target of 0 is the one-hot of atom 5: the loss is −log softmax(logits)[5]
    loss = head.loss(logits, torch.zeros(4))
    torch.testing.assert_close(loss.detach().double(), -torch.log(probs[..., 5]), rtol=1e-6, atol=1e-6)
    loss.mean().backward()
    # d(mean loss)/d(output bias of member k) = Σ_b (softmax − one-hot of atom 5) / (2 · 4)
    expected = (probs - F.one_hot(torch.tensor(5), 11).double()).sum(1, keepdim=True) / 8
    torch.testing.assert_close(critic.output.bias.grad.double(), expected, rtol=1e-5, atol=1e-7)
    assert all(p.grad is not None for p in critic.parameters())


def test_reward_scaler_by_hand():
    scaler = RewardScaler(gamma=0.5, num_envs=1, v_max=2.0)
    assert scaler.denominator().item() == pytest.approx(1.0)  # no statistics yet: rewards unchanged
    # G = 1: std 0, max|G| / v_max = 0.5
    scaler.update(np.array([1.0]), np.array([False]))
    assert scaler.denominator().item() == pytest.approx(0.5)
    torch.testing.assert_close(scaler(torch.tensor([1.0, -3.0])), torch.tensor([2.0, -6.0]))
    torch.testing.assert_close(scaler(torch.tensor(1.0)), torch.tensor(2.0))  # one reward
    torch.testing.assert_close(scaler(torch.tensor([[1.0], [-3.0]])), torch.tensor([[2.0], [-6.0]]))  # (B, 1)
    # G = 0.5 * 1 + 2 = 2.5 (episode ends): G values {1, 2.5} have std 0.75; 2.5 / 2 = 1.25 wins
    scaler.update(np.array([2.0]), np.array([True]))
    assert scaler.denominator().item() == pytest.approx(1.25)
    assert scaler.returns.item() == 0.0  # reset after the episode's last step
    # G = 4: G values {1, 2.5, 4} have std sqrt(1.5) ≈ 1.22; 4 / 2 = 2 wins
    scaler.update(np.array([4.0]), np.array([False]))
    assert scaler.denominator().item() == pytest.approx(2.0)
    scaler.v_max = 5.0  # now the std wins: 4 / 5 < sqrt(1.5)
    assert scaler.denominator().item() == pytest.approx(math.sqrt(1.5 + 1e-8))


@pytest.mark.parametrize("algo", ["sac", "td3"])
@pytest.mark.parametrize("head, support, g_max", [
    ("scalar", (None, None), 5.0),  # SimbaV2's G_max
    ("c51", (None, None), 5.0),  # the default support [-5, 5]
    ("c51", (-2.0, 2.0), 2.0),  # scaled returns stay on a narrower support (they reached 5 against its edge 2)
    ("hlgauss", (-1.0, 10.0), 1.0),  # the edge nearer 0: neither side's returns leave the support
])
def test_scaled_returns_stay_on_the_critics_support(algo, head, support, g_max):
    from keelrl.agents import sac, td3

    module, agent_cls = {"sac": (sac, sac.SAC), "td3": (td3, td3.TD3)}[algo]
    config_cls = sac.SACConfig if algo == "sac" else td3.TD3Config
    config = module.resolve(config_cls(hidden_sizes=(8,), critic_head=head, v_min=support[0], v_max=support[1],
                                       num_bins=11, scale_rewards=True))
    module.validate(config)
    agent = agent_cls(3, np.array([-1.0]), np.array([1.0]), config)
    assert agent.reward_scaler.v_max == g_max
    for _ in range(2000):  # reward 1 every step: G grows towards 1 / (1 − γ)
        agent.reward_scaler.update(np.ones(1), np.zeros(1, bool))
    largest = agent.reward_scaler.returns.max().item() / agent.reward_scaler.denominator().item()
    assert largest == pytest.approx(g_max)


def test_scaled_rewards_need_a_support_around_zero():
    from keelrl.agents import sac

    config = sac.SACConfig(critic_head="c51", v_min=0.0, v_max=10.0, scale_rewards=True)
    with pytest.raises(ValueError, match=r"--v-min and --v-max must lie on either side of 0, got \[0.0, 10.0\]"):
        sac.validate(config)


def test_reward_scaler_keeps_one_trace_per_env():
    rng = np.random.default_rng(0)
    rewards, dones = rng.normal(size=(30, 3)), rng.random((30, 3)) < 0.2
    scaler = RewardScaler(gamma=0.9, num_envs=3)
    trace, seen = np.zeros(3), []
    for r, d in zip(rewards, dones):
        scaler.update(r, d)
        trace = 0.9 * trace + r
        seen.append(trace.copy())
        trace[d] = 0.0
    seen = np.concatenate(seen)
    expected = max(np.sqrt(seen.var() + 1e-8), np.abs(seen).max() / 5.0)
    assert scaler.denominator().item() == pytest.approx(expected, rel=1e-10)


def test_stacked_reward_scalers_keep_each_seeds_trace_statistics_and_scale():
    """A seed group's scaler (keelrl.networks.seeds): rewards (S, num_envs) folded into each seed's own state, and a
    batch (S, B) divided by each seed's own denominator, as two single scalers given each seed's rewards."""
    rng = np.random.default_rng(0)
    rewards = [rng.normal(scale, size=(30, 3)) for scale in (1.0, 20.0)]  # seed 1's returns far larger
    dones = [rng.random((30, 3)) < 0.2 for _ in range(2)]
    group = stack_seeds(lambda: RewardScaler(gamma=0.9, num_envs=3), [1, 2])
    singles = [RewardScaler(gamma=0.9, num_envs=3) for _ in range(2)]
    for step in range(30):
        group.update(np.stack([r[step] for r in rewards]), np.stack([d[step] for d in dones]))
        for k, single in enumerate(singles):
            single.update(rewards[k][step], dones[k][step])
    batch = torch.tensor([[1.0, -2.0], [3.0, 4.0]])  # (S, B)
    scaled = group(batch)
    for k, single in enumerate(singles):
        assert group.denominator()[k].item() == pytest.approx(single.denominator().item(), rel=1e-12)
        torch.testing.assert_close(group.returns[k], single.returns)
        torch.testing.assert_close(scaled[k], single(batch[k]))
    assert group.denominator()[1] > 5 * group.denominator()[0]


def test_reward_scaler_state_dict_round_trip():
    scaler = RewardScaler(gamma=0.99, num_envs=2)
    for step in range(5):
        scaler.update(np.array([1.0, -2.0 * step]), np.array([step == 2, False]))
    state = scaler.state_dict()
    assert all(isinstance(value, torch.Tensor) for value in state.values())
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    restored = RewardScaler(gamma=0.99, num_envs=2)
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    for s in (scaler, restored):
        s.update(np.array([0.5, 3.0]), np.array([False, True]))
    assert restored.denominator().item() == scaler.denominator().item()
    torch.testing.assert_close(restored.returns, scaler.returns)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: SimbaEncoder(OBS_DIM, 0, 1), "hidden_dim"),
        (lambda: SimbaV2Encoder(OBS_DIM, 8, -1), "num_blocks"),
        (lambda: SimbaV2Critic(OBS_DIM, ACTION_DIM, 8, 1, num_critics=0), "critics"),
        (lambda: RewardScaler(gamma=1.5, num_envs=1), "--gamma"),
        (lambda: RewardScaler(gamma=0.99, num_envs=0), "--num-envs"),
        (lambda: RewardScaler(gamma=0.99, num_envs=1, v_max=0.0), "--v-max"),
    ],
)
def test_bad_arguments_raise_value_error(make, message):
    with pytest.raises(ValueError, match=message):
        make()
