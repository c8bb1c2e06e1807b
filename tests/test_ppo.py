"""PPO: one update against a float64 oracle (GAE, clipped surrogate, clipped value loss, entropy, gradient
clipping, one Adam step) for Box and Discrete actions; truncations bootstrapped from the true final observation;
CleanRL's defaults per kind of action space; action and observation spaces PPO cannot take refused in one line; a
run resumed mid-rollout ending exactly as a straight run does; learning on CartPole; the envpool backend.

The oracle copies the agent's weights into plain float64 tensors and recomputes the update by hand from CleanRL's
ppo_continuous_action.py / ppo.py: tanh-MLP forward passes, the Gaussian or categorical log-densities and
entropies written out, GAE as a backward loop, the losses, gradients from autograd on those plain tensors, the
global norm clipped to max_grad_norm (torch's clip_grad_norm_: scale max_norm / (norm + 1e-6) when below 1) and
Adam's first step with eps 1e-5 written out. One minibatch and one epoch make the update a single Adam step.
Tolerances as the other oracles: float64 oracle, float32 agent.
"""

from __future__ import annotations

import csv
import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from keelrl.agents import ppo, ppo_lag
from keelrl.agents.harness import loop
from keelrl.agents.harness.options import run_cli
from keelrl.agents.ppo import PPO, PPOConfig
from keelrl.buffers.rollout import RolloutBuffer
from keelrl.envs import CostWrapper
from keelrl.evaluate import main as evaluate_main

OBS_DIM, STEPS, ENVS = 3, 5, 2
TOL = dict(rtol=1e-5, atol=1e-6)
ADAM_BETA1, ADAM_BETA2, ADAM_EPS = 0.9, 0.999, 1e-5
SETTINGS = dict(hidden_sizes=(8, 8), num_envs=ENVS, num_steps=STEPS, num_minibatches=1, update_epochs=1,
                learning_rate=1e-3, ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.05, normalize_obs=False,
                normalize_reward=False, total_timesteps=10 * STEPS * ENVS)
SPACES = {"box": gym.spaces.Box(-1.0, 1.0, (2,)), "discrete": gym.spaces.Discrete(3)}


def filled_rollout(agent: PPO, seed: int = 0) -> tuple[RolloutBuffer, torch.Tensor]:
    """A rollout of random observations, actions, rewards and episode ends, whose stored log-probabilities and
    values are the agent's own moved by ±0.4, so some ratios and value updates fall outside the clip; and the
    observations after its last step."""
    g = torch.Generator().manual_seed(seed)
    rollout = RolloutBuffer(STEPS, ENVS, (OBS_DIM,), agent.action_space.shape)
    for t in range(STEPS):
        obs = torch.randn(ENVS, OBS_DIM, generator=g)
        if agent.continuous:
            actions = torch.rand(ENVS, 2, generator=g) * 2 - 1
        else:
            actions = torch.randint(0, 3, (ENVS,), generator=g).float()
        with torch.no_grad():
            log_probs, _ = agent.log_prob_and_entropy(obs, actions)
            values = agent.value(obs)
        rollout.add(obs=obs.numpy(), actions=actions.numpy(),
                    log_probs=(log_probs + 0.8 * torch.rand(ENVS, generator=g) - 0.4).numpy(),
                    values=(values + 0.8 * torch.rand(ENVS, generator=g) - 0.4).numpy(),
                    rewards=torch.randn(ENVS, generator=g).numpy(), dones=np.array([t == 2, t == 3]))
    return rollout, torch.randn(ENVS, OBS_DIM, generator=g)


def tanh_mlp(x: torch.Tensor, params: dict[str, torch.Tensor], prefix: str) -> torch.Tensor:
    """Linear, tanh, Linear, tanh, Linear: layer k's weight (out, in) at index 2k."""
    for k in range(3):
        x = x @ params[f"{prefix}.{2 * k}.weight"].T + params[f"{prefix}.{2 * k}.bias"]
        if k < 2:
            x = torch.tanh(x)
    return x


def log_prob_and_entropy(params, obs, actions, continuous: bool) -> tuple[torch.Tensor, torch.Tensor]:
    outputs = tanh_mlp(obs, params, "actor")
    if continuous:
        log_std = params["actor_logstd"]
        z = (actions - outputs) / log_std.exp()
        log_prob = (-0.5 * z**2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        entropy = (0.5 + 0.5 * math.log(2 * math.pi) + log_std).sum().expand(len(obs))
        return log_prob, entropy
    log_p = outputs - torch.logsumexp(outputs, dim=-1, keepdim=True)
    return log_p.gather(1, actions.long()[:, None])[:, 0], -(log_p.exp() * log_p).sum(-1)


def gae_by_hand(rewards, values, dones, next_values, gamma, lam):
    advantages, last = torch.zeros_like(rewards), torch.zeros_like(next_values)
    for t in reversed(range(len(rewards))):
        following = next_values if t == len(rewards) - 1 else values[t + 1]
        delta = rewards[t] + gamma * (1 - dones[t]) * following - values[t]
        advantages[t] = last = delta + gamma * lam * (1 - dones[t]) * last
    return advantages, advantages + values


def oracle(agent: PPO, rollout: RolloutBuffer, next_obs: torch.Tensor) -> tuple[dict, dict]:
    """The losses and every parameter after one update, in float64, by hand."""
    config = agent.config
    params = {n: p.detach().double().clone().requires_grad_(True) for n, p in agent.named_parameters()}
    data = {n: torch.from_numpy(v).double() for n, v in rollout.data.items()}
    with torch.no_grad():
        advantages, returns = gae_by_hand(data["rewards"], data["values"], data["dones"],
                                          tanh_mlp(next_obs.double(), params, "critic")[:, 0], config.gamma,
                                          config.gae_lambda)
    obs, actions = data["obs"].flatten(0, 1), data["actions"].flatten(0, 1)
    old_log_probs, old_values = data["log_probs"].flatten(), data["values"].flatten()
    advantages, returns = advantages.flatten(), returns.flatten()
    log_probs, entropy = log_prob_and_entropy(params, obs, actions, agent.continuous)
    ratio = (log_probs - old_log_probs).exp()
    normalised = (advantages - advantages.mean()) / (advantages.std() + 1e-8)  # torch's std: unbiased
    clip = config.clip_coef
    policy_loss = torch.max(-normalised * ratio, -normalised * ratio.clamp(1 - clip, 1 + clip)).mean()
    values = tanh_mlp(obs, params, "critic")[:, 0]
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    value_loss = 0.5 * torch.max((values - returns) ** 2, (clipped - returns) ** 2).mean()
    loss = policy_loss - config.ent_coef * entropy.mean() + config.vf_coef * value_loss
    grads = dict(zip(params, torch.autograd.grad(loss, list(params.values()))))
    norm = torch.sqrt(sum((g**2).sum() for g in grads.values()))
    scale = min(1.0, config.max_grad_norm / (float(norm) + 1e-6))
    new = {}
    for name, p in params.items():
        g = grads[name] * scale
        m_hat, v_hat = (1 - ADAM_BETA1) * g / (1 - ADAM_BETA1), (1 - ADAM_BETA2) * g * g / (1 - ADAM_BETA2)
        new[name] = p.detach() - config.learning_rate * m_hat / (v_hat.sqrt() + ADAM_EPS)
    losses = {"policy_loss": policy_loss, "value_loss": value_loss, "entropy": entropy.mean(),
              "approx_kl": ((ratio - 1) - (log_probs - old_log_probs)).mean(),
              "old_approx_kl": (old_log_probs - log_probs).mean()}
    assert float(norm) > config.max_grad_norm  # the clipping is exercised
    assert ((ratio - 1).abs() > clip).any() and ((values - old_values).abs() > clip).any()  # so are both clips
    return {n: v.detach() for n, v in losses.items()}, new


@pytest.mark.parametrize("kind", list(SPACES))
def test_one_update_matches_a_float64_oracle(kind):
    torch.manual_seed(0)
    agent = PPO(OBS_DIM, SPACES[kind], PPOConfig(**SETTINGS))
    rollout, next_obs = filled_rollout(agent)
    expected_losses, expected_params = oracle(agent, rollout, next_obs)
    with torch.no_grad():
        next_values = {"rewards": agent.value(next_obs).numpy()}
    logged = agent.update(rollout, next_values)
    for name, value in expected_losses.items():
        torch.testing.assert_close(logged[f"losses/{name}"].double(), value, **TOL, msg=name)
    for name, param in agent.named_parameters():
        torch.testing.assert_close(param.detach().double(), expected_params[name], **TOL, msg=name)
    assert logged["charts/learning_rate"] == pytest.approx(1e-3)  # the first of 10 updates: not annealed yet
    agent.update(rollout, next_values)
    assert agent.optimizers["ppo"].param_groups[0]["lr"] == pytest.approx(0.9e-3)  # linear to 0 over 10


@pytest.mark.parametrize("kind", list(SPACES))
def test_the_rollout_policy_acts_as_the_networks_do(kind):
    """The numpy copy that acts through a rollout stores the log-probabilities and values the torch networks give
    its actions, and samples from π(·|s): a Gaussian around the mean with the policy's std, or the softmax."""
    torch.manual_seed(0)
    agent = PPO(OBS_DIM, SPACES[kind], PPOConfig(**SETTINGS))
    with torch.no_grad():
        if agent.continuous:
            agent.actor_logstd.copy_(torch.tensor([-1.0, 0.5]))
        else:
            agent.actor[-1].weight.mul_(300.0)  # logits far apart, so the probabilities are not all about 1/3
    policy = agent.rollout_policy()
    obs = np.repeat(np.random.default_rng(0).normal(size=(1, OBS_DIM)).astype(np.float32), 20_000, axis=0)
    actions, log_probs, values = policy.explore(obs)
    with torch.no_grad():
        expected_log_probs, _ = agent.log_prob_and_entropy(torch.as_tensor(obs), torch.as_tensor(actions).float())
        outputs = agent.actor(torch.as_tensor(obs[:1]))[0].numpy()
    np.testing.assert_allclose(log_probs, expected_log_probs.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(values["rewards"], agent.value(torch.as_tensor(obs)).detach().numpy(), rtol=1e-5,
                               atol=1e-6)
    if agent.continuous:
        np.testing.assert_allclose(actions.mean(0), outputs, atol=0.03)
        np.testing.assert_allclose(actions.std(0), np.exp([-1.0, 0.5]), rtol=0.03)
    else:
        probs = np.exp(outputs - outputs.max()) / np.exp(outputs - outputs.max()).sum()
        assert probs.max() - probs.min() > 0.2
        np.testing.assert_allclose(np.bincount(actions, minlength=3) / len(actions), probs, atol=0.015)


# ---------------------------------------------------------------------------------------------------
# the loop

class TimeLimitedEnv(gym.Env):
    """Observations (t, 1, 0)/10 with reward 1 per step, truncated after 4 steps; never terminal."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def _obs(self):
        return np.array([self.t / 10, 0.1, 0.0], np.float32)

    def step(self, action):
        self.t += 1
        return self._obs(), 1.0, False, self.t >= 4, {}


class TupleActionsEnv(TimeLimitedEnv):
    action_space = gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Discrete(2)))


gym.register("keelrl_test/TimeLimited-v0", entry_point=TimeLimitedEnv)
gym.register("keelrl_test/TupleActions-v0", entry_point=TupleActionsEnv)


def tiny(tmp_path, **options) -> PPOConfig:
    return PPOConfig(**{**dict(env_id="InvertedPendulum-v5", total_timesteps=512, num_steps=64, num_minibatches=2,
                               update_epochs=2, hidden_sizes=(16, 16), eval_freq=256, eval_episodes=2, quiet=True,
                               runs_dir=str(tmp_path)), **options})


def test_a_truncated_step_bootstraps_from_the_true_final_observation(tmp_path, monkeypatch):
    """The rollout's reward at a time limit is r + γ V(final observation), not r (CleanRL's script cuts it)."""
    updates = []
    monkeypatch.setattr(PPO, "update", lambda agent, rollout, next_values: updates.append(
        ({n: torch.from_numpy(v.copy()) for n, v in rollout.data.items()}, agent)) or {})
    ppo.train(tiny(tmp_path, env_id="keelrl_test/TimeLimited-v0", total_timesteps=8, num_steps=8, num_minibatches=1,
                   normalize_obs=False, normalize_reward=False, eval_freq=0))
    (data, agent), = updates
    final_obs = torch.tensor([[0.4, 0.1, 0.0]])
    with torch.no_grad():
        bootstrap = 0.99 * agent.value(final_obs)
    torch.testing.assert_close(data["rewards"][:, 0], torch.tensor([1.0, 1.0, 1.0, 1.0 + bootstrap.item()] * 2))
    assert data["dones"][:, 0].tolist() == [0.0, 0.0, 0.0, 1.0] * 2


def test_cleanrl_defaults_for_each_kind_of_action_space():
    box = ppo.resolve(PPOConfig(env_id="Hopper-v5"))
    assert (box.num_envs, box.num_steps, box.learning_rate, box.num_minibatches, box.update_epochs, box.ent_coef,
            box.normalize_obs, box.normalize_reward) == (1, 2048, 3e-4, 32, 10, 0.0, True, True)
    discrete = ppo.resolve(PPOConfig(env_id="CartPole-v1"))
    assert (discrete.num_envs, discrete.num_steps, discrete.learning_rate, discrete.num_minibatches,
            discrete.update_epochs, discrete.ent_coef, discrete.normalize_obs, discrete.normalize_reward) == \
        (4, 128, 2.5e-4, 4, 4, 0.01, False, False)
    assert ppo.resolve(PPOConfig(env_id="CartPole-v1", num_envs=8)).num_envs == 8  # a given option stays


def test_an_action_space_ppo_cannot_act_in_is_refused_in_one_line(capsys):
    assert run_cli(ppo.train, PPOConfig, args=["--env-id", "keelrl_test/TupleActions-v0"]) == 2
    assert capsys.readouterr().err == ("error: PPO acts in a Box (vector) or Discrete action space; "
                                       "'keelrl_test/TupleActions-v0' has Tuple(Discrete(2), Discrete(2)).\n")


gym.register("keelrl_test/CostlyBlackjack-v0",
             entry_point=lambda: CostWrapper(gym.make("Blackjack-v1"), lambda action, obs, info: 0.0))
BLACKJACK = "Tuple(Discrete(32), Discrete(11), Discrete(2))"


@pytest.mark.parametrize("agent, env_id, given", [
    ("ppo", "Blackjack-v1", []),
    ("ppo", "Blackjack-v1", ["--num-envs", "1", "--num-steps", "8", "--learning-rate", "1e-3",
                             "--num-minibatches", "1", "--update-epochs", "1", "--ent-coef", "0",
                             "--normalize-obs", "False", "--normalize-reward", "False"]),  # nothing left to resolve
    ("ppo_lag", "keelrl_test/CostlyBlackjack-v0", []),
])
def test_an_observation_space_ppo_cannot_take_is_refused_in_one_line(agent, env_id, given, tmp_path, capsys):
    """Observations that are not a flat Box (Blackjack's are a Tuple) are refused in one line naming the space,
    exit code 2, no traceback and no run directory, whether or not the options left an env to probe for defaults;
    PPO-Lag, which reuses PPO's pieces, alike. They used to end in a TypeError from the observation size."""
    module = {"ppo": ppo, "ppo_lag": ppo_lag}[agent]
    config_cls = {"ppo": PPOConfig, "ppo_lag": ppo_lag.PPOLagConfig}[agent]
    runs = tmp_path / "runs"
    code = run_cli(module.train, config_cls, args=["--env-id", env_id, "--runs-dir", str(runs), "--quiet", *given])
    name = {"ppo": "PPO", "ppo_lag": "PPO-Lag"}[agent]
    assert capsys.readouterr().err == (f"error: {name} takes flat (vector) Box observations; {env_id!r} has "
                                       f"{BLACKJACK}.\n")
    assert code == 2 and not runs.exists()


def model_digest(run_dir) -> list[tuple[str, float]]:
    state = torch.load(run_dir / "model.pt", weights_only=True)["networks"]
    return sorted((name, float(value.double().sum())) for name, value in state.items())


def test_a_run_resumed_mid_rollout_ends_as_a_straight_run(tmp_path, monkeypatch):
    """InvertedPendulum's MuJoCo state is saved with the checkpoint, so the resumed run goes on with the very
    episodes and rollout it was in: logs and weights equal a straight run's, bit for bit."""
    straight = ppo.train(tiny(tmp_path / "straight"))
    real_record = loop.Run.record_episodes

    def killed(run, info):
        if run.step == 230:  # checkpoints every 100 steps: the last at 200, 8 steps into the 4th rollout of 64
            raise KeyboardInterrupt
        return real_record(run, info)

    monkeypatch.setattr(loop.Run, "record_episodes", killed)
    with pytest.raises(KeyboardInterrupt):
        ppo.train(tiny(tmp_path / "resumed", checkpoint_freq=100))
    monkeypatch.undo()
    (run_dir,) = (tmp_path / "resumed").iterdir()
    assert torch.load(run_dir / "checkpoint.pt", weights_only=True)["rollout"]["step"] == 8
    resumed = ppo.train(PPOConfig(resume=str(run_dir), quiet=True))
    assert resumed.global_step == straight.global_step == 512
    for name in ("episodes.csv", "eval.csv"):
        assert (run_dir / name).read_text() == (straight.run_dir / name).read_text(), name
    assert model_digest(run_dir) == model_digest(straight.run_dir)


def test_a_run_resumed_on_envs_that_cannot_be_saved_starts_new_episodes(tmp_path, monkeypatch):
    """CartPole's state is not saved: the interrupted episodes end at the checkpoint, cut as truncations."""
    config = tiny(tmp_path, env_id="CartPole-v1", num_envs=2, checkpoint_freq=100, total_timesteps=400,
                  normalize_obs=False, normalize_reward=False)
    real_record = loop.Run.record_episodes

    def killed(run, info):
        if run.step == 150:
            raise KeyboardInterrupt
        return real_record(run, info)

    monkeypatch.setattr(loop.Run, "record_episodes", killed)
    with pytest.raises(KeyboardInterrupt):
        ppo.train(config)
    monkeypatch.undo()
    (run_dir,) = tmp_path.iterdir()
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert checkpoint["episodes"] is None and checkpoint["rollout"]["step"] == 50  # 100 steps of 2 envs
    ends = []
    monkeypatch.setattr(PPO, "update", lambda agent, rollout, next_values: ends.append(rollout.data["dones"].copy())
                        or {})
    ppo.train(PPOConfig(resume=str(run_dir), quiet=True))
    assert ends[0][49].tolist() == [1.0, 1.0]  # every episode in progress ended at the checkpoint's step


def test_the_evaluation_command_and_extend_to_take_a_ppo_run(tmp_path, capsys):
    """model.pt keeps the observation statistics the policy acts through, so the evaluation command gives what
    `evaluate` gives; --extend-to trains a finished run on to the new budget."""
    result = ppo.train(tiny(tmp_path, total_timesteps=256, eval_freq=0))
    agent = PPO.load(result.run_dir / "model.pt")
    assert agent.obs_norm.count.item() == 256  # every observation acted on, from the saved model
    capsys.readouterr()
    assert evaluate_main([str(result.run_dir), "--episodes", "3", "--seed", "7"]) == 0
    returns, _ = ppo.evaluate(agent, "InvertedPendulum-v5", episodes=3, seed=7)
    assert f"return {returns.mean():.1f} ± {returns.std():.1f}" in capsys.readouterr().out
    extended = ppo.train(PPOConfig(resume=str(result.run_dir), extend_to=512, quiet=True))
    assert extended.global_step == 512
    assert torch.load(result.run_dir / "checkpoint.pt", weights_only=True)["agent"]["num_updates"] == 8
    assert PPO.load(result.run_dir / "model.pt").obs_norm.count.item() == 512


def test_cartpole_learns_within_25k_steps(tmp_path):
    result = ppo.train(tiny(tmp_path, env_id="CartPole-v1", num_envs=None, num_steps=None, num_minibatches=None,
                            update_epochs=None, hidden_sizes=(64, 64), total_timesteps=25_000, eval_freq=0,
                            eval_episodes=5))
    assert result.final_eval_return > 100  # a random policy lasts about 22 steps (seeds 1-5 here: 144 to 500)


def test_the_envpool_backend_runs_ppo_on_several_envs(tmp_path):
    pytest.importorskip("envpool")
    options = dict(env_id="Hopper-v4", env_backend="envpool", num_envs=4, num_steps=16, total_timesteps=256,
                   eval_freq=0, eval_episodes=1)
    result = ppo.train(tiny(tmp_path / "a", **options))
    assert result.global_step == 256
    with open(result.run_dir / "config.json") as f:
        assert '"env_backend": "envpool"' in f.read()
    # each env took 64 steps from its reset: an episode that ended lasted at most as many steps as its env had taken
    # by then (4 global steps a loop step), and its return is a finite number
    with open(result.run_dir / "episodes.csv") as f:
        rows = [(int(row["global_step"]), int(row["length"]), float(row["return"])) for row in csv.DictReader(f)]
    steps = [step for step, _, _ in rows]
    assert steps == sorted(steps) and all(step <= 256 for step in steps)
    assert all(1 <= length <= 64 and 4 * (length - 1) <= step and math.isfinite(ret) for step, length, ret in rows)
    # one seed, the same numbers: a second run logs the same episodes and ends with the same weights and evaluation
    again = ppo.train(tiny(tmp_path / "b", **options))
    assert (again.run_dir / "episodes.csv").read_text() == (result.run_dir / "episodes.csv").read_text()
    assert np.array_equal(again.final_eval_returns, result.final_eval_returns)
    weights = PPO.load(result.run_dir / "model.pt").state_dict()
    for name, tensor in PPO.load(again.run_dir / "model.pt").state_dict().items():
        assert torch.equal(tensor, weights[name]), name


def test_a_ppo_built_by_hand_takes_cleanrl_defaults_for_its_action_space():
    """The options left at None were filled in by `train` only: PPO(obs_dim, space, PPOConfig()) failed inside
    torch's Adam (a learning rate of None)."""
    discrete = PPO(4, gym.spaces.Discrete(2), PPOConfig())
    config = discrete.config
    assert (config.num_envs, config.learning_rate, config.normalize_obs) == (4, 2.5e-4, False)
    assert discrete.act(np.zeros((3, 4), np.float32)).shape == (3,)
    box = PPO(4, gym.spaces.Box(-1.0, 1.0, (2,)), PPOConfig())
    assert (box.config.num_steps, box.config.ent_coef, box.config.normalize_reward) == (2048, 0.0, True)
    assert box.act(np.zeros((3, 4), np.float32)).shape == (3, 2)
