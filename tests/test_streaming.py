"""Streaming agents: ObGD's bound and traces, sparse init, the streaming wrappers against numpy,
stream AC / Q / TD updates, runs, resume after a kill, and clear errors."""

import csv
import json
import math
import re

import gymnasium as gym
import numpy as np
import pytest
import torch

from keelrl.agents.harness.options import run_cli
from keelrl.agents.stream_ac import StreamAC, StreamACConfig
from keelrl.agents.stream_q import StreamQ, StreamQConfig
from keelrl.agents.stream_q import train as train_q
from keelrl.agents.stream_td import StreamTD, StreamTDConfig, monte_carlo_errors, value_error
from keelrl.agents.stream_td import train as train_td
from keelrl.envs.normalize import RunningStats
from keelrl.envs.streaming_wrappers import (
    StreamObsNormalize,
    StreamRewardScale,
    TimeFeature,
    Transition,
    load_stream_env_state,
    make_stream_env,
    stream_env_state,
)
from keelrl.networks.streaming import ObGD, StreamMLP, sparse_init_
from test_sac import killed_past, read_episodes



def set_grads(params, grads):
    for p, g in zip(params, grads):
        p.grad.copy_(g)


@pytest.mark.parametrize("adaptive", [False, True])
def test_obgd_step_obeys_its_bound_on_random_gradients(adaptive):
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(7, 5)), torch.nn.Parameter(torch.randn(5))]
    kappa, lr = 2.0, 1.0
    optimizer = ObGD(params, lr=lr, kappa=kappa, adaptive=adaptive)
    active = inactive = 0
    for step in range(200):
        scale = 10.0 ** torch.empty(()).uniform_(-4, 1).item()  # from tiny gradients (bound off) to large ones
        set_grads(params, [torch.randn_like(p) * scale for p in params])
        delta = float(torch.randn(()) * 3)
        before = optimizer.flat_params.clone()
        step_size = optimizer.step(delta, reset=step % 3 == 0)
        moved = optimizer.flat_params - before
        direction = moved / (step_size * delta)  # the (scaled) trace the step followed
        effective = step_size * max(abs(delta), 1.0) * direction.abs().sum().item()
        assert effective <= 1.0 / kappa * (1 + 1e-4)
        if lr * kappa * max(abs(delta), 1.0) * direction.abs().sum().item() > 1.0:
            active += 1
            assert effective == pytest.approx(1.0 / kappa, rel=1e-4)
        else:
            inactive += 1
            assert step_size == lr
        optimizer.zero_grad()
    assert active > 20 and inactive > 20  # both regimes were exercised


def test_obgd_traces_decay_by_gamma_lambda_and_reset_at_episode_end():
    params = [torch.nn.Parameter(torch.zeros(3, 2)), torch.nn.Parameter(torch.zeros(2))]
    optimizer = ObGD(params, lr=1e-3, gamma=0.9, lam=0.5)
    first = [torch.ones(3, 2), torch.full((2,), 2.0)]
    set_grads(params, first)
    optimizer.step(0.1)
    torch.testing.assert_close(optimizer.trace, torch.cat([g.reshape(-1) for g in first]))
    optimizer.zero_grad()
    optimizer.step(0.1)  # zero gradient: the trace only decays
    torch.testing.assert_close(optimizer.trace, 0.45 * torch.cat([g.reshape(-1) for g in first]))
    set_grads(params, first)
    optimizer.step(0.1, reset=True)
    assert optimizer.trace.abs().sum() == 0
    # the gradient views survive a module-style zero_grad(set_to_none=True)
    for p in params:
        p.grad = None
    optimizer.zero_grad()
    (params[0].sum() + params[1].sum()).backward()
    assert optimizer.flat_grads.sum() == 8


def test_adaptive_obgd_divides_by_the_root_of_second_moment_plus_eps_by_hand():
    """Two steps where v̂ (~1e-8) is as small as eps (1e-8), so sqrt(v̂ + eps) and sqrt(v̂) + eps differ.

    Step 1: e = g = (1e-4, 3e-4), δ = 1; v = 0.001(δe)², v̂ = v / (1 − 0.999) = (1e-8, 9e-8);
    direction = e / sqrt(v̂ + 1e-8) = (1e-4/sqrt(2e-8), 3e-4/sqrt(1e-7)) = (0.7071068, 0.9486833),
    ‖·‖₁ = 1.6557901; bound 1·2·1·1.6557901 > 1 so η = 1/3.3115802 = 0.3019706; θ = ηδ·direction.
    (With eps outside the root the direction would be e/(|e| + 1e-8) ≈ (0.9999, 0.99997), θ ≈ (0.25, 0.25).)
    Step 2: no new gradient, e = 0.792e, δ = −0.5; v ← 0.999v + 0.001(δe)², v̂ = v / (1 − 0.999²)
    = (5.781971e-9, 5.203774e-8); direction = (0.6304412, 0.9539343), η = 1/(2·1.5843754) = 0.3155818.
    """
    param = torch.nn.Parameter(torch.zeros(2))
    optimizer = ObGD([param], lr=1.0, gamma=0.99, lam=0.8, kappa=2.0, adaptive=True, beta2=0.999, eps=1e-8)
    set_grads([param], [torch.tensor([1e-4, 3e-4])])
    assert optimizer.step(1.0) == pytest.approx(0.3019706, rel=1e-5)
    torch.testing.assert_close(optimizer.second_moment / (1 - 0.999), torch.tensor([1e-8, 9e-8]), rtol=1e-5, atol=0)
    torch.testing.assert_close(param.detach(), torch.tensor([0.3019706 * 0.7071068, 0.3019706 * 0.9486833]),
                               rtol=1e-5, atol=0)
    torch.testing.assert_close(param.detach(), torch.tensor([0.2135255, 0.2864745]), rtol=1e-5, atol=0)
    optimizer.zero_grad()
    assert optimizer.step(-0.5) == pytest.approx(0.3155818, rel=1e-5)
    torch.testing.assert_close(optimizer.second_moment / (1 - 0.999**2), torch.tensor([5.781971e-9, 5.203774e-8]),
                               rtol=1e-5, atol=0)
    expected = torch.tensor([0.2135255 - 0.5 * 0.3155818 * 0.6304412, 0.2864745 - 0.5 * 0.3155818 * 0.9539343])
    torch.testing.assert_close(param.detach(), expected, rtol=1e-5, atol=0)
    torch.testing.assert_close(param.detach(), torch.tensor([0.1140476, 0.1359524]), rtol=1e-5, atol=0)


def test_sparse_init_zeroes_ninety_percent_of_each_row():
    weight = torch.empty(64, 100)
    sparse_init_(weight, 0.9)
    assert ((weight == 0).sum(dim=1) == 90).all()
    assert weight.abs().max() <= 1 / math.sqrt(100)
    network = StreamMLP(5, (32, 32), 2)
    linears = [*network.hidden, network.output]
    assert [(m.weight == 0).sum(dim=1).min().item() for m in linears] == [4, 28, 28]  # 90% of 5 keeps one input
    assert all((m.bias == 0).all() for m in linears)
    assert sum(p.numel() for p in network.parameters()) == sum(m.weight.numel() + m.bias.numel() for m in linears)


class StreamTestEnv(gym.Env):
    """Random observations (3,) and rewards; episodes of 7 steps, the 4th episode terminates at step 3."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (3,))
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.episode = getattr(self, "episode", -1) + 1
        return self.np_random.normal([1.0, -2.0, 5.0], [1.0, 3.0, 0.1]).astype(np.float32), {}

    def step(self, action):
        self.t += 1
        obs = self.np_random.normal([1.0, -2.0, 5.0], [1.0, 3.0, 0.1]).astype(np.float32)
        return obs, float(self.np_random.exponential(2.0)), self.episode == 3 and self.t == 3, False, {}


gym.register("keelrl_test/StreamTest-v0", entry_point=StreamTestEnv, max_episode_steps=7)


class Recorder(gym.Wrapper):
    """Keeps every raw observation (resets included) and reward that passes through."""

    def __init__(self, env):
        super().__init__(env)
        self.observations, self.rewards = [], []

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self.observations.append(obs)
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.observations.append(obs)
        self.rewards.append((reward, terminated or truncated))
        return obs, reward, terminated, truncated, info


def test_wrappers_match_numpy_on_a_stream():
    recorder = Recorder(gym.make("keelrl_test/StreamTest-v0"))
    env = StreamRewardScale(TimeFeature(StreamObsNormalize(recorder), max_episode_steps=7), gamma=0.9)
    env.reset(seed=0)
    trace, traces, elapsed = 0.0, [], 0
    for _ in range(60):
        obs, reward, terminated, truncated, _ = env.step(0)
        elapsed += 1
        history = np.array(recorder.observations, np.float64)  # every raw observation so far
        expected_obs = (history[-1] - history.mean(0)) / np.sqrt(history.var(0, ddof=1) + 1e-8)
        np.testing.assert_allclose(obs[:3], expected_obs, rtol=1e-6, atol=1e-6)
        assert obs[3] == pytest.approx(1 - elapsed / 7)  # the time feature
        raw_reward, _ = recorder.rewards[-1]
        trace = 0.9 * trace + raw_reward
        traces.append(trace)
        expected_scale = np.sqrt(np.var(traces, ddof=1) + 1e-8) if len(traces) > 1 else 1.0
        assert reward == pytest.approx(raw_reward / expected_scale, rel=1e-6)
        if terminated or truncated:
            trace, elapsed = 0.0, 0
            env.reset()
    assert env.unwrapped.episode == 9  # 3 episodes of 7 steps, one of 3 (terminated), then 7-step ones


def test_running_stats_pushed_one_sample_at_a_time_match_numpy_and_round_trip():
    """The stream wrappers' statistics: Welford's update, sample variance (ddof=1), as stream-x divides by."""
    rng = np.random.default_rng(0)
    stream = rng.normal(3.0, 2.0, (500, 4))
    stats = RunningStats((4,))
    np.testing.assert_array_equal(stats.sample_var, np.ones(4))  # no variance before two samples
    for x in stream:
        stats.push(x)
    np.testing.assert_allclose(stats.mean, stream.mean(0), rtol=1e-10)
    np.testing.assert_allclose(stats.sample_var, stream.var(0, ddof=1), rtol=1e-10)
    np.testing.assert_allclose(stats.var, stream.var(0), rtol=1e-10)
    copy = RunningStats((4,))
    copy.load_state_dict(stats.state_dict())
    np.testing.assert_array_equal(copy.mean, stats.mean)
    np.testing.assert_array_equal(copy.sample_var, stats.sample_var)


def test_env_state_round_trip_and_frozen_statistics():
    env = make_stream_env("keelrl_test/StreamTest-v0")
    env.reset(seed=1)
    for _ in range(10):
        env.step(1)
    state = stream_env_state(env)
    assert set(state) == {"obs_normalizer", "reward_scaler"} and int(state["obs_normalizer"]["count"]) == 11
    # the statistics against numpy on the same raw stream (the env alone, same seed and actions): the reset
    # observation and 10 step observations; the discounted-return traces u ← 0.99 u + r, restarted after every
    # step the time limit (7) truncates (steps 7 to 10: the test never resets)
    raw = gym.make("keelrl_test/StreamTest-v0")
    observations, rewards, traces, trace = [raw.reset(seed=1)[0]], [], [], 0.0
    for _ in range(10):
        obs, reward, terminated, truncated, _ = raw.step(1)
        observations.append(obs)
        rewards.append(reward)
        trace = 0.99 * trace + reward
        traces.append(trace)
        if terminated or truncated:
            trace = 0.0
    observations = np.array(observations, np.float64)
    np.testing.assert_allclose(state["obs_normalizer"]["mean"].numpy(), observations.mean(0), rtol=1e-12)
    np.testing.assert_allclose(state["obs_normalizer"]["m2"].numpy(), observations.var(0) * 11, rtol=1e-10)
    scaler = state["reward_scaler"]
    assert int(scaler["count"]) == 10 and float(scaler["return_trace"]) == 0.0
    assert float(scaler["mean"]) == pytest.approx(np.mean(traces), rel=1e-12)
    assert float(scaler["m2"]) == pytest.approx(np.var(traces) * 10, rel=1e-10)
    assert traces[6] > rewards[6] and traces[7:] == rewards[7:]  # a long trace, then restarts after step 7
    other = make_stream_env("keelrl_test/StreamTest-v0")
    load_stream_env_state(other, state)
    for key, saved in stream_env_state(other).items():
        for name, value in saved.items():
            torch.testing.assert_close(value, state[key][name])
    with pytest.raises(ValueError, match="same normalisation flags"):
        load_stream_env_state(other, {"obs_normalizer": state["obs_normalizer"]})
    wrappers = [w for w in (other, other.env, other.env.env) if isinstance(w, (StreamObsNormalize, StreamRewardScale, TimeFeature))]
    assert len(wrappers) == 3


def q_agent(**overrides) -> StreamQ:
    torch.manual_seed(0)
    return StreamQ(4, gym.spaces.Discrete(3), StreamQConfig(hidden_sizes=(16, 16), **overrides))


def test_stream_q_cuts_the_trace_after_an_exploratory_action():
    agent = q_agent()
    optimizer = agent.optimizers["q_network"]
    rng = np.random.default_rng(0)
    observations = rng.normal(size=(4, 4)).astype(np.float32)

    def gradient(obs, action):
        q_value = agent.q_network(torch.as_tensor(obs))[action]
        return torch.cat([g.reshape(-1) for g in torch.autograd.grad(q_value, list(agent.q_network.parameters()))])

    for i, explore in enumerate([False, False, True, False]):
        obs = observations[i]
        greedy = agent.act(obs, deterministic=True)
        action = (greedy + 1) % 3 if explore else greedy
        expected = gradient(obs, action) + (0.0 if explore else 0.99 * 0.8 * optimizer.trace)
        agent.update(Transition(obs, action, 1.0, observations[(i + 1) % 4], False, False))
        torch.testing.assert_close(optimizer.trace, expected)  # greedy: γλe + ∇Q; exploratory: ∇Q only


def test_stream_q_epsilon_decays_linearly():
    agent = q_agent(total_timesteps=1000, exploration_fraction=0.5, start_e=1.0, end_e=0.1)
    assert agent.epsilon == 1.0
    agent.num_updates = 250
    assert agent.epsilon == pytest.approx(0.55)
    agent.num_updates = 900
    assert agent.epsilon == pytest.approx(0.1)


@pytest.mark.parametrize("make_agent", [
    lambda: StreamAC(4, gym.spaces.Box(-np.ones(2, np.float32), np.ones(2, np.float32)), StreamACConfig(hidden_sizes=(16, 16))),
    lambda: StreamAC(4, gym.spaces.Discrete(3), StreamACConfig(hidden_sizes=(16, 16))),
    lambda: q_agent(),
    lambda: StreamTD(4, gym.spaces.Discrete(3), StreamTDConfig(hidden_sizes=(16, 16))),
], ids=["ac-box", "ac-discrete", "q", "td"])
def test_repeated_updates_on_one_terminal_transition_shrink_the_td_error(make_agent):
    torch.manual_seed(0)
    agent = make_agent()
    obs = np.array([0.5, -1.0, 2.0, 0.1], np.float32)
    action = agent.act(obs, deterministic=True)
    # the first TD error by hand: δ = r − V(s) (or r − Q(s, a)), nothing bootstrapped from a terminal s'
    network = agent.q_network if isinstance(agent, StreamQ) else agent.critic
    params = list(network.parameters())
    output = network(torch.as_tensor(obs))
    value = output[action] if isinstance(agent, StreamQ) else output[0]
    gradient = torch.cat([g.reshape(-1) for g in torch.autograd.grad(value, params)]).double()
    before = torch.cat([p.detach().reshape(-1) for p in params]).double()
    delta = 3.0 - value.item()
    errors = [agent.update(Transition(obs, action, 3.0, obs, True, True))["losses/td_error"]]
    assert errors[0] == pytest.approx(delta, rel=1e-6)
    if not isinstance(agent, StreamAC):  # (AC's critic is stepped alike; its actor's objective is its own)
        # ObGD's first step by hand: e = ∇, η = lr / max(1, lr κ max(|δ|, 1) ‖e‖₁), θ ← θ + η δ e; lr 1, κ 2
        step_size = 1.0 / max(1.0, 1.0 * 2.0 * max(abs(delta), 1.0) * gradient.abs().sum().item())
        after = torch.cat([p.detach().reshape(-1) for p in params]).double()
        torch.testing.assert_close(after, before + step_size * delta * gradient, rtol=1e-5, atol=1e-7)
    errors += [agent.update(Transition(obs, action, 3.0, obs, True, True))["losses/td_error"] for _ in range(29)]
    assert abs(errors[-1]) < 0.05 * abs(errors[0])
    assert all(math.isfinite(e) for e in errors)


def test_stream_ac_policy_moves_towards_actions_with_positive_td_error():
    torch.manual_seed(0)
    agent = StreamAC(4, gym.spaces.Box(-np.ones(2, np.float32), np.ones(2, np.float32)),
                     StreamACConfig(hidden_sizes=(16, 16), entropy_coef=0.0))
    obs = np.array([0.5, -1.0, 2.0, 0.1], np.float32)
    action = np.array([0.8, -0.6], np.float32)
    mean_before, _ = agent._gaussian(torch.as_tensor(obs))
    for _ in range(20):
        agent.update(Transition(obs, action, 5.0, obs, True, True))  # V starts near 0: δ > 0
    mean_after, _ = agent._gaussian(torch.as_tensor(obs))
    assert (np.abs(mean_after.detach().numpy() - action) < np.abs(mean_before.detach().numpy() - action)).all()


def test_monte_carlo_errors_keep_only_steps_whose_tail_is_negligible():
    errors = monte_carlo_errors([0.0, 0.0, 0.0], [1.0, 1.0, 1.0], 0.5, terminated=True)
    np.testing.assert_allclose(errors, [-1.75, -1.5, -1.0])
    # truncated: the step 3 before the end misses 0.5**3 = 0.125 > 0.01 of its tail, only earlier ones count
    assert len(monte_carlo_errors([0.0] * 10, [1.0] * 10, 0.5, terminated=False)) == 4


def tiny(config_cls, tmp_path, **overrides):
    settings = dict(env_id="CartPole-v1", total_timesteps=1500, hidden_sizes=(16, 16), eval_freq=1000,
                    eval_episodes=2, checkpoint_freq=500, log_freq=100, runs_dir=str(tmp_path), quiet=True)
    return config_cls(**{**settings, **overrides})


def test_stream_q_runs_are_reproducible_and_complete(tmp_path):
    first = train_q(tiny(StreamQConfig, tmp_path / "a", seed=3))
    second = train_q(tiny(StreamQConfig, tmp_path / "b", seed=3))
    other = train_q(tiny(StreamQConfig, tmp_path / "c", seed=4))
    returns = lambda result: [row["return"] for row in read_episodes(result.run_dir)]  # noqa: E731
    assert len(returns(first)) > 10
    assert returns(first) == returns(second) and returns(first) != returns(other)
    np.testing.assert_array_equal(first.final_eval_returns, second.final_eval_returns)
    for name in ("config.json", "episodes.csv", "eval.csv", "checkpoint.pt", "model.pt"):
        assert (first.run_dir / name).is_file(), name
    assert any(p.name.startswith("events.out.tfevents") for p in first.run_dir.iterdir())
    evals = list(csv.DictReader((first.run_dir / "eval.csv").open()))
    assert [int(row["global_step"]) for row in evals] == [1000, 1500]
    assert float(evals[-1]["mean_return"]) == pytest.approx(first.final_eval_returns.mean(), rel=1e-12)
    assert float(evals[-1]["std_return"]) == pytest.approx(first.final_eval_returns.std(), abs=1e-12)
    # CartPole-v1 pays 1 per step, and one env's episodes end at the running sum of their lengths
    rows = read_episodes(first.run_dir)
    lengths = [int(row["length"]) for row in rows]
    assert [float(row["return"]) for row in rows] == [float(n) for n in lengths]
    assert [int(row["global_step"]) for row in rows] == np.cumsum(lengths).tolist()
    saved = json.loads((first.run_dir / "config.json").read_text())
    assert saved["algo"] == "stream_q" and saved["config"]["seed"] == 3 and saved["config"]["total_timesteps"] == 1500
    # the saved model acts as the trained one, with the run's normaliser statistics
    loaded = StreamQ.load(first.run_dir / "model.pt")
    assert int(loaded.env_state["reward_scaler"]["count"]) == 1500
    from keelrl.agents.stream_q import evaluate
    np.testing.assert_array_equal(evaluate(loaded, "CartPole-v1", 2, 10_000 + 3 * 2)[0], first.final_eval_returns)


def test_stream_td_learns_the_random_policy_value(tmp_path):
    result = train_td(tiny(StreamTDConfig, tmp_path, total_timesteps=4000, eval_freq=0, eval_episodes=20))
    trained = StreamTD.load(result.run_dir / "model.pt")
    untrained = StreamTD(trained.obs_dim, trained.action_space, trained.config)
    untrained.env_state = trained.env_state
    _, _, trained_error = value_error(trained, "CartPole-v1", 20, seed=100)
    _, _, untrained_error = value_error(untrained, "CartPole-v1", 20, seed=100)
    assert trained_error < 0.5 * untrained_error


def test_resume_after_kill_leaves_no_gap_or_duplicate(tmp_path):
    args = ["--env-id", "CartPole-v1", "--total-timesteps", "5000", "--hidden-sizes", "16", "16",
            "--checkpoint-freq", "1000", "--eval-freq", "0", "--eval-episodes", "2", "--runs-dir", str(tmp_path),
            "--quiet"]
    run_dir = killed_past("keelrl.agents.stream_q", args, tmp_path)
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert 1000 <= checkpoint["global_step"] < 5000
    assert set(checkpoint["env"]) == {"obs_normalizer", "reward_scaler"}
    assert set(checkpoint["agent"]["optimizers"]["q_network"]) == {"trace", "second_moment", "num_steps"}
    before = read_episodes(run_dir)
    assert int(before[-1]["global_step"]) > checkpoint["global_step"]

    result = train_q(StreamQConfig(resume=str(run_dir), quiet=True))
    assert result.global_step == 5000
    after = read_episodes(run_dir)
    steps = [int(row["global_step"]) for row in after]
    assert steps == sorted(set(steps))
    kept = [row for row in before if int(row["global_step"]) <= checkpoint["global_step"]]
    assert after[: len(kept)] == kept and steps[len(kept)] > checkpoint["global_step"]
    # the reward scaler's statistics count every step, before and after the interruption
    model = StreamQ.load(run_dir / "model.pt")
    assert int(model.env_state["reward_scaler"]["count"]) == 5000
    assert torch.load(run_dir / "checkpoint.pt", weights_only=True)["agent"]["num_updates"] == 5000


class Killed(Exception):
    """Stands in for a kill of the training process."""


@pytest.mark.parametrize("algo", ["stream_td", "stream_q", "stream_ac"])
def test_resume_from_a_mid_episode_checkpoint_starts_the_new_episode_with_zero_traces(algo, tmp_path, monkeypatch):
    """Episodes of StreamTest-v0 last 7 steps, so the checkpoint at step 10 is 3 steps into the second
    episode, with a non-zero trace. The run dies at step 12; the resumed run resets its env (a new
    episode), so the first update after resume must step along its own gradient alone (trace 0 before
    it), not along γλ·(the saved trace) + gradient."""
    agent_module = __import__(f"keelrl.agents.{algo}", fromlist=["train"])
    config_cls = {"stream_q": StreamQConfig, "stream_ac": StreamACConfig, "stream_td": StreamTDConfig}[algo]
    agent_cls = {"stream_q": StreamQ, "stream_ac": StreamAC, "stream_td": StreamTD}[algo]
    greedy = dict(start_e=0.0, end_e=0.0) if algo == "stream_q" else {}  # no Watkins cut of the trace
    config = config_cls(env_id="keelrl_test/StreamTest-v0", total_timesteps=30, hidden_sizes=(8, 8), eval_freq=0,
                        eval_episodes=1, checkpoint_freq=10, log_freq=5, runs_dir=str(tmp_path), quiet=True,
                        **greedy)
    update = agent_cls.update

    def update_until_killed(self, transition):
        if self.num_updates == 12:
            raise Killed
        return update(self, transition)

    monkeypatch.setattr(agent_cls, "update", update_until_killed)
    with pytest.raises(Killed):
        agent_module.train(config)
    monkeypatch.setattr(agent_cls, "update", update)
    (run_dir,) = tmp_path.iterdir()
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert checkpoint["global_step"] == 10 and [int(r["global_step"]) for r in read_episodes(run_dir)] == [7]
    saved = checkpoint["agent"]["optimizers"]
    assert all(state["trace"].abs().sum() > 0 for state in saved.values())  # mid-episode: a live trace
    assert checkpoint["env"]["reward_scaler"]["return_trace"] > 0  # and a live discounted-return trace

    steps, transitions = [], []  # (optimiser, its step count, trace before the step, the step's gradient, trace after)
    step = ObGD.step

    def recording_step(self, delta, reset=False):
        before, grads = self.trace.clone(), self.flat_grads.clone()
        step_size = step(self, delta, reset)
        steps.append((self, self.num_steps, before, grads, self.trace.clone()))
        return step_size

    def recording_update(self, transition):
        transitions.append(transition)
        return update(self, transition)

    return_traces = []  # the reward scaler's return trace as each env step begins
    scale_step = StreamRewardScale.step

    def recording_scale_step(self, action):
        return_traces.append(self.return_trace)
        return scale_step(self, action)

    monkeypatch.setattr(ObGD, "step", recording_step)
    monkeypatch.setattr(agent_cls, "update", recording_update)
    monkeypatch.setattr(StreamRewardScale, "step", recording_scale_step)
    result = agent_module.train(config_cls(resume=str(run_dir), quiet=True))
    assert result.global_step == 30
    first_update = steps[: len(saved)]  # one step per optimiser (stream AC: critic and actor)
    assert len({id(opt) for opt, *_ in first_update}) == len(saved)
    for _, num_steps, before, grads, after in first_update:
        assert num_steps == 11  # the checkpoint's 10 steps, then this one
        assert torch.count_nonzero(before) == 0  # not the saved trace (decayed by γλ)
        assert grads.abs().sum() > 0
        torch.testing.assert_close(after, grads, rtol=0, atol=0)  # e = 0·γλ + ∇
    assert transitions[0].obs[-1] == 1.0  # the time feature of a reset: a new episode
    assert return_traces[0] == 0.0 and return_traces[1] > 0  # u ← γu + r restarts from 0
    # the episode started on resume runs its full 7 steps (10 → 17) before the next one
    assert [int(r["global_step"]) for r in read_episodes(run_dir)][:3] == [7, 17, 24]


@pytest.mark.parametrize(
    "module, args, message",
    [
        ("stream_q", ["--env-id", "Hopper-v5"], r"Stream Q needs a Discrete action space.*stream_ac"),
        ("stream_ac", ["--env-id", "Hoper-v5"], "Did you mean 'Hopper-v5'"),
        ("stream_ac", ["--total-timesteps", "0"], "--total-timesteps must be positive"),
        ("stream_ac", ["--lam", "1.5"], r"--lam must lie in \[0, 1\]"),
        # β₂ = 1: the bias correction's 1 − β₂ⁿ is 0, and adaptive ObGD's step turned every weight NaN
        ("stream_q", ["--adaptive", "--beta2", "1"], r"--beta2 must lie in \[0, 1\), got 1.0"),
        ("stream_q", ["--end-e", "0.5", "--start-e", "0.1"], "--end-e <= --start-e"),
        ("stream_td", ["--policy", "missing.pt"], "no such file"),
        ("stream_ac", ["--env-id", "keelrl_test/NanReward-v0"], "no time limit.*--no-time-feature"),
        ("stream_q", ["--env-id", "Blackjack-v1"], "flat \\(vector\\) Box observations"),
        ("stream_ac", ["--env-id", "keelrl_test/NanRewardLate-v0", "--checkpoint-freq", "200"],
         r"non-finite reward .*global step 250.*checkpoint of step 200 .* is kept"),
    ],
)
def test_bad_input_is_one_clear_line_and_exit_code_2(module, args, message, tmp_path, capsys):
    agent_module = __import__(f"keelrl.agents.{module}", fromlist=["train"])
    config_cls = {"stream_q": StreamQConfig, "stream_ac": StreamACConfig, "stream_td": StreamTDConfig}[module]
    code = run_cli(agent_module.train, config_cls, args=[*args, "--runs-dir", str(tmp_path), "--quiet",
                                                         "--hidden-sizes", "8"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: ") and "Traceback" not in err
    assert re.search(message, err), err


def test_resume_of_another_streaming_algorithms_run(tmp_path, capsys):
    result = train_q(tiny(StreamQConfig, tmp_path, total_timesteps=200, eval_freq=0))
    from keelrl.agents.stream_ac import train as train_ac
    assert run_cli(train_ac, StreamACConfig, args=["--resume", str(result.run_dir)]) == 2
    assert "that run is 'stream_q', not 'stream_ac'" in capsys.readouterr().err


def test_a_stream_td_model_loads_and_evaluates_without_its_policys_file(tmp_path):
    """model.pt keeps what rebuilds the evaluated policy (its weights were there already): moved or deleted, the
    policy's own run is no longer needed to load, act or evaluate (it once was: load_policy read --policy's path)."""
    from keelrl.agents.stream_td import evaluate
    q_run = train_q(tiny(StreamQConfig, tmp_path / "q", total_timesteps=600, eval_freq=0))
    td_run = train_td(tiny(StreamTDConfig, tmp_path / "td", total_timesteps=600, eval_freq=0,
                           policy=str(q_run.run_dir / "model.pt")))
    before = evaluate(StreamTD.load(td_run.run_dir / "model.pt"), "CartPole-v1", 3, 100)[0]
    q_run.run_dir.rename(tmp_path / "moved")
    loaded = StreamTD.load(td_run.run_dir / "model.pt")
    assert isinstance(loaded.policy, StreamQ) and loaded.policy.env_state.keys() == {"obs_normalizer", "reward_scaler"}
    np.testing.assert_array_equal(evaluate(loaded, "CartPole-v1", 3, 100)[0], before)
    moved = StreamQ.load(tmp_path / "moved" / "model.pt")
    for name, tensor in moved.state_dict().items():
        torch.testing.assert_close(loaded.policy.state_dict()[name], tensor, rtol=0, atol=0, msg=name)


def test_the_evaluation_command_names_the_policy_a_stream_td_run_plays(tmp_path, capsys):
    """It said "(deterministic policy, ..." of a uniform random policy."""
    from keelrl.evaluate import main as evaluate_main

    q_run = train_q(tiny(StreamQConfig, tmp_path / "q", total_timesteps=300, eval_freq=0))
    for policy, said in (("random", "uniform random policy"),
                         (str(q_run.run_dir / "model.pt"), "stream_q model's deterministic policy")):
        td_run = train_td(tiny(StreamTDConfig, tmp_path / policy[-8:], total_timesteps=300, eval_freq=0, policy=policy))
        capsys.readouterr()
        assert evaluate_main([str(td_run.run_dir), "--episodes", "2", "--csv", str(tmp_path / "e.csv")]) == 0
        assert f"stream_td on CartPole-v1, 2 episodes ({said}, seeds " in capsys.readouterr().out


def test_a_loaded_q_lambda_agent_explores_as_it_ended_training(tmp_path):
    """model.pt kept no update count, so a loaded agent's ε was its first (1.0): act() played uniformly at random."""
    result = train_q(tiny(StreamQConfig, tmp_path, total_timesteps=300, eval_freq=0))
    loaded = StreamQ.load(result.run_dir / "model.pt")
    assert loaded.num_updates == 300 and loaded.epsilon == pytest.approx(0.01)


@pytest.mark.parametrize("agent_cls, config_cls", [(StreamQ, StreamQConfig), (StreamAC, StreamACConfig)])
def test_a_streaming_agent_refuses_a_batch_or_an_unwrapped_observation_in_one_line(agent_cls, config_cls):
    """A batch gave a wrong answer without a word (StreamQ: the argmax over the flattened batch, an int), and the
    env's own observation (4 numbers for CartPole, without the time feature) torch's shape error."""
    agent = agent_cls(5, gym.spaces.Discrete(2), config_cls())
    assert agent.act(np.zeros(5, np.float32), deterministic=True) in (0, 1)
    for shape in ((3, 5), (4,)):
        with pytest.raises(ValueError, match=rf"^{agent.algo} acts on one observation at a time, as its env wrappers "
                                             rf"give it \(shape \(5,\): normalised, with the time feature\), got "
                                             rf"shape {re.escape(str(shape))};"):
            agent.act(np.zeros(shape, np.float32))
