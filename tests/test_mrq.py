"""MR.Q (agents/mrq.py) and LAP replay (buffers/lap.py): each loss against a float64 oracle written here from the
networks' saved weights (the forward passes too: a layer left out fails as surely as a wrong loss), the two-hot
encoding and its inverse, the multi-step Huber target with termination and truncation, LAP's priorities and sampling
probabilities, sequences and their live mask, the target-copy schedule, and a short run: its files, its model, and a
resume that ends where any other resume from the same checkpoint ends."""

from __future__ import annotations

import csv
import dataclasses

import numpy as np
import pytest
import torch

from keelrl.agents import mrq
from keelrl.agents.mrq import MRQ, MRQConfig, SymexpTwoHot, main, train
from keelrl.buffers import LAPReplayBuffer, SequenceBatch
from keelrl.evaluate import EvaluateConfig, evaluate_saved

from helpers import killed_in_call

OBS_DIM, ACTION_DIM = 3, 2
LOW, HIGH = -2 * np.ones(ACTION_DIM), 2 * np.ones(ACTION_DIM)  # actions learnt as env action / 2
SMALL = dict(zs_dim=12, zsa_dim=10, za_dim=6, enc_hidden_dim=16, value_hidden_dim=14, policy_hidden_dim=8, num_bins=9,
             bins_low=-3.0, bins_high=3.0)


def make_agent(**overrides) -> MRQ:
    torch.manual_seed(0)
    agent = MRQ(OBS_DIM, LOW, HIGH, MRQConfig(**{**SMALL, **overrides}))
    with torch.no_grad():  # the online networks away from the targets they were copied to
        for param in agent.parameters():
            param.add_(0.05 * torch.randn_like(param))
    return agent


# ---- the float64 oracle: MR.Q's networks by hand from the agent's weights ----

def weights(agent: MRQ) -> dict[str, torch.Tensor]:
    return {name: tensor.double() for name, tensor in agent.state_dict().items()}


def linear(w, name, x):
    return x @ w[f"{name}.weight"].T + w[f"{name}.bias"]


def layer_norm(x):
    return (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-5)


def elu(x):
    return torch.where(x > 0, x, torch.expm1(x))


def mlp(w, name, x, activation):
    """Linear → LayerNorm → activation, twice, then Linear."""
    h = activation(layer_norm(linear(w, f"{name}.0", x)))
    h = activation(layer_norm(linear(w, f"{name}.3", h)))
    return linear(w, f"{name}.6", h)


def zs_of(w, encoder, obs):
    return elu(layer_norm(mlp(w, f"{encoder}.state", obs, elu)))


def zsa_of(w, encoder, zs, actions):
    return mlp(w, f"{encoder}.state_action", torch.cat([zs, elu(linear(w, f"{encoder}.action", actions))], -1), elu)


def q_of(w, value, zsa):
    """(B, zsa) -> (2, B): each critic Linear → LayerNorm → ELU three times, then Linear."""
    outputs = []
    for member in range(2):
        h = zsa
        for layer in range(3):
            h = elu(layer_norm(h @ w[f"{value}.hidden.{layer}.weight"][member] + w[f"{value}.hidden.{layer}.bias"][member]))
        outputs.append((h @ w[f"{value}.output.weight"][member] + w[f"{value}.output.bias"][member]).squeeze(-1))
    return torch.stack(outputs)


def policy_of(w, policy, zs):
    """Actions in [−1, 1] and their pre-tanh values."""
    pre = mlp(w, f"{policy}.net", zs, torch.relu)
    return torch.tanh(pre), pre


def two_hot_oracle(values, low=-10.0, high=10.0, num_bins=65):
    """(N,) -> (N, K): the mass of each value split between the bins around it, symexp(linspace(low, high, K))."""
    symlog = np.linspace(low, high, num_bins)
    bins = np.sign(symlog) * np.expm1(np.abs(symlog))
    out = np.zeros((len(values), num_bins))
    for n, value in enumerate(np.asarray(values, dtype=np.float64)):
        value = min(max(value, bins[0]), bins[-1])
        j = max(i for i in range(num_bins - 1) if bins[i] <= value)
        share = (value - bins[j]) / (bins[j + 1] - bins[j])
        out[n, j] += 1 - share
        out[n, j + 1] += share
    return torch.as_tensor(out), torch.as_tensor(bins)


# ---- the losses ----

def test_defaults_are_the_papers():
    config = MRQConfig()
    assert (config.batch_size, config.gamma, config.target_update_freq, config.learning_starts) == (256, 0.99, 250, 10_000)
    assert (config.exploration_noise, config.target_policy_noise, config.noise_clip) == (0.2, 0.2, 0.3)
    assert (config.dyn_weight, config.reward_weight, config.done_weight) == (1.0, 0.1, 0.1)
    assert (config.alpha, config.min_priority, config.enc_horizon, config.q_horizon) == (0.4, 1.0, 5, 3)
    assert (config.zs_dim, config.zsa_dim, config.za_dim, config.enc_hidden_dim) == (512, 512, 256, 512)
    assert (config.enc_lr, config.value_lr, config.policy_lr) == (1e-4, 3e-4, 3e-4)
    assert (config.enc_weight_decay, config.value_weight_decay, config.policy_weight_decay) == (1e-4, 1e-4, 1e-4)
    assert (config.value_grad_clip, config.pre_activ_weight, config.num_bins) == (20.0, 1e-5, 65)
    agent = MRQ(17, -np.ones(6), np.ones(6), config)  # the paper's ~4.1M parameters (Hopper's 11/3: 3.85M online)
    assert 3.8e6 < sum(p.numel() for name, p in agent.named_parameters() if "target" not in name) < 4.2e6


def test_two_hot_encoding_and_its_inverse_against_float64():
    two_hot = SymexpTwoHot(-10.0, 10.0, 65)
    rng = np.random.default_rng(0)
    _, bins = two_hot_oracle([0.0])
    values = np.concatenate([[-3e4, -5.0, -0.1, 0.0, 0.2, 1.0, 7.5, bins[40], bins[64], 100.0, 3e4],
                             rng.normal(size=20) * 5, rng.normal(size=5) * 500])
    expected, bins = two_hot_oracle(values)
    got = two_hot.encode(torch.as_tensor(values))
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    assert ((got > 0).sum(-1) <= 2).all()
    clipped = np.clip(values, bins[0].item(), bins[-1].item())
    torch.testing.assert_close(got @ bins, torch.as_tensor(clipped), rtol=1e-6, atol=1e-5)  # the mean is the value
    logits = torch.as_tensor(rng.normal(size=(7, 65)) * 3)
    torch.testing.assert_close(two_hot.decode(logits.float()).double(), torch.softmax(logits, -1) @ bins, rtol=1e-5,
                               atol=1e-4)
    cross_entropy = -(expected[:7] * torch.log_softmax(logits, -1)).sum(-1)
    torch.testing.assert_close(two_hot.cross_entropy(logits.float(), torch.as_tensor(values[:7]).float()).double(),
                               cross_entropy, rtol=1e-5, atol=1e-5)


def sequences(rng) -> SequenceBatch:
    """Five 4-step sequences: sample 0 terminates at step 1 (steps 2, 3 not live), sample 1 leaves its episode after
    step 2, sample 2 terminates at its last step; big and small rewards."""
    batch, horizon = 5, 4
    terminated = np.zeros((batch, horizon))
    terminated[0, 1] = terminated[2, 3] = 1
    live = np.ones((batch, horizon))
    live[0, 2:] = live[1, 3] = 0
    rewards = rng.normal(size=(batch, horizon)) * 3
    rewards[3] = [40.0, -25.0, 0.0, 0.5]
    tensor = lambda array: torch.as_tensor(array, dtype=torch.float32)  # noqa: E731
    return SequenceBatch(obs=tensor(rng.normal(size=(batch, horizon, OBS_DIM))),
                         actions=tensor(rng.uniform(-2, 2, (batch, horizon, ACTION_DIM))), rewards=tensor(rewards),
                         next_obs=tensor(rng.normal(size=(batch, horizon, OBS_DIM))), terminated=tensor(terminated),
                         live=tensor(live))


@pytest.mark.parametrize("terminations", [True, False])
def test_unrolled_encoder_loss_against_float64(terminations):
    agent = make_agent(dyn_weight=0.7, reward_weight=0.3, done_weight=0.2)
    seq = sequences(np.random.default_rng(1))
    w, s = weights(agent), {name: t.double() for name, t in seq._asdict().items()}
    batch, horizon = s["rewards"].shape
    target = zs_of(w, "encoder_target", s["next_obs"].flatten(0, 1)).view(batch, horizon, -1)
    zs, actions = zs_of(w, "encoder", s["obs"][:, 0]), s["actions"] / 2
    dynamics = reward = termination = 0.0
    for k in range(horizon):
        out = linear(w, "encoder.model", zsa_of(w, "encoder", zs, actions[:, k]))
        done, zs, logits = out[:, 0], out[:, 1:13], out[:, 13:]
        live = s["live"][:, k]
        dynamics += ((zs - target[:, k]) ** 2 * live[:, None]).mean()
        two_hot, _ = two_hot_oracle(s["rewards"][:, k].numpy(), -3.0, 3.0, 9)
        reward += (-(two_hot * torch.log_softmax(logits, -1)).sum(-1) * live).mean()
        termination += ((done - s["terminated"][:, k]) ** 2 * live).mean()
    expected = 0.7 * dynamics + 0.3 * reward + (0.2 * termination if terminations else 0.0)
    loss, parts = agent.encoder_loss(seq, terminations)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert parts["dynamics"].item() == pytest.approx(dynamics.item(), rel=1e-5)
    assert parts["reward"].item() == pytest.approx(reward.item(), rel=1e-5)
    assert parts["termination"].item() == pytest.approx(termination.item() if terminations else 0.0, rel=1e-5)
    logged = agent.update_encoder(seq, terminations)
    assert logged["losses/encoder_loss"].item() == pytest.approx(expected.item(), rel=1e-5)


def n_step_buffer(gamma: float = 0.9) -> tuple[LAPReplayBuffer, dict[str, np.ndarray]]:
    """One env's 10 steps: an episode terminated at step 3, one truncated at step 6, one still running (7-9)."""
    rng = np.random.default_rng(2)
    steps = 10
    data = dict(obs=rng.normal(size=(steps, OBS_DIM)), actions=rng.uniform(-2, 2, (steps, ACTION_DIM)),
                rewards=rng.normal(size=steps) * 4, next_obs=rng.normal(size=(steps, OBS_DIM)),
                terminated=np.arange(steps) == 3, truncated=np.arange(steps) == 6)
    buffer = LAPReplayBuffer(32, (OBS_DIM,), (ACTION_DIM,), n_step=3, gamma=gamma)
    for i in range(steps):
        buffer.add(*(data[name][i:i + 1] for name in ("obs", "actions", "rewards", "next_obs", "terminated",
                                                       "truncated")))
    return buffer, data


def n_step_oracle(data, gamma=0.9, horizon=3):
    """Per start: Σ_k γ^k r over up to `horizon` steps of its episode (the terminal step's reward included), the
    discount γ^steps, the last step's termination flag and true next observation."""
    steps = len(data["rewards"])
    returns, discounts, terminated, next_obs = [], [], [], []
    for i in range(steps):
        total, k, j = 0.0, 0, i
        while True:
            total += gamma**k * data["rewards"][j]
            k += 1
            if data["terminated"][j] or data["truncated"][j] or k == horizon or j == steps - 1:
                break
            j += 1
        returns.append(total), discounts.append(gamma**k), terminated.append(float(data["terminated"][j]))
        next_obs.append(data["next_obs"][j])
    return (torch.as_tensor(np.array(v)) for v in (returns, discounts, terminated, next_obs))


def test_huber_critic_loss_with_multi_step_returns_scaling_and_termination_against_float64():
    agent = make_agent(gamma=0.9)
    agent.reward_scale.fill_(2.5)
    agent.target_reward_scale.fill_(1.5)
    buffer, data = n_step_buffer()
    batch = buffer.batch_at(torch.arange(10))
    returns, discounts, terminated, next_obs = n_step_oracle(data)
    noise = torch.as_tensor(np.random.default_rng(3).normal(size=(10, ACTION_DIM)) * 2, dtype=torch.float32)
    w = weights(agent)
    next_zs = zs_of(w, "encoder_target", next_obs)
    smoothing = (0.2 * noise.double()).clamp(-0.3, 0.3)
    next_actions = (policy_of(w, "policy_target", next_zs)[0] + smoothing).clamp(-1, 1)
    next_q = q_of(w, "value_target", zsa_of(w, "encoder_target", next_zs, next_actions)).min(0).values
    y = (returns + discounts * (1 - terminated) * 1.5 * next_q) / 2.5
    zs = zs_of(w, "encoder", torch.as_tensor(data["obs"]))
    q = q_of(w, "value", zsa_of(w, "encoder", zs, torch.as_tensor(data["actions"]) / 2))  # (2, 10)
    error = q - y
    huber = torch.where(error.abs() < 1, 0.5 * error**2, error.abs() - 0.5)
    assert (error.abs() < 1).any() and (error.abs() > 1).any() and (smoothing.abs() == 0.3).any()  # all branches
    assert terminated.sum() > 0 and (discounts > 0.9**3 + 1e-9).any()  # episode ends inside the horizon

    loss, td_errors, values = agent.value_loss(agent.state_embedding(batch.obs), batch, noise)
    torch.testing.assert_close(agent.td_target(batch, noise).double(), y, rtol=1e-5, atol=1e-5)
    assert loss.item() == pytest.approx(huber.mean().item(), rel=1e-5)
    torch.testing.assert_close(td_errors.double(), error.abs().max(0).values, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(values.double(), q, rtol=1e-5, atol=1e-5)


def test_policy_loss_on_both_critics_with_the_pre_activation_penalty_against_float64():
    agent = make_agent(pre_activ_weight=0.5)
    obs = torch.as_tensor(np.random.default_rng(4).normal(size=(6, OBS_DIM)) * 3, dtype=torch.float32)
    w = weights(agent)
    zs = zs_of(w, "encoder", obs.double())
    actions, pre = policy_of(w, "policy", zs)
    q = q_of(w, "value", zsa_of(w, "encoder", zs, actions))
    expected = -q.mean() + 0.5 * (pre**2).mean()
    assert agent.policy_loss(agent.state_embedding(obs)).item() == pytest.approx(expected.item(), rel=1e-5)
    deterministic = agent.act(obs.numpy(), deterministic=True)
    np.testing.assert_allclose(deterministic, 2 * actions.numpy(), rtol=1e-5, atol=1e-6)  # in the env's ±2 box


# ---- LAP ----

def test_lap_priorities_and_sampling_probabilities():
    buffer = LAPReplayBuffer(16, (1,), (1,), seed=0, alpha=0.4, min_priority=1.0)
    for i in range(6):
        buffer.add([[i]], [[0.0]], [0.0], [[i]], [False], [False])
    torch.testing.assert_close(buffer.probabilities(), torch.full((6,), 1 / 6, dtype=torch.float64))
    buffer.update_priorities(torch.tensor([0, 2, 3, 5]), torch.tensor([0.5, 3.0, -2.0, 1.7]))
    expected = np.array([1.0, 1.0, 3.0**0.4, 2.0**0.4, 1.0, 1.7**0.4])  # max(|δ|, 1) ** 0.4
    np.testing.assert_allclose(buffer.priorities[:6].numpy(), expected, rtol=1e-6)
    assert buffer.max_priority == pytest.approx(3.0**0.4, rel=1e-6)
    buffer.add([[6]], [[0.0]], [0.0], [[6]], [False], [False])  # a new transition: the largest priority so far
    expected = np.append(expected, 3.0**0.4)
    np.testing.assert_allclose(buffer.probabilities().numpy(), expected / expected.sum(), rtol=1e-6)
    draws = torch.cat([buffer.sample_indices(50_000) for _ in range(4)])
    frequencies = torch.bincount(draws, minlength=7).double() / len(draws)
    np.testing.assert_allclose(frequencies.numpy(), expected / expected.sum(), atol=4e-3)  # ~4σ at 200k draws
    # the draw is the buffer generator's, saved with the buffer (and the priorities with it)
    restored = LAPReplayBuffer(16, (1,), (1,), seed=5)
    restored.load_state_dict(buffer.state_dict())
    assert restored.max_priority == buffer.max_priority
    torch.testing.assert_close(restored.priorities, buffer.priorities)
    torch.testing.assert_close(restored.sample_indices(64), buffer.sample_indices(64))
    clamped = LAPReplayBuffer(16, (1,), (1,), alpha=0.5, min_priority=2.0)  # the clamp is on |δ|, before the power
    for i in range(2):
        clamped.add([[i]], [[0.0]], [0.0], [[i]], [False], [False])
    np.testing.assert_allclose(clamped.priorities[:2].numpy(), [2.0**0.5] * 2, rtol=1e-6)
    clamped.update_priorities(torch.tensor([0, 1]), torch.tensor([1.0, -9.0]))
    np.testing.assert_allclose(clamped.priorities[:2].numpy(), [2.0**0.5, 3.0], rtol=1e-6)
    uniform = LAPReplayBuffer(16, (1,), (1,), alpha=0.0)
    for i in range(4):
        uniform.add([[i]], [[0.0]], [0.0], [[i]], [False], [False])
    uniform.update_priorities(torch.tensor([1]), torch.tensor([9.0]))
    torch.testing.assert_close(uniform.probabilities(), torch.full((4,), 0.25, dtype=torch.float64))


def test_sequences_follow_one_env_and_mask_what_is_not_its_episode():
    """Two envs interleaved; env 0 terminates at its step 1 and is truncated at its step 3, env 1 runs on; the
    newest step is each env's step 4."""
    buffer = LAPReplayBuffer(64, (1,), (1,), num_envs=2, alpha=0.0)
    terminated = {(0, 1)}
    truncated = {(0, 3)}
    for t in range(5):
        obs = np.array([[10 * e + t] for e in range(2)], dtype=np.float32)
        buffer.add(obs, obs / 100, obs[:, 0] + 0.5, obs + 0.25, [(e, t) in terminated for e in range(2)],
                   [(e, t) in truncated for e in range(2)])
    starts = torch.tensor([0, 2, 4, 1, 7, 8])  # env 0 at t 0, 1, 2; env 1 at t 0, 3; env 0 at t 4
    seq = buffer.sequences_at(starts, 3)
    first = torch.tensor([0, 1, 2, 10, 13, 4], dtype=torch.float32)
    steps = first[:, None] + torch.arange(3)  # what each env stored, step by step
    live_by_hand = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 0], [1, 1, 1], [1, 1, 0], [1, 0, 0]],
                                dtype=torch.float32)
    torch.testing.assert_close(seq.live, live_by_hand)
    live = seq.live.bool()
    torch.testing.assert_close(seq.obs[..., 0][live], steps[live])
    torch.testing.assert_close(seq.next_obs[..., 0][live], steps[live] + 0.25)
    torch.testing.assert_close(seq.rewards[live], steps[live] + 0.5)
    torch.testing.assert_close(seq.actions[..., 0][live], steps[live] / 100)
    assert seq.terminated[0].tolist() == [0.0, 1.0, 0.0] and seq.terminated[2, 1].item() == 0.0


# ---- the update schedule ----

def test_targets_are_copied_and_reward_scales_refreshed_every_target_update_freq():
    agent = make_agent(batch_size=4, target_update_freq=2, enc_horizon=2, q_horizon=2)
    buffer, data = n_step_buffer()
    buffer.n_step = 2
    online_before = {}
    for update in range(5):
        online_before[update] = {name: tensor.clone() for name, tensor in agent.state_dict().items()}
        agent.update(buffer)
    state = agent.state_dict()
    for name in (name for name in state if "_target." in name):
        online_name = name.replace("_target.", ".")
        # copied at updates 0, 2, 4: the target holds the online weights as they were when update 4 began (the
        # encoder's as they were after the steps of update 2, the critics' and policy's as after update 3)
        torch.testing.assert_close(state[name], online_before[4][online_name], rtol=0, atol=0)
        assert not torch.equal(state[name], online_before[2 if name.startswith("encoder") else 3][online_name])
    assert agent.reward_scale.item() == pytest.approx(np.abs(data["rewards"]).mean(), rel=1e-6)
    assert agent.target_reward_scale.item() == agent.reward_scale.item()  # refreshed twice from the same buffer
    assert (buffer.priorities[:10] != 1.0).any()  # TD errors came back as priorities


def test_bf16_losses_are_close_to_fp32():
    buffer, _ = n_step_buffer()
    batch = buffer.batch_at(torch.arange(10))
    seq = sequences(np.random.default_rng(1))
    noise = torch.zeros(10, ACTION_DIM)
    losses = {}
    for precision in ("fp32", "bf16"):
        agent = make_agent(precision=precision)
        zs = agent._state_embedding(batch.obs)
        losses[precision] = [agent._encoder_loss(seq, True)[0].item(), agent._value_loss(zs, batch, noise)[0].item(),
                             agent._policy_loss(zs).item()]
    np.testing.assert_allclose(losses["bf16"], losses["fp32"], rtol=5e-2)


# ---- a short run ----

def test_a_resumed_agent_logs_the_encoder_losses_of_its_last_burst(tmp_path):
    agent, resumed = make_agent(), make_agent()
    agent.encoder_losses = {"losses/encoder_loss": torch.tensor(0.5), "losses/reward_loss": torch.tensor(0.25)}
    torch.save({"agent": agent.training_state()}, tmp_path / "checkpoint.pt")
    resumed.load_training_state(torch.load(tmp_path / "checkpoint.pt", weights_only=True)["agent"])
    assert {name: value.item() for name, value in resumed.encoder_losses.items()} == {
        "losses/encoder_loss": 0.5, "losses/reward_loss": 0.25}
    state = agent.training_state()
    del state["encoder_losses"]  # a checkpoint from before they were kept: none until the next burst, as then
    resumed.load_training_state(state)
    assert resumed.encoder_losses == {}


def tiny(runs_dir, **overrides) -> MRQConfig:
    settings = dict(env_id="InvertedPendulum-v5", total_timesteps=500, learning_starts=200, batch_size=32,
                    buffer_size=10_000, zs_dim=32, zsa_dim=32, za_dim=16, enc_hidden_dim=32, value_hidden_dim=32,
                    policy_hidden_dim=32, target_update_freq=50, eval_freq=250, eval_episodes=2, checkpoint_freq=250,
                    log_freq=50, runs_dir=str(runs_dir), quiet=True)
    return MRQConfig(**{**settings, **overrides})


def interrupted_and_resumed(runs_dir, at_update: int, monkeypatch):
    """A run killed (an exception) in its `at_update`-th update, past its checkpoint at step 250 (updates from step
    200 on), then resumed to its end: its directory and result."""
    killed_in_call(monkeypatch, MRQ, "update", at_update, lambda: train(tiny(runs_dir)))
    (run_dir,) = runs_dir.iterdir()
    return run_dir, train(MRQConfig(resume=str(run_dir), quiet=True))


def test_a_short_run_writes_its_files_and_resumes_as_any_resume_from_its_checkpoint(tmp_path, monkeypatch):
    straight = train(tiny(tmp_path / "straight"))
    run_dir = straight.run_dir
    for name in ("config.json", "episodes.csv", "eval.csv", "checkpoint.pt", "buffer.pt", "model.pt"):
        assert (run_dir / name).is_file(), name
    assert any(path.name.startswith("events.out.tfevents") for path in run_dir.iterdir())
    assert [int(row["global_step"]) for row in csv.DictReader((run_dir / "eval.csv").open())] == [250, 500]
    episodes = list(csv.DictReader((run_dir / "episodes.csv").open()))
    lengths = [int(row["length"]) for row in episodes]  # InvertedPendulum-v5 pays 1 a step, 0 on the last
    assert len(episodes) > 5 and [float(row["return"]) for row in episodes] == [n - 1.0 for n in lengths]
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert checkpoint["global_step"] == 500 and checkpoint["agent"]["num_updates"] == 300
    buffer = torch.load(run_dir / "buffer.pt", weights_only=True)
    assert buffer["priorities"].shape == (500,) and float(buffer["max_priority"]) >= 1.0
    assert len(set(buffer["priorities"].tolist())) > 1  # TD errors came back as priorities
    # model.pt is the final policy, and both evaluations replay the final one: episode i seeded 10000 + 1 * 2 + i
    loaded = MRQ.load(run_dir)
    np.testing.assert_array_equal(mrq.evaluate(loaded, "InvertedPendulum-v5", 2, 10_002)[0], straight.final_eval_returns)
    command = evaluate_saved(EvaluateConfig(path=str(run_dir), episodes=2, seed=10_002))
    assert command.algo == "mrq" and np.array_equal(command.returns, straight.final_eval_returns)

    first_dir, first = interrupted_and_resumed(tmp_path / "first", 80, monkeypatch)
    second_dir, second = interrupted_and_resumed(tmp_path / "second", 120, monkeypatch)
    assert first.global_step == second.global_step == 500
    for log in ("episodes.csv", "eval.csv"):  # up to the checkpoint, what the straight run logged
        straight_lines = (run_dir / log).read_text().splitlines()
        kept = [line for line in straight_lines[1:] if int(line.split(",")[0]) <= 250]
        assert kept and (first_dir / log).read_text().splitlines()[:1 + len(kept)] == straight_lines[:1 + len(kept)]
        assert (first_dir / log).read_text() == (second_dir / log).read_text()  # then as any resume from there
    first_model, second_model = (torch.load(d / "model.pt", weights_only=True)["networks"] for d in (first_dir,
                                                                                                   second_dir))
    assert all(torch.equal(first_model[name], second_model[name]) for name in first_model)
    np.testing.assert_array_equal(first.final_eval_returns, second.final_eval_returns)


def test_num_seeds_and_bad_options_are_refused_in_one_line(tmp_path, capsys):
    assert main(["--num-seeds", "3", "--runs-dir", str(tmp_path)]) == 2
    assert "MR.Q trains one seed per process" in capsys.readouterr().err
    assert main(["--alpha", "-1", "--runs-dir", str(tmp_path)]) == 2
    assert "--alpha must be non-negative" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
    assert "num_seeds" not in {field.name for field in dataclasses.fields(MRQConfig)}
