"""SAC/TD3 options: networks × value heads, UTD, presets, learning-rate decay, reward scaling, bad options."""

import dataclasses
import importlib
import json
import math
import re

import numpy as np
import pytest
import torch

from keelrl.agents import sac, td3
from keelrl.agents.harness.options import apply_preset, help_paragraphs, parse_command_line, run_cli
from keelrl.agents.sac import SAC, SACConfig
from keelrl.agents.sac import train as train_sac
from keelrl.agents.td3 import TD3, TD3Config
from keelrl.networks import C51Head, HLGaussHead, ScalarHead, td_target
from keelrl.networks.builders import episode_length_discount, with_default_support

OBS_DIM, ACTION_DIM = 5, 2  # as the fixed_batch fixture in conftest.py
SMALL = dict(hidden_sizes=(32, 32), actor_hidden_dim=16, critic_hidden_dim=32, critic_num_blocks=1)


def resolved(config):
    """The config a new run trains with: its agent's preset applied, then a categorical critic on scaled
    rewards given the support [−5, 5] unless --v-min/--v-max are set."""
    config = apply_preset(config, sac.PRESETS if isinstance(config, SACConfig) else td3.PRESETS)
    return with_default_support(config, config.scale_rewards)


def make(agent_cls, config_cls, **options):
    torch.manual_seed(0)
    config = resolved(config_cls(**{**SMALL, **options}))
    return agent_cls(OBS_DIM, -np.ones(ACTION_DIM), np.ones(ACTION_DIM), config)


def target_of(agent, batch, next_actions):
    """The agent's critic target for next actions `next_actions` (no entropy bonus)."""
    with torch.no_grad():
        next_outputs = agent.critic_target(batch.next_obs, next_actions)
    return td_target(agent.head, next_outputs, batch.rewards, batch.discounts, batch.terminated)


# The 21 atoms (C51) or bin centres (HL-Gauss) of the support [−10, 10] used below, in float64.
ATOMS = np.linspace(-10.0, 10.0, 21)
CENTRES = -10.0 + 20.0 * (np.arange(21) + 0.5) / 21


def softmax64(logits: torch.Tensor) -> np.ndarray:
    x = logits.detach().double().numpy()
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def c51_projection_by_hand(next_probs: np.ndarray, rewards: np.ndarray, discounts: np.ndarray) -> np.ndarray:
    """C51 (Bellemare et al. 2017, Algorithm 1) on ATOMS, one atom at a time: z = clip(r + γ z_j) hands its
    probability to its two neighbouring atoms in proportion to closeness."""
    target = np.zeros_like(next_probs)
    for b in range(len(rewards)):
        for j, atom in enumerate(ATOMS):
            position = (np.clip(rewards[b] + discounts[b] * atom, -10.0, 10.0) + 10.0) / 1.0
            lower, upper = int(np.floor(position)), int(np.ceil(position))
            if lower == upper:
                target[b, lower] += next_probs[b, j]
            else:
                target[b, lower] += next_probs[b, j] * (upper - position)
                target[b, upper] += next_probs[b, j] * (position - lower)
    return target


def hl_gauss_by_hand(values: np.ndarray, sigma: float = 0.75 * 20.0 / 21) -> np.ndarray:
    """HL-Gauss histograms on the 21 bins of [−10, 10]: N(clip(y), σ²) mass per bin over the mass inside."""
    edges = np.linspace(-10.0, 10.0, 22)
    cdf = 0.5 * (1 + np.vectorize(math.erf)((edges - np.clip(values, -10.0, 10.0)[:, None]) / (sigma * math.sqrt(2))))
    return np.diff(cdf, axis=-1) / (cdf[:, -1:] - cdf[:, :1])


@pytest.mark.parametrize("agent_cls, config_cls", [(SAC, SACConfig), (TD3, TD3Config)])
@pytest.mark.parametrize("network", ["mlp", "simba", "simbav2"])
@pytest.mark.parametrize("head", ["scalar", "c51", "hlgauss"])
def test_every_network_and_head_learns_a_fixed_batch(agent_cls, config_cls, network, head, fixed_batch, monkeypatch):
    support = {} if head == "scalar" else dict(v_min=-10.0, v_max=10.0, num_bins=21)
    agent = make(agent_cls, config_cls, network=network, critic_head=head, **support)
    outputs = agent.critic(fixed_batch.obs, fixed_batch.actions)
    assert outputs.shape == (2, 256, agent.head.num_outputs)
    # the critic fits a fixed target through its head ...
    target = target_of(agent, fixed_batch, fixed_batch.actions)
    # ... the target by hand from the target critic's outputs: r + 0.99 (1 − d) min_k Q'_k(s', a) for scalar and
    # HL-Gauss critics (Q' = Σ softmax · bin centres), the C51 projection of the pessimistic member's distribution
    rewards, not_done = fixed_batch.rewards.double().numpy(), 1.0 - fixed_batch.terminated.double().numpy()
    with torch.no_grad():
        next_outputs = agent.critic_target(fixed_batch.next_obs, fixed_batch.actions)
    if head == "c51":
        probs = softmax64(next_outputs)  # (2, B, 21)
        pessimist = (probs @ ATOMS).argmin(0)
        expected_target = c51_projection_by_hand(probs[pessimist, np.arange(256)], rewards, 0.99 * not_done)
        np.testing.assert_allclose(target.double().numpy(), expected_target, rtol=1e-5, atol=1e-6)
    else:
        next_q = next_outputs.squeeze(-1).double().numpy() if head == "scalar" else softmax64(next_outputs) @ CENTRES
        expected_target = rewards + 0.99 * not_done * next_q.min(0)
        np.testing.assert_allclose(target.double().numpy(), expected_target, rtol=1e-5, atol=1e-6)
    # the first step's loss by hand (mean over critics and samples): squared error, or the cross-entropy
    # against the target distribution (C51) or the HL-Gauss histogram of the scalar target
    before = agent.critic(fixed_batch.obs, fixed_batch.actions).detach()
    if head == "scalar":
        per_sample = (before.squeeze(-1).double().numpy() - target.double().numpy()) ** 2
    else:
        histogram = target.double().numpy() if head == "c51" else hl_gauss_by_hand(target.double().numpy())
        log_probs = np.log(softmax64(before))
        per_sample = -(histogram * log_probs).sum(-1)
    with monkeypatch.context() as patch:  # the agent's critic step, towards the fixed target
        patch.setattr(sac if agent_cls is SAC else td3, "td_target", lambda *args, **kwargs: target)
        losses = [agent.update_critic(fixed_batch)["losses/qf_loss"].item() for _ in range(30)]
    assert losses[0] == pytest.approx(per_sample.mean(), rel=1e-5)  # a float32 network pass and loss
    assert losses[-1] < losses[0]
    # ... and full updates (actor, targets, projection) run and stay finite
    for _ in range(4):
        assert all(torch.isfinite(v) for v in agent.update(fixed_batch).values())
    assert agent.act(fixed_batch.obs.numpy()[:3]).shape == (3, ACTION_DIM)


def test_heads_follow_the_option():
    assert isinstance(make(SAC, SACConfig).head, ScalarHead)
    assert isinstance(make(SAC, SACConfig, critic_head="c51", v_min=-1.0, v_max=1.0).head, C51Head)
    hl = make(SAC, SACConfig, critic_head="hlgauss", v_min=0.0, v_max=10.0, num_bins=10).head
    assert isinstance(hl, HLGaussHead) and hl.sigma == pytest.approx(0.75)


def test_simbav2_weight_rows_have_unit_norm_after_an_agent_update(fixed_batch):
    agent = make(SAC, SACConfig, preset="simbav2")
    for _ in range(2):
        agent.update(fixed_batch)
    weights = [m.weight for net in (agent.actor, agent.critic) for m in net.modules()
               if type(m).__name__ == "HyperLinear"]
    assert len(weights) > 6
    for weight in weights:
        torch.testing.assert_close(weight.norm(dim=-1), torch.ones(weight.shape[:-1]), atol=1e-5, rtol=0)


def test_critic_target_uses_the_c51_projection_of_the_pessimistic_member(fixed_batch):
    agent = make(TD3, TD3Config, critic_head="c51", v_min=-10.0, v_max=10.0, num_bins=21)
    batch = fixed_batch._replace(rewards=torch.full((256,), 0.05))  # small rewards keep γz + r inside the support
    target = target_of(agent, batch, batch.actions)
    assert target.shape == (256, 21)
    torch.testing.assert_close(target.sum(-1), torch.ones(256))
    next_values = agent.head.value(agent.critic_target(batch.next_obs, batch.actions))  # (E, B)
    pessimistic = next_values.min(dim=0).values
    expected_mean = batch.rewards + 0.99 * (1 - batch.terminated) * pessimistic
    # float32 sums of 21 products of size up to 10: 1e-5 absolute
    torch.testing.assert_close(target @ agent.head.support, expected_mean, atol=1e-5, rtol=0)
    # the whole distribution, projected by hand from the member with the smaller mean (Σ softmax · atoms)
    with torch.no_grad():
        probs = softmax64(agent.critic_target(batch.next_obs, batch.actions))
    pessimist = (probs @ ATOMS).argmin(0)
    assert 0 < pessimist.sum() < 256  # each member is the pessimist somewhere
    expected = c51_projection_by_hand(probs[pessimist, np.arange(256)], batch.rewards.double().numpy(),
                                      0.99 * (1 - batch.terminated.double().numpy()))
    np.testing.assert_allclose(target.double().numpy(), expected, rtol=1e-5, atol=1e-6)
    terminal = batch.terminated.bool().numpy()
    assert terminal.any()  # a terminal transition's target is the two-hot of r = 0.05: atom 10 (0) and 11 (1)
    # (the float32 position (0.05 + 10) / 1 carries the rounding of 10.05: 2e-7, hence atol 1e-6)
    np.testing.assert_allclose(target.numpy()[terminal][:, 10:12], np.tile([0.95, 0.05], (terminal.sum(), 1)),
                               rtol=0, atol=1e-6)


# What every preset shares with keelrl's defaults, read from both references' MuJoCo runs:
# configs/buffer/numpy_uniform.yaml:6-9 (buffer 1e6, learning starts 5000, batch 256), τ 0.005
# (SimBa configs/agent/sac_simba.yaml:31, SimbaV2 configs/agent/simbaV2.yaml:43), 1-step returns, clipped double Q
# on episodic MuJoCo, actor 1 block × 128, critic 2 blocks × 512 (sac_simba.yaml:13-14,19-20; simbaV2.yaml:22-23,32-33).
SHARED = dict(buffer_size=1_000_000, learning_starts=5_000, batch_size=256, tau=0.005, n_step=1, num_critics=2,
              actor_num_blocks=1, actor_hidden_dim=128, critic_num_blocks=2, critic_hidden_dim=512,
              normalize_obs=True, obs_clip=None, gamma=0.995)  # γ: heuristic of base.yaml:17 / online_rl.yaml:20
# SonyResearch/simba configs/agent/sac_simba.yaml and configs/base.yaml:25 (2 updates per step)
SIMBA = dict(network="simba", critic_head="scalar", scale_rewards=False, optimizer="adamw", weight_decay=1e-2,
             final_lr_fraction=1.0, utd=2)
# dojeon-ai/SimbaV2 configs/agent/simbaV2.yaml, configs/online_rl.yaml:28 with configs/env/mujoco.yaml:13 (UTD 1)
SIMBAV2 = dict(network="simbav2", critic_head="c51", num_bins=101, v_min=-5.0, v_max=5.0, scale_rewards=True,
               optimizer="adam", weight_decay=0.0, final_lr_fraction=0.5, utd=1)
SAC_EXPECTED = {  # policy_frequency 1: actor and temperature step with every critic update (sac_agent.py:198-229)
    "simba": dict(**SHARED, **SIMBA, policy_lr=1e-4, q_lr=1e-4, alpha_init=0.01, target_entropy_scale=-0.5,
                  autotune=True, policy_frequency=1, target_network_frequency=1),
    "simbav2": dict(**SHARED, **SIMBAV2, policy_lr=1e-4, q_lr=1e-4, alpha_init=0.01, target_entropy_scale=-0.5,
                    autotune=True, policy_frequency=1, target_network_frequency=1),
}
TD3_EXPECTED = {  # TD3's own update rule stays: policy delay 2, target smoothing
    "simba": dict(**SHARED, **SIMBA, learning_rate=1e-4, exploration_noise=0.1, policy_frequency=2),
    "simbav2": dict(**SHARED, **SIMBAV2, learning_rate=1e-4, exploration_noise=0.1, policy_frequency=2),
}


@pytest.mark.parametrize("agent_cls, config_cls, expected", [(SAC, SACConfig, SAC_EXPECTED), (TD3, TD3Config, TD3_EXPECTED)])
@pytest.mark.parametrize("preset", ["simba", "simbav2"])
def test_presets_resolve_to_the_references_mujoco_configuration(agent_cls, config_cls, expected, preset):
    config = resolved(config_cls(preset=preset))
    assert {name: getattr(config, name) for name in expected[preset]} == expected[preset]


def test_presets_accept_agreeing_flags_and_refuse_contradicting_ones():
    assert resolved(SACConfig(preset="simbav2", gamma=0.995, scale_rewards=True)).utd == 1
    with pytest.raises(ValueError, match="--preset simbav2 sets --utd 1, but --utd 2 was also given"):
        resolved(SACConfig(preset="simbav2", utd=2))


def test_discount_heuristic_of_simba_and_simbav2():
    """max(min((L/5 − 1) / (L/5), 0.995), 0.95), L = max_episode_steps / action_repeat (base.yaml:17)."""
    assert episode_length_discount(1000) == 0.995  # MuJoCo: (200 − 1) / 200
    assert episode_length_discount(1000, action_repeat=2) == 0.99  # DMC: (100 − 1) / 100
    assert episode_length_discount(200) == 0.975  # (40 − 1) / 40
    assert episode_length_discount(50) == 0.95  # 0.9, raised to the floor
    assert episode_length_discount(10_000) == 0.995  # capped


@pytest.mark.parametrize("preset", ["simba", "simbav2"])
def test_presets_step_actor_and_temperature_with_every_critic_update(preset, fixed_batch):
    agent = make(SAC, SACConfig, preset=preset)
    for k in (1, 2, 3):
        losses = agent.update(fixed_batch)
        assert {"losses/actor_loss", "losses/alpha_loss"} <= set(losses)
        for name in ("critic", "actor", "alpha"):
            steps = {int(state["step"]) for state in agent.optimizers[name].state.values()}
            assert steps == {k}, (name, steps)


def test_plain_sac_keeps_cleanrl_delayed_actor_steps(fixed_batch):
    """No preset: CleanRL's schedule, two actor/α steps every second update."""
    agent = make(SAC, SACConfig)
    actor_steps = []
    for _ in range(4):
        agent.update(fixed_batch)
        actor_steps.append({int(s["step"]) for s in agent.optimizers["actor"].state.values()})
    assert actor_steps == [set(), {2}, {2}, {4}]


def test_simba_preset_puts_no_weight_decay_on_the_temperature(fixed_batch):
    """SimBa's configs/agent/sac_simba.yaml:16,22 weight decay 1e-2 on actor and critic, :29 none on the
    temperature (AdamW's decay would pull log α towards 0, α towards 1)."""
    agent = make(SAC, SACConfig, preset="simba")
    decay = {name: [type(opt).__name__, opt.param_groups[0]["weight_decay"]] for name, opt in agent.optimizers.items()}
    assert decay == {"actor": ["AdamW", 1e-2], "critic": ["AdamW", 1e-2], "alpha": ["AdamW", 0.0]}
    losses = agent.update(fixed_batch)  # one α step: Adam's first step moves log α by lr · sign(gradient)
    # d(alpha_loss)/d log α = alpha_loss itself (the loss is α · c with α = exp(log α))
    expected = math.log(0.01) - 1e-4 * math.copysign(1.0, losses["losses/alpha_loss"].item())
    assert agent.log_alpha.item() == pytest.approx(expected, abs=1e-6)  # decay would add −1e-6 · log α ≈ +4.6e-6
    td3 = make(TD3, TD3Config, preset="simba")
    assert [td3.optimizers[name].param_groups[0]["weight_decay"] for name in ("actor", "critic")] == [1e-2, 1e-2]


@pytest.mark.parametrize("head", ["c51", "hlgauss"])
@pytest.mark.parametrize("network", ["mlp", "simba"])
def test_scaled_rewards_give_categorical_critics_the_unit_support_without_a_preset(head, network):
    config = resolved(SACConfig(scale_rewards=True, critic_head=head, network=network))
    assert (config.v_min, config.v_max) == (-5.0, 5.0)
    explicit = resolved(TD3Config(scale_rewards=True, critic_head=head, v_min=-2.0))
    assert (explicit.v_min, explicit.v_max) == (-2.0, 5.0)  # an explicit bound wins
    assert resolved(SACConfig(critic_head=head, v_min=-1.0, v_max=3.0)).v_max == 3.0
    assert resolved(SACConfig(scale_rewards=True)).v_min is None  # scalar critics need none


def test_scale_rewards_with_a_categorical_critic_runs_from_the_command_line(tmp_path):
    args = ["--env-id", "InvertedPendulum-v5", "--scale-rewards", "--critic-head", "c51", "--total-timesteps", "40",
            "--learning-starts", "30", "--batch-size", "8", "--eval-freq", "0", "--eval-episodes", "1",
            "--hidden-sizes", "16", "16", "--runs-dir", str(tmp_path), "--quiet"]
    assert run_cli(train_sac, SACConfig, args=args) == 0
    (run_dir,) = tmp_path.iterdir()
    config = json.loads((run_dir / "config.json").read_text())["config"]
    assert (config["v_min"], config["v_max"], config["num_bins"]) == (-5.0, 5.0, 101)


@pytest.mark.parametrize("module", ["sac", "td3", "sac_lag", "td3_lag"])
def test_the_simbav2_preset_runs_from_the_command_line_with_its_support(module, tmp_path):
    """The preset turns reward scaling on, so its categorical critic gets the [−5, 5] support."""
    agent_module = importlib.import_module(f"keelrl.agents.{module}")
    env_id = "keelrl/SafeHopperVelocity-v1" if module.endswith("_lag") else "InvertedPendulum-v5"
    learning_starts = 5_000 if module.startswith("td3") else 30  # TD3's presets set SimBa's 5000 (theirs: 25000)
    args = ["--env-id", env_id, "--preset", "simbav2", "--total-timesteps", str(learning_starts + 10),
            "--learning-starts", str(learning_starts), "--batch-size", "8", "--eval-freq", "0", "--eval-episodes", "1", "--actor-hidden-dim", "8",
            "--critic-hidden-dim", "8", "--critic-num-blocks", "1", "--runs-dir", str(tmp_path),
            "--quiet"]
    config_cls = next(obj for name, obj in vars(agent_module).items() if name.endswith("Config")
                      and getattr(obj, "__module__", "") == agent_module.__name__)
    assert run_cli(agent_module.train, config_cls, args=args) == 0
    (run_dir,) = tmp_path.iterdir()
    config = json.loads((run_dir / "config.json").read_text())["config"]
    assert (config["critic_head"], config["scale_rewards"], config["v_min"], config["v_max"]) == ("c51", True, -5.0, 5.0)


def test_train_returns_the_resolved_config_and_a_resumed_run_the_saved_one(tmp_path):
    config = SACConfig(env_id="InvertedPendulum-v5", preset="simbav2", total_timesteps=40, learning_starts=30,
                       batch_size=8, eval_freq=0, eval_episodes=1, actor_hidden_dim=8, critic_hidden_dim=8,
                       critic_num_blocks=1, runs_dir=str(tmp_path), quiet=True)
    result = train_sac(config)
    assert (result.config.gamma, result.config.utd, result.config.v_min, result.config.v_max) == (0.995, 1, -5.0, 5.0)
    resumed = train_sac(SACConfig(resume=str(result.run_dir), extend_to=50, quiet=True))
    assert resumed.config == dataclasses.replace(result.config, total_timesteps=50, resume=str(result.run_dir))


def test_online_normaliser_follows_simba_under_the_presets_and_clips_otherwise():
    """SimBa/SimbaV2 (agents/wrappers/normalization.py): (x − mean) / sqrt(var + 1e-8), no clip;
    plain --normalize-obs keeps its clip at ±10."""
    obs = np.array([[1.0, 0.0, 2.0, 0.0, 5.0], [3.0, 4.0, 2.0, 0.0, 5.0], [5.0, 8.0, 2.0, 0.0, 5.0]])
    mean, var = obs.mean(0), obs.var(0)  # [3, 4, 2, 0, 5], [8/3, 32/3, 0, 0, 0]
    x = np.array([[3.0 + 50 * math.sqrt(8 / 3), 0.0, 2.0, 1e-3, 5.0]])
    expected = (x - mean) / np.sqrt(var + 1e-8)  # [50, −1.2247, 0, 10, 0]
    for agent_cls, config_cls in ((SAC, SACConfig), (TD3, TD3Config)):
        for preset in ("simba", "simbav2"):
            agent = make(agent_cls, config_cls, preset=preset)
            agent.obs_norm.update(torch.as_tensor(obs))
            out = agent.obs_norm(torch.as_tensor(x, dtype=torch.float32)).numpy()
            np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)
            assert out[0, 0] == pytest.approx(50.0, rel=1e-6)
    plain = make(SAC, SACConfig, normalize_obs=True)
    plain.obs_norm.update(torch.as_tensor(obs))
    out = plain.obs_norm(torch.as_tensor(x, dtype=torch.float32)).numpy()
    np.testing.assert_allclose(out, np.clip(expected, -10, 10), rtol=1e-6, atol=1e-6)


def test_learning_rates_decay_linearly(fixed_batch):
    agent = make(SAC, SACConfig, final_lr_fraction=0.5, total_timesteps=5_010, learning_starts=5_000)
    for _ in range(5):
        agent.update(fixed_batch)
    # the 5th update ran with progress 4/10
    assert agent.optimizers["critic"].param_groups[0]["lr"] == pytest.approx(1e-3 * (1 - 0.5 * 0.4))
    assert agent.optimizers["actor"].param_groups[0]["lr"] == pytest.approx(3e-4 * (1 - 0.5 * 0.4))


def test_reward_scaling_divides_batch_rewards(fixed_batch, monkeypatch):
    agent = make(TD3, TD3Config, scale_rewards=True)
    for _ in range(50):
        agent.reward_scaler.update(np.full(1, 10.0), np.zeros(1, bool))
    seen = {}

    def learn(batch):
        seen["rewards"] = batch.rewards
        return {}

    monkeypatch.setattr(agent, "learn", learn)
    agent.update(fixed_batch)
    torch.testing.assert_close(seen["rewards"], fixed_batch.rewards / agent.reward_scaler.denominator().float())
    assert "reward_scaler.returns" in agent.state_dict()  # saved with checkpoints and the model


def test_utd_sets_updates_per_environment_step(tmp_path):
    result = train_sac(SACConfig(env_id="InvertedPendulum-v5", total_timesteps=300, learning_starts=200, utd=3,
                                 batch_size=16, eval_freq=0, eval_episodes=1, runs_dir=str(tmp_path), quiet=True,
                                 **SMALL))
    state = torch.load(result.run_dir / "checkpoint.pt", weights_only=True)
    assert state["agent"]["num_updates"] == 3 * 100


@pytest.mark.parametrize(
    "args, message",
    [
        (["--critic-head", "c51", "--v-min", "5", "--v-max", "5"], "--v-min .* must be smaller than --v-max"),
        (["--critic-head", "hlgauss", "--v-min", "0", "--v-max", "1", "--num-bins", "1"], "--num-bins must be at least 2"),
        (["--critic-head", "c51"], "needs a support: give --v-min and --v-max"),
        (["--normalize-obs", "--obs-clip", "0"], "--obs-clip must be positive"),
        (["--utd", "0"], "--utd must be positive"),
        (["--preset", "simbav2", "--network", "simba"], "--preset simbav2 sets --network simbav2, but --network simba"),
        (["--preset", "simba", "--q-lr", "0.003"], "--preset simba sets --q-lr 0.0001, but --q-lr 0.003"),
        # given at their defaults, which the preset would have replaced without a word
        (["--preset", "simba", "--q-lr", "0.001"], "--preset simba sets --q-lr 0.0001, but --q-lr 0.001"),
        (["--preset", "simbav2", "--network=mlp"], "--preset simbav2 sets --network simbav2, but --network mlp"),
    ],
)
def test_bad_options_are_refused_clearly(args, message, tmp_path, capsys):
    assert run_cli(train_sac, SACConfig, args=[*args, "--runs-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err
    assert not any(tmp_path.iterdir())


def test_options_survive_save_and_load(tmp_path, fixed_batch):
    agent = make(SAC, SACConfig, preset="simbav2")
    agent.update(fixed_batch)
    agent.save(tmp_path / "model.pt")
    loaded = SAC.load(tmp_path / "model.pt")
    assert dataclasses.asdict(loaded.config) == dataclasses.asdict(agent.config)
    obs = fixed_batch.obs.numpy()[:4]
    np.testing.assert_array_equal(loaded.act(obs, deterministic=True), agent.act(obs, deterministic=True))


def test_help_prints_a_multi_line_option_description_as_running_text(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # wide enough that the help box wraps no description
    with pytest.raises(SystemExit):
        parse_command_line(SACConfig, ["--help"])
    help_text = capsys.readouterr().out
    # two field docstrings whose second lines start with a letter and with "(": tyro alone broke both lines there
    assert "videos.csv (return, cost, length), a frame in TensorBoard (needs keelrl[video];" in help_text
    assert "once as a CUDA graph and replay it (networks/cuda_graphs.py)" in help_text


def test_help_paragraphs_join_lines_but_keep_paragraphs_and_bullets():
    text = "first line\n    (second) line\n\n    next paragraph\n    - a bullet\n      continued\n    * another"
    assert help_paragraphs(text) == "first line (second) line\n\nnext paragraph\n- a bullet continued\n* another"
